//! NEON dot products of the ternary formats TQ1_0 and TQ2_0 with Q8_K
//! activations.
//!
//! Each block unpacks into sixteen registers of 16 signed weights `t - 1`
//! (-1..=1; TQ2_0's unused stored 3 gives 2), in the order of the
//! activations, which meet them in [`dot16`]. TQ1_0's digit `k` of a byte
//! `q` is the leading digit of `3^k q mod 256` (`mul` wraps as the
//! reference's `uint8_t` product does), found as two unsigned compares
//! (`>= 86`, `>= 171`) instead of `(3 q) >> 8`.

use super::{dot16, fp16, paths};
use crate::quant::tq::POW3;
use crate::quant::{as_blocks, BlockQ8K, BlockTQ1_0, BlockTQ2_0};
use std::arch::aarch64::*;

paths! {
    tq1_0, tq1_0_rows = dot_tq1_0(BlockQ8K);
    tq2_0, tq2_0_rows = dot_tq2_0(BlockQ8K);
}

/// `t - 1` for the leading base-3 digit `t = (3 q) >> 8` of every byte of `q`.
#[inline(always)]
unsafe fn weight(q: uint8x16_t) -> int8x16_t {
    let ge86 = vreinterpretq_s8_u8(vcgeq_u8(q, vdupq_n_u8(86)));
    let ge171 = vreinterpretq_s8_u8(vcgeq_u8(q, vdupq_n_u8(171)));
    // -1 + [q >= 86] + [q >= 171], the masks being 0 / -1
    vsubq_s8(vsubq_s8(vdupq_n_s8(-1), ge86), ge171)
}

/// The 256 weights of a TQ1_0 block, 16 per register in value order.
#[inline(always)]
unsafe fn weights_tq1(x: &BlockTQ1_0) -> [int8x16_t; 16] {
    let (q0, q1, q2) = (vld1q_u8(x.qs.as_ptr()), vld1q_u8(x.qs.as_ptr().add(16)), vld1q_u8(x.qs.as_ptr().add(32)));
    // qh's four bytes repeated, times 1, 3, 9, 27 by groups of four lanes:
    // digit k of byte j is value 240 + 4 k + j.
    let h = vmulq_u8(
        vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(x.qh))),
        vreinterpretq_u8_u32(vld1q_u32([0x0101_0101, 0x0303_0303, 0x0909_0909, 0x1B1B_1B1B].as_ptr())),
    );
    let mut w = [vdupq_n_s8(0); 16];
    for k in 0..5 {
        let p = vdupq_n_u8(POW3[k]);
        // qs[0..32]: digit k of byte m is value 32 k + m
        w[2 * k] = weight(vmulq_u8(q0, p));
        w[2 * k + 1] = weight(vmulq_u8(q1, p));
        // qs[32..48]: digit k of byte m is value 160 + 16 k + m
        w[10 + k] = weight(vmulq_u8(q2, p));
    }
    w[15] = weight(h);
    w
}

/// The 256 weights of a TQ2_0 block.
#[inline(always)]
unsafe fn weights_tq2(x: &BlockTQ2_0) -> [int8x16_t; 16] {
    let (m, one) = (vdupq_n_u8(3), vdupq_n_s8(1));
    let mut w = [vdupq_n_s8(0); 16];
    for h in 0..2 {
        // byte m of 32 holds values 128 h + 32 l + m at bits 2l..2l + 2
        for half in 0..2 {
            let q = vld1q_u8(x.qs.as_ptr().add(32 * h + 16 * half));
            let parts = [q, vshrq_n_u8::<2>(q), vshrq_n_u8::<4>(q), vshrq_n_u8::<6>(q)];
            for (l, p) in parts.into_iter().enumerate() {
                w[8 * h + 2 * l + half] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(p, m)), one);
            }
        }
    }
    w
}

/// `sum w y` over a block's 256 weights and a Q8_K block, in 4 lanes.
#[inline(always)]
unsafe fn dot256<const D: bool>(w: &[int8x16_t; 16], y: &BlockQ8K) -> int32x4_t {
    let mut s = vdupq_n_s32(0);
    for (j, &wj) in w.iter().enumerate() {
        s = dot16::<D>(s, wj, vld1q_s8(y.qs.as_ptr().add(16 * j)));
    }
    s
}

#[inline(always)]
unsafe fn dot_tq1_0<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockTQ1_0>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut acc = vdupq_n_f32(0.0);
    for (xb, yb) in x.iter().zip(a) {
        let s = dot256::<D>(&weights_tq1(xb), yb);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), fp16(xb.d) * yb.d);
    }
    vaddvq_f32(acc)
}

#[inline(always)]
unsafe fn dot_tq2_0<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockTQ2_0>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut acc = vdupq_n_f32(0.0);
    for (xb, yb) in x.iter().zip(a) {
        let s = dot256::<D>(&weights_tq2(xb), yb);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), fp16(xb.d) * yb.d);
    }
    vaddvq_f32(acc)
}
