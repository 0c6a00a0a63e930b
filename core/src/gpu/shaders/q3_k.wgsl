// Q3_K: hmask[32], qs[64], scales[12] (sixteen 6-bit scales, biased by 32),
// d (f16). Element 128h + 32j + l: the low 2 bits are bits 2j..2j+2 of
// qs[32h + l]; 4 is subtracted unless bit 4h + j of hmask[l] is set; its
// group of 16 is g = 8h + 2j + l / 16; value = d * (sc_g - 32) * q.
const BLOCK_BYTES: u32 = 110u;
const BLOCK_ELEMS: u32 = 256u;

// Scale g (0..16) of the 12 packed bytes at `o`: four low bits from bytes
// 0..8 (nibble g / 8 of byte g % 8), two high bits from bytes 8..12.
fn q3k_scale(o: u32, g: u32) -> f32 {
    let low = (byte_at(o + (g % 8u)) >> (4u * (g / 8u))) & 15u;
    let high = (byte_at(o + 8u + (g % 4u)) >> (2u * (g / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

fn block_dot(o: u32, xi: u32) -> f32 {
    let d = f16_at(o + 108u);
    var s = 0.0;
    for (var g = 0u; g < 16u; g++) {
        let h = g / 8u;
        let j = (g % 8u) / 2u;
        let l0 = 16u * (g % 2u);
        var sq = 0.0;
        for (var l = 0u; l < 16u; l++) {
            let low = (byte_at(o + 32u + 32u * h + l0 + l) >> (2u * j)) & 3u;
            let keep = (byte_at(o + l0 + l) >> (4u * h + j)) & 1u;
            let q = f32(low) - select(4.0, 0.0, keep == 1u);
            sq += q * x[xi + 16u * g + l];
        }
        s += q3k_scale(o + 96u, g) * sq;
    }
    return d * s;
}
