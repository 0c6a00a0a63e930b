//! IQ3_XXS: super-blocks of 256 weights as 64 points of a 256-entry grid of
//! 4 unsigned values (3.06 bits per weight).
//!
//! Each group of 32 has 8 grid indices (`grid`) and one little-endian u32 in
//! `scales_signs`: bits `7l..7l + 7` (l < 4) select the signs of values
//! `8l..8l + 8` (seven stored bits, the eighth is their parity: an even
//! number of negatives), bits 28..32 the group scale `s`. value =
//! `d * (0.5 + s) / 2 * grid * sign`. Dotted with Q8_K activations in
//! integers: `(2s + 1) * sum(grid * sign * q)`, times `d * y.d / 4`.

use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ3XXS {
    pub d: F16Bytes,
    /// Grid indices, 8 per group of 32 values.
    pub grid: [u8; QK_K / 4],
    /// Per group, a little-endian u32 of four 7-bit sign indices and a 4-bit scale.
    pub scales_signs: [u8; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ3XXS {}

impl BlockIQ3XXS {
    /// Group `g`'s word: four 7-bit sign indices and the scale in the top nibble.
    #[inline(always)]
    pub fn aux(&self, g: usize) -> u32 {
        let s = &self.scales_signs[4 * g..4 * g + 4];
        u32::from_le_bytes([s[0], s[1], s[2], s[3]])
    }
}

/// The 8 sign bits of 7 stored ones: the eighth makes the count of set bits
/// even (llama.cpp's `ksigns_iq2xs[i]`, computed).
#[inline(always)]
pub const fn signs8(i: u32) -> u8 {
    let i = i & 0x7F;
    (i | ((i.count_ones() & 1) << 7)) as u8
}

/// The four grid values of index `i`.
#[inline(always)]
pub fn grid(i: u8) -> [u8; 4] {
    GRID[i as usize].to_le_bytes()
}

/// Group `g` of a block as 32 signed integers `grid * sign`.
#[inline(always)]
fn group(b: &BlockIQ3XXS, g: usize) -> [i8; 32] {
    let aux = b.aux(g);
    let mut v = [0i8; 32];
    for l in 0..4 {
        let signs = signs8(aux >> (7 * l));
        for h in 0..2 {
            let q = grid(b.grid[8 * g + 2 * l + h]);
            for j in 0..4 {
                let neg = signs & (1 << (4 * h + j)) != 0;
                v[8 * l + 4 * h + j] = if neg { -(q[j] as i8) } else { q[j] as i8 };
            }
        }
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ3XXS>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (g, yg) in y.chunks_exact_mut(32).enumerate() {
            let db = d * (0.5 + (b.aux(g) >> 28) as f32) * 0.5;
            for (o, &v) in yg.iter_mut().zip(&group(b, g)) {
                // |v| first, then the sign: the rounding of gguf-py's `db * grid * sign`.
                let m = db * v.unsigned_abs() as f32;
                *o = if v < 0 { -m } else { m };
            }
        }
    }
}

/// Dot product of one IQ3_XXS row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let blocks = as_blocks::<BlockIQ3XXS>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        let mut isum = 0i32;
        for g in 0..8 {
            let ls = 2 * (x.aux(g) >> 28) as i32 + 1;
            let v = group(x, g);
            let dot: i32 = v.iter().zip(&y.qs[32 * g..32 * g + 32]).map(|(&p, &q)| p as i32 * q as i32).sum();
            isum += ls * dot;
        }
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    0.25 * sum
}

/// `iq3xxs_grid`: 256 points of 4 values in {4, 12, ..., 62}, byte `j` value `j`.
#[rustfmt::skip]
pub static GRID: [u32; 256] = [
    0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e, 0x04041404, 0x04041414,
    0x04041c0c, 0x04042414, 0x04043e1c, 0x04043e2c, 0x040c040c, 0x040c041c, 0x040c0c04, 0x040c0c14,
    0x040c140c, 0x040c142c, 0x040c1c04, 0x040c1c14, 0x040c240c, 0x040c2c24, 0x040c3e04, 0x04140404,
    0x04140414, 0x04140424, 0x04140c0c, 0x04141404, 0x04141414, 0x04141c0c, 0x04141c1c, 0x04141c3e,
    0x04142c0c, 0x04142c3e, 0x04143e2c, 0x041c040c, 0x041c043e, 0x041c0c04, 0x041c0c14, 0x041c142c,
    0x041c3e04, 0x04240c1c, 0x04241c3e, 0x04242424, 0x04242c3e, 0x04243e1c, 0x04243e2c, 0x042c040c,
    0x042c043e, 0x042c1c14, 0x042c2c14, 0x04341c2c, 0x04343424, 0x043e0c04, 0x043e0c24, 0x043e0c34,
    0x043e241c, 0x043e340c, 0x0c04040c, 0x0c04041c, 0x0c040c04, 0x0c040c14, 0x0c04140c, 0x0c04141c,
    0x0c041c04, 0x0c041c14, 0x0c041c24, 0x0c04243e, 0x0c042c04, 0x0c0c0404, 0x0c0c0414, 0x0c0c0c0c,
    0x0c0c1404, 0x0c0c1414, 0x0c14040c, 0x0c14041c, 0x0c140c04, 0x0c140c14, 0x0c14140c, 0x0c141c04,
    0x0c143e14, 0x0c1c0404, 0x0c1c0414, 0x0c1c1404, 0x0c1c1c0c, 0x0c1c2434, 0x0c1c3434, 0x0c24040c,
    0x0c24042c, 0x0c242c04, 0x0c2c1404, 0x0c2c1424, 0x0c2c2434, 0x0c2c3e0c, 0x0c34042c, 0x0c3e1414,
    0x0c3e2404, 0x14040404, 0x14040414, 0x14040c0c, 0x14040c1c, 0x14041404, 0x14041414, 0x14041434,
    0x14041c0c, 0x14042414, 0x140c040c, 0x140c041c, 0x140c042c, 0x140c0c04, 0x140c0c14, 0x140c140c,
    0x140c1c04, 0x140c341c, 0x140c343e, 0x140c3e04, 0x14140404, 0x14140414, 0x14140c0c, 0x14140c3e,
    0x14141404, 0x14141414, 0x14141c3e, 0x14142404, 0x14142c2c, 0x141c040c, 0x141c0c04, 0x141c0c24,
    0x141c3e04, 0x141c3e24, 0x14241c2c, 0x14242c1c, 0x142c041c, 0x142c143e, 0x142c240c, 0x142c3e24,
    0x143e040c, 0x143e041c, 0x143e0c34, 0x143e242c, 0x1c04040c, 0x1c040c04, 0x1c040c14, 0x1c04140c,
    0x1c04141c, 0x1c042c04, 0x1c04342c, 0x1c043e14, 0x1c0c0404, 0x1c0c0414, 0x1c0c1404, 0x1c0c1c0c,
    0x1c0c2424, 0x1c0c2434, 0x1c14040c, 0x1c14041c, 0x1c140c04, 0x1c14142c, 0x1c142c14, 0x1c143e14,
    0x1c1c0c0c, 0x1c1c1c1c, 0x1c241c04, 0x1c24243e, 0x1c243e14, 0x1c2c0404, 0x1c2c0434, 0x1c2c1414,
    0x1c2c2c2c, 0x1c340c24, 0x1c341c34, 0x1c34341c, 0x1c3e1c1c, 0x1c3e3404, 0x24040424, 0x24040c3e,
    0x24041c2c, 0x24041c3e, 0x24042c1c, 0x24042c3e, 0x240c3e24, 0x24141404, 0x24141c3e, 0x24142404,
    0x24143404, 0x24143434, 0x241c043e, 0x241c242c, 0x24240424, 0x24242c0c, 0x24243424, 0x242c142c,
    0x242c241c, 0x242c3e04, 0x243e042c, 0x243e0c04, 0x243e0c14, 0x243e1c04, 0x2c040c14, 0x2c04240c,
    0x2c043e04, 0x2c0c0404, 0x2c0c0434, 0x2c0c1434, 0x2c0c2c2c, 0x2c140c24, 0x2c141c14, 0x2c143e14,
    0x2c1c0414, 0x2c1c2c1c, 0x2c240c04, 0x2c24141c, 0x2c24143e, 0x2c243e14, 0x2c2c0414, 0x2c2c1c0c,
    0x2c342c04, 0x2c3e1424, 0x2c3e2414, 0x34041424, 0x34042424, 0x34042434, 0x34043424, 0x340c140c,
    0x340c340c, 0x34140c3e, 0x34143424, 0x341c1c04, 0x341c1c34, 0x34242424, 0x342c042c, 0x342c2c14,
    0x34341c1c, 0x343e041c, 0x343e140c, 0x3e04041c, 0x3e04042c, 0x3e04043e, 0x3e040c04, 0x3e041c14,
    0x3e042c14, 0x3e0c1434, 0x3e0c2404, 0x3e140c14, 0x3e14242c, 0x3e142c14, 0x3e1c0404, 0x3e1c0c2c,
    0x3e1c1c1c, 0x3e1c3404, 0x3e24140c, 0x3e24240c, 0x3e2c0404, 0x3e2c0414, 0x3e2c1424, 0x3e341c04,
];
