//! Gemma 4's variants of the shared blocks.
//!
//! - [`KvAttention`]: attention whose keys and values may come from one
//!   projection (V = K before its norm), whose values are RMS-normed without
//!   a weight, whose RoPE has per-pair frequency factors (proportional RoPE),
//!   and which may keep no cache at all and read an earlier layer's
//!   (shared KV).
//! - [`RoutedExperts`]: the MoE half of a Gemma 4 FFN: the router reads the
//!   residual (RMS-normed, times a learned vector, times `n_embd^-0.5`),
//!   softmax over all experts, top-k renormalised, times a per-expert scale;
//!   each expert is GeGLU with gate and up in one fused stack.
//! - [`PerLayerInput`]: the per-layer embedding a block of an E model adds
//!   to the residual.

use std::ops::Range;

use super::super::cache::KvCache;
use super::super::expert_cache::{ExpertCache, ExpertIo};
use super::super::pass::{Attend, Pass};
use super::super::scratch::{heap, take, ActCache};
use super::super::weights::{Experts, Loader, Matrix};
use super::attention::AttnParams;
use super::moe::{top_k, Groups, Slabs};
use super::norm::RmsNorm;
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{ops, MatJob, QActs};

/// The KV cache a [`KvAttention`] layer writes, or the one it only reads.
pub enum Kv<'a> {
    Own(&'a mut KvCache),
    Shared(&'a KvCache),
}

/// Key and value projections of a layer that keeps its own cache.
pub struct KvProj {
    pub k: Matrix, // [n_kv*hd, n_embd]
    /// `None`: the values are the key projection (`attention_k_eq_v`).
    pub v: Option<Matrix>, // [n_kv*hd, n_embd]
    pub k_norm: Vec<f32>, // [hd]
}

/// One Gemma 4 attention layer. Shapes: q `[n_head*hd, n_embd]`, o
/// `[n_embd, n_head*hd]`, q norm `[hd]`.
pub struct KvAttention {
    pub p: AttnParams,
    pub q: Matrix,
    pub q_norm: Vec<f32>,
    /// `None`: a shared-KV layer (it reads an earlier layer's cache).
    pub kv: Option<KvProj>,
    pub o: Matrix,
    /// `[n_rot/2]` RoPE frequency factors (global layers).
    pub rope_factors: Option<Vec<f32>>,
}

/// What the Gemma 4 blocks reuse from pass to pass.
#[derive(Default)]
pub struct Gemma4Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    scores: Vec<f32>,
    input: ActCache,
    acts: QActs,
    // routed experts
    router_in: Vec<f32>,
    logits: Vec<f32>,
    chosen: Vec<u32>,
    weights: Vec<f32>,
    groups: Groups,
    gate_up: Vec<f32>,
    hidden: Vec<f32>,
    down: Vec<f32>,
    /// The two halves of a Gemma 4 MoE FFN (dense MLP, routed experts).
    pub half: Vec<f32>,
    /// Per-layer inputs `[n][n_layer][n_embd_per_layer]` of the pass's tokens.
    pub ple: Vec<f32>,
    pub ple_gate: Vec<f32>,
    /// What the expert cache served this sequence so far.
    pub io: ExpertIo,
    /// The next layer's guessed experts, and one token's guesses.
    ahead: Vec<usize>,
    top: Vec<u32>,
}

impl Gemma4Scratch {
    /// The experts the last routed pass chose, `[n][n_used]`.
    pub fn chosen(&self) -> &[u32] {
        &self.chosen
    }

    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        heap(&self.q)
            + heap(&self.k)
            + heap(&self.v)
            + heap(&self.att)
            + heap(&self.scores)
            + self.input.heap_bytes()
            + self.acts.heap_bytes()
            + heap(&self.router_in)
            + heap(&self.logits)
            + heap(&self.chosen)
            + heap(&self.weights)
            + self.groups.heap_bytes()
            + heap(&self.gate_up)
            + heap(&self.hidden)
            + heap(&self.down)
            + heap(&self.half)
            + heap(&self.ple)
            + heap(&self.ple_gate)
            + heap(&self.ahead)
            + heap(&self.top)
    }
}

impl KvAttention {
    /// Layer `il`'s tensors; `own_kv` false for a shared-KV layer (no k/v).
    pub fn load(
        ld: &Loader,
        il: usize,
        n_embd: usize,
        p: AttnParams,
        own_kv: bool,
        rope_factors: Option<Vec<f32>>,
    ) -> Result<KvAttention> {
        let (hd, q_rows, kv_rows) = (p.head_dim, p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        let kv = if own_kv {
            Some(KvProj {
                k: ld.matrix(TensorKind::AttnK, il, kv_rows, n_embd)?,
                v: ld.matrix_opt(TensorKind::AttnV, il, kv_rows, n_embd)?,
                k_norm: ld.vector(TensorKind::AttnKNorm, il, hd)?,
            })
        } else {
            None
        };
        Ok(KvAttention {
            q: ld.matrix(TensorKind::AttnQ, il, q_rows, n_embd)?,
            q_norm: ld.vector(TensorKind::AttnQNorm, il, hd)?,
            kv,
            o: ld.matrix(TensorKind::AttnOut, il, n_embd, q_rows)?,
            rope_factors,
            p,
        })
    }

    /// `out = Attention(x)` (`[n][n_embd]` each); with its own cache, the
    /// tokens' keys and values join it at `pos0..pos0 + n`, otherwise the
    /// shared cache already holds them (its layer ran earlier in the pass).
    pub fn forward(&self, pass: &Pass, kv: Kv<'_>, s: &mut Gemma4Scratch, x: &[f32], out: &mut [f32]) {
        let (p, n, pos0) = (&self.p, pass.n, pass.pos0);
        let hd = p.head_dim;
        let (q_rows, kv_rows) = (p.n_head * hd, p.n_kv_head * hd);
        let n_embd = x.len() / n;
        let q = take(&mut s.q, n * q_rows);
        let k = take(&mut s.k, n * kv_rows);
        let v = take(&mut s.v, n * kv_rows);

        // Projections: q = Wq x; k = Wk x; v = Wv x (or v = k).
        match &self.kv {
            Some(kp) => {
                let vw = kp.v.as_ref().unwrap_or(&kp.k);
                pass.observe(&[&self.q, &kp.k], x);
                if let Some(vm) = &kp.v {
                    pass.observe(&[vm], x);
                }
                s.input.prepare(x, n, n_embd, &[self.q.ty, kp.k.ty, vw.ty]);
                let mut jobs = vec![
                    MatJob { w: self.q.view(pass.file), x: s.input.get(self.q.ty), rows: None, out: &mut *q },
                    MatJob { w: kp.k.view(pass.file), x: s.input.get(kp.k.ty), rows: None, out: &mut *k },
                ];
                if let Some(vm) = &kp.v {
                    jobs.push(MatJob { w: vm.view(pass.file), x: s.input.get(vm.ty), rows: None, out: &mut *v });
                }
                pass.matmul(&mut jobs);
                if kp.v.is_none() {
                    v.copy_from_slice(k);
                }
            }
            None => {
                pass.observe(&[&self.q], x);
                s.input.prepare(x, n, n_embd, &[self.q.ty]);
                pass.matmul(&mut [MatJob {
                    w: self.q.view(pass.file),
                    x: s.input.get(self.q.ty),
                    rows: None,
                    out: &mut *q,
                }]);
            }
        }

        // Per head: q/k norms (weighted), v norm (weightless), RoPE on q and k.
        let factors = self.rope_factors.as_deref();
        for t in 0..n {
            let pos = pos0 + t;
            let qt = &mut q[t * q_rows..(t + 1) * q_rows];
            let kt = &mut k[t * kv_rows..(t + 1) * kv_rows];
            let vt = &mut v[t * kv_rows..(t + 1) * kv_rows];
            ops::with_rope_angles_factors(p.rope.n_rot, pos, p.rope.base, p.rope.scale, factors, |cs| {
                for qh in qt.chunks_exact_mut(hd) {
                    ops::rms_norm_inplace(qh, Some(&self.q_norm), p.eps);
                }
                ops::rope_apply(qt, hd, cs, p.rope.neox);
                if let Some(kp) = &self.kv {
                    for (kh, vh) in kt.chunks_exact_mut(hd).zip(vt.chunks_exact_mut(hd)) {
                        ops::rms_norm_inplace(kh, Some(&kp.k_norm), p.eps);
                        ops::rms_norm_inplace(vh, None, p.eps);
                    }
                    ops::rope_apply(kt, hd, cs, p.rope.neox);
                }
            });
        }
        let cache: &KvCache = match kv {
            Kv::Own(cache) => {
                for t in 0..n {
                    for h in 0..p.n_kv_head {
                        let r = t * kv_rows + h * hd..t * kv_rows + (h + 1) * hd;
                        cache.store(h, pos0 + t, &k[r.clone()], &v[r]);
                    }
                }
                cache
            }
            Kv::Shared(cache) => cache,
        };

        // softmax(q·K) · V (scale 1: the q/k norms set the temperature), then o.
        let att = take(&mut s.att, n * q_rows);
        let a = Attend { p, cache, q, q_rows, gated: false, sinks: None };
        pass.backend.attend(pass, &a, att, &mut s.scores);
        pass.project(&self.o, &mut s.acts, att, out);
    }
}

/// The routed experts of a Gemma 4 MoE layer.
pub struct RoutedExperts {
    /// Its layer (the expert cache's key).
    pub layer: usize,
    pub n_used: usize,
    pub n_ff: usize,
    pub eps: f32,
    pub router: Matrix, // [n_expert, n_embd]
    /// `[n_embd]`: multiplies the normalised router input.
    pub router_scale: Vec<f32>,
    /// `[n_expert][2*n_ff, n_embd]`: gate rows, then up rows.
    pub gate_up: Experts,
    pub down: Experts, // [n_expert][n_embd, n_ff]
    /// `[n_expert]`: multiplies each expert's routing weight.
    pub expert_scale: Vec<f32>,
    /// The next layer's experts: under a memory budget, its likely experts
    /// are read while this layer computes (see [`Self::read_ahead`]).
    pub ahead: Option<Box<RoutedExperts>>,
}

impl RoutedExperts {
    /// Layer `il`'s router and experts.
    pub fn load(
        ld: &Loader,
        il: usize,
        n_embd: usize,
        (n_expert, n_used, n_ff): (usize, usize, usize),
        eps: f32,
    ) -> Result<RoutedExperts> {
        let scale = |kind: TensorKind, n: usize| ld.vector_shaped(&kind.scale(il), &[n as u64]);
        Ok(RoutedExperts {
            layer: il,
            n_used,
            n_ff,
            eps,
            router: ld.matrix(TensorKind::FfnGateInp, il, n_expert, n_embd)?,
            router_scale: scale(TensorKind::FfnGateInp, n_embd)?,
            gate_up: ld.experts(TensorKind::FfnGateUpExps, il, n_expert, 2 * n_ff, n_embd)?,
            down: ld.experts(TensorKind::FfnDownExps, il, n_expert, n_embd, n_ff)?,
            expert_scale: scale(TensorKind::FfnDownExps, n_expert)?,
            ahead: None,
        })
    }

    /// With layer `next`'s experts to read ahead.
    pub fn with_ahead(mut self, next: RoutedExperts) -> RoutedExperts {
        self.ahead = Some(Box::new(next));
        self
    }

    /// `out = Σ_k w_k · expert_k(x)` per token, routed on `resid` (the
    /// residual stream); `x` is the experts' (normalised) input. Under a
    /// memory budget the experts come from the pass's expert cache, as many
    /// at a time as it holds; one that cannot be read is an I/O error.
    pub fn forward(&self, pass: &Pass, s: &mut Gemma4Scratch, resid: &[f32], x: &[f32], out: &mut [f32]) -> Result<()> {
        let (n, n_embd) = (pass.n, self.router.cols);
        self.route(pass, s, resid);
        s.groups.build(&s.chosen, &s.weights, n, self.router.rows);
        s.input.prepare(x, n, n_embd, &[self.gate_up.all.ty]);
        let n_active = s.groups.active().len();
        if pass.observer.is_some() {
            for (e, seg) in s.groups.segments() {
                pass.observe_expert(&[&self.gate_up], e, x, s.groups.tokens(seg));
            }
        }
        match pass.experts {
            None => {
                if let Some(map) = pass.map {
                    // Mapped: tell the OS which slabs come next (see Moe::forward).
                    for (e, seg) in s.groups.segments() {
                        for x in [&self.gate_up, &self.down].into_iter().filter(|x| !pass.from_copy(x, seg.len())) {
                            let r = x.slab_range(e);
                            map.will_need(r.start, r.len());
                        }
                    }
                }
                self.run(pass, s, 0..n_active, &Slabs::File(pass));
            }
            Some(cache) => {
                // As many experts at a time as the cache holds: those already
                // there are computed while the others are read.
                let tensors = &[&self.gate_up, &self.down];
                let mut first = 0;
                while first < n_active {
                    let lease = cache.fetch(self.layer, &s.groups.active()[first..], tensors)?;
                    if lease.is_empty() {
                        return Err(Error::OutOfMemory("the expert cache holds no expert".into()));
                    }
                    let group = first..first + lease.len();
                    s.io += lease.io;
                    if group == (0..n_active) {
                        self.read_ahead(pass, s, cache, resid);
                    }
                    let split = s.groups.ready_first(group.clone(), |e| lease.is_ready(e));
                    let slabs = Slabs::Cache(&lease);
                    self.run(pass, s, group.start..split, &slabs);
                    lease.wait()?;
                    self.run(pass, s, split..group.end, &slabs);
                    first = group.end;
                }
            }
        }
        // The weighted sum per token.
        out.fill(0.0);
        for (e, seg) in s.groups.segments() {
            for (row, &(t, w)) in seg.zip(s.groups.members(e)) {
                ops::axpy_f32(&mut out[t * n_embd..(t + 1) * n_embd], w, &s.down[row * n_embd..(row + 1) * n_embd]);
            }
        }
        Ok(())
    }

    /// Guess the next layer's experts (its router on this layer's residual,
    /// which changes little from one layer to the next) and start reading
    /// those the cache lacks, into at most half the slots this layer leaves:
    /// three quarters of the k per token, the guesses right most often (as
    /// `Moe::read_ahead`).
    fn read_ahead(&self, pass: &Pass, s: &mut Gemma4Scratch, cache: &ExpertCache, resid: &[f32]) {
        let Some(a) = &self.ahead else { return };
        let (n, n_expert, k) = (pass.n, a.router.rows, a.n_used);
        let room = cache.capacity().saturating_sub(s.groups.active().len()) / 2;
        if room < k {
            return;
        }
        a.router_logits(pass, s, resid);
        let logits = &s.logits[..n * n_expert];
        s.top.resize((k - k / 4).max(1), 0);
        s.ahead.clear();
        for p in logits.chunks_exact(n_expert) {
            top_k(p, &mut s.top);
            for &e in &s.top {
                if !s.ahead.contains(&(e as usize)) && s.ahead.len() < room {
                    s.ahead.push(e as usize);
                }
            }
        }
        s.io += cache.prefetch(a.layer, &s.ahead, &[&a.gate_up, &a.down]);
    }

    /// The router's logits `W_r · (rms_norm(resid) * scale / sqrt(n_embd))`, in `s.logits`.
    fn router_logits(&self, pass: &Pass, s: &mut Gemma4Scratch, resid: &[f32]) {
        let (n, n_expert, n_embd) = (pass.n, self.router.rows, self.router.cols);
        let r = take(&mut s.router_in, n * n_embd);
        let inv = 1.0 / (n_embd as f32).sqrt();
        for (ro, xr) in r.chunks_exact_mut(n_embd).zip(resid.chunks_exact(n_embd)) {
            ops::rms_norm(ro, xr, None, self.eps);
            ro.iter_mut().zip(&self.router_scale).for_each(|(v, &w)| *v = *v * inv * w);
        }
        let logits = take(&mut s.logits, n * n_expert);
        pass.project(&self.router, &mut s.acts, r, logits);
    }

    /// Router: softmax(W_r · (rms_norm(resid) * scale / sqrt(n_embd))) ->
    /// top-k, renormalised, times the experts' scales; into `s.chosen` and
    /// `s.weights`.
    fn route(&self, pass: &Pass, s: &mut Gemma4Scratch, resid: &[f32]) {
        let (n, n_expert, k) = (pass.n, self.router.rows, self.n_used);
        self.router_logits(pass, s, resid);
        pass.observe(&[&self.router], &s.router_in[..n * self.router.cols]);
        let logits = &mut s.logits[..n * n_expert];
        s.chosen.resize(n * k, 0);
        s.weights.resize(n * k, 0.0);
        for t in 0..n {
            let pr = &mut logits[t * n_expert..(t + 1) * n_expert];
            ops::softmax(pr);
            let chosen = &mut s.chosen[t * k..(t + 1) * k];
            top_k(pr, chosen);
            let w = &mut s.weights[t * k..(t + 1) * k];
            for (wi, &e) in w.iter_mut().zip(chosen.iter()) {
                *wi = pr[e as usize];
            }
            let sum = w.iter().sum::<f32>().max(6.103_515_6e-5);
            for (wi, &e) in w.iter_mut().zip(chosen.iter()) {
                *wi = *wi / sum * self.expert_scale[e as usize];
            }
        }
    }

    /// The active experts `group` (indices into the groups' list) over their
    /// tokens: gate|up of all in one batch of products, GeGLU, then every
    /// down projection in a second batch, into `s.down` at their rows.
    fn run(&self, pass: &Pass, s: &mut Gemma4Scratch, group: Range<usize>, slabs: &Slabs<'_>) {
        if group.is_empty() {
            return;
        }
        let (n_ff, n_embd) = (self.n_ff, self.router.cols);
        let g = &s.groups;
        let total = g.total();
        let rows = g.rows_of(group.clone());
        let gu = take(&mut s.gate_up, total * 2 * n_ff);
        {
            let xq = s.input.get(self.gate_up.all.ty);
            let mut jobs = Vec::with_capacity(group.len());
            let mut rest = &mut gu[rows.start * 2 * n_ff..rows.end * 2 * n_ff];
            for i in group.clone() {
                let (e, seg) = g.segment(i);
                let (o, r) = std::mem::take(&mut rest).split_at_mut(seg.len() * 2 * n_ff);
                rest = r;
                let rows = g.tokens(seg);
                jobs.push(MatJob { w: slabs.get(&self.gate_up, 0, e, rows.len()), x: xq, rows: Some(rows), out: o });
            }
            pass.matmul(&mut jobs);
        }
        // GeGLU: hidden = gelu(gate) * up.
        let hidden = take(&mut s.hidden, total * n_ff);
        for (h, row) in hidden[rows.start * n_ff..rows.end * n_ff]
            .chunks_exact_mut(n_ff)
            .zip(gu[rows.start * 2 * n_ff..rows.end * 2 * n_ff].chunks_exact_mut(2 * n_ff))
        {
            let (gate, up) = row.split_at_mut(n_ff);
            ops::gelu_tanh(gate);
            ops::mul(gate, up);
            h.copy_from_slice(gate);
        }
        if pass.observer.is_some() {
            for i in group.clone() {
                let (e, seg) = g.segment(i);
                pass.observe_expert(&[&self.down], e, hidden, g.stacked(seg));
            }
        }
        // down of the group's rows: one quantisation, then every expert in one pass.
        s.acts.quantize(self.down.all.ty, &hidden[rows.start * n_ff..rows.end * n_ff], rows.len(), n_ff);
        let d = take(&mut s.down, total * n_embd);
        let mut jobs = Vec::with_capacity(group.len());
        let mut rest = &mut d[rows.start * n_embd..rows.end * n_embd];
        for i in group {
            let (e, seg) = g.segment(i);
            let (o, r) = std::mem::take(&mut rest).split_at_mut(seg.len() * n_embd);
            rest = r;
            let local = g.stacked(seg.start - rows.start..seg.end - rows.start);
            jobs.push(MatJob { w: slabs.get(&self.down, 1, e, local.len()), x: &s.acts, rows: Some(local), out: o });
        }
        pass.matmul(&mut jobs);
    }
}

/// The per-layer input of one block of an E model:
/// `x += post_norm(proj(gelu(inp_gate · x) * ple_l))`.
pub struct PerLayerInput {
    pub inp_gate: Matrix, // [n_ple, n_embd]
    pub proj: Matrix,     // [n_embd, n_ple]
    pub post_norm: RmsNorm,
}

impl PerLayerInput {
    pub fn load(ld: &Loader, il: usize, n_embd: usize, n_ple: usize, eps: f32) -> Result<PerLayerInput> {
        Ok(PerLayerInput {
            inp_gate: ld.matrix(TensorKind::PerLayerInpGate, il, n_ple, n_embd)?,
            proj: ld.matrix(TensorKind::PerLayerProj, il, n_embd, n_ple)?,
            post_norm: RmsNorm::load(ld, TensorKind::PerLayerPostNorm, il, n_embd, eps)?,
        })
    }

    /// `x += post_norm(proj(gelu(inp_gate · x) * ple))` where `ple` holds
    /// each token's input for this layer (`[n][n_ple]` at a stride of `stride`
    /// from `offset`); `out` is scratch of `[n][n_embd]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        pass: &Pass,
        acts: &mut QActs,
        gate: &mut Vec<f32>,
        ple: &[f32],
        (offset, stride): (usize, usize),
        x: &mut [f32],
        out: &mut [f32],
    ) {
        let (n, n_ple) = (pass.n, self.inp_gate.rows);
        let g = take(gate, n * n_ple);
        pass.project(&self.inp_gate, acts, x, g);
        ops::gelu_tanh(g);
        for (t, gt) in g.chunks_exact_mut(n_ple).enumerate() {
            ops::mul(gt, &ple[t * stride + offset..][..n_ple]);
        }
        pass.project(&self.proj, acts, g, out);
        self.post_norm.forward_inplace(out);
        ops::add(x, out);
    }
}

/// The error for a Gemma 4 layer whose shared KV source does not fit it.
pub fn kv_mismatch(il: usize, source: usize) -> Error {
    Error::InvalidHyperparameter {
        key: "gemma4.attention.shared_kv_layers".into(),
        reason: format!("layer {il} shares the KV cache of layer {source}, whose heads differ"),
    }
}
