//! What the IQ searches share: llama.cpp's rounding, the importance weights,
//! sign folding, and the scale scan that places groups of weights on a
//! lattice ([`Lattice`]).
//!
//! Arithmetic follows llama.cpp's source order in f32 throughout (no fused
//! multiply-adds, no reassociation): the outputs must equal its bytes.

pub(super) use super::common::{blocks_mut, make_qp_quants, nearest_int, sum_squares};
use super::iq_lattice::Lattice;
use std::ops::RangeInclusive;

/// Each weight's importance: `imatrix * sqrt(sigma2 + x^2)` with an
/// importance vector, `fallback(x)` without one.
pub(super) fn importance(
    x: &[f32],
    imatrix: Option<&[f32]>,
    sigma2: f32,
    fallback: impl Fn(f32) -> f32,
    out: &mut [f32],
) {
    match imatrix {
        Some(qw) => {
            for ((o, &v), &q) in out.iter_mut().zip(x).zip(qw) {
                *o = q * (sigma2 + v * v).sqrt();
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = fallback(v);
            }
        }
    }
}

/// Fold the signs of 8 weights out: `xval = |x|`, and a sign byte (bit `i`:
/// weight `i` is negative). Where only 7 sign bits are stored, the count of
/// negatives must be even: if it is odd, the weight that matters least
/// (smallest `weight * x^2`, first of equals) keeps the wrong sign (its
/// `xval` becomes negative). Returns the sign byte, 7 bits when `even`.
pub(super) fn fold_signs(x: &[f32], weight: &[f32], xval: &mut [f32], even: bool) -> u8 {
    let mut signs = 0u8;
    for (i, (&v, o)) in x.iter().zip(xval.iter_mut()).enumerate() {
        *o = if v >= 0.0 { v } else { -v };
        if v < 0.0 {
            signs |= 1 << i;
        }
    }
    if even && signs.count_ones() % 2 == 1 {
        let cost = |i: usize| weight[i] * x[i] * x[i];
        let least = (1..8).fold(0, |m, i| if cost(i) < cost(m) { i } else { m });
        xval[least] = -xval[least];
        signs ^= 1 << least;
    }
    if even {
        signs & 127
    } else {
        signs
    }
}

/// Largest value (0 for none larger), in llama.cpp's `MAX` order.
pub(super) fn max_of(x: &[f32]) -> f32 {
    x[1..].iter().fold(x[0], |m, &v| if m > v { m } else { v })
}

/// `sum w * x * q` and `sum w * q * q` of odd levels `q = 2l + 1`.
fn odd_level_sums(xval: &[f32], weight: &[f32], levels: &[u8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for ((&x, &w), &l) in xval.iter().zip(weight).zip(levels) {
        let q = (2 * l as i32 + 1) as f32;
        sumqx += w * x * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The 4-bit code of a group scale `s` under super-block scale `1 / id`
/// (groups scale by the odd multiples `2c + 1`), llama.cpp's rounding.
pub(super) fn odd_scale_code(id: f32, s: f32, top: i32) -> u8 {
    nearest_int(0.5f32 * (id * s - 1.0)).clamp(0, top) as u8
}

/// Which points a [`ScaleScan`] re-places at the scale it settles on.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Refit {
    /// Every point, always (IQ2_XXS).
    Always,
    /// Only the points the best trial had to move off-lattice (IQ2_XS,
    /// IQ2_S, IQ3_XXS).
    OffLattice,
    /// Every point, when any is off-lattice; a group no trial improved
    /// counts as off-lattice (IQ3_S).
    AllIfAnyOffLattice,
}

/// The scale search of the IQ2/IQ3 formats: try the inverse scales
/// `(2 kMaxQ - 1 + i * step) / max` for `i` in `steps`, round each group of
/// `D` magnitudes to odd levels `2l + 1` (`l < kMaxQ`), move a rounded point
/// that is not on the lattice to its weighted-nearest listed neighbour,
/// keep the trial with the best least-squares fit, then re-place points at
/// the fitted scale ([`Refit`]) and fit once more.
pub(super) struct ScaleScan {
    pub steps: RangeInclusive<i32>,
    pub step: f32,
    pub refit: Refit,
}

impl ScaleScan {
    /// Place `xval` (magnitudes, `D` per point) on `lattice`: fills
    /// `levels` and returns the scale. `waux` (sqrt of `weight`) weighs the
    /// neighbour searches; `start` is the scale kept if no trial fits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fit<const D: usize>(
        &self,
        lattice: &Lattice<D>,
        xval: &[f32],
        weight: &[f32],
        waux: &[f32],
        max: f32,
        start: f32,
        levels: &mut [u8],
    ) -> f32 {
        let n = xval.len();
        let points = n / D;
        levels.fill(0);
        let top = lattice.top_level() as i32;
        let odd_max = (2 * top + 1) as f32;
        let round = |id: f32, x: f32| nearest_int(0.5f32 * (id * x - 1.0)).clamp(0, top) as u8;
        let mut trial = [0u8; 32];
        let mut trial_off = [false; 8];
        let mut off = [self.refit == Refit::AllIfAnyOffLattice; 8];
        let (mut best, mut scale) = (0.0f32, start);
        for i in self.steps.clone() {
            let id = (odd_max + i as f32 * self.step) / max;
            let this_scale = 1.0 / id;
            for k in 0..points {
                let (x, t) = (&xval[D * k..D * k + D], &mut trial[D * k..D * k + D]);
                for (l, &v) in t.iter_mut().zip(x) {
                    *l = round(id, v);
                }
                trial_off[k] = lattice.place(t, x, &waux[D * k..D * k + D], this_scale).1;
            }
            let (sumqx, sumq2) = odd_level_sums(xval, weight, &trial[..n]);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                levels.copy_from_slice(&trial[..n]);
                off[..points].copy_from_slice(&trial_off[..points]);
            }
        }
        let any_off = off[..points].iter().any(|&o| o);
        let refit = match self.refit {
            Refit::Always => scale > 0.0,
            _ => any_off && scale > 0.0,
        };
        if refit {
            let id = 1.0 / scale;
            for k in 0..points {
                if self.refit == Refit::OffLattice && !off[k] {
                    continue;
                }
                let (x, l) = (&xval[D * k..D * k + D], &mut levels[D * k..D * k + D]);
                for (l, &v) in l.iter_mut().zip(x) {
                    *l = round(id, v);
                }
                lattice.place(l, x, &waux[D * k..D * k + D], scale);
            }
            let (sumqx, sumq2) = odd_level_sums(xval, weight, levels);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        scale
    }
}
