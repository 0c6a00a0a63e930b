//! AVX2 dot products of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
//! with Q8_0 / Q8_1 activations. One 256-bit register holds a block; two
//! blocks per iteration keep two FMA chains in flight.

use super::{dot_i8, dot_u8i8, fp16, hsum_ps, load32, paths};
use crate::quant::{as_blocks, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use std::arch::x86_64::*;

paths! {
    q4_0 = dot_q4_0(BlockQ8_0);
    q4_1 = dot_q4_1(BlockQ8_1);
    q5_0 = dot_q5_0(BlockQ8_0);
    q5_1 = dot_q5_1(BlockQ8_1);
    q8_0 = dot_q8_0(BlockQ8_0);
}

/// 16 bytes of nibbles -> 32 bytes: low nibbles (values 0..16) then high ones.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let b = _mm_loadu_si128(qs.as_ptr().cast());
    let both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The 32 bits of `qh` spread to one byte each: 0xFF where the bit is set.
#[inline(always)]
unsafe fn bits_to_bytes(qh: [u8; 4]) -> __m256i {
    // Byte i takes source byte i/8 ...
    let v = _mm256_set1_epi32(i32::from_le_bytes(qh));
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    // ... and keeps only its bit i%8: OR in every other bit, compare with all-ones.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

#[inline(always)]
unsafe fn dot_q8_0<const V: u8>(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let x = as_blocks::<BlockQ8_0>(w);
    debug_assert_eq!(x.len(), a.len());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut pairs = x.chunks_exact(2).zip(a.chunks_exact(2));
    for (xp, yp) in &mut pairs {
        let s0 =
            dot_i8::<V>(_mm256_setzero_si256(), load32(xp[0].qs.as_ptr().cast()), load32(yp[0].qs.as_ptr().cast()));
        let s1 =
            dot_i8::<V>(_mm256_setzero_si256(), load32(xp[1].qs.as_ptr().cast()), load32(yp[1].qs.as_ptr().cast()));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(xp[0].d) * fp16(yp[0].d)), _mm256_cvtepi32_ps(s0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(xp[1].d) * fp16(yp[1].d)), _mm256_cvtepi32_ps(s1), acc1);
    }
    if x.len() % 2 == 1 {
        let (xb, yb) = (&x[x.len() - 1], &a[a.len() - 1]);
        let s = dot_i8::<V>(_mm256_setzero_si256(), load32(xb.qs.as_ptr().cast()), load32(yb.qs.as_ptr().cast()));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(xb.d) * fp16(yb.d)), _mm256_cvtepi32_ps(s), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// Shared loop of the formats with a single scale per block and Q8_0
/// activations: `signed(block)` yields the 32 signed values of a weight block.
#[inline(always)]
unsafe fn dot_signed<B, const V: u8>(
    x: &[B],
    a: &[BlockQ8_0],
    scale: impl Fn(&B) -> F16,
    signed: impl Fn(&B) -> __m256i,
) -> f32 {
    debug_assert_eq!(x.len(), a.len());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut pairs = x.chunks_exact(2).zip(a.chunks_exact(2));
    for (xp, yp) in &mut pairs {
        let s0 = dot_i8::<V>(_mm256_setzero_si256(), signed(&xp[0]), load32(yp[0].qs.as_ptr().cast()));
        let s1 = dot_i8::<V>(_mm256_setzero_si256(), signed(&xp[1]), load32(yp[1].qs.as_ptr().cast()));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(scale(&xp[0])) * fp16(yp[0].d)), _mm256_cvtepi32_ps(s0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(scale(&xp[1])) * fp16(yp[1].d)), _mm256_cvtepi32_ps(s1), acc1);
    }
    if x.len() % 2 == 1 {
        let (xb, yb) = (&x[x.len() - 1], &a[a.len() - 1]);
        let s = dot_i8::<V>(_mm256_setzero_si256(), signed(xb), load32(yb.qs.as_ptr().cast()));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(scale(xb)) * fp16(yb.d)), _mm256_cvtepi32_ps(s), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

type F16 = crate::quant::F16Bytes;

#[inline(always)]
unsafe fn dot_q4_0<const V: u8>(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    dot_signed::<BlockQ4_0, V>(
        as_blocks(w),
        a,
        |b| b.d,
        // nibble - 8
        |b| _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8)),
    )
}

#[inline(always)]
unsafe fn dot_q5_0<const V: u8>(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    dot_signed::<BlockQ5_0, V>(
        as_blocks(w),
        a,
        |b| b.d,
        // q - 16 = nibble where the fifth bit is set, nibble | 0xF0 (nibble - 16) where it is clear.
        |b| _mm256_or_si256(nibbles(&b.qs), _mm256_andnot_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(-16))),
    )
}

/// Shared loop of the formats with a scale and a minimum per block (Q8_1
/// activations): `unsigned(block)` yields the 32 unsigned values.
#[inline(always)]
unsafe fn dot_unsigned<B, const V: u8>(
    x: &[B],
    a: &[BlockQ8_1],
    dm: impl Fn(&B) -> (F16, F16),
    unsigned: impl Fn(&B) -> __m256i,
) -> f32 {
    debug_assert_eq!(x.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = 0.0f32;
    for (xb, yb) in x.iter().zip(a) {
        let (d, m) = dm(xb);
        let s = dot_u8i8::<V>(_mm256_setzero_si256(), unsigned(xb), load32(yb.qs.as_ptr().cast()));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(d) * fp16(yb.d)), _mm256_cvtepi32_ps(s), acc);
        // The minimum meets the activation sum, precomputed in the Q8_1 block.
        acc_m += fp16(m) * fp16(yb.s);
    }
    hsum_ps(acc) + acc_m
}

#[inline(always)]
unsafe fn dot_q4_1<const V: u8>(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    dot_unsigned::<BlockQ4_1, V>(as_blocks(w), a, |b| (b.d, b.m), |b| nibbles(&b.qs))
}

#[inline(always)]
unsafe fn dot_q5_1<const V: u8>(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    dot_unsigned::<BlockQ5_1, V>(
        as_blocks(w),
        a,
        |b| (b.d, b.m),
        // nibble + 16 * fifth bit
        |b| _mm256_or_si256(nibbles(&b.qs), _mm256_and_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(0x10))),
    )
}
