"""llama.cpp's teacher-forced logits (positions x vocab f32, dump_logits.c)
cut to what core/tests/iq_files.rs needs: per position the 32 most likely
tokens' ids and log-probabilities (u32, f32 little-endian), in order."""
import math
import struct
import sys

VOCAB, TOP = int(sys.argv[3]), 32
raw = open(sys.argv[1], "rb").read()
values = struct.unpack(f"<{len(raw) // 4}f", raw)
out = bytearray()
for p in range(len(values) // VOCAB):
    row = values[p * VOCAB:(p + 1) * VOCAB]
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    best = sorted(range(VOCAB), key=lambda i: -row[i])[:TOP]
    for i in best:
        out += struct.pack("<If", i, row[i] - lse)
open(sys.argv[2], "wb").write(out)
