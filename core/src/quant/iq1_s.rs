//! IQ1_S: 1.56 bits per weight. Super-blocks of 256 weights in 8 groups of
//! 32, each 4 rows of 8 from the 2048-row grid of -1/0/+1 values. Row `r`'s
//! 11-bit index: low 8 bits `qs[r]`, high 3 bits at bit `3(r % 4)` of the
//! group's 16-bit word `qh[r / 4]`, whose bits 12..15 are the group's 3-bit
//! scale and the sign of its delta (+-1/8 added to every weight). See
//! [`super::iq`] for the values.

use super::iq::{self, Unpacked};
use super::iq_grids::IQ1S_GRID;
use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ1S {
    pub d: F16Bytes,
    pub qs: [u8; QK_K / 8],
    /// 8 little-endian 16-bit words.
    pub qh: [u8; QK_K / 16],
}
const _: () = assert!(size_of::<BlockIQ1S>() == 50);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ1S {}

/// Group `g`'s high-bits word.
#[inline(always)]
pub fn qh(b: &BlockIQ1S, g: usize) -> u16 {
    u16::from_le_bytes([b.qh[2 * g], b.qh[2 * g + 1]])
}

/// Row `r`'s grid index.
#[inline(always)]
pub fn index(b: &BlockIQ1S, r: usize) -> usize {
    b.qs[r] as usize | ((qh(b, r / 4) >> (3 * (r % 4))) as usize & 7) << 8
}

pub fn unpack(b: &BlockIQ1S, u: &mut Unpacked) {
    for g in 0..8 {
        let h = qh(b, g);
        let s = (h >> 12 & 7) as u8;
        u.s[2 * g] = s;
        u.s[2 * g + 1] = s;
        let delta: i8 = if h & 0x8000 != 0 { -1 } else { 1 };
        for r in 4 * g..4 * g + 4 {
            let row = IQ1S_GRID[index(b, r)].to_le_bytes();
            for (v, &g) in u.v[8 * r..8 * r + 8].iter_mut().zip(&row) {
                *v = 8 * g as i8 + delta;
            }
        }
    }
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ1S>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    let mut u = Unpacked::new();
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        unpack(b, &mut u);
        iq::dequantize_iq1(&u, b.d.to_f32(), y);
    }
}

/// Dot product of one IQ1_S row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    iq::vec_dot(as_blocks::<BlockIQ1S>(w), a, |b| b.d.to_f32(), unpack)
}
