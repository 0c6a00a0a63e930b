//! NEON I8MM 2x2 tiles for prefill: `smmla` multiplies a 2x8 block of int8
//! weights (8 values of two weight rows) by a 2x8 block of activations (8
//! values of two activation rows) into all four dot products at once, so each
//! unpacked weight register serves two tokens.
//!
//! Results are `[w0.a0, w0.a1, w1.a0, w1.a1]`; the integer sums are the same
//! as the row kernels', only regrouped.

use super::fp16;
use super::kquants::{acts, mins_dot_bsums32, q6_half};
use super::legacy::nibbles;
use crate::quant::{as_blocks, scales_mins_k4, BlockQ4K, BlockQ4_0, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_0F};
use std::arch::aarch64::*;
use std::arch::asm;

/// `smmla`: `acc[2i + j] += sum_k a[8i + k] * b[8j + k]`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
        options(pure, nomem, nostack)
    );
    acc
}

/// The 2x2 dot products of 16 values: weights `x0`, `x1`, activations `y0`, `y1`.
#[inline(always)]
unsafe fn mm16(acc: int32x4_t, x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> int32x4_t {
    // Interleave 8-byte halves: [x0 lo, x1 lo] and [x0 hi, x1 hi].
    let zip1 =
        |a: int8x16_t, b: int8x16_t| vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
    let zip2 =
        |a: int8x16_t, b: int8x16_t| vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
    let acc = smmla(acc, zip1(x0, x1), zip1(y0, y1));
    smmla(acc, zip2(x0, x1), zip2(y0, y1))
}

/// `[a0 * b0, a0 * b1, a1 * b0, a1 * b1]`: the scale of each tile element.
#[inline(always)]
unsafe fn outer(a0: f32, a1: f32, b0: f32, b1: f32) -> float32x4_t {
    let b = vset_lane_f32::<1>(b1, vdup_n_f32(b0));
    vmulq_f32(vcombine_f32(vdup_n_f32(a0), vdup_n_f32(a1)), vcombine_f32(b, b))
}

#[inline(always)]
unsafe fn split(v: float32x4_t) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    vst1q_f32(out.as_mut_ptr(), v);
    out
}

/// Shared loop of the Q8_0-activation formats: `signed(block)` yields the two
/// 16-value halves of a weight block.
#[inline(always)]
unsafe fn tile_q8<B>(
    w0: &[B],
    w1: &[B],
    a0: &[BlockQ8_0F],
    a1: &[BlockQ8_0F],
    scale: impl Fn(&B) -> f32,
    signed: impl Fn(&B) -> (int8x16_t, int8x16_t),
) -> [f32; 4] {
    debug_assert!(w0.len() == w1.len() && w0.len() == a0.len() && a0.len() == a1.len());
    let mut acc = vdupq_n_f32(0.0);
    for i in 0..w0.len() {
        let ((x0l, x0h), (x1l, x1h)) = (signed(&w0[i]), signed(&w1[i]));
        let y = |b: &BlockQ8_0F, h: usize| vld1q_s8(b.qs.as_ptr().add(16 * h));
        let c = mm16(vdupq_n_s32(0), x0l, x1l, y(&a0[i], 0), y(&a1[i], 0));
        let c = mm16(c, x0h, x1h, y(&a0[i], 1), y(&a1[i], 1));
        let d = outer(scale(&w0[i]), scale(&w1[i]), a0[i].d, a1[i].d);
        acc = vfmaq_f32(acc, vcvtq_f32_s32(c), d);
    }
    split(acc)
}

#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn tile_q8_0(w0: &[u8], w1: &[u8], a0: &[BlockQ8_0F], a1: &[BlockQ8_0F]) -> [f32; 4] {
    tile_q8::<BlockQ8_0>(
        as_blocks(w0),
        as_blocks(w1),
        a0,
        a1,
        |b| fp16(b.d),
        |b| (vld1q_s8(b.qs.as_ptr()), vld1q_s8(b.qs.as_ptr().add(16))),
    )
}

#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn tile_q4_0(w0: &[u8], w1: &[u8], a0: &[BlockQ8_0F], a1: &[BlockQ8_0F]) -> [f32; 4] {
    tile_q8::<BlockQ4_0>(
        as_blocks(w0),
        as_blocks(w1),
        a0,
        a1,
        |b| fp16(b.d),
        |b| {
            // nibble - 8
            let (lo, hi) = nibbles(&b.qs);
            let eight = vdupq_n_s8(8);
            (vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight))
        },
    )
}

/// Per-row scales of one group as the 2x2 tile sees them: `[s0, s0, s1, s1]`.
#[inline(always)]
unsafe fn row_scales(s0: i32, s1: i32) -> int32x4_t {
    vcombine_s32(vdup_n_s32(s0), vdup_n_s32(s1))
}

#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn tile_q4_k(w0: &[u8], w1: &[u8], a0: &[BlockQ8K], a1: &[BlockQ8K]) -> [f32; 4] {
    let (w0, w1) = (as_blocks::<BlockQ4K>(w0), as_blocks::<BlockQ4K>(w1));
    debug_assert!(w0.len() == w1.len() && w0.len() == a0.len() && a0.len() == a1.len());
    let low = vdupq_n_u8(0x0F);
    let mut acc = vdupq_n_f32(0.0);
    for i in 0..w0.len() {
        let (x0, x1, y0, y1) = (&w0[i], &w1[i], &a0[i], &a1[i]);
        let (sc0, m0) = scales_mins_k4(&x0.scales);
        let (sc1, m1) = scales_mins_k4(&x1.scales);
        let summ = [
            mins_dot_bsums32(&m0, y0),
            mins_dot_bsums32(&m0, y1),
            mins_dot_bsums32(&m1, y0),
            mins_dot_bsums32(&m1, y1),
        ];
        let mut sumi = vdupq_n_s32(0);
        for c in 0..4 {
            let q = |b: &BlockQ4K, h: usize| vld1q_u8(b.qs.as_ptr().add(32 * c + 16 * h));
            let (q00, q01, q10, q11) = (q(x0, 0), q(x0, 1), q(x1, 0), q(x1, 1));
            let s8 = |v: uint8x16_t| vreinterpretq_s8_u8(v);
            // low nibbles: group 2c
            let p =
                mm16(vdupq_n_s32(0), s8(vandq_u8(q00, low)), s8(vandq_u8(q10, low)), acts(y0, 4 * c), acts(y1, 4 * c));
            let p = mm16(p, s8(vandq_u8(q01, low)), s8(vandq_u8(q11, low)), acts(y0, 4 * c + 1), acts(y1, 4 * c + 1));
            sumi = vmlaq_s32(sumi, p, row_scales(sc0[2 * c] as i32, sc1[2 * c] as i32));
            // high nibbles: group 2c + 1
            let hi = |v: uint8x16_t| s8(vshrq_n_u8::<4>(v));
            let p = mm16(vdupq_n_s32(0), hi(q00), hi(q10), acts(y0, 4 * c + 2), acts(y1, 4 * c + 2));
            let p = mm16(p, hi(q01), hi(q11), acts(y0, 4 * c + 3), acts(y1, 4 * c + 3));
            sumi = vmlaq_s32(sumi, p, row_scales(sc0[2 * c + 1] as i32, sc1[2 * c + 1] as i32));
        }
        let d = outer(fp16(x0.d), fp16(x1.d), y0.d, y1.d);
        let dmin = outer(fp16(x0.dmin), fp16(x1.dmin), y0.d, y1.d);
        acc = vfmaq_f32(acc, vcvtq_f32_s32(sumi), d);
        acc = vfmsq_f32(acc, vcvtq_f32_s32(vld1q_s32(summ.as_ptr())), dmin);
    }
    split(acc)
}

#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn tile_q6_k(w0: &[u8], w1: &[u8], a0: &[BlockQ8K], a1: &[BlockQ8K]) -> [f32; 4] {
    let (w0, w1) = (as_blocks::<BlockQ6K>(w0), as_blocks::<BlockQ6K>(w1));
    debug_assert!(w0.len() == w1.len() && w0.len() == a0.len() && a0.len() == a1.len());
    let mut acc = vdupq_n_f32(0.0);
    for i in 0..w0.len() {
        let (x0, x1, y0, y1) = (&w0[i], &w1[i], &a0[i], &a1[i]);
        let mut sumi = vdupq_n_s32(0);
        for h in 0..2 {
            let (v0, v1) = (q6_half(x0, h), q6_half(x1, h));
            for r in 0..8 {
                let g = 8 * h + r;
                let p = mm16(vdupq_n_s32(0), v0[r], v1[r], acts(y0, g), acts(y1, g));
                sumi = vmlaq_s32(sumi, p, row_scales(x0.scales[g] as i32, x1.scales[g] as i32));
            }
        }
        acc = vfmaq_f32(acc, vcvtq_f32_s32(sumi), outer(fp16(x0.d), fp16(x1.d), y0.d, y1.d));
    }
    split(acc)
}
