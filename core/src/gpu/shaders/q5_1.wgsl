// Q5_1: d, m (f16), qh (u32), qs[16] as in Q5_0; value = d * q + m. The
// minimum's term is m times the activations' block sum x[xi + 32], as in
// Q4_1.
const BLOCK_BYTES: u32 = 24u;
const BLOCK_ELEMS: u32 = 32u;

fn block_dot(o: u32, xi: u32) -> f32 {
    let qh = u32_at(o + 4u);
    var s = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(o + 8u + j);
        let q0 = (q & 15u) | (((qh >> j) & 1u) << 4u);
        let q1 = (q >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
        s += f32(q0) * x[xi + j] + f32(q1) * x[xi + j + 16u];
    }
    return f16_at(o) * s + f16_at(o + 2u) * x[xi + 32u];
}
