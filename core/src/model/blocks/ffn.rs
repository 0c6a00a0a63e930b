//! The dense gated feed-forward block: `down(act(gate · x) * (up · x))`.

use super::super::pass::Pass;
use super::super::scratch::{take, ActCache};
use super::super::weights::{Loader, Matrix};
use crate::error::Result;
use crate::gguf::TensorKind;
use crate::kernels::{ops, MatJob, QActs};

/// The activation between gate and up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// SwiGLU: silu(gate) * up.
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with gate `g` clamped
    /// above and up `u` both ways at [`OAI_LIMIT`], `g·sigmoid(OAI_ALPHA·g)·(u + 1)`.
    SwigluOai,
}

/// The sigmoid's slope of [`Act::SwigluOai`] (llama.cpp's constant).
pub const OAI_ALPHA: f32 = 1.702;
/// The clamp of [`Act::SwigluOai`] (llama.cpp's constant).
pub const OAI_LIMIT: f32 = 7.0;

impl Act {
    /// `gate = act(gate) * up`, elementwise.
    pub fn apply(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Act::Silu => ops::silu(gate),
            Act::GeluTanh => ops::gelu_tanh(gate),
            Act::SwigluOai => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    let x = g.min(OAI_LIMIT);
                    *g = x / (1.0 + (-OAI_ALPHA * x).exp()) * (u.clamp(-OAI_LIMIT, OAI_LIMIT) + 1.0);
                }
                return;
            }
        }
        ops::mul(gate, up);
    }
}

/// A dense gated FFN. Shapes: gate/up `[n_ff, n_embd]`, down `[n_embd, n_ff]`.
pub struct Dense {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub act: Act,
}

/// What the dense FFN reuses from pass to pass.
#[derive(Default)]
pub struct FfnScratch {
    gate: Vec<f32>,
    up: Vec<f32>,
    input: ActCache,
    hidden: QActs,
}

impl FfnScratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        heap(&self.gate) + heap(&self.up) + self.input.heap_bytes() + self.hidden.heap_bytes()
    }
}

impl Dense {
    /// Layer `il`'s `ffn_gate`/`ffn_up`/`ffn_down`.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, n_ff: usize, act: Act) -> Result<Dense> {
        Dense::load_kinds(ld, il, [TensorKind::FfnGate, TensorKind::FfnUp, TensorKind::FfnDown], n_embd, n_ff, act)
    }

    /// The three matrices of the given kinds (a MoE's shared expert has its own).
    pub fn load_kinds(
        ld: &Loader,
        il: usize,
        [gate, up, down]: [TensorKind; 3],
        n_embd: usize,
        n_ff: usize,
        act: Act,
    ) -> Result<Dense> {
        Ok(Dense {
            gate: ld.matrix(gate, il, n_ff, n_embd)?,
            up: ld.matrix(up, il, n_ff, n_embd)?,
            down: ld.matrix(down, il, n_embd, n_ff)?,
            act,
        })
    }

    /// `out = FFN(x)` for the pass's tokens (`[n][n_embd]` each).
    pub fn forward(&self, pass: &Pass, s: &mut FfnScratch, x: &[f32], out: &mut [f32]) {
        let (n, n_ff, n_embd) = (pass.n, self.gate.rows, self.gate.cols);
        pass.observe(&[&self.gate, &self.up], x);
        s.input.prepare(x, n, n_embd, &[self.gate.ty, self.up.ty]);
        let gate = take(&mut s.gate, n * n_ff);
        let up = take(&mut s.up, n * n_ff);
        pass.matmul(&mut [
            MatJob { w: self.gate.view(pass.file), x: s.input.get(self.gate.ty), rows: None, out: gate },
            MatJob { w: self.up.view(pass.file), x: s.input.get(self.up.ty), rows: None, out: up },
        ]);
        self.act.apply(gate, up);
        pass.project(&self.down, &mut s.hidden, gate, out);
    }
}

#[cfg(test)]
mod tests {
    use super::Act;

    #[test]
    fn the_clamped_swiglu_is_ggmls_swiglu_oai() {
        // g * sigmoid(1.702 g) * (u + 1), g clamped above at 7, u both ways.
        let oai = |g: f32, u: f32| g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
        let mut gate = [0.5, -2.0, 9.0, 3.0, -30.0];
        let up = [1.0, 0.25, 2.0, -12.0, 40.0];
        Act::SwigluOai.apply(&mut gate, &up);
        let want = [oai(0.5, 1.0), oai(-2.0, 0.25), oai(7.0, 2.0), oai(3.0, -7.0), oai(-30.0, 7.0)];
        for (g, w) in gate.iter().zip(want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{gate:?} vs {want:?}");
        }
    }
}
