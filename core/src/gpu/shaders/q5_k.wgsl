// Q5_K: d, dmin (f16), scales[12] as in Q4_K, qh[32], qs[128]. Group g of 32
// elements: nibbles as in Q4_K, the fifth bit of element l of the group is
// bit g of qh[l]; value = d * sc_g * q - dmin * m_g.
const BLOCK_BYTES: u32 = 176u;
const BLOCK_ELEMS: u32 = 256u;

fn block_dot(o: u32, xi: u32) -> f32 {
    let d = f16_at(o);
    let dmin = f16_at(o + 2u);
    var s = 0.0;
    for (var g = 0u; g < 8u; g++) {
        let sm = k4_scale_min(o + 4u, g);
        let q0 = o + 48u + 32u * (g / 2u);
        let shift = 4u * (g % 2u);
        var sq = 0.0;
        var sx = 0.0;
        for (var l = 0u; l < 32u; l++) {
            let xv = x[xi + 32u * g + l];
            let q = ((byte_at(q0 + l) >> shift) & 15u) | (((byte_at(o + 16u + l) >> g) & 1u) << 4u);
            sq += f32(q) * xv;
            sx += xv;
        }
        s += d * sm.x * sq - dmin * sm.y * sx;
    }
    return s;
}
