//! NEON I8MM 2x2 tiles for prefill: `smmla` multiplies a 2x8 block of int8
//! weights (8 values of two weight rows) by a 2x8 block of activations (8
//! values of two activation rows) into all four dot products at once, so each
//! unpacked weight register serves two tokens.
//!
//! Results are `[w0.a0, w0.a1, w1.a0, w1.a1]`; the integer sums are the same
//! as the row kernels', only regrouped.
//!
//! Only Q4_0 has a tile: its 4-bit values cost as much to unpack as to
//! multiply, so sharing them between two tokens pays for interleaving the
//! activations (0.94 -> 0.80 M instructions per prompt token on
//! qwen3moe-tiny Q4_0, p = 32). Tiles for Q8_0, Q4_K and Q6_K were measured
//! and removed: they cost more than the rows kernels once per token (Q8_0
//! 1.76 vs 1.66 M on gemma3-tiny Q8_0; qwen35moe mid Q4_K_M 101.7 vs 85.5 M
//! at p = 64 and 101.6 vs 85.5 M at p = 16), whose chained group scales and
//! four-row headers a 2x2 tile cannot share.

use super::fp16;
use super::legacy::nibbles;
use crate::quant::{as_blocks, BlockQ4_0, BlockQ8_0F};
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

/// Two Q4_0 rows (values `nibble - 8`) with two activation rows.
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn tile_q4_0(w0: &[u8], w1: &[u8], a0: &[BlockQ8_0F], a1: &[BlockQ8_0F]) -> [f32; 4] {
    let (w0, w1) = (as_blocks::<BlockQ4_0>(w0), as_blocks::<BlockQ4_0>(w1));
    debug_assert!(w0.len() == w1.len() && w0.len() == a0.len() && a0.len() == a1.len());
    let eight = vdupq_n_s8(8);
    let signed = |b: &BlockQ4_0| {
        let (lo, hi) = nibbles(&b.qs);
        (vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight))
    };
    let y = |b: &BlockQ8_0F, h: usize| vld1q_s8(b.qs.as_ptr().add(16 * h));
    let mut acc = vdupq_n_f32(0.0);
    for i in 0..w0.len() {
        let ((x0l, x0h), (x1l, x1h)) = (signed(&w0[i]), signed(&w1[i]));
        let c = mm16(vdupq_n_s32(0), x0l, x1l, y(&a0[i], 0), y(&a1[i], 0));
        let c = mm16(c, x0h, x1h, y(&a0[i], 1), y(&a1[i], 1));
        let d = outer(fp16(w0[i].d), fp16(w1[i].d), a0[i].d, a1[i].d);
        acc = vfmaq_f32(acc, vcvtq_f32_s32(c), d);
    }
    split(acc)
}
