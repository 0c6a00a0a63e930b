//! IQ2_S: 2.56 bits per weight. Super-blocks of 256 weights as 32 rows of 8;
//! row `r` has a 10-bit index into the 1024-row grid of 8 magnitudes (low 8
//! bits in `qs[r]`, high 2 bits in bits `2(r % 4)` of `qh[r / 4]`) and a
//! full sign byte `qs[32 + r]`. One 4-bit scale per 16 weights, two to a
//! byte of `scales`. See [`super::iq`] for the values.

use super::iq::{self, grid, signed, Unpacked};
use super::iq_grids::IQ2S_GRID;
use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ2S {
    pub d: F16Bytes,
    /// 32 low index bytes, then 32 sign bytes.
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2S>() == 82);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ2S {}

/// Row `r` (0..32): (grid index, sign byte).
#[inline(always)]
pub fn row(b: &BlockIQ2S, r: usize) -> (usize, u8) {
    let hi = (b.qh[r / 4] >> (2 * (r % 4)) & 3) as usize;
    (b.qs[r] as usize | hi << 8, b.qs[32 + r])
}

pub fn unpack(b: &BlockIQ2S, u: &mut Unpacked) {
    for (g, s) in b.scales.iter().enumerate() {
        u.s[2 * g] = s & 0xF;
        u.s[2 * g + 1] = s >> 4;
    }
    for r in 0..QK_K / 8 {
        let (i, signs) = row(b, r);
        u.v[8 * r..8 * r + 8].copy_from_slice(&signed(grid(&IQ2S_GRID, i), signs));
    }
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ2S>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    let mut u = Unpacked::new();
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        unpack(b, &mut u);
        iq::dequantize_iq2(&u, b.d.to_f32(), y);
    }
}

/// Dot product of one IQ2_S row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    iq::vec_dot(as_blocks::<BlockIQ2S>(w), a, |b| b.d.to_f32(), unpack)
}
