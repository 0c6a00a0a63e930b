// Causal attention of a pass's query tokens over a KV cache on the device:
// out[t][h] = softmax(scale * q_th . K) . V over the positions token t sees
// (its own and those before it, within the sliding window when there is
// one), the query heads sharing their KV head (grouped-query attention),
// times sigmoid(gate) per output when the queries carry gates.
//
// One workgroup per (query head, token): its invocations split the
// positions for the scores and their softmax (`max_all`, `sum_all`:
// `reduce.wgsl`, or `reduce_subgroups.wgsl` where the adapter has
// subgroups), then the output dimensions for the weighted sum of the values.
// The scores live in `sc`, one row per (token, head) of a dispatch; a long
// prompt over a long context goes in several dispatches of tokens
// `t0 + wid.y`, so that their scores fit.
//
// The cache is `[kv_head][capacity][dim]` of f16 (two per word, low half
// first; read by `kv_half.wgsl` or `kv_f16.wgsl`) or f32 (`p.f16`). With an
// f16 cache the query and the softmax weights are rounded to f16 before
// they meet the keys and the values, as on the CPU (and in llama.cpp's f16
// cache).

struct Params {
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    head_dim_v: u32,
    // Values per token in q, and from one head's query to the next.
    q_rows: u32,
    q_stride: u32,
    gated: u32,
    capacity: u32,
    // Position of the first token; window length (0: none).
    pos0: u32,
    window: u32,
    f16: u32,
    // Scores per (token, head) row of `sc`.
    sc_stride: u32,
    scale: f32,
    // First token of this dispatch.
    t0: u32,
    // Workgroups per head of a decoded token's split attention
    // (`attention_split.wgsl`; `main` ignores it).
    chunks: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> k: array<u32>;
@group(0) @binding(1) var<storage, read> v: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> sc: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

const WG: u32 = 64u;
// The largest head the query buffer holds (the host checks).
const MAX_HEAD_DIM: u32 = 512u;
var<workgroup> qs: array<f32, MAX_HEAD_DIM>;

// Element `e` of the keys or values, as f32.
fn k_at(e: u32) -> f32 {
    if (p.f16 != 0u) {
        return k_half(e);
    }
    return bitcast<f32>(k[e]);
}

fn v_at(e: u32) -> f32 {
    if (p.f16 != 0u) {
        return v_half(e);
    }
    return bitcast<f32>(v[e]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let lid = lane.lid;
    let h = wid.x;
    let t = p.t0 + wid.y;
    let pos = p.pos0 + t;
    var lo = 0u;
    if (p.window != 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let len = pos + 1u - lo;
    let kvh = h / (p.n_head / p.n_kv_head);
    let hd = p.head_dim;
    let hdv = p.head_dim_v;

    // The query, rounded as the cache rounds it.
    let qb = t * p.q_rows + h * p.q_stride;
    for (var i = lid; i < hd; i += WG) {
        let x = q[qb + i];
        qs[i] = select(x, round_to_half(x), p.f16 != 0u);
    }
    workgroupBarrier();

    // Scores of the positions this invocation takes, and their maximum.
    let sb = (wid.y * p.n_head + h) * p.sc_stride;
    let kb = (kvh * p.capacity + lo) * hd;
    var m = -3.4e38;
    for (var j = lid; j < len; j += WG) {
        var s = 0.0;
        for (var i = 0u; i < hd; i++) {
            s += qs[i] * k_at(kb + j * hd + i);
        }
        s *= p.scale;
        sc[sb + j] = s;
        m = max(m, s);
    }
    m = max_all(m, lane);

    // Softmax: exponentials, their sum, the normalised weights.
    var total = 0.0;
    for (var j = lid; j < len; j += WG) {
        let e = exp(sc[sb + j] - m);
        sc[sb + j] = e;
        total += e;
    }
    let inv = 1.0 / sum_all(total, lane);
    for (var j = lid; j < len; j += WG) {
        let w = sc[sb + j] * inv;
        sc[sb + j] = select(w, round_to_half(w), p.f16 != 0u);
    }
    // Every invocation reads every weight below.
    storageBarrier();

    // The weighted sum of the values, one output dimension per invocation.
    let vb = (kvh * p.capacity + lo) * hdv;
    for (var d = lid; d < hdv; d += WG) {
        var acc = 0.0;
        for (var j = 0u; j < len; j++) {
            acc += sc[sb + j] * v_at(vb + j * hdv + d);
        }
        if (p.gated != 0u) {
            acc *= 1.0 / (1.0 + exp(-q[qb + hd + d]));
        }
        out[(t * p.n_head + h) * hdv + d] = acc;
    }
}
