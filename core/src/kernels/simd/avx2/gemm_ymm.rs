//! Prefill as a GEMM on AVX2 (and AVX-VNNI): the 256-bit twin of
//! [`super::gemm`]'s AVX-512 panels, for Q4_0 / Q5_0 and the K-quants.
//!
//! A tile's weight rows are decoded once, eight rows at a time, into panels:
//! values as unsigned bytes, 4 values of each of the 8 rows per 32-byte
//! register, so one multiply with the token's 4 activations broadcast from
//! memory adds 4 products to each of 8 rows. Without VNNI that multiply is
//! `vpmaddubsw` (u8 x i8 -> i16 pairs), whose pair sums are added in i16 for
//! as many registers as cannot overflow, then widened by one `vpmaddwd` (by
//! ones, or by the K-quants' group scales, below): per 32 values of a row,
//! 2-3 instructions serve 8 rows, where the
//! four-token kernels pay about 7 per row. With AVX-VNNI, `vpdpbusd`.
//!
//! Measured with `pocket bench-kernels --isa avx2 --threads 1
//! --working-set-mib 8 --tokens N` on Zen 3 (expert 512x2048, GMAC/s,
//! kernels before -> panels): Q4_0 4 tokens 7.4-10.1 -> 12.3, 8 tokens
//! 7.6-8.2 -> 15.1-15.3, 64 tokens 10 -> 21; Q4_K 8 tokens 13-14 -> 15-16,
//! 32 tokens 14.5 -> 22; Q3_K 32 tokens 15.8 -> 20.3; Q6_K 8 tokens 12.5-14
//! -> 9.6-11.2 (so from 16), 32 tokens 14.2 -> 15.7. Q2_K has none: its
//! decoded rows already cost what a panel does (the values carry the
//! scales, so both pay one `vpmaddubsw` per 32 products and little more):
//! 16.1-16.6 -> 12.5-14 at 8 tokens, 18.4-19.4 -> 18.8-20.2 at 128.
//!
//! Offsets (Q4_0's 8, Q5_0's 16; Q3_K's 4, Q6_K's 32) are kept in the values
//! and taken off through the activations' block or group sums, as are the
//! K-quants' minimums (see [`super::gemm`]). The K-quants' group scales stay
//! integers: without VNNI they are the widening `vpmaddwd`'s factor (where
//! ones would otherwise be), so a block's sum is one i32 that meets `d` once
//! instead of a conversion and a multiply-add per group and token (Q6_K
//! 32 tokens 17-19 -> 18-22 GMAC/s, Q5_K 20-23 -> 22-25, Q4_K and Q3_K within
//! the noise). The integer sums are the scalar twin's; the f32 sums run per
//! block (per group with VNNI), within the tests' tolerance.

// The kernels index several parallel arrays (tokens' accumulators, rows'
// blocks) by one counter; iterator chains would hide which lanes meet.
#![allow(clippy::needless_range_loop)]
use super::gemm::{q4_k_values, q5_k_values, q6_k_values};
use super::kquants::{q3_k_values, q3_scales};
use super::legacy::Signed32;
use super::{fp16, prefetch_panel, MADD, VEX};
use crate::quant::{
    as_blocks, scales_mins_k4, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0F,
};
use std::arch::x86_64::*;

/// Rows per panel (the lanes of a 256-bit register of i32).
const HEIGHT: usize = 8;
/// Tokens per kernel call, at most (accumulators for four tokens, their i16
/// partial sums and the shared registers fill the sixteen `ymm`).
const ACTS: usize = 4;

/// Transpose 8 registers of 8 words: word `c` of register `r` moves to word
/// `r` of register `c` (interleave words, then pairs, then swap halves).
#[inline(always)]
unsafe fn transpose8(r: &mut [__m256i; 8]) {
    let mut t = [_mm256_setzero_si256(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // t[0] = r0 r1 words 0 1 | 4 5, t[1] = r0 r1 words 2 3 | 6 7, t[2] = r2 r3 ...
    let mut u = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let (a, b) = (4 * h, 4 * h + 2);
        u[4 * h] = _mm256_unpacklo_epi64(t[a], t[b]); // words 0 | 4 of 4 rows
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[a], t[b]); // words 1 | 5
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[a + 1], t[b + 1]); // words 2 | 6
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[a + 1], t[b + 1]); // words 3 | 7
    }
    for w in 0..4 {
        r[w] = _mm256_permute2x128_si256::<0x20>(u[w], u[4 + w]);
        r[w + 4] = _mm256_permute2x128_si256::<0x31>(u[w], u[4 + w]);
    }
}

/// The 32 bytes at `at` of 8 rows `stride` apart from `base`, transposed:
/// register `i` holds word `i` of every row.
#[inline(always)]
unsafe fn transposed(base: *const u8, stride: usize, at: usize) -> [__m256i; 8] {
    let mut r = [_mm256_setzero_si256(); 8];
    for (row, v) in r.iter_mut().enumerate() {
        *v = _mm256_loadu_si256(base.add(row * stride + at).cast());
    }
    transpose8(&mut r);
    r
}

/// Activations `4j..4j + 4` of `qs` in every lane (a broadcast load).
#[inline(always)]
unsafe fn word(qs: *const i8, j: usize) -> __m256i {
    _mm256_set1_epi32(qs.add(4 * j).cast::<i32>().read_unaligned())
}

/// The i32 sums of `n` registers of panel values (from `p`, 32 bytes apart)
/// against the activation words `j0..j0 + n` of `qs`, added to `acc`. Without
/// VNNI, the `vpmaddubsw` pair sums of `group` registers at a time are added
/// in i16 (the caller's bound: values below `2^15 / (2 * 128 * group)`),
/// then widened by `vpmaddwd` with `factor` (i16 pairs: ones, or the rows'
/// group scales), so the sums are `factor` times the products. With VNNI
/// they are the plain products: `factor` is not read.
#[inline(always)]
unsafe fn sums<const V: u8, const T: usize>(
    p: *const u8,
    qs: &[*const i8; T],
    j0: usize,
    n: usize,
    group: usize,
    factor: __m256i,
    acc: &mut [__m256i; T],
) {
    if V == VEX {
        for j in j0..j0 + n {
            let w = _mm256_loadu_si256(p.add(32 * j).cast());
            for t in 0..T {
                acc[t] = _mm256_dpbusd_avx_epi32(acc[t], w, word(qs[t], j));
            }
        }
        return;
    }
    let mut g = j0;
    while g < j0 + n {
        let ge = (g + group).min(j0 + n);
        let mut s = [_mm256_setzero_si256(); T];
        for j in g..ge {
            let w = _mm256_loadu_si256(p.add(32 * j).cast());
            for t in 0..T {
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(w, word(qs[t], j)));
            }
        }
        for t in 0..T {
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s[t], factor));
        }
        g = ge;
    }
}

// ---- Q4_0 and Q5_0 (Q8_0 activations): one scale per 32 values ------------

const LEGACY_VALUES: usize = 8 * 32;
/// One decoded block of a Q4_0 / Q5_0 panel: values, then `d` per row.
const LEGACY_BLOCK_BYTES: usize = LEGACY_VALUES + 32;
/// Decode panels from this many tokens on (below, the decoded-rows kernels).
const LEGACY_MIN_ACTS: usize = 4;

/// `B`'s 8 weight rows into panel blocks: the values plus `OFF` (so
/// unsigned: Q4_0 0..16, Q5_0 0..32), `d` as f32.
#[inline(always)]
unsafe fn decode_legacy<B: Signed32 + crate::quant::FileBlock, const OFF: i8>(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[B]; HEIGHT] = std::array::from_fn(|r| as_blocks::<B>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * LEGACY_BLOCK_BYTES, "decode: row lengths differ");
    for b in 0..nb {
        prefetch_panel(&x, b);
        let p = out.as_mut_ptr().add(b * LEGACY_BLOCK_BYTES);
        // (Loops, not `from_fn` closures: a closure here is compiled without
        // the wrappers' target features, and the intrinsics in it become calls.)
        let mut q = [_mm256_setzero_si256(); HEIGHT];
        let d = p.add(LEGACY_VALUES).cast::<f32>();
        for r in 0..HEIGHT {
            q[r] = _mm256_add_epi8(x[r][b].values(), _mm256_set1_epi8(OFF));
            d.add(r).write_unaligned(_mm256_cvtss_f32(x[r][b].scale_x8()));
        }
        transpose8(&mut q);
        for (j, v) in q.into_iter().enumerate() {
            _mm256_storeu_si256(p.add(32 * j).cast(), v);
        }
    }
}

/// `T` tokens against one decoded Q4_0 / Q5_0 panel: `out[stride t + r]`. `GROUP`
/// registers of i16 pair sums before widening (Q4_0: 8 x 2 x 15 x 128 fit in
/// i16; Q5_0: 4 x 2 x 31 x 128).
#[inline(always)]
unsafe fn legacy_dot<const V: u8, const T: usize, const OFF: i32, const GROUP: usize>(
    dec: &[u8],
    a: &[&[BlockQ8_0F]],
    out: *mut f32,
    stride: usize,
) {
    let nb = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == nb) && dec.len() >= nb * LEGACY_BLOCK_BYTES);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * LEGACY_BLOCK_BYTES);
        let y: [&BlockQ8_0F; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        // The offset times the activations' sum, taken off before the sums.
        let mut c = [_mm256_setzero_si256(); T];
        for t in 0..T {
            c[t] = _mm256_set1_epi32(-OFF * y[t].s);
        }
        sums::<V, T>(p, &y.map(|y| y.qs.as_ptr()), 0, 8, GROUP, _mm256_set1_epi16(1), &mut c);
        let d = _mm256_loadu_ps(p.add(LEGACY_VALUES).cast());
        for t in 0..T {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[t]), _mm256_mul_ps(d, _mm256_set1_ps(y[t].d)), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out.add(stride * t), acc[t]);
    }
}

// ---- K-quants (Q8_K activations) ------------------------------------------

const VALUES: usize = 64 * 32;
const SCALES: usize = 16 * 32;
const PAIRS: usize = 8 * 32;
/// One decoded block of a K-quant panel: values, group scales (i16, twice
/// per word), minimum (or offset) pairs, `d`, the minimums' factor `dmin`
/// (or `d`).
const BLOCK_BYTES: usize = VALUES + SCALES + PAIRS + 2 * 32;

/// What a row decoder gives per block. Whole 32-byte registers: the decoder
/// transposes `q`, `s` and `m` 32 bytes at a time.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Row {
    /// The 256 values as unsigned bytes.
    q: [u8; 256],
    /// Group scales (groups of 16 or 32 values) as i16, in both halves of
    /// a word: `vpmaddwd`'s factor for both pair sums of a lane.
    s: [i32; 16],
    /// Minimums or offset terms as i16, per group of 16 values.
    m: [i16; 16],
    /// The values' factor `d`.
    d: f32,
    /// The minimums' factor: `dmin` (or `d`).
    dm: f32,
}

/// A scale as a [`Row::s`] word.
#[inline(always)]
fn twice(s: i16) -> i32 {
    let w = s as u16 as u32;
    (w | w << 16) as i32
}

/// A K-quant block that fills one row's [`Row`] with AVX2 alone (the
/// values decoded as for the AVX-512 panels, the scales as integers).
trait Row8: crate::quant::FileBlock {
    unsafe fn row8(&self, r: &mut Row);
}

/// Q4_K / Q5_K scales and minimums (duplicated over each group's two halves
/// of 16, for the pairs of `bsums`).
#[inline(always)]
fn k4_scales(scales: &[u8; 12], d: f32, dmin: f32, r: &mut Row) {
    let (s, m) = scales_mins_k4(scales);
    for g in 0..8 {
        r.s[g] = twice(s[g] as i16);
        r.m[2 * g] = m[g] as i16;
        r.m[2 * g + 1] = m[g] as i16;
    }
    r.d = d;
    r.dm = dmin;
}

impl Row8 for BlockQ4K {
    #[inline(always)]
    unsafe fn row8(&self, r: &mut Row) {
        q4_k_values(self, &mut r.q);
        k4_scales(&self.scales, fp16(self.d), fp16(self.dmin), r);
    }
}

impl Row8 for BlockQ5K {
    #[inline(always)]
    unsafe fn row8(&self, r: &mut Row) {
        q5_k_values(self, &mut r.q);
        k4_scales(&self.scales, fp16(self.d), fp16(self.dmin), r);
    }
}

/// Q6_K: values 0..64; the offset 32 times the group scale as the "minimum",
/// with `d`.
impl Row8 for BlockQ6K {
    #[inline(always)]
    unsafe fn row8(&self, r: &mut Row) {
        q6_k_values(self, &mut r.q);
        for g in 0..16 {
            let s = self.scales[g] as i16;
            r.s[g] = twice(s);
            r.m[g] = 32 * s;
        }
        r.d = fp16(self.d);
        r.dm = r.d;
    }
}

/// Q3_K: values 0..8 (the scalar format's `q - 4` plus 4); the offset 4
/// times the group scale as the "minimum", with `d`.
impl Row8 for BlockQ3K {
    #[inline(always)]
    unsafe fn row8(&self, r: &mut Row) {
        for (i, v) in q3_k_values(self).into_iter().enumerate() {
            _mm256_storeu_si256(r.q.as_mut_ptr().add(32 * i).cast(), v);
        }
        let s16 = _mm256_cvtepi8_epi16(q3_scales(&self.scales));
        // Each i16 twice: the low and high 8 of the 16, widened in order.
        let lo = _mm256_unpacklo_epi16(s16, s16);
        let hi = _mm256_unpackhi_epi16(s16, s16);
        _mm256_storeu_si256(r.s.as_mut_ptr().cast(), _mm256_permute2x128_si256::<0x20>(lo, hi));
        _mm256_storeu_si256(r.s.as_mut_ptr().add(8).cast(), _mm256_permute2x128_si256::<0x31>(lo, hi));
        _mm256_storeu_si256(r.m.as_mut_ptr().cast(), _mm256_slli_epi16::<2>(s16));
        r.d = fp16(self.d);
        r.dm = r.d;
    }
}

/// `B`'s 8 weight rows into panel blocks (the layout of [`BLOCK_BYTES`]).
#[inline(always)]
unsafe fn decode_k<B: Row8>(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[B]; HEIGHT] = std::array::from_fn(|r| as_blocks::<B>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * BLOCK_BYTES, "decode: row lengths differ");
    let zero = Row { q: [0; 256], s: [0; 16], m: [0; 16], d: 0.0, dm: 0.0 };
    let mut rb = [zero; HEIGHT];
    let stride = std::mem::size_of::<Row>();
    let base = rb.as_ptr().cast::<u8>();
    for b in 0..nb {
        prefetch_panel(&x, b);
        for r in 0..HEIGHT {
            x[r][b].row8(&mut rb[r]);
        }
        let p = out.as_mut_ptr().add(b * BLOCK_BYTES);
        // Values: word j of every row into register j, 8 registers at a time.
        for c in 0..8 {
            for (i, v) in transposed(base, stride, 32 * c).into_iter().enumerate() {
                _mm256_storeu_si256(p.add(32 * (8 * c + i)).cast(), v);
            }
        }
        for h in 0..2 {
            let at = std::mem::offset_of!(Row, s) + 32 * h;
            for (g, v) in transposed(base, stride, at).into_iter().enumerate() {
                _mm256_storeu_si256(p.add(VALUES + 32 * (8 * h + g)).cast(), v);
            }
        }
        for (pair, v) in transposed(base, stride, std::mem::offset_of!(Row, m)).into_iter().enumerate() {
            _mm256_storeu_si256(p.add(VALUES + SCALES + 32 * pair).cast(), v);
        }
        let f = p.add(VALUES + SCALES + PAIRS).cast::<f32>();
        for r in 0..HEIGHT {
            f.add(r).write_unaligned(rb[r].d);
            f.add(HEIGHT + r).write_unaligned(rb[r].dm);
        }
    }
}

/// `T` tokens against one decoded K-quant panel: `out[stride t + r]`. `G` values
/// per scale group (16 or 32); `GROUP` registers of i16 pair sums before
/// widening (see [`sums`]). Without VNNI the widening `vpmaddwd` takes the
/// group scales as its factor, so a block's sum stays in i32 (at most
/// 32 widenings of `2 x 2^15 x 128`, 2^28, for Q6_K, the widest) and meets `d` once; VNNI's
/// sums are scaled per group in f32.
#[inline(always)]
unsafe fn k_dot<const V: u8, const T: usize, const G: usize, const GROUP: usize>(
    dec: &[u8],
    a: &[&[BlockQ8K]],
    out: *mut f32,
    stride: usize,
) {
    let nb = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == nb) && dec.len() >= nb * BLOCK_BYTES);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * BLOCK_BYTES);
        let y: [&BlockQ8K; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let qs = y.map(|y| y.qs.as_ptr());
        let mut rf = [_mm256_setzero_ps(); T];
        let mut ri = [_mm256_setzero_si256(); T];
        for g in 0..256 / G {
            let s = _mm256_loadu_si256(p.add(VALUES + 32 * g).cast());
            if V == VEX {
                let mut c = [_mm256_setzero_si256(); T];
                sums::<V, T>(p, &qs, g * G / 4, G / 4, GROUP, s, &mut c);
                let sf = _mm256_cvtepi32_ps(_mm256_srai_epi32::<16>(s));
                for t in 0..T {
                    rf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[t]), sf, rf[t]);
                }
            } else {
                sums::<V, T>(p, &qs, g * G / 4, G / 4, GROUP, s, &mut ri);
            }
        }
        if V != VEX {
            for t in 0..T {
                rf[t] = _mm256_cvtepi32_ps(ri[t]);
            }
        }
        // Minimums (or offsets) against the activations' group sums, in pairs.
        let mut m = [_mm256_setzero_si256(); T];
        for pair in 0..8 {
            let mp = _mm256_loadu_si256(p.add(VALUES + SCALES + 32 * pair).cast());
            for t in 0..T {
                let bs = _mm256_set1_epi32(y[t].bsums.as_ptr().add(2 * pair).cast::<i32>().read_unaligned());
                m[t] = super::dot_i16::<V>(m[t], mp, bs);
            }
        }
        let d = _mm256_loadu_ps(p.add(VALUES + SCALES + PAIRS).cast());
        let dm = _mm256_loadu_ps(p.add(VALUES + SCALES + PAIRS + 32).cast());
        for t in 0..T {
            let r = _mm256_fmsub_ps(rf[t], d, _mm256_mul_ps(_mm256_cvtepi32_ps(m[t]), dm));
            acc[t] = _mm256_fmadd_ps(r, _mm256_set1_ps(y[t].d), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out.add(stride * t), acc[t]);
    }
}

/// One kernel body for one to [`ACTS`] tokens.
macro_rules! by_tokens {
    ($f:ident::<$v:ident, _ $(, $p:tt)*>($dec:ident, $a:ident, $out:ident, $stride:ident)) => {
        match $a.len() {
            1 => $f::<$v, 1 $(, $p)*>($dec, $a, $out, $stride),
            2 => $f::<$v, 2 $(, $p)*>($dec, $a, $out, $stride),
            3 => $f::<$v, 3 $(, $p)*>($dec, $a, $out, $stride),
            _ => $f::<$v, 4 $(, $p)*>($dec, $a, $out, $stride),
        }
    };
}

/// Each format's decoder `decode_x` and panel kernel `x`, compiled with a
/// path's target features.
macro_rules! formats {
    ($features:literal, $v:ident;
     $($decode:ident = $dec:ident::<$($dp:tt),*>, $dot:ident = $kern:ident::<$($kp:tt),*>($act:ty);)*) => {$(
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $decode(rows: &[&[u8]], out: &mut [u8]) {
            $dec::<$($dp),*>(rows, out)
        }
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $dot(dec: &[u8], a: &[&[$act]], out: *mut f32, stride: usize) {
            by_tokens!($kern::<$v, _ $(, $kp)*>(dec, a, out, stride))
        }
    )*};
}

/// The decoders and panel kernels, compiled for AVX2 (`MADD`) and AVX-VNNI
/// (`VEX`).
macro_rules! paths {
    ($($m:ident, $features:literal, $v:ident;)*) => {$(
        pub(crate) mod $m {
            use super::*;

            // Legacy: the offset, then i16 sums per widening. K-quants:
            // values per group, then i16 sums per widening (Q3_K groups of
            // 16 below 8; Q4_K / Q5_K groups of 32 below 16 / 32; Q6_K
            // groups of 16 below 64).
            formats! { $features, $v;
                decode_q4_0 = decode_legacy::<BlockQ4_0, 8>, q4_0 = legacy_dot::<8, 8>(BlockQ8_0F);
                decode_q5_0 = decode_legacy::<BlockQ5_0, 16>, q5_0 = legacy_dot::<16, 4>(BlockQ8_0F);
                decode_q3_k = decode_k::<BlockQ3K>, q3_k = k_dot::<16, 4>(BlockQ8K);
                decode_q4_k = decode_k::<BlockQ4K>, q4_k = k_dot::<32, 8>(BlockQ8K);
                decode_q5_k = decode_k::<BlockQ5K>, q5_k = k_dot::<32, 4>(BlockQ8K);
                decode_q6_k = decode_k::<BlockQ6K>, q6_k = k_dot::<16, 2>(BlockQ8K);
            }

            /// The panels of Q4_0 / Q5_0 and the K-quants for this path's table.
            pub(crate) fn install(k: &mut crate::kernels::table::Kernels) {
                use crate::kernels::table::{PanelDot, Panels};
                type Decode = unsafe fn(&[&[u8]], &mut [u8]);
                let l = |decode: Decode, dot: PanelDot<BlockQ8_0F>| {
                    let (height, acts) = (HEIGHT, ACTS);
                    Some(Panels { height, block_bytes: LEGACY_BLOCK_BYTES, min_acts: LEGACY_MIN_ACTS, acts, decode, dot })
                };
                k.q4_0.panels = l(decode_q4_0, q4_0);
                k.q5_0.panels = l(decode_q5_0, q5_0);
                let p = |decode: Decode, dot: PanelDot<BlockQ8K>, min_acts: usize| {
                    let (height, acts) = (HEIGHT, ACTS);
                    Some(Panels { height, block_bytes: BLOCK_BYTES, min_acts, acts, decode, dot })
                };
                k.q3_k.panels = p(decode_q3_k, q3_k, 16);
                k.q4_k.panels = p(decode_q4_k, q4_k, 8);
                k.q5_k.panels = p(decode_q5_k, q5_k, 16);
                k.q6_k.panels = p(decode_q6_k, q6_k, 16);
            }
        }
    )*};
}

paths! {
    avx2, "avx2,fma,f16c", MADD;
    avxvnni, "avx2,fma,f16c,avxvnni", VEX;
}
