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
}

impl Act {
    /// `gate = act(gate) * up`, elementwise.
    pub fn apply(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Act::Silu => ops::silu(gate),
            Act::GeluTanh => ops::gelu_tanh(gate),
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
