//! AVX2 dot products of the IQ1 / IQ2 formats (IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ1_S, IQ1_M) with Q8_K activations.
//!
//! One body serves all five: each format turns 32 weights into a register
//! of unsigned magnitudes, a register of signs and the i16 scales `2s + 1`
//! of its two groups of 16 ([`IqBlock::chunk`]); the activations take the
//! signs (`vpsignb`), `vpmaddubsw` multiplies them with the magnitudes into
//! i16 pairs, and the scales multiply-add those into i32 lanes. Grid rows
//! are 8 bytes each, so four table loads fill a register. For IQ2 the
//! magnitudes are the grid bytes (<= 43) and the signs its sign bits; for
//! IQ1 the signed weight `8 * grid + delta` (|v| <= 9) is its own sign.
//! The integers are the scalar twin's exactly; per block
//! `d * d_y * sum`, and 1/8 at the end (see `quant::iq`).

use super::{dot_i16, fp16, hsum_ps, load32, paths, prefetch_ahead};
use crate::quant::iq::{KSIGN_BYTES, SIGN_BYTES};
use crate::quant::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use crate::quant::{
    as_blocks, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS,
    BlockQ8K, FileBlock,
};
use std::arch::x86_64::*;

paths! {
    iq2_xxs = dot_iq2_xxs(BlockQ8K);
    iq2_xs = dot_iq2_xs(BlockQ8K);
    iq2_s = dot_iq2_s(BlockQ8K);
    iq1_s = dot_iq1_s(BlockQ8K);
    iq1_m = dot_iq1_m(BlockQ8K);
}

/// A block of one of the formats, as the common body sees it.
trait IqBlock: FileBlock {
    /// The super-block scale.
    unsafe fn d(&self) -> f32;
    /// Weights `32c..32c + 32`: (magnitudes, signs, i16 scales: the first
    /// group's in the low 128-bit half, the second's in the high half).
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i, __m256i);
}

/// Four 8-byte table rows, the first in the lowest bytes.
#[inline(always)]
unsafe fn table_rows(t: &[u64], i: [usize; 4]) -> __m256i {
    _mm256_set_epi64x(t[i[3]] as i64, t[i[2]] as i64, t[i[1]] as i64, t[i[0]] as i64)
}

/// The i16 scales `2s + 1` of two groups of 16 (`s0` first).
#[inline(always)]
unsafe fn scales(s0: u32, s1: u32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16((2 * s1 + 1) as i16), _mm_set1_epi16((2 * s0 + 1) as i16))
}

/// IQ1 weights `8 * grid + delta` from grid rows (bytes -1, 0, 1) and the
/// deltas (+-1 in every byte of a row): their magnitudes, and themselves as
/// the signs.
#[inline(always)]
unsafe fn iq1_weights(grid: __m256i, delta: __m256i) -> (__m256i, __m256i) {
    // 8 * grid (grid is -1, 0 or +1), plus the delta
    let v = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), delta);
    (_mm256_abs_epi8(v), v)
}

impl IqBlock for BlockIQ2XXS {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i, __m256i) {
        let (idx, aux) = iq2_xxs::group(self, c);
        let mag = table_rows(&IQ2XXS_GRID, idx.map(usize::from));
        let signs = table_rows(&KSIGN_BYTES, [0, 7, 14, 21].map(|s| (aux >> s & 127) as usize));
        (mag, signs, _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16))
    }
}

impl IqBlock for BlockIQ2XS {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i, __m256i) {
        let r: [(usize, u8); 4] = std::array::from_fn(|l| iq2_xs::row(self, 4 * c + l));
        let mag = table_rows(&IQ2XS_GRID, r.map(|r| r.0));
        let signs = table_rows(&SIGN_BYTES, r.map(|r| r.1 as usize));
        let s = self.scales[c] as u32;
        (mag, signs, scales(s & 0xF, s >> 4))
    }
}

impl IqBlock for BlockIQ2S {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i, __m256i) {
        let r: [(usize, u8); 4] = std::array::from_fn(|l| iq2_s::row(self, 4 * c + l));
        let mag = table_rows(&IQ2S_GRID, r.map(|r| r.0));
        let signs = table_rows(&SIGN_BYTES, r.map(|r| r.1 as usize));
        let s = self.scales[c] as u32;
        (mag, signs, scales(s & 0xF, s >> 4))
    }
}

impl IqBlock for BlockIQ1S {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i, __m256i) {
        let h = iq1_s::qh(self, c);
        let grid = table_rows(&IQ1S_GRID, std::array::from_fn(|l| iq1_s::index(self, 4 * c + l)));
        let delta = _mm256_set1_epi8(if h & 0x8000 != 0 { -1 } else { 1 });
        let (mag, signs) = iq1_weights(grid, delta);
        (mag, signs, _mm256_set1_epi16((2 * (h >> 12 & 7) + 1) as i16))
    }
}

impl IqBlock for BlockIQ1M {
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        iq1_m::d(self)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> (__m256i, __m256i, __m256i) {
        let r: [(usize, i8); 4] = std::array::from_fn(|l| iq1_m::row(self, 4 * c + l));
        let grid = table_rows(&IQ1S_GRID, r.map(|r| r.0));
        // each row's delta in all 8 of its bytes
        let splat = |d: i8| (d as u8 as u64 * 0x0101_0101_0101_0101) as i64;
        let delta = _mm256_set_epi64x(splat(r[3].1), splat(r[2].1), splat(r[1].1), splat(r[0].1));
        let (mag, signs) = iq1_weights(grid, delta);
        let w = u16::from_le_bytes([self.scales[c / 2 * 2], self.scales[c / 2 * 2 + 1]]) as u32;
        let sh = 6 * (c % 2) as u32;
        (mag, signs, scales(w >> sh & 7, w >> (sh + 3) & 7))
    }
}

/// The common body: one weight row with `N` activation rows.
#[inline(always)]
unsafe fn dot_iq<B: IqBlock, const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<B>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const B).cast(), size_of::<B>());
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..8 {
            let (mag, signs, sc) = xb.chunk(c);
            for n in 0..N {
                // activations with the weights' signs, times the magnitudes
                let q = _mm256_sign_epi8(load32(a[n][i].qs.as_ptr().add(32 * c).cast()), signs);
                sumi[n] = dot_i16::<V>(sumi[n], _mm256_maddubs_epi16(mag, q), sc);
            }
        }
        let d = xb.d();
        for n in 0..N {
            acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[n][i].d), _mm256_cvtepi32_ps(sumi[n]), acc[n]);
        }
    }
    acc.map(|v| 0.125 * hsum_ps(v))
}

#[inline(always)]
unsafe fn dot_iq2_xxs<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ2XXS, V, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq2_xs<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ2XS, V, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq2_s<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ2S, V, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq1_s<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ1S, V, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq1_m<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ1M, V, N>(w, a)
}
