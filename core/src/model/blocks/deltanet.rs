//! Gated DeltaNet (linear attention with a gated delta rule), as Qwen3.5's
//! linear-attention layers store it in GGUF.
//!
//! Per token: project x to q|k|v (one matrix), the output gate z, beta and the
//! decay input alpha; run a short causal depthwise conv (kernel 4) over q|k|v
//! with SiLU; L2-normalise q and k per head; then for every value head h
//! (using key head h mod n_k_heads) with state S (d_k x d_v):
//!
//! ```text
//!   S <- exp(g) S                      g = softplus(alpha + dt_bias) * a   (a = -exp(A_log), stored)
//!   u  = S^T k
//!   S <- S + k ((v - u) * beta)^T      beta = sigmoid(beta_proj)
//!   o  = S^T (q / sqrt(d_k))
//! ```
//!
//! and the output is RMSNorm(o) * SiLU(z) per head, projected back to n_embd.

pub use super::super::params::DeltaParams;
use super::super::pass::{DeltaRule, Pass};
use super::super::scratch::{take, ActCache, SharedMut};
use super::super::ssm::Ssm;
use super::super::weights::{Loader, Matrix};
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{ops, MatJob, QActs};
use crate::threads::Pieces;

/// One DeltaNet layer: its shape and weights. Shapes (rows x cols): qkv `[conv_dim, n_embd]`,
/// gate (z) `[value_dim, n_embd]`, beta/alpha `[n_v_heads, n_embd]`,
/// conv `[d_conv][conv_dim]` (tap-major: transposed from the file's `[conv_dim][d_conv]` at load, so each
/// tap is one contiguous row over the channels), dt_bias/a `[n_v_heads]`, norm `[d_v]`, out `[n_embd, value_dim]`.
pub struct DeltaNet {
    pub p: DeltaParams,
    pub qkv: Matrix,
    pub gate: Matrix,
    pub beta: Matrix,
    pub alpha: Matrix,
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: Matrix,
}

impl DeltaScratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        heap(&self.qkv)
            + heap(&self.conv)
            + heap(&self.z)
            + heap(&self.beta_g)
            + heap(&self.o)
            + heap(&self.rule)
            + self.input.heap_bytes()
            + self.heads.heap_bytes()
    }
}

impl DeltaNet {
    /// Layer `il`'s tensors.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, p: DeltaParams) -> Result<DeltaNet> {
        let (cd, vd, hv) = (p.conv_dim(), p.value_dim(), p.n_v_heads);
        Ok(DeltaNet {
            p,
            qkv: ld.matrix(TensorKind::AttnQkv, il, cd, n_embd)?,
            gate: ld.matrix(TensorKind::AttnGate, il, vd, n_embd)?,
            beta: ld.matrix(TensorKind::SsmBeta, il, hv, n_embd)?,
            alpha: ld.matrix(TensorKind::SsmAlpha, il, hv, n_embd)?,
            conv: taps_major(
                &ld.vector_shaped(&TensorKind::SsmConv1d.weight(il), &[p.d_conv as u64, cd as u64])?,
                p.d_conv,
            ),
            dt_bias: ld.vector_shaped(&TensorKind::SsmDt.bias(il), &[hv as u64])?,
            a: ld.vector_shaped(&TensorKind::SsmA.weight(il), &[hv as u64])?,
            norm: ld.vector(TensorKind::SsmNorm, il, p.d_v)?,
            out: ld.matrix(TensorKind::SsmOut, il, n_embd, vd)?,
        })
    }
}

/// `[channels][taps]` -> `[taps][channels]`.
pub(super) fn taps_major(w: &[f32], taps: usize) -> Vec<f32> {
    let channels = w.len() / taps;
    (0..taps * channels).map(|i| w[(i % channels) * taps + i / channels]).collect()
}

/// Recurrent state of one DeltaNet layer for one sequence.
#[derive(Debug)]
pub struct DeltaState {
    /// The last `d_conv - 1` conv inputs, oldest first: `[d_conv-1][conv_dim]`;
    /// a backend may hold its newest values on its device, as it may S's.
    pub conv: Ssm,
    /// Per value head, S as `[d_k][d_v]` (rows indexed by key dim); a
    /// backend may hold its newest values on its device.
    pub ssm: Ssm,
}

/// A copy of a [`DeltaState`]'s values (a checkpoint's, a snapshot's).
#[derive(Clone, Debug, PartialEq)]
pub struct SavedDelta {
    pub conv: Vec<f32>,
    pub ssm: Vec<f32>,
}

impl DeltaState {
    pub fn new(p: &DeltaParams) -> DeltaState {
        DeltaState { conv: Ssm::new((p.d_conv - 1) * p.conv_dim()), ssm: Ssm::new(p.n_v_heads * p.d_k * p.d_v) }
    }

    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * 4
    }

    pub fn clear(&mut self) {
        self.conv.clear();
        self.ssm.clear();
    }

    /// The values now (read back from a device that holds newer ones).
    pub fn save(&self) -> Result<SavedDelta> {
        Ok(SavedDelta { conv: self.conv.read()?.into_owned(), ssm: self.ssm.read()?.into_owned() })
    }

    /// [`save`](Self::save) into `saved`, reusing its memory.
    pub fn save_into(&self, saved: &mut SavedDelta) -> Result<()> {
        let (conv, ssm) = (self.conv.read()?, self.ssm.read()?);
        saved.conv.clear();
        saved.conv.extend_from_slice(&conv);
        saved.ssm.clear();
        saved.ssm.extend_from_slice(&ssm);
        Ok(())
    }

    /// Zeros of this state's shape, to read saved values into.
    pub fn blank(&self) -> SavedDelta {
        SavedDelta { conv: vec![0.0; self.conv.len()], ssm: vec![0.0; self.ssm.len()] }
    }

    /// Take `saved`'s values (a device's copies are stale from then on).
    pub fn load(&mut self, saved: &SavedDelta) -> Result<()> {
        if saved.conv.len() != self.conv.len() || saved.ssm.len() != self.ssm.len() {
            return Err(Error::InvalidArgument(format!(
                "a saved recurrent state of {} + {} values for one of {} + {}",
                saved.conv.len(),
                saved.ssm.len(),
                self.conv.len(),
                self.ssm.len()
            )));
        }
        self.conv.overwrite().copy_from_slice(&saved.conv);
        self.ssm.overwrite().copy_from_slice(&saved.ssm);
        Ok(())
    }
}

/// What a DeltaNet layer reuses from pass to pass.
#[derive(Default)]
pub struct DeltaScratch {
    /// q|k|v before the conv, `[n][conv_dim]`, and after it.
    qkv: Vec<f32>,
    conv: Vec<f32>,
    /// The output gate z `[n][value_dim]`; beta and the log decays `[2][n][n_v_heads]`.
    z: Vec<f32>,
    beta_g: Vec<f32>,
    /// The heads' outputs `[n][value_dim]`.
    o: Vec<f32>,
    /// The backend's own scratch.
    rule: Vec<f32>,
    input: ActCache,
    heads: QActs,
}

impl DeltaNet {
    /// `out = DeltaNet(x)` for the pass's tokens (`[n][n_embd]` each); the
    /// state advances by `n` tokens. Fails only when S, newer on a device,
    /// cannot be read back for the CPU.
    pub fn forward(
        &self,
        pass: &Pass,
        st: &mut DeltaState,
        s: &mut DeltaScratch,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let (p, n) = (&self.p, pass.n);
        let (cd, vd, hv) = (p.conv_dim(), p.value_dim(), p.n_v_heads);
        let n_embd = x.len() / n;

        // Input projections: q|k|v (pre-conv), the output gate z, beta and alpha.
        pass.observe(&[&self.qkv, &self.gate, &self.beta, &self.alpha], x);
        s.input.prepare(x, n, n_embd, &[self.qkv.ty, self.gate.ty, self.beta.ty, self.alpha.ty]);
        let qkv = take(&mut s.qkv, n * cd);
        let z = take(&mut s.z, n * vd);
        let (beta, g) = take(&mut s.beta_g, 2 * n * hv).split_at_mut(n * hv);
        let f = pass.file;
        pass.matmul(&mut [
            MatJob { w: self.qkv.view(f), x: s.input.get(self.qkv.ty), rows: None, out: qkv },
            MatJob { w: self.gate.view(f), x: s.input.get(self.gate.ty), rows: None, out: z },
            MatJob { w: self.beta.view(f), x: s.input.get(self.beta.ty), rows: None, out: beta },
            MatJob { w: self.alpha.view(f), x: s.input.get(self.alpha.ty), rows: None, out: g },
        ]);
        // beta = sigmoid(.), g = softplus(alpha + dt_bias) * a (a < 0: a decay rate)
        beta.iter_mut().for_each(|b| *b = ops::sigmoid(*b));
        for row in g.chunks_exact_mut(hv) {
            for ((g, &bias), &a) in row.iter_mut().zip(&self.dt_bias).zip(&self.a) {
                *g = softplus(*g + bias) * a;
            }
        }

        // Causal depthwise conv (kernel d_conv) over [state window | new inputs], then SiLU.
        let conv_out = take(&mut s.conv, n * cd);
        let hist = p.d_conv - 1;
        let window = st.conv.host_mut()?;
        for t in 0..n {
            let out = &mut conv_out[t * cd..(t + 1) * cd];
            for (j, taps) in self.conv.chunks_exact(cd).enumerate() {
                // Input at time t + j - hist: from the state window when negative.
                let i = t + j;
                let x =
                    if i < hist { &window[i * cd..(i + 1) * cd] } else { &qkv[(i - hist) * cd..(i - hist + 1) * cd] };
                if j == 0 {
                    out.iter_mut().zip(x).zip(taps).for_each(|((o, &x), &k)| *o = x * k);
                } else {
                    out.iter_mut().zip(x).zip(taps).for_each(|((o, &x), &k)| *o += x * k);
                }
            }
            ops::silu(out);
        }
        // The window now holds the last `hist` inputs: shift the state, then copy new rows in.
        let keep = hist.saturating_sub(n);
        window.copy_within((hist - keep) * cd..hist * cd, 0);
        let fresh = hist - keep;
        window[keep * cd..].copy_from_slice(&qkv[(n - fresh) * cd..n * cd]);

        // L2-normalise q and k of every key head.
        let kd = p.key_dim();
        for t in 0..n {
            let row = &mut conv_out[t * cd..t * cd + 2 * kd];
            row.chunks_exact_mut(p.d_k).for_each(|h| l2_norm(h, p.eps));
        }

        // The delta rule, on the backend.
        let o = take(&mut s.o, n * vd);
        let rule = DeltaRule { p, qkv: conv_out, g, beta };
        pass.backend.delta_rule(pass, &rule, &mut st.ssm, o, &mut s.rule)?;

        // Gated RMSNorm per head: RMSNorm(o) * SiLU(z).
        ops::silu(z);
        for (oh, zh) in o.chunks_exact_mut(p.d_v).zip(z.chunks_exact(p.d_v)) {
            ops::rms_norm_inplace(oh, Some(&self.norm), p.eps);
            ops::mul(oh, zh);
        }

        // Output projection.
        pass.project(&self.out, &mut s.heads, o, out);
        Ok(())
    }
}

/// [`crate::model::pass::Backend::delta_rule`] on the CPU: value heads are
/// independent, so threads claim them one at a time ([`Pieces`]: a slow core
/// takes fewer); each head runs token by
/// token, or in chunks (see [`ChunkScratch`]) for long prompts.
pub(crate) fn delta_rule_cpu(pass: &Pass, d: &DeltaRule<'_>, ssm: &mut [f32], o: &mut [f32], scratch: &mut Vec<f32>) {
    let (p, conv_out, beta, g, n, pool) = (d.p, d.qkv, d.beta, d.g, pass.n, pass.pool);
    let (cd, vd, hv, kd) = (p.conv_dim(), p.value_dim(), p.n_v_heads, p.key_dim());
    // Per-thread scratch: the scaled queries of every token, and u.
    let per_thread = n * p.d_k + p.d_v;
    let tmp = take(scratch, pool.n_threads() * per_thread);
    let (o_out, ssm, tmp) = (SharedMut::new(o), SharedMut::new(ssm), SharedMut::new(tmp));
    let q_scale = 1.0 / (p.d_k as f32).sqrt();
    let heads = Pieces::new(hv);
    pool.run(&|ith, _| {
        // SAFETY: each thread owns its stripe of `tmp`, and the heads it claims of the state and outputs.
        let (qs, u) = unsafe { tmp.slice(ith * per_thread, per_thread) }.split_at_mut(n * p.d_k);
        // Not in one-row mode (a speculative verify pass): its tokens must
        // each be computed as a decode step computes them, and the chunked
        // form sums in another order.
        let chunked = n >= CHUNKED_FROM && !pool.one_row();
        let mut chunk = if chunked { Some(ChunkScratch::new(CHUNK, p.d_k, p.d_v)) } else { None };
        for h in heads.iter() {
            let sh = unsafe { ssm.slice(h * p.d_k * p.d_v, p.d_k * p.d_v) };
            let kh = h % p.n_k_heads;
            let row = |t: usize| &conv_out[t * cd..(t + 1) * cd];
            for t in 0..n {
                let q = &row(t)[kh * p.d_k..(kh + 1) * p.d_k];
                qs[t * p.d_k..(t + 1) * p.d_k].iter_mut().zip(q).for_each(|(d, &x)| *d = x * q_scale);
            }
            let k_of = |t: usize| &row(t)[kd + kh * p.d_k..kd + (kh + 1) * p.d_k];
            let v_of = |t: usize| &row(t)[2 * kd + h * p.d_v..2 * kd + (h + 1) * p.d_v];
            match chunk.as_mut() {
                None => {
                    for t in 0..n {
                        let out = unsafe { o_out.slice(t * vd + h * p.d_v, p.d_v) };
                        let q = &qs[t * p.d_k..(t + 1) * p.d_k];
                        let step = Step { decay: g[t * hv + h].exp(), beta: beta[t * hv + h] };
                        delta_step(sh, q, k_of(t), v_of(t), step, u, out);
                    }
                }
                Some(cs) => {
                    for c0 in (0..n).step_by(CHUNK) {
                        let c = CHUNK.min(n - c0);
                        cs.load(c, |t| (&qs[(c0 + t) * p.d_k..(c0 + t + 1) * p.d_k], k_of(c0 + t), v_of(c0 + t)));
                        for t in 0..c {
                            cs.g[t] = g[(c0 + t) * hv + h];
                            cs.beta[t] = beta[(c0 + t) * hv + h];
                        }
                        cs.run(sh, c);
                        for t in 0..c {
                            let out = unsafe { o_out.slice((c0 + t) * vd + h * p.d_v, p.d_v) };
                            out.copy_from_slice(&cs.o[t * p.d_v..(t + 1) * p.d_v]);
                        }
                    }
                }
            }
        }
    });
}

/// Prompts at least this long use the chunked form of the delta rule.
const CHUNKED_FROM: usize = 32;
/// Tokens per chunk of the chunked form.
const CHUNK: usize = 64;
/// State columns read per pass over a chunk's tokens (128 rows of 32: 16 KiB).
const STATE_BLOCK: usize = 32;

/// The chunked (parallel) form of the delta rule for one head: a chunk of c
/// tokens is solved at once from the state at its start, S0. With
/// G_t = sum_{s<=t} g_s and D the corrected updates,
///
/// ```text
///   (I + A) D = beta * (V - exp(G) * (K S0)),   A[t][j] = beta_t exp(G_t - G_j) k_t.k_j  (j < t)
///   o_t = exp(G_t) S0^T q_t + sum_{j<=t} exp(G_t - G_j) (q_t.k_j) D_j
///   S  <- exp(G_c) S0 + sum_j exp(G_c - G_j) k_j D_j^T
/// ```
///
/// which equals `c` sequential [`delta_step`]s up to rounding.
pub struct ChunkScratch {
    d_k: usize,
    d_v: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Log decays of the chunk's tokens.
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
    /// Outputs `[c][d_v]`.
    pub o: Vec<f32>,
    /// Cumulative log decays.
    cum: Vec<f32>,
    /// Corrected updates `[c][d_v]`.
    d: Vec<f32>,
    /// A block of the state's columns, `[d_k][STATE_BLOCK]`.
    sb: Vec<f32>,
    /// The keys transposed, `[d_k][c]`.
    kt: Vec<f32>,
    /// Products of every token's key (`kk`) and query (`qk`) with every key, `[c][c]`.
    kk: Vec<f32>,
    qk: Vec<f32>,
    /// Decays over the chunk's tokens, two weight vectors over them, and
    /// two rows of `d_v`.
    e: Vec<f32>,
    wa: Vec<f32>,
    wb: Vec<f32>,
    ra: Vec<f32>,
    rb: Vec<f32>,
}

impl ChunkScratch {
    pub fn new(c: usize, d_k: usize, d_v: usize) -> Self {
        ChunkScratch {
            d_k,
            d_v,
            q: vec![0.0; c * d_k],
            k: vec![0.0; c * d_k],
            v: vec![0.0; c * d_v],
            g: vec![0.0; c],
            beta: vec![0.0; c],
            o: vec![0.0; c * d_v],
            cum: vec![0.0; c],
            d: vec![0.0; c * d_v],
            sb: vec![0.0; d_k * STATE_BLOCK.min(d_v)],
            kt: vec![0.0; d_k * c],
            kk: vec![0.0; c * c],
            qk: vec![0.0; c * c],
            e: vec![0.0; c],
            wa: vec![0.0; c],
            wb: vec![0.0; c],
            ra: vec![0.0; d_v],
            rb: vec![0.0; d_v],
        }
    }

    /// Copy the (already scaled) q, k and v of `c` tokens in.
    pub fn load<'a>(&mut self, c: usize, mut qkv: impl FnMut(usize) -> (&'a [f32], &'a [f32], &'a [f32])) {
        let (dk, dv) = (self.d_k, self.d_v);
        for t in 0..c {
            let (q, k, v) = qkv(t);
            self.q[t * dk..(t + 1) * dk].copy_from_slice(q);
            self.k[t * dk..(t + 1) * dk].copy_from_slice(k);
            self.v[t * dv..(t + 1) * dv].copy_from_slice(v);
        }
    }

    /// Advance the state `s` (`[d_k][d_v]`) over the `c` loaded tokens, writing `o`.
    pub fn run(&mut self, s: &mut [f32], c: usize) {
        let (dk, dv) = (self.d_k, self.d_v);
        let mut acc = 0f32;
        for t in 0..c {
            acc += self.g[t];
            self.cum[t] = acc;
        }
        // D starts as beta_t (v_t - exp(G_t) S0^T k_t); the outputs start as
        // exp(G_t) S0^T q_t. Both reads of S0 in one pass per token, over a
        // copy of a block of its columns that stays in L1 for every token
        // (the whole state does not).
        for c0 in (0..dv).step_by(STATE_BLOCK) {
            let w = STATE_BLOCK.min(dv - c0);
            let block = &mut self.sb[..dk * w];
            for (b, row) in block.chunks_exact_mut(w).zip(s.chunks_exact(dv)) {
                b.copy_from_slice(&row[c0..c0 + w]);
            }
            for t in 0..c {
                let d = &mut self.d[t * dv + c0..t * dv + c0 + w];
                let o = &mut self.o[t * dv + c0..t * dv + c0 + w];
                ops::state_read(block, &self.k[t * dk..(t + 1) * dk], &self.q[t * dk..(t + 1) * dk], d, o);
            }
        }
        for t in 0..c {
            let d = &mut self.d[t * dv..(t + 1) * dv];
            let o = &mut self.o[t * dv..(t + 1) * dv];
            let gt = self.cum[t].exp();
            for (di, &vi) in d.iter_mut().zip(&self.v[t * dv..(t + 1) * dv]) {
                *di = self.beta[t] * (vi - gt * *di);
            }
            ops::scale(o, gt);
        }
        // Every product of a key or a query with a key, from the transposed
        // keys: row t of `kk` is K k_t, of `qk` K q_t.
        let kt = &mut self.kt[..dk * c];
        for (j, kj) in self.k[..c * dk].chunks_exact(dk).enumerate() {
            for (i, &x) in kj.iter().enumerate() {
                kt[i * c + j] = x;
            }
        }
        for t in 0..c {
            let (kk, qk) = (&mut self.kk[t * c..(t + 1) * c], &mut self.qk[t * c..(t + 1) * c]);
            ops::state_read(kt, &self.k[t * dk..(t + 1) * dk], &self.q[t * dk..(t + 1) * dk], kk, qk);
        }
        // Forward substitution through (I + A), row by row of D, and the
        // intra-chunk terms of the outputs: step t reads the finished rows
        // D_0..D_{t-1} once for both D_t's correction and o_{t-1}'s sum.
        // exp(G_t - G_j) of step t is kept for step t + 1 in `e`.
        let (e, wa, wb) = (&mut self.e, &mut self.wa, &mut self.wb);
        for t in 1..=c {
            let (done, rest) = self.d.split_at_mut(t * dv);
            let prev = t - 1;
            for j in 0..prev {
                wb[j] = e[j] * self.qk[prev * c + j];
            }
            wb[prev] = self.qk[prev * c + prev];
            if t < c {
                for j in 0..t {
                    e[j] = (self.cum[t] - self.cum[j]).exp();
                    wa[j] = self.beta[t] * e[j] * self.kk[t * c + j];
                }
            } else {
                wa[..t].copy_from_slice(&wb[..t]);
            }
            let (ra, rb) = (&mut self.ra[..dv], &mut self.rb[..dv]);
            ops::state_read(done, &wa[..t], &wb[..t], ra, rb);
            if t < c {
                rest[..dv].iter_mut().zip(ra.iter()).for_each(|(d, &x)| *d -= x);
            }
            self.o[prev * dv..t * dv].iter_mut().zip(rb.iter()).for_each(|(o, &x)| *o += x);
        }
        // The state at the chunk end, two rows at a time: row i gains
        // D^T (exp(G_c - G_j) k_j[i])_j.
        let last = self.cum[c - 1];
        e[..c].iter_mut().zip(&self.cum[..c]).for_each(|(e, &g)| *e = (last - g).exp());
        let decay = last.exp();
        let d = &self.d[..c * dv];
        for i in (0..dk).step_by(2) {
            let i1 = (i + 1).min(dk - 1);
            for j in 0..c {
                wa[j] = e[j] * self.kt[i * c + j];
                wb[j] = e[j] * self.kt[i1 * c + j];
            }
            let (ra, rb) = (&mut self.ra[..dv], &mut self.rb[..dv]);
            ops::state_read(d, &wa[..c], &wb[..c], ra, rb);
            for (r, add) in [(i, &*ra), (i1, &*rb)].into_iter().take(i1 - i + 1) {
                s[r * dv..(r + 1) * dv].iter_mut().zip(add).for_each(|(x, &a)| *x = decay * *x + a);
            }
        }
    }
}

/// One recurrent step of one head. The state is read twice and written once
/// (it is far larger than the caches: 2 MiB per layer in Qwen3.5-35B-A3B):
///
/// ```text
///   pass 1 (read):  u = S^T k,  o = S^T q
///   d = (v - exp(g) u) beta,     o <- exp(g) o + (q.k) d
///   pass 2 (write): S <- exp(g) S + k d^T
/// ```
///
/// which is `S <- exp(g) S; S <- S + k (v - S^T k)^T beta; o = S^T q`
/// reordered. `u` is scratch of length d_v.
#[inline]
pub fn delta_step(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], step: Step, u: &mut [f32], out: &mut [f32]) {
    let Step { decay, beta } = step;
    ops::state_read(s, k, q, u, out);
    let qk = ops::dot_f32(q, k);
    for ((ui, &vi), oi) in u.iter_mut().zip(v).zip(out.iter_mut()) {
        let d = (vi - decay * *ui) * beta;
        *ui = d;
        *oi = decay * *oi + qk * d;
    }
    ops::state_update(s, decay, k, u);
}

/// One token's scalars of the delta rule: the state's decay `exp(g)` and the update strength.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub decay: f32,
    pub beta: f32,
}

/// `log(1 + e^x)`, linear above 20 (as the reference does).
#[inline]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// x / sqrt(sum(x^2) + eps), evaluated as the reference does: an RMSNorm with
/// eps / n, then a scale by 1 / sqrt(n).
fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    ops::rms_norm_inplace(x, None, eps / n);
    ops::scale(x, 1.0 / n.sqrt());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    #[test]
    fn chunked_form_equals_sequential_steps() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for (dk, dv, c) in
            [(16, 24, 1usize), (16, 24, 2), (16, 24, 7), (16, 24, 33), (16, 24, 64), (5, 40, 64), (128, 128, 64)]
        {
            let mut q = rand(&mut seed, c * dk, 0.3);
            let mut k = rand(&mut seed, c * dk, 1.0);
            for kt in k.chunks_exact_mut(dk) {
                l2_norm(kt, 1e-6);
            }
            for qt in q.chunks_exact_mut(dk) {
                l2_norm(qt, 1e-6);
            }
            let v = rand(&mut seed, c * dv, 1.0);
            let g: Vec<f32> = rand(&mut seed, c, 1.0).iter().map(|x| -x.abs() * 2.0).collect();
            let beta: Vec<f32> = rand(&mut seed, c, 1.0).iter().map(|x| ops::sigmoid(*x * 3.0)).collect();
            let s0 = rand(&mut seed, dk * dv, 0.5);

            let mut s_seq = s0.clone();
            let mut o_seq = vec![0f32; c * dv];
            let mut u = vec![0f32; dv];
            for t in 0..c {
                let out = &mut o_seq[t * dv..(t + 1) * dv];
                delta_step(
                    &mut s_seq,
                    &q[t * dk..][..dk],
                    &k[t * dk..][..dk],
                    &v[t * dv..][..dv],
                    Step { decay: g[t].exp(), beta: beta[t] },
                    &mut u,
                    out,
                );
            }

            let mut cs = ChunkScratch::new(64, dk, dv);
            cs.load(c, |t| (&q[t * dk..(t + 1) * dk], &k[t * dk..(t + 1) * dk], &v[t * dv..(t + 1) * dv]));
            cs.g[..c].copy_from_slice(&g);
            cs.beta[..c].copy_from_slice(&beta);
            let mut s_chunk = s0.clone();
            cs.run(&mut s_chunk, c);

            let err = |a: &[f32], b: &[f32]| {
                a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0f32, f32::max)
            };
            assert!(err(&cs.o[..c * dv], &o_seq) < 1e-5, "outputs, chunk {c}: {}", err(&cs.o[..c * dv], &o_seq));
            assert!(err(&s_chunk, &s_seq) < 1e-5, "state, chunk {c}: {}", err(&s_chunk, &s_seq));
        }
    }
}
