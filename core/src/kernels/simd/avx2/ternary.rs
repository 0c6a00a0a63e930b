//! AVX2 dot products of the ternary formats TQ1_0 and TQ2_0 with Q8_K
//! activations.
//!
//! Both unpack each block into eight registers of 32 stored trits (0..=2,
//! TQ2_0's unused 3 included), in the order of the activations, and dot them
//! unsigned with the signed activations; `sum (t - 1) y` is then
//! `sum t y - sum y`, the activation sum coming from the Q8_K block's group
//! sums. TQ1_0's digits come from its base-3 fractions without a multiply:
//! `3^k q mod 256` by repeated byte-wise tripling (`q + q + q` wraps as the
//! reference's `uint8_t` product does), the digit `((3 q) >> 8)` as two
//! unsigned compares (`q >= 86`, `q >= 171`).

use super::{dot_u8i8, fp16, hsum_ps, load32, paths, prefetch_ahead};
use crate::quant::{as_blocks, BlockQ8K, BlockTQ1_0, BlockTQ2_0, FileBlock};
use std::arch::x86_64::*;

paths! {
    tq1_0 = dot_tq1_0(BlockQ8K);
    tq2_0 = dot_tq2_0(BlockQ8K);
}

/// Group `g`'s 32 activations of a Q8_K block.
#[inline(always)]
unsafe fn acts(y: &BlockQ8K, g: usize) -> __m256i {
    load32(y.qs.as_ptr().add(32 * g).cast())
}

/// The sum of a Q8_K block's 256 activations, spread over 8 i32 lanes.
#[inline(always)]
unsafe fn act_sums(y: &BlockQ8K) -> __m256i {
    _mm256_madd_epi16(_mm256_loadu_si256(y.bsums.as_ptr().cast()), _mm256_set1_epi16(1))
}

/// `q * 3` in every byte, modulo 256.
#[inline(always)]
unsafe fn triple(q: __m256i) -> __m256i {
    _mm256_add_epi8(q, _mm256_add_epi8(q, q))
}

/// 0xFF in the bytes where `q >= c` (unsigned).
#[inline(always)]
unsafe fn at_least(q: __m256i, c: u8) -> __m256i {
    _mm256_cmpeq_epi8(_mm256_max_epu8(q, _mm256_set1_epi8(c as i8)), q)
}

/// The leading base-3 digit `(3 q) >> 8` of every byte: 0, 1 or 2.
#[inline(always)]
unsafe fn digit(q: __m256i) -> __m256i {
    // two 0 / -1 masks, negated
    _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(at_least(q, 86), at_least(q, 171)))
}

/// The eight registers of a TQ1_0 block's stored trits, values `32 g..32 g + 32`.
#[inline(always)]
unsafe fn trits_tq1(x: &BlockTQ1_0) -> [__m256i; 8] {
    // qs[0..32]: digit k of byte m is value 32 k + m.
    let mut a = [load32(x.qs.as_ptr()); 5];
    for k in 1..5 {
        a[k] = triple(a[k - 1]);
    }
    // qs[32..48] in both halves: digit k of byte m is value 160 + 16 k + m.
    let mut b = [_mm256_broadcastsi128_si256(_mm_loadu_si128(x.qs.as_ptr().add(32).cast())); 5];
    for k in 1..5 {
        b[k] = triple(b[k - 1]);
    }
    // qh's four bytes repeated: digit k of byte j is value 240 + 4 k + j.
    let mut h = [_mm256_set1_epi32(i32::from_le_bytes(x.qh)); 4];
    for k in 1..4 {
        h[k] = triple(h[k - 1]);
    }
    // values 224..256: b's fifth digit, then qh's digits by 32-bit lanes
    let mut last = _mm256_blend_epi32::<0x10>(b[4], h[0]);
    last = _mm256_blend_epi32::<0x20>(last, h[1]);
    last = _mm256_blend_epi32::<0x40>(last, h[2]);
    last = _mm256_blend_epi32::<0x80>(last, h[3]);
    [
        digit(a[0]),
        digit(a[1]),
        digit(a[2]),
        digit(a[3]),
        digit(a[4]),
        digit(_mm256_blend_epi32::<0xF0>(b[0], b[1])),
        digit(_mm256_blend_epi32::<0xF0>(b[2], b[3])),
        digit(last),
    ]
}

/// The eight registers of a TQ2_0 block's stored 2-bit values.
#[inline(always)]
unsafe fn trits_tq2(x: &BlockTQ2_0) -> [__m256i; 8] {
    let (l, h) = (pairs(load32(x.qs.as_ptr())), pairs(load32(x.qs.as_ptr().add(32))));
    [l[0], l[1], l[2], l[3], h[0], h[1], h[2], h[3]]
}

/// Bits `2l..2l + 2` of every byte, l = 0..4.
#[inline(always)]
unsafe fn pairs(q: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(q), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(q), m),
    ]
}

/// A ternary block: its size, and its trits and scale unpacked.
trait Ternary: Copy {
    const SIZE: usize;
    unsafe fn unpack(&self) -> ([__m256i; 8], f32);
}

impl Ternary for BlockTQ1_0 {
    const SIZE: usize = 54;
    #[inline(always)]
    unsafe fn unpack(&self) -> ([__m256i; 8], f32) {
        (trits_tq1(self), fp16(self.d))
    }
}

impl Ternary for BlockTQ2_0 {
    const SIZE: usize = 66;
    #[inline(always)]
    unsafe fn unpack(&self) -> ([__m256i; 8], f32) {
        (trits_tq2(self), fp16(self.d))
    }
}

/// `sum (t - 1) y` per block, scaled: the loop both formats share.
#[inline(always)]
unsafe fn dot_ternary<B: Ternary + FileBlock, const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<B>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const B).cast(), B::SIZE);
        let (t, d) = xb.unpack();
        for n in 0..N {
            let y = &a[n][i];
            // t . y (t <= 3, |y| <= 127: pair sums fit i16), less sum y
            let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), act_sums(y));
            for (g, &tg) in t.iter().enumerate() {
                sumi = dot_u8i8::<V>(sumi, tg, acts(y, g));
            }
            acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[n]);
        }
    }
    let mut out = [0.0f32; N];
    for n in 0..N {
        out[n] = hsum_ps(acc[n]);
    }
    out
}

#[inline(always)]
unsafe fn dot_tq1_0<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_ternary::<BlockTQ1_0, V, N>(w, a)
}

#[inline(always)]
unsafe fn dot_tq2_0<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_ternary::<BlockTQ2_0, V, N>(w, a)
}
