//! IQ4_NL and IQ4_XS: 4-bit indices into one non-linear table of 16 int8
//! values ([`KVALUES_IQ4NL`]), denser near zero where weights are.
//!
//! IQ4_NL: blocks of 32 with an f16 scale, value = `d * KVALUES[q]`; byte `j`
//! of `qs` holds value `j` in its low nibble and `j + 16` in its high one, as
//! in Q4_0. Dotted with Q8_0 activations.
//!
//! IQ4_XS: super-blocks of 256 in 8 groups of 32, each with a 6-bit scale
//! stored as a low nibble (`scales_l`) and two high bits (`scales_h`);
//! value = `d * (ls - 32) * KVALUES[q]`, nibbles laid out per group as in
//! IQ4_NL. Dotted with Q8_K activations.

use super::{as_blocks, BlockQ8K, BlockQ8_0F, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

/// The 16 values a 4-bit index stands for (`kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

pub const QK4_NL: usize = 32;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: F16Bytes,
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ4NL {}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: F16Bytes,
    /// Two high bits of each group's scale, group `g` at bits `2g..2g + 2`.
    pub scales_h: [u8; 2],
    /// Low nibbles of the group scales, group `g` in byte `g / 2`.
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);
// SAFETY: as above.
unsafe impl FileBlock for BlockIQ4XS {}

impl BlockIQ4XS {
    /// The signed scale `ls - 32` (-32..32) of group `g` (0..8).
    #[inline(always)]
    pub fn scale(&self, g: usize) -> i32 {
        let h = u16::from_le_bytes(self.scales_h);
        let ls = ((self.scales_l[g / 2] >> (4 * (g % 2))) & 0xF) as u16 | (((h >> (2 * g)) & 3) << 4);
        ls as i32 - 32
    }
}

/// 16 bytes of nibbles -> the 32 table values: low nibbles, then high ones.
#[inline(always)]
fn values(qs: &[u8]) -> [i8; 32] {
    debug_assert_eq!(qs.len(), 16);
    let mut v = [0i8; 32];
    for (j, &q) in qs.iter().enumerate() {
        v[j] = KVALUES_IQ4NL[(q & 0xF) as usize];
        v[j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
    }
    v
}

/// `sum v * y` over 32 values.
#[inline(always)]
fn dot32(v: &[i8; 32], y: &[i8]) -> i32 {
    v.iter().zip(y).map(|(&a, &b)| a as i32 * b as i32).sum()
}

pub fn dequantize_row_nl(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ4NL>(src);
    assert_eq!(dst.len(), blocks.len() * QK4_NL);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK4_NL)) {
        let d = b.d.to_f32();
        for (o, &v) in y.iter_mut().zip(&values(&b.qs)) {
            *o = d * v as f32;
        }
    }
}

/// Dot product of one IQ4_NL row with Q8_0 activations.
pub fn vec_dot_nl(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    let blocks = as_blocks::<BlockIQ4NL>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        sum += (x.d.to_f32() * y.d) * dot32(&values(&x.qs), &y.qs) as f32;
    }
    sum
}

pub fn dequantize_row_xs(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ4XS>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (g, (yg, qs)) in y.chunks_exact_mut(32).zip(b.qs.chunks_exact(16)).enumerate() {
            let dl = d * b.scale(g) as f32;
            for (o, &v) in yg.iter_mut().zip(&values(qs)) {
                *o = dl * v as f32;
            }
        }
    }
}

/// Dot product of one IQ4_XS row with Q8_K activations: per super-block an
/// exact integer sum of group scale times group dot product.
pub fn vec_dot_xs(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let blocks = as_blocks::<BlockIQ4XS>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        let mut isum = 0i32;
        for (g, (qs, yg)) in x.qs.chunks_exact(16).zip(y.qs.chunks_exact(32)).enumerate() {
            isum += x.scale(g) * dot32(&values(qs), yg);
        }
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}
