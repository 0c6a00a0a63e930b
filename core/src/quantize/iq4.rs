//! IQ4_NL and IQ4_XS: each weight an index into the 16 non-linear values
//! [`KVALUES_IQ4NL`], llama.cpp's `quantize_row_iq4_nl_impl`.
//!
//! Per group of 32: start from the scale that maps the weight of largest
//! magnitude onto -127, round every weight to its nearest table value and
//! fit the scale by weighted least squares; then try the 15 scales that map
//! that weight onto `-127 + t` (`t` in -7..=7) and keep the best fit. IQ4_NL
//! stores each group's scale as f16; IQ4_XS stores 6-bit multiples of one
//! f16 super-block scale and re-rounds the weights to the stored scales.

use super::iq::{blocks_mut, nearest_int, sum_squares};
use crate::quant::iq4::{BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};
use crate::quant::{F16Bytes, QK_K};

const GROUP: usize = 32;

/// The index of the table value nearest `x` (upper of two equally near),
/// llama.cpp's `best_index_int8`.
fn nearest_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// `sum w q x` and `sum w q q` of the table values the weights round to at
/// inverse scale `id`.
fn fit_sums(x: &[f32], weight: &[f32], id: f32) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (&v, &w) in x.iter().zip(weight) {
        let q = KVALUES_IQ4NL[nearest_index(id * v) as usize] as f32;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The best scale of one group of 32 (0 for a group of near-zeros).
fn group_scale(x: &[f32], weight: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let (sumqx, sumq2) = fit_sums(x, weight, 1.0 / (-max / v0));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for t in -7..=7 {
        let (sumqx, sumq2) = fit_sums(x, weight, (t + KVALUES_IQ4NL[0] as i32) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Each weight's importance in a super-block of `x` (32 or 256 values).
fn group_weights(x: &[f32], imatrix: Option<&[f32]>, sigma2: f32, out: &mut [f32]) {
    super::iq::importance(x, imatrix, sigma2, |v| v * v, out);
}

/// Indices of `x` at inverse scale `id`, packed two to a byte: value `j`
/// in the low nibble of byte `j`, value `j + 16` in its high nibble.
fn pack(x: &[f32], id: f32, qs: &mut [u8]) {
    for (j, q) in qs.iter_mut().enumerate() {
        *q = nearest_index(id * x[j]) | nearest_index(id * x[j + 16]) << 4;
    }
}

pub(super) fn iq4_nl(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let mut weight = [0.0f32; GROUP];
    for (i, (x, b)) in row.chunks_exact(GROUP).zip(blocks_mut::<BlockIQ4NL>(out)).enumerate() {
        let sigma2 = sum_squares(x) * (2.0 / GROUP as f32);
        group_weights(x, imatrix.map(|w| &w[GROUP * i..GROUP * (i + 1)]), sigma2, &mut weight);
        let d = group_scale(x, &weight);
        b.d = F16Bytes::from_f32(d);
        pack(x, if d != 0.0 { 1.0 / d } else { 0.0 }, &mut b.qs);
    }
}

pub(super) fn iq4_xs(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let mut weight = [0.0f32; GROUP];
    let mut scales = [0.0f32; QK_K / GROUP];
    for (i, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ4XS>(out)).enumerate() {
        let sigma2 = sum_squares(xs) * (2.0 / QK_K as f32);
        // The group scale of largest magnitude, with its sign.
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for (g, (x, s)) in xs.chunks_exact(GROUP).zip(scales.iter_mut()).enumerate() {
            let at = QK_K * i + GROUP * g;
            group_weights(x, imatrix.map(|w| &w[at..at + GROUP]), sigma2, &mut weight);
            *s = group_scale(x, &weight);
            if s.abs() > amax {
                amax = s.abs();
                max = *s;
            }
        }
        // Signed 6-bit group scales (-32..=31) of one f16 scale.
        let d = -max / 32.0;
        b.d = F16Bytes::from_f32(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.scales_h = [0; 2];
        let mut scales_h = 0u16;
        for (g, (x, &s)) in xs.chunks_exact(GROUP).zip(&scales).enumerate() {
            let l = nearest_int(id * s).clamp(-32, 31);
            let dl = d * l as f32;
            pack(x, if dl != 0.0 { 1.0 / dl } else { 0.0 }, &mut b.qs[16 * g..16 * g + 16]);
            let l = (l + 32) as u8;
            if g % 2 == 0 {
                b.scales_l[g / 2] = l & 0xF;
            } else {
                b.scales_l[g / 2] |= (l & 0xF) << 4;
            }
            scales_h |= ((l >> 4) as u16) << (2 * g);
        }
        b.scales_h = scales_h.to_le_bytes();
    }
}
