//! IQ2_XXS: 2.06 bits per weight. Super-blocks of 256 weights in 8 groups of
//! 32; each group is 8 bytes read as two little-endian words: the first holds
//! 4 indices (one byte each) into the 256-row grid of 8 magnitudes, the
//! second 4 sign patterns of 7 bits (expanded through `KSIGNS_IQ2XS`) and,
//! in its top 4 bits, the group's scale. See [`super::iq`] for the values.

use super::iq::{self, grid, signed, Unpacked};
use super::iq_grids::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIQ2XXS {
    pub d: F16Bytes,
    pub qs: [u8; QK_K / 4],
}
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockIQ2XXS {}

/// Group `g`'s (grid indices, sign-and-scale word).
#[inline(always)]
pub fn group(b: &BlockIQ2XXS, g: usize) -> ([u8; 4], u32) {
    let q = &b.qs[8 * g..8 * g + 8];
    ([q[0], q[1], q[2], q[3]], u32::from_le_bytes([q[4], q[5], q[6], q[7]]))
}

pub fn unpack(b: &BlockIQ2XXS, u: &mut Unpacked) {
    for g in 0..8 {
        let (idx, aux) = group(b, g);
        let s = (aux >> 28) as u8;
        u.s[2 * g] = s;
        u.s[2 * g + 1] = s;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
            let v = signed(grid(&IQ2XXS_GRID, idx[l] as usize), signs);
            u.v[32 * g + 8 * l..32 * g + 8 * l + 8].copy_from_slice(&v);
        }
    }
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockIQ2XXS>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    let mut u = Unpacked::new();
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        unpack(b, &mut u);
        iq::dequantize_iq2(&u, b.d.to_f32(), y);
    }
}

/// Dot product of one IQ2_XXS row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    iq::vec_dot(as_blocks::<BlockIQ2XXS>(w), a, |b| b.d.to_f32(), unpack)
}
