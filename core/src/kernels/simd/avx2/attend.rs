//! Prompt attention over an f16 KV head on AVX-512: up to sixteen query rows
//! (a few tokens times the query heads sharing the KV head) in the sixteen
//! lanes of one register, so every key and value is read and widened once
//! for all of them (see [`crate::kernels::ops::attend_f16`]).
//!
//! - Scores: the queries transposed (`qt[i]` = lane r holds `q_r[i]`), eight
//!   keys widened to f32 at a time, and for each dimension one load of `qt[i]`
//!   meets each key's `k_j[i]` broadcast from memory: eight accumulators of
//!   sixteen rows, no horizontal sums. `st[j]` keeps key j's scores of all
//!   rows, -inf outside a row's range.
//! - Softmax down the lanes: the rows' maxima, `exp` (the scalar twin's
//!   polynomial), the rows' sums (from their sinks' share, if any), the
//!   weights rounded to f16.
//! - Values: eight rows times 32 columns of accumulators, each value row
//!   widened once per block of columns and met by the eight rows' weights
//!   broadcast from `st`.

// Rows, keys and columns index parallel arrays of lanes by one counter.
#![allow(clippy::needless_range_loop)]
use crate::kernels::ops::{AttendRows, ATTEND_KEYS, ATTEND_ROWS};
use crate::kernels::scalar;
use std::arch::x86_64::*;

const LANES: usize = ATTEND_ROWS;

/// Lanes `0..n.min(16)` set.
#[inline(always)]
fn first(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// `n.min(16)` f16 values at `p` widened to f32 (the rest zero).
#[inline(always)]
unsafe fn load_f16(p: *const u16, n: usize) -> __m512 {
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p.cast()))
}

/// [`scalar::exp_attend`] per lane.
#[inline(always)]
unsafe fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let m = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(m, _mm512_set1_ps(scalar::LN2_HI), x);
    let r = _mm512_fnmadd_ps(m, _mm512_set1_ps(scalar::LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in scalar::EXP_TAYLOR {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(m), _mm512_set1_epi32(127)));
    _mm512_mul_ps(p, _mm512_castsi512_ps(bits))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn attend_f16(a: &AttendRows<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let (d, dv, rows) = (a.d, a.dv, a.ranges.len());
    let n = a.k.len() / d;
    let (qt, rest) = scratch.split_at_mut(LANES * d);
    let (kf, st) = rest.split_at_mut(ATTEND_KEYS * d);
    let st = &mut st[..LANES * n];
    let (lo, hi, jlo, jhi) = a.lanes(qt);
    let (lo, hi) = (_mm512_loadu_ps(lo.as_ptr()), _mm512_loadu_ps(hi.as_ptr()));
    let kp = a.k.as_ptr().cast::<u16>();

    // Scores, ATTEND_KEYS keys at a time, then one at a time.
    let scale = _mm512_set1_ps(a.scale);
    let mut max = _mm512_set1_ps(f32::MIN);
    // Key j's scaled scores of every row, -inf where j is outside the row's range.
    let mut store = |j: usize, acc: __m512| {
        let jv = _mm512_set1_ps(j as f32);
        let inside = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(jv, lo) & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(jv, hi);
        let s = _mm512_mask_mul_ps(_mm512_set1_ps(f32::NEG_INFINITY), inside, acc, scale);
        max = _mm512_max_ps(max, s);
        _mm512_storeu_ps(st.as_mut_ptr().add(j * LANES), s);
    };
    let mut j = jlo;
    while j < jhi {
        let keys = ATTEND_KEYS.min(jhi - j);
        for kk in 0..keys {
            for i in (0..d).step_by(16) {
                let w = load_f16(kp.add((j + kk) * d + i), d - i);
                _mm512_mask_storeu_ps(kf.as_mut_ptr().add(kk * d + i), first(d - i), w);
            }
        }
        if keys == ATTEND_KEYS {
            let acc = scores::<ATTEND_KEYS>(qt, kf, d);
            for kk in 0..ATTEND_KEYS {
                store(j + kk, acc[kk]);
            }
        } else {
            for kk in 0..keys {
                store(j + kk, scores::<1>(qt, &kf[kk * d..], d)[0]);
            }
        }
        j += keys;
    }

    // Softmax down the lanes (each row's sink, if any, joins the maximum and
    // starts the sum); the weights rounded to f16 in place.
    let sink = _mm512_loadu_ps(a.sink_lanes().as_ptr());
    let max = _mm512_max_ps(max, sink);
    let has_sink = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(sink, _mm512_set1_ps(f32::NEG_INFINITY));
    let mut sum = _mm512_maskz_mov_ps(has_sink, exp(_mm512_sub_ps(sink, max)));
    for j in jlo..jhi {
        let p = st.as_mut_ptr().add(j * LANES);
        let s = _mm512_loadu_ps(p);
        let inside = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(s, _mm512_set1_ps(f32::NEG_INFINITY));
        let e = _mm512_maskz_mov_ps(inside, exp(_mm512_sub_ps(s, max)));
        sum = _mm512_add_ps(sum, e);
        _mm512_storeu_ps(p, e);
    }
    let inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(sum, _mm512_setzero_ps()), _mm512_set1_ps(1.0), sum);
    for j in jlo..jhi {
        let p = st.as_mut_ptr().add(j * LANES);
        let w = _mm512_mul_ps(_mm512_loadu_ps(p), inv);
        let w = _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(w));
        _mm512_storeu_ps(p, w);
    }

    // Values: eight rows by 32 columns per pass over the positions.
    let vp = a.v.as_ptr().cast::<u16>();
    for r0 in (0..rows).step_by(8) {
        let nr = (rows - r0).min(8);
        for c in (0..dv).step_by(32) {
            let (m0, m1) = (first(dv - c), first((dv - c).saturating_sub(16)));
            let mut acc = [[_mm512_setzero_ps(); 2]; 8];
            for j in jlo..jhi {
                let row = vp.add(j * dv + c);
                let (v0, v1) = (load_f16(row, dv - c), load_f16(row.add(16), (dv - c).saturating_sub(16)));
                let w = st.as_ptr().add(j * LANES + r0);
                for r in 0..8 {
                    let b = _mm512_set1_ps(*w.add(r));
                    acc[r][0] = _mm512_fmadd_ps(b, v0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(b, v1, acc[r][1]);
                }
            }
            for r in 0..nr {
                let o = out.as_mut_ptr().add((r0 + r) * dv + c);
                _mm512_mask_storeu_ps(o, m0, acc[r][0]);
                if m1 != 0 {
                    _mm512_mask_storeu_ps(o.add(16), m1, acc[r][1]);
                }
            }
        }
    }
}

/// The sixteen rows' dot products with `K` widened keys (`kf`: `K` rows of `d`).
#[inline(always)]
unsafe fn scores<const K: usize>(qt: &[f32], kf: &[f32], d: usize) -> [__m512; K] {
    let mut acc = [_mm512_setzero_ps(); K];
    let (qp, kp) = (qt.as_ptr(), kf.as_ptr());
    for i in 0..d {
        let q = _mm512_loadu_ps(qp.add(i * LANES));
        for kk in 0..K {
            acc[kk] = _mm512_fmadd_ps(q, _mm512_set1_ps(*kp.add(kk * d + i)), acc[kk]);
        }
    }
    acc
}
