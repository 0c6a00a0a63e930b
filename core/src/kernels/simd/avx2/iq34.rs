//! AVX2 dot products of the non-linear and grid formats: IQ4_NL and MXFP4
//! (with Q8_0 activations), IQ4_XS, IQ3_XXS and IQ3_S (with Q8_K).
//!
//! IQ4_NL, IQ4_XS and MXFP4 map 4-bit indices through a 16-entry table of
//! int8 values with one `vpshufb`; the signed weights meet the signed
//! activations as `|w| * (y with w's sign)` so that the unsigned-by-signed
//! product instructions apply (|w|, |y| <= 127: pair sums fit i16). The IQ3
//! formats gather four unsigned grid values per index (at most 62) and put
//! each value's sign on the activation instead (`(y ^ m) - m`, `m` = 0xFF
//! where negative). Group scales multiply the i16 pair sums into i32 lanes.

use super::{dot_i16, dot_u8i8, fp16, hsum_ps, load32, paths, prefetch_ahead};
use crate::quant::iq4::KVALUES_IQ4NL;
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4};
use crate::quant::{
    as_blocks, iq3_s, iq3_xxs, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ8K, BlockQ8_0F,
};
use std::arch::x86_64::*;

paths! {
    iq4_nl = dot_iq4_nl(BlockQ8_0F);
    mxfp4 = dot_mxfp4(BlockQ8_0F);
    iq4_xs = dot_iq4_xs(BlockQ8K);
    iq3_xxs = dot_iq3_xxs(BlockQ8K);
    iq3_s = dot_iq3_s(BlockQ8K);
}

/// A 16-entry int8 table in both 128-bit halves, for `vpshufb`.
#[inline(always)]
unsafe fn table(t: &[i8; 16]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast()))
}

/// 16 bytes of nibbles through `table`: 32 signed values, the low nibbles'
/// first (the 16 bytes go to both halves; the high half is shifted down 4).
#[inline(always)]
unsafe fn lookup(table: __m256i, qs: &[u8; 16]) -> __m256i {
    let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr().cast()));
    let idx = _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
    _mm256_shuffle_epi8(table, idx)
}

/// The 32 bits of `bits` spread to one byte each: 0xFF where the bit is set
/// (byte `i` of the 32 tests bit `i`).
#[inline(always)]
unsafe fn sign_masks(bits: u32) -> __m256i {
    const BYTE_BITS: i64 = 0x8040_2010_0804_0201_u64 as i64;
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let b = _mm256_and_si256(spread, _mm256_set1_epi64x(BYTE_BITS));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(BYTE_BITS))
}

/// `y` negated where `m` is 0xFF (activations are within +-127).
#[inline(always)]
unsafe fn negate_where(y: __m256i, m: __m256i) -> __m256i {
    _mm256_sub_epi8(_mm256_xor_si256(y, m), m)
}

/// Eight grid points (four bytes each) as one register.
#[inline(always)]
unsafe fn gather8(p: [u32; 8]) -> __m256i {
    _mm256_set_epi32(
        p[7] as i32,
        p[6] as i32,
        p[5] as i32,
        p[4] as i32,
        p[3] as i32,
        p[2] as i32,
        p[1] as i32,
        p[0] as i32,
    )
}

/// The lane sums of `N` accumulators.
#[inline(always)]
unsafe fn hsums<const N: usize>(acc: [__m256; N], scale: f32) -> [f32; N] {
    let mut out = [0.0f32; N];
    for n in 0..N {
        out[n] = scale * hsum_ps(acc[n]);
    }
    out
}

// ---- 32-element blocks with a 16-entry table, Q8_0 activations -----------

/// A block of 32 table indices with one float scale.
trait Lut32 {
    const SIZE: usize;
    fn table() -> &'static [i8; 16];
    fn qs(&self) -> &[u8; 16];
    unsafe fn scale(&self) -> f32;
}

impl Lut32 for BlockIQ4NL {
    const SIZE: usize = 18;
    fn table() -> &'static [i8; 16] {
        &KVALUES_IQ4NL
    }
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        fp16(self.d)
    }
}

impl Lut32 for BlockMXFP4 {
    const SIZE: usize = 17;
    fn table() -> &'static [i8; 16] {
        &KVALUES_MXFP4
    }
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        e8m0_to_f32_half(self.e)
    }
}

#[inline(always)]
unsafe fn dot_lut32<B: Lut32 + crate::quant::FileBlock, const V: u8, const N: usize>(
    w: &[u8],
    a: [&[BlockQ8_0F]; N],
) -> [f32; N] {
    let x = as_blocks::<B>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let t = table(B::table());
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const B).cast(), B::SIZE);
        let v = lookup(t, xb.qs());
        let u = _mm256_abs_epi8(v);
        let d = xb.scale();
        for n in 0..N {
            let y = &a[n][i];
            // |w| * (y with the sign of w)
            let p = dot_u8i8::<V>(_mm256_setzero_si256(), u, _mm256_sign_epi8(load32(y.qs.as_ptr().cast()), v));
            acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(p), acc[n]);
        }
    }
    hsums(acc, 1.0)
}

#[inline(always)]
unsafe fn dot_iq4_nl<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_lut32::<BlockIQ4NL, V, N>(w, a)
}

#[inline(always)]
unsafe fn dot_mxfp4<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_lut32::<BlockMXFP4, V, N>(w, a)
}

// ---- super-blocks of 256, Q8_K activations ---------------------------------

/// Group `g`'s 32 activations of a Q8_K block.
#[inline(always)]
unsafe fn acts(y: &BlockQ8K, g: usize) -> __m256i {
    load32(y.qs.as_ptr().add(32 * g).cast())
}

/// `acc[n] + dx * y_n.d * sumi[n]` for block `i` of every activation row.
#[inline(always)]
unsafe fn add_scaled<const N: usize>(
    acc: &mut [__m256; N],
    sumi: [__m256i; N],
    dx: f32,
    a: &[&[BlockQ8K]; N],
    i: usize,
) {
    for n in 0..N {
        acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(dx * a[n][i].d), _mm256_cvtepi32_ps(sumi[n]), acc[n]);
    }
}

#[inline(always)]
unsafe fn dot_iq4_xs<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockIQ4XS>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let t = table(&KVALUES_IQ4NL);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockIQ4XS).cast(), 136);
        let mut sumi = [_mm256_setzero_si256(); N];
        for g in 0..8 {
            let v = lookup(t, &*xb.qs.as_ptr().add(16 * g).cast::<[u8; 16]>());
            let u = _mm256_abs_epi8(v);
            let s = _mm256_set1_epi16(xb.scale(g) as i16);
            for n in 0..N {
                let y = _mm256_sign_epi8(acts(&a[n][i], g), v);
                // pair sums of |w| * signed y, times the group scale
                sumi[n] = dot_i16::<V>(sumi[n], _mm256_maddubs_epi16(u, y), s);
            }
        }
        add_scaled(&mut acc, sumi, fp16(xb.d), &a, i);
    }
    hsums(acc, 1.0)
}

#[inline(always)]
unsafe fn dot_iq3_xxs<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockIQ3XXS>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockIQ3XXS).cast(), 98);
        let mut sumi = [_mm256_setzero_si256(); N];
        for g in 0..8 {
            let aux = xb.aux(g);
            let idx = &xb.grid[8 * g..8 * g + 8];
            let q = gather8(std::array::from_fn(|k| iq3_xxs::GRID[idx[k] as usize]));
            // four 7-bit sign indices -> 32 sign bits -> byte masks
            let signs = u32::from_le_bytes(std::array::from_fn(|l| iq3_xxs::signs8(aux >> (7 * l))));
            let m = sign_masks(signs);
            let s = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
            for n in 0..N {
                let y = negate_where(acts(&a[n][i], g), m);
                sumi[n] = dot_i16::<V>(sumi[n], _mm256_maddubs_epi16(q, y), s);
            }
        }
        add_scaled(&mut acc, sumi, fp16(xb.d), &a, i);
    }
    hsums(acc, 0.25)
}

#[inline(always)]
unsafe fn dot_iq3_s<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockIQ3S>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockIQ3S).cast(), 110);
        let mut sumi = [_mm256_setzero_si256(); N];
        for g in 0..8 {
            let (qs, qh) = (&xb.qs[8 * g..8 * g + 8], xb.qh[g] as usize);
            // 9-bit indices: a byte of qs and bit k of qh
            let q = gather8(std::array::from_fn(|k| iq3_s::GRID[qs[k] as usize | ((qh >> k) & 1) << 8]));
            let sg = &xb.signs[4 * g..4 * g + 4];
            let m = sign_masks(u32::from_le_bytes([sg[0], sg[1], sg[2], sg[3]]));
            let s = _mm256_set1_epi16(xb.scale(g) as i16);
            for n in 0..N {
                let y = negate_where(acts(&a[n][i], g), m);
                sumi[n] = dot_i16::<V>(sumi[n], _mm256_maddubs_epi16(q, y), s);
            }
        }
        add_scaled(&mut acc, sumi, fp16(xb.d), &a, i);
    }
    hsums(acc, 1.0)
}
