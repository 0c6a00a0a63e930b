//! Prefill as a GEMM for the K-quants (Q2_K..Q6_K) on NEON with `sdot`.
//!
//! The rows kernels unpack every weight block once per token; over a prompt
//! that is most of their work. Here the weight rows of a tile are decoded
//! once, four rows at a time, into a layout that the `sdot`-by-element form
//! multiplies directly, and every token of the tile reuses it:
//!
//! - values: for each group of 16 values of the block, four registers; register
//!   `j` holds values `4j..4j + 4` of rows 0, 1, 2, 3 (a 4x4 transpose of 32-bit
//!   words), so `sdot acc.4s, w_j.16b, a.4b[j]` adds to lane `r` row `r`'s
//!   products with the token's values `4j..4j + 4`: four instructions per 16
//!   values serve four rows, and the 16 activations are one plain load;
//! - offsets removed (Q3_K: -4..3, Q6_K: -32..31), so only the formats with
//!   minimums (Q2_K, Q4_K, Q5_K) need the activations' group sums;
//! - group scales as the chain steps `s_g - s_(g+1)` of the rows kernels
//!   (summation by parts: one running `sdot` accumulator through the block and
//!   one `mla` per group, for four rows at once), minimums as i16, both with
//!   the rows in the lanes; `d` and `dmin` as f32 lanes.
//!
//! Per four rows, token and 16 values: four `sdot`, one activation load and a
//! quarter of the group's `mla` and weight loads — against the rows kernels'
//! unpacking, `sdot`, scaling and shared loads per row. The integer sums are
//! the scalar twin's; only the order of the f32 sums over blocks differs.

// The kernels index several parallel arrays (tokens' accumulators, rows' blocks)
// by one counter; iterator chains would hide which lanes meet.
#![allow(clippy::needless_range_loop)]
use super::{fp16, sdot_lane};
use crate::quant::{
    as_blocks, q3_k, scales_mins_k4_words, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, F16Bytes,
};
use std::arch::aarch64::*;

/// Bytes of the values of one decoded block of four rows (16 groups x 64).
const VALUES: usize = 1024;
/// Bytes of the chain steps: at most 16 groups x 4 rows of i32.
const STEPS: usize = 256;
/// Bytes of the minimums: at most 16 groups x 4 rows of i16.
const MINS: usize = 128;
/// One decoded block of four rows: values, steps, minimums, `d`, `dmin`.
const QUAD_BLOCK_BYTES: usize = VALUES + STEPS + MINS + 32;

/// Decode a quad from this many tokens on: below, the rows kernels (which
/// unpack each block per token but decode nothing) cost fewer instructions.
pub(crate) const MIN_ACTS: usize = 4;

/// Group scales (or minimums) of four rows as i16, 8 groups per register:
/// `[row][groups 0..8, 8..16]` (only the first register with 8 groups).
pub(super) type RowsI16 = [[int16x8_t; 2]; 4];

/// `v[r]` (8 groups each) with the rows in the lanes: per group `g`, the
/// four rows' values. Returns the groups in pairs: `[g0 r0..4, g1 r0..4]`,
/// `[g2 .., g3 ..]`, ...
#[inline(always)]
unsafe fn rows_to_lanes(v: [int16x8_t; 4]) -> [int16x8_t; 4] {
    let (ab_lo, ab_hi) = (vzip1q_s16(v[0], v[1]), vzip2q_s16(v[0], v[1]));
    let (cd_lo, cd_hi) = (vzip1q_s16(v[2], v[3]), vzip2q_s16(v[2], v[3]));
    let w = |x: int16x8_t| vreinterpretq_s32_s16(x);
    let h = |x: int32x4_t| vreinterpretq_s16_s32(x);
    [
        h(vzip1q_s32(w(ab_lo), w(cd_lo))),
        h(vzip2q_s32(w(ab_lo), w(cd_lo))),
        h(vzip1q_s32(w(ab_hi), w(cd_hi))),
        h(vzip2q_s32(w(ab_hi), w(cd_hi))),
    ]
}

/// Where a decoder writes four rows of a block: a quad of the `sdot`
/// panels, or half of an eight-row `smmla` panel (`super::i8mm`). The
/// formats' decoders produce values, scales and minimums once; a layout
/// only arranges them.
pub(super) trait Layout: Sized {
    /// Weight rows of a panel (four or eight).
    const ROWS: usize;
    /// Bytes of one decoded block of a panel.
    const BLOCK_BYTES: usize;
    /// The writer of rows `4h..4h + 4` of the decoded block at `out`.
    fn at(out: *mut u8, h: usize) -> Self;
    /// Group `g` (16 values) of the four rows, as signed bytes (`w[r]`: row `r`).
    unsafe fn values(&self, g: usize, w: [int8x16_t; 4]);
    /// The chain step `s_g - s_(g+1)` of scale group `g`, rows in the lanes.
    unsafe fn step(&self, g: usize, s: int32x4_t);
    /// The minimums of `n` (8 or 16) groups, rows in the lanes.
    unsafe fn mins(&self, m: &RowsI16, n: usize);
    unsafe fn scales(&self, d: [F16Bytes; 4], dmin: [F16Bytes; 4]);

    /// The chain steps `s_g - s_(g+1)` (`s_n = 0`) of `n` (8 or 16) groups
    /// from the rows' scales.
    #[inline(always)]
    unsafe fn steps(&self, sc: &RowsI16, n: usize) {
        let z = vdupq_n_s16(0);
        for h in 0..n / 8 {
            let d = [0, 1, 2, 3].map(|r| {
                let next =
                    if n == 16 && h == 0 { vextq_s16::<1>(sc[r][0], sc[r][1]) } else { vextq_s16::<1>(sc[r][h], z) };
                vsubq_s16(sc[r][h], next)
            });
            for (i, g) in rows_to_lanes(d).into_iter().enumerate() {
                self.step(8 * h + 2 * i, vmovl_s16(vget_low_s16(g)));
                self.step(8 * h + 2 * i + 1, vmovl_high_s16(g));
            }
        }
    }
}

/// The minimums of `n` (8 or 16) groups of four rows at `p`: per group, the
/// rows' i16 (what [`mins8`] reads).
#[inline(always)]
pub(super) unsafe fn store_mins(p: *mut i16, m: &RowsI16, n: usize) {
    for h in 0..n / 8 {
        for (i, g) in rows_to_lanes([0, 1, 2, 3].map(|r| m[r][h])).into_iter().enumerate() {
            vst1q_s16(p.add(32 * h + 8 * i), g);
        }
    }
}

/// One decoded quad block under construction.
pub(crate) struct Quad {
    out: *mut u8,
}

impl Layout for Quad {
    const ROWS: usize = 4;
    const BLOCK_BYTES: usize = QUAD_BLOCK_BYTES;

    fn at(out: *mut u8, _h: usize) -> Quad {
        Quad { out }
    }

    /// `st4` interleaves the rows' 32-bit words, which is the layout
    /// (register `j` = word `j` of each row).
    #[inline(always)]
    unsafe fn values(&self, g: usize, w: [int8x16_t; 4]) {
        let u = |v: int8x16_t| vreinterpretq_u32_s8(v);
        vst4q_u32(self.out.add(64 * g).cast(), uint32x4x4_t(u(w[0]), u(w[1]), u(w[2]), u(w[3])));
    }

    #[inline(always)]
    unsafe fn step(&self, g: usize, s: int32x4_t) {
        vst1q_s32(self.out.add(VALUES).cast::<i32>().add(4 * g), s);
    }

    #[inline(always)]
    unsafe fn mins(&self, m: &RowsI16, n: usize) {
        store_mins(self.out.add(VALUES + STEPS).cast(), m, n);
    }

    #[inline(always)]
    unsafe fn scales(&self, d: [F16Bytes; 4], dmin: [F16Bytes; 4]) {
        let p = self.out.add(VALUES + STEPS + MINS).cast::<f32>();
        for r in 0..4 {
            p.add(r).write_unaligned(fp16(d[r]));
            p.add(4 + r).write_unaligned(fp16(dmin[r]));
        }
    }
}

/// 8 unsigned bytes (a little-endian word) as i16 lanes.
#[inline(always)]
unsafe fn widen8(w: u64) -> int16x8_t {
    vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(w)))
}

/// 16 bytes as two registers of i16 lanes (signed or unsigned).
#[inline(always)]
unsafe fn widen16<const SIGNED: bool>(v: uint8x16_t) -> [int16x8_t; 2] {
    if SIGNED {
        let v = vreinterpretq_s8_u8(v);
        [vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v)]
    } else {
        [vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v))), vreinterpretq_s16_u16(vmovl_high_u8(v))]
    }
}

/// The 6-bit scales and minimums of a Q4_K / Q5_K block (`scales`, 12 bytes).
#[inline(always)]
unsafe fn k4_scales(q: &[u8; 12]) -> ([int16x8_t; 2], [int16x8_t; 2]) {
    let (s, m) = scales_mins_k4_words(q);
    let z = vdupq_n_s16(0);
    ([widen8(s), z], [widen8(m), z])
}

/// Decode the rows of a panel (`L::ROWS`, whole blocks each) into `out`
/// (`L::BLOCK_BYTES` per block), four rows at a time by `block`.
#[inline(always)]
unsafe fn decode_with<B: crate::quant::FileBlock, L: Layout>(
    rows: &[&[u8]],
    out: &mut [u8],
    block: impl Fn(&L, [&B; 4]),
) {
    assert_eq!(rows.len(), L::ROWS, "decode: a panel is {} rows", L::ROWS);
    let x: [&[B]; 8] = std::array::from_fn(|r| as_blocks::<B>(rows[r.min(L::ROWS - 1)]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * L::BLOCK_BYTES, "decode: row lengths differ");
    for b in 0..nb {
        let p = out.as_mut_ptr().add(b * L::BLOCK_BYTES);
        for h in 0..L::ROWS / 4 {
            block(&L::at(p, h), [0, 1, 2, 3].map(|r| &x[4 * h + r][b]));
        }
    }
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> uint8x16_t {
    vld1q_u8(p)
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a reinterpretation of the same 128 bits.
    unsafe { vreinterpretq_s8_u8(v) }
}

/// Q4_K: group `g` (16 values) is half `g % 2` of 32-value group `g / 2`,
/// whose values are the low (even) or high (odd) nibbles of bytes `32 (g / 4)..`.
pub(crate) unsafe fn decode_q4_k<L: Layout>(rows: &[&[u8]], out: &mut [u8]) {
    decode_with::<BlockQ4K, L>(rows, out, |q, xb| {
        let low = vdupq_n_u8(0x0F);
        for g in 0..16 {
            let w = xb.map(|b| {
                let v = ld(b.qs.as_ptr().add(32 * (g / 4) + 16 * (g % 2)));
                s8(if (g / 2) % 2 == 0 { vandq_u8(v, low) } else { vshrq_n_u8::<4>(v) })
            });
            q.values(g, w);
        }
        let sm = xb.map(|b| k4_scales(&b.scales));
        let (sc, m) = (sm.map(|x| x.0), sm.map(|x| x.1));
        q.steps(&sc, 8);
        q.mins(&m, 8);
        q.scales(xb.map(|b| b.d), xb.map(|b| b.dmin));
    })
}

/// Q5_K: Q4_K's nibbles with the fifth bit of value `v` in bit `v / 32` of
/// `qh[v % 32]`.
pub(crate) unsafe fn decode_q5_k<L: Layout>(rows: &[&[u8]], out: &mut [u8]) {
    decode_with::<BlockQ5K, L>(rows, out, |q, xb| {
        let low = vdupq_n_u8(0x0F);
        for g in 0..16 {
            let w = xb.map(|b| {
                let v = ld(b.qs.as_ptr().add(32 * (g / 4) + 16 * (g % 2)));
                let nib = if (g / 2) % 2 == 0 { vandq_u8(v, low) } else { vshrq_n_u8::<4>(v) };
                let h = ld(b.qh.as_ptr().add(16 * (g % 2)));
                // Bit g / 2 of each qh byte, to bit 4.
                let bit = vandq_u8(vshlq_u8(h, vdupq_n_s8(4 - (g / 2) as i8)), vdupq_n_u8(0x10));
                s8(vorrq_u8(nib, bit))
            });
            q.values(g, w);
        }
        let sm = xb.map(|b| k4_scales(&b.scales));
        let (sc, m) = (sm.map(|x| x.0), sm.map(|x| x.1));
        q.steps(&sc, 8);
        q.mins(&m, 8);
        q.scales(xb.map(|b| b.d), xb.map(|b| b.dmin));
    })
}

/// Q2_K: value `v` of a block is bits `2 (l / 32)` of `qs[32 h + l % 32]`,
/// `h = v / 128`, `l = v % 128`; scale and minimum of group `g` in the low and
/// high nibbles of `scales[g]`.
pub(crate) unsafe fn decode_q2_k<L: Layout>(rows: &[&[u8]], out: &mut [u8]) {
    decode_with::<BlockQ2K, L>(rows, out, |q, xb| {
        let three = vdupq_n_u8(3);
        for g in 0..16 {
            let (h, l) = (g / 8, 16 * (g % 8));
            let w = xb.map(|b| {
                let v = ld(b.qs.as_ptr().add(32 * h + l % 32));
                s8(vandq_u8(vshlq_u8(v, vdupq_n_s8(-2 * (l / 32) as i8)), three))
            });
            q.values(g, w);
        }
        let packed = xb.map(|b| ld(b.scales.as_ptr()));
        let sc = packed.map(|v| widen16::<false>(vandq_u8(v, vdupq_n_u8(15))));
        let m = packed.map(|v| widen16::<false>(vshrq_n_u8::<4>(v)));
        q.steps(&sc, 16);
        q.mins(&m, 16);
        q.scales(xb.map(|b| b.d), xb.map(|b| b.dmin));
    })
}

/// Q3_K: Q2_K's low bits, the third bit of value `v` in bit `v / 32` of
/// `hmask[v % 32]` (set: no offset; clear: minus 4), signed 6-bit scales.
pub(crate) unsafe fn decode_q3_k<L: Layout>(rows: &[&[u8]], out: &mut [u8]) {
    decode_with::<BlockQ3K, L>(rows, out, |q, xb| {
        let (three, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
        for g in 0..16 {
            let (h, l) = (g / 8, 16 * (g % 8));
            let w = xb.map(|b| {
                let v = ld(b.qs.as_ptr().add(32 * h + l % 32));
                let lo = vandq_u8(vshlq_u8(v, vdupq_n_s8(-2 * (l / 32) as i8)), three);
                let hm = ld(b.hmask.as_ptr().add(16 * (g % 2)));
                // Bit g / 2 of each hmask byte, to bit 2.
                let bit = vandq_u8(vshlq_u8(hm, vdupq_n_s8(2 - (g / 2) as i8)), four);
                vsubq_s8(s8(vorrq_u8(lo, bit)), s8(four))
            });
            q.values(g, w);
        }
        // Biased by 32 in the words: unbiased as i8 (-32..32) before widening.
        let sc = xb.map(|b| {
            let w = q3_k::unpack_scales_words(&b.scales);
            let v = vsubq_u8(vld1q_u8(w.as_ptr().cast()), vdupq_n_u8(32));
            widen16::<true>(v)
        });
        q.steps(&sc, 16);
        let z = F16Bytes::from_f32(0.0);
        q.scales(xb.map(|b| b.d), [z; 4]);
    })
}

/// Q6_K: value `v` (`h = v / 128`, `l = v % 128`) is the low (`l < 64`) or
/// high nibble of `ql[64 h + l % 64]` with bits `2 (l / 32)` of
/// `qh[32 h + l % 32]` above it, minus 32; scales are i8 per group.
pub(crate) unsafe fn decode_q6_k<L: Layout>(rows: &[&[u8]], out: &mut [u8]) {
    decode_with::<BlockQ6K, L>(rows, out, |q, xb| {
        let (low, top, off) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30), vdupq_n_s8(32));
        for g in 0..16 {
            let (h, l) = (g / 8, 16 * (g % 8));
            let w = xb.map(|b| {
                let v = ld(b.ql.as_ptr().add(64 * h + l % 64));
                let nib = if l < 64 { vandq_u8(v, low) } else { vshrq_n_u8::<4>(v) };
                let hb = ld(b.qh.as_ptr().add(32 * h + l % 32));
                let hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8(4 - 2 * (l / 32) as i8)), top);
                vsubq_s8(s8(vorrq_u8(nib, hi)), off)
            });
            q.values(g, w);
        }
        let sc = xb.map(|b| widen16::<true>(ld(b.scales.as_ptr().cast())));
        q.steps(&sc, 16);
        let z = F16Bytes::from_f32(0.0);
        q.scales(xb.map(|b| b.d), [z; 4]);
    })
}

/// `T` tokens against one decoded quad: `out[t]` = the four rows' products
/// with token `t`. `G` groups carry a scale (16, or 8 of 32 values each);
/// `M` groups a minimum (0: none).
#[inline(always)]
unsafe fn quad_dot<const T: usize, const G: usize, const M: usize>(dec: &[u8], a: [&[BlockQ8K]; T]) -> [[f32; 4]; T] {
    let nb = a[0].len();
    assert!(a.iter().all(|x| x.len() == nb) && dec.len() >= nb * QUAD_BLOCK_BYTES, "quad_dot: lengths differ");
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * QUAD_BLOCK_BYTES);
        let y: [&BlockQ8K; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let mut c = [vdupq_n_s32(0); T];
        let mut r = [vdupq_n_s32(0); T];
        // Written out, so that every offset is a constant: as a loop, LLVM
        // kept it rolled, 13 instructions of counters, address arithmetic and
        // branches next to each group's 16 `sdot` (four tokens).
        macro_rules! groups {
            ($($g:literal)*) => {$(
                group::<T, G>($g, p, &y, &mut c, &mut r);
            )*};
        }
        groups!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        let f = p.add(VALUES + STEPS + MINS).cast::<f32>();
        let (d, dmin) = (vld1q_f32(f), vld1q_f32(f.add(4)));
        for t in 0..T {
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(r[t]), vmulq_n_f32(d, y[t].d));
        }
        if M > 0 {
            let mp = p.add(VALUES + STEPS).cast::<i16>();
            for t in 0..T {
                let m = block_mins::<M>(mp, y[t]);
                acc[t] = vfmsq_f32(acc[t], vcvtq_f32_s32(m), vmulq_n_f32(dmin, y[t].d));
            }
        }
    }
    acc.map(|v| {
        let mut o = [0f32; 4];
        vst1q_f32(o.as_mut_ptr(), v);
        o
    })
}

/// Group `g` (16 values) of the decoded quad block at `p` against `T`
/// tokens: four `sdot` per token into `c`; at the end of a scale group, its
/// chain step into `r`.
#[inline(always)]
unsafe fn group<const T: usize, const G: usize>(
    g: usize,
    p: *const u8,
    y: &[&BlockQ8K; T],
    c: &mut [int32x4_t; T],
    r: &mut [int32x4_t; T],
) {
    let w = [0, 1, 2, 3].map(|j| vld1q_s8(p.add(64 * g + 16 * j).cast()));
    for t in 0..T {
        let x = vld1q_s8(y[t].qs.as_ptr().add(16 * g));
        c[t] = sdot_lane::<0>(c[t], w[0], x);
        c[t] = sdot_lane::<1>(c[t], w[1], x);
        c[t] = sdot_lane::<2>(c[t], w[2], x);
        c[t] = sdot_lane::<3>(c[t], w[3], x);
    }
    if (g + 1).is_multiple_of(16 / G) {
        let step = vld1q_s32(p.add(VALUES).cast::<i32>().add(4 * (g / (16 / G))));
        for t in 0..T {
            r[t] = vmlaq_s32(r[t], c[t], step);
        }
    }
}

/// `sum_g mins[g] * bsum_g(y)` over a block's `M` (8 or 16) groups, the four
/// rows in the lanes (`mins`: as [`store_mins`] wrote them).
#[inline(always)]
pub(super) unsafe fn block_mins<const M: usize>(mins: *const i16, y: &BlockQ8K) -> int32x4_t {
    let (b0, b1) = (vld1q_s16(y.bsums.as_ptr()), vld1q_s16(y.bsums.as_ptr().add(8)));
    let z = vdupq_n_s32(0);
    if M == 8 {
        // Groups of 32: the sums of pairs of 16-value group sums.
        mins8(z, mins, vpaddq_s16(b0, b1))
    } else {
        mins8(mins8(z, mins, b0), mins.add(32), b1)
    }
}

/// `m + sum_{g < 8} mins[g] * s[g]`, the four rows in the lanes (`mins`: 8
/// groups x 4 rows of i16).
#[inline(always)]
unsafe fn mins8(m: int32x4_t, mins: *const i16, s: int16x8_t) -> int32x4_t {
    let l = |g: usize| vld1_s16(mins.add(4 * g));
    let m = vmlal_laneq_s16::<0>(m, l(0), s);
    let m = vmlal_laneq_s16::<1>(m, l(1), s);
    let m = vmlal_laneq_s16::<2>(m, l(2), s);
    let m = vmlal_laneq_s16::<3>(m, l(3), s);
    let m = vmlal_laneq_s16::<4>(m, l(4), s);
    let m = vmlal_laneq_s16::<5>(m, l(5), s);
    let m = vmlal_laneq_s16::<6>(m, l(6), s);
    vmlal_laneq_s16::<7>(m, l(7), s)
}

/// The quad kernels of one format: up to four tokens per call.
macro_rules! quad_kernels {
    ($($name:ident = $g:literal, $m:literal;)*) => {
        $(
            #[target_feature(enable = "neon,dotprod")]
            pub(crate) unsafe fn $name(dec: &[u8], a: &[&[BlockQ8K]], out: *mut f32, stride: usize) {
                let v: &[[f32; 4]] = match a.len() {
                    1 => &quad_dot::<1, $g, $m>(dec, [a[0]]),
                    2 => &quad_dot::<2, $g, $m>(dec, [a[0], a[1]]),
                    3 => &quad_dot::<3, $g, $m>(dec, [a[0], a[1], a[2]]),
                    _ => &quad_dot::<4, $g, $m>(dec, [a[0], a[1], a[2], a[3]]),
                };
                for (t, v) in v.iter().enumerate() {
                    vst1q_f32(out.add(stride * t), vld1q_f32(v.as_ptr()));
                }
            }
        )*
    };
}

quad_kernels! {
    q2_k = 16, 16;
    q3_k = 16, 0;
    q4_k = 8, 8;
    q5_k = 8, 8;
    q6_k = 16, 0;
}
