//! Prefill as a GEMM for the K-quants (Q2_K..Q6_K) on AVX-512 VNNI.
//!
//! The four-token kernels unpack every weight block once per four tokens.
//! Here a tile's weight rows are decoded once, sixteen rows at a time, into
//! panels that `vpdpbusd` multiplies directly, and every token of the tile
//! reuses them:
//!
//! - values as unsigned bytes (offsets kept: Q3_K 0..8, Q6_K 0..64), 4 values
//!   of each of the 16 rows per 64-byte register, so one `vpdpbusd` with the
//!   token's 4 activations broadcast from memory adds 4 products to each of 16
//!   rows: 64 instructions per 256 values serve 16 rows;
//! - Q2_K's 2-bit values times their 4-bit group scale (at most 45, still a
//!   byte), so its block needs no per-group scaling;
//! - the other formats' group scales times the row's `d`, as f32 lanes, one
//!   conversion and multiply-add per group;
//! - minimums (Q2_K, Q4_K, Q5_K) and the offsets times the scales (Q3_K: 4,
//!   Q6_K: 32) as pairs of i16 that `vpdpwssd` meets with pairs of the
//!   activations' group sums (`bsums`), then `dmin` (or `d`).
//!
//! The integer sums are the scalar twin's; the f32 sums run in another order
//! (per group, then per block), within the tests' tolerance.

// The kernels index several parallel arrays (tokens' accumulators, rows' blocks)
// by one counter; iterator chains would hide which lanes meet.
#![allow(clippy::needless_range_loop)]
use super::fp16;
use super::legacy::Signed32;
use crate::quant::{
    as_blocks, q3_k, scales_mins_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K,
    BlockQ8_0F,
};
use std::arch::x86_64::*;

/// Rows per panel (the lanes of a 512-bit register of i32).
pub(crate) const HEIGHT: usize = 16;
/// Tokens per kernel call, at most.
pub(crate) const ACTS: usize = 8;
/// Decode from this many tokens on (below, the four-token kernels): a
/// panel's decoding costs about what 20-30 tokens' products with it do, so
/// MoE experts with a few tokens each keep the packed kernels. Measured on
/// the mid qwen35moe Q4_K_M file, pp128, 2 threads, 3 draws twice: from 6
/// tokens 281-287 t/s, from 16 301-305, from 24 308-318, from 32 319-327, from
/// 48 315-319, never 276-283.
pub(crate) const MIN_ACTS: usize = 32;

const VALUES: usize = 64 * 64;
const SCALES: usize = 16 * 64;
const PAIRS: usize = 8 * 64;
/// One decoded block of a panel: values, group scales, minimum pairs, `dmin`.
pub(crate) const BLOCK_BYTES: usize = VALUES + SCALES + PAIRS + 64;

/// What a format's decoder gives per row and block (`q` first: the panel's
/// gathers read it at a fixed stride).
#[repr(C)]
struct RowBlock {
    /// The 256 values as unsigned bytes.
    q: [u8; 256],
    /// Group scales times `d` (Q2_K: `d` alone, in group 0).
    sd: [f32; 16],
    /// Minimums or offset terms as i16, per group of 16 values.
    m: [i16; 16],
    /// The factor of the minimums: `dmin` (or `d`).
    dm: f32,
}

impl RowBlock {
    fn new() -> RowBlock {
        RowBlock { q: [0; 256], sd: [0.0; 16], m: [0; 16], dm: 0.0 }
    }
}

/// A K-quant block that fills one row's [`RowBlock`]. (A trait method, not
/// a closure: a closure would be compiled without the wrappers' target
/// features, and the intrinsics in it would become calls.)
trait PanelBlock: crate::quant::FileBlock {
    unsafe fn row(&self, rb: &mut RowBlock);
}

/// The decoders' shared part: `rows` (16) weight rows of blocks `B` into
/// panel blocks.
#[inline(always)]
unsafe fn decode_with<B: PanelBlock>(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[B]; HEIGHT] = std::array::from_fn(|r| as_blocks::<B>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * BLOCK_BYTES, "decode: row lengths differ");
    let mut rb: [RowBlock; HEIGHT] = std::array::from_fn(|_| RowBlock::new());
    for b in 0..nb {
        for r in 0..HEIGHT {
            x[r][b].row(&mut rb[r]);
        }
        let p = out.as_mut_ptr().add(b * BLOCK_BYTES);
        // Values: word j of every row into register j (a gather per register).
        let base = rb.as_ptr().cast::<u8>();
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let idx = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(std::mem::size_of::<RowBlock>() as i32));
        for j in 0..64 {
            let v = _mm512_i32gather_epi32::<1>(idx, base.add(4 * j).cast());
            _mm512_storeu_si512(p.add(64 * j).cast(), v);
        }
        // Scales, minimum pairs and `dm`: one gather per register too.
        let rb_base = rb.as_ptr().cast::<u8>();
        let sd_at = std::mem::offset_of!(RowBlock, sd);
        for g in 0..16 {
            let v = _mm512_i32gather_ps::<1>(idx, rb_base.add(sd_at + 4 * g).cast());
            _mm512_storeu_ps(p.add(VALUES + 64 * g).cast(), v);
        }
        let m_at = std::mem::offset_of!(RowBlock, m);
        for pair in 0..8 {
            let v = _mm512_i32gather_epi32::<1>(idx, rb_base.add(m_at + 4 * pair).cast());
            _mm512_storeu_si512(p.add(VALUES + SCALES + 64 * pair).cast(), v);
        }
        let v = _mm512_i32gather_ps::<1>(idx, rb_base.add(std::mem::offset_of!(RowBlock, dm)).cast());
        _mm512_storeu_ps(p.add(VALUES + SCALES + PAIRS).cast(), v);
    }
}

/// 32 bytes at `p`.
#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
unsafe fn st(q: &mut [u8; 256], at: usize, v: __m256i) {
    _mm256_storeu_si256(q.as_mut_ptr().add(at).cast(), v);
}

/// `(v >> shift) & mask` per byte (16-bit shifts: the bits a byte takes from
/// its neighbour are masked off).
#[inline(always)]
unsafe fn bits(v: __m256i, shift: i32, mask: i8) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(mask))
}

/// `v << shift` per byte, for bytes whose shifted bits stay inside them.
#[inline(always)]
unsafe fn up(v: __m256i, shift: i32) -> __m256i {
    _mm256_sll_epi16(v, _mm_cvtsi32_si128(shift))
}

/// Q4_K / Q5_K scales times `d` and minimums (duplicated over each group's
/// two halves of 16, for the pairs of `bsums`).
#[inline(always)]
unsafe fn k4_scales(scales: &[u8; 12], d: f32, dmin: f32, rb: &mut RowBlock) {
    let (s, m) = scales_mins_k4(scales);
    for g in 0..8 {
        rb.sd[g] = d * s[g] as f32;
        rb.m[2 * g] = m[g] as i16;
        rb.m[2 * g + 1] = m[g] as i16;
    }
    rb.dm = dmin;
}

#[inline(always)]
unsafe fn q4_k_row(b: &BlockQ4K, rb: &mut RowBlock) {
    for c in 0..4 {
        let v = ld(b.qs.as_ptr().add(32 * c));
        st(&mut rb.q, 64 * c, _mm256_and_si256(v, _mm256_set1_epi8(0x0F)));
        st(&mut rb.q, 64 * c + 32, bits(v, 4, 0x0F));
    }
    k4_scales(&b.scales, fp16(b.d), fp16(b.dmin), rb);
}

#[inline(always)]
unsafe fn q5_k_row(b: &BlockQ5K, rb: &mut RowBlock) {
    let h = ld(b.qh.as_ptr());
    for c in 0..4 {
        let v = ld(b.qs.as_ptr().add(32 * c));
        let lo = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), up(bits(h, 2 * c as i32, 1), 4));
        let hi = _mm256_or_si256(bits(v, 4, 0x0F), up(bits(h, 2 * c as i32 + 1, 1), 4));
        st(&mut rb.q, 64 * c, lo);
        st(&mut rb.q, 64 * c + 32, hi);
    }
    k4_scales(&b.scales, fp16(b.d), fp16(b.dmin), rb);
}

/// `[0, s, 2s, 3s]` in every word, `s` the scale of Q2_K group `g`
/// (`3 * 15 < 256`: the bytes never carry).
#[inline(always)]
unsafe fn q2_table(b: &BlockQ2K, g: usize) -> __m128i {
    _mm_set1_epi32(((b.scales[g] & 15) as u32 * 0x0302_0100) as i32)
}

/// Q2_K: values times their group's scale (`q * s <= 45`) by a byte shuffle
/// of `[0, s, 2s, 3s]`.
#[inline(always)]
unsafe fn q2_k_row(b: &BlockQ2K, rb: &mut RowBlock) {
    for h in 0..2 {
        let v = ld(b.qs.as_ptr().add(32 * h));
        for j in 0..4 {
            let q = bits(v, 2 * j as i32, 3);
            let g = 8 * h + 2 * j;
            let t = _mm256_set_m128i(q2_table(b, g + 1), q2_table(b, g));
            st(&mut rb.q, 128 * h + 32 * j, _mm256_shuffle_epi8(t, q));
        }
    }
    rb.sd = [0.0; 16];
    rb.sd[0] = fp16(b.d);
    for g in 0..16 {
        rb.m[g] = (b.scales[g] >> 4) as i16;
    }
    rb.dm = fp16(b.dmin);
}

/// Q3_K: 3-bit values 0..8 (the scalar format's `q - 4` plus 4).
#[inline(always)]
unsafe fn q3_k_row(b: &BlockQ3K, rb: &mut RowBlock) {
    let hm = ld(b.hmask.as_ptr());
    for h in 0..2 {
        let v = ld(b.qs.as_ptr().add(32 * h));
        for j in 0..4 {
            let q = _mm256_or_si256(bits(v, 2 * j as i32, 3), up(bits(hm, (4 * h + j) as i32, 1), 2));
            st(&mut rb.q, 128 * h + 32 * j, q);
        }
    }
    let d = fp16(b.d);
    for (g, s) in q3_k::unpack_scales(&b.scales).into_iter().enumerate() {
        rb.sd[g] = d * s as f32;
        rb.m[g] = 4 * s as i16;
    }
    rb.dm = d;
}

/// Q6_K: 6-bit values 0..64 (the scalar format's `q - 32` plus 32).
#[inline(always)]
unsafe fn q6_k_row(b: &BlockQ6K, rb: &mut RowBlock) {
    for h in 0..2 {
        let (l0, l1) = (ld(b.ql.as_ptr().add(64 * h)), ld(b.ql.as_ptr().add(64 * h + 32)));
        let qh = ld(b.qh.as_ptr().add(32 * h));
        let lows = [
            _mm256_and_si256(l0, _mm256_set1_epi8(0x0F)),
            _mm256_and_si256(l1, _mm256_set1_epi8(0x0F)),
            bits(l0, 4, 0x0F),
            bits(l1, 4, 0x0F),
        ];
        for (j, lo) in lows.into_iter().enumerate() {
            let q = _mm256_or_si256(lo, up(bits(qh, 2 * j as i32, 3), 4));
            st(&mut rb.q, 128 * h + 32 * j, q);
        }
    }
    let d = fp16(b.d);
    for g in 0..16 {
        rb.sd[g] = d * b.scales[g] as f32;
        rb.m[g] = 32 * b.scales[g] as i16;
    }
    rb.dm = d;
}

/// Activations `4j..4j + 4` of `y` in every lane (a broadcast load).
#[inline(always)]
unsafe fn word(y: &BlockQ8K, j: usize) -> __m512i {
    _mm512_set1_epi32(y.qs.as_ptr().add(4 * j).cast::<i32>().read_unaligned())
}

/// `T` tokens against one decoded panel: `out[16 t + r]`. `G` values per
/// scale group (16 or 32), or the whole block when `FOLD` (Q2_K).
#[inline(always)]
unsafe fn panel_dot<const T: usize, const G: usize, const FOLD: bool>(dec: &[u8], a: &[&[BlockQ8K]], out: &mut [f32]) {
    let nb = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == nb) && dec.len() >= nb * BLOCK_BYTES && out.len() >= 16 * T);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * BLOCK_BYTES);
        let y: [&BlockQ8K; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let mut rf = [_mm512_setzero_ps(); T];
        if FOLD {
            let mut c = [_mm512_setzero_si512(); T];
            for j in 0..64 {
                let w = _mm512_loadu_si512(p.add(64 * j).cast());
                for t in 0..T {
                    c[t] = _mm512_dpbusd_epi32(c[t], w, word(y[t], j));
                }
            }
            for t in 0..T {
                rf[t] = _mm512_mul_ps(_mm512_cvtepi32_ps(c[t]), _mm512_loadu_ps(p.add(VALUES).cast()));
            }
        } else {
            for g in 0..256 / G {
                let mut c = [_mm512_setzero_si512(); T];
                for j in g * G / 4..(g + 1) * G / 4 {
                    let w = _mm512_loadu_si512(p.add(64 * j).cast());
                    for t in 0..T {
                        c[t] = _mm512_dpbusd_epi32(c[t], w, word(y[t], j));
                    }
                }
                let s = _mm512_loadu_ps(p.add(VALUES + 64 * g).cast());
                for t in 0..T {
                    rf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[t]), s, rf[t]);
                }
            }
        }
        // Minimums (or offsets) against the activations' group sums, in pairs.
        let mut m = [_mm512_setzero_si512(); T];
        for pair in 0..8 {
            let mp = _mm512_loadu_si512(p.add(VALUES + SCALES + 64 * pair).cast());
            for t in 0..T {
                let bs = _mm512_set1_epi32(y[t].bsums.as_ptr().add(2 * pair).cast::<i32>().read_unaligned());
                m[t] = _mm512_dpwssd_epi32(m[t], mp, bs);
            }
        }
        let dm = _mm512_loadu_ps(p.add(VALUES + SCALES + PAIRS).cast());
        for t in 0..T {
            let r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m[t]), dm, rf[t]);
            acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(y[t].d), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * t), acc[t]);
    }
}

/// The decoder and the panel kernel of each format, compiled for AVX-512
/// F + BW + VNNI.
macro_rules! panels {
    ($($name:ident, $decode:ident = $row:ident($block:ident), $g:literal, $fold:literal;)*) => {$(
        impl PanelBlock for $block {
            #[inline(always)]
            unsafe fn row(&self, rb: &mut RowBlock) {
                $row(self, rb)
            }
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $decode(rows: &[&[u8]], out: &mut [u8]) {
            decode_with::<$block>(rows, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $name(dec: &[u8], a: &[&[BlockQ8K]], out: &mut [f32]) {
            match a.len() {
                1 => panel_dot::<1, $g, $fold>(dec, a, out),
                2 => panel_dot::<2, $g, $fold>(dec, a, out),
                3 => panel_dot::<3, $g, $fold>(dec, a, out),
                4 => panel_dot::<4, $g, $fold>(dec, a, out),
                5 => panel_dot::<5, $g, $fold>(dec, a, out),
                6 => panel_dot::<6, $g, $fold>(dec, a, out),
                7 => panel_dot::<7, $g, $fold>(dec, a, out),
                _ => panel_dot::<8, $g, $fold>(dec, a, out),
            }
        }
    )*};
}

panels! {
    q2_k, decode_q2_k = q2_k_row(BlockQ2K), 256, true;
    q3_k, decode_q3_k = q3_k_row(BlockQ3K), 16, false;
    q4_k, decode_q4_k = q4_k_row(BlockQ4K), 32, false;
    q5_k, decode_q5_k = q5_k_row(BlockQ5K), 32, false;
    q6_k, decode_q6_k = q6_k_row(BlockQ6K), 16, false;
}

// ---- Q4_0 and Q5_0 (Q8_0 activations): one scale per 32 values ------------

const LEGACY_VALUES: usize = 8 * 64;
/// One decoded block of a Q4_0 / Q5_0 panel: values, then `d` per row.
pub(crate) const LEGACY_BLOCK_BYTES: usize = LEGACY_VALUES + 64;

/// `B`'s 16 weight rows into panel blocks: the values plus `OFF` (so
/// unsigned: Q4_0 0..16, Q5_0 0..32), `d` as f32.
#[inline(always)]
unsafe fn decode_legacy<B: Signed32 + crate::quant::FileBlock, const OFF: i8>(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[B]; HEIGHT] = std::array::from_fn(|r| as_blocks::<B>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * LEGACY_BLOCK_BYTES, "decode: row lengths differ");
    let mut q = [[0u8; 32]; HEIGHT];
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let idx = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(32));
    for b in 0..nb {
        let p = out.as_mut_ptr().add(b * LEGACY_BLOCK_BYTES);
        for r in 0..HEIGHT {
            let v = _mm256_add_epi8(x[r][b].values(), _mm256_set1_epi8(OFF));
            _mm256_storeu_si256(q[r].as_mut_ptr().cast(), v);
            let d = _mm256_cvtss_f32(x[r][b].scale_x8());
            p.add(LEGACY_VALUES + 4 * r).cast::<f32>().write_unaligned(d);
        }
        for j in 0..8 {
            let v = _mm512_i32gather_epi32::<1>(idx, q.as_ptr().cast::<u8>().add(4 * j).cast());
            _mm512_storeu_si512(p.add(64 * j).cast(), v);
        }
    }
}

/// `T` tokens against one decoded Q4_0 / Q5_0 panel: `out[16 t + r]`.
#[inline(always)]
unsafe fn legacy_dot<const T: usize, const OFF: i32>(dec: &[u8], a: &[&[BlockQ8_0F]], out: &mut [f32]) {
    let nb = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == nb) && dec.len() >= nb * LEGACY_BLOCK_BYTES);
    assert!(out.len() >= 16 * T);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * LEGACY_BLOCK_BYTES);
        let y: [&BlockQ8_0F; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        // The offset times the activations' sum, taken off before the sums.
        let mut c: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(-OFF * y[t].s));
        for j in 0..8 {
            let w = _mm512_loadu_si512(p.add(64 * j).cast());
            for t in 0..T {
                c[t] = _mm512_dpbusd_epi32(
                    c[t],
                    w,
                    _mm512_set1_epi32(y[t].qs.as_ptr().add(4 * j).cast::<i32>().read_unaligned()),
                );
            }
        }
        let d = _mm512_loadu_ps(p.add(LEGACY_VALUES).cast());
        for t in 0..T {
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[t]), _mm512_mul_ps(d, _mm512_set1_ps(y[t].d)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * t), acc[t]);
    }
}

macro_rules! legacy_panels {
    ($($name:ident, $decode:ident = $block:ident, $off:literal;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $decode(rows: &[&[u8]], out: &mut [u8]) {
            decode_legacy::<$block, $off>(rows, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $name(dec: &[u8], a: &[&[BlockQ8_0F]], out: &mut [f32]) {
            match a.len() {
                1 => legacy_dot::<1, $off>(dec, a, out),
                2 => legacy_dot::<2, $off>(dec, a, out),
                3 => legacy_dot::<3, $off>(dec, a, out),
                4 => legacy_dot::<4, $off>(dec, a, out),
                5 => legacy_dot::<5, $off>(dec, a, out),
                6 => legacy_dot::<6, $off>(dec, a, out),
                7 => legacy_dot::<7, $off>(dec, a, out),
                _ => legacy_dot::<8, $off>(dec, a, out),
            }
        }
    )*};
}

legacy_panels! {
    q4_0, decode_q4_0 = BlockQ4_0, 8;
    q5_0, decode_q5_0 = BlockQ5_0, 16;
}

/// The panels of every K-quant and of Q4_0 / Q5_0, for the AVX-512 VNNI table.
pub(crate) fn install(k: &mut crate::kernels::table::Kernels) {
    use crate::kernels::table::{PanelDot, Panels};
    type Decode = unsafe fn(&[&[u8]], &mut [u8]);
    let p = |decode: Decode, dot: PanelDot<BlockQ8K>| {
        Some(Panels { height: HEIGHT, block_bytes: BLOCK_BYTES, min_acts: MIN_ACTS, acts: ACTS, decode, dot })
    };
    k.q2_k.panels = p(decode_q2_k, q2_k);
    k.q3_k.panels = p(decode_q3_k, q3_k);
    k.q4_k.panels = p(decode_q4_k, q4_k);
    k.q5_k.panels = p(decode_q5_k, q5_k);
    k.q6_k.panels = p(decode_q6_k, q6_k);
    let l = |decode: Decode, dot: PanelDot<BlockQ8_0F>| {
        Some(Panels { height: HEIGHT, block_bytes: LEGACY_BLOCK_BYTES, min_acts: MIN_ACTS, acts: ACTS, decode, dot })
    };
    k.q4_0.panels = l(decode_q4_0, q4_0);
    k.q5_0.panels = l(decode_q5_0, q5_0);
}
