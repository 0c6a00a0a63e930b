// The per-row arithmetic of a decoded token on the device (`gpu/graph.rs`):
// norms, RoPE, residual adds, activations, the MoE router and the sum of
// the experts' outputs, the DeltaNet decays and conv. One entry point per
// operation, all over one bind group layout: `a` is written (in place where
// the operation reads it too), `b`, `c` read, `d` read (or, for the conv,
// written), `p` the dispatch's parameters, `step` the token's position.
// Each mirrors a CPU function named in its comment, in the same order of
// operations where that order decides the rounding.

struct Params {
    // Elements (or rows), and the row width.
    n: u32,
    width: u32,
    // Offsets and row strides, in elements, into `a` and `b`.
    a0: u32,
    sa: u32,
    b0: u32,
    sb: u32,
    mode: u32,
    // Operation-specific counts (see each entry point).
    k: u32,
    m: u32,
    e: u32,
    eps: f32,
    f0: f32,
    f1: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read_write> d: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
// Word 0: the token's position.
@group(0) @binding(5) var<storage, read> step: array<u32>;

const WG: u32 = 64u;

// `norm`'s modes.
const WEIGHT: u32 = 1u;
const IN_PLACE: u32 = 2u;
const L2: u32 = 4u;
const SILU_GATE: u32 = 8u;

// The flat invocation index of a one-dimensional grid that may continue
// along y (`p.e` workgroups along x).
fn flat(wid: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * max(p.e, 1u) + wid.x) * WG + lid;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// `deltanet::softplus` and `moe::softplus`.
fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

fn norm_in(i: u32, in_place: bool) -> f32 {
    if (in_place) {
        return a[i];
    }
    return b[i];
}

// Row `wid.x` (of `p.n`) of `p.width` values: `ops::rms_norm` (or, with
// L2, `deltanet::l2_norm`), times the weight `c` (WEIGHT), times SiLU of
// the gate row in `d` (SILU_GATE: the DeltaNet's gated norm); from `b`, or
// from `a` itself (IN_PLACE).
@compute @workgroup_size(64)
fn norm(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let r = wid.x;
    let w = p.width;
    let ia = p.a0 + r * p.sa;
    let in_place = (p.mode & IN_PLACE) != 0u;
    let ib = select(p.b0 + r * p.sb, ia, in_place);
    var ss = 0.0;
    for (var i = lane.lid; i < w; i += WG) {
        let v = norm_in(ib + i, in_place);
        ss += v * v;
    }
    let total = sum_all(ss, lane);
    let n = f32(w);
    var scale: f32;
    if ((p.mode & L2) != 0u) {
        // RMSNorm with eps / n, then 1 / sqrt(n).
        scale = 1.0 / sqrt(total / n + p.eps / n) * (1.0 / sqrt(n));
    } else {
        scale = 1.0 / sqrt(total / n + p.eps);
    }
    for (var i = lane.lid; i < w; i += WG) {
        var v = norm_in(ib + i, in_place) * scale;
        if ((p.mode & WEIGHT) != 0u) {
            v *= c[i];
        }
        if ((p.mode & SILU_GATE) != 0u) {
            v *= silu(d[r * w + i]);
        }
        a[ia + i] = v;
    }
}

// `ops::with_rope_angles` + `ops::rope_apply` for `p.n` heads at `a[p.a0 +
// h * p.sa]`, `p.k` pairs each (n_rot / 2), NeoX halves when `p.mode` is 1;
// `p.f0` the angle's ratio from one pair to the next (base^(-2 / n_rot),
// taken on the host as the CPU takes it), `p.f1` the frequency scale.
@compute @workgroup_size(64)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = flat(wid, lid);
    if (g >= p.n * p.k) {
        return;
    }
    let h = g / p.k;
    let i = g % p.k;
    // The CPU's angle: the position times the ratio, i times over.
    var theta = f32(step[0]);
    for (var j = 0u; j < i; j++) {
        theta *= p.f0;
    }
    let t = p.f1 * theta;
    let cs = cos(t);
    let sn = sin(t);
    let base = p.a0 + h * p.sa;
    var ia = base + 2u * i;
    var ib = ia + 1u;
    if (p.mode == 1u) {
        ia = base + i;
        ib = base + i + p.k;
    }
    let x0 = a[ia];
    let x1 = a[ib];
    a[ia] = x0 * cs - x1 * sn;
    a[ib] = x0 * sn + x1 * cs;
}

// a[a0 + i] += b[b0 + i % k] for i < n (a residual add; a bias with k = its length).
@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, lid);
    if (i < p.n) {
        a[p.a0 + i] += b[p.b0 + i % p.k];
    }
}

// a = act(a) * b (`ffn::Act::apply`): SiLU (mode 0) or GELU (mode 1).
@compute @workgroup_size(64)
fn glu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, lid);
    if (i < p.n) {
        let g = a[i];
        a[i] = select(silu(g), gelu(g), p.mode == 1u) * b[i];
    }
}

// a = f0 * tanh(a / f0) (final logit soft-capping).
@compute @workgroup_size(64)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, lid);
    if (i < p.n) {
        a[i] = tanh(a[i] / p.f0) * p.f0;
    }
}

// The DeltaNet's decays and update strengths, as the delta-rule kernel
// takes them (`[exp(g) | beta]`, `p.n` value heads each): exp(softplus(alpha
// + dt_bias) * A) from alpha `b` and `c` = `[dt_bias | A]`, and sigmoid of
// beta `d` (`DeltaNet::forward`).
@compute @workgroup_size(64)
fn decay(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, lid);
    if (i < p.n) {
        a[i] = exp(softplus(b[i] + c[i]) * c[p.n + i]);
        a[p.n + i] = sigmoid(d[i]);
    }
}

// The DeltaNet's causal conv of one token (`DeltaNet::forward`): channel i
// of `p.n`, its `p.k` older inputs in the window `d` (`[k][n]`, oldest
// first), taps `b` (`[k + 1][n]`); the new input in `a` becomes SiLU of the
// sum, and the window moves on by one.
@compute @workgroup_size(64)
fn conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, lid);
    if (i >= p.n) {
        return;
    }
    let n = p.n;
    let hist = p.k;
    let x = a[i];
    var s = 0.0;
    for (var j = 0u; j < hist; j++) {
        s += d[j * n + i] * b[j * n + i];
    }
    s += x * b[hist * n + i];
    for (var j = 0u; j + 1u < hist; j++) {
        d[j * n + i] = d[(j + 1u) * n + i];
    }
    if (hist > 0u) {
        d[(hist - 1u) * n + i] = x;
    }
    a[i] = silu(s);
}

// The router of one token (`Moe::route`): `p.m` logits in `b`; into `a`:
// the `p.k` chosen experts (ids as u32 bits), their weights at `p.k`, and
// the gating's probabilities at `2 k + 1` (work space). `p.mode`: gating
// 0 softmax, 1 sigmoid, 2 sqrt(softplus); +4: renormalise the weights;
// `p.f0` a scale of the weights (1: none). One invocation: `top_k`'s
// insertion, ties to the lower id.
@compute @workgroup_size(1)
fn route() {
    let n = p.m;
    let k = p.k;
    let pr = 2u * k + 1u;
    let gating = p.mode & 3u;
    var mx = -3.4e38;
    for (var e = 0u; e < n; e++) {
        mx = max(mx, b[e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < n; e++) {
        var v = b[e];
        if (gating == 0u) {
            v = exp(v - mx);
            sum += v;
        } else if (gating == 1u) {
            v = sigmoid(v);
        } else {
            v = sqrt(softplus(v));
        }
        a[pr + e] = v;
    }
    if (gating == 0u) {
        let inv = 1.0 / sum;
        for (var e = 0u; e < n; e++) {
            a[pr + e] *= inv;
        }
    }
    // Insertion into the sorted list of the k largest so far.
    var filled = 0u;
    for (var e = 0u; e < n; e++) {
        let v = a[pr + e];
        var pos = filled;
        while (pos > 0u && a[pr + bitcast<u32>(a[pos - 1u])] < v) {
            pos -= 1u;
        }
        if (pos < k) {
            let end = min(filled, k - 1u);
            for (var j = end; j > pos; j--) {
                a[j] = a[j - 1u];
            }
            a[pos] = bitcast<f32>(e);
            filled = min(filled + 1u, k);
        }
    }
    var wsum = 0.0;
    for (var j = 0u; j < k; j++) {
        let w = a[pr + bitcast<u32>(a[j])];
        a[k + j] = w;
        wsum += w;
    }
    let norm = (p.mode & 4u) != 0u;
    let inv = 1.0 / max(wsum, 6.1035156e-5);
    for (var j = 0u; j < k; j++) {
        var w = a[k + j];
        if (norm) {
            w *= inv;
        }
        if (p.f0 != 1.0 && p.f0 != 0.0) {
            w *= p.f0;
        }
        a[k + j] = w;
    }
}

// The shared expert's gate sigmoid(x . w) (`Moe::combine`): x `b`, w `c`
// (`p.n` values), into a[p.a0].
@compute @workgroup_size(64)
fn shared_gate(lane: Lane) {
    var s = 0.0;
    for (var i = lane.lid; i < p.n; i += WG) {
        s += b[i] * c[i];
    }
    let total = sum_all(s, lane);
    if (lane.lid == 0u) {
        a[p.a0] = sigmoid(total);
    }
}

// The MoE output of one token (`Moe::combine`): a[i] = the sum over the
// `p.k` routed experts' outputs `b` (`[k][n]`) with their weights (the
// router's `c[k ..]`), plus the shared expert's output `d` times its gate
// `c[2 k]` (mode 1) or as it is (mode 2: a shared expert without a gate).
@compute @workgroup_size(64)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, lid);
    if (i >= p.n) {
        return;
    }
    var s = 0.0;
    for (var j = 0u; j < p.k; j++) {
        s += c[p.k + j] * b[j * p.n + i];
    }
    if (p.mode == 1u) {
        s += d[i] * c[2u * p.k];
    } else if (p.mode == 2u) {
        s += d[i];
    }
    a[i] = s;
}

// The scale `d` times a quantised value `q`, as the CPU's int8 times its
// scale: a zero has the sign of `d`, set by the bits (a compiler free to
// ignore the sign of zero keeps them).
fn int_times(d: f32, q: f32) -> f32 {
    if (q == 0.0) {
        return bitcast<f32>(bitcast<u32>(d) & 0x80000000u);
    }
    return d * q;
}

// Activations as the CPU's kernels see them (`QActs::quantize`, then
// `QActs::device_values`): block `wid` of `b` quantised to int8 and back into
// `a`. Mode 0: Q8_0 (blocks of 32, `quantize_row_q8_0`'s
// multiplier 127 / amax, the scale kept as f16); mode 1: Q8_1 (the same,
// each block followed by its sum `s`: 33 values); mode 2: Q8_K (blocks of
// 256, `quantize_row_q8_k`: -127 / the value of largest magnitude, with its
// sign, the first one on a tie of signs; at most 127). Rounding half to
// even, as there (WGSL's `round`).
@compute @workgroup_size(64)
fn quant(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let blk = wid.y * max(p.e, 1u) + wid.x;
    let size = select(32u, 256u, p.mode == 2u);
    let base = blk * size;
    let live = base < p.n;
    var hi = 0.0;
    var lo = 0.0;
    for (var i = lane.lid; i < size && live; i += WG) {
        let v = b[base + i];
        hi = max(hi, v);
        lo = min(lo, v);
    }
    hi = max_all(hi, lane);
    lo = -max_all(-lo, lane);
    // abs: no -0 from the maximum of two zeros.
    let amax = abs(max(hi, -lo));
    if (p.mode != 2u) {
        let scale = amax / 127.0;
        let d = round_to_half(scale);
        let id = select(0.0, 127.0 / amax, amax != 0.0);
        // Mode 1 (Q8_1): 33 values per block, the last `s`.
        let out = blk * select(size, size + 1u, p.mode == 1u);
        var qsum = 0.0;
        for (var i = lane.lid; i < size && live; i += WG) {
            let q = round(b[base + i] * id);
            a[out + i] = int_times(d, q);
            qsum += q;
        }
        if (p.mode == 1u) {
            // `quantize_row_q8_1`'s `s`: the integer sum (exact in f32) times
            // the unrounded scale, rounded to f16.
            let total = sum_all(qsum, lane);
            if (lane.lid == 0u && live) {
                a[out + size] = round_to_half(total * scale);
            }
        }
        return;
    }
    // The first value of largest magnitude, when both signs reach it.
    var first = -3.4e38;
    for (var i = lane.lid; i < size && live; i += WG) {
        if (abs(b[base + i]) == amax) {
            first = max(first, -f32(i));
        }
    }
    first = max_all(first, lane);
    var mx = hi;
    if (-lo > hi) {
        mx = lo;
    } else if (-lo == hi) {
        mx = select(0.0, b[base + u32(-first)], live && first > -3.4e38);
    }
    if (amax == 0.0) {
        for (var i = lane.lid; i < size && live; i += WG) {
            a[base + i] = 0.0;
        }
        return;
    }
    let iscale = -127.0 / mx;
    let d = 1.0 / iscale;
    for (var i = lane.lid; i < size && live; i += WG) {
        a[base + i] = int_times(d, min(round(iscale * b[base + i]), 127.0));
    }
}
