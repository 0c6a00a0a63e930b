//! RMSNorm over the rows of the residual stream.

use super::super::weights::Loader;
use crate::error::Result;
use crate::gguf::TensorKind;
use crate::kernels::ops;

/// `x / rms(x) * w` per row of `w.len()` values.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub w: Vec<f32>,
    pub eps: f32,
}

impl RmsNorm {
    /// Layer `il`'s norm weight of this kind, `[n_embd]`.
    pub fn load(ld: &Loader, kind: TensorKind, il: usize, n_embd: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm { w: ld.vector(kind, il, n_embd)?, eps })
    }

    /// `out = RMSNorm(x)`, row by row.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        for (o, r) in out.chunks_exact_mut(self.w.len()).zip(x.chunks_exact(self.w.len())) {
            ops::rms_norm(o, r, Some(&self.w), self.eps);
        }
    }

    /// `x = RMSNorm(x)`, row by row.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        for r in x.chunks_exact_mut(self.w.len()) {
            ops::rms_norm_inplace(r, Some(&self.w), self.eps);
        }
    }
}
