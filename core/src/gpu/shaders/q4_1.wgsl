// Q4_1: d, m (f16), qs[16] as in Q4_0; value = d * q + m. The minimum's
// term is m times the activations' block sum x[xi + 32] (Q8_1's `s`, which
// the CPU rounds to f16), not the sum of the values here: as the CPU does.
const BLOCK_BYTES: u32 = 20u;
const BLOCK_ELEMS: u32 = 32u;

fn block_dot(o: u32, xi: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(o + 4u + j);
        s += f32(q & 15u) * x[xi + j] + f32(q >> 4u) * x[xi + j + 16u];
    }
    return f16_at(o) * s + f16_at(o + 2u) * x[xi + 32u];
}
