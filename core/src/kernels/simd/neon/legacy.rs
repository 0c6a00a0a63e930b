//! NEON dot products of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
//! with Q8_0 / Q8_1 activations: a block is two 16-byte registers; the
//! per-block scale multiplies a 4-lane f32 accumulator (Q8_0: each row's
//! whole integer sum of a block, four rows to a register, in every kernel).

use super::{by_twos, dot16, exact_paths, fp16, fp16x4, fp16x4_packed, ld_s8, paths};
use crate::quant::q8_0_x4::BlockQ8_0x4;
use crate::quant::{
    as_blocks, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_0F, BlockQ8_1F, F16Bytes,
};
use std::arch::aarch64::*;

paths! {
    q4_0, q4_0_rows = dot_q4_0(BlockQ8_0F);
    q4_1, q4_1_rows = dot_q4_1(BlockQ8_1F);
    q5_0, q5_0_rows = dot_q5_0(BlockQ8_0F);
    q5_1, q5_1_rows = dot_q5_1(BlockQ8_1F);
    q8_0, q8_0_rows = dot_q8_0(BlockQ8_0F) / dotn_q8_0 * 4;
}

exact_paths! {
    q4_0 = exact_q4_0(BlockQ8_0F);
    q4_1 = exact_q4_1(BlockQ8_1F);
    q5_0 = exact_q5_0(BlockQ8_0F);
    q5_1 = exact_q5_1(BlockQ8_1F);
    q8_0 = exact_q8_0(BlockQ8_0F) / exactn_q8_0 * 4;
}

/// 16 bytes of nibbles -> (low nibbles: values 0..16, high nibbles: values 16..32).
#[inline(always)]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(qs.as_ptr());
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

/// The fifth bits of a Q5 block as byte masks (0xFF where set): values 0..16, 16..32.
#[inline(always)]
unsafe fn fifth_bits(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let src = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
    // Byte i takes source byte i/8 and tests its bit i%8.
    let pick_lo = vcombine_u8(vdup_n_u8(0), vdup_n_u8(1));
    let pick_hi = vcombine_u8(vdup_n_u8(2), vdup_n_u8(3));
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    (vtstq_u8(vqtbl1q_u8(src, pick_lo), bit), vtstq_u8(vqtbl1q_u8(src, pick_hi), bit))
}

/// Dot product of two 16-byte halves of a block with 32 activations.
#[inline(always)]
unsafe fn block_dot<const D: bool>(lo: int8x16_t, hi: int8x16_t, y: &[i8; 32]) -> int32x4_t {
    let p = dot16::<D>(vdupq_n_s32(0), lo, ld_s8(y.as_ptr().cast()));
    dot16::<D>(p, hi, ld_s8(y.as_ptr().add(16).cast()))
}

/// Shared loop of the formats with one scale per block and Q8_0 activations:
/// `signed(block)` yields the two halves of the block as signed values.
#[inline(always)]
unsafe fn dot_signed<B, const D: bool>(
    x: &[B],
    a: &[BlockQ8_0F],
    scale: impl Fn(&B) -> F16Bytes,
    signed: impl Fn(&B) -> (int8x16_t, int8x16_t),
) -> f32 {
    debug_assert_eq!(x.len(), a.len());
    let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut pairs = x.chunks_exact(2).zip(a.chunks_exact(2));
    for (xp, yp) in &mut pairs {
        let (l0, h0) = signed(&xp[0]);
        let (l1, h1) = signed(&xp[1]);
        let p0 = block_dot::<D>(l0, h0, &yp[0].qs);
        let p1 = block_dot::<D>(l1, h1, &yp[1].qs);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(p0), fp16(scale(&xp[0])) * yp[0].d);
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(p1), fp16(scale(&xp[1])) * yp[1].d);
    }
    if x.len() % 2 == 1 {
        let (xb, yb) = (&x[x.len() - 1], &a[a.len() - 1]);
        let (l, h) = signed(xb);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(block_dot::<D>(l, h, &yb.qs)), fp16(scale(xb)) * yb.d);
    }
    vaddvq_f32(vaddq_f32(acc0, acc1))
}

/// Four Q8_0 weight rows with one activation row: each block's 32
/// activations are loaded once for the four rows, and the four rows' scales
/// by lane loads into one register, multiplied by the activations' scale
/// together. A block's four partial sums per row are added pairwise into one
/// register, lane r row r's whole integer sum ([`lane_sums`]), which one fused
/// multiply-add by the scales adds to the rows' accumulator, blocks in
/// order: the arithmetic of [`exact_q8_0`] and of the interleaved rows'
/// [`dot_q8_0_x4`], so that a row's bits do not depend on the kernel.
#[inline(always)]
unsafe fn dotn_q8_0<const D: bool, const R: usize>(rows: [&[u8]; R], a: &[BlockQ8_0F]) -> [f32; R] {
    const { assert!(R == 4, "the Q8_0 body takes four rows") };
    let x = rows.map(as_blocks::<BlockQ8_0>);
    debug_assert!(x.iter().all(|r| r.len() == a.len()));
    // Every row holds at least `nb` blocks: the unchecked reads below stay in bounds.
    let nb = x.iter().fold(a.len(), |n, r| n.min(r.len()));
    let mut acc = vdupq_n_f32(0.0);
    by_twos(nb, |b| {
        let yb = a.get_unchecked(b);
        let (y0, y1) = (ld_s8(yb.qs.as_ptr().cast()), ld_s8(yb.qs.as_ptr().add(16).cast()));
        let xb: [&BlockQ8_0; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        // Lane r: row r's scale times the activations'.
        let d = vmulq_n_f32(fp16x4(std::array::from_fn(|r| xb[r].d.0.as_ptr())), yb.d);
        let p: [int32x4_t; 4] = std::array::from_fn(|r| {
            let q = xb[r].qs.as_ptr();
            dot16::<D>(dot16::<D>(vdupq_n_s32(0), ld_s8(q.cast()), y0), ld_s8(q.add(16).cast()), y1)
        });
        acc = vfmaq_f32(acc, vcvtq_f32_s32(lane_sums(p)), d);
    });
    let mut out = [0.0f32; R];
    vst1q_f32(out.as_mut_ptr(), acc);
    out
}

/// Four registers' lanes summed, lane r register r's (pairwise adds: the
/// integer sums are exact whatever the order).
#[inline(always)]
unsafe fn lane_sums(p: [int32x4_t; 4]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]))
}

/// One Q8_0 row by [`dotn_q8_0`]'s arithmetic (one fused chain, blocks in
/// order), so that a row of the rows kernel's groups of four and a row of
/// the rest give the same bits (a head over the first tokens of the
/// vocabulary gives them as the whole head does).
#[inline(always)]
unsafe fn dot_q8_0<const D: bool>(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    exact_q8_0::<D, 1>(w, [a])[0]
}

#[inline(always)]
unsafe fn dot_q4_0<const D: bool>(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    dot_signed::<BlockQ4_0, D>(as_blocks(w), a, |b| b.d, |b| q4_0_signed(b))
}

/// A Q4_0 block's values (nibble - 8) as two signed registers.
#[inline(always)]
unsafe fn q4_0_signed(b: &BlockQ4_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(&b.qs);
    let eight = vdupq_n_s8(8);
    (vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight))
}

#[inline(always)]
unsafe fn dot_q5_0<const D: bool>(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    dot_signed::<BlockQ5_0, D>(as_blocks(w), a, |b| b.d, |b| q5_0_signed(b))
}

/// A Q5_0 block's values (q - 16: the nibble where the fifth bit is set,
/// nibble | 0xF0, i.e. nibble - 16, where clear) as two signed registers.
#[inline(always)]
unsafe fn q5_0_signed(b: &BlockQ5_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(&b.qs);
    let (mlo, mhi) = fifth_bits(b.qh);
    let f0 = vdupq_n_u8(0xF0);
    (vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(f0, mlo))), vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(f0, mhi))))
}

/// Shared loop of the formats with a scale and a minimum per block (Q8_1
/// activations): `unsigned(block)` yields the two halves (values below 32).
#[inline(always)]
unsafe fn dot_unsigned<B, const D: bool>(
    x: &[B],
    a: &[BlockQ8_1F],
    dm: impl Fn(&B) -> (F16Bytes, F16Bytes),
    unsigned: impl Fn(&B) -> (uint8x16_t, uint8x16_t),
) -> f32 {
    debug_assert_eq!(x.len(), a.len());
    let mut acc = vdupq_n_f32(0.0);
    let mut acc_m = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let (d, m) = dm(xb);
        let (lo, hi) = unsigned(xb);
        let p = block_dot::<D>(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), &yb.qs);
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), fp16(d) * yb.d);
        // The minimum meets the activation sum, precomputed in the Q8_1 block.
        acc_m += fp16(m) * yb.s;
    }
    vaddvq_f32(acc) + acc_m
}

#[inline(always)]
unsafe fn dot_q4_1<const D: bool>(w: &[u8], a: &[BlockQ8_1F]) -> f32 {
    dot_unsigned::<BlockQ4_1, D>(as_blocks(w), a, |b| (b.d, b.m), |b| nibbles(&b.qs))
}

#[inline(always)]
unsafe fn dot_q5_1<const D: bool>(w: &[u8], a: &[BlockQ8_1F]) -> f32 {
    dot_unsigned::<BlockQ5_1, D>(as_blocks(w), a, |b| (b.d, b.m), |b| q5_1_unsigned(b))
}

/// A Q5_1 block's values (nibble + 16 * fifth bit) as two unsigned registers.
#[inline(always)]
unsafe fn q5_1_unsigned(b: &BlockQ5_1) -> (uint8x16_t, uint8x16_t) {
    let (lo, hi) = nibbles(&b.qs);
    let (mlo, mhi) = fifth_bits(b.qh);
    let s = vdupq_n_u8(0x10);
    (vorrq_u8(lo, vandq_u8(mlo, s)), vorrq_u8(hi, vandq_u8(mhi, s)))
}

// ---- exact kernels: N activation rows per pass over the weights --------------
//
// Each body below computes, for every activation row, the float operations of
// the decode body it names in the same order (see `table::Exact`): only the
// unpacking of the weights and the integer dot products are shared.

/// [`dot_signed`] with `N` activation rows.
#[inline(always)]
unsafe fn exact_signed<B, const D: bool, const N: usize>(
    x: &[B],
    a: [&[BlockQ8_0F]; N],
    scale: impl Fn(&B) -> F16Bytes,
    signed: impl Fn(&B) -> (int8x16_t, int8x16_t),
) -> [f32; N] {
    debug_assert!(a.iter().all(|a| a.len() == x.len()));
    // Every activation row holds at least `nb` blocks: the unchecked reads stay in bounds.
    let nb = a.iter().fold(x.len(), |n, a| n.min(a.len()));
    let (mut acc0, mut acc1) = ([vdupq_n_f32(0.0); N], [vdupq_n_f32(0.0); N]);
    let mut b = 0;
    while b + 2 <= nb {
        let (x0, x1) = (x.get_unchecked(b), x.get_unchecked(b + 1));
        let ((l0, h0), (l1, h1)) = (signed(x0), signed(x1));
        let (s0, s1) = (fp16(scale(x0)), fp16(scale(x1)));
        for t in 0..N {
            let (y0, y1) = (a[t].get_unchecked(b), a[t].get_unchecked(b + 1));
            let p0 = block_dot::<D>(l0, h0, &y0.qs);
            let p1 = block_dot::<D>(l1, h1, &y1.qs);
            acc0[t] = vmlaq_n_f32(acc0[t], vcvtq_f32_s32(p0), s0 * y0.d);
            acc1[t] = vmlaq_n_f32(acc1[t], vcvtq_f32_s32(p1), s1 * y1.d);
        }
        b += 2;
    }
    if b < nb {
        let xb = x.get_unchecked(b);
        let (l, h) = signed(xb);
        let s = fp16(scale(xb));
        for t in 0..N {
            let yb = a[t].get_unchecked(b);
            acc0[t] = vmlaq_n_f32(acc0[t], vcvtq_f32_s32(block_dot::<D>(l, h, &yb.qs)), s * yb.d);
        }
    }
    std::array::from_fn(|t| vaddvq_f32(vaddq_f32(acc0[t], acc1[t])))
}

/// [`dot_unsigned`] with `N` activation rows.
#[inline(always)]
unsafe fn exact_unsigned<B, const D: bool, const N: usize>(
    x: &[B],
    a: [&[BlockQ8_1F]; N],
    dm: impl Fn(&B) -> (F16Bytes, F16Bytes),
    unsigned: impl Fn(&B) -> (uint8x16_t, uint8x16_t),
) -> [f32; N] {
    debug_assert!(a.iter().all(|a| a.len() == x.len()));
    let nb = a.iter().fold(x.len(), |n, a| n.min(a.len()));
    let mut acc = [vdupq_n_f32(0.0); N];
    let mut acc_m = [0.0f32; N];
    for b in 0..nb {
        let xb = x.get_unchecked(b);
        let (d, m) = dm(xb);
        let (d, m) = (fp16(d), fp16(m));
        let (lo, hi) = unsigned(xb);
        let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
        for t in 0..N {
            let yb = a[t].get_unchecked(b);
            acc[t] = vmlaq_n_f32(acc[t], vcvtq_f32_s32(block_dot::<D>(lo, hi, &yb.qs)), d * yb.d);
            acc_m[t] += m * yb.s;
        }
    }
    std::array::from_fn(|t| vaddvq_f32(acc[t]) + acc_m[t])
}

/// [`dotn_q8_0`] with `N` activation rows: each weight register serves every
/// activation row.
#[inline(always)]
unsafe fn exactn_q8_0<const D: bool, const R: usize, const N: usize>(
    rows: [&[u8]; R],
    a: [&[BlockQ8_0F]; N],
) -> [[f32; R]; N] {
    const { assert!(R == 4, "the Q8_0 body takes four rows") };
    let x = rows.map(as_blocks::<BlockQ8_0>);
    let nb = x.iter().fold(a.iter().fold(usize::MAX, |n, a| n.min(a.len())), |n, r| n.min(r.len()));
    let mut acc = [vdupq_n_f32(0.0); N];
    for b in 0..nb {
        let xb: [&BlockQ8_0; R] = std::array::from_fn(|r| x[r].get_unchecked(b));
        let ws = fp16x4(std::array::from_fn(|r| xb[r].d.0.as_ptr()));
        let yb: [&BlockQ8_0F; N] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let w: [(int8x16_t, int8x16_t); R] = std::array::from_fn(|r| {
            let q = xb[r].qs.as_ptr();
            (ld_s8(q.cast()), ld_s8(q.add(16).cast()))
        });
        for t in 0..N {
            let d = vmulq_n_f32(ws, yb[t].d);
            let (y0, y1) = (ld_s8(yb[t].qs.as_ptr().cast()), ld_s8(yb[t].qs.as_ptr().add(16).cast()));
            let p: [int32x4_t; 4] =
                std::array::from_fn(|r| dot16::<D>(dot16::<D>(vdupq_n_s32(0), w[r].0, y0), w[r].1, y1));
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(lane_sums(p)), d);
        }
    }
    acc.map(|v| {
        let mut out = [0.0f32; R];
        vst1q_f32(out.as_mut_ptr(), v);
        out
    })
}

/// [`dot_q8_0`] with `N` activation rows: each row's chain as alone, and as
/// [`exactn_q8_0`] forms it (a block's whole integer sum, then one fused
/// multiply-add by the two scales' product, blocks in order).
#[inline(always)]
unsafe fn exact_q8_0<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    let x = as_blocks::<BlockQ8_0>(w);
    debug_assert!(a.iter().all(|a| a.len() == x.len()));
    // Every activation row holds at least `nb` blocks: the unchecked reads stay in bounds.
    let nb = a.iter().fold(x.len(), |n, a| n.min(a.len()));
    let mut acc = [0.0f32; N];
    for b in 0..nb {
        let xb = x.get_unchecked(b);
        let s = fp16(xb.d);
        let q = xb.qs.as_ptr();
        let (w0, w1) = (ld_s8(q.cast()), ld_s8(q.add(16).cast()));
        for t in 0..N {
            let yb = a[t].get_unchecked(b);
            let (y0, y1) = (ld_s8(yb.qs.as_ptr().cast()), ld_s8(yb.qs.as_ptr().add(16).cast()));
            let p = dot16::<D>(dot16::<D>(vdupq_n_s32(0), w0, y0), w1, y1);
            acc[t] = (vaddvq_s32(p) as f32).mul_add(s * yb.d, acc[t]);
        }
    }
    acc
}

#[inline(always)]
unsafe fn exact_q4_0<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    exact_signed::<BlockQ4_0, D, N>(as_blocks(w), a, |b| b.d, |b| q4_0_signed(b))
}

#[inline(always)]
unsafe fn exact_q5_0<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    exact_signed::<BlockQ5_0, D, N>(as_blocks(w), a, |b| b.d, |b| q5_0_signed(b))
}

#[inline(always)]
unsafe fn exact_q4_1<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    exact_unsigned::<BlockQ4_1, D, N>(as_blocks(w), a, |b| (b.d, b.m), |b| nibbles(&b.qs))
}

#[inline(always)]
unsafe fn exact_q5_1<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    exact_unsigned::<BlockQ5_1, D, N>(as_blocks(w), a, |b| (b.d, b.m), |b| q5_1_unsigned(b))
}

/// The integer sums of two consecutive blocks of four interleaved Q8_0 rows
/// ([`crate::quant::q8_0_x4`]: `q`, the first one's values) against their
/// 32 activations each (`y0`, `y1`), one lane per row: eight `sdot` by
/// element a block, the two blocks' chains side by side (the second
/// block's values 72 bytes past the first's last: its 8-byte header).
#[inline(always)]
unsafe fn q8_0_x4_core2(q: *const i8, y0: *const i8, y1: *const i8) -> (int32x4_t, int32x4_t) {
    let (r0, r1): (int32x4_t, int32x4_t);
    std::arch::asm!(
        "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{q}], #64",
        "ld1 {{v20.16b, v21.16b, v22.16b, v23.16b}}, [{q}], {skip}",
        "ld1 {{v24.16b, v25.16b, v26.16b, v27.16b}}, [{q}], #64",
        "ld1 {{v28.16b, v29.16b, v30.16b, v31.16b}}, [{q}]",
        "ldp {a0:q}, {a1:q}, [{y0}]",
        "ldp {a2:q}, {a3:q}, [{y1}]",
        "movi {c0:v}.4s, #0",
        "movi {c1:v}.4s, #0",
        "sdot {c0:v}.4s, v16.16b, {a0:v}.4b[0]",
        "sdot {c1:v}.4s, v24.16b, {a2:v}.4b[0]",
        "sdot {c0:v}.4s, v17.16b, {a0:v}.4b[1]",
        "sdot {c1:v}.4s, v25.16b, {a2:v}.4b[1]",
        "sdot {c0:v}.4s, v18.16b, {a0:v}.4b[2]",
        "sdot {c1:v}.4s, v26.16b, {a2:v}.4b[2]",
        "sdot {c0:v}.4s, v19.16b, {a0:v}.4b[3]",
        "sdot {c1:v}.4s, v27.16b, {a2:v}.4b[3]",
        "sdot {c0:v}.4s, v20.16b, {a1:v}.4b[0]",
        "sdot {c1:v}.4s, v28.16b, {a3:v}.4b[0]",
        "sdot {c0:v}.4s, v21.16b, {a1:v}.4b[1]",
        "sdot {c1:v}.4s, v29.16b, {a3:v}.4b[1]",
        "sdot {c0:v}.4s, v22.16b, {a1:v}.4b[2]",
        "sdot {c1:v}.4s, v30.16b, {a3:v}.4b[2]",
        "sdot {c0:v}.4s, v23.16b, {a1:v}.4b[3]",
        "sdot {c1:v}.4s, v31.16b, {a3:v}.4b[3]",
        q = inout(reg) q => _, y0 = in(reg) y0, y1 = in(reg) y1, skip = in(reg) 72usize,
        c0 = out(vreg) r0, c1 = out(vreg) r1,
        a0 = out(vreg) _, a1 = out(vreg) _, a2 = out(vreg) _, a3 = out(vreg) _,
        out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _,
        out("v24") _, out("v25") _, out("v26") _, out("v27") _, out("v28") _, out("v29") _, out("v30") _, out("v31") _,
        options(pure, readonly, nostack)
    );
    (r0, r1)
}

/// [`q8_0_x4_core2`] for one block (the last of an odd count): the same
/// integers.
#[inline(always)]
unsafe fn q8_0_x4_core(q: *const i8, y: *const i8) -> int32x4_t {
    let r: int32x4_t;
    std::arch::asm!(
        "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{q}], #64",
        "ld1 {{v20.16b, v21.16b, v22.16b, v23.16b}}, [{q}]",
        "ldp {a0:q}, {a1:q}, [{y}]",
        "movi {c0:v}.4s, #0",
        "movi {c1:v}.4s, #0",
        "sdot {c0:v}.4s, v16.16b, {a0:v}.4b[0]",
        "sdot {c1:v}.4s, v17.16b, {a0:v}.4b[1]",
        "sdot {c0:v}.4s, v18.16b, {a0:v}.4b[2]",
        "sdot {c1:v}.4s, v19.16b, {a0:v}.4b[3]",
        "sdot {c0:v}.4s, v20.16b, {a1:v}.4b[0]",
        "sdot {c1:v}.4s, v21.16b, {a1:v}.4b[1]",
        "sdot {c0:v}.4s, v22.16b, {a1:v}.4b[2]",
        "sdot {c1:v}.4s, v23.16b, {a1:v}.4b[3]",
        "add {c0:v}.4s, {c0:v}.4s, {c1:v}.4s",
        q = inout(reg) q => _, y = in(reg) y,
        c0 = out(vreg) r, c1 = out(vreg) _, a0 = out(vreg) _, a1 = out(vreg) _,
        out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _,
        options(pure, readonly, nostack)
    );
    r
}

/// Four interleaved Q8_0 rows ([`crate::quant::q8_0_x4`]: `w` holds their
/// blocks) with one activation row: per block, each row's integer sum
/// scaled by `d * y.d` in one multiply-add, blocks in order (two at a time
/// through the integer core).
#[inline(always)]
unsafe fn dot_q8_0_x4(w: &[u8], a: &[BlockQ8_0F]) -> [f32; 4] {
    let x = as_blocks::<BlockQ8_0x4>(w);
    debug_assert_eq!(x.len(), a.len());
    let nb = x.len().min(a.len());
    let mut acc = vdupq_n_f32(0.0);
    let scale = |xb: &BlockQ8_0x4, yb: &BlockQ8_0F| vmulq_n_f32(fp16x4_packed(&xb.d), yb.d);
    let mut b = 0;
    while b + 2 <= nb {
        let (x0, x1) = (x.get_unchecked(b), x.get_unchecked(b + 1));
        let (y0, y1) = (a.get_unchecked(b), a.get_unchecked(b + 1));
        let (i0, i1) = q8_0_x4_core2(x0.qs.as_ptr(), y0.qs.as_ptr(), y1.qs.as_ptr());
        acc = vfmaq_f32(acc, vcvtq_f32_s32(i0), scale(x0, y0));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(i1), scale(x1, y1));
        b += 2;
    }
    if b < nb {
        let (xb, yb) = (x.get_unchecked(b), a.get_unchecked(b));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(q8_0_x4_core(xb.qs.as_ptr(), yb.qs.as_ptr())), scale(xb, yb));
    }
    let mut out = [0.0f32; 4];
    vst1q_f32(out.as_mut_ptr(), acc);
    out
}

/// [`dot_q8_0_x4`] on the dot-product path, over consecutive groups of four
/// interleaved rows (`group_bytes` each) into `out` (four a group).
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn q8_0_x4(w: &[u8], group_bytes: usize, a: &[BlockQ8_0F], out: &mut [f32]) {
    for (g, o) in w.chunks_exact(group_bytes).zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&dot_q8_0_x4(g, a));
    }
}
