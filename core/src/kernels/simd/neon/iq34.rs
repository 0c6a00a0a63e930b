//! NEON dot products of the non-linear and grid formats: IQ4_NL and MXFP4
//! (with Q8_0 activations), IQ4_XS, IQ3_XXS and IQ3_S (with Q8_K), one
//! weight row against one to four activation rows.
//!
//! IQ4_NL, IQ4_XS and MXFP4 map 4-bit indices through their 16-entry int8
//! table with one `tbl` per 16 values. The IQ3 formats gather four unsigned
//! grid values (at most 62) per index and take their signs from a table of
//! +-1 bytes (IQ3_XXS: seven stored bits and their parity, `KSIGN_BYTES`) or
//! from byte masks (IQ3_S: whole sign bytes, `(q ^ m) - m`). Each group of
//! 32 weights is unpacked once into signed int8 lanes that serve every
//! activation row in [`dot16`], and group scales multiply the 4-lane group
//! sums into an i32 accumulator (super-blocks: the eight scales computed
//! once in vectors and applied by lane): one float multiply-add per block
//! (IQ4_NL, MXFP4) or super-block.
//!
//! MXFP4's rows kernel (decode: the experts of gpt-oss) takes four weight
//! rows at a time, one lane of its accumulator per row ([`dotn_mxfp4`]).

use super::{
    acts_paths, aux_scales, by_twos, dot16, fp16, ksigns32, lane_sums4, ld_s8, mla_lane, nibbles8, odd, opaque, word,
};
use crate::quant::iq4::KVALUES_IQ4NL;
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4};
use crate::quant::{
    as_blocks, iq3_s, iq3_xxs, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ8K, BlockQ8_0F,
};
use std::arch::aarch64::*;

acts_paths! {
    iq4_nl = dot_iq4_nl(BlockQ8_0F);
    mxfp4 = dot_mxfp4(BlockQ8_0F) / dotn_mxfp4 * 4;
    iq4_xs = dot_iq4_xs(BlockQ8K);
    iq3_xxs = dot_iq3_xxs(BlockQ8K);
    iq3_s = dot_iq3_s(BlockQ8K);
}

/// 16 bytes of nibbles through `table`: (values 0..16 from the low nibbles,
/// values 16..32 from the high ones).
#[inline(always)]
unsafe fn lookup(table: int8x16_t, qs: *const u8) -> [int8x16_t; 2] {
    let q = vld1q_u8(qs);
    [vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0F))), vqtbl1q_s8(table, vshrq_n_u8::<4>(q))]
}

/// Dot product of 32 weights (two registers) with the 32 activations at `y`.
#[inline(always)]
unsafe fn dot32<const D: bool>(w: [int8x16_t; 2], y: *const i8) -> int32x4_t {
    let p = dot16::<D>(vdupq_n_s32(0), w[0], ld_s8(y.cast()));
    dot16::<D>(p, w[1], ld_s8(y.add(16).cast()))
}

/// The 32 bits of `bits` spread to one byte each: 0xFF where bit `i` is set,
/// bytes 0..16 and 16..32.
#[inline(always)]
unsafe fn sign_masks(bits: u32) -> [int8x16_t; 2] {
    let src = vreinterpretq_u8_u32(vdupq_n_u32(bits));
    // Byte i takes source byte i/8 and tests its bit i%8.
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let lo = vtstq_u8(vqtbl1q_u8(src, vcombine_u8(vdup_n_u8(0), vdup_n_u8(1))), bit);
    let hi = vtstq_u8(vqtbl1q_u8(src, vcombine_u8(vdup_n_u8(2), vdup_n_u8(3))), bit);
    [vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)]
}

/// Eight grid points (four values each) as two registers.
#[inline(always)]
unsafe fn grid8(p: [u32; 8]) -> [int8x16_t; 2] {
    let r = |k: usize| {
        vreinterpretq_s8_u32(vcombine_u32(
            vcreate_u32(p[k] as u64 | (p[k + 1] as u64) << 32),
            vcreate_u32(p[k + 2] as u64 | (p[k + 3] as u64) << 32),
        ))
    };
    [r(0), r(4)]
}

// ---- 32-element blocks with a 16-entry table, Q8_0 activations -----------

#[inline(always)]
unsafe fn dot_lut32<B, const D: bool, const N: usize>(
    x: &[B],
    a: [&[BlockQ8_0F]; N],
    table: &[i8; 16],
    part: impl Fn(&B) -> (f32, &[u8; 16]),
) -> [f32; N] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let t = vld1q_s8(table.as_ptr());
    // Two accumulators per activation row (even and odd blocks), for latency.
    let mut acc = [[vdupq_n_f32(0.0); 2]; N];
    for (i, xb) in x.iter().enumerate() {
        let (d, q) = part(xb);
        let w = lookup(t, q.as_ptr());
        for n in 0..N {
            let yb = a[n].get_unchecked(i);
            acc[n][i % 2] = vfmaq_n_f32(acc[n][i % 2], vcvtq_f32_s32(dot32::<D>(w, yb.qs.as_ptr())), d * yb.d);
        }
    }
    acc.map(|[a0, a1]| vaddvq_f32(vaddq_f32(a0, a1)))
}

#[inline(always)]
unsafe fn dot_iq4_nl<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_lut32::<BlockIQ4NL, D, N>(as_blocks(w), a, &KVALUES_IQ4NL, |b| (fp16(b.d), &b.qs))
}

#[inline(always)]
unsafe fn dot_mxfp4<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_lut32::<BlockMXFP4, D, N>(as_blocks(w), a, &KVALUES_MXFP4, |b| (e8m0_to_f32_half(b.e), &b.qs))
}

/// Four MXFP4 rows with one activation row, lane `r` of every vector for
/// row `r`. Each block's activations are loaded once for the four rows; the
/// rows' integer sums run on through the blocks, never zeroed (wrapping
/// arithmetic: the difference between two blocks' running sums is exact), and
/// are reduced across lanes with pairwise adds into one register, so that the
/// block's sums take one conversion, one multiply and one add for the four
/// rows, with the four scales decoded in one vector. Lane for lane the scalar
/// twin's arithmetic (`sum += (y.d * scale) * sumi`, no fused multiply-add):
/// equal to [`crate::quant::mxfp4::vec_dot`] to the bit.
#[inline(always)]
unsafe fn dotn_mxfp4<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8_0F]) -> [f32; R] {
    const { assert!(R == 4, "the MXFP4 body takes four rows") };
    let x = rows.map(as_blocks::<BlockMXFP4>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let t = vld1q_s8(KVALUES_MXFP4.as_ptr());
    let mut acc = vdupq_n_f32(0.0);
    // The rows' running sums, and their reduction after the previous block.
    let mut run = [vdupq_n_s32(0); R];
    let mut before = vdupq_n_s32(0);
    by_twos(nb, |b| {
        let yb = a.get_unchecked(b);
        let (y0, y1) = (ld_s8(yb.qs.as_ptr().cast()), ld_s8(yb.qs.as_ptr().add(16).cast()));
        let xb: [&BlockMXFP4; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        for r in 0..R {
            let w = lookup(t, xb[r].qs.as_ptr());
            run[r] = dot16::<D>(dot16::<D>(run[r], w[0], y0), w[1], y1);
        }
        // Lane r: row r's sum over the blocks so far; minus the last: this block's.
        let total = lane_sums4(&run);
        let sumi = vsubq_s32(total, before);
        before = total;
        let d = vmulq_n_f32(e8m0_half4([xb[0].e, xb[1].e, xb[2].e, xb[3].e]), yb.d);
        acc = vaddq_f32(acc, vmulq_f32(d, vcvtq_f32_s32(sumi)));
    });
    let mut out = [0.0f32; R];
    vst1q_f32(out.as_mut_ptr(), acc);
    out
}

/// Four E8M0 exponents as the halved scales `2^(e - 128)` of
/// [`e8m0_to_f32_half`], one lane each: `(e - 1) << 23` as f32 bits, the
/// subnormals `0x0020_0000 << e` where `e < 2`.
#[inline(always)]
unsafe fn e8m0_half4(e: [u8; 4]) -> float32x4_t {
    let e = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(u32::from_le_bytes(e) as u64))));
    let one = vdupq_n_u32(1);
    let normal = vshlq_n_u32::<23>(vsubq_u32(e, one));
    let subnormal = vshlq_u32(vdupq_n_u32(0x0020_0000), vreinterpretq_s32_u32(e));
    let small = vcleq_u32(e, one);
    vreinterpretq_f32_u32(vbslq_u32(small, subnormal, normal))
}

// ---- super-blocks of 256, Q8_K activations ---------------------------------

/// Super-blocks of eight groups of 32 weights: `scales(xb)` gives the eight
/// integer group scales (group `g` in lane `g % 4` of register `g / 4`),
/// `group(xb, g)` unpacks group `g` into signed int8 lanes once for all `N`
/// activation rows; `d(xb)` is the super-block scale.
#[inline(always)]
unsafe fn dot_groups<B, G: Fn(&B, usize) -> [int8x16_t; 2], const D: bool, const N: usize>(
    x: &[B],
    a: [&[BlockQ8K]; N],
    d: impl Fn(&B) -> f32,
    scales: impl Fn(&B) -> [int32x4_t; 2],
    group: G,
) -> [f32; N] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc = [vdupq_n_f32(0.0); N];
    for (i, xb) in x.iter().enumerate() {
        let sc = scales(xb).map(|v| opaque(v));
        let y: [*const i8; N] = std::array::from_fn(|n| a[n].get_unchecked(i).qs.as_ptr());
        let mut isum = [vdupq_n_s32(0); N];
        // The eight groups written out, so that each one's scale lane is a constant.
        group_step::<B, G, D, N, 0>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 1>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 2>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 3>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 4>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 5>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 6>(&group, xb, &sc, y, &mut isum);
        group_step::<B, G, D, N, 7>(&group, xb, &sc, y, &mut isum);
        let d = d(xb);
        for n in 0..N {
            acc[n] = vfmaq_n_f32(acc[n], vcvtq_f32_s32(isum[n]), d * a[n].get_unchecked(i).d);
        }
    }
    acc.map(|v| vaddvq_f32(v))
}

/// Group `K` of a super-block with `N` activation rows (`y`: their blocks'
/// values), into the integer sums.
#[inline(always)]
unsafe fn group_step<B, G: Fn(&B, usize) -> [int8x16_t; 2], const D: bool, const N: usize, const K: usize>(
    group: &G,
    xb: &B,
    sc: &[int32x4_t; 2],
    y: [*const i8; N],
    isum: &mut [int32x4_t; N],
) {
    let w = group(xb, K);
    for n in 0..N {
        isum[n] = mla_lane(isum[n], dot32::<D>(w, y[n].add(32 * K)), sc[K / 4], K % 4);
    }
}

/// Eight 4-bit scales, two to a byte, as `1 + 2s` (IQ3_S).
#[inline(always)]
unsafe fn odd_nibbles(b: [u8; 4]) -> [int32x4_t; 2] {
    let v = vmovl_u8(nibbles8(b));
    [odd(vmovl_u16(vget_low_u16(v))), odd(vmovl_high_u16(v))]
}

#[inline(always)]
unsafe fn dot_iq4_xs<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let t = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    let scales = |xb: &BlockIQ4XS| {
        // low nibbles | two high bits (group g at bits 2g of scales_h) << 4, minus 32
        let h = vdupq_n_u16(u16::from_le_bytes(xb.scales_h));
        let h = vandq_u16(vshlq_u16(h, vld1q_s16([0, -2, -4, -6, -8, -10, -12, -14].as_ptr())), vdupq_n_u16(3));
        let ls = vorrq_u16(vmovl_u8(nibbles8(xb.scales_l)), vshlq_n_u16::<4>(h));
        let s = vsubq_s16(vreinterpretq_s16_u16(ls), vdupq_n_s16(32));
        [vmovl_s16(vget_low_s16(s)), vmovl_high_s16(s)]
    };
    dot_groups::<BlockIQ4XS, _, D, N>(
        as_blocks(w),
        a,
        |xb| fp16(xb.d),
        scales,
        |xb, g| lookup(t, xb.qs.as_ptr().add(16 * g)),
    )
}

#[inline(always)]
unsafe fn dot_iq3_xxs<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let scales = |xb: &BlockIQ3XXS| {
        let q = vld1q_u8_x2(xb.scales_signs.as_ptr());
        [aux_scales(vreinterpretq_u32_u8(q.0)), aux_scales(vreinterpretq_u32_u8(q.1))]
    };
    let sums = dot_groups::<BlockIQ3XXS, _, D, N>(
        as_blocks(w),
        a,
        |xb| fp16(xb.d),
        scales,
        |xb, g| {
            let aux = word(&xb.scales_signs, 4 * g);
            let (i0, i1) = (word(&xb.grid, 8 * g), word(&xb.grid, 8 * g + 4));
            let [q0, q1] = grid8(std::array::from_fn(|k| {
                let i = if k < 4 { i0 } else { i1 };
                iq3_xxs::GRID[(i >> (8 * (k % 4))) as u8 as usize]
            }));
            let [s0, s1] = ksigns32(aux);
            [vmulq_s8(q0, s0), vmulq_s8(q1, s1)]
        },
    );
    sums.map(|s| 0.25 * s)
}

#[inline(always)]
unsafe fn dot_iq3_s<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let scales = |xb: &BlockIQ3S| odd_nibbles(xb.scales);
    dot_groups::<BlockIQ3S, _, D, N>(
        as_blocks(w),
        a,
        |xb| fp16(xb.d),
        scales,
        |xb, g| {
            let (lo0, lo1, qh) = (word(&xb.qs, 8 * g), word(&xb.qs, 8 * g + 4), xb.qh[g] as u32);
            // 9-bit indices: a byte of qs and bit k of qh
            let [q0, q1] = grid8(std::array::from_fn(|k| {
                let lo = if k < 4 { lo0 } else { lo1 };
                iq3_s::GRID[((lo >> (8 * (k % 4)) & 255) | (qh >> k & 1) << 8) as usize]
            }));
            let [m0, m1] = sign_masks(word(&xb.signs, 4 * g));
            // negated where the mask is 0xFF: (q ^ m) - m
            [vsubq_s8(veorq_s8(q0, m0), m0), vsubq_s8(veorq_s8(q1, m1), m1)]
        },
    )
}
