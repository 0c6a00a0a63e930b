//! Prompt attention over an f16 KV head on NEON: up to sixteen query rows
//! (a few tokens times the query heads sharing the KV head) in four
//! registers of four lanes, so every key and value is read and widened once
//! for all of them (see [`crate::kernels::ops::attend_f16`]).
//!
//! - Scores: the queries transposed (`qt[i]`: the sixteen rows' value at
//!   dimension `i`), keys widened to f32 eight at a time; four keys' four
//!   dimensions are loaded as four registers and multiplied into the rows by
//!   element (`fmla .s[lane]`): sixteen accumulators, no horizontal sums.
//!   `st[j]` keeps key j's scores of all rows, -inf outside a row's range.
//! - Softmax down the lanes: the rows' maxima, `exp` (the scalar twin's
//!   polynomial), the rows' sums, the weights rounded to f16.
//! - Values: eight rows times eight columns of accumulators, each value row
//!   widened once per block of columns and met by the eight rows' weights by
//!   element.

// Rows, keys and columns index parallel arrays of lanes by one counter.
#![allow(clippy::needless_range_loop)]
use crate::kernels::ops::{AttendRows, ATTEND_KEYS, ATTEND_ROWS};
use crate::kernels::scalar;
use half::slice::HalfFloatSliceExt;
use std::arch::aarch64::*;

const LANES: usize = ATTEND_ROWS;
const QUADS: usize = LANES / 4;

/// [`scalar::exp_attend`] per lane.
#[inline(always)]
unsafe fn exp(x: float32x4_t) -> float32x4_t {
    let x = vmaxq_f32(x, vdupq_n_f32(-87.0));
    let m = vrndnq_f32(vmulq_n_f32(x, std::f32::consts::LOG2_E));
    let r = vfmsq_f32(x, m, vdupq_n_f32(scalar::LN2_HI));
    let r = vfmsq_f32(r, m, vdupq_n_f32(scalar::LN2_LO));
    let mut p = vdupq_n_f32(1.0 / 720.0);
    for c in scalar::EXP_TAYLOR {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let two_m = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(m), vdupq_n_s32(127))));
    vmulq_f32(p, two_m)
}

/// 8 f16 values at `p` widened to f32, reading only `n.min(8)` (the rest zero).
#[inline(always)]
unsafe fn load_f16x8(p: *const half::f16, n: usize) -> [float32x4_t; 2] {
    let mut buf = [half::f16::ZERO; 8];
    std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n.min(8));
    widen8(vld1q_u16(buf.as_ptr().cast()))
}

/// Eight f16 (as u16 lanes) widened to f32.
#[inline(always)]
unsafe fn widen8(h: uint16x8_t) -> [float32x4_t; 2] {
    [vcvt_f32_f16_base(vget_low_u16(h)), vcvt_f32_f16_base(vget_high_u16(h))]
}

/// Four f16 (as u16 lanes) widened with `fcvtl` (base AArch64).
#[inline(always)]
unsafe fn vcvt_f32_f16_base(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    std::arch::asm!("fcvtl {o:v}.4s, {h:v}.4h", h = in(vreg) h, o = out(vreg) out, options(pure, nomem, nostack));
    out
}

/// Eight f32 rounded to f16 and back (`fcvtn`, then `fcvtl`).
#[inline(always)]
unsafe fn round_f16(v: float32x4_t) -> float32x4_t {
    let out: float32x4_t;
    std::arch::asm!(
        "fcvtn {t:v}.4h, {v:v}.4s",
        "fcvtl {o:v}.4s, {t:v}.4h",
        v = in(vreg) v, t = out(vreg) _, o = out(vreg) out,
        options(pure, nomem, nostack)
    );
    out
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn attend_f16(a: &AttendRows<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let (d, dv, rows) = (a.d, a.dv, a.ranges.len());
    let n = a.k.len() / d;
    let (qt, rest) = scratch.split_at_mut(LANES * d);
    let (kf, st) = rest.split_at_mut(ATTEND_KEYS * d);
    let st = &mut st[..LANES * n];
    let (lo, hi, jlo, jhi) = a.lanes(qt);
    let lo: [float32x4_t; QUADS] = std::array::from_fn(|g| vld1q_f32(lo.as_ptr().add(4 * g)));
    let hi: [float32x4_t; QUADS] = std::array::from_fn(|g| vld1q_f32(hi.as_ptr().add(4 * g)));

    // Scores, four keys at a time, then one at a time.
    let mut max = [vdupq_n_f32(f32::MIN); QUADS];
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
    let neg_inf = vdupq_n_f32(f32::NEG_INFINITY);
    let sinks = a.sink_lanes();
    let mut sum = [vdupq_n_f32(0.0); QUADS];
    for g in 0..QUADS {
        let sink = vld1q_f32(sinks.as_ptr().add(4 * g));
        max[g] = vmaxq_f32(max[g], sink);
        let none = vceqq_f32(sink, neg_inf);
        sum[g] = vbslq_f32(none, vdupq_n_f32(0.0), exp(vsubq_f32(sink, max[g])));
    }
    for j in jlo..jhi {
        for g in 0..QUADS {
            let p = st.as_mut_ptr().add(j * LANES + 4 * g);
            let s = vld1q_f32(p);
            let outside = vceqq_f32(s, neg_inf);
            let e = vbslq_f32(outside, vdupq_n_f32(0.0), exp(vsubq_f32(s, max[g])));
            sum[g] = vaddq_f32(sum[g], e);
            vst1q_f32(p, e);
        }
    }
    let inv: [float32x4_t; QUADS] = std::array::from_fn(|g| {
        let positive = vcgtq_f32(sum[g], vdupq_n_f32(0.0));
        vbslq_f32(positive, vdivq_f32(vdupq_n_f32(1.0), sum[g]), vdupq_n_f32(0.0))
    });
    for j in jlo..jhi {
        for g in 0..QUADS {
            let p = st.as_mut_ptr().add(j * LANES + 4 * g);
            vst1q_f32(p, round_f16(vmulq_f32(vld1q_f32(p), inv[g])));
        }
    }

    // Values: eight rows by eight columns per pass over the positions.
    for r0 in (0..rows).step_by(8) {
        for c in (0..dv).step_by(8) {
            let acc = if dv - c >= 8 {
                mix::<true>(a.v, st, dv, c, r0, jlo, jhi)
            } else {
                mix::<false>(a.v, st, dv, c, r0, jlo, jhi)
            };
            let cols = (dv - c).min(8);
            for r in 0..(rows - r0).min(8) {
                let mut lanes = [0f32; 8];
                vst1q_f32(lanes.as_mut_ptr(), acc[r][0]);
                vst1q_f32(lanes.as_mut_ptr().add(4), acc[r][1]);
                out[(r0 + r) * dv + c..][..cols].copy_from_slice(&lanes[..cols]);
            }
        }
    }
}

/// Rows `r0..r0 + 8` times columns `c..c + 8` of the weighted values over
/// positions `jlo..jhi` (`FULL`: all eight columns exist; else the rest).
#[inline(always)]
unsafe fn mix<const FULL: bool>(
    v: &[half::f16],
    st: &[f32],
    dv: usize,
    c: usize,
    r0: usize,
    jlo: usize,
    jhi: usize,
) -> [[float32x4_t; 2]; 8] {
    let cols = (dv - c).min(8);
    let mut acc = [[vdupq_n_f32(0.0); 2]; 8];
    for j in jlo..jhi {
        let row = v.as_ptr().add(j * dv + c);
        let v = if FULL { widen8(vld1q_u16(row.cast())) } else { load_f16x8(row, cols) };
        let w = st.as_ptr().add(j * LANES + r0);
        let (w0, w1) = (vld1q_f32(w), vld1q_f32(w.add(4)));
        macro_rules! row {
            ($r:literal, $w:ident, $lane:literal) => {
                acc[$r][0] = vfmaq_laneq_f32::<$lane>(acc[$r][0], v[0], $w);
                acc[$r][1] = vfmaq_laneq_f32::<$lane>(acc[$r][1], v[1], $w);
            };
        }
        row!(0, w0, 0);
        row!(1, w0, 1);
        row!(2, w0, 2);
        row!(3, w0, 3);
        row!(4, w1, 0);
        row!(5, w1, 1);
        row!(6, w1, 2);
        row!(7, w1, 3);
    }
    acc
}

/// Key `j`'s scaled scores of every row into `st[j]` (-inf where `j` is
/// outside the row's range), the rows' maxima updated.
#[inline(always)]
unsafe fn keep(
    st: &mut [f32],
    j: usize,
    acc: &[float32x4_t; QUADS],
    lo: &[float32x4_t; QUADS],
    hi: &[float32x4_t; QUADS],
    scale: f32,
    max: &mut [float32x4_t; QUADS],
) {
    let jv = vdupq_n_f32(j as f32);
    for g in 0..QUADS {
        let inside = vandq_u32(vcgeq_f32(jv, lo[g]), vcltq_f32(jv, hi[g]));
        let v = vbslq_f32(inside, vmulq_n_f32(acc[g], scale), vdupq_n_f32(f32::NEG_INFINITY));
        max[g] = vmaxq_f32(max[g], v);
        vst1q_f32(st.as_mut_ptr().add(j * LANES + 4 * g), v);
    }
}

/// The sixteen rows' dot products with `K` widened keys (`kf`: `K` rows of
/// `d`): four dimensions of each key per register, met by element.
#[inline(always)]
unsafe fn scores<const K: usize>(qt: &[f32], kf: &[f32], d: usize) -> [[float32x4_t; QUADS]; K] {
    let mut acc = [[vdupq_n_f32(0.0); QUADS]; K];
    let (qp, kp) = (qt.as_ptr(), kf.as_ptr());
    let mut i = 0;
    while i + 4 <= d {
        let kv: [float32x4_t; K] = std::array::from_fn(|kk| vld1q_f32(kp.add(kk * d + i)));
        macro_rules! dim {
            ($lane:literal) => {
                for g in 0..QUADS {
                    let q = vld1q_f32(qp.add((i + $lane) * LANES + 4 * g));
                    for kk in 0..K {
                        acc[kk][g] = vfmaq_laneq_f32::<$lane>(acc[kk][g], q, kv[kk]);
                    }
                }
            };
        }
        dim!(0);
        dim!(1);
        dim!(2);
        dim!(3);
        i += 4;
    }
    for i in i..d {
        for g in 0..QUADS {
            let q = vld1q_f32(qp.add(i * LANES + 4 * g));
            for kk in 0..K {
                acc[kk][g] = vfmaq_n_f32(acc[kk][g], q, *kp.add(kk * d + i));
            }
        }
    }
    acc
}
