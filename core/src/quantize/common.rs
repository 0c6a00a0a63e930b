//! What the legacy and K-quant quantisers share: llama.cpp's rounding, a
//! mutable block view of the output, and the four scale searches its
//! quantisers are built from.
//!
//! Every float operation here is f32 and in the order llama.cpp's C does it
//! (no fused multiply-add, no reassociated sums): the searches compare
//! errors that can differ in the last bit, so a reordered sum may pick
//! another scale and change the bytes.

use crate::quant::FileBlock;

/// Below this a group's largest magnitude counts as zero (llama.cpp's
/// `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to the nearest integer, ties to even, as llama.cpp's `nearest_int`:
/// adding 1.5 * 2^23 leaves the integer in the low mantissa bits. Exact for
/// |x| < 2^22; beyond that it returns the same wrapped value the C does
/// (some searches divide by tiny numbers, and their bytes must still match).
#[inline(always)]
pub(super) fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// C's float -> int conversion as compiled for x86 (`cvttss2si`):
/// truncation toward zero, but the "integer indefinite" `i32::MIN` for NaN
/// or a value outside i32 (Rust's `as` saturates instead). llama.cpp's
/// reference Q4_0..Q8_0 reach it on a block of subnormals, where 1/d
/// overflows to infinity: x86 then stores level 0 (the low byte).
#[inline(always)]
pub(super) fn c_float_to_int(x: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        x as i32
    } else {
        i32::MIN
    }
}

/// `out` as a slice of blocks to fill in place.
///
/// Panics when `out` is not a whole number of blocks (the dispatch has
/// checked the row's size).
pub(super) fn blocks_mut<B: FileBlock>(out: &mut [u8]) -> &mut [B] {
    let size = std::mem::size_of::<B>();
    assert!(out.len().is_multiple_of(size), "{} bytes is not a whole number of {size}-byte blocks", out.len());
    // SAFETY: `B: FileBlock` is repr(C) byte arrays only: alignment 1, no
    // padding, every bit pattern valid; the blocks lie inside `out`, which
    // this borrow holds exclusively.
    unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<B>(), out.len() / size) }
}

/// Quantise `row` block by block: `quantize` gets each block of `N` values,
/// the matching slice of the importance vector if any, and the block to fill.
pub(super) fn each_block<B: FileBlock, const N: usize>(
    row: &[f32],
    imatrix: Option<&[f32]>,
    out: &mut [u8],
    mut quantize: impl FnMut(&[f32; N], Option<&[f32; N]>, &mut B),
) {
    let (xs, _) = row.as_chunks::<N>();
    let blocks = blocks_mut::<B>(out);
    assert_eq!(xs.len(), blocks.len());
    match imatrix {
        None => xs.iter().zip(blocks).for_each(|(x, b)| quantize(x, None, b)),
        Some(w) => {
            let (ws, _) = w.as_chunks::<N>();
            xs.iter().zip(ws).zip(blocks).for_each(|((x, w), b)| quantize(x, Some(w), b));
        }
    }
}

/// Σ x², summed in order from +0.
#[inline]
pub(super) fn sum_squares(x: &[f32]) -> f32 {
    x.iter().fold(0.0, |s, &v| s + v * v)
}

/// Σ x, summed in order from +0 (Rust's `Sum` starts from -0).
#[inline]
pub(super) fn sum(x: &[f32]) -> f32 {
    x.iter().fold(0.0, |s, &v| s + v)
}

/// The weighted searches' per-value weight: the importance of the column
/// times sqrt(σ² + x²), so that large weights count more even where the
/// importance vector is flat.
#[inline]
pub(super) fn importance<const N: usize>(x: &[f32; N], qw: &[f32; N], sigma2: f32) -> [f32; N] {
    std::array::from_fn(|i| qw[i] * (sigma2 + x[i] * x[i]).sqrt())
}

/// The value of largest magnitude (the first if tied) and that magnitude.
#[inline]
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            (max, amax) = (v, v.abs());
        }
    }
    (max, amax)
}

/// The larger of the positive values (0 if none), as C's `MAX` picks.
#[inline]
pub(super) fn positive_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0, |m, &v| if v > m { v } else { m })
}

/// A symmetric scale for `x` on the signed grid -nmax..nmax-1: levels are
/// rounded from a trial inverse scale -(nmax + k/10)/max for k in -9..=9,
/// and the trial whose least-squares scale explains most of Σ w x²
/// (largest (Σ w x l)² / Σ w l²) wins. `w` is `weights`, or x² without.
/// Writes `l + nmax` to `levels`; returns the scale (0 for an all-zero
/// group). llama.cpp's `make_qx_quants` with `rmse_type` 1.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], weights: Option<&[f32]>, levels: &mut [u8]) -> f32 {
    /// Trials k = -9..=9 sit in lanes 0..19; the lanes past them pad the
    /// arrays to whole vectors and are never read.
    const LANES: usize = 24;
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let iscales: [f32; LANES] = std::array::from_fn(|lane| -(nmax as f32 + 0.1 * (lane as i32 - 9) as f32) / max);
    // Every trial's sums in one pass over x, each lane adding in x's order
    // as the one-trial-at-a-time loop does (so the bytes stay llama.cpp's),
    // with the trials side by side instead of one dependent chain each.
    let (mut sumlx, mut suml2) = ([0.0f32; LANES], [0.0f32; LANES]);
    for (i, &v) in x.iter().enumerate() {
        let w = weights.map_or(v * v, |w| w[i]);
        for lane in 0..LANES {
            let l = level(iscales[lane], v) as f32;
            sumlx[lane] += w * v * l;
            suml2[lane] += w * l * l;
        }
    }
    // Trial 0 (lane 9) first, then k = -9..=9 in order, as the C does.
    let mut best_lane = 9;
    let mut scale = if suml2[9] != 0.0 { sumlx[9] / suml2[9] } else { 0.0 };
    let mut best = scale * sumlx[9];
    for lane in (0..19).filter(|&lane| lane != 9) {
        if suml2[lane] > 0.0 && sumlx[lane] * sumlx[lane] > best * suml2[lane] {
            scale = sumlx[lane] / suml2[lane];
            best = scale * sumlx[lane];
            best_lane = lane;
        }
    }
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = (level(iscales[best_lane], v) + nmax) as u8;
    }
    scale
}

/// A symmetric scale for `x` (at most 16 values) on the grid -nmax..nmax-1,
/// weighted by x²: levels start from -nmax/max and then, for up to five
/// sweeps, each level moves to the one the others' least-squares scale
/// suggests when that explains more of Σ w x². Writes `l + nmax` to
/// `levels`; returns the scale. llama.cpp's `make_q3_quants` with `do_rmse`.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let mut l = [0i32; 16];
    let l = &mut l[..x.len()];
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        *li = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *li as f32;
        suml2 += w * *li as f32 * *li as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *li as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new != *li {
                    slx += w * v * new as f32;
                    sl2 += w * new as f32 * new as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        (*li, sumlx, suml2) = (new, slx, sl2);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (out, &li) in levels.iter_mut().zip(l.iter()) {
        *out = (li + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The trial grid of [`make_qkx_quants`]: inverse scales
/// (nmax + rmin + k rdelta) / (max - min) for k in 0..=steps, errors as
/// |d| (`mad`) or d².
#[derive(Clone, Copy)]
pub(super) struct ScaleMinSearch {
    pub rmin: f32,
    pub rdelta: f32,
    pub steps: i32,
    pub mad: bool,
}

/// An asymmetric fit x ≈ scale·l - min with l in 0..=nmax and min >= 0, for
/// at most 32 values: levels start from the range [min(x, 0), max(x)];
/// each trial of `search` rounds levels, solves the weighted least squares
/// for scale and offset (offset clamped at 0), and the trial with the least
/// weighted error wins; later trials round from the winning offset so far. Writes the levels; returns (scale, min).
/// llama.cpp's `make_qkx2_quants` / `make_qkx3_quants` with weights.
pub(super) fn make_qkx_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    search: ScaleMinSearch,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        levels.fill(0);
        return (0.0, -min);
    }
    let error = |scale: f32, min: f32, levels: &[u8]| {
        let mut err = 0.0f32;
        for ((&l, &v), &w) in levels.iter().zip(x).zip(weights) {
            let diff = scale * l as f32 + min - v;
            err += w * if search.mad { diff.abs() } else { diff * diff };
        }
        err
    };
    let round_levels = |iscale: f32, levels: &mut [u8]| {
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
        }
    };

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    round_levels(iscale, levels);
    let mut best_error = error(scale, min, levels);
    if search.steps < 1 {
        return (scale, -min);
    }
    let mut trial = [0u8; 32];
    let trial = &mut trial[..n];
    for k in 0..=search.steps {
        let iscale = (search.rmin + search.rdelta * k as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((t, &v), &w) in trial.iter_mut().zip(x).zip(weights) {
            let l = nearest_int(iscale * (v - min)).clamp(0, nmax);
            *t = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let err = error(this_scale, this_min, trial);
            if err < best_error {
                levels.copy_from_slice(trial);
                (best_error, scale, min) = (err, this_scale, this_min);
            }
        }
    }
    (scale, -min)
}

/// A scale for non-negative `x` (the sub-block scales or mins of a K-quant
/// block) on the grid 0..=nmax: the best of nine trial inverse scales
/// (nmax + k/10)/max by weighted squared error, then up to five sweeps that
/// move each level to the one the others' least-squares scale suggests.
/// Writes the levels; returns the scale. llama.cpp's `make_qp_quants`.
///
/// Levels are stored as bytes as the C stores them (a negative level, only
/// possible for a negative input, wraps the same way).
pub(super) fn make_qp_quants(nmax: i32, x: &[f32], weights: &[f32], levels: &mut [u8]) -> f32 {
    let max = positive_max(x);
    if max < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = nearest_int(iscale * v) as u8;
        let diff = v - scale * *l as f32;
        best_mse += w * diff * diff;
    }
    for k in (-4..=4).filter(|&k| k != 0) {
        let trial_iscale = (0.1 * k as f32 + nmax as f32) / max;
        let trial_scale = 1.0 / trial_iscale;
        let mut mse = 0.0f32;
        for (&v, &w) in x.iter().zip(weights) {
            let l = nearest_int(trial_iscale * v).min(nmax);
            let diff = v - trial_scale * l as f32;
            mse += w * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = trial_iscale;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        let li = nearest_int(iscale * v).min(nmax);
        *l = li as u8;
        sumlx += w * v * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
            let old = *l as f32;
            let mut slx = sumlx - w * v * old;
            let mut sl2 = suml2 - w * old * old;
            if slx > 0.0 && sl2 > 0.0 {
                let new = nearest_int(v * sl2 / slx).min(nmax);
                if new != *l as i32 {
                    slx += w * v * new as f32;
                    sl2 += w * new as f32 * new as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        (*l, sumlx, suml2) = (new as u8, slx, sl2);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases =
            [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (3.49, 3), (-7.51, -8), (4_194_303.0, 4_194_303)];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
            assert_eq!(nearest_int(x) as f32, x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn float_to_int_is_x86_truncation() {
        assert_eq!(c_float_to_int(7.9), 7);
        assert_eq!(c_float_to_int(-7.9), -7);
        assert_eq!(c_float_to_int(-2_147_483_648.0), i32::MIN);
        for x in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3e9, -3e9] {
            assert_eq!(c_float_to_int(x), i32::MIN, "{x}");
        }
    }

    #[test]
    fn qx_search_fits_a_scaled_grid_exactly() {
        // Values on the grid -4..3 times 0.25: the fit recovers it.
        let x: Vec<f32> = (0..16).map(|i| ((i % 8) as f32 - 4.0) * 0.25).collect();
        let mut l = [0u8; 16];
        let scale = make_qx_quants(4, &x, None, &mut l);
        for (&v, &q) in x.iter().zip(&l) {
            assert_eq!(scale * (q as f32 - 4.0), v);
        }
        assert_eq!(make_qx_quants(4, &[0.0; 16], None, &mut l), 0.0);
        assert_eq!(l, [0; 16]);
    }

    #[test]
    fn q3_search_never_worse_than_its_start() {
        let x: Vec<f32> = (0..16).map(|i| ((i * 37 % 11) as f32 - 5.3) * 0.1).collect();
        let mut l = [0u8; 16];
        let scale = make_q3_quants(4, &x, &mut l);
        let err =
            |s: f32, l: &[u8]| x.iter().zip(l).map(|(v, &q)| (v - s * (q as f32 - 4.0)).powi(2) * v * v).sum::<f32>();
        let (max, _) = signed_max(&x);
        let start: Vec<u8> = x.iter().map(|&v| (nearest_int(-4.0 / max * v).clamp(-4, 3) + 4) as u8).collect();
        assert!(err(scale, &l) <= err(max / -4.0, &start) * 1.0001);
        assert!(l.iter().all(|&q| q < 8));
    }

    #[test]
    fn scale_min_search_covers_the_range() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.1 - 1.0).collect();
        let w = [1.0f32; 32];
        let mut l = [0u8; 32];
        let search = ScaleMinSearch { rmin: -1.0, rdelta: 0.1, steps: 20, mad: false };
        let (scale, min) = make_qkx_quants(15, &x, &w, &mut l, search);
        assert!(scale > 0.0 && min > 0.0);
        for (&v, &q) in x.iter().zip(&l) {
            assert!(q <= 15);
            assert!((scale * q as f32 - min - v).abs() <= scale, "{v}");
        }
        // A constant positive group: min clamps to 0, one level covers it.
        let (scale, min) = make_qkx_quants(15, &[2.0; 32], &w, &mut l, search);
        assert_eq!(min, 0.0);
        assert!(l.iter().all(|&q| (scale * q as f32 - 2.0).abs() < 1e-5));
    }

    #[test]
    fn qp_search_keeps_levels_in_range() {
        let x = [0.3f32, 1.7, 0.0, 2.9, 0.05, 1.1, 2.2, 0.6];
        let w = [1.0, 2.0, 0.0, 1.0, 3.0, 1.0, 1.0, 0.5];
        let mut l = [0u8; 8];
        let scale = make_qp_quants(15, &x, &w, &mut l);
        assert!(scale > 0.0);
        for (&v, &q) in x.iter().zip(&l) {
            assert!(q <= 15);
            assert!((scale * q as f32 - v).abs() <= scale, "{v}");
        }
    }
}
