//! NEON dot products of the non-linear and grid formats: IQ4_NL and MXFP4
//! (with Q8_0 activations), IQ4_XS, IQ3_XXS and IQ3_S (with Q8_K).
//!
//! IQ4_NL, IQ4_XS and MXFP4 map 4-bit indices through their 16-entry int8
//! table with one `tbl` per 16 values. The IQ3 formats gather four unsigned
//! grid values (at most 62) per index and put each value's sign on the
//! activation instead (`(y ^ m) - m`, `m` = 0xFF where negative). Either way
//! signed int8 weights meet signed activations in [`dot16`], and group
//! scales multiply the 4-lane group sums into an i32 accumulator: one float
//! multiply-add per block (IQ4_NL, MXFP4) or super-block.

use super::{dot16, fp16, ld_s8, paths};
use crate::quant::iq4::KVALUES_IQ4NL;
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4};
use crate::quant::{
    as_blocks, iq3_s, iq3_xxs, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ8K, BlockQ8_0F,
};
use std::arch::aarch64::*;

paths! {
    iq4_nl, iq4_nl_rows = dot_iq4_nl(BlockQ8_0F);
    mxfp4, mxfp4_rows = dot_mxfp4(BlockQ8_0F);
    iq4_xs, iq4_xs_rows = dot_iq4_xs(BlockQ8K);
    iq3_xxs, iq3_xxs_rows = dot_iq3_xxs(BlockQ8K);
    iq3_s, iq3_s_rows = dot_iq3_s(BlockQ8K);
}

/// 16 bytes of nibbles through `table`: (values 0..16 from the low nibbles,
/// values 16..32 from the high ones).
#[inline(always)]
unsafe fn lookup(table: int8x16_t, qs: *const u8) -> (int8x16_t, int8x16_t) {
    let q = vld1q_u8(qs);
    (vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0F))), vqtbl1q_s8(table, vshrq_n_u8::<4>(q)))
}

/// Dot product of 32 weights (two registers) with the 32 activations at `y`.
#[inline(always)]
unsafe fn dot32<const D: bool>(lo: int8x16_t, hi: int8x16_t, y: *const i8) -> int32x4_t {
    let p = dot16::<D>(vdupq_n_s32(0), lo, ld_s8(y.cast()));
    dot16::<D>(p, hi, ld_s8(y.add(16).cast()))
}

/// The 32 bits of `bits` spread to one byte each: 0xFF where bit `i` is set,
/// bytes 0..16 and 16..32.
#[inline(always)]
unsafe fn sign_masks(bits: u32) -> (int8x16_t, int8x16_t) {
    let src = vreinterpretq_u8_u32(vdupq_n_u32(bits));
    // Byte i takes source byte i/8 and tests its bit i%8.
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let lo = vtstq_u8(vqtbl1q_u8(src, vcombine_u8(vdup_n_u8(0), vdup_n_u8(1))), bit);
    let hi = vtstq_u8(vqtbl1q_u8(src, vcombine_u8(vdup_n_u8(2), vdup_n_u8(3))), bit);
    (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
}

/// 32 activations at `y` negated where the masks are 0xFF (they are within
/// +-127), as two registers.
#[inline(always)]
unsafe fn signed_acts(y: *const i8, m: (int8x16_t, int8x16_t)) -> (int8x16_t, int8x16_t) {
    let (y0, y1) = (ld_s8(y.cast()), ld_s8(y.add(16).cast()));
    (vsubq_s8(veorq_s8(y0, m.0), m.0), vsubq_s8(veorq_s8(y1, m.1), m.1))
}

/// Eight grid points (four values each) as two registers.
#[inline(always)]
unsafe fn grid8(p: [u32; 8]) -> (int8x16_t, int8x16_t) {
    (vreinterpretq_s8_u32(vld1q_u32(p.as_ptr())), vreinterpretq_s8_u32(vld1q_u32(p.as_ptr().add(4))))
}

// ---- 32-element blocks with a 16-entry table, Q8_0 activations -----------

#[inline(always)]
unsafe fn dot_lut32<B, const D: bool>(
    x: &[B],
    a: &[BlockQ8_0F],
    table: &[i8; 16],
    part: impl Fn(&B) -> (f32, &[u8; 16]),
) -> f32 {
    debug_assert_eq!(x.len(), a.len());
    let t = vld1q_s8(table.as_ptr());
    let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut pairs = x.chunks_exact(2).zip(a.chunks_exact(2));
    for (xp, yp) in &mut pairs {
        let ((d0, q0), (d1, q1)) = (part(&xp[0]), part(&xp[1]));
        let (l0, h0) = lookup(t, q0.as_ptr());
        let (l1, h1) = lookup(t, q1.as_ptr());
        let p0 = dot32::<D>(l0, h0, yp[0].qs.as_ptr());
        let p1 = dot32::<D>(l1, h1, yp[1].qs.as_ptr());
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), d0 * yp[0].d);
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), d1 * yp[1].d);
    }
    if x.len() % 2 == 1 {
        let (xb, yb) = (&x[x.len() - 1], &a[a.len() - 1]);
        let (d, q) = part(xb);
        let (l, h) = lookup(t, q.as_ptr());
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(dot32::<D>(l, h, yb.qs.as_ptr())), d * yb.d);
    }
    vaddvq_f32(vaddq_f32(acc0, acc1))
}

#[inline(always)]
unsafe fn dot_iq4_nl<const D: bool>(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    dot_lut32::<BlockIQ4NL, D>(as_blocks(w), a, &KVALUES_IQ4NL, |b| (fp16(b.d), &b.qs))
}

#[inline(always)]
unsafe fn dot_mxfp4<const D: bool>(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    dot_lut32::<BlockMXFP4, D>(as_blocks(w), a, &KVALUES_MXFP4, |b| (e8m0_to_f32_half(b.e), &b.qs))
}

// ---- super-blocks of 256, Q8_K activations ---------------------------------

#[inline(always)]
unsafe fn dot_iq4_xs<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockIQ4XS>(w);
    debug_assert_eq!(x.len(), a.len());
    let t = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    let mut acc = vdupq_n_f32(0.0);
    for (xb, yb) in x.iter().zip(a) {
        let mut isum = vdupq_n_s32(0);
        for g in 0..8 {
            let (lo, hi) = lookup(t, xb.qs.as_ptr().add(16 * g));
            isum = vmlaq_n_s32(isum, dot32::<D>(lo, hi, yb.qs.as_ptr().add(32 * g)), xb.scale(g));
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), fp16(xb.d) * yb.d);
    }
    vaddvq_f32(acc)
}

#[inline(always)]
unsafe fn dot_iq3_xxs<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockIQ3XXS>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut acc = vdupq_n_f32(0.0);
    for (xb, yb) in x.iter().zip(a) {
        let mut isum = vdupq_n_s32(0);
        for g in 0..8 {
            let aux = xb.aux(g);
            let idx = &xb.grid[8 * g..8 * g + 8];
            let (q0, q1) = grid8(std::array::from_fn(|k| iq3_xxs::GRID[idx[k] as usize]));
            // four 7-bit sign indices -> 32 sign bits -> byte masks
            let signs = u32::from_le_bytes(std::array::from_fn(|l| iq3_xxs::signs8(aux >> (7 * l))));
            let (y0, y1) = signed_acts(yb.qs.as_ptr().add(32 * g), sign_masks(signs));
            let p = dot16::<D>(dot16::<D>(vdupq_n_s32(0), q0, y0), q1, y1);
            isum = vmlaq_n_s32(isum, p, (2 * (aux >> 28) + 1) as i32);
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), fp16(xb.d) * yb.d);
    }
    0.25 * vaddvq_f32(acc)
}

#[inline(always)]
unsafe fn dot_iq3_s<const D: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockIQ3S>(w);
    debug_assert_eq!(x.len(), a.len());
    let mut acc = vdupq_n_f32(0.0);
    for (xb, yb) in x.iter().zip(a) {
        let mut isum = vdupq_n_s32(0);
        for g in 0..8 {
            let (qs, qh) = (&xb.qs[8 * g..8 * g + 8], xb.qh[g] as usize);
            // 9-bit indices: a byte of qs and bit k of qh
            let (q0, q1) = grid8(std::array::from_fn(|k| iq3_s::GRID[qs[k] as usize | ((qh >> k) & 1) << 8]));
            let sg = &xb.signs[4 * g..4 * g + 4];
            let m = sign_masks(u32::from_le_bytes([sg[0], sg[1], sg[2], sg[3]]));
            let (y0, y1) = signed_acts(yb.qs.as_ptr().add(32 * g), m);
            let p = dot16::<D>(dot16::<D>(vdupq_n_s32(0), q0, y0), q1, y1);
            isum = vmlaq_n_s32(isum, p, xb.scale(g));
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), fp16(xb.d) * yb.d);
    }
    vaddvq_f32(acc)
}
