// Q4_K: d, dmin (f16), scales[12] (eight 6-bit scale/min pairs), qs[128].
// Group g of 32 elements is the low (g even) or high (g odd) nibbles of
// qs[32 * (g / 2) ..][..32]; value = d * sc_g * q - dmin * m_g.
const BLOCK_BYTES: u32 = 144u;
const BLOCK_ELEMS: u32 = 256u;

fn block_dot(o: u32, xi: u32) -> f32 {
    let d = f16_at(o);
    let dmin = f16_at(o + 2u);
    var s = 0.0;
    for (var g = 0u; g < 8u; g++) {
        let sm = k4_scale_min(o + 4u, g);
        let q0 = o + 16u + 32u * (g / 2u);
        let shift = 4u * (g % 2u);
        var sq = 0.0;
        var sx = 0.0;
        // Four quants per word read (the same sums, in the same order).
        for (var l = 0u; l < 32u; l += 4u) {
            let q = u32_at(q0 + l) >> shift;
            let xb = xi + 32u * g + l;
            for (var i = 0u; i < 4u; i++) {
                let xv = x[xb + i];
                sq += f32((q >> (8u * i)) & 15u) * xv;
                sx += xv;
            }
        }
        s += d * sm.x * sq - dmin * sm.y * sx;
    }
    return s;
}
