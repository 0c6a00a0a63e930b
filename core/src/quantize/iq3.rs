//! IQ3_XXS and IQ3_S: groups of 4 magnitudes placed on a grid of odd levels
//! 1..15, llama.cpp's `quantize_row_iq3_xxs_impl` / `quantize_row_iq3_s_impl`.
//!
//! Per sub-block of 32: fold the signs out (IQ3_XXS keeps 7 bits per 8
//! weights, an even count of negatives; IQ3_S all 8), find the scale by
//! [`ScaleScan`], and store it as a 4-bit odd multiple of `max_scale / 31`;
//! the stored super-block scale carries llama.cpp's fudge factor (1.0125
//! for IQ3_XXS, 1.033 for IQ3_S).

use super::iq::{blocks_mut, fold_signs, importance, max_of, odd_scale_code, sum_squares, Refit, ScaleScan};
use super::iq_lattice::{self, Lattice};
use crate::quant::{BlockIQ3S, BlockIQ3XXS, F16Bytes, QK_K};

/// One sub-block of 32 placed: grid indices, sign bytes, scale.
struct Placed {
    idx: [u16; 8],
    signs: [u8; 4],
    scale: f32,
}

/// Search one sub-block of 32; None where llama.cpp skips it (`skip` of its
/// largest magnitude).
fn place(
    lattice: &Lattice<4>,
    scan: &ScaleScan,
    x: &[f32],
    imatrix: Option<&[f32]>,
    sigma2: f32,
    skip: fn(f32) -> bool,
    even: bool,
) -> Option<Placed> {
    let mut weight = [0.0f32; 32];
    let mut waux = [0.0f32; 32];
    let mut xval = [0.0f32; 32];
    let mut signs = [0u8; 4];
    importance(x, imatrix, sigma2, |v| v * v, &mut weight);
    for (a, &w) in waux.iter_mut().zip(&weight) {
        *a = w.sqrt();
    }
    for (k, s) in signs.iter_mut().enumerate() {
        let r = 8 * k..8 * k + 8;
        *s = fold_signs(&x[r.clone()], &weight[r.clone()], &mut xval[r], even);
    }
    let max = max_of(&xval);
    if skip(max) {
        return None;
    }
    let mut levels = [0u8; 32];
    let mut scale = scan.fit(lattice, &xval, &weight, &waux, max, max / 15.0, &mut levels);
    if scale < 0.0 {
        scale = -scale;
        signs = signs.map(|s| if even { !s & 127 } else { !s });
    }
    let mut idx = [0u16; 8];
    for (i, l) in idx.iter_mut().zip(levels.chunks_exact(4)) {
        *i = lattice.find(l).expect("placed levels are grid points");
    }
    Some(Placed { idx, signs, scale })
}

fn sub_imatrix(imatrix: Option<&[f32]>, at: usize) -> Option<&[f32]> {
    imatrix.map(|w| &w[at..at + 32])
}

pub(super) fn iq3_xxs(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq3_xxs();
    let scan = ScaleScan { steps: -15..=15, step: 0.2, refit: Refit::OffLattice };
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ3XXS>(out)).enumerate() {
        let sigma2 = 2.0 * sum_squares(xs) / QK_K as f32;
        let mut scales = [0.0f32; QK_K / 32];
        // Per sub-block: four 7-bit sign codes, the scale code in the top nibble.
        let mut words = [0u32; QK_K / 32];
        b.d = F16Bytes::from_f32(0.0);
        b.grid = [0; QK_K / 4];
        for (ib, x) in xs.chunks_exact(32).enumerate() {
            let Some(p) =
                place(lattice, &scan, x, sub_imatrix(imatrix, QK_K * ibl + 32 * ib), sigma2, |m| m < 1e-8, true)
            else {
                continue;
            };
            for (g, &i) in b.grid[8 * ib..8 * ib + 8].iter_mut().zip(&p.idx) {
                *g = i as u8;
            }
            words[ib] = p.signs.iter().enumerate().map(|(k, &s)| (s as u32) << (7 * k)).sum();
            scales[ib] = p.scale;
        }
        let max_scale = scales.iter().fold(0.0f32, |m, &s| if m > s { m } else { s });
        if max_scale == 0.0 {
            b.grid = [0; QK_K / 4];
            b.scales_signs = [0; QK_K / 8];
            continue;
        }
        let d = max_scale / 31.0;
        b.d = F16Bytes::from_f32(d * 1.0125);
        let id = 1.0 / d;
        for ((w, &s), o) in words.iter_mut().zip(&scales).zip(b.scales_signs.chunks_exact_mut(4)) {
            *w |= (odd_scale_code(id, s, 15) as u32) << 28;
            o.copy_from_slice(&w.to_le_bytes());
        }
    }
}

pub(super) fn iq3_s(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let lattice = iq_lattice::iq3_s();
    let scan = ScaleScan { steps: -9..=9, step: 0.2, refit: Refit::AllIfAnyOffLattice };
    for (ibl, (xs, b)) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockIQ3S>(out)).enumerate() {
        let sigma2 = 2.0 * sum_squares(xs) / QK_K as f32;
        let mut scales = [0.0f32; QK_K / 32];
        *b = BlockIQ3S {
            d: F16Bytes::from_f32(0.0),
            qs: [0; QK_K / 4],
            qh: [0; QK_K / 32],
            signs: [0; QK_K / 8],
            scales: [0; QK_K / 64],
        };
        // llama.cpp advances its index and sign cursors only past the
        // sub-blocks it stores: after an all-zero sub-block, the next one's
        // indices and signs land in the skipped one's place (its high index
        // bits stay at its own position). Kept, to equal its bytes.
        let mut stored = 0;
        for (ib, x) in xs.chunks_exact(32).enumerate() {
            let Some(p) =
                place(lattice, &scan, x, sub_imatrix(imatrix, QK_K * ibl + 32 * ib), sigma2, |m| m == 0.0, false)
            else {
                continue;
            };
            for (k, &i) in p.idx.iter().enumerate() {
                b.qs[8 * stored + k] = i as u8;
                b.qh[ib] |= ((i >> 8) as u8) << k;
            }
            b.signs[4 * stored..4 * stored + 4].copy_from_slice(&p.signs);
            stored += 1;
            scales[ib] = p.scale;
        }
        let max_scale = scales.iter().fold(0.0f32, |m, &s| if m > s { m } else { s });
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b.d = F16Bytes::from_f32(d * 1.033);
        let id = 1.0 / d;
        for (o, pair) in b.scales.iter_mut().zip(scales.chunks_exact(2)) {
            *o = odd_scale_code(id, pair[0], 15) | odd_scale_code(id, pair[1], 15) << 4;
        }
    }
}
