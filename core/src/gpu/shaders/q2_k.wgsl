// Q2_K: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin (f16).
// Element 128h + 32j + l is bits 2j..2j+2 of qs[32h + l]; its group of 16,
// g = 8h + 2j + l / 16, gives value = d * sc_g * q - dmin * m_g.
const BLOCK_BYTES: u32 = 84u;
const BLOCK_ELEMS: u32 = 256u;

fn block_dot(o: u32, xi: u32) -> f32 {
    let d = f16_at(o + 80u);
    let dmin = f16_at(o + 82u);
    var s = 0.0;
    for (var g = 0u; g < 16u; g++) {
        let sc = byte_at(o + g);
        let h = g / 8u;
        let shift = 2u * ((g % 8u) / 2u);
        let q0 = o + 16u + 32u * h + 16u * (g % 2u);
        var sq = 0.0;
        var sx = 0.0;
        for (var l = 0u; l < 16u; l++) {
            let xv = x[xi + 16u * g + l];
            sq += f32((byte_at(q0 + l) >> shift) & 3u) * xv;
            sx += xv;
        }
        s += d * f32(sc & 15u) * sq - dmin * f32(sc >> 4u) * sx;
    }
    return s;
}
