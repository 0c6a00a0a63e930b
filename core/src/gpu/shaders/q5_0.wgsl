// Q5_0: d (f16), qh (u32), qs[16]; the low 4 bits as in Q4_0, the fifth bit
// of element j is bit j of qh; value = d * (q - 16).
const BLOCK_BYTES: u32 = 22u;
const BLOCK_ELEMS: u32 = 32u;

fn block_dot(o: u32, xi: u32) -> f32 {
    let qh = u32_at(o + 2u);
    var s = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(o + 6u + j);
        let q0 = (q & 15u) | (((qh >> j) & 1u) << 4u);
        let q1 = (q >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
        s += (f32(q0) - 16.0) * x[xi + j] + (f32(q1) - 16.0) * x[xi + j + 16u];
    }
    return f16_at(o) * s;
}
