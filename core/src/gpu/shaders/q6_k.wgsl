// Q6_K: ql[128], qh[64], scales[16] (i8), d (f16). Element 128h + 32k + l
// (k = 0..4, l = 0..32): low 4 bits from ql[64h + 32 (k % 2) + l] (low
// nibble for k < 2, high above), high 2 bits from bits 2k..2k+2 of
// qh[32h + l]; its group of 16 is g = 8h + 2k + l / 16;
// value = d * scale_g * (q - 32).
const BLOCK_BYTES: u32 = 210u;
const BLOCK_ELEMS: u32 = 256u;

fn block_dot(o: u32, xi: u32) -> f32 {
    var s = 0.0;
    for (var g = 0u; g < 16u; g++) {
        let h = g / 8u;
        let k = (g % 8u) / 2u;
        let l0 = 16u * (g % 2u);
        let ql0 = o + 64u * h + 32u * (k % 2u) + l0;
        let qh0 = o + 128u + 32u * h + l0;
        var sq = 0.0;
        // Four quants per word read (the same sums, in the same order).
        for (var l = 0u; l < 16u; l += 4u) {
            let qlw = u32_at(ql0 + l) >> (4u * (k / 2u));
            let qhw = u32_at(qh0 + l) >> (2u * k);
            for (var i = 0u; i < 4u; i++) {
                let lo = (qlw >> (8u * i)) & 15u;
                let hi = (qhw >> (8u * i)) & 3u;
                sq += (f32(lo | (hi << 4u)) - 32.0) * x[xi + 16u * g + l + i];
            }
        }
        s += i8_of(byte_at(o + 192u + g)) * sq;
    }
    return f16_at(o + 208u) * s;
}
