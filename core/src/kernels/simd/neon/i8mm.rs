//! NEON I8MM (`smmla`) prefill kernels. `smmla` multiplies a 2x8 block of
//! int8 weights (8 values of two weight rows) by a 2x8 block of activations
//! (8 values of two tokens) into all four dot products at once, so each
//! weight register serves two tokens and each activation register two rows.
//!
//! - Q4_0: 2x2 tiles straight on the file's blocks (its 4-bit values cost as
//!   much to unpack as to multiply, so sharing them between two tokens pays
//!   for interleaving the activations: 0.94 -> 0.80 M instructions per prompt
//!   token on qwen3moe-tiny Q4_0, p = 32).
//! - The K-quants (Q2_K..Q6_K): panels of eight weight rows decoded once per
//!   tile (below). 2x2 tiles on the file's blocks were measured and removed:
//!   they cost more than the rows kernels once per token (qwen35moe mid Q4_K_M
//!   101.7 vs 85.5 M at p = 64), since a 2x2 tile cannot share the chained
//!   group scales and block headers that a decoded panel carries once.
//!
//! Results of a 2x2 product are `[w0.a0, w0.a1, w1.a0, w1.a1]`; the integer
//! sums are the same as the rows kernels', only regrouped.

// The kernels index parallel arrays (row pairs', token pairs' accumulators)
// by one counter; iterator chains would hide which lanes meet.
#![allow(clippy::needless_range_loop)]
use super::fp16;
use super::gemm::{block_mins, store_mins, Layout, RowsI16};
use super::legacy::nibbles;
use crate::quant::{as_blocks, BlockQ4_0, BlockQ8K, BlockQ8_0F, F16Bytes};
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

// Prefill panels of eight rows for the K-quants.
//
// `smmla` takes 8 values of two weight rows and 8 values of two tokens and
// adds all four products: per 16 values, a panel of eight rows (four row
// pairs) meets a pair of tokens in 8 `smmla`, where the `sdot` panels
// (`gemm.rs`) spend 16 `sdot` on the same products. The weights are decoded
// once per tile into pairs of rows (`[row 2p values 8k..8k + 8, row 2p + 1
// the same]`); the tokens are paired per call (two `zip` per pair and 16
// values, against the 8 `smmla` they feed). The scales follow the `sdot`
// panels (chain steps per group, summed by parts), stored per row pair as
// `[s_2p, s_2p, s_2p+1, s_2p+1]` to match the accumulators'
// `[r0.t0, r0.t1, r1.t0, r1.t1]`; at the end of a block the accumulators are
// unzipped to four rows per token and take the `sdot` panels' f32 tail. The
// integer sums are the scalar twin's; only the order of the f32 sums differs.

/// Bytes of the values of one decoded block of eight rows (16 groups x 128).
const MM_VALUES: usize = 2048;
/// Bytes of the chain steps: 16 groups x 4 row pairs x 4 lanes of i32.
const MM_STEPS: usize = 1024;
/// Bytes of the minimums: two quads' (16 groups x 4 rows of i16 each).
const MM_MINS: usize = 256;
/// One decoded block of eight rows: values, steps, minimums, `d`, `dmin`.
const MM_BLOCK_BYTES: usize = MM_VALUES + MM_STEPS + MM_MINS + 64;

/// Rows `4h..4h + 4` of an eight-row panel block under construction.
pub(crate) struct MmHalf {
    out: *mut u8,
    h: usize,
}

impl Layout for MmHalf {
    const ROWS: usize = 8;
    const BLOCK_BYTES: usize = MM_BLOCK_BYTES;

    fn at(out: *mut u8, h: usize) -> MmHalf {
        MmHalf { out, h }
    }

    /// Row pairs `2h`, `2h + 1`: their 8-byte halves interleaved.
    #[inline(always)]
    unsafe fn values(&self, g: usize, w: [int8x16_t; 4]) {
        let q = |v: int8x16_t| vreinterpretq_s64_s8(v);
        for i in 0..2 {
            let (a, b) = (q(w[2 * i]), q(w[2 * i + 1]));
            let p = self.out.add(128 * g + 32 * (2 * self.h + i)).cast::<i64>();
            vst1q_s64(p, vzip1q_s64(a, b));
            vst1q_s64(p.add(2), vzip2q_s64(a, b));
        }
    }

    /// `[s0, s0, s1, s1]` for row pair `2h`, `[s2, s2, s3, s3]` for `2h + 1`.
    #[inline(always)]
    unsafe fn step(&self, g: usize, s: int32x4_t) {
        let p = self.out.add(MM_VALUES + 64 * g + 32 * self.h).cast::<i32>();
        vst1q_s32(p, vzip1q_s32(s, s));
        vst1q_s32(p.add(4), vzip2q_s32(s, s));
    }

    #[inline(always)]
    unsafe fn mins(&self, m: &RowsI16, n: usize) {
        store_mins(self.out.add(MM_VALUES + MM_STEPS + 128 * self.h).cast(), m, n);
    }

    #[inline(always)]
    unsafe fn scales(&self, d: [F16Bytes; 4], dmin: [F16Bytes; 4]) {
        let p = self.out.add(MM_VALUES + MM_STEPS + MM_MINS).cast::<f32>();
        for r in 0..4 {
            p.add(4 * self.h + r).write_unaligned(fp16(d[r]));
            p.add(8 + 4 * self.h + r).write_unaligned(fp16(dmin[r]));
        }
    }
}

/// `T` tokens (`a[..T]`; the rest repeat the last) against one decoded
/// eight-row panel, in `P` pairs: row `r` with token `t` to
/// `out[t * stride + r]`. `G` groups carry a scale (16, or 8 of 32 values
/// each); `M` groups a minimum (0: none).
#[inline(always)]
unsafe fn mm_dot<const T: usize, const P: usize, const G: usize, const M: usize>(
    dec: &[u8],
    a: [&[BlockQ8K]; 4],
    out: *mut f32,
    stride: usize,
) {
    let nb = a[0].len();
    assert!(a.iter().all(|x| x.len() == nb) && dec.len() >= nb * MM_BLOCK_BYTES, "mm_dot: lengths differ");
    // acc[t][h]: token t, rows 4h..4h + 4.
    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * MM_BLOCK_BYTES);
        let y: [&BlockQ8K; 4] = std::array::from_fn(|t| a[t].get_unchecked(b));
        // c[pair of rows][pair of tokens]: running sums; r: scaled by parts.
        let mut c = [[vdupq_n_s32(0); P]; 4];
        let mut r = [[vdupq_n_s32(0); P]; 4];
        // Written out, so that every offset is a constant (see `gemm.rs`).
        macro_rules! groups {
            ($($g:literal)*) => {$(
                mm_group::<P, G>($g, p, &y, &mut c, &mut r);
            )*};
        }
        groups!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        let f = p.add(MM_VALUES + MM_STEPS + MM_MINS).cast::<f32>();
        for h in 0..2 {
            let (d, dmin) = (vld1q_f32(f.add(4 * h)), vld1q_f32(f.add(8 + 4 * h)));
            for q in 0..P {
                // `[r0.t0, r0.t1, r1.t0, r1.t1]` of two row pairs -> four rows per token.
                let (lo, hi) = (r[2 * h][q], r[2 * h + 1][q]);
                let rows = [vuzp1q_s32(lo, hi), vuzp2q_s32(lo, hi)];
                for k in 0..2 {
                    let t = 2 * q + k;
                    if t < T {
                        acc[t][h] = vfmaq_f32(acc[t][h], vcvtq_f32_s32(rows[k]), vmulq_n_f32(d, y[t].d));
                    }
                }
            }
            if M > 0 {
                let mp = p.add(MM_VALUES + MM_STEPS + 128 * h).cast::<i16>();
                for t in 0..T {
                    let m = block_mins::<M>(mp, y[t]);
                    acc[t][h] = vfmsq_f32(acc[t][h], vcvtq_f32_s32(m), vmulq_n_f32(dmin, y[t].d));
                }
            }
        }
    }
    for t in 0..T {
        vst1q_f32(out.add(stride * t), acc[t][0]);
        vst1q_f32(out.add(stride * t + 4), acc[t][1]);
    }
}

/// Group `g` (16 values) of the decoded panel block at `p` against `P`
/// pairs of tokens: the pair's values interleaved by 8 bytes, then two
/// `smmla` per row pair into `c`; at the end of a scale group, its chain
/// step into `r`.
#[inline(always)]
unsafe fn mm_group<const P: usize, const G: usize>(
    g: usize,
    p: *const u8,
    y: &[&BlockQ8K; 4],
    c: &mut [[int32x4_t; P]; 4],
    r: &mut [[int32x4_t; P]; 4],
) {
    let s64 = |v: int8x16_t| vreinterpretq_s64_s8(v);
    let s8 = |v: int64x2_t| vreinterpretq_s8_s64(v);
    let x: [[int8x16_t; 2]; P] = std::array::from_fn(|q| {
        let x0 = s64(vld1q_s8(y[2 * q].qs.as_ptr().add(16 * g)));
        let x1 = s64(vld1q_s8(y[2 * q + 1].qs.as_ptr().add(16 * g)));
        [s8(vzip1q_s64(x0, x1)), s8(vzip2q_s64(x0, x1))]
    });
    for pr in 0..4 {
        let w = p.add(128 * g + 32 * pr).cast::<i8>();
        let (w0, w1) = (vld1q_s8(w), vld1q_s8(w.add(16)));
        for q in 0..P {
            c[pr][q] = smmla(c[pr][q], w0, x[q][0]);
            c[pr][q] = smmla(c[pr][q], w1, x[q][1]);
        }
    }
    if (g + 1).is_multiple_of(16 / G) {
        let s = p.add(MM_VALUES).cast::<i32>().add(16 * (g / (16 / G)));
        for pr in 0..4 {
            let step = vld1q_s32(s.add(4 * pr));
            for q in 0..P {
                r[pr][q] = vmlaq_s32(r[pr][q], c[pr][q], step);
            }
        }
    }
}

/// The eight-row panel kernels of one format: up to four tokens per call.
macro_rules! mm_kernels {
    ($($name:ident = $g:literal, $m:literal;)*) => {
        $(
            #[target_feature(enable = "neon,dotprod,i8mm")]
            pub(crate) unsafe fn $name(dec: &[u8], a: &[&[BlockQ8K]], out: *mut f32, stride: usize) {
                match a.len() {
                    1 => mm_dot::<1, 1, $g, $m>(dec, [a[0]; 4], out, stride),
                    2 => mm_dot::<2, 1, $g, $m>(dec, [a[0], a[1], a[1], a[1]], out, stride),
                    3 => mm_dot::<3, 2, $g, $m>(dec, [a[0], a[1], a[2], a[2]], out, stride),
                    _ => mm_dot::<4, 2, $g, $m>(dec, [a[0], a[1], a[2], a[3]], out, stride),
                }
            }
        )*
    };
}

mm_kernels! {
    q2_k = 16, 16;
    q3_k = 16, 0;
    q4_k = 8, 8;
    q5_k = 8, 8;
    q6_k = 16, 0;
}
