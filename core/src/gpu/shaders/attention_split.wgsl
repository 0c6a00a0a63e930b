// A decoded token's attention split over the cached positions: `chunks`
// workgroups per head instead of one (`main`), so that a long context
// keeps the device busy. Four passes over the same scores (`sc`) and the
// partial results `part` (`[n_head][chunks][2 + head_dim_v]`: the chunk's
// largest score, its sum of exponentials, its share of the output):
//
//   split_scores   (chunks x heads)  scores of the chunk's positions, their maximum
//   split_exp      (chunks x heads)  exp(score - the head's maximum), their sum
//   split_values   (chunks x heads)  the weights (normalised by the head's sum;
//                                    rounded to f16 with an f16 cache) times the values
//   split_sum      (heads)           the chunks' shares summed, the output gate
//
// The maximum and the weights are those `main` computes; only the order of
// the f32 sums differs (per chunk, then over chunks). Chunk c of a head
// takes positions [c * n, (c + 1) * n) of the `len` it sees, n = len /
// chunks rounded up; a chunk past the end takes none.

@group(0) @binding(8) var<storage, read_write> part: array<f32>;

// The positions a head sees (from `lo`, `len` of them), the chunk's share
// [a, b) of them, and where its partial results and scores lie.
struct Span {
    lo: u32,
    len: u32,
    a: u32,
    b: u32,
    kvh: u32,
    part: u32,
    sc: u32,
}

fn span(c: u32, h: u32) -> Span {
    let pos = p.pos0;
    var lo = 0u;
    if (p.window != 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let len = pos + 1u - lo;
    let n = (len + p.chunks - 1u) / p.chunks;
    let a = min(c * n, len);
    let b = min(a + n, len);
    let kvh = h / (p.n_head / p.n_kv_head);
    return Span(lo, len, a, b, kvh, (h * p.chunks + c) * (2u + p.head_dim_v), h * p.sc_stride);
}

@compute @workgroup_size(64)
fn split_scores(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let lid = lane.lid;
    let h = wid.y;
    let s = span(wid.x, h);
    let hd = p.head_dim;
    // The query, rounded as the cache rounds it.
    let qb = h * p.q_stride;
    for (var i = lid; i < hd; i += WG) {
        let x = q[qb + i];
        qs[i] = select(x, round_to_half(x), p.f16 != 0u);
    }
    workgroupBarrier();
    let kb = (s.kvh * p.capacity + s.lo) * hd;
    var m = -3.4e38;
    for (var j = s.a + lid; j < s.b; j += WG) {
        var x = 0.0;
        for (var i = 0u; i < hd; i++) {
            x += qs[i] * k_at(kb + j * hd + i);
        }
        x *= p.scale;
        sc[s.sc + j] = x;
        m = max(m, x);
    }
    m = max_all(m, lane);
    if (lid == 0u) {
        part[s.part] = m;
    }
}

// The largest score of head `h`, over its chunks' maxima.
fn head_max(h: u32) -> f32 {
    var m = -3.4e38;
    for (var c = 0u; c < p.chunks; c++) {
        m = max(m, part[(h * p.chunks + c) * (2u + p.head_dim_v)]);
    }
    return m;
}

@compute @workgroup_size(64)
fn split_exp(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let lid = lane.lid;
    let h = wid.y;
    let s = span(wid.x, h);
    let m = head_max(h);
    var total = 0.0;
    for (var j = s.a + lid; j < s.b; j += WG) {
        let e = exp(sc[s.sc + j] - m);
        sc[s.sc + j] = e;
        total += e;
    }
    total = sum_all(total, lane);
    if (lid == 0u) {
        part[s.part + 1u] = total;
    }
}

@compute @workgroup_size(64)
fn split_values(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let lid = lane.lid;
    let h = wid.y;
    let s = span(wid.x, h);
    var total = 0.0;
    for (var c = 0u; c < p.chunks; c++) {
        total += part[(h * p.chunks + c) * (2u + p.head_dim_v) + 1u];
    }
    let inv = 1.0 / total;
    for (var j = s.a + lid; j < s.b; j += WG) {
        let w = sc[s.sc + j] * inv;
        sc[s.sc + j] = select(w, round_to_half(w), p.f16 != 0u);
    }
    // Every invocation reads every weight of the chunk below.
    storageBarrier();
    let hdv = p.head_dim_v;
    let vb = (s.kvh * p.capacity + s.lo) * hdv;
    for (var d = lid; d < hdv; d += WG) {
        var acc = 0.0;
        for (var j = s.a; j < s.b; j++) {
            acc += sc[s.sc + j] * v_at(vb + j * hdv + d);
        }
        part[s.part + 2u + d] = acc;
    }
}

@compute @workgroup_size(64)
fn split_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let hdv = p.head_dim_v;
    for (var d = lid; d < hdv; d += WG) {
        var acc = 0.0;
        for (var c = 0u; c < p.chunks; c++) {
            acc += part[(h * p.chunks + c) * (2u + hdv) + 2u + d];
        }
        if (p.gated != 0u) {
            acc *= 1.0 / (1.0 + exp(-q[h * p.q_stride + p.head_dim + d]));
        }
        out[h * hdv + d] = acc;
    }
}
