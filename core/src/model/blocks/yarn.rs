//! YaRN RoPE (as ggml computes it): each rotated pair's angle blends the
//! interpolated angle (`freq_scale * θ`) and the original one (`θ`). The
//! high-frequency pairs (more than `beta_fast` turns over the original
//! context) keep their original angle, the low-frequency ones (fewer than
//! `beta_slow` turns) take the interpolated one, with a linear ramp between;
//! cos and sin are scaled by `mscale`.

/// One layer's rotation: plain RoPE (`ext_factor` 0, linear `freq_scale`)
/// or YaRN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Rotated dims (even).
    pub n_rot: usize,
    pub base: f32,
    /// `1 / factor`.
    pub freq_scale: f32,
    /// How much of the original angle the ramp mixes back in (1 for YaRN, 0 off).
    pub ext_factor: f32,
    /// The pairs (in dims) where the ramp starts and ends.
    pub corr_dims: [f32; 2],
    /// cos and sin are multiplied by this.
    pub mscale: f32,
}

impl Yarn {
    /// Plain RoPE with a linear frequency scale.
    pub fn linear(n_rot: usize, base: f32, freq_scale: f32) -> Yarn {
        Yarn { n_rot, base, freq_scale, ext_factor: 0.0, corr_dims: [0.0, 0.0], mscale: 1.0 }
    }

    /// YaRN over an original context of `n_ctx_orig` with ramp bounds
    /// `beta_fast`/`beta_slow` (turns), scaling cos and sin by `mscale`.
    pub fn extended(n_rot: usize, base: f32, freq_scale: f32, n_ctx_orig: usize, beta: [f32; 2], mscale: f32) -> Yarn {
        // The dim whose wavelength makes `turns` turns over the original context.
        let dim = |turns: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (turns * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
        };
        let start = dim(beta[0]).floor().max(0.0);
        let end = dim(beta[1]).ceil().min(n_rot as f32 - 1.0);
        Yarn { n_rot, base, freq_scale, ext_factor: 1.0, corr_dims: [start, end], mscale }
    }

    /// `(cos, sin)` of the `n_rot / 2` angles at position `pos` into `cs`.
    pub fn angles(&self, pos: usize, cs: &mut [(f32, f32)]) {
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        let [low, high] = self.corr_dims;
        let mut theta_extrap = pos as f32;
        for (i, c) in cs.iter_mut().enumerate().take(self.n_rot / 2) {
            let interp = self.freq_scale * theta_extrap;
            let theta = if self.ext_factor != 0.0 {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                interp * (1.0 - mix) + theta_extrap * mix
            } else {
                interp
            };
            *c = (theta.cos() * self.mscale, theta.sin() * self.mscale);
            theta_extrap *= theta_scale;
        }
    }
}

/// ggml's YaRN magnitude `0.1 * m * ln(s) + 1` for a context `s` times the
/// original (1 when not extended).
pub fn yarn_mscale(s: f32, m: f32) -> f32 {
    if s <= 1.0 {
        1.0
    } else {
        0.1 * m * s.ln() + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::Yarn;
    use crate::kernels::ops;

    #[test]
    fn without_extension_it_is_plain_rope() {
        let y = Yarn::linear(16, 10_000.0, 0.25);
        let mut cs = [(0.0, 0.0); 8];
        for pos in [0, 1, 7, 300] {
            y.angles(pos, &mut cs);
            ops::with_rope_angles(16, pos, 10_000.0, 0.25, |want| {
                for (a, b) in cs.iter().zip(want) {
                    assert!((a.0 - b.0).abs() < 1e-5 && (a.1 - b.1).abs() < 1e-5, "{pos}: {a:?} vs {b:?}");
                }
            });
        }
    }

    #[test]
    fn yarn_keeps_fast_pairs_and_interpolates_slow_ones() {
        // DeepSeek tiny: 16 dims, base 1e4, factor 4, original context 128, beta 32/1.
        let y = Yarn::extended(16, 10_000.0, 0.25, 128, [32.0, 1.0], 1.0);
        // start = floor(16 ln(128 / 64π) / 2 ln 1e4) = floor(-0.39) -> 0; end = ceil(16 ln(128/2π) / 2 ln 1e4) = 3.
        assert_eq!(y.corr_dims, [0.0, 3.0]);
        let mut cs = [(0.0, 0.0); 8];
        let pos = 5;
        y.angles(pos, &mut cs);
        let theta = |i: usize| pos as f32 * 10_000f32.powf(-2.0 * i as f32 / 16.0);
        // Pair 0: the original angle; pairs 3 and on: interpolated; pair 1: two thirds original.
        assert!((cs[0].0 - theta(0).cos()).abs() < 1e-5);
        assert!((cs[5].1 - (0.25 * theta(5)).sin()).abs() < 1e-6);
        let mixed = theta(1) * (2.0 / 3.0) + 0.25 * theta(1) / 3.0;
        assert!((cs[1].0 - mixed.cos()).abs() < 1e-5, "{:?} vs {}", cs[1], mixed.cos());
    }
}
