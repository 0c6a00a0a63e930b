//! IQ1_S and IQ1_M: groups of 8 weights from the 2048-point grid of
//! -1/0/+1, shifted by a delta of +-1/8, llama.cpp's
//! `quantize_row_iq1_s_impl` / `quantize_row_iq1_m_impl`.
//!
//! With three values a weight, the best split of a sub-block is found
//! exactly: sort its weights, and for every pair of cut points (below the
//! first: -1, between: 0, above the second: +1) and every delta sign, fit
//! the scale by weighted least squares from prefix sums; keep the best fit.
//! A group of 8 whose pattern is not a grid point moves to its nearest
//! listed neighbour, and the scale is refitted. Sub-block scales are stored
//! as 3-bit odd multiples of `max_scale / 15`.
//!
//! IQ1_S: sub-blocks of 32, one delta sign each. IQ1_M: sub-blocks of 16,
//! a delta sign per group of 8, and the super-block scale refitted over the
//! stored values at the end.

use super::iq::{blocks_mut, importance, nearest_int, sum_squares};
use super::iq_lattice::{self, Lattice};
use crate::quant::{BlockIQ1M, BlockIQ1S, F16Bytes, QK_K};

const DELTA: f32 = 0.125;
/// The three values of a weight with a positive / negative delta.
const PLUS: [f32; 3] = [-1.0 + DELTA, DELTA, 1.0 + DELTA];
const MINUS: [f32; 3] = [-1.0 - DELTA, -DELTA, 1.0 - DELTA];

/// Indices of `x` in ascending order, equal values in index order (a
/// stable sort, as glibc's merge-sort `qsort` leaves them).
fn ascending(x: &[f32], order: &mut [u8]) {
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u8;
    }
    for i in 1..order.len() {
        let mut j = i;
        while j > 0 && x[order[j] as usize] < x[order[j - 1] as usize] {
            order.swap(j, j - 1);
            j -= 1;
        }
    }
}

/// Levels (0, 1, 2 for -1, 0, +1) of a split at cut points `i1 <= i2` of
/// the ascending `order`.
fn split_levels(order: &[u8], i1: usize, i2: usize, levels: &mut [u8]) {
    for (j, &i) in order.iter().enumerate() {
        levels[i as usize] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
}

/// Put each group of 8 `levels` on the grid, moving an off-grid group to
/// the neighbour nearest `x` at `scale` with the group's values. Returns
/// the grid indices and whether any group moved.
fn place(
    lattice: &Lattice<8>,
    x: &[f32],
    weight: &[f32],
    scale: f32,
    values: impl Fn(usize) -> &'static [f32; 3],
    levels: &mut [u8],
    idx: &mut [u16],
) -> bool {
    let mut moved = false;
    for (k, (l, i)) in levels.chunks_exact_mut(8).zip(idx.iter_mut()).enumerate() {
        *i = match lattice.find(l) {
            Ok(i) => i,
            Err(near) => {
                moved = true;
                let r = 8 * k..8 * k + 8;
                let i = lattice.closest(near, &x[r.clone()], &weight[r], scale, values(k));
                l.copy_from_slice(lattice.levels(i));
                i
            }
        };
    }
    moved
}

/// The least-squares scale of `x` against the grid points `idx` (with each
/// group's values, times `mult`): (`sum w q x`, `sum w q q`).
fn grid_sums(
    lattice: &Lattice<8>,
    x: &[f32],
    weight: &[f32],
    idx: &[u16],
    values: impl Fn(usize) -> &'static [f32; 3],
    mult: f32,
    sums: &mut (f32, f32),
) {
    for (k, &i) in idx.iter().enumerate() {
        for (j, &l) in lattice.levels(i).iter().enumerate() {
            let (w, q) = (weight[8 * k + j], values(k)[l as usize] * mult);
            sums.0 += w * q * x[8 * k + j];
            sums.1 += w * q * q;
        }
    }
}

/// The 3-bit code of a sub-block scale under super-block scale `1 / id`.
fn scale_code(id: f32, s: f32) -> u16 {
    nearest_int(0.5f32 * (id * s - 1.0)).clamp(0, 7) as u16
}

/// One IQ1_S sub-block of 32 placed: grid indices, scale, delta sign.
fn iq1_s_sub_block(lattice: &Lattice<8>, x: &[f32], weight: &[f32]) -> Option<([u16; 4], f32, bool)> {
    let max = x[1..].iter().fold(x[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() });
    if max < 1e-12 {
        return None;
    }
    let mut order = [0u8; 32];
    ascending(x, &mut order);
    let (mut sumx, mut sumw) = ([0.0f32; 33], [0.0f32; 33]);
    for (j, &i) in order.iter().enumerate() {
        let i = i as usize;
        sumx[j + 1] = sumx[j] + weight[i] * x[i];
        sumw[j + 1] = sumw[j] + weight[i];
    }
    let (mut best, mut scale) = (-f32::MAX, max);
    let mut split = None;
    for i1 in 0..=32 {
        for i2 in i1..=32 {
            for (v, plus) in [(&PLUS, true), (&MINUS, false)] {
                let sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[32] - sumx[i2]) * v[2];
                let sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0]
                    + (sumw[i2] - sumw[i1]) * v[1] * v[1]
                    + (sumw[32] - sumw[i2]) * v[2] * v[2];
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    split = Some((i1, i2, plus));
                }
            }
        }
    }
    let (i1, i2, mut plus) = split?;
    let mut levels = [0u8; 32];
    split_levels(&order, i1, i2, &mut levels);
    if scale < 0.0 {
        levels.iter_mut().for_each(|l| *l = 2 - *l);
        scale = -scale;
        plus = !plus;
    }
    let values = move |_| if plus { &PLUS } else { &MINUS };
    let mut idx = [0u16; 4];
    if place(lattice, x, weight, scale, values, &mut levels, &mut idx) {
        let mut sums = (0.0f32, 0.0f32);
        grid_sums(lattice, x, weight, &idx, values, 1.0, &mut sums);
        if sums.0 > 0.0 && sums.1 > 0.0 {
            scale = sums.0 / sums.1;
        }
    }
    Some((idx, scale, plus))
}

pub(super) fn iq1_s(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq1();
    let mut weight = [0.0f32; 32];
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ1S>(out)).enumerate() {
        let sigma2 = 2.0 * sum_squares(xs) / QK_K as f32;
        // Per sub-block: 3 high index bits per group, the scale code at 12..15,
        // the delta sign at 15.
        let mut qh = [0u16; QK_K / 32];
        let mut scales = [0.0f32; QK_K / 32];
        let mut plus = [true; QK_K / 32];
        b.qs = [0; QK_K / 8];
        for (ib, x) in xs.chunks_exact(32).enumerate() {
            let at = QK_K * ibl + 32 * ib;
            importance(x, imatrix.map(|w| &w[at..at + 32]), sigma2, |v| v * v, &mut weight);
            let Some((idx, scale, p)) = iq1_s_sub_block(lattice, x, &weight) else {
                continue;
            };
            for (k, &i) in idx.iter().enumerate() {
                b.qs[4 * ib + k] = i as u8;
                qh[ib] |= (i >> 8) << (3 * k);
            }
            (scales[ib], plus[ib]) = (scale, p);
        }
        let max_scale = scales.iter().fold(0.0f32, |m, &s| if m > s { m } else { s });
        b.d = F16Bytes::from_f32(0.0);
        if max_scale != 0.0 {
            let d = max_scale / 15.0;
            b.d = F16Bytes::from_f32(d * 1.125);
            let id = 1.0 / d;
            for ((h, &s), &p) in qh.iter_mut().zip(&scales).zip(&plus) {
                *h |= (scale_code(id, s) | if p { 0 } else { 8 }) << 12;
            }
        }
        for (o, h) in b.qh.chunks_exact_mut(2).zip(&qh) {
            o.copy_from_slice(&h.to_le_bytes());
        }
    }
}

/// IQ1_M's delta signs of a sub-block's two groups: 0 (+, +), 1 (+, -),
/// 2 (-, +), 3 (-, -).
fn iq1_m_values(shift: usize) -> impl Fn(usize) -> &'static [f32; 3] + Copy {
    move |k| {
        let plus = if k == 0 { shift < 2 } else { shift.is_multiple_of(2) };
        if plus {
            &PLUS
        } else {
            &MINUS
        }
    }
}

/// One IQ1_M sub-block of 16 placed: grid indices, scale, delta signs.
fn iq1_m_sub_block(lattice: &Lattice<8>, x: &[f32], weight: &[f32]) -> Option<([u16; 2], f32, usize)> {
    let max = x[1..].iter().fold(x[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() });
    if max < 1e-7 {
        return None;
    }
    let mut order = [0u8; 16];
    ascending(x, &mut order);
    // Prefix sums per half of the sub-block (each half has its own delta).
    let (mut px, mut pw) = ([[0.0f32; 17]; 2], [[0.0f32; 17]; 2]);
    for (j, &i) in order.iter().enumerate() {
        let i = i as usize;
        let h = i / 8;
        px[h][j + 1] = px[h][j] + weight[i] * x[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + weight[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    // With values v0 < v1 < v2 one apart, a split's sum collapses to
    // `total * v2 - px[i1] - px[i2]`.
    let (p2, m2) = (PLUS[2], MINUS[2]);
    let cp1 = PLUS[0] * PLUS[0] - PLUS[1] * PLUS[1];
    let cp2 = PLUS[1] * PLUS[1] - PLUS[2] * PLUS[2];
    let cm1 = MINUS[0] * MINUS[0] - MINUS[1] * MINUS[1];
    let cm2 = MINUS[1] * MINUS[1] - MINUS[2] * MINUS[2];
    let (mut best, mut scale) = (-f32::MAX, max);
    let mut split = None;
    for i1 in 0..=16 {
        for i2 in i1..=16 {
            let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) = ([0.0f32; 2], [0.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
            for h in 0..2 {
                let sx = px[h][i1] + px[h][i2];
                qx_p[h] = px[h][16] * p2 - sx;
                qx_m[h] = px[h][16] * m2 - sx;
                q2_p[h] = pw[h][16] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = pw[h][16] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            let sumqx = [qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]];
            let sumq2 = [q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]];
            for k in 0..4 {
                if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best * sumq2[k] {
                    scale = sumqx[k] / sumq2[k];
                    best = scale * sumqx[k];
                    split = Some((i1, i2, k));
                }
            }
        }
    }
    let (i1, i2, mut shift) = split?;
    let mut levels = [0u8; 16];
    split_levels(&order, i1, i2, &mut levels);
    if scale < 0.0 {
        levels.iter_mut().for_each(|l| *l = 2 - *l);
        scale = -scale;
        shift = 3 - shift;
    }
    let values = iq1_m_values(shift);
    let mut idx = [0u16; 2];
    if place(lattice, x, weight, scale, values, &mut levels, &mut idx) {
        let mut sums = (0.0f32, 0.0f32);
        grid_sums(lattice, x, weight, &idx, values, 1.0, &mut sums);
        if sums.0 > 0.0 && sums.1 > 0.0 {
            scale = sums.0 / sums.1;
        }
    }
    Some((idx, scale, shift))
}

pub(super) fn iq1_m(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq1();
    let mut weight = [0.0f32; 16];
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ1M>(out)).enumerate() {
        let sigma2 = 2.0 * sum_squares(xs) / QK_K as f32;
        let sub_imatrix = |ib: usize| imatrix.map(|w| &w[QK_K * ibl + 16 * ib..QK_K * ibl + 16 * ib + 16]);
        let mut scales = [0.0f32; QK_K / 16];
        let mut shifts = [0usize; QK_K / 16];
        let mut idx = [[0u16; 2]; QK_K / 16];
        for (ib, x) in xs.chunks_exact(16).enumerate() {
            importance(x, sub_imatrix(ib), sigma2, |v| v * v, &mut weight);
            if let Some((i, scale, shift)) = iq1_m_sub_block(lattice, x, &weight) {
                (idx[ib], scales[ib], shifts[ib]) = (i, scale, shift);
            }
        }
        *b = BlockIQ1M { qs: [0; QK_K / 8], qh: [0; QK_K / 16], scales: [0; QK_K / 32] };
        let max_scale = scales.iter().fold(0.0f32, |m, &s| if m > s { m } else { s });
        if max_scale == 0.0 {
            continue;
        }
        // Store indices, delta signs and 3-bit scales, and refit the
        // super-block scale to the stored values (skipped sub-blocks count,
        // as grid point 0 at code 0).
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let mut sums = (0.0f32, 0.0f32);
        for (ib, x) in xs.chunks_exact(16).enumerate() {
            let l = scale_code(id, scales[ib]);
            sc[ib / 4] |= l << (3 * (ib % 4));
            let [i0, i1] = idx[ib];
            b.qs[2 * ib] = i0 as u8;
            b.qs[2 * ib + 1] = i1 as u8;
            b.qh[ib] = (i0 >> 8) as u8 | ((i1 >> 8) as u8) << 4 | [0x00, 0x80, 0x08, 0x88][shifts[ib]];
            importance(x, sub_imatrix(ib), sigma2, |v| v * v, &mut weight);
            grid_sums(lattice, x, &weight, &idx[ib], iq1_m_values(shifts[ib]), (2 * l + 1) as f32, &mut sums);
        }
        if sums.1 > 0.0 {
            d = sums.0 / sums.1;
        }
        let s = F16Bytes::from_f32(d * 1.1125);
        let s = u16::from_le_bytes(s.0);
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (o, w) in b.scales.chunks_exact_mut(2).zip(&sc) {
            o.copy_from_slice(&w.to_le_bytes());
        }
    }
}
