//! AVX2 activation quantiser: Q8_K (the K-quants' activations), equal to the
//! bit to [`crate::quant::q8_k::quantize_row_q8_k`].

use crate::quant::q8_k::{inverse_scale, BlockQ8K};
use crate::quant::QK_K;
use std::arch::x86_64::*;

/// [`crate::quant::q8_k::quantize_row_q8_k`], 32 values per step: the
/// minimum and maximum with `vminps` / `vmaxps` (the running value second, so
/// a NaN yields it: NaNs ignored, as by `f32::min` / `max`), products rounded
/// half to even by `vcvtps2dq` (the default rounding mode; NaNs zeroed first,
/// as the scalar cast does), narrowed with signed saturation (the scalar
/// clamp at 127; no value reaches -128) and each group of 16 summed with
/// `vpsadbw` on the bytes biased by 128.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let p = xb.as_ptr();
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2]);
        for i in (0..QK_K).step_by(16) {
            let (a, b) = (_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(p.add(i + 8)));
            lo = [_mm256_min_ps(a, lo[0]), _mm256_min_ps(b, lo[1])];
            hi = [_mm256_max_ps(a, hi[0]), _mm256_max_ps(b, hi[1])];
        }
        let Some(iscale) = inverse_scale(xb, hmin(_mm256_min_ps(lo[0], lo[1])), hmax(_mm256_max_ps(hi[0], hi[1])))
        else {
            *yb = BlockQ8K::default();
            continue;
        };
        let s = _mm256_set1_ps(iscale);
        // packs interleave 128-bit lanes: put the 4-byte groups back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let bias = _mm256_set1_epi8(-128);
        for c in 0..QK_K / 32 {
            let i = |k: usize| {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(32 * c + 8 * k)), s);
                _mm256_cvtps_epi32(_mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v)))
            };
            let (w0, w1) = (_mm256_packs_epi32(i(0), i(1)), _mm256_packs_epi32(i(2), i(3)));
            let q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w0, w1), order);
            _mm256_storeu_si256(yb.qs.as_mut_ptr().add(32 * c).cast(), q);
            // Sums of 8 bytes, each biased by 128, in the four 64-bit lanes.
            let sums = _mm256_sad_epu8(_mm256_xor_si256(q, bias), _mm256_setzero_si256());
            let [a, b] = lane_pair_sums(sums);
            yb.bsums[2 * c] = (a - 16 * 128) as i16;
            yb.bsums[2 * c + 1] = (b - 16 * 128) as i16;
        }
        yb.d = 1.0 / iscale;
    }
}

/// Smallest lane of `v` (no NaNs).
#[inline(always)]
unsafe fn hmin(v: __m256) -> f32 {
    let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_min_ss(m, _mm_movehdup_ps(m)))
}

/// Largest lane of `v` (no NaNs).
#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// `[lane 0 + lane 1, lane 2 + lane 3]` of four 64-bit lanes.
#[inline(always)]
unsafe fn lane_pair_sums(v: __m256i) -> [i64; 2] {
    let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    [_mm_cvtsi128_si64(lo) + _mm_extract_epi64::<1>(lo), _mm_cvtsi128_si64(hi) + _mm_extract_epi64::<1>(hi)]
}
