//! NEON dot products of the K-quants (Q2_K..Q6_K) with Q8_K activations.
//!
//! Weights are unpacked 16 at a time into int8 lanes (with their offset
//! removed, so no correction pass is needed except for the minimums), dotted
//! with 16 activations, and the 4-lane result is multiply-accumulated with the
//! group scale into an i32 accumulator; one horizontal sum per super-block.
//!
//! The multi-row bodies (`dotn_*`, used by the rows kernels of the formats
//! that dominate decode) load each 16 activations once for R weight rows and
//! keep a 4-lane f32 accumulator per row (Q4_K: one for its four rows, a
//! lane each): one horizontal sum per row, not per super-block. Inside a super-block they chain the groups: one `sdot`
//! accumulator runs through every group and, after each group, is multiplied
//! by the difference between its scale and the next group's into the scaled
//! sum (summation by parts: `sum_g s_g p_g = sum_g (s_g - s_g+1) * (p_0 + .. +
//! p_g)`), so no per-group accumulator is zeroed or reduced.

use super::{dot16, exact_paths, fp16, fp16x2, fp16x4_packed, paths};
use crate::quant::q3_k::unpack_scales;
use crate::quant::q4_k_x4::BlockQ4Kx4;
use crate::quant::q6_k_x4::BlockQ6Kx4;
use crate::quant::{
    as_blocks, scales_mins_k4, scales_mins_k4_words, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
    F16Bytes,
};
use std::arch::aarch64::*;

paths! {
    q2_k, q2_k_rows = dot_q2_k(BlockQ8K) / dotn_q2_k * 2;
    q3_k, q3_k_rows = dot_q3_k(BlockQ8K) / dotn_q3_k * 2;
    q4_k, q4_k_rows = dot_q4_k(BlockQ8K) / dotn_q4_k * 4;
    q5_k, q5_k_rows = dot_q5_k(BlockQ8K) / dotn_q5_k * 2;
    q6_k, q6_k_rows = dot_q6_k(BlockQ8K) / dotn_q6_k * 2;
}

exact_paths! {
    q4_k = exact_q4_k(BlockQ8K) / exactn_q4_k * 4;
    q6_k = exact_q6_k(BlockQ8K) / exactn_q6_k * 2;
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
        // One fused multiply-add of the block's whole sum: the arithmetic of
        // the two-row body and of the interleaved rows, so that a row's bits
        // do not depend on the kernel.
        sum = (vaddvq_s32(sumi) as f32).mul_add(fp16(xb.d) * yb.d, sum);
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
        // One fused multiply-add of the block's whole sum: the arithmetic of
        // the two-row body and of the interleaved rows, so that a row's bits
        // do not depend on the kernel.
        sum = (vaddvq_s32(sumi) as f32).mul_add(fp16(xb.d) * yb.d, sum);
    }
    sum
}

/// The 8 activation registers of half `h` (values 128h..128h + 128) of a block.
#[inline(always)]
unsafe fn acts_half(y: &BlockQ8K, h: usize) -> [int8x16_t; 8] {
    let p = y.qs.as_ptr().add(128 * h);
    [
        vld1q_s8(p),
        vld1q_s8(p.add(16)),
        vld1q_s8(p.add(32)),
        vld1q_s8(p.add(48)),
        vld1q_s8(p.add(64)),
        vld1q_s8(p.add(80)),
        vld1q_s8(p.add(96)),
        vld1q_s8(p.add(112)),
    ]
}

/// The steps `s_g - s_(g+1)` (with `s_8 = 0`) between a block's eight group
/// scales (`sc`, one per byte), as i32 lanes for groups 0..4 and 4..8.
#[inline(always)]
unsafe fn scale_steps8(sc: u64) -> [int32x4_t; 2] {
    let s = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(sc)));
    let d = vsubq_s16(s, vextq_s16::<1>(s, vdupq_n_s16(0)));
    [vmovl_s16(vget_low_s16(d)), vmovl_high_s16(d)]
}

/// `r + c * s[L]`, lane-wise (`mla` by element). In `asm!` because LLVM
/// otherwise splats the lane of the widened 16-bit steps with `dup` + `sxtl`
/// before a vector `mla`: three instructions instead of one.
#[inline(always)]
unsafe fn mla_lane<const L: usize>(r: int32x4_t, c: int32x4_t, s: int32x4_t) -> int32x4_t {
    let mut r = r;
    std::arch::asm!(
        "mla {r:v}.4s, {c:v}.4s, {s:v}.s[{l}]",
        r = inout(vreg) r, c = in(vreg) c, s = in(vreg) s, l = const L,
        options(pure, nomem, nostack)
    );
    r
}

/// Groups 4h..4h + 4 of a Q4_K row against half `h` of the activations `y`
/// (bytes 64h..64h + 64: low nibbles then high nibbles of each 32 bytes),
/// chained: `c` keeps running through every group of the block and after
/// group g, `r += c * steps[g]`. By summation by parts, `r` ends up holding
/// `sum_g s_g * (group g's products)`, with no per-group accumulator to zero
/// and no pairwise reduction of group sums.
#[inline(always)]
unsafe fn q4_k_half_chain<const D: bool, const FIRST: bool>(
    xb: &BlockQ4K,
    h: usize,
    y: &[int8x16_t; 8],
    (c, r): (int32x4_t, int32x4_t),
    steps: int32x4_t,
) -> (int32x4_t, int32x4_t) {
    let low = vdupq_n_u8(0x0F);
    let p = xb.qs.as_ptr().add(64 * h);
    let (q0, q1, q2, q3) = (vld1q_u8(p), vld1q_u8(p.add(16)), vld1q_u8(p.add(32)), vld1q_u8(p.add(48)));
    let c = dot16::<D>(dot16::<D>(c, s8(vandq_u8(q0, low)), y[0]), s8(vandq_u8(q1, low)), y[1]);
    // The first half starts the chain: `c` and `r` come in as zeros, and
    // `r` starts as a product rather than a multiply-add.
    let r = if FIRST { mul_lane::<0>(c, steps) } else { mla_lane::<0>(r, c, steps) };
    let c = dot16::<D>(dot16::<D>(c, s8(vshrq_n_u8::<4>(q0)), y[2]), s8(vshrq_n_u8::<4>(q1)), y[3]);
    let r = mla_lane::<1>(r, c, steps);
    let c = dot16::<D>(dot16::<D>(c, s8(vandq_u8(q2, low)), y[4]), s8(vandq_u8(q3, low)), y[5]);
    let r = mla_lane::<2>(r, c, steps);
    let c = dot16::<D>(dot16::<D>(c, s8(vshrq_n_u8::<4>(q2)), y[6]), s8(vshrq_n_u8::<4>(q3)), y[7]);
    (c, mla_lane::<3>(r, c, steps))
}

/// One Q5_K super-block's contribution to a row's 4-lane accumulator:
/// the scaled group sums `r` and the minimums meeting the activations' pair
/// sums go through one conversion and one multiply-add, lanes `[r, r, m, m] *
/// [d, d, -dmin, -dmin] * y.d` (`dm` = `[d, dmin, ..]`, `ysign` = `[y, y, -y,
/// -y]`).
#[inline(always)]
unsafe fn k4_finish(
    acc: float32x4_t,
    r: int32x4_t,
    dm: float32x4_t,
    mins: u64,
    pairs: int16x8_t,
    ysign: float32x4_t,
) -> float32x4_t {
    let m = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mins)));
    let msum = vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs);
    let v = vpaddq_s32(r, msum); // [r01, r23, m01, m23]
    vfmaq_f32(acc, vcvtq_f32_s32(v), vmulq_f32(vzip1q_f32(dm, dm), ysign))
}

/// `c * s[L]`, lane-wise (`mul` by element; see [`mla_lane`]): the first
/// step of a chain, so that its scaled sum needs no zeroed register.
#[inline(always)]
unsafe fn mul_lane<const L: usize>(c: int32x4_t, s: int32x4_t) -> int32x4_t {
    let r: int32x4_t;
    std::arch::asm!(
        "mul {r:v}.4s, {c:v}.4s, {s:v}.s[{l}]",
        r = lateout(vreg) r, c = in(vreg) c, s = in(vreg) s, l = const L,
        options(pure, nomem, nostack)
    );
    r
}

/// The headers of four Q4_K blocks (`d`, `dmin` and the 12 scale bytes: the
/// first 16 bytes of each), transposed: `[d|dmin, a, b, c]` words of the four
/// blocks, one register per word, one lane per block. Four loads: the first
/// block's words replicated to every lane (`ld4r`), the others each into
/// its lane (`ld4` to a lane), which transposes as it loads.
#[inline(always)]
unsafe fn q4_k_headers4(xb: [&BlockQ4K; 4]) -> [uint32x4_t; 4] {
    let p = |i: usize| (xb[i] as *const BlockQ4K).cast::<u32>();
    let v = vld4q_dup_u32(p(0));
    let v = vld4q_lane_u32::<1>(p(1), v);
    let v = vld4q_lane_u32::<2>(p(2), v);
    let v = vld4q_lane_u32::<3>(p(3), v);
    [v.0, v.1, v.2, v.3]
}

/// The 6-bit scales and mins of four Q4_K blocks from their transposed
/// scale words `a`, `b`, `c` (see [`q4_k_headers4`]), decoded in one pass for
/// all four: `(scales, mins)`, each two registers holding two blocks' eight
/// values (`[block 0 | block 1]`, `[block 2 | block 3]`).
#[inline(always)]
unsafe fn q4_k_scales4(a: uint32x4_t, b: uint32x4_t, c: uint32x4_t) -> ([uint8x16_t; 2], [uint8x16_t; 2]) {
    let (a, b, c) = (vreinterpretq_u8_u32(a), vreinterpretq_u8_u32(b), vreinterpretq_u8_u32(c));
    let low6 = vdupq_n_u8(0x3F);
    // Values 0..4: the low 6 bits of a (scales) and b (mins); values 4..8: the
    // nibbles of c below the top 2 bits of a and b.
    let (sc_lo, m_lo) = (vandq_u8(a, low6), vandq_u8(b, low6));
    let sc_hi = vsliq_n_u8::<4>(vandq_u8(c, vdupq_n_u8(0x0F)), vshrq_n_u8::<6>(a));
    let m_hi = vsliq_n_u8::<4>(vshrq_n_u8::<4>(c), vshrq_n_u8::<6>(b));
    let z = |lo: uint8x16_t, hi: uint8x16_t| {
        let (lo, hi) = (vreinterpretq_u32_u8(lo), vreinterpretq_u32_u8(hi));
        [vreinterpretq_u8_u32(vzip1q_u32(lo, hi)), vreinterpretq_u8_u32(vzip2q_u32(lo, hi))]
    };
    (z(sc_lo, sc_hi), z(m_lo, m_hi))
}

/// The chain steps `s_g - s_(g+1)` (`s_8 = 0`; within +-63) of the two blocks
/// whose scales `s` holds (`[block 0 | block 1]`), as i32 lanes: `[block][groups 0..4, 4..8]`.
#[inline(always)]
unsafe fn scale_steps2(s: uint8x16_t) -> [[int32x4_t; 2]; 2] {
    let d = vreinterpretq_s8_u8(vsubq_u8(s, vreinterpretq_u8_u64(vshrq_n_u64::<8>(vreinterpretq_u64_u8(s)))));
    let w = |h: int16x8_t| [vmovl_s16(vget_low_s16(h)), vmovl_high_s16(h)];
    [w(vmovl_s8(vget_low_s8(d))), w(vmovl_high_s8(d))]
}

/// [`scale_steps2`] before widening: each block's eight steps as i16.
#[inline(always)]
unsafe fn scale_steps2_i16(s: uint8x16_t) -> [int16x8_t; 2] {
    let d = vreinterpretq_s8_u8(vsubq_u8(s, vreinterpretq_u8_u64(vshrq_n_u64::<8>(vreinterpretq_u64_u8(s)))));
    [vmovl_s8(vget_low_s8(d)), vmovl_high_s8(d)]
}

/// `v` unchanged, computed here: an `asm!` with effects (not `pure`) that
/// LLVM cannot move the computation of `v` past.
#[inline(always)]
unsafe fn barrier(mut v: int32x4_t) -> int32x4_t {
    std::arch::asm!("/* {v:v} */", v = inout(vreg) v, options(nomem, nostack, preserves_flags));
    v
}

/// f16 lanes 0..4 and 4..8 of `v` as f32 (`fcvtl`, `fcvtl2`).
#[inline(always)]
unsafe fn fp16x8(v: uint32x4_t) -> (float32x4_t, float32x4_t) {
    let (lo, hi): (float32x4_t, float32x4_t);
    std::arch::asm!("fcvtl {o:v}.4s, {i:v}.4h", o = lateout(vreg) lo, i = in(vreg) v, options(pure, nomem, nostack));
    std::arch::asm!("fcvtl2 {o:v}.4s, {i:v}.8h", o = lateout(vreg) hi, i = in(vreg) v, options(pure, nomem, nostack));
    (lo, hi)
}

/// Lines of the two-row `asm!` cores below, whose operands are named by row:
/// `a0`/`b0`, `a1`/`b1` the weight registers, `t0`/`t1` their unpacked
/// values, `c0`/`c1` the running `sdot` sums, `r0`/`r1` the scaled sums and
/// `s0N`/`s1N` the rows' scale steps; `u` a scratch register.
#[rustfmt::skip]
macro_rules! rows2 {
    // Each row's register `$w` (`"a"` or `"b"`) masked by `$m`, or shifted down by `$n`.
    (and $w:literal, $m:literal) => { rows2!(@both "and {t", concat!(":v}.16b, {", $w), concat!(":v}.16b, {", $m, ":v}.16b")) };
    (ushr $w:literal, $n:literal) => { rows2!(@both "ushr {t", concat!(":v}.16b, {", $w), concat!(":v}.16b, #", $n)) };
    // Q3_K's high bit of each row (register `$h` then row) put in by `bit`
    // under the mask `$m`, shifted into place by `$op` `$n` first where it is not there.
    (high $h:literal, $m:literal) => { rows2!(@both "bit {t", concat!(":v}.16b, {", $h), concat!(":v}.16b, {", $m, ":v}.16b")) };
    (high $op:ident $h:literal, $n:literal, $m:literal) => {
        concat!(
            stringify!($op), " {u:v}.16b, {", $h, "0:v}.16b, #", $n, "\nbit {t0:v}.16b, {u:v}.16b, {", $m, ":v}.16b\n",
            stringify!($op), " {u:v}.16b, {", $h, "1:v}.16b, #", $n, "\nbit {t1:v}.16b, {u:v}.16b, {", $m, ":v}.16b",
        )
    };
    // Each row's sum plus its values times the activations `$y`.
    (sdot $y:literal) => { rows2!(@both "sdot {c", ":v}.4s, {t", concat!(":v}.16b, {", $y, ":v}.16b")) };
    // The chain's step (`"mul"` to start it, `"mla"`): `r += c * s[$s].s[$l]`.
    (step $op:literal, $s:literal, $l:literal) => {
        concat!(
            $op, " {r0:v}.4s, {c0:v}.4s, {s0", $s, ":v}.s[", $l, "]\n",
            $op, " {r1:v}.4s, {c1:v}.4s, {s1", $s, ":v}.s[", $l, "]",
        )
    };
    // Each row's steps `s{row}$s` (i16) widened, half `$half` (`"4h"` with
    // `sxtl`, `"8h"` with `sxtl2`), into `w{row}` for the steps of `stepw`.
    (widen $ext:literal, $s:literal, $half:literal) => {
        concat!(
            $ext, " {w0:v}.4s, {s0", $s, ":v}.", $half, "\n",
            $ext, " {w1:v}.4s, {s1", $s, ":v}.", $half,
        )
    };
    // As `step`, with the steps widened into `w0`, `w1`.
    (stepw $op:literal, $l:literal) => {
        concat!(
            $op, " {r0:v}.4s, {c0:v}.4s, {w0:v}.s[", $l, "]\n",
            $op, " {r1:v}.4s, {c1:v}.4s, {w1:v}.s[", $l, "]",
        )
    };
    // `$a ROW $b ROW $c` for row 0, then for row 1.
    (@both $a:expr, $b:expr, $c:expr) => { concat!($a, 0, $b, 0, $c, "\n", $a, 1, $b, 1, $c) };
}

/// The integer part of a block of two Q4_K rows (`q`: their `qs`) against a
/// Q8_K block's activations (`y`: its `qs`), chained as [`q4_k_half_chain`]
/// chains them (`st[r]`: row r's steps for groups 0..4 and 4..8), with
/// `sdot`, in one `asm!` for the reasons given at [`q2_k_core2_sdot`]: the
/// scaled sums of the two rows. The four-row body calls it twice (each
/// activation loaded twice): with four rows in one `asm!`, the registers it
/// holds leave LLVM too few for the scales around it, and it spills.
#[inline(always)]
unsafe fn q4_k_core2_sdot(q: [*const u8; 2], y: *const i8, st: [int16x8_t; 2]) -> [int32x4_t; 2] {
    let (r0, r1): (int32x4_t, int32x4_t);
    std::arch::asm!(
        "movi {m:v}.16b, #0x0f",
        "movi {c0:v}.4s, #0",
        "movi {c1:v}.4s, #0",
        "ldp {a0:q}, {b0:q}, [{q0}, #0]",
        "ldp {a1:q}, {b1:q}, [{q1}, #0]",
        "ldp {y0:q}, {y1:q}, [{y}, #0]",
        rows2!(widen "sxtl", "", "4h"),
        rows2!(and "a", "m"),
        rows2!(sdot "y0"),
        rows2!(and "b", "m"),
        rows2!(sdot "y1"),
        rows2!(stepw "mul", 0),
        "ldp {y0:q}, {y1:q}, [{y}, #32]",
        rows2!(ushr "a", 4),
        rows2!(sdot "y0"),
        rows2!(ushr "b", 4),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 1),
        "ldp {a0:q}, {b0:q}, [{q0}, #32]",
        "ldp {a1:q}, {b1:q}, [{q1}, #32]",
        "ldp {y0:q}, {y1:q}, [{y}, #64]",
        rows2!(and "a", "m"),
        rows2!(sdot "y0"),
        rows2!(and "b", "m"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 2),
        "ldp {y0:q}, {y1:q}, [{y}, #96]",
        rows2!(ushr "a", 4),
        rows2!(sdot "y0"),
        rows2!(ushr "b", 4),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 3),
        "ldp {a0:q}, {b0:q}, [{q0}, #64]",
        "ldp {a1:q}, {b1:q}, [{q1}, #64]",
        "ldp {y0:q}, {y1:q}, [{y}, #128]",
        rows2!(widen "sxtl2", "", "8h"),
        rows2!(and "a", "m"),
        rows2!(sdot "y0"),
        rows2!(and "b", "m"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 0),
        "ldp {y0:q}, {y1:q}, [{y}, #160]",
        rows2!(ushr "a", 4),
        rows2!(sdot "y0"),
        rows2!(ushr "b", 4),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 1),
        "ldp {a0:q}, {b0:q}, [{q0}, #96]",
        "ldp {a1:q}, {b1:q}, [{q1}, #96]",
        "ldp {y0:q}, {y1:q}, [{y}, #192]",
        rows2!(and "a", "m"),
        rows2!(sdot "y0"),
        rows2!(and "b", "m"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 2),
        "ldp {y0:q}, {y1:q}, [{y}, #224]",
        rows2!(ushr "a", 4),
        rows2!(sdot "y0"),
        rows2!(ushr "b", 4),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 3),
        q0 = in(reg) q[0], q1 = in(reg) q[1], y = in(reg) y,
        s0 = in(vreg) st[0], s1 = in(vreg) st[1], w0 = out(vreg) _, w1 = out(vreg) _,
        r0 = out(vreg) r0, r1 = out(vreg) r1,
        c0 = out(vreg) _, c1 = out(vreg) _, m = out(vreg) _, t0 = out(vreg) _, t1 = out(vreg) _,
        a0 = out(vreg) _, b0 = out(vreg) _, a1 = out(vreg) _, b1 = out(vreg) _,
        y0 = out(vreg) _, y1 = out(vreg) _,
        options(pure, readonly, nostack)
    );
    [r0, r1]
}

/// Four Q4_K rows with one activation row. The four blocks' headers are
/// loaded and transposed together so that their scales and mins are decoded
/// by one pass of vector instructions for all four, and the super-block
/// finish runs on four lanes, one per row: the scaled sums, then the
/// minimums meeting the activations' pair sums, each reduced across rows and
/// put through one conversion and one multiply-add for the four rows.
#[inline(always)]
unsafe fn dotn_q4_k<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8K]) -> [f32; R] {
    const { assert!(R == 4, "the Q4_K body takes four rows") };
    let x = rows.map(as_blocks::<BlockQ4K>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let mut acc = vdupq_n_f32(0.0);
    for (b, yb) in a[..nb].iter().enumerate() {
        let xb: [&BlockQ4K; 4] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let [dm, wa, wb, wc] = q4_k_headers4(xb);
        let (scales, mins) = q4_k_scales4(wa, wb, wc);
        // The minimums against the activations' sums over each group of 32
        // first: their registers are free again for the products.
        let pairs = vpaddq_s16(vld1q_s16(yb.bsums.as_ptr()), vld1q_s16(yb.bsums.as_ptr().add(8)));
        let m16 = [
            vmovl_u8(vget_low_u8(mins[0])),
            vmovl_high_u8(mins[0]),
            vmovl_u8(vget_low_u8(mins[1])),
            vmovl_high_u8(mins[1]),
        ];
        let msum: [int32x4_t; 4] = std::array::from_fn(|r| {
            let m = vreinterpretq_s16_u16(m16[r]);
            vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs)
        });
        let sums = |v: [int32x4_t; 4]| vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
        // Held in one register across the products: LLVM otherwise sinks
        // the reduction below them and spills its four inputs.
        let msum = barrier(sums(msum));
        let scaled = if D {
            // The steps go in as i16, widened inside a half at a time.
            let (s01, s23) = (scale_steps2_i16(scales[0]), scale_steps2_i16(scales[1]));
            let steps = [s01[0], s01[1], s23[0], s23[1]];
            let y = yb.qs.as_ptr();
            let [r0, r1] = q4_k_core2_sdot([xb[0].qs.as_ptr(), xb[1].qs.as_ptr()], y, [steps[0], steps[1]]);
            let [r2, r3] = q4_k_core2_sdot([xb[2].qs.as_ptr(), xb[3].qs.as_ptr()], y, [steps[2], steps[3]]);
            [r0, r1, r2, r3]
        } else {
            let (s01, s23) = (scale_steps2(scales[0]), scale_steps2(scales[1]));
            let steps = [s01[0], s01[1], s23[0], s23[1]];
            let zero = vdupq_n_s32(0);
            let y = acts_half(yb, 0);
            let cr: [_; 4] =
                std::array::from_fn(|r| q4_k_half_chain::<D, true>(xb[r], 0, &y, (zero, zero), steps[r][0]));
            let y = acts_half(yb, 1);
            std::array::from_fn(|r| q4_k_half_chain::<D, false>(xb[r], 1, &y, cr[r], steps[r][1]).1)
        };
        // d, dmin of the four rows: [d0, dmin0, d1, dmin1], [d2, dmin2, d3, dmin3].
        let (dm01, dm23) = fp16x8(dm);
        let (d, dmin) = (vuzp1q_f32(dm01, dm23), vuzp2q_f32(dm01, dm23));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(sums(scaled)), vmulq_n_f32(d, yb.d));
        acc = vfmsq_f32(acc, vcvtq_f32_s32(msum), vmulq_n_f32(dmin, yb.d));
    }
    let mut out = [0.0f32; R];
    vst1q_f32(out.as_mut_ptr(), acc);
    out
}

/// Chunk `c` (values 64c..64c + 64: groups 2c, 2c + 1) of a Q5_K row, chained
/// as in [`q4_k_half_chain`]: nibble | fifth bit << 4, the fifth bits in bits
/// 0 and 1 of `qh` (shifted down two per chunk by the caller). `y`: the
/// chunk's four activation registers; `L0`, `L1`: the groups' lanes in `steps`.
#[inline(always)]
unsafe fn q5_k_chunk<const D: bool, const L0: usize, const L1: usize>(
    xb: &BlockQ5K,
    c: usize,
    qh: [uint8x16_t; 2],
    y: [int8x16_t; 4],
    (acc, r): (int32x4_t, int32x4_t),
    steps: int32x4_t,
) -> (int32x4_t, int32x4_t) {
    let (one, two) = (vdupq_n_u8(1), vdupq_n_u8(2));
    let p = xb.qs.as_ptr().add(32 * c);
    let (q0, q1) = (vld1q_u8(p), vld1q_u8(p.add(16)));
    // low nibble with bit 0 above it (shift-and-insert keeps the nibble)
    let (l0, l1) = (vsliq_n_u8::<4>(q0, vandq_u8(qh[0], one)), vsliq_n_u8::<4>(q1, vandq_u8(qh[1], one)));
    // high nibble shifted in under bit 1 (moved to bit 4)
    let h0 = vsriq_n_u8::<4>(vshlq_n_u8::<3>(vandq_u8(qh[0], two)), q0);
    let h1 = vsriq_n_u8::<4>(vshlq_n_u8::<3>(vandq_u8(qh[1], two)), q1);
    let acc = dot16::<D>(dot16::<D>(acc, s8(l0), y[0]), s8(l1), y[1]);
    let r = mla_lane::<L0>(r, acc, steps);
    let acc = dot16::<D>(dot16::<D>(acc, s8(h0), y[2]), s8(h1), y[3]);
    (acc, mla_lane::<L1>(r, acc, steps))
}

#[inline(always)]
unsafe fn dotn_q5_k<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8K]) -> [f32; R] {
    let x = rows.map(as_blocks::<BlockQ5K>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let mut acc = [vdupq_n_f32(0.0); R];
    let sign = vld1q_f32([1.0f32, 1.0, -1.0, -1.0].as_ptr());
    for (b, yb) in a[..nb].iter().enumerate() {
        let xb: [&BlockQ5K; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let words: [(u64, u64); R] = std::array::from_fn(|r| scales_mins_k4_words(&xb[r].scales));
        let st: [[int32x4_t; 2]; R] = std::array::from_fn(|r| scale_steps8(words[r].0));
        let qh: [[uint8x16_t; 2]; R] =
            std::array::from_fn(|r| [vld1q_u8(xb[r].qh.as_ptr()), vld1q_u8(xb[r].qh.as_ptr().add(16))]);
        let shr2 = |q: [uint8x16_t; 2]| [vshrq_n_u8::<2>(q[0]), vshrq_n_u8::<2>(q[1])];
        let zero = vdupq_n_s32(0);
        let y = acts_half(yb, 0);
        let (y0, y1) = ([y[0], y[1], y[2], y[3]], [y[4], y[5], y[6], y[7]]);
        let cr: [_; R] = std::array::from_fn(|r| q5_k_chunk::<D, 0, 1>(xb[r], 0, qh[r], y0, (zero, zero), st[r][0]));
        let cr: [_; R] = std::array::from_fn(|r| q5_k_chunk::<D, 2, 3>(xb[r], 1, shr2(qh[r]), y1, cr[r], st[r][0]));
        let y = acts_half(yb, 1);
        let (y2, y3) = ([y[0], y[1], y[2], y[3]], [y[4], y[5], y[6], y[7]]);
        let qh: [_; R] = std::array::from_fn(|r| shr2(shr2(qh[r])));
        let cr: [_; R] = std::array::from_fn(|r| q5_k_chunk::<D, 0, 1>(xb[r], 2, qh[r], y2, cr[r], st[r][1]));
        let cr: [_; R] = std::array::from_fn(|r| q5_k_chunk::<D, 2, 3>(xb[r], 3, shr2(qh[r]), y3, cr[r], st[r][1]));
        let pairs = vpaddq_s16(vld1q_s16(yb.bsums.as_ptr()), vld1q_s16(yb.bsums.as_ptr().add(8)));
        let ysign = vmulq_n_f32(sign, yb.d);
        for r in 0..R {
            // d, dmin: the block's first 4 bytes
            let dm = fp16x2((xb[r] as *const BlockQ5K).cast());
            acc[r] = k4_finish(acc[r], cr[r].1, dm, words[r].1, pairs, ysign);
        }
    }
    acc.map(|v| vaddvq_f32(v))
}

/// The 8 registers of unsigned 6-bit values (0..64, offset not removed) in
/// half `h` of a Q6_K block, in the order of [`q6_half`]; the high bit pairs
/// are inserted with shift-and-insert (`sli` / `sri`), which also masks. The
/// top pair needs no mask: `qh >> 2` holds it in bits 4..6 with zeros above,
/// and `sri` keeps only those top four bits.
#[inline(always)]
unsafe fn q6_half_unsigned(xb: &BlockQ6K, h: usize) -> [int8x16_t; 8] {
    let ql = |i: usize| vld1q_u8(xb.ql.as_ptr().add(64 * h + 16 * i));
    let (ql0, ql1, ql2, ql3) = (ql(0), ql(1), ql(2), ql(3));
    let qh0 = vld1q_u8(xb.qh.as_ptr().add(32 * h));
    let qh1 = vld1q_u8(xb.qh.as_ptr().add(32 * h + 16));
    let (m03, m30) = (vdupq_n_u8(0x03), vdupq_n_u8(0x30));
    let (qs0, qs1) = (vshrq_n_u8::<2>(qh0), vshrq_n_u8::<2>(qh1));
    [
        // low nibble | bits 0..2 << 4, low nibble | bits 2..4 << 4
        s8(vsliq_n_u8::<4>(ql0, vandq_u8(qh0, m03))),
        s8(vsliq_n_u8::<4>(ql1, vandq_u8(qh1, m03))),
        s8(vsliq_n_u8::<4>(ql2, vandq_u8(qs0, m03))),
        s8(vsliq_n_u8::<4>(ql3, vandq_u8(qs1, m03))),
        // high nibble | bits 4..6 (already in place), high nibble | bits 6..8
        s8(vsriq_n_u8::<4>(vandq_u8(qh0, m30), ql0)),
        s8(vsriq_n_u8::<4>(vandq_u8(qh1, m30), ql1)),
        s8(sri4(qs0, ql2)),
        s8(sri4(qs1, ql3)),
    ]
}

/// `(a & 0xF0) | (b >> 4)` as one `sri`. In `asm!` because LLVM otherwise
/// masks `a` with an `and` and adds the shifted `b` (`usra`): two
/// instructions where `a` is not needed afterwards.
#[inline(always)]
unsafe fn sri4(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
    let mut a = a;
    std::arch::asm!("sri {a:v}.16b, {b:v}.16b, #4", a = inout(vreg) a, b = in(vreg) b, options(pure, nomem, nostack));
    a
}

/// The steps `s_g - s_(g+1)` (with `s_16 = 0`) between 16 group scales
/// (groups 0..8 in `lo`, 8..16 in `hi`), as i32 lanes: groups 4k..4k + 4 in
/// vector k.
#[inline(always)]
unsafe fn steps16(lo: int16x8_t, hi: int16x8_t) -> [int32x4_t; 4] {
    let [dl, dh] = steps16_i16(lo, hi);
    [vmovl_s16(vget_low_s16(dl)), vmovl_high_s16(dl), vmovl_s16(vget_low_s16(dh)), vmovl_high_s16(dh)]
}

/// [`steps16`] before widening: the steps of groups 0..8 and 8..16 as i16.
#[inline(always)]
unsafe fn steps16_i16(lo: int16x8_t, hi: int16x8_t) -> [int16x8_t; 2] {
    [vsubq_s16(lo, vextq_s16::<1>(lo, hi)), vsubq_s16(hi, vextq_s16::<1>(hi, vdupq_n_s16(0)))]
}

/// Eight groups of 16 values (`v[i]` is group 8h + i) against half `h` of the
/// activations `y`, chained through `c` with `r += c * step_g` after each
/// group (`s0`, `s1`: the steps of groups 8h..8h + 4, 8h + 4..8h + 8), as in
/// [`q4_k_half_chain`].
#[inline(always)]
unsafe fn chain8<const D: bool, const FIRST: bool>(
    v: [int8x16_t; 8],
    y: &[int8x16_t; 8],
    (c, r): (int32x4_t, int32x4_t),
    s0: int32x4_t,
    s1: int32x4_t,
) -> (int32x4_t, int32x4_t) {
    let c = dot16::<D>(c, v[0], y[0]);
    // The first half starts the chain (`c`, `r` come in as zeros).
    let r = if FIRST { mul_lane::<0>(c, s0) } else { mla_lane::<0>(r, c, s0) };
    let c = dot16::<D>(c, v[1], y[1]);
    let r = mla_lane::<1>(r, c, s0);
    let c = dot16::<D>(c, v[2], y[2]);
    let r = mla_lane::<2>(r, c, s0);
    let c = dot16::<D>(c, v[3], y[3]);
    let r = mla_lane::<3>(r, c, s0);
    let c = dot16::<D>(c, v[4], y[4]);
    let r = mla_lane::<0>(r, c, s1);
    let c = dot16::<D>(c, v[5], y[5]);
    let r = mla_lane::<1>(r, c, s1);
    let c = dot16::<D>(c, v[6], y[6]);
    let r = mla_lane::<2>(r, c, s1);
    let c = dot16::<D>(c, v[7], y[7]);
    (c, mla_lane::<3>(r, c, s1))
}

/// A Q6_K block's 16 signed group scales widened to i16 (groups 0..8, 8..16).
#[inline(always)]
unsafe fn q6_k_scales(xb: &BlockQ6K) -> [int16x8_t; 2] {
    let sc = vld1q_s8(xb.scales.as_ptr());
    [vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc)]
}

/// One Q3_K/Q6_K super-block's contribution of two rows to their pair
/// accumulator (lanes `[row 0, row 0, row 1, row 1]`), from the scaled sums
/// `r` of values stored with an offset: the offset comes off as `sum_g
/// scale_g * bsum_g << SHIFT` (Q6_K: 32, SHIFT 5; Q3_K: 4 times the 16 of
/// [`PAIR_SCALE`], SHIFT 6), the two rows' lanes are added pairwise, and one
/// conversion and one multiply-add by `[d0, d0, d1, d1] * yd` (`yd` over 16
/// for Q3_K) finish both. `WHOLE` (Q6_K): each row's two lanes added first,
/// into its block's whole sum in both its lanes (read by [`whole_out`]): one
/// multiply-add of a block's integer sum per row, as [`dot_q6_k`] and
/// [`dot_q6_k_x4`] form it.
#[inline(always)]
unsafe fn offset_finish2<const SHIFT: i32, const WHOLE: bool>(
    acc: float32x4_t,
    r: [int32x4_t; 2],
    sc: [[int16x8_t; 2]; 2],
    bsums: [int16x8_t; 2],
    d: [&F16Bytes; 2],
    yd: f32,
) -> float32x4_t {
    let isum = |i: usize| vsubq_s32(r[i], vshlq_n_s32::<SHIFT>(dot_bsums16(sc[i][0], sc[i][1], bsums)));
    let pairs = vpaddq_s32(isum(0), isum(1));
    let sums = if WHOLE { vaddq_s32(pairs, vrev64q_s32(pairs)) } else { pairs };
    vfmaq_f32(acc, vcvtq_f32_s32(sums), vmulq_n_f32(d_pair(d[0], d[1]), yd))
}

/// The two results of a `WHOLE` accumulator of [`offset_finish2`] (lanes 0 and 2).
#[inline(always)]
unsafe fn whole_out<const R: usize>(acc: float32x4_t) -> [f32; R] {
    let v = vuzp1q_f32(acc, acc);
    let mut out = [0.0f32; R];
    vst1_f32(out.as_mut_ptr(), vget_low_f32(v));
    out
}

#[inline(always)]
unsafe fn dotn_q6_k<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8K]) -> [f32; R] {
    const { assert!(R == 2, "the Q6_K body takes two rows") };
    let x = rows.map(as_blocks::<BlockQ6K>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let mut acc = vdupq_n_f32(0.0);
    for (b, yb) in a[..nb].iter().enumerate() {
        let xb: [&BlockQ6K; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let sc: [_; R] = std::array::from_fn(|r| q6_k_scales(xb[r]));
        let st: [_; R] = std::array::from_fn(|r| steps16(sc[r][0], sc[r][1]));
        let zero = vdupq_n_s32(0);
        let y = acts_half(yb, 0);
        let cr: [_; R] = std::array::from_fn(|r| {
            chain8::<D, true>(q6_half_unsigned(xb[r], 0), &y, (zero, zero), st[r][0], st[r][1])
        });
        let y = acts_half(yb, 1);
        let cr: [_; R] =
            std::array::from_fn(|r| chain8::<D, false>(q6_half_unsigned(xb[r], 1), &y, cr[r], st[r][2], st[r][3]));
        let bsums = [vld1q_s16(yb.bsums.as_ptr()), vld1q_s16(yb.bsums.as_ptr().add(8))];
        acc = offset_finish2::<5, true>(acc, [cr[0].1, cr[1].1], [sc[0], sc[1]], bsums, [&xb[0].d, &xb[1].d], yb.d);
    }
    whole_out(acc)
}

/// Two blocks' f16 scales `d` as `[d0, d0, d1, d1]`: the lanes of a pair
/// accumulator (see [`dotn_q6_k`]).
#[inline(always)]
unsafe fn d_pair(a: &F16Bytes, b: &F16Bytes) -> float32x4_t {
    let h = vld1_lane_u16::<0>((a as *const F16Bytes).cast(), vdup_n_u16(0));
    let h = vld1_lane_u16::<1>((b as *const F16Bytes).cast(), h);
    let f: float32x4_t;
    std::arch::asm!("fcvtl {o:v}.4s, {i:v}.4h", o = lateout(vreg) f, i = in(vreg) h, options(pure, nomem, nostack));
    vzip1q_f32(f, f)
}

/// Scale multipliers of the groups of a half block in the Q2_K/Q3_K multi-row
/// bodies. Bit pair `j` of a byte is used in place (`q & 3 << 2j`, values
/// times `4^j`) for j < 3 and shifted down for j = 3, so the group sums of a
/// half come out times [1, 1, 4, 4, 16, 16, 1, 1]; multiplying the scales by
/// [16, 16, 4, 4, 1, 1, 16, 16] makes every product 16 times its true value,
/// and the super-block scale is divided by 16 (exactly) instead. This saves a
/// shift per 16 values.
const PAIR_SCALE: u64 = 0x1010_0101_0404_1010;

/// The eight registers of bit pairs of half `h` of a Q2_K/Q3_K block in group
/// order (pair j of the first 16 bytes, pair j of the second, ...), in place.
#[inline(always)]
unsafe fn bit_pairs(qs: &[u8; 64], h: usize) -> [uint8x16_t; 8] {
    let p = qs.as_ptr().add(32 * h);
    let (q0, q1) = (vld1q_u8(p), vld1q_u8(p.add(16)));
    let (m0, m1, m2) = (vdupq_n_u8(0x03), vdupq_n_u8(0x0C), vdupq_n_u8(0x30));
    [
        vandq_u8(q0, m0),
        vandq_u8(q1, m0),
        vandq_u8(q0, m1),
        vandq_u8(q1, m1),
        vandq_u8(q0, m2),
        vandq_u8(q1, m2),
        vshrq_n_u8::<6>(q0),
        vshrq_n_u8::<6>(q1),
    ]
}

/// `sum_g w[g] * bsums[g]` for 16 i16 weights.
#[inline(always)]
unsafe fn dot_bsums16(lo: int16x8_t, hi: int16x8_t, bsums: [int16x8_t; 2]) -> int32x4_t {
    let [b0, b1] = bsums;
    let s = vmull_s16(vget_low_s16(lo), vget_low_s16(b0));
    let s = vmlal_high_s16(s, lo, b0);
    let s = vmlal_s16(s, vget_low_s16(hi), vget_low_s16(b1));
    vmlal_high_s16(s, hi, b1)
}

/// A Q2_K block's 16 scales times the in-place factors of [`PAIR_SCALE`]
/// (4 bits times at most 16 fit a byte), as i16 (groups 0..8, 8..16), and its
/// 16 minimums.
#[inline(always)]
unsafe fn q2_k_scales(xb: &BlockQ2K) -> ([int16x8_t; 2], uint8x16_t) {
    let raw = vld1q_u8(xb.scales.as_ptr());
    let mult = vcombine_u8(vcreate_u8(PAIR_SCALE), vcreate_u8(PAIR_SCALE));
    let sc = vmulq_u8(vandq_u8(raw, vdupq_n_u8(0x0F)), mult);
    let w = |v: uint16x8_t| vreinterpretq_s16_u16(v);
    ([w(vmovl_u8(vget_low_u8(sc))), w(vmovl_high_u8(sc))], vshrq_n_u8::<4>(raw))
}

/// A Q2_K block's minimums (`mins`, 16 bytes) against the activation group
/// sums: `sum_g mins[g] * bsums[g]` spread over four lanes.
#[inline(always)]
unsafe fn q2_k_mins(mins: uint8x16_t, bsums: [int16x8_t; 2]) -> int32x4_t {
    let w = |v: uint16x8_t| vreinterpretq_s16_u16(v);
    dot_bsums16(w(vmovl_u8(vget_low_u8(mins))), w(vmovl_high_u8(mins)), bsums)
}

/// One Q2_K super-block's contribution to two rows' accumulator, lanes
/// `[row 0 scaled, row 0 minimums, row 1 scaled, row 1 minimums]`: each
/// row's scaled sums `r` (16 times too large, see [`PAIR_SCALE`]) and its
/// minimums meeting the activation group sums (`msum`, [`q2_k_mins`]) added
/// across lanes, then one conversion and one multiply-add for both rows,
/// times `[d, dmin, d, dmin] * ysign` (`ysign` = `[y / 16, -y, y / 16, -y]`).
#[inline(always)]
unsafe fn q2_k_finish2(
    acc: float32x4_t,
    r: [int32x4_t; 2],
    xb: [&BlockQ2K; 2],
    msum: [int32x4_t; 2],
    ysign: float32x4_t,
) -> float32x4_t {
    let v = vpaddq_s32(vpaddq_s32(r[0], msum[0]), vpaddq_s32(r[1], msum[1]));
    // Each row's `d`, `dmin`: adjacent f16 values in its block.
    let dm: float32x4_t;
    std::arch::asm!(
        "ldr {o:s}, [{a}]",
        "ld1 {{{o:v}.s}}[1], [{b}]",
        "fcvtl {o:v}.4s, {o:v}.4h",
        a = in(reg) std::ptr::addr_of!(xb[0].d), b = in(reg) std::ptr::addr_of!(xb[1].d), o = out(vreg) dm,
        options(pure, readonly, nostack, preserves_flags)
    );
    vfmaq_f32(acc, vcvtq_f32_s32(v), vmulq_f32(dm, ysign))
}

// The Q2_K `asm!` below reads `qs` at offset 16 of the block.
const _: () = assert!(std::mem::offset_of!(BlockQ2K, qs) == 16);

/// The integer part of a block of two Q2_K rows (`x`: their blocks, `qs`
/// read at its offset, so that no pointer is formed for it) against a
/// Q8_K block's activations (`y`: its `qs`), both halves chained as
/// [`chain8`] chains them (`st`: each row's [`steps16`]), with `sdot`, in one
/// `asm!`: the scaled sums `r` of the two rows. Written out because LLVM,
/// scheduling the same operations from intrinsics, loads the activations
/// with unpaired `ldur` (they sit 4 bytes into the block), rematerialises
/// the masks every block and moves registers: 207 instructions a block of
/// two rows against 110 here for the same integers, plus the scales and the
/// finish.
#[inline(always)]
unsafe fn q2_k_core2_sdot(x: [&BlockQ2K; 2], y: *const i8, st: [[int32x4_t; 4]; 2]) -> [int32x4_t; 2] {
    let (r0, r1): (int32x4_t, int32x4_t);
    std::arch::asm!(
        "ldp {a0:q}, {b0:q}, [{x0}, #16]",
        "ldp {a1:q}, {b1:q}, [{x1}, #16]",
        "movi {c0:v}.4s, #0",
        "movi {c1:v}.4s, #0",
        "ldp {y0:q}, {y1:q}, [{y}, #0]",
        rows2!(and "a", "m0"),
        rows2!(sdot "y0"),
        rows2!(step "mul", 0, 0),
        rows2!(and "b", "m0"),
        rows2!(sdot "y1"),
        rows2!(step "mla", 0, 1),
        "ldp {y2:q}, {y3:q}, [{y}, #32]",
        rows2!(and "a", "m1"),
        rows2!(sdot "y2"),
        rows2!(step "mla", 0, 2),
        rows2!(and "b", "m1"),
        rows2!(sdot "y3"),
        rows2!(step "mla", 0, 3),
        "ldp {y0:q}, {y1:q}, [{y}, #64]",
        rows2!(and "a", "m2"),
        rows2!(sdot "y0"),
        rows2!(step "mla", 1, 0),
        rows2!(and "b", "m2"),
        rows2!(sdot "y1"),
        rows2!(step "mla", 1, 1),
        "ldp {y2:q}, {y3:q}, [{y}, #96]",
        rows2!(ushr "a", 6),
        rows2!(sdot "y2"),
        rows2!(step "mla", 1, 2),
        rows2!(ushr "b", 6),
        rows2!(sdot "y3"),
        rows2!(step "mla", 1, 3),
        "ldp {a0:q}, {b0:q}, [{x0}, #48]",
        "ldp {a1:q}, {b1:q}, [{x1}, #48]",
        "ldp {y0:q}, {y1:q}, [{y}, #128]",
        rows2!(and "a", "m0"),
        rows2!(sdot "y0"),
        rows2!(step "mla", 2, 0),
        rows2!(and "b", "m0"),
        rows2!(sdot "y1"),
        rows2!(step "mla", 2, 1),
        "ldp {y2:q}, {y3:q}, [{y}, #160]",
        rows2!(and "a", "m1"),
        rows2!(sdot "y2"),
        rows2!(step "mla", 2, 2),
        rows2!(and "b", "m1"),
        rows2!(sdot "y3"),
        rows2!(step "mla", 2, 3),
        "ldp {y0:q}, {y1:q}, [{y}, #192]",
        rows2!(and "a", "m2"),
        rows2!(sdot "y0"),
        rows2!(step "mla", 3, 0),
        rows2!(and "b", "m2"),
        rows2!(sdot "y1"),
        rows2!(step "mla", 3, 1),
        "ldp {y2:q}, {y3:q}, [{y}, #224]",
        rows2!(ushr "a", 6),
        rows2!(sdot "y2"),
        rows2!(step "mla", 3, 2),
        rows2!(ushr "b", 6),
        rows2!(sdot "y3"),
        rows2!(step "mla", 3, 3),
        x0 = in(reg) std::ptr::from_ref(x[0]), x1 = in(reg) std::ptr::from_ref(x[1]), y = in(reg) y,
        m0 = in(vreg) vdupq_n_u8(0x03), m1 = in(vreg) vdupq_n_u8(0x0C), m2 = in(vreg) vdupq_n_u8(0x30),
        s00 = in(vreg) st[0][0], s01 = in(vreg) st[0][1], s02 = in(vreg) st[0][2], s03 = in(vreg) st[0][3],
        s10 = in(vreg) st[1][0], s11 = in(vreg) st[1][1], s12 = in(vreg) st[1][2], s13 = in(vreg) st[1][3],
        r0 = out(vreg) r0, r1 = out(vreg) r1,
        c0 = out(vreg) _, c1 = out(vreg) _, t0 = out(vreg) _, t1 = out(vreg) _,
        a0 = out(vreg) _, b0 = out(vreg) _, a1 = out(vreg) _, b1 = out(vreg) _,
        y0 = out(vreg) _, y1 = out(vreg) _, y2 = out(vreg) _, y3 = out(vreg) _,
        options(pure, readonly, nostack)
    );
    [r0, r1]
}

#[inline(always)]
unsafe fn dotn_q2_k<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8K]) -> [f32; R] {
    const { assert!(R == 2, "the Q2_K body takes two rows") };
    let x = rows.map(as_blocks::<BlockQ2K>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let mut acc = vdupq_n_f32(0.0);
    let sign = vld1q_f32([1.0f32 / 16.0, -1.0, 1.0 / 16.0, -1.0].as_ptr());
    for (b, yb) in a[..nb].iter().enumerate() {
        let xb: [&BlockQ2K; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let sc: [_; R] = std::array::from_fn(|r| q2_k_scales(xb[r]));
        let st: [_; R] = std::array::from_fn(|r| steps16(sc[r].0[0], sc[r].0[1]));
        // The minimums first: their registers are free again for the products.
        let bsums = [vld1q_s16(yb.bsums.as_ptr()), vld1q_s16(yb.bsums.as_ptr().add(8))];
        let msum: [_; R] = std::array::from_fn(|r| q2_k_mins(sc[r].1, bsums));
        let sums: [int32x4_t; R] = if D {
            let core = q2_k_core2_sdot([xb[0], xb[1]], yb.qs.as_ptr(), [st[0], st[1]]);
            std::array::from_fn(|r| core[r])
        } else {
            let zero = vdupq_n_s32(0);
            let y = acts_half(yb, 0);
            let cr: [_; R] = std::array::from_fn(|r| {
                chain8::<D, true>(bit_pairs(&xb[r].qs, 0).map(s8), &y, (zero, zero), st[r][0], st[r][1])
            });
            let y = acts_half(yb, 1);
            std::array::from_fn(|r| {
                chain8::<D, false>(bit_pairs(&xb[r].qs, 1).map(s8), &y, cr[r], st[r][2], st[r][3]).1
            })
        };
        let ysign = vmulq_n_f32(sign, yb.d);
        acc = q2_k_finish2(acc, [sums[0], sums[1]], [xb[0], xb[1]], [msum[0], msum[1]], ysign);
    }
    pair_out(acc)
}

/// Half `H` of a Q3_K block as unsigned 3-bit values (value + 4) in place:
/// [`bit_pairs`] plus each value's high bit (bit 4H + j of its `hmask` byte)
/// moved just above its pair (to bit 2j + 2 for j < 3, bit 2 for j = 3).
#[inline(always)]
unsafe fn q3_k_half<const H: usize>(xb: &BlockQ3K) -> [uint8x16_t; 8] {
    let v = bit_pairs(&xb.qs, H);
    let (hm0, hm1) = (vld1q_u8(xb.hmask.as_ptr()), vld1q_u8(xb.hmask.as_ptr().add(16)));
    let (b2, b4, b6) = (vdupq_n_u8(0x04), vdupq_n_u8(0x10), vdupq_n_u8(0x40));
    // Immediate shifts only: a vector shift count per pair would hold eight
    // more registers across the four rows.
    let high = |hm: uint8x16_t| -> [uint8x16_t; 4] {
        if H == 0 {
            [
                vandq_u8(vshlq_n_u8::<2>(hm), b2),
                vandq_u8(vshlq_n_u8::<3>(hm), b4),
                vandq_u8(vshlq_n_u8::<4>(hm), b6),
                vandq_u8(vshrq_n_u8::<1>(hm), b2),
            ]
        } else {
            [
                vandq_u8(vshrq_n_u8::<2>(hm), b2),
                vandq_u8(vshrq_n_u8::<1>(hm), b4),
                vandq_u8(hm, b6),
                vandq_u8(vshrq_n_u8::<5>(hm), b2),
            ]
        }
    };
    let (h0, h1) = (high(hm0), high(hm1));
    [
        vorrq_u8(v[0], h0[0]),
        vorrq_u8(v[1], h1[0]),
        vorrq_u8(v[2], h0[1]),
        vorrq_u8(v[3], h1[1]),
        vorrq_u8(v[4], h0[2]),
        vorrq_u8(v[5], h1[2]),
        vorrq_u8(v[6], h0[3]),
        vorrq_u8(v[7], h1[3]),
    ]
}

/// A Q3_K block's 16 signed scales as i16 (groups 0..8, 8..16): as stored,
/// and times the in-place factors of [`PAIR_SCALE`].
#[inline(always)]
unsafe fn q3_k_scales(xb: &BlockQ3K) -> ([int16x8_t; 2], [int16x8_t; 2]) {
    // The 6-bit values as `unpack_scales_words` forms them, in vector lanes:
    // words `a`, `b` (bytes 0..8) give the low nibbles, `a & 15, b & 15` for
    // scales 0..8 and `a >> 4, b >> 4` for 8..16; word `high` (bytes 8..12)
    // gives bit pair `k` of each byte to the scales `4k..4k + 4`, inserted
    // above the nibble. (Two replicating loads, no general-purpose work.)
    const NIBBLE_SHIFTS: u64 = 0xFCFC_FCFC_FCFC_FCFC; // 0 for bytes 0..8, -4 for 8..16
    const PAIR_SHIFTS: [i8; 16] = [0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6];
    let ab = vreinterpretq_u8_u64(vld1q_dup_u64(xb.scales.as_ptr().cast()));
    let low = vandq_u8(
        vshlq_u8(ab, vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(0), vcreate_u64(NIBBLE_SHIFTS)))),
        vdupq_n_u8(0x0F),
    );
    let high = vreinterpretq_u8_u32(vld1q_dup_u32(xb.scales.as_ptr().add(8).cast()));
    let pairs = vandq_u8(vshlq_u8(high, vld1q_s8(PAIR_SHIFTS.as_ptr())), vdupq_n_u8(0x03));
    let biased = vsliq_n_u8::<4>(low, pairs);
    let sc = vsubq_s8(s8(biased), vdupq_n_s8(32));
    let (lo, hi) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
    let mult = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(PAIR_SCALE)));
    ([lo, hi], [vmulq_s16(lo, mult), vmulq_s16(hi, mult)])
}

// The Q3_K `asm!` below reads `hmask` at offset 0 of the block, `qs` at 32.
const _: () = assert!(std::mem::offset_of!(BlockQ3K, hmask) == 0 && std::mem::offset_of!(BlockQ3K, qs) == 32);

/// The integer part of a block of two Q3_K rows against a Q8_K block's
/// activations, as [`q2_k_core2_sdot`] computes Q2_K's: each value is its bit
/// pair in place (see [`bit_pairs`]) with its high bit (from `hmask`)
/// inserted just above by one `bit`, as [`q3_k_half`] places it. `x`: the
/// rows' blocks (`qs`, `hmask` read at their offsets), `st`: their
/// [`steps16_i16`], `r`: each row's starting sum (the offset, negated). One
/// `asm!` for the reason given at [`q2_k_core2_sdot`]: from intrinsics LLVM
/// spent 344 instructions a block of two rows, here 180 plus the scales and
/// the finish.
#[inline(always)]
unsafe fn q3_k_core2_sdot(
    x: [&BlockQ3K; 2],
    y: *const i8,
    st: [[int16x8_t; 2]; 2],
    r: [int32x4_t; 2],
) -> [int32x4_t; 2] {
    let [mut r0, mut r1] = r;
    std::arch::asm!(
        "movi {m0:v}.16b, #0x03",
        "movi {m1:v}.16b, #0x0c",
        "movi {m2:v}.16b, #0x30",
        "movi {n2:v}.16b, #0x04",
        "movi {n4:v}.16b, #0x10",
        "movi {n6:v}.16b, #0x40",
        "ldp {h00:q}, {h10:q}, [{x0}]",
        "ldp {h01:q}, {h11:q}, [{x1}]",
        "ldp {a0:q}, {b0:q}, [{x0}, #32]",
        "ldp {a1:q}, {b1:q}, [{x1}, #32]",
        "movi {c0:v}.4s, #0",
        "movi {c1:v}.4s, #0",
        "ldp {y0:q}, {y1:q}, [{y}, #0]",
        rows2!(widen "sxtl", 0, "4h"),
        rows2!(and "a", "m0"),
        rows2!(high shl "h0", 2, "n2"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 0),
        rows2!(and "b", "m0"),
        rows2!(high shl "h1", 2, "n2"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 1),
        "ldp {y0:q}, {y1:q}, [{y}, #32]",
        rows2!(and "a", "m1"),
        rows2!(high shl "h0", 3, "n4"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 2),
        rows2!(and "b", "m1"),
        rows2!(high shl "h1", 3, "n4"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 3),
        "ldp {y0:q}, {y1:q}, [{y}, #64]",
        rows2!(widen "sxtl2", 0, "8h"),
        rows2!(and "a", "m2"),
        rows2!(high shl "h0", 4, "n6"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 0),
        rows2!(and "b", "m2"),
        rows2!(high shl "h1", 4, "n6"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 1),
        "ldp {y0:q}, {y1:q}, [{y}, #96]",
        rows2!(ushr "a", 6),
        rows2!(high ushr "h0", 1, "n2"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 2),
        rows2!(ushr "b", 6),
        rows2!(high ushr "h1", 1, "n2"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 3),
        "ldp {a0:q}, {b0:q}, [{x0}, #64]",
        "ldp {a1:q}, {b1:q}, [{x1}, #64]",
        "ldp {y0:q}, {y1:q}, [{y}, #128]",
        rows2!(widen "sxtl", 1, "4h"),
        rows2!(and "a", "m0"),
        rows2!(high ushr "h0", 2, "n2"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 0),
        rows2!(and "b", "m0"),
        rows2!(high ushr "h1", 2, "n2"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 1),
        "ldp {y0:q}, {y1:q}, [{y}, #160]",
        rows2!(and "a", "m1"),
        rows2!(high ushr "h0", 1, "n4"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 2),
        rows2!(and "b", "m1"),
        rows2!(high ushr "h1", 1, "n4"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 3),
        "ldp {y0:q}, {y1:q}, [{y}, #192]",
        rows2!(widen "sxtl2", 1, "8h"),
        rows2!(and "a", "m2"),
        rows2!(high "h0", "n6"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 0),
        rows2!(and "b", "m2"),
        rows2!(high "h1", "n6"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 1),
        "ldp {y0:q}, {y1:q}, [{y}, #224]",
        rows2!(ushr "a", 6),
        rows2!(high ushr "h0", 5, "n2"),
        rows2!(sdot "y0"),
        rows2!(stepw "mla", 2),
        rows2!(ushr "b", 6),
        rows2!(high ushr "h1", 5, "n2"),
        rows2!(sdot "y1"),
        rows2!(stepw "mla", 3),
        x0 = in(reg) std::ptr::from_ref(x[0]), x1 = in(reg) std::ptr::from_ref(x[1]), y = in(reg) y,
        m0 = out(vreg) _, m1 = out(vreg) _, m2 = out(vreg) _, n2 = out(vreg) _, n4 = out(vreg) _, n6 = out(vreg) _,
        s00 = in(vreg) st[0][0], s01 = in(vreg) st[0][1], s10 = in(vreg) st[1][0], s11 = in(vreg) st[1][1],
        w0 = out(vreg) _, w1 = out(vreg) _,
        r0 = inout(vreg) r0, r1 = inout(vreg) r1,
        c0 = out(vreg) _, c1 = out(vreg) _, t0 = out(vreg) _, t1 = out(vreg) _, u = out(vreg) _,
        a0 = out(vreg) _, b0 = out(vreg) _, a1 = out(vreg) _, b1 = out(vreg) _,
        h00 = out(vreg) _, h10 = out(vreg) _, h01 = out(vreg) _, h11 = out(vreg) _,
        y0 = out(vreg) _, y1 = out(vreg) _,
        options(pure, readonly, nostack)
    );
    [r0, r1]
}

#[inline(always)]
unsafe fn dotn_q3_k<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8K]) -> [f32; R] {
    const { assert!(R == 2, "the Q3_K body takes two rows") };
    let x = rows.map(as_blocks::<BlockQ3K>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let mut acc = vdupq_n_f32(0.0);
    for (b, yb) in a[..nb].iter().enumerate() {
        let xb: [&BlockQ3K; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let sc: [_; R] = std::array::from_fn(|r| q3_k_scales(xb[r]));
        let bsums = [vld1q_s16(yb.bsums.as_ptr()), vld1q_s16(yb.bsums.as_ptr().add(8))];
        let d = [&xb[0].d, &xb[1].d];
        if D {
            // The steps go in as i16 and are widened a quarter at a time
            // inside: eight registers fewer held across the products.
            let st: [_; R] = std::array::from_fn(|r| steps16_i16(sc[r].1[0], sc[r].1[1]));
            // The offset first, as the sums' starting value: its registers
            // are free again for the products.
            let off = |r: usize| vnegq_s32(vshlq_n_s32::<6>(dot_bsums16(sc[r].0[0], sc[r].0[1], bsums)));
            let [r0, r1] = q3_k_core2_sdot([xb[0], xb[1]], yb.qs.as_ptr(), [st[0], st[1]], [off(0), off(1)]);
            acc =
                vfmaq_f32(acc, vcvtq_f32_s32(vpaddq_s32(r0, r1)), vmulq_n_f32(d_pair(d[0], d[1]), yb.d * (1.0 / 16.0)));
        } else {
            let st: [_; R] = std::array::from_fn(|r| steps16(sc[r].1[0], sc[r].1[1]));
            let zero = vdupq_n_s32(0);
            let y = acts_half(yb, 0);
            let cr: [_; R] = std::array::from_fn(|r| {
                chain8::<D, true>(q3_k_half::<0>(xb[r]).map(s8), &y, (zero, zero), st[r][0], st[r][1])
            });
            let y = acts_half(yb, 1);
            let cr: [_; R] = std::array::from_fn(|r| {
                chain8::<D, false>(q3_k_half::<1>(xb[r]).map(s8), &y, cr[r], st[r][2], st[r][3])
            });
            let sc = [sc[0].0, sc[1].0];
            acc = offset_finish2::<6, false>(acc, [cr[0].1, cr[1].1], sc, bsums, d, yb.d * (1.0 / 16.0));
        }
    }
    pair_out(acc)
}

/// The two results of a pair accumulator (lanes `[row 0, row 0, row 1, row 1]`).
#[inline(always)]
unsafe fn pair_out<const R: usize>(acc: float32x4_t) -> [f32; R] {
    let v = vpaddq_f32(acc, acc);
    let mut out = [0.0f32; R];
    vst1_f32(out.as_mut_ptr(), vget_low_f32(v));
    out
}

// ---- exact kernels: N activation rows per pass over the weights --------------
//
// Each `exactn_*` body computes, for every activation row, the float
// operations of the `dotn_*` body it mirrors in the same order (see
// `table::Exact`); the weights are unpacked once for all the activation
// rows, and the integer sums (exact in any order) are formed row by row,
// each row's chain running through the activation rows in turn. A lone
// row (the rows kernel's remainder) runs the one-row body per activation
// row.

/// The one-row body `dot` with each of `N` activation rows.
#[inline(always)]
unsafe fn each_act<const N: usize>(a: [&[BlockQ8K]; N], dot: impl Fn(&[BlockQ8K]) -> f32) -> [f32; N] {
    a.map(dot)
}

#[inline(always)]
unsafe fn exact_q4_k<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    each_act(a, |a| dot_q4_k::<D>(w, a))
}

#[inline(always)]
unsafe fn exact_q6_k<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    each_act(a, |a| dot_q6_k::<D>(w, a))
}

/// The blocks both the weight rows and every activation row hold.
#[inline(always)]
fn common_blocks<W, const R: usize, const N: usize>(x: &[&[W]; R], a: &[&[BlockQ8K]; N]) -> usize {
    debug_assert!(x.iter().all(|r| a.iter().all(|a| r.len() == a.len())));
    x.iter().fold(a.iter().fold(usize::MAX, |n, a| n.min(a.len())), |n, r| n.min(r.len()))
}

/// Half `h` of one weight row's block (its values `v`, unpacked once) with
/// half `h` of block `yb[t]` of each activation row, chained by [`chain8`]
/// (`FIRST`: half 0, starting the chains).
#[inline(always)]
unsafe fn chain_half<const D: bool, const FIRST: bool, const N: usize>(
    v: [int8x16_t; 8],
    yb: &[&BlockQ8K; N],
    h: usize,
    cr: &mut [(int32x4_t, int32x4_t); N],
    s0: int32x4_t,
    s1: int32x4_t,
) {
    for t in 0..N {
        cr[t] = chain8::<D, FIRST>(v, &acts_half(yb[t], h), cr[t], s0, s1);
    }
}

/// [`dotn_q6_k`] with `N` activation rows.
#[inline(always)]
unsafe fn exactn_q6_k<const D: bool, const R: usize, const N: usize>(
    rows: [&[u8]; R],
    a: [&[BlockQ8K]; N],
) -> [[f32; R]; N] {
    const { assert!(R == 2, "the Q6_K body takes two rows") };
    let x = rows.map(as_blocks::<BlockQ6K>);
    let nb = common_blocks(&x, &a);
    let mut acc = [vdupq_n_f32(0.0); N];
    for b in 0..nb {
        let yb: [&BlockQ8K; N] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let xb: [&BlockQ6K; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let sc: [_; R] = std::array::from_fn(|r| q6_k_scales(xb[r]));
        let zero = vdupq_n_s32(0);
        let mut sums = [[zero; N]; R];
        for r in 0..R {
            let st = steps16(sc[r][0], sc[r][1]);
            let mut cr = [(zero, zero); N];
            chain_half::<D, true, N>(q6_half_unsigned(xb[r], 0), &yb, 0, &mut cr, st[0], st[1]);
            chain_half::<D, false, N>(q6_half_unsigned(xb[r], 1), &yb, 1, &mut cr, st[2], st[3]);
            sums[r] = cr.map(|c| c.1);
        }
        for t in 0..N {
            let bsums = [vld1q_s16(yb[t].bsums.as_ptr()), vld1q_s16(yb[t].bsums.as_ptr().add(8))];
            let d = [&xb[0].d, &xb[1].d];
            acc[t] = offset_finish2::<5, true>(acc[t], [sums[0][t], sums[1][t]], [sc[0], sc[1]], bsums, d, yb[t].d);
        }
    }
    acc.map(|v| whole_out(v))
}

/// Half `h` of a Q4_K block's values in the order of
/// [`q4_k_half_chain`]'s products: low nibbles of bytes 0..32, high
/// nibbles of them, low nibbles of bytes 32..64, high nibbles.
#[inline(always)]
unsafe fn q4_k_half(xb: &BlockQ4K, h: usize) -> [int8x16_t; 8] {
    let low = vdupq_n_u8(0x0F);
    let p = xb.qs.as_ptr().add(64 * h);
    let (q0, q1, q2, q3) = (vld1q_u8(p), vld1q_u8(p.add(16)), vld1q_u8(p.add(32)), vld1q_u8(p.add(48)));
    [
        s8(vandq_u8(q0, low)),
        s8(vandq_u8(q1, low)),
        s8(vshrq_n_u8::<4>(q0)),
        s8(vshrq_n_u8::<4>(q1)),
        s8(vandq_u8(q2, low)),
        s8(vandq_u8(q3, low)),
        s8(vshrq_n_u8::<4>(q2)),
        s8(vshrq_n_u8::<4>(q3)),
    ]
}

/// Groups 4h..4h + 4 of a Q4_K row (unpacked by [`q4_k_half`]) against half
/// `h` of the activations, chained as in [`q4_k_half_chain`] (one step per
/// group of 32, after its two products).
#[inline(always)]
unsafe fn chain4<const D: bool>(
    v: &[int8x16_t; 8],
    y: &[int8x16_t; 8],
    (c, r): (int32x4_t, int32x4_t),
    steps: int32x4_t,
) -> (int32x4_t, int32x4_t) {
    let c = dot16::<D>(dot16::<D>(c, v[0], y[0]), v[1], y[1]);
    let r = mla_lane::<0>(r, c, steps);
    let c = dot16::<D>(dot16::<D>(c, v[2], y[2]), v[3], y[3]);
    let r = mla_lane::<1>(r, c, steps);
    let c = dot16::<D>(dot16::<D>(c, v[4], y[4]), v[5], y[5]);
    let r = mla_lane::<2>(r, c, steps);
    let c = dot16::<D>(dot16::<D>(c, v[6], y[6]), v[7], y[7]);
    (c, mla_lane::<3>(r, c, steps))
}

/// A Q4_K block's scaled sums `r` with block `yb[t]` of each activation
/// row (`steps`: the block's two step registers), its values unpacked once.
#[inline(always)]
unsafe fn q4_k_row<const D: bool, const N: usize>(
    xb: &BlockQ4K,
    yb: &[&BlockQ8K; N],
    steps: [int32x4_t; 2],
) -> [int32x4_t; N] {
    let zero = vdupq_n_s32(0);
    let mut cr = [(zero, zero); N];
    for (h, st) in steps.into_iter().enumerate() {
        let v = q4_k_half(xb, h);
        for t in 0..N {
            cr[t] = chain4::<D>(&v, &acts_half(yb[t], h), cr[t], st);
        }
    }
    cr.map(|c| c.1)
}

/// [`dotn_q4_k`] with `N` activation rows: the four blocks' headers decoded
/// once, each row's values unpacked once for every activation row, and per
/// activation row the same finish on four lanes.
#[inline(always)]
unsafe fn exactn_q4_k<const D: bool, const R: usize, const N: usize>(
    rows: [&[u8]; R],
    a: [&[BlockQ8K]; N],
) -> [[f32; R]; N] {
    const { assert!(R == 4, "the Q4_K body takes four rows") };
    let x = rows.map(as_blocks::<BlockQ4K>);
    let nb = common_blocks(&x, &a);
    let mut acc = [vdupq_n_f32(0.0); N];
    for b in 0..nb {
        let yb: [&BlockQ8K; N] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let xb: [&BlockQ4K; 4] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let [dm, wa, wb, wc] = q4_k_headers4(xb);
        let (scales, mins) = q4_k_scales4(wa, wb, wc);
        let (s01, s23) = (scale_steps2(scales[0]), scale_steps2(scales[1]));
        let steps = [s01[0], s01[1], s23[0], s23[1]];
        // Each row's scaled sums with each activation row, reduced across
        // the rows pairwise (integers: the order does not matter) to the
        // lanes the decode body's finish sees.
        let (r0, r1) = (q4_k_row::<D, N>(xb[0], &yb, steps[0]), q4_k_row::<D, N>(xb[1], &yb, steps[1]));
        let mut p01 = r0;
        for t in 0..N {
            p01[t] = vpaddq_s32(r0[t], r1[t]);
        }
        let (r2, r3) = (q4_k_row::<D, N>(xb[2], &yb, steps[2]), q4_k_row::<D, N>(xb[3], &yb, steps[3]));
        let m16 = [
            vmovl_u8(vget_low_u8(mins[0])),
            vmovl_high_u8(mins[0]),
            vmovl_u8(vget_low_u8(mins[1])),
            vmovl_high_u8(mins[1]),
        ];
        let (dm01, dm23) = fp16x8(dm);
        let (d, dmin) = (vuzp1q_f32(dm01, dm23), vuzp2q_f32(dm01, dm23));
        for t in 0..N {
            let sum = vpaddq_s32(p01[t], vpaddq_s32(r2[t], r3[t]));
            let pairs = vpaddq_s16(vld1q_s16(yb[t].bsums.as_ptr()), vld1q_s16(yb[t].bsums.as_ptr().add(8)));
            let msum: [int32x4_t; 4] = std::array::from_fn(|r| {
                let m = vreinterpretq_s16_u16(m16[r]);
                vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs)
            });
            let msum = vpaddq_s32(vpaddq_s32(msum[0], msum[1]), vpaddq_s32(msum[2], msum[3]));
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(sum), vmulq_n_f32(d, yb[t].d));
            acc[t] = vfmsq_f32(acc[t], vcvtq_f32_s32(msum), vmulq_n_f32(dmin, yb[t].d));
        }
    }
    acc.map(|v| {
        let mut out = [0.0f32; R];
        vst1q_f32(out.as_mut_ptr(), v);
        out
    })
}

/// Lines of [`q4_k_x4_core`]: word `$w` (0..4) of chunks `2i` (register
/// `w$w`) and `2i + 1` (`w$w + 4`), low nibbles into the even groups' chain
/// `cl`, high nibbles into the odd groups' `ch`, each meeting its four
/// activations (element `$w` of `a0`..`a3`, see [`q4_k_x4_core`]).
#[rustfmt::skip]
macro_rules! x4_word {
    ($w:literal, $v:literal, $lo:literal, $hi:literal) => {
        concat!(
            "and {t0:v}.16b, {w", $v, ":v}.16b, {m:v}.16b\n",
            "ushr {t1:v}.16b, {w", $v, ":v}.16b, #4\n",
            "sdot {cl:v}.4s, {t0:v}.16b, {", $lo, ":v}.4b[", $w, "]\n",
            "sdot {ch:v}.4s, {t1:v}.16b, {", $hi, ":v}.4b[", $w, "]",
        )
    };
}

/// One quarter `i` of a block of four interleaved Q4_K rows (chunks `2i`,
/// `2i + 1`: groups `2i`, `2i + 1`), `$op` (`"mul"` to start the chains,
/// `"mla"`) the chains' step by steps `s$i` (i16: group `2i` in the low
/// half, `2i + 1` in the high half).
#[rustfmt::skip]
macro_rules! x4_quarter {
    ($i:literal, $q:literal, $y:literal, $y2:literal, $op:literal) => {
        concat!(
            "ldp {w0:q}, {w1:q}, [{q}, #", $q, "]\n",
            "ldp {w2:q}, {w3:q}, [{q}, #", $q, " + 32]\n",
            "ldp {w4:q}, {w5:q}, [{q}, #", $q, " + 64]\n",
            "ldp {w6:q}, {w7:q}, [{q}, #", $q, " + 96]\n",
            "ldp {a0:q}, {a1:q}, [{y}, #", $y, "]\n",
            "ldp {a2:q}, {a3:q}, [{y}, #", $y2, "]\n",
            x4_word!(0, 0, "a0", "a2"), "\n",
            x4_word!(1, 1, "a0", "a2"), "\n",
            x4_word!(2, 2, "a0", "a2"), "\n",
            x4_word!(3, 3, "a0", "a2"), "\n",
            x4_word!(0, 4, "a1", "a3"), "\n",
            x4_word!(1, 5, "a1", "a3"), "\n",
            x4_word!(2, 6, "a1", "a3"), "\n",
            x4_word!(3, 7, "a1", "a3"), "\n",
            "sxtl {s:v}.4s, {s", $i, ":v}.4h\n",
            $op, " {rl:v}.4s, {cl:v}.4s, {s:v}.4s\n",
            "sxtl2 {s:v}.4s, {s", $i, ":v}.8h\n",
            $op, " {rh:v}.4s, {ch:v}.4s, {s:v}.4s",
        )
    };
}

// The x4 core reads `qs` at its offset in the block.
const _: () = assert!(std::mem::offset_of!(BlockQ4Kx4, qs) == 80 && std::mem::offset_of!(BlockQ4Kx4, steps) == 16);

/// The scaled sums of a block of four interleaved Q4_K rows
/// ([`crate::quant::q4_k_x4`]) against a Q8_K block's activations (`y`: its
/// `qs`), one lane per row: each 16-byte register of weights holds the same
/// four weights of the four rows, so one `sdot` by element (the four
/// activations they meet) adds to all four rows' lanes, and one vector
/// multiply-add by the four rows' steps scales a group. Two chains by parts
/// (as in [`q4_k_half_chain`]): the even groups (low nibbles) and the odd
/// ones (high nibbles), each its own sums and steps (`s_g - s_(g+2)`), so
/// that two `sdot` chains run side by side. `st`: the steps as i16, quarter
/// `i` in `st[i]`.
#[inline(always)]
unsafe fn q4_k_x4_core(x: &BlockQ4Kx4, y: *const i8, st: [int16x8_t; 4]) -> int32x4_t {
    let r: int32x4_t;
    std::arch::asm!(
        "movi {m:v}.16b, #0x0f",
        "movi {cl:v}.4s, #0",
        "movi {ch:v}.4s, #0",
        x4_quarter!("0", "80", "0", "32", "mul"),
        x4_quarter!("1", "208", "64", "96", "mla"),
        x4_quarter!("2", "336", "128", "160", "mla"),
        x4_quarter!("3", "464", "192", "224", "mla"),
        "add {rl:v}.4s, {rl:v}.4s, {rh:v}.4s",
        q = in(reg) std::ptr::from_ref(x), y = in(reg) y,
        s0 = in(vreg) st[0], s1 = in(vreg) st[1], s2 = in(vreg) st[2], s3 = in(vreg) st[3],
        rl = out(vreg) r, rh = out(vreg) _, cl = out(vreg) _, ch = out(vreg) _, s = out(vreg) _,
        m = out(vreg) _, t0 = out(vreg) _, t1 = out(vreg) _,
        w0 = out(vreg) _, w1 = out(vreg) _, w2 = out(vreg) _, w3 = out(vreg) _,
        w4 = out(vreg) _, w5 = out(vreg) _, w6 = out(vreg) _, w7 = out(vreg) _,
        a0 = out(vreg) _, a1 = out(vreg) _, a2 = out(vreg) _, a3 = out(vreg) _,
        options(pure, readonly, nostack)
    );
    r
}

/// Four interleaved Q4_K rows ([`crate::quant::q4_k_x4`]: `w` holds their
/// blocks) with one activation row: the same integers as [`dotn_q4_k`] and
/// the same float operations on each lane, so the same products to the bit.
#[inline(always)]
pub(super) unsafe fn dot_q4_k_x4(w: &[u8], a: &[BlockQ8K]) -> [f32; 4] {
    let x = as_blocks::<BlockQ4Kx4>(w);
    debug_assert_eq!(x.len(), a.len());
    let nb = x.len().min(a.len());
    let mut acc = vdupq_n_f32(0.0);
    for b in 0..nb {
        let (xb, yb) = (x.get_unchecked(b), a.get_unchecked(b));
        let (s01, s23) = (vld1q_s8(xb.steps.as_ptr()), vld1q_s8(xb.steps.as_ptr().add(16)));
        let st = [vmovl_s8(vget_low_s8(s01)), vmovl_high_s8(s01), vmovl_s8(vget_low_s8(s23)), vmovl_high_s8(s23)];
        // The minimums against the activations' sums over each group of 32,
        // `mins` group-major: lanes `[g, g + 1] x rows` meet pair g, g + 1.
        let (m01, m23) = (vld1q_u8(xb.mins.as_ptr()), vld1q_u8(xb.mins.as_ptr().add(16)));
        let w = |v: uint16x8_t| vreinterpretq_s16_u16(v);
        let m16 = [
            w(vmovl_u8(vget_low_u8(m01))),
            w(vmovl_high_u8(m01)),
            w(vmovl_u8(vget_low_u8(m23))),
            w(vmovl_high_u8(m23)),
        ];
        let pairs = vpaddq_s16(vld1q_s16(yb.bsums.as_ptr()), vld1q_s16(yb.bsums.as_ptr().add(8)));
        let m = vmull_laneq_s16::<0>(vget_low_s16(m16[0]), pairs);
        let m = vmlal_high_laneq_s16::<1>(m, m16[0], pairs);
        let m = vmlal_laneq_s16::<2>(m, vget_low_s16(m16[1]), pairs);
        let m = vmlal_high_laneq_s16::<3>(m, m16[1], pairs);
        let m = vmlal_laneq_s16::<4>(m, vget_low_s16(m16[2]), pairs);
        let m = vmlal_high_laneq_s16::<5>(m, m16[2], pairs);
        let m = vmlal_laneq_s16::<6>(m, vget_low_s16(m16[3]), pairs);
        let msum = barrier(vmlal_high_laneq_s16::<7>(m, m16[3], pairs));
        let scaled = q4_k_x4_core(xb, yb.qs.as_ptr(), st);
        // d of the four rows, then dmin: eight f16 in order.
        let (d, dmin) = fp16x8(vld1q_u32(xb.d.as_ptr().cast()));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(scaled), vmulq_n_f32(d, yb.d));
        acc = vfmsq_f32(acc, vcvtq_f32_s32(msum), vmulq_n_f32(dmin, yb.d));
    }
    let mut out = [0.0f32; 4];
    vst1q_f32(out.as_mut_ptr(), acc);
    out
}

/// [`dot_q4_k_x4`] on the dot-product path, over consecutive groups of
/// four interleaved rows (`group_bytes` each) into `out` (four a group).
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn q4_k_x4(w: &[u8], group_bytes: usize, a: &[BlockQ8K], out: &mut [f32]) {
    for (g, o) in w.chunks_exact(group_bytes).zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&dot_q4_k_x4(g, a));
    }
}

/// Group `$j` (0..4) of a quarter of [`q6_k_x4_core`]: its three registers
/// (`v20`..`v22`, loaded as the pointer steps on) unpacked to the four words
/// (see [`crate::quant::q6_k_x4`]: `A & 63`, `B & 63`, `C & 63` and the top
/// bit pairs gathered by two `sri` and a shift), the group's sum started at
/// the offset's share (`-32 * bsum`, lane `$j` of `n`) and taken by four
/// `sdot` by element (activations `a$j`), then `$op` (`"mul"` to start
/// the chain, `"mla"`) into `$r` by the four rows' scales `k$j`.
#[rustfmt::skip]
macro_rules! x6_group {
    ($j:literal, $n:literal, $op:literal, $r:literal) => {
        concat!(
            "ld1 {{v20.16b, v21.16b, v22.16b}}, [{q}], #48\n",
            "and {t:v}.16b, v22.16b, {m:v}.16b\n",
            "sri v22.16b, v21.16b, #2\n",
            "and v21.16b, v21.16b, {m:v}.16b\n",
            "sri v22.16b, v20.16b, #4\n",
            "and v20.16b, v20.16b, {m:v}.16b\n",
            "ushr v22.16b, v22.16b, #2\n",
            "dup {g:v}.4s, {", $n, ":v}.s[", $j, "]\n",
            "sdot {g:v}.4s, v20.16b, {a", $j, ":v}.4b[0]\n",
            "sdot {g:v}.4s, v21.16b, {a", $j, ":v}.4b[1]\n",
            "sdot {g:v}.4s, {t:v}.16b, {a", $j, ":v}.4b[2]\n",
            "sdot {g:v}.4s, v22.16b, {a", $j, ":v}.4b[3]\n",
            $op, " {", $r, ":v}.4s, {g:v}.4s, {k", $j, ":v}.4s",
        )
    };
}

/// A quarter of [`q6_k_x4_core`] (groups `4i..4i + 4`, their offsets in
/// register `$n`): the
/// activations of its four groups, its 16 scales widened to i32 (group `j`
/// of the four rows in `k$j`), then the groups, alternately into the two
/// chains `r0`, `r1`; `$op0` starts them in the first quarter.
#[rustfmt::skip]
macro_rules! x6_quarter {
    ($n:literal, $y:literal, $y2:literal, $sc:literal, $op0:literal) => {
        concat!(
            "ldp {a0:q}, {a1:q}, [{y}, #", $y, "]\n",
            "ldp {a2:q}, {a3:q}, [{y}, #", $y2, "]\n",
            "ldr {k3:q}, [{x}, #", $sc, "]\n",
            "sxtl {k1:v}.8h, {k3:v}.8b\n",
            "sxtl2 {k3:v}.8h, {k3:v}.16b\n",
            "sxtl {k0:v}.4s, {k1:v}.4h\n",
            "sxtl2 {k1:v}.4s, {k1:v}.8h\n",
            "sxtl {k2:v}.4s, {k3:v}.4h\n",
            "sxtl2 {k3:v}.4s, {k3:v}.8h\n",
            x6_group!("0", $n, $op0, "r0"), "\n",
            x6_group!("1", $n, $op0, "r1"), "\n",
            x6_group!("2", $n, "mla", "r0"), "\n",
            x6_group!("3", $n, "mla", "r1"),
        )
    };
}

// The Q6_K x4 core reads the scales and values at their offsets in the block.
const _: () = assert!(std::mem::offset_of!(BlockQ6Kx4, scales) == 8 && std::mem::offset_of!(BlockQ6Kx4, qs) == 72);

/// The integer sums `sum_g scale_g * sum (q - 32) * a` of a block of four
/// interleaved Q6_K rows ([`crate::quant::q6_k_x4`]) against a Q8_K
/// block's activations (`y`: its `qs`), one lane per row: each group's
/// three registers unpack to four words of the same four weights of the
/// four rows, met by `sdot` by element with the same four activations; a
/// group's sum starts at `-32 * bsum_g` (`n`: quarter `i`'s groups in
/// `n[i]`), so the offset costs nothing per group, and one vector
/// multiply-add by the four rows' scales adds it to one of two chains.
/// `m`: 0x3f in every byte.
#[inline(always)]
unsafe fn q6_k_x4_core(x: &BlockQ6Kx4, y: *const i8, n: [int32x4_t; 4], m: uint8x16_t) -> int32x4_t {
    let r: int32x4_t;
    std::arch::asm!(
        x6_quarter!("n0", "0", "32", "8", "mul"),
        x6_quarter!("n1", "64", "96", "24", "mla"),
        x6_quarter!("n2", "128", "160", "40", "mla"),
        x6_quarter!("n3", "192", "224", "56", "mla"),
        "add {r0:v}.4s, {r0:v}.4s, {r1:v}.4s",
        x = in(reg) std::ptr::from_ref(x), y = in(reg) y,
        q = inout(reg) x.qs.as_ptr() => _,
        n0 = in(vreg) n[0], n1 = in(vreg) n[1], n2 = in(vreg) n[2], n3 = in(vreg) n[3],
        r0 = out(vreg) r, r1 = out(vreg) _, g = out(vreg) _, t = out(vreg) _, m = in(vreg) m,
        k0 = out(vreg) _, k1 = out(vreg) _, k2 = out(vreg) _, k3 = out(vreg) _,
        a0 = out(vreg) _, a1 = out(vreg) _, a2 = out(vreg) _, a3 = out(vreg) _,
        out("v20") _, out("v21") _, out("v22") _,
        options(pure, readonly, nostack)
    );
    r
}

/// Four interleaved Q6_K rows ([`crate::quant::q6_k_x4`]: `w` holds their
/// blocks) with one activation row: each row's block sum the same integer
/// as the plain kernels', scaled by `d * y.d` in one multiply-add a block.
#[inline(always)]
pub(super) unsafe fn dot_q6_k_x4(w: &[u8], a: &[BlockQ8K]) -> [f32; 4] {
    let x = as_blocks::<BlockQ6Kx4>(w);
    debug_assert_eq!(x.len(), a.len());
    let nb = x.len().min(a.len());
    let mut acc = vdupq_n_f32(0.0);
    let (m32, low6) = (vdupq_n_s16(-32), vdupq_n_u8(0x3f));
    for b in 0..nb {
        let (xb, yb) = (x.get_unchecked(b), a.get_unchecked(b));
        // The offset's share of each group: -32 times its activations' sum.
        let n = offsets_q6(&yb.bsums, m32);
        let isum = q6_k_x4_core(xb, yb.qs.as_ptr(), n, low6);
        let d = fp16x4_packed(&xb.d);
        acc = vfmaq_f32(acc, vcvtq_f32_s32(isum), vmulq_n_f32(d, yb.d));
    }
    let mut out = [0.0f32; 4];
    vst1q_f32(out.as_mut_ptr(), acc);
    out
}

/// `-32 * bsums` as i32, groups `4i..4i + 4` in vector `i` (`m32`: -32 in
/// every lane). Four `smull` in `asm!`: LLVM makes each a shift and a
/// negation.
#[inline(always)]
unsafe fn offsets_q6(bsums: &[i16; 16], m32: int16x8_t) -> [int32x4_t; 4] {
    let (b0, b1) = (vld1q_s16(bsums.as_ptr()), vld1q_s16(bsums.as_ptr().add(8)));
    let (n0, n1, n2, n3): (int32x4_t, int32x4_t, int32x4_t, int32x4_t);
    std::arch::asm!(
        "smull {n0:v}.4s, {b0:v}.4h, {m:v}.4h",
        "smull2 {n1:v}.4s, {b0:v}.8h, {m:v}.8h",
        "smull {n2:v}.4s, {b1:v}.4h, {m:v}.4h",
        "smull2 {n3:v}.4s, {b1:v}.8h, {m:v}.8h",
        b0 = in(vreg) b0, b1 = in(vreg) b1, m = in(vreg) m32,
        n0 = out(vreg) n0, n1 = out(vreg) n1, n2 = out(vreg) n2, n3 = out(vreg) n3,
        options(pure, nomem, nostack)
    );
    [n0, n1, n2, n3]
}

/// [`dot_q6_k_x4`] on the dot-product path, over consecutive groups of
/// four interleaved rows (`group_bytes` each) into `out` (four a group).
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn q6_k_x4(w: &[u8], group_bytes: usize, a: &[BlockQ8K], out: &mut [f32]) {
    for (g, o) in w.chunks_exact(group_bytes).zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&dot_q6_k_x4(g, a));
    }
}
