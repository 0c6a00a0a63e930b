//! Feed-forward blocks: the dense gated FFN, and the Mixture-of-Experts FFN
//! that reads only the routed experts' slabs of the mapped file.

use super::attention::project;
use super::scratch::{take, Scratch};
use super::weights::{Experts, Loader, Matrix};
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{self, ops, QActs};
use crate::threads::ThreadPool;

/// The activation between gate and up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// SwiGLU: silu(gate) * up.
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
}

fn activate(act: Act, gate: &mut [f32], up: &[f32]) {
    match act {
        Act::Silu => ops::silu(gate),
        Act::GeluTanh => ops::gelu_tanh(gate),
    }
    ops::mul(gate, up);
}

/// A dense gated FFN: down(act(gate · x) * (up · x)). Shapes: gate/up
/// `[n_ff, n_embd]`, down `[n_embd, n_ff]`.
pub struct Dense {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

impl Dense {
    pub fn load(ld: &Loader, il: usize, n_embd: usize, n_ff: usize) -> Result<Dense> {
        Ok(Dense {
            gate: ld.matrix(TensorKind::FfnGate, il, n_ff, n_embd)?,
            up: ld.matrix(TensorKind::FfnUp, il, n_ff, n_embd)?,
            down: ld.matrix(TensorKind::FfnDown, il, n_embd, n_ff)?,
        })
    }

    /// `s.out = FFN(s.xn)` for `n` tokens.
    pub fn forward(&self, file: &[u8], pool: &ThreadPool, act: Act, n: usize, s: &mut Scratch) {
        let (n_ff, n_embd) = (self.gate.rows, self.gate.cols);
        let xn = &s.xn[..n * n_embd];
        let gate = take(&mut s.gate, n * n_ff);
        let up = take(&mut s.up, n * n_ff);
        project(pool, file, &self.gate, &mut s.acts, xn, n, gate);
        project(pool, file, &self.up, &mut s.acts, xn, n, up);
        activate(act, gate, up);
        let out = take(&mut s.out, n * n_embd);
        project(pool, file, &self.down, &mut s.acts2, &s.gate[..n * n_ff], n, out);
    }
}

/// How router logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

impl Gating {
    /// `{arch}.expert_gating_func`: 1 softmax, 2 sigmoid (llama.cpp's numbering).
    pub fn from_id(id: usize) -> Option<Gating> {
        match id {
            1 => Some(Gating::Softmax),
            2 => Some(Gating::Sigmoid),
            _ => None,
        }
    }
}

/// A shared expert that every token passes through, optionally scaled by
/// sigmoid(gate_inp_shexp · x).
pub struct SharedExpert {
    pub ffn: Dense,
    /// `[1, n_embd]`.
    pub gate_inp: Option<Matrix>,
}

/// A Mixture-of-Experts FFN. Router `[n_expert, n_embd]`; experts stacked
/// `[n_expert][n_ff, n_embd]` (gate, up) and `[n_expert][n_embd, n_ff]` (down).
pub struct Moe {
    pub router: Matrix,
    pub gate: Experts,
    pub up: Experts,
    pub down: Experts,
    pub n_used: usize,
    pub gating: Gating,
    /// Renormalise the selected experts' weights to sum to 1.
    pub norm_weights: bool,
    /// Multiply the weights by this (1 = off).
    pub weights_scale: f32,
    pub shared: Option<SharedExpert>,
}

/// What one forward pass of the MoE block routed where (for tests and stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing {
    /// `[n_tokens][n_used]` expert ids.
    pub experts: Vec<u32>,
}

impl Moe {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        ld: &Loader,
        il: usize,
        n_embd: usize,
        n_ff: usize,
        n_expert: usize,
        n_used: usize,
        gating: Gating,
        norm_weights: bool,
        weights_scale: f32,
    ) -> Result<Moe> {
        if n_used == 0 || n_used > n_expert {
            return Err(Error::InvalidHyperparameter {
                key: "expert_used_count".into(),
                reason: format!("{n_used} of {n_expert} experts"),
            });
        }
        Ok(Moe {
            router: ld.matrix(TensorKind::FfnGateInp, il, n_expert, n_embd)?,
            gate: ld.experts(TensorKind::FfnGateExps, il, n_expert, n_ff, n_embd)?,
            up: ld.experts(TensorKind::FfnUpExps, il, n_expert, n_ff, n_embd)?,
            down: ld.experts(TensorKind::FfnDownExps, il, n_expert, n_embd, n_ff)?,
            n_used,
            gating,
            norm_weights,
            weights_scale,
            shared: None,
        })
    }

    pub fn n_expert(&self) -> usize {
        self.router.rows
    }

    /// `s.out = MoE(s.xn)` for `n` tokens. Tokens are grouped by expert so
    /// each routed expert runs once over all its tokens, and unrouted experts
    /// are never touched. Each call appends its routing to `trace` when given.
    pub fn forward(&self, file: &[u8], pool: &ThreadPool, n: usize, s: &mut Scratch, trace: Option<&mut Vec<Routing>>) {
        let n_embd = self.router.cols;
        let n_expert = self.n_expert();
        let n_ff = self.gate.rows;
        let k = self.n_used;
        let xn = &s.xn[..n * n_embd];

        // Router: logits -> probabilities -> top-k -> weights.
        let probs = take(&mut s.router, n * n_expert);
        project(pool, file, &self.router, &mut s.acts, xn, n, probs);
        let mut chosen = vec![0u32; n * k];
        let mut weights = vec![0f32; n * k];
        for t in 0..n {
            let p = &mut probs[t * n_expert..(t + 1) * n_expert];
            match self.gating {
                Gating::Softmax => ops::softmax(p),
                Gating::Sigmoid => p.iter_mut().for_each(|v| *v = ops::sigmoid(*v)),
            }
            top_k(p, &mut chosen[t * k..(t + 1) * k]);
            let w = &mut weights[t * k..(t + 1) * k];
            for (wi, &e) in w.iter_mut().zip(&chosen[t * k..(t + 1) * k]) {
                *wi = p[e as usize];
            }
            if self.norm_weights {
                let sum: f32 = w.iter().sum::<f32>().max(6.103_515_6e-5);
                w.iter_mut().for_each(|x| *x /= sum);
            }
            if self.weights_scale != 1.0 && self.weights_scale != 0.0 {
                w.iter_mut().for_each(|x| *x *= self.weights_scale);
            }
        }
        if let Some(tr) = trace {
            tr.push(Routing { experts: chosen.clone() });
        }

        // Group tokens by expert.
        let mut members: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_expert];
        for t in 0..n {
            for j in 0..k {
                members[chosen[t * k + j] as usize].push((t, weights[t * k + j]));
            }
        }

        let out = take(&mut s.moe, n * n_embd);
        out.fill(0.0);
        let mut gate_acts = std::mem::take(&mut s.acts);
        gate_acts.quantize(self.gate.all.ty, xn, n, n_embd);
        let mut up_acts = QActs::new();
        let same = self.up.all.ty == self.gate.all.ty;
        if !same {
            up_acts.quantize(self.up.all.ty, xn, n, n_embd);
        }
        let mut rows = Vec::new();
        for (e, toks) in members.iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let m = toks.len();
            rows.clear();
            rows.extend(toks.iter().map(|&(t, _)| t));
            // gate and up over this expert's tokens, then act(gate) * up.
            let g = take(&mut s.gate, m * n_ff);
            let u = take(&mut s.up, m * n_ff);
            kernels::matmul_rows(pool, &self.gate.slab(file, e), &gate_acts, &rows, g);
            let ua = if same { &gate_acts } else { &up_acts };
            kernels::matmul_rows(pool, &self.up.slab(file, e), ua, &rows, u);
            activate(Act::Silu, g, u);
            // down, then the weighted sum into each token's output.
            let d = take(&mut s.tmp, m * n_embd);
            s.acts2.quantize(self.down.all.ty, &s.gate[..m * n_ff], m, n_ff);
            kernels::matmul(pool, &self.down.slab(file, e), &s.acts2, d);
            for (j, &(t, wgt)) in toks.iter().enumerate() {
                ops::axpy_f32(&mut out[t * n_embd..(t + 1) * n_embd], wgt, &d[j * n_embd..(j + 1) * n_embd]);
            }
        }
        s.acts = gate_acts;

        if let Some(sh) = &self.shared {
            sh.ffn.forward(file, pool, Act::Silu, n, s);
            if let Some(gi) = &sh.gate_inp {
                let gl = take(&mut s.tmp, n);
                project(pool, file, gi, &mut s.acts, &s.xn[..n * n_embd], n, gl);
                for t in 0..n {
                    let g = ops::sigmoid(s.tmp[t]);
                    s.out[t * n_embd..(t + 1) * n_embd].iter_mut().for_each(|v| *v *= g);
                }
            }
            ops::add(&mut s.out[..n * n_embd], &s.moe[..n * n_embd]);
        } else {
            let (out, moe) = (&mut s.out, &s.moe);
            take(out, n * n_embd).copy_from_slice(&moe[..n * n_embd]);
        }
    }
}

/// Indices of the `out.len()` largest values, largest first (ties: lower index first).
pub fn top_k(values: &[f32], out: &mut [u32]) {
    let k = out.len();
    let mut filled = 0usize;
    for (i, &v) in values.iter().enumerate() {
        // Insertion into a small sorted list: k is 2..8.
        let mut pos = filled;
        while pos > 0 && values[out[pos - 1] as usize] < v {
            pos -= 1;
        }
        if pos < k {
            let end = filled.min(k - 1);
            out.copy_within(pos..end, pos + 1);
            out[pos] = i as u32;
            filled = (filled + 1).min(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_picks_largest_in_order() {
        let v = [0.1, 0.5, 0.3, 0.9, 0.5, -1.0];
        let mut out = [0u32; 3];
        top_k(&v, &mut out);
        assert_eq!(out, [3, 1, 4]);
        let mut one = [0u32; 1];
        top_k(&v, &mut one);
        assert_eq!(one, [3]);
        let mut all = [0u32; 6];
        top_k(&v, &mut all);
        assert_eq!(all, [3, 1, 4, 2, 0, 5]);
    }
}
