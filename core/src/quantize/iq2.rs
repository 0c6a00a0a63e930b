//! IQ2_XXS, IQ2_XS and IQ2_S: groups of 8 magnitudes placed on a grid of
//! odd levels 1, 3, 5 with a sign byte each, llama.cpp's
//! `quantize_row_iq2_{xxs,xs,s}_impl`.
//!
//! Per sub-block (32 weights for IQ2_XXS, 16 for the others): fold the signs
//! out, find the sub-block scale by [`ScaleScan`] (IQ2_XXS starts it from
//! [`make_qp_quants`]), then store each sub-block scale as a 4-bit odd
//! multiple of `max_scale / 31`. IQ2_XXS and IQ2_XS keep 7 sign bits a
//! group (an even count of negatives); IQ2_S keeps all 8.

use super::iq::{
    blocks_mut, fold_signs, importance, make_qp_quants, max_of, odd_scale_code, sum_squares, Refit, ScaleScan,
};
use super::iq_lattice::{self, Lattice};
use crate::quant::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, F16Bytes, QK_K};

/// One sub-block's weights and magnitudes, folded for the search.
struct SubBlock<const N: usize> {
    weight: [f32; N],
    waux: [f32; N],
    xval: [f32; N],
    signs: [u8; 4],
}

impl<const N: usize> SubBlock<N> {
    /// Importance weights (`fallback` without an importance vector), their
    /// square roots, and the folded magnitudes and sign bytes.
    fn new(x: &[f32], imatrix: Option<&[f32]>, sigma2: f32, fallback: impl Fn(f32) -> f32, even: bool) -> Self {
        let mut b = SubBlock { weight: [0.0; N], waux: [0.0; N], xval: [0.0; N], signs: [0; 4] };
        importance(x, imatrix, sigma2, fallback, &mut b.weight);
        for (a, &w) in b.waux.iter_mut().zip(&b.weight) {
            *a = w.sqrt();
        }
        for k in 0..N / 8 {
            let r = 8 * k..8 * k + 8;
            b.signs[k] = fold_signs(&x[r.clone()], &b.weight[r.clone()], &mut b.xval[r], even);
        }
        b
    }

    /// Grid indices of the placed levels (all on the grid by construction).
    fn indices(lattice: &Lattice<8>, levels: &[u8]) -> [u16; 4] {
        let mut idx = [0u16; 4];
        for (i, l) in idx.iter_mut().zip(levels.chunks_exact(8)) {
            *i = lattice.find(l).expect("placed levels are grid points");
        }
        idx
    }
}

fn sub_imatrix(imatrix: Option<&[f32]>, at: usize, n: usize) -> Option<&[f32]> {
    imatrix.map(|w| &w[at..at + n])
}

pub(super) fn iq2_xxs(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq2_xxs();
    let scan = ScaleScan { steps: -6..=6, step: 0.1, refit: Refit::Always };
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ2XXS>(out)).enumerate() {
        // Per group of 32: grid indices (4 bytes), then signs and scale.
        let mut words = [0u32; QK_K / 16];
        let mut scales = [0.0f32; QK_K / 32];
        let sigma2 = sum_squares(xs) / QK_K as f32;
        let mut levels = [0u8; 32];
        for (ib, x) in xs.chunks_exact(32).enumerate() {
            let sb = SubBlock::<32>::new(x, sub_imatrix(imatrix, QK_K * ibl + 32 * ib, 32), sigma2, |v| v * v, true);
            if max_of(&sb.xval) < 1e-15 {
                continue;
            }
            let start = make_qp_quants(4, &sb.xval, &sb.weight, &mut levels);
            let eff_max = start * 3.0;
            if eff_max <= 0.0 {
                continue;
            }
            let mut scale = scan.fit(lattice, &sb.xval, &sb.weight, &sb.waux, eff_max, start, &mut levels);
            let mut signs = sb.signs;
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| !s & 127);
            }
            let idx = SubBlock::<32>::indices(lattice, &levels);
            words[2 * ib] = idx.iter().enumerate().map(|(k, &i)| (i as u32) << (8 * k)).sum();
            words[2 * ib + 1] = signs.iter().enumerate().map(|(k, &s)| (s as u32) << (7 * k)).sum();
            scales[ib] = scale;
        }
        let max_scale = scales.iter().fold(0.0f32, |m, &s| if m > s { m } else { s });
        b.d = F16Bytes::from_f32(0.0);
        b.qs = [0; QK_K / 4];
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b.d = F16Bytes::from_f32(d);
        let id = 1.0 / d;
        for (ib, &s) in scales.iter().enumerate() {
            words[2 * ib + 1] |= (odd_scale_code(id, s, 15) as u32) << 28;
        }
        for (q, w) in b.qs.chunks_exact_mut(4).zip(&words) {
            q.copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// The shared body of IQ2_XS and IQ2_S, sub-blocks of 16 (two points).
struct Sixteens<'a, F> {
    lattice: &'a Lattice<8>,
    /// Importance of a weight without an importance vector.
    weigh: F,
    /// Sub-blocks whose largest magnitude is below this are skipped.
    eps: f32,
    /// Whether signs are stored as 7 bits (an even count of negatives).
    even: bool,
}

impl<F: Fn(f32) -> f32 + Copy> Sixteens<'_, F> {
    /// Per sub-block: the scale, and `store(sub_block, grid indices, sign
    /// bytes)` for the two points; returns the scales (0 where skipped).
    fn place(
        &self,
        xs: &[f32],
        imatrix: Option<&[f32]>,
        sigma2: f32,
        mut store: impl FnMut(usize, [u16; 4], [u8; 4]),
    ) -> [f32; QK_K / 16] {
        let scan = ScaleScan { steps: -9..=9, step: 0.1, refit: Refit::OffLattice };
        let mut scales = [0.0f32; QK_K / 16];
        let mut levels = [0u8; 16];
        for (ib, x) in xs.chunks_exact(16).enumerate() {
            let sb = SubBlock::<16>::new(x, sub_imatrix(imatrix, 16 * ib, 16), sigma2, self.weigh, self.even);
            let max = max_of(&sb.xval);
            if max < self.eps {
                continue;
            }
            let mut scale = scan.fit(self.lattice, &sb.xval, &sb.weight, &sb.waux, max, max / 5.0, &mut levels);
            let mut signs = sb.signs;
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| if self.even { !s & 127 } else { !s });
            }
            store(ib, SubBlock::<16>::indices(self.lattice, &levels), signs);
            scales[ib] = scale;
        }
        scales
    }
}

/// Scales as nibbles of odd multiples of `d`, two to a byte.
fn scale_nibbles(scales: &[f32], d: f32, out: &mut [u8]) {
    let id = 1.0 / d;
    for (o, pair) in out.iter_mut().zip(scales.chunks_exact(2)) {
        *o = odd_scale_code(id, pair[0], 15) | odd_scale_code(id, pair[1], 15) << 4;
    }
}

fn max_scale(scales: &[f32]) -> f32 {
    scales.iter().fold(0.0f32, |m, &s| if m > s { m } else { s })
}

pub(super) fn iq2_xs(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq2_xs();
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ2XS>(out)).enumerate() {
        let sigma2 = sum_squares(xs) / QK_K as f32;
        // Per point: 9-bit grid index, 7 sign bits above it.
        let mut words = [0u16; QK_K / 8];
        let imatrix = sub_imatrix(imatrix, QK_K * ibl, QK_K);
        let sixteens = Sixteens { lattice, weigh: |v: f32| v * v, eps: 1e-15, even: true };
        let scales = sixteens.place(xs, imatrix, sigma2, |ib, idx, signs| {
            for k in 0..2 {
                words[2 * ib + k] = idx[k] | (signs[k] as u16) << 9;
            }
        });
        b.d = F16Bytes::from_f32(0.0);
        b.qs = [0; QK_K / 4];
        b.scales = [0; QK_K / 32];
        let max_scale = max_scale(&scales);
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b.d = F16Bytes::from_f32(d);
        scale_nibbles(&scales, d, &mut b.scales);
        for (q, w) in b.qs.chunks_exact_mut(2).zip(&words) {
            q.copy_from_slice(&w.to_le_bytes());
        }
    }
}

pub(super) fn iq2_s(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq2_s();
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ2S>(out)).enumerate() {
        let sigma2 = 2.0 * sum_squares(xs) / QK_K as f32;
        b.d = F16Bytes::from_f32(0.0);
        b.qs = [0; QK_K / 4];
        b.qh = [0; QK_K / 32];
        b.scales = [0; QK_K / 32];
        let imatrix = sub_imatrix(imatrix, QK_K * ibl, QK_K);
        let weigh = |v: f32| 0.25f32 * sigma2 + v * v;
        // Per point: low index byte, 2 high bits in `qh`, a full sign byte.
        let sixteens = Sixteens { lattice, weigh, eps: 1e-8, even: false };
        let scales = sixteens.place(xs, imatrix, sigma2, |ib, idx, signs| {
            for k in 0..2 {
                let r = 2 * ib + k;
                b.qs[r] = idx[k] as u8;
                b.qh[r / 4] |= ((idx[k] >> 8) as u8) << (2 * (r % 4));
                b.qs[QK_K / 8 + r] = signs[k];
            }
        });
        let max_scale = max_scale(&scales);
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b.d = F16Bytes::from_f32(d * 0.9875);
        scale_nibbles(&scales, d, &mut b.scales);
    }
}
