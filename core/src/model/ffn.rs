//! Feed-forward blocks: the dense gated FFN, and the Mixture-of-Experts FFN
//! that reads only the routed experts' slabs of the mapped file.

use super::attention::project;
use super::scratch::{take, Scratch};
use super::weights::{Experts, Loader, Matrix};
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{self, ops, MatJob};
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
        let n_embd = self.gate.cols;
        s.shared.prepare(&s.xn[..n * n_embd], n, n_embd, &[self.gate.ty, self.up.ty]);
        self.forward_prepared(file, pool, act, n, s);
    }

    /// As [`forward`](Self::forward) with `s.shared` already holding the input.
    fn forward_prepared(&self, file: &[u8], pool: &ThreadPool, act: Act, n: usize, s: &mut Scratch) {
        let (n_ff, n_embd) = (self.gate.rows, self.gate.cols);
        let gate = take(&mut s.gate, n * n_ff);
        let up = take(&mut s.up, n * n_ff);
        kernels::matmul_batch(
            pool,
            &mut [
                MatJob { w: self.gate.view(file), x: s.shared.get(self.gate.ty), rows: None, out: gate },
                MatJob { w: self.up.view(file), x: s.shared.get(self.up.ty), rows: None, out: up },
            ],
        );
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
    /// sqrt(softplus(x)).
    SqrtSoftplus,
}

impl Gating {
    /// `{arch}.expert_gating_func` (1 softmax, 2 sigmoid, 4 sqrt-softplus), or
    /// `default` when the file does not say.
    pub fn from_meta(m: &super::hparams::Meta, default: Gating) -> Result<Gating> {
        use crate::gguf::Key;
        match m.usize_or(Key::ExpertGatingFunc, 0)? {
            0 => Ok(default),
            1 => Ok(Gating::Softmax),
            2 => Ok(Gating::Sigmoid),
            4 => Ok(Gating::SqrtSoftplus),
            other => Err(Error::InvalidHyperparameter {
                key: m.key(Key::ExpertGatingFunc),
                reason: format!("unknown gating function {other}"),
            }),
        }
    }
}

/// A shared expert that every token passes through, optionally scaled by
/// sigmoid(gate_inp_shexp · x).
pub struct SharedExpert {
    pub ffn: Dense,
    /// `[n_embd]`.
    pub gate_inp: Option<Vec<f32>>,
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

        // One quantisation of the input for the router, the experts and the shared expert.
        let (shared_gate, shared_up) =
            self.shared.as_ref().map_or((self.gate.all.ty, self.up.all.ty), |sh| (sh.ffn.gate.ty, sh.ffn.up.ty));
        let tys = [self.router.ty, self.gate.all.ty, self.up.all.ty, shared_gate, shared_up];
        s.shared.prepare(&s.xn[..n * n_embd], n, n_embd, &tys);

        // Router: logits -> probabilities -> top-k -> weights.
        let probs = take(&mut s.router, n * n_expert);
        kernels::matmul(pool, &self.router.view(file), s.shared.get(self.router.ty), probs);
        s.chosen.resize(n * k, 0);
        s.weights.resize(n * k, 0.0);
        for t in 0..n {
            let p = &mut probs[t * n_expert..(t + 1) * n_expert];
            match self.gating {
                Gating::Softmax => ops::softmax(p),
                Gating::Sigmoid => p.iter_mut().for_each(|v| *v = ops::sigmoid(*v)),
                Gating::SqrtSoftplus => p.iter_mut().for_each(|v| *v = softplus(*v).sqrt()),
            }
            let chosen = &mut s.chosen[t * k..(t + 1) * k];
            top_k(p, chosen);
            let w = &mut s.weights[t * k..(t + 1) * k];
            for (wi, &e) in w.iter_mut().zip(chosen.iter()) {
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
            tr.push(Routing { experts: s.chosen.clone() });
        }

        // Group tokens by expert: expert e's tokens take rows seg[e]..seg[e+1]
        // of the stacked expert inputs and outputs.
        s.members.resize_with(n_expert, Vec::new);
        s.members.iter_mut().for_each(Vec::clear);
        for t in 0..n {
            for j in 0..k {
                s.members[s.chosen[t * k + j] as usize].push((t, s.weights[t * k + j]));
            }
        }
        let members = std::mem::take(&mut s.members);
        let active: Vec<usize> = (0..n_expert).filter(|&e| !members[e].is_empty()).collect();
        let mut seg = Vec::with_capacity(active.len() + 1);
        seg.push(0usize);
        for &e in &active {
            seg.push(seg.last().copied().unwrap_or(0) + members[e].len());
        }
        let total = n * k;
        s.rows.clear();
        for &e in &active {
            s.rows.extend(members[e].iter().map(|&(t, _)| t));
        }
        if s.iota.len() < total.max(n) {
            s.iota = (0..total.max(n)).collect();
        }
        let n_ffs = self.shared.as_ref().map_or(0, |sh| sh.ffn.gate.rows);

        // gate and up of every routed expert (and of the shared expert) in one pass.
        let g_all = take(&mut s.gate, total * n_ff + n * n_ffs);
        let u_all = take(&mut s.up, total * n_ff + n * n_ffs);
        {
            let (g_routed, g_shared) = g_all.split_at_mut(total * n_ff);
            let (u_routed, u_shared) = u_all.split_at_mut(total * n_ff);
            let mut jobs = Vec::with_capacity(2 * active.len() + 2);
            let (mut g_rest, mut u_rest) = (g_routed, u_routed);
            for (i, &e) in active.iter().enumerate() {
                let m = seg[i + 1] - seg[i];
                let rows = &s.rows[seg[i]..seg[i + 1]];
                let (g, gr) = std::mem::take(&mut g_rest).split_at_mut(m * n_ff);
                let (u, ur) = std::mem::take(&mut u_rest).split_at_mut(m * n_ff);
                (g_rest, u_rest) = (gr, ur);
                jobs.push(MatJob {
                    w: self.gate.slab(file, e),
                    x: s.shared.get(self.gate.all.ty),
                    rows: Some(rows),
                    out: g,
                });
                jobs.push(MatJob {
                    w: self.up.slab(file, e),
                    x: s.shared.get(self.up.all.ty),
                    rows: Some(rows),
                    out: u,
                });
            }
            if let Some(sh) = &self.shared {
                jobs.push(MatJob {
                    w: sh.ffn.gate.view(file),
                    x: s.shared.get(sh.ffn.gate.ty),
                    rows: None,
                    out: g_shared,
                });
                jobs.push(MatJob { w: sh.ffn.up.view(file), x: s.shared.get(sh.ffn.up.ty), rows: None, out: u_shared });
            }
            kernels::matmul_batch(pool, &mut jobs);
        }
        activate(Act::Silu, g_all, u_all);

        // down: one quantisation of all expert inputs, then every expert in one pass.
        let d_all = take(&mut s.tmp, total * n_embd);
        let sh_out = take(&mut s.out, n * n_embd);
        s.acts2.quantize(self.down.all.ty, &g_all[..total * n_ff], total, n_ff);
        let shared_down_ty = self.shared.as_ref().map(|sh| sh.ffn.down.ty);
        if let Some(ty) = shared_down_ty {
            s.acts.quantize(ty, &g_all[total * n_ff..total * n_ff + n * n_ffs], n, n_ffs);
        }
        {
            let mut jobs = Vec::with_capacity(active.len() + 1);
            let mut d_rest = &mut d_all[..];
            for (i, &e) in active.iter().enumerate() {
                let m = seg[i + 1] - seg[i];
                let (d, dr) = std::mem::take(&mut d_rest).split_at_mut(m * n_embd);
                d_rest = dr;
                jobs.push(MatJob {
                    w: self.down.slab(file, e),
                    x: &s.acts2,
                    rows: Some(&s.iota[seg[i]..seg[i + 1]]),
                    out: d,
                });
            }
            if let Some(sh) = &self.shared {
                jobs.push(MatJob { w: sh.ffn.down.view(file), x: &s.acts, rows: None, out: sh_out });
            }
            kernels::matmul_batch(pool, &mut jobs);
        }

        // The weighted sum of the experts' outputs, per token.
        let out = take(&mut s.moe, n * n_embd);
        out.fill(0.0);
        for (i, &e) in active.iter().enumerate() {
            for (j, &(t, wgt)) in members[e].iter().enumerate() {
                let row = seg[i] + j;
                ops::axpy_f32(&mut out[t * n_embd..(t + 1) * n_embd], wgt, &s.tmp[row * n_embd..(row + 1) * n_embd]);
            }
        }
        s.members = members;

        if let Some(sh) = &self.shared {
            // The shared expert, gated by sigmoid(gate_inp · x), joins the routed sum.
            if let Some(gi) = &sh.gate_inp {
                for t in 0..n {
                    let g = ops::sigmoid(ops::dot_f32(&s.xn[t * n_embd..(t + 1) * n_embd], gi));
                    ops::scale(&mut s.out[t * n_embd..(t + 1) * n_embd], g);
                }
            }
            ops::add(&mut s.out[..n * n_embd], &s.moe[..n * n_embd]);
        } else {
            let (out, moe) = (&mut s.out, &s.moe);
            take(out, n * n_embd).copy_from_slice(&moe[..n * n_embd]);
        }
    }
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
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
