//! IQ2_XS: 2.31 bits per weight. Super-blocks of 256 weights as 32 rows of 8;
//! each row is one little-endian 16-bit word: a 9-bit index into the
//! 512-row grid of 8 magnitudes and, above it, a 7-bit sign pattern
//! (expanded through `KSIGNS_IQ2XS`). One 4-bit scale per 16 weights, two to
//! a byte of `scales`. See [`super::iq`] for the values.

use super::iq::{self, grid, signed, Unpacked};
use super::iq_grids::{IQ2XS_GRID, KSIGNS_IQ2XS};
use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ2XS {
    pub d: F16Bytes,
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2XS>() == 74);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ2XS {}

/// Row `r` (0..32): (grid index, sign pattern byte).
#[inline(always)]
pub fn row(b: &BlockIQ2XS, r: usize) -> (usize, u8) {
    let q = u16::from_le_bytes([b.qs[2 * r], b.qs[2 * r + 1]]);
    ((q & 511) as usize, KSIGNS_IQ2XS[(q >> 9) as usize])
}

pub fn unpack(b: &BlockIQ2XS, u: &mut Unpacked) {
    for (g, s) in b.scales.iter().enumerate() {
        u.s[2 * g] = s & 0xF;
        u.s[2 * g + 1] = s >> 4;
    }
    for r in 0..QK_K / 8 {
        let (i, signs) = row(b, r);
        u.v[8 * r..8 * r + 8].copy_from_slice(&signed(grid(&IQ2XS_GRID, i), signs));
    }
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ2XS>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    let mut u = Unpacked::new();
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        unpack(b, &mut u);
        iq::dequantize_iq2(&u, b.d.to_f32(), y);
    }
}

/// Dot product of one IQ2_XS row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    iq::vec_dot(as_blocks::<BlockIQ2XS>(w), a, |b| b.d.to_f32(), unpack)
}
