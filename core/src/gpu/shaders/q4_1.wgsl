// Q4_1: d, m (f16), qs[16] as in Q4_0; value = d * q + m.
const BLOCK_BYTES: u32 = 20u;
const BLOCK_ELEMS: u32 = 32u;

fn block_dot(o: u32, xi: u32) -> f32 {
    var s = 0.0;
    var sx = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(o + 4u + j);
        let x0 = x[xi + j];
        let x1 = x[xi + j + 16u];
        s += f32(q & 15u) * x0 + f32(q >> 4u) * x1;
        sx += x0 + x1;
    }
    return f16_at(o) * s + f16_at(o + 2u) * sx;
}
