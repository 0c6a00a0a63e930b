//! IQ1_M: 1.75 bits per weight. Super-blocks of 256 weights as 32 rows of 8
//! from the 2048-row grid of -1/0/+1 values (IQ1_S's). Row `r`'s 11-bit
//! index: low 8 bits `qs[r]`, high 3 bits in nibble `r % 2` of `qh[r / 2]`,
//! whose 4th bit is the sign of the row's delta (+-1/8 added to each weight).
//! `scales` is 4 little-endian 16-bit words: each holds four 3-bit scales
//! (one per 16 weights) in its low 12 bits, and the top nibbles of the four
//! words together are the f16 super-block scale. See [`super::iq`].

use super::iq::{self, Unpacked};
use super::iq_grids::IQ1S_GRID;
use super::{as_blocks, f16_to_f32, BlockQ8K, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ1M>() == 56);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ1M {}

/// Scale word `i` (0..4).
#[inline(always)]
fn sc(b: &BlockIQ1M, i: usize) -> u16 {
    u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]])
}

/// The f16 super-block scale, from the top nibbles of the scale words.
#[inline(always)]
pub fn d(b: &BlockIQ1M) -> f32 {
    let bits = (sc(b, 0) >> 12) | (sc(b, 1) >> 8 & 0x00F0) | (sc(b, 2) >> 4 & 0x0F00) | (sc(b, 3) & 0xF000);
    f16_to_f32(bits)
}

/// Row `r`'s (grid index, delta sign: +1 or -1).
#[inline(always)]
pub fn row(b: &BlockIQ1M, r: usize) -> (usize, i8) {
    let h = b.qh[r / 2] >> (4 * (r % 2));
    (b.qs[r] as usize | ((h & 7) as usize) << 8, if h & 8 != 0 { -1 } else { 1 })
}

pub fn unpack(b: &BlockIQ1M, u: &mut Unpacked) {
    for (g, s) in u.s.iter_mut().enumerate() {
        *s = (sc(b, g / 4) >> (3 * (g % 4)) & 7) as u8;
    }
    for r in 0..QK_K / 8 {
        let (i, delta) = row(b, r);
        let grid = IQ1S_GRID[i].to_le_bytes();
        for (v, &g) in u.v[8 * r..8 * r + 8].iter_mut().zip(&grid) {
            *v = 8 * g as i8 + delta;
        }
    }
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ1M>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    let mut u = Unpacked::new();
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        unpack(b, &mut u);
        iq::dequantize_iq1(&u, d(b), y);
    }
}

/// Dot product of one IQ1_M row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    iq::vec_dot(as_blocks::<BlockIQ1M>(w), a, d, unpack)
}
