//! NEON dot products of the IQ1 / IQ2 formats (IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ1_S, IQ1_M) with Q8_K activations.
//!
//! One body serves all five: each format gives, per group of 16 weights, the
//! signed weights as int8 lanes and the group's scale `2s + 1`
//! ([`IqBlock::group`]); the body dots them with 16 activations (`sdot`, or
//! widening multiplies on plain NEON) and multiply-accumulates the 4 lanes
//! with the scale. Grid rows are 8 bytes: two table loads make a register.
//! IQ2 weights are grid magnitudes (<= 43) times +-1 signs; IQ1 weights are
//! `8 * grid + delta` (|v| <= 9). The integers are the scalar twin's exactly;
//! per block `d * d_y * sum`, and 1/8 at the end (see `quant::iq`).

use super::{dot16, fp16, paths};
use crate::quant::iq::{KSIGN_BYTES, SIGN_BYTES};
use crate::quant::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use crate::quant::{
    as_blocks, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS,
    BlockQ8K, FileBlock,
};
use std::arch::aarch64::*;

paths! {
    iq2_xxs, iq2_xxs_rows = dot_iq2_xxs(BlockQ8K);
    iq2_xs, iq2_xs_rows = dot_iq2_xs(BlockQ8K);
    iq2_s, iq2_s_rows = dot_iq2_s(BlockQ8K);
    iq1_s, iq1_s_rows = dot_iq1_s(BlockQ8K);
    iq1_m, iq1_m_rows = dot_iq1_m(BlockQ8K);
}

/// A block of one of the formats, as the common body sees it.
trait IqBlock: FileBlock {
    /// The super-block scale.
    unsafe fn d(&self) -> f32;
    /// Weights `16g..16g + 16` as int8 lanes, and their scale `2s + 1`.
    unsafe fn group(&self, g: usize) -> (int8x16_t, i32);
}

/// Two 8-byte table rows, the first in the low half.
#[inline(always)]
unsafe fn rows2(t: &[u64], i0: usize, i1: usize) -> int8x16_t {
    vcombine_s8(vcreate_s8(t[i0]), vcreate_s8(t[i1]))
}

/// IQ2 weights: grid magnitudes times the +-1 sign bytes.
#[inline(always)]
unsafe fn iq2_weights(grid: int8x16_t, signs: int8x16_t) -> int8x16_t {
    vmulq_s8(grid, signs)
}

/// IQ1 weights: `8 * grid + delta` (grid -1, 0 or +1; delta +-1 per byte).
#[inline(always)]
unsafe fn iq1_weights(grid: int8x16_t, delta: int8x16_t) -> int8x16_t {
    vaddq_s8(vshlq_n_s8::<3>(grid), delta)
}

/// A row's delta (+-1) in all 8 of its bytes.
#[inline(always)]
fn splat(d: i8) -> u64 {
    d as u8 as u64 * 0x0101_0101_0101_0101
}

impl IqBlock for BlockIQ2XXS {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn group(&self, g: usize) -> (int8x16_t, i32) {
        let (idx, aux) = iq2_xxs::group(self, g / 2);
        let l = 2 * (g % 2);
        let grid = rows2(&IQ2XXS_GRID, idx[l] as usize, idx[l + 1] as usize);
        let sign = |l: usize| (aux >> (7 * l) & 127) as usize;
        let signs = rows2(&KSIGN_BYTES, sign(l), sign(l + 1));
        (iq2_weights(grid, signs), 2 * (aux >> 28) as i32 + 1)
    }
}

impl IqBlock for BlockIQ2XS {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn group(&self, g: usize) -> (int8x16_t, i32) {
        let ((i0, s0), (i1, s1)) = (iq2_xs::row(self, 2 * g), iq2_xs::row(self, 2 * g + 1));
        let w = iq2_weights(rows2(&IQ2XS_GRID, i0, i1), rows2(&SIGN_BYTES, s0 as usize, s1 as usize));
        (w, 2 * (self.scales[g / 2] >> (4 * (g % 2)) & 0xF) as i32 + 1)
    }
}

impl IqBlock for BlockIQ2S {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn group(&self, g: usize) -> (int8x16_t, i32) {
        let ((i0, s0), (i1, s1)) = (iq2_s::row(self, 2 * g), iq2_s::row(self, 2 * g + 1));
        let w = iq2_weights(rows2(&IQ2S_GRID, i0, i1), rows2(&SIGN_BYTES, s0 as usize, s1 as usize));
        (w, 2 * (self.scales[g / 2] >> (4 * (g % 2)) & 0xF) as i32 + 1)
    }
}

impl IqBlock for BlockIQ1S {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn group(&self, g: usize) -> (int8x16_t, i32) {
        let h = iq1_s::qh(self, g / 2);
        let grid = rows2(&IQ1S_GRID, iq1_s::index(self, 2 * g), iq1_s::index(self, 2 * g + 1));
        let delta = vdupq_n_s8(if h & 0x8000 != 0 { -1 } else { 1 });
        (iq1_weights(grid, delta), 2 * (h >> 12 & 7) as i32 + 1)
    }
}

impl IqBlock for BlockIQ1M {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        iq1_m::d(self)
    }
    #[inline(always)]
    unsafe fn group(&self, g: usize) -> (int8x16_t, i32) {
        let ((i0, d0), (i1, d1)) = (iq1_m::row(self, 2 * g), iq1_m::row(self, 2 * g + 1));
        let delta = vcombine_s8(vcreate_s8(splat(d0)), vcreate_s8(splat(d1)));
        let w = u16::from_le_bytes([self.scales[g / 4 * 2], self.scales[g / 4 * 2 + 1]]);
        (iq1_weights(rows2(&IQ1S_GRID, i0, i1), delta), 2 * (w >> (3 * (g % 4)) & 7) as i32 + 1)
    }
}

/// The common body: one weight row with one activation row.
#[inline(always)]
unsafe fn dot_iq<B: IqBlock, const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<B>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let mut sumi = vdupq_n_s32(0);
        for g in 0..16 {
            let (w, ls) = xb.group(g);
            let p = dot16::<D>(vdupq_n_s32(0), w, vld1q_s8(yb.qs.as_ptr().add(16 * g)));
            sumi = vmlaq_n_s32(sumi, p, ls);
        }
        sum += xb.d() * yb.d * vaddvq_s32(sumi) as f32;
    }
    0.125 * sum
}

#[inline(always)]
unsafe fn dot_iq2_xxs<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_iq::<BlockIQ2XXS, D>(w, a)
}

#[inline(always)]
unsafe fn dot_iq2_xs<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_iq::<BlockIQ2XS, D>(w, a)
}

#[inline(always)]
unsafe fn dot_iq2_s<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_iq::<BlockIQ2S, D>(w, a)
}

#[inline(always)]
unsafe fn dot_iq1_s<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_iq::<BlockIQ1S, D>(w, a)
}

#[inline(always)]
unsafe fn dot_iq1_m<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    dot_iq::<BlockIQ1M, D>(w, a)
}
