//! Mamba2's selective-scan step ([`crate::kernels::ops::ssm_scan`]) on AVX2
//! and AVX-512: each state row is read, decayed, given its rank-one update,
//! stored and dotted with `c` in one pass, sixteen columns at a time, in the
//! lanes and order of the scalar twin
//! ([`crate::kernels::scalar::ssm_scan`]): lane `l` of the
//! dot product sums the columns `j ≡ l` mod 16, then the lanes are added in
//! halves (16 -> 8 -> 4 -> 2 -> 1), then the last `len % 16` columns.

use crate::kernels::scalar::SCAN_LANES;
use std::arch::x86_64::*;

/// Lanes 0..4 of `x` summed as the scalar twin's last steps: `l + l+2`, then `0 + 1`.
#[inline(always)]
unsafe fn sum4(x: __m128) -> f32 {
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// The tail of a row past the full lanes, one column at a time (scalar twin's order).
#[inline(always)]
fn tail(row: &mut [f32], decay: f32, xd: f32, b: &[f32], c: &[f32], mut sum: f32) -> f32 {
    for ((sv, &bv), &cv) in row.iter_mut().zip(b).zip(c) {
        *sv = *sv * decay + bv * xd;
        sum = sv.mul_add(cv, sum);
    }
    sum
}

/// Two registers of eight lanes (lanes 0-7 and 8-15 of the scalar twin).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn ssm_scan(s: &mut [f32], decay: f32, dt: f32, x: &[f32], b: &[f32], c: &[f32], y: &mut [f32]) {
    let ds = b.len();
    if ds == 0 {
        y.fill(0.0);
        return;
    }
    let full = ds / SCAN_LANES * SCAN_LANES;
    let g = _mm256_set1_ps(decay);
    let (bp, cp) = (b.as_ptr(), c.as_ptr());
    for ((row, &xi), y) in s.chunks_exact_mut(ds).zip(x).zip(y.iter_mut()) {
        let xd = xi * dt;
        let xv = _mm256_set1_ps(xd);
        let sp = row.as_mut_ptr();
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in (0..full).step_by(SCAN_LANES) {
            // s = s * decay + b * x dt (unfused), stored; acc += s * c.
            let s0 = _mm256_add_ps(
                _mm256_mul_ps(_mm256_loadu_ps(sp.add(j)), g),
                _mm256_mul_ps(_mm256_loadu_ps(bp.add(j)), xv),
            );
            let s1 = _mm256_add_ps(
                _mm256_mul_ps(_mm256_loadu_ps(sp.add(j + 8)), g),
                _mm256_mul_ps(_mm256_loadu_ps(bp.add(j + 8)), xv),
            );
            _mm256_storeu_ps(sp.add(j), s0);
            _mm256_storeu_ps(sp.add(j + 8), s1);
            lo = _mm256_fmadd_ps(s0, _mm256_loadu_ps(cp.add(j)), lo);
            hi = _mm256_fmadd_ps(s1, _mm256_loadu_ps(cp.add(j + 8)), hi);
        }
        // 16 -> 8 -> 4 lanes, then 4 -> 1.
        let v8 = _mm256_add_ps(lo, hi);
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        *y = tail(&mut row[full..], decay, xd, &b[full..], &c[full..], sum4(v4));
    }
}

/// One register of sixteen lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) unsafe fn ssm_scan_zmm(s: &mut [f32], decay: f32, dt: f32, x: &[f32], b: &[f32], c: &[f32], y: &mut [f32]) {
    let ds = b.len();
    if ds == 0 {
        y.fill(0.0);
        return;
    }
    let full = ds / SCAN_LANES * SCAN_LANES;
    let g = _mm512_set1_ps(decay);
    let (bp, cp) = (b.as_ptr(), c.as_ptr());
    for ((row, &xi), y) in s.chunks_exact_mut(ds).zip(x).zip(y.iter_mut()) {
        let xd = xi * dt;
        let xv = _mm512_set1_ps(xd);
        let sp = row.as_mut_ptr();
        let mut acc = _mm512_setzero_ps();
        for j in (0..full).step_by(SCAN_LANES) {
            // s = s * decay + b * x dt (unfused), stored; acc += s * c.
            let sv = _mm512_add_ps(
                _mm512_mul_ps(_mm512_loadu_ps(sp.add(j)), g),
                _mm512_mul_ps(_mm512_loadu_ps(bp.add(j)), xv),
            );
            _mm512_storeu_ps(sp.add(j), sv);
            acc = _mm512_fmadd_ps(sv, _mm512_loadu_ps(cp.add(j)), acc);
        }
        // 16 -> 8 -> 4 lanes, then 4 -> 1.
        let v8 = _mm256_add_ps(
            _mm512_castps512_ps256(acc),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
        );
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        *y = tail(&mut row[full..], decay, xd, &b[full..], &c[full..], sum4(v4));
    }
}
