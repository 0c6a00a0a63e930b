//! NEON dot products of the K-quants (Q2_K..Q6_K) with Q8_K activations.
//!
//! Weights are unpacked 16 at a time into int8 lanes (with their offset
//! removed, so no correction pass is needed except for the minimums), dotted
//! with 16 activations, and the 4-lane result is multiply-accumulated with the
//! group scale into an i32 accumulator; one horizontal sum per super-block.

use super::{dot16, fp16, paths};
use crate::quant::q3_k::unpack_scales;
use crate::quant::{as_blocks, scales_mins_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::arch::aarch64::*;

paths! {
    q2_k, q2_k_rows = dot_q2_k(BlockQ8K);
    q3_k, q3_k_rows = dot_q3_k(BlockQ8K);
    q4_k, q4_k_rows = dot_q4_k(BlockQ8K);
    q5_k, q5_k_rows = dot_q5_k(BlockQ8K);
    q6_k, q6_k_rows = dot_q6_k(BlockQ8K);
}

/// Activations `16i..16i + 16` of a Q8_K block.
#[inline(always)]
pub(super) unsafe fn acts(y: &BlockQ8K, i: usize) -> int8x16_t {
    vld1q_s8(y.qs.as_ptr().add(16 * i))
}

/// `sum_g mins[g] * bsums[g]` over the 16 groups of 16 (unsigned mins < 256).
#[inline(always)]
unsafe fn mins_dot_bsums16(mins: uint8x16_t, y: &BlockQ8K) -> i32 {
    let (b0, b1) = (vld1q_s16(y.bsums.as_ptr()), vld1q_s16(y.bsums.as_ptr().add(8)));
    let m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
    let m1 = vreinterpretq_s16_u16(vmovl_high_u8(mins));
    let p = vmlal_high_s16(vmull_s16(vget_low_s16(m0), vget_low_s16(b0)), m0, b0);
    let p = vmlal_high_s16(vmlal_s16(p, vget_low_s16(m1), vget_low_s16(b1)), m1, b1);
    vaddvq_s32(p)
}

/// `sum_g mins[g] * (bsum_2g + bsum_2g+1)` over the 8 groups of 32.
#[inline(always)]
pub(super) unsafe fn mins_dot_bsums32(mins: &[u8; 8], y: &BlockQ8K) -> i32 {
    // Adjacent pairs of the 16 sums of 16 -> 8 sums of 32.
    let pairs = vpaddq_s16(vld1q_s16(y.bsums.as_ptr()), vld1q_s16(y.bsums.as_ptr().add(8)));
    let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins.as_ptr())));
    vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs))
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a register reinterpretation.
    unsafe { vreinterpretq_s8_u8(v) }
}

#[inline(always)]
unsafe fn dot_q2_k<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockQ2K>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let summ = mins_dot_bsums16(vshrq_n_u8::<4>(vld1q_u8(xb.scales.as_ptr())), yb);
        let three = vdupq_n_u8(3);
        let mut sumi = vdupq_n_s32(0);
        for h in 0..2 {
            let mut q0 = vld1q_u8(xb.qs.as_ptr().add(32 * h));
            let mut q1 = vld1q_u8(xb.qs.as_ptr().add(32 * h + 16));
            for j in 0..4 {
                // 2-bit pair j of each byte: groups 8h + 2j (values 0..16) and 8h + 2j + 1
                let g = 8 * h + 2 * j;
                let p0 = dot16::<D>(vdupq_n_s32(0), s8(vandq_u8(q0, three)), acts(yb, g));
                let p1 = dot16::<D>(vdupq_n_s32(0), s8(vandq_u8(q1, three)), acts(yb, g + 1));
                sumi = vmlaq_n_s32(sumi, p0, (xb.scales[g] & 0xF) as i32);
                sumi = vmlaq_n_s32(sumi, p1, (xb.scales[g + 1] & 0xF) as i32);
                q0 = vshrq_n_u8::<2>(q0);
                q1 = vshrq_n_u8::<2>(q1);
            }
        }
        sum += yb.d * fp16(xb.d) * vaddvq_s32(sumi) as f32 - yb.d * fp16(xb.dmin) * summ as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q3_k<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockQ3K>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let sc = unpack_scales(&xb.scales);
        let (three, one, four) = (vdupq_n_u8(3), vdupq_n_u8(1), vdupq_n_s8(4));
        let mut hm0 = vld1q_u8(xb.hmask.as_ptr());
        let mut hm1 = vld1q_u8(xb.hmask.as_ptr().add(16));
        let mut sumi = vdupq_n_s32(0);
        for h in 0..2 {
            let mut q0 = vld1q_u8(xb.qs.as_ptr().add(32 * h));
            let mut q1 = vld1q_u8(xb.qs.as_ptr().add(32 * h + 16));
            for j in 0..4 {
                let g = 8 * h + 2 * j;
                // (low 2 bits | high bit << 2) - 4: values -4..4
                let v0 = vorrq_u8(vandq_u8(q0, three), vshlq_n_u8::<2>(vandq_u8(hm0, one)));
                let v1 = vorrq_u8(vandq_u8(q1, three), vshlq_n_u8::<2>(vandq_u8(hm1, one)));
                let p0 = dot16::<D>(vdupq_n_s32(0), vsubq_s8(s8(v0), four), acts(yb, g));
                let p1 = dot16::<D>(vdupq_n_s32(0), vsubq_s8(s8(v1), four), acts(yb, g + 1));
                sumi = vmlaq_n_s32(sumi, p0, sc[g] as i32);
                sumi = vmlaq_n_s32(sumi, p1, sc[g + 1] as i32);
                (q0, q1) = (vshrq_n_u8::<2>(q0), vshrq_n_u8::<2>(q1));
                (hm0, hm1) = (vshrq_n_u8::<1>(hm0), vshrq_n_u8::<1>(hm1));
            }
        }
        sum += yb.d * fp16(xb.d) * vaddvq_s32(sumi) as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q4_k<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockQ4K>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let (sc, m) = scales_mins_k4(&xb.scales);
        let summ = mins_dot_bsums32(&m, yb);
        let low = vdupq_n_u8(0x0F);
        let mut sumi = vdupq_n_s32(0);
        for c in 0..4 {
            let q0 = vld1q_u8(xb.qs.as_ptr().add(32 * c));
            let q1 = vld1q_u8(xb.qs.as_ptr().add(32 * c + 16));
            // low nibbles: values 64c..64c+32 (group 2c), high nibbles: the next 32 (group 2c+1)
            let p = dot16::<D>(vdupq_n_s32(0), s8(vandq_u8(q0, low)), acts(yb, 4 * c));
            let p = dot16::<D>(p, s8(vandq_u8(q1, low)), acts(yb, 4 * c + 1));
            sumi = vmlaq_n_s32(sumi, p, sc[2 * c] as i32);
            let p = dot16::<D>(vdupq_n_s32(0), s8(vshrq_n_u8::<4>(q0)), acts(yb, 4 * c + 2));
            let p = dot16::<D>(p, s8(vshrq_n_u8::<4>(q1)), acts(yb, 4 * c + 3));
            sumi = vmlaq_n_s32(sumi, p, sc[2 * c + 1] as i32);
        }
        sum += yb.d * fp16(xb.d) * vaddvq_s32(sumi) as f32 - yb.d * fp16(xb.dmin) * summ as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q5_k<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockQ5K>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let (sc, m) = scales_mins_k4(&xb.scales);
        let summ = mins_dot_bsums32(&m, yb);
        let (low, one, two) = (vdupq_n_u8(0x0F), vdupq_n_u8(1), vdupq_n_u8(2));
        let mut qh0 = vld1q_u8(xb.qh.as_ptr());
        let mut qh1 = vld1q_u8(xb.qh.as_ptr().add(16));
        let mut sumi = vdupq_n_s32(0);
        for c in 0..4 {
            let q0 = vld1q_u8(xb.qs.as_ptr().add(32 * c));
            let q1 = vld1q_u8(xb.qs.as_ptr().add(32 * c + 16));
            // nibble | fifth bit << 4 (bit 2c for the low nibbles, 2c+1 for the high)
            let l0 = vorrq_u8(vandq_u8(q0, low), vshlq_n_u8::<4>(vandq_u8(qh0, one)));
            let l1 = vorrq_u8(vandq_u8(q1, low), vshlq_n_u8::<4>(vandq_u8(qh1, one)));
            let h0 = vorrq_u8(vshrq_n_u8::<4>(q0), vshlq_n_u8::<3>(vandq_u8(qh0, two)));
            let h1 = vorrq_u8(vshrq_n_u8::<4>(q1), vshlq_n_u8::<3>(vandq_u8(qh1, two)));
            let p = dot16::<D>(dot16::<D>(vdupq_n_s32(0), s8(l0), acts(yb, 4 * c)), s8(l1), acts(yb, 4 * c + 1));
            sumi = vmlaq_n_s32(sumi, p, sc[2 * c] as i32);
            let p = dot16::<D>(dot16::<D>(vdupq_n_s32(0), s8(h0), acts(yb, 4 * c + 2)), s8(h1), acts(yb, 4 * c + 3));
            sumi = vmlaq_n_s32(sumi, p, sc[2 * c + 1] as i32);
            (qh0, qh1) = (vshrq_n_u8::<2>(qh0), vshrq_n_u8::<2>(qh1));
        }
        sum += yb.d * fp16(xb.d) * vaddvq_s32(sumi) as f32 - yb.d * fp16(xb.dmin) * summ as f32;
    }
    sum
}

/// The 8 registers of signed 6-bit values (-32..32) in half `h` of a Q6_K
/// block: register `2t + i` holds values `128h + 32t + 16i ..+ 16`.
#[inline(always)]
pub(super) unsafe fn q6_half(xb: &BlockQ6K, h: usize) -> [int8x16_t; 8] {
    let ql = |i: usize| vld1q_u8(xb.ql.as_ptr().add(64 * h + 16 * i));
    let (ql0, ql1, ql2, ql3) = (ql(0), ql(1), ql(2), ql(3));
    let qh0 = vld1q_u8(xb.qh.as_ptr().add(32 * h));
    let qh1 = vld1q_u8(xb.qh.as_ptr().add(32 * h + 16));
    let (low, m30, off) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30), vdupq_n_s8(32));
    // nibble | bit pair << 4, minus 32
    let v = |nib: uint8x16_t, high: uint8x16_t| vsubq_s8(s8(vorrq_u8(nib, high)), off);
    [
        v(vandq_u8(ql0, low), vandq_u8(vshlq_n_u8::<4>(qh0), m30)),
        v(vandq_u8(ql1, low), vandq_u8(vshlq_n_u8::<4>(qh1), m30)),
        v(vandq_u8(ql2, low), vandq_u8(vshlq_n_u8::<2>(qh0), m30)),
        v(vandq_u8(ql3, low), vandq_u8(vshlq_n_u8::<2>(qh1), m30)),
        v(vshrq_n_u8::<4>(ql0), vandq_u8(qh0, m30)),
        v(vshrq_n_u8::<4>(ql1), vandq_u8(qh1, m30)),
        v(vshrq_n_u8::<4>(ql2), vandq_u8(vshrq_n_u8::<2>(qh0), m30)),
        v(vshrq_n_u8::<4>(ql3), vandq_u8(vshrq_n_u8::<2>(qh1), m30)),
    ]
}

#[inline(always)]
unsafe fn dot_q6_k<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockQ6K>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let mut sumi = vdupq_n_s32(0);
        for h in 0..2 {
            for (i, v) in q6_half(xb, h).into_iter().enumerate() {
                // register i of the half is group 8h + i
                let g = 8 * h + i;
                sumi = vmlaq_n_s32(sumi, dot16::<D>(vdupq_n_s32(0), v, acts(yb, g)), xb.scales[g] as i32);
            }
        }
        sum += yb.d * fp16(xb.d) * vaddvq_s32(sumi) as f32;
    }
    sum
}
