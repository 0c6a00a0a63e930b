"""Two GGUF importance matrices side by side: the entries each has, and per
shared entry the largest relative difference of the per-column mean squares
(sum / count, as llama-quantize uses them) and of the counts."""
import struct
import sys


def read_gguf(path):
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF", path
    o = 8
    nt, nkv = struct.unpack_from("<QQ", b, o)
    o += 16

    def s():
        nonlocal o
        (n,) = struct.unpack_from("<Q", b, o)
        o += 8
        r = b[o:o + n].decode()
        o += n
        return r

    fmts = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def val(t):
        nonlocal o
        if t == 8:
            return s()
        if t == 9:
            (et,) = struct.unpack_from("<I", b, o)
            (n,) = struct.unpack_from("<Q", b, o + 4)
            o += 12
            return [val(et) for _ in range(n)]
        (v,) = struct.unpack_from("<" + fmts[t], b, o)
        o += struct.calcsize(fmts[t])
        return v

    kv = {}
    for _ in range(nkv):
        k = s()
        (t,) = struct.unpack_from("<I", b, o)
        o += 4
        kv[k] = val(t)
    infos = []
    for _ in range(nt):
        name = s()
        (nd,) = struct.unpack_from("<I", b, o)
        dims = struct.unpack_from("<%dQ" % nd, b, o + 4)
        o += 4 + 8 * nd
        ty, off = struct.unpack_from("<IQ", b, o)
        o += 12
        infos.append((name, dims, off))
    align = kv.get("general.alignment", 32)
    data = (o + align - 1) // align * align
    tensors = {}
    for name, dims, off in infos:
        n = 1
        for d in dims:
            n *= d
        tensors[name] = (dims, struct.unpack_from("<%df" % n, b, data + off))
    return kv, tensors


def means(tensors):
    out = {}
    for name, (dims, sums) in tensors.items():
        if not name.endswith(".in_sum2"):
            continue
        base = name[: -len(".in_sum2")]
        counts = tensors[base + ".counts"][1]
        cols = dims[0]
        m = []
        for j, c in enumerate(counts):
            m.extend(v / c if c > 0 else 1.0 for v in sums[j * cols:(j + 1) * cols])
        out[base] = (m, counts)
    return out


a_kv, a = read_gguf(sys.argv[1])
b_kv, b = read_gguf(sys.argv[2])
ma, mb = means(a), means(b)
only_a, only_b = sorted(set(ma) - set(mb)), sorted(set(mb) - set(ma))
worst, worst_name, count_diff = 0.0, "", 0
for name in sorted(set(ma) & set(mb)):
    (x, ca), (y, cb) = ma[name], mb[name]
    count_diff += ca != cb
    if len(x) != len(y):
        print(f"{name}: {len(x)} vs {len(y)} values")
        continue
    for u, v in zip(x, y):
        d = abs(u - v) / max(abs(u), abs(v), 1e-30)
        if d > worst:
            worst, worst_name = d, name
print(f"entries: {len(ma)} vs {len(mb)} ({len(set(ma) & set(mb))} shared); only in the first: {only_a}; "
      f"only in the second: {only_b}; entries with different counts: {count_diff}; "
      f"largest relative difference of a column's mean square: {worst:.2e} ({worst_name})")
print(f"chunk_count {a_kv.get('imatrix.chunk_count')} vs {b_kv.get('imatrix.chunk_count')}, "
      f"chunk_size {a_kv.get('imatrix.chunk_size')} vs {b_kv.get('imatrix.chunk_size')}")
