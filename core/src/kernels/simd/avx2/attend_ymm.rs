//! [`super::attend`]'s prompt attention on AVX2 (8 lanes): the sixteen
//! query rows in two registers. Scores: four keys at a time, each key's
//! value at a dimension broadcast from memory into both halves of the rows
//! (eight accumulators); values: four rows times sixteen columns per pass.
//! Lane for lane the operations of the scalar twin, as on AVX-512.

// Rows, keys and columns index parallel arrays of lanes by one counter.
#![allow(clippy::needless_range_loop)]
use crate::kernels::ops::{AttendRows, ATTEND_KEYS, ATTEND_ROWS};
use crate::kernels::scalar;
use half::slice::HalfFloatSliceExt;
use std::arch::x86_64::*;

const LANES: usize = ATTEND_ROWS;
const HALVES: usize = LANES / 8;

/// [`scalar::exp_attend`] per lane.
#[inline(always)]
unsafe fn exp(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
    let m = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(m, _mm256_set1_ps(scalar::LN2_HI), x);
    let r = _mm256_fnmadd_ps(m, _mm256_set1_ps(scalar::LN2_LO), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in scalar::EXP_TAYLOR {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(m), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
}

/// 8 f16 values at `p` widened to f32, reading only `n.min(8)` (the rest zero).
#[inline(always)]
unsafe fn load_f16(p: *const half::f16, n: usize) -> __m256 {
    let n = n.min(8);
    let mut buf = [half::f16::ZERO; 8];
    std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
    _mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr().cast()))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend_f16(a: &AttendRows<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let (d, dv, rows) = (a.d, a.dv, a.ranges.len());
    let n = a.k.len() / d;
    let (qt, rest) = scratch.split_at_mut(LANES * d);
    let (kf, st) = rest.split_at_mut(ATTEND_KEYS * d);
    let st = &mut st[..LANES * n];
    let (lo, hi, jlo, jhi) = a.lanes(qt);
    let lo: [__m256; HALVES] = std::array::from_fn(|g| _mm256_loadu_ps(lo.as_ptr().add(8 * g)));
    let hi: [__m256; HALVES] = std::array::from_fn(|g| _mm256_loadu_ps(hi.as_ptr().add(8 * g)));

    // Scores, four keys at a time, then one at a time.
    let mut max = [_mm256_set1_ps(f32::MIN); HALVES];
    let mut j = jlo;
    while j < jhi {
        let keys = ATTEND_KEYS.min(jhi - j);
        a.k[j * d..(j + keys) * d].convert_to_f32_slice(&mut kf[..keys * d]);
        let mut kk = 0;
        while kk + 4 <= keys {
            let acc = scores::<4>(qt, &kf[kk * d..], d);
            for s in 0..4 {
                keep(st, j + kk + s, &acc[s], &lo, &hi, a.scale, &mut max);
            }
            kk += 4;
        }
        for kk in kk..keys {
            keep(st, j + kk, &scores::<1>(qt, &kf[kk * d..], d)[0], &lo, &hi, a.scale, &mut max);
        }
        j += keys;
    }

    // Softmax down the lanes (each row's sink, if any, joins the maximum and
    // starts the sum); the weights rounded to f16 in place.
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let sinks = a.sink_lanes();
    let mut sum = [_mm256_setzero_ps(); HALVES];
    for g in 0..HALVES {
        let sink = _mm256_loadu_ps(sinks.as_ptr().add(8 * g));
        max[g] = _mm256_max_ps(max[g], sink);
        let none = _mm256_cmp_ps::<_CMP_EQ_OQ>(sink, neg_inf);
        sum[g] = _mm256_andnot_ps(none, exp(_mm256_sub_ps(sink, max[g])));
    }
    for j in jlo..jhi {
        for g in 0..HALVES {
            let p = st.as_mut_ptr().add(j * LANES + 8 * g);
            let s = _mm256_loadu_ps(p);
            let outside = _mm256_cmp_ps::<_CMP_EQ_OQ>(s, neg_inf);
            let e = _mm256_andnot_ps(outside, exp(_mm256_sub_ps(s, max[g])));
            sum[g] = _mm256_add_ps(sum[g], e);
            _mm256_storeu_ps(p, e);
        }
    }
    let inv: [__m256; HALVES] = std::array::from_fn(|g| {
        let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(sum[g], _mm256_setzero_ps());
        _mm256_and_ps(positive, _mm256_div_ps(_mm256_set1_ps(1.0), sum[g]))
    });
    for j in jlo..jhi {
        for g in 0..HALVES {
            let p = st.as_mut_ptr().add(j * LANES + 8 * g);
            let w = _mm256_mul_ps(_mm256_loadu_ps(p), inv[g]);
            _mm256_storeu_ps(p, _mm256_cvtph_ps(_mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(w)));
        }
    }

    // Values: four rows by sixteen columns per pass over the positions.
    for r0 in (0..rows).step_by(4) {
        for c in (0..dv).step_by(16) {
            let acc = if dv - c >= 16 {
                mix::<true>(a.v, st, dv, c, r0, jlo, jhi)
            } else {
                mix::<false>(a.v, st, dv, c, r0, jlo, jhi)
            };
            let cols = (dv - c).min(16);
            for r in 0..(rows - r0).min(4) {
                let mut lanes = [0f32; 16];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r][1]);
                out[(r0 + r) * dv + c..][..cols].copy_from_slice(&lanes[..cols]);
            }
        }
    }
}

/// Rows `r0..r0 + 4` times columns `c..c + 16` of the weighted values over
/// positions `jlo..jhi` (`FULL`: all sixteen columns exist; else the rest).
#[inline(always)]
unsafe fn mix<const FULL: bool>(
    v: &[half::f16],
    st: &[f32],
    dv: usize,
    c: usize,
    r0: usize,
    jlo: usize,
    jhi: usize,
) -> [[__m256; 2]; 4] {
    let cols = (dv - c).min(16);
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    for j in jlo..jhi {
        let row = v.as_ptr().add(j * dv + c);
        let (v0, v1) = if FULL {
            (_mm256_cvtph_ps(_mm_loadu_si128(row.cast())), _mm256_cvtph_ps(_mm_loadu_si128(row.add(8).cast())))
        } else {
            (load_f16(row, cols), load_f16(row.add(8), cols.saturating_sub(8)))
        };
        let w = st.as_ptr().add(j * LANES + r0);
        for r in 0..4 {
            let b = _mm256_broadcast_ss(&*w.add(r));
            acc[r][0] = _mm256_fmadd_ps(b, v0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(b, v1, acc[r][1]);
        }
    }
    acc
}

/// Key `j`'s scaled scores of every row into `st[j]` (-inf where `j` is
/// outside the row's range), the rows' maxima updated.
#[inline(always)]
unsafe fn keep(
    st: &mut [f32],
    j: usize,
    acc: &[__m256; HALVES],
    lo: &[__m256; HALVES],
    hi: &[__m256; HALVES],
    scale: f32,
    max: &mut [__m256; HALVES],
) {
    let jv = _mm256_set1_ps(j as f32);
    for g in 0..HALVES {
        let inside = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(jv, lo[g]), _mm256_cmp_ps::<_CMP_LT_OQ>(jv, hi[g]));
        let s = _mm256_mul_ps(acc[g], _mm256_set1_ps(scale));
        let v = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, inside);
        max[g] = _mm256_max_ps(max[g], v);
        _mm256_storeu_ps(st.as_mut_ptr().add(j * LANES + 8 * g), v);
    }
}

/// The sixteen rows' dot products with `K` widened keys (`kf`: `K` rows of `d`).
#[inline(always)]
unsafe fn scores<const K: usize>(qt: &[f32], kf: &[f32], d: usize) -> [[__m256; HALVES]; K] {
    let mut acc = [[_mm256_setzero_ps(); HALVES]; K];
    let (qp, kp) = (qt.as_ptr(), kf.as_ptr());
    for i in 0..d {
        let q: [__m256; HALVES] = std::array::from_fn(|g| _mm256_loadu_ps(qp.add(i * LANES + 8 * g)));
        for kk in 0..K {
            let k = _mm256_broadcast_ss(&*kp.add(kk * d + i));
            for g in 0..HALVES {
                acc[kk][g] = _mm256_fmadd_ps(q[g], k, acc[kk][g]);
            }
        }
    }
    acc
}
