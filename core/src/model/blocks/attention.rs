//! Causal self-attention over the KV cache: grouped-query heads, RoPE
//! (or YaRN), optional QK-norm (per head, or over the whole projections),
//! biases, an output gate, per-head sinks, and sliding windows.

use super::super::cache::{KvCache, KvType};
pub use super::super::params::{AttnParams, Rope};
use super::super::pass::{Attend, Pass};
use super::super::scratch::{take, ActCache, SharedMut};
use super::super::weights::{Loader, Matrix};
use super::yarn::Yarn;
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{ops, MatJob, QActs};
use crate::threads::Pieces;

/// What the q/k norms normalise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// Each head on its own: weights `[hd]` (Qwen3, Gemma).
    PerHead,
    /// A token's whole projection at once: weights `[n_head*hd]` and
    /// `[n_kv_head*hd]` (OLMoE).
    Whole,
}

/// One attention layer: its shape and its weights. Shapes: q `[n_head*hd
/// (x2 if gated), n_embd]`, k/v `[n_kv_head*hd, n_embd]`, o `[n_embd,
/// n_head*hd_v]`, q/k norm `[hd]` (or whole: `[n_head*hd]`, `[n_kv_head*hd]`).
pub struct Attention {
    pub p: AttnParams,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub o: Matrix,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub qk_norm: QkNorm,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// `[n_embd]`, added to the output projection.
    pub o_bias: Option<Vec<f32>>,
    /// `[n_head]`: one more logit per head that takes part in the softmax's
    /// denominator but mixes no value (gpt-oss's `attn_sinks`).
    pub sinks: Option<Box<[f32]>>,
    /// Rotate by YaRN instead of [`AttnParams::rope`]'s plain RoPE (boxed:
    /// few layers have it, and an enum of layer kinds stays small).
    pub yarn: Option<Box<Yarn>>,
    /// q carries a per-head output gate after each head's query
    /// (`[q_h | gate_h]` per head): the output is `att * sigmoid(gate)`.
    pub gated: bool,
}

/// What attention reuses from pass to pass.
#[derive(Default)]
pub struct AttnScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Heads' outputs before the output projection.
    att: Vec<f32>,
    /// Per-thread scores and gathered queries (see [`attend_cpu`]).
    scores: Vec<f32>,
    /// The input quantised once for q, k and v; the heads' outputs for o.
    input: ActCache,
    heads: QActs,
    /// YaRN's (cos, sin) per rotated pair at one position.
    yarn: Vec<(f32, f32)>,
}

impl AttnScratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        heap(&self.q)
            + heap(&self.k)
            + heap(&self.v)
            + heap(&self.att)
            + heap(&self.scores)
            + self.input.heap_bytes()
            + self.heads.heap_bytes()
            + heap(&self.yarn)
    }
}

impl Attention {
    /// Load the standard tensors of layer `il`.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, p: AttnParams, gated: bool) -> Result<Attention> {
        Self::load_with(ld, il, n_embd, p, gated, QkNorm::PerHead)
    }

    /// [`load`](Self::load) with q/k norms (when the file has them) of kind
    /// `qk_norm` (whole-projection norms are for an ungated q: a gated q
    /// interleaves its gates with the heads).
    pub fn load_with(
        ld: &Loader,
        il: usize,
        n_embd: usize,
        p: AttnParams,
        gated: bool,
        qk_norm: QkNorm,
    ) -> Result<Attention> {
        let (q_norm_len, k_norm_len) = match qk_norm {
            QkNorm::PerHead => (p.head_dim, p.head_dim),
            QkNorm::Whole => (p.n_head * p.head_dim, p.n_kv_head * p.head_dim),
        };
        let q_rows = p.n_head * p.head_dim * if gated { 2 } else { 1 };
        let kv_k = p.n_kv_head * p.head_dim;
        let kv_v = p.n_kv_head * p.head_dim_v;
        Ok(Attention {
            q: ld.matrix(TensorKind::AttnQ, il, q_rows, n_embd)?,
            k: ld.matrix(TensorKind::AttnK, il, kv_k, n_embd)?,
            v: ld.matrix(TensorKind::AttnV, il, kv_v, n_embd)?,
            o: ld.matrix(TensorKind::AttnOut, il, n_embd, p.n_head * p.head_dim_v)?,
            q_norm: ld.vector_opt(TensorKind::AttnQNorm, il, q_norm_len)?,
            k_norm: ld.vector_opt(TensorKind::AttnKNorm, il, k_norm_len)?,
            qk_norm,
            q_bias: ld.bias_opt(TensorKind::AttnQ, il, q_rows)?,
            k_bias: ld.bias_opt(TensorKind::AttnK, il, kv_k)?,
            v_bias: ld.bias_opt(TensorKind::AttnV, il, kv_v)?,
            o_bias: ld.bias_opt(TensorKind::AttnOut, il, n_embd)?,
            sinks: None,
            yarn: None,
            gated,
            p,
        })
    }

    /// Add layer `il`'s attention sinks (`attn_sinks`, `[n_head]`), required.
    pub fn with_sinks(mut self, ld: &Loader, il: usize) -> Result<Attention> {
        let sinks = ld.vector(TensorKind::AttnSinks, il, self.p.n_head)?;
        if !sinks.iter().all(|v| v.is_finite()) {
            let key = TensorKind::AttnSinks.weight(il);
            return Err(Error::InvalidHyperparameter { key, reason: "a sink is not finite".into() });
        }
        self.sinks = Some(sinks.into());
        Ok(self)
    }

    /// Rotate queries and keys by `yarn` (its `n_rot` must be the RoPE's).
    pub fn with_yarn(mut self, yarn: Yarn) -> Attention {
        debug_assert_eq!(yarn.n_rot, self.p.rope.n_rot);
        self.yarn = Some(Box::new(yarn));
        self
    }

    /// `out = Attention(x)` for the pass's tokens (`x`, `out`: `[n][n_embd]`);
    /// their keys and values join `cache` at positions `pos0..pos0 + n`.
    pub fn forward(&self, pass: &Pass, cache: &mut KvCache, s: &mut AttnScratch, x: &[f32], out: &mut [f32]) {
        let (p, n, pos0) = (&self.p, pass.n, pass.pos0);
        let (hd, hdv) = (p.head_dim, p.head_dim_v);
        let q_rows = self.q.rows;
        let (kv_k, kv_v) = (p.n_kv_head * hd, p.n_kv_head * hdv);
        let n_embd = x.len() / n;

        // Projections: q (and its gate), k, v = W · x.
        let q = take(&mut s.q, n * q_rows);
        let k = take(&mut s.k, n * kv_k);
        let v = take(&mut s.v, n * kv_v);
        pass.observe(&[&self.q, &self.k, &self.v], x);
        s.input.prepare(x, n, n_embd, &[self.q.ty, self.k.ty, self.v.ty]);
        pass.matmul(&mut [
            MatJob { w: self.q.view(pass.file), x: s.input.get(self.q.ty), rows: None, out: q },
            MatJob { w: self.k.view(pass.file), x: s.input.get(self.k.ty), rows: None, out: k },
            MatJob { w: self.v.view(pass.file), x: s.input.get(self.v.ty), rows: None, out: v },
        ]);
        for (bias, out, width) in
            [(&self.q_bias, &mut *q, q_rows), (&self.k_bias, &mut *k, kv_k), (&self.v_bias, &mut *v, kv_v)]
        {
            if let Some(b) = bias {
                out.chunks_exact_mut(width).for_each(|row| ops::add(row, b));
            }
        }

        // Per head: QK-norm, then RoPE (or YaRN) at the token's position; keys and values go to the cache.
        // (Whole-projection norms first, over each token's q and k.)
        let q_stride = if self.gated { 2 * hd } else { hd };
        let per_head = self.qk_norm == QkNorm::PerHead;
        let yarn_cs = &mut s.yarn;
        yarn_cs.resize(self.yarn.as_ref().map_or(0, |y| y.n_rot / 2), (0.0, 0.0));
        for t in 0..n {
            let pos = pos0 + t;
            let qt = &mut q[t * q_rows..(t + 1) * q_rows];
            let kt = &mut k[t * kv_k..(t + 1) * kv_k];
            if !per_head {
                for (x, norm) in [(&mut *qt, &self.q_norm), (&mut *kt, &self.k_norm)] {
                    if let Some(nw) = norm {
                        ops::rms_norm_inplace(x, Some(nw), p.eps);
                    }
                }
            }
            let mut rotate = |cs: &[(f32, f32)]| {
                for h in 0..p.n_head {
                    let qh = &mut qt[h * q_stride..][..hd];
                    if let (Some(nw), true) = (&self.q_norm, per_head) {
                        ops::rms_norm_inplace(qh, Some(nw), p.eps);
                    }
                    ops::rope_apply(qh, hd, cs, p.rope.neox);
                }
                if let (Some(nw), true) = (&self.k_norm, per_head) {
                    kt.chunks_exact_mut(hd).for_each(|kh| ops::rms_norm_inplace(kh, Some(nw), p.eps));
                }
                ops::rope_apply(kt, hd, cs, p.rope.neox);
            };
            match &self.yarn {
                Some(y) => {
                    y.angles(pos, yarn_cs);
                    rotate(yarn_cs)
                }
                None => ops::with_rope_angles(p.rope.n_rot, pos, p.rope.base, p.rope.scale, rotate),
            }
            for h in 0..p.n_kv_head {
                cache.store(h, pos, &kt[h * hd..(h + 1) * hd], &v[t * kv_v + h * hdv..][..hdv]);
            }
        }

        // softmax(scale · q·K) · V on the backend, then the output projection.
        let att = take(&mut s.att, n * p.n_head * hdv);
        let a = Attend { p, cache, q, q_rows, gated: self.gated, sinks: self.sinks.as_deref() };
        pass.backend.attend(pass, &a, att, &mut s.scores);
        pass.project(&self.o, &mut s.heads, att, out);
        if let Some(b) = &self.o_bias {
            out.chunks_exact_mut(b.len()).for_each(|row| ops::add(row, b));
        }
    }
}

/// [`crate::model::pass::Backend::attend`] on the CPU. The query heads that
/// share a KV head run together: the score and mix kernels read each key and
/// value row once for all of them; work items are (token, KV head, slice of
/// its query heads), claimed one at a time ([`Pieces`]), the latest tokens
/// (the most keys) first. Each thread's stripe of `scratch`
/// holds the item's scores and its queries, gathered into consecutive rows
/// and rounded to the cache's precision.
pub(crate) fn attend_cpu(pass: &Pass, a: &Attend<'_>, att: &mut [f32], scratch: &mut Vec<f32>) {
    let (p, cache, q, q_rows, pool) = (a.p, a.cache, a.q, a.q_rows, pass.pool);
    let (n, pos0) = (pass.n, pass.pos0);
    let (hd, hdv) = (p.head_dim, p.head_dim_v);
    let q_stride = if a.gated { 2 * hd } else { hd };
    let cap = cache.capacity;
    let group = p.n_head / p.n_kv_head;
    // One-row mode (speculative verify passes): every token as decoding runs it.
    let one_row = pool.one_row();
    if n > 1 && cache.ty == KvType::F16 && ops::has_tiled_attention() && !one_row {
        return attend_tiled(pass, a, att, scratch);
    }
    let per_item = heads_per_item(group, if one_row { 1 } else { n } * p.n_kv_head, pool.n_threads());
    let stripe = per_item * (cap + hd);
    let scratch = take(scratch, pool.n_threads() * stripe);
    let (att_out, scratch) = (SharedMut::new(att), SharedMut::new(scratch));
    let slices = group / per_item;
    let items = n * p.n_kv_head * slices;
    let pieces = Pieces::new(items);
    pool.run(&|ith, _| {
        // SAFETY: each thread owns its stripe of the scratch.
        let (sc_all, qs) = unsafe { scratch.slice(ith * stripe, stripe) }.split_at_mut(per_item * cap);
        // Claimed one at a time, last first: a causal prompt's later tokens
        // see more keys, and a slow core takes fewer items.
        for item in pieces.iter().map(|i| items - 1 - i) {
            let (t, rest) = (item / (p.n_kv_head * slices), item % (p.n_kv_head * slices));
            let (kvh, h0) = (rest / slices, (rest / slices) * group + (rest % slices) * per_item);
            let pos = pos0 + t;
            let lo = p.window.map_or(0, |wnd| (pos + 1).saturating_sub(wnd));
            let len = pos + 1 - lo;
            for (g, qg) in qs.chunks_exact_mut(hd).enumerate() {
                cache.round_query(&q[t * q_rows + (h0 + g) * q_stride..][..hd], qg);
            }
            let sc = &mut sc_all[..per_item * len];
            cache.k_scores(kvh, lo, qs, per_item, sc);
            for (g, row) in sc.chunks_exact_mut(len).enumerate() {
                ops::scale(row, p.scale);
                match a.sinks {
                    Some(sinks) => softmax_with_sink(row, sinks[h0 + g]),
                    None => ops::softmax(row),
                }
            }
            // SAFETY: the item owns heads h0..h0 + per_item of token t.
            let out = unsafe { att_out.slice((t * p.n_head + h0) * hdv, per_item * hdv) };
            cache.v_mix(kvh, lo, sc, per_item, out);
            a.gate(t, h0, out);
        }
    });
}

impl Attend<'_> {
    /// A gated layer's output gates on token `t`'s heads from `h0` on
    /// (`out`: whole heads): each value times the sigmoid of its gate, which
    /// follows the head's query in `q`. Nothing for an ungated layer.
    fn gate(&self, t: usize, h0: usize, out: &mut [f32]) {
        if !self.gated {
            return;
        }
        let (hd, hdv) = (self.p.head_dim, self.p.head_dim_v);
        for (g, o) in out.chunks_exact_mut(hdv).enumerate() {
            let gate = &self.q[t * self.q_rows + (h0 + g) * 2 * hd + hd..][..hd];
            for (o, &gv) in o.iter_mut().zip(gate) {
                *o *= ops::sigmoid(gv);
            }
        }
    }
}

/// [`attend_cpu`] for a prompt over an f16 cache with the tiled kernel:
/// work items are (block of tokens, KV head, slice of its query heads)
/// with at most [`ops::ATTEND_ROWS`] rows, so each key and value is read once
/// for a few tokens' queries of the group (keys a block's first token sees
/// before its window starts, or its last token's future, are masked; each
/// row's head's sink, if the layer has them, joins its softmax).
fn attend_tiled(pass: &Pass, a: &Attend<'_>, att: &mut [f32], scratch: &mut Vec<f32>) {
    let (p, cache, q, q_rows, pool) = (a.p, a.cache, a.q, a.q_rows, pass.pool);
    let (n, pos0) = (pass.n, pass.pos0);
    let (hd, hdv) = (p.head_dim, p.head_dim_v);
    let q_stride = if a.gated { 2 * hd } else { hd };
    let group = p.n_head / p.n_kv_head;
    // Query heads per item: the largest divisor of the group that fits the rows.
    let heads = (1..=group.min(ops::ATTEND_ROWS)).rev().find(|&h| group.is_multiple_of(h)).unwrap_or(1);
    let tokens = ops::ATTEND_ROWS / heads;
    let (blocks, slices) = (n.div_ceil(tokens), group / heads);
    let rows_max = tokens * heads;
    let stripe = rows_max * (hd + hdv) + ops::attend_f16_scratch(hd, cache.capacity);
    let scratch = take(scratch, pool.n_threads() * stripe);
    let (att_out, scratch) = (SharedMut::new(att), SharedMut::new(scratch));
    let lo_of = |pos: usize| p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let items = blocks * p.n_kv_head * slices;
    let pieces = Pieces::new(items);
    pool.run(&|ith, _| {
        // SAFETY: each thread owns its stripe of the scratch.
        let stripe = unsafe { scratch.slice(ith * stripe, stripe) };
        let (qs, rest) = stripe.split_at_mut(rows_max * hd);
        let (os, work) = rest.split_at_mut(rows_max * hdv);
        let mut ranges = [(0usize, 0usize); ops::ATTEND_ROWS];
        let mut sinks = [0f32; ops::ATTEND_ROWS];
        // Claimed one at a time, last first: later blocks of a causal prompt
        // see more keys.
        for item in pieces.iter().map(|i| items - 1 - i) {
            let (blk, rest) = (item / (p.n_kv_head * slices), item % (p.n_kv_head * slices));
            let (kvh, h0) = (rest / slices, (rest / slices) * group + (rest % slices) * heads);
            let (t0, t1) = (blk * tokens, (blk * tokens + tokens).min(n));
            let (base, top) = (lo_of(pos0 + t0), pos0 + t1);
            let rows = (t1 - t0) * heads;
            for t in t0..t1 {
                let pos = pos0 + t;
                for g in 0..heads {
                    let r = (t - t0) * heads + g;
                    cache.round_query(&q[t * q_rows + (h0 + g) * q_stride..][..hd], &mut qs[r * hd..][..hd]);
                    ranges[r] = (lo_of(pos) - base, pos + 1 - base);
                    sinks[r] = a.sinks.map_or(0.0, |s| s[h0 + g]);
                }
            }
            // (Always an f16 cache: the caller checked.)
            let Some((k, v)) = cache.f16_rows(kvh, base, top) else { continue };
            let rows_in = ops::AttendRows {
                q: &qs[..rows * hd],
                d: hd,
                k,
                v,
                dv: hdv,
                ranges: &ranges[..rows],
                scale: p.scale,
                sinks: a.sinks.map(|_| &sinks[..rows]),
            };
            ops::attend_f16(&rows_in, &mut os[..rows * hdv], work);
            for t in t0..t1 {
                // SAFETY: the item owns heads h0..h0 + heads of its tokens.
                let out = unsafe { att_out.slice((t * p.n_head + h0) * hdv, heads * hdv) };
                out.copy_from_slice(&os[(t - t0) * heads * hdv..][..heads * hdv]);
                a.gate(t, h0, out);
            }
        }
    });
}

/// Softmax over `row` and one more logit, `sink`, which takes part in the
/// denominator only (ggml's `soft_max_ext` with sinks).
fn softmax_with_sink(row: &mut [f32], sink: f32) {
    let max = row.iter().fold(sink, |m, &v| m.max(v));
    let mut sum = f64::from((sink - max).exp());
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    ops::scale(row, (1.0 / sum) as f32);
}

/// Query heads per work item: the whole group sharing a KV head when there
/// are enough (token, KV head) items to keep every thread busy, else the
/// largest divisor of the group that makes enough items.
fn heads_per_item(group: usize, kv_items: usize, threads: usize) -> usize {
    (1..=group).rev().find(|&k| group.is_multiple_of(k) && kv_items * (group / k) >= threads).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::{heads_per_item, softmax_with_sink};

    #[test]
    fn a_sink_takes_its_share_of_the_softmax() {
        // Scores 0 and ln 2 with a sink of ln 3: weights 1/6 and 2/6 (the sink's 3/6 mixes nothing).
        let mut row = [0.0, 2f32.ln()];
        softmax_with_sink(&mut row, 3f32.ln());
        assert!((row[0] - 1.0 / 6.0).abs() < 1e-6 && (row[1] - 2.0 / 6.0).abs() < 1e-6, "{row:?}");
        // A sink far below the scores changes nothing; far above, it takes everything.
        let mut row = [1.0, 2.0, 3.0];
        softmax_with_sink(&mut row, -1e4);
        let mut plain = [1.0, 2.0, 3.0];
        crate::kernels::ops::softmax(&mut plain);
        assert!(row.iter().zip(plain).all(|(a, b)| (a - b).abs() < 1e-7), "{row:?} vs {plain:?}");
        let mut row = [1.0, 2.0];
        softmax_with_sink(&mut row, 100.0);
        assert!(row.iter().all(|&v| v < 1e-30), "{row:?}");
    }

    #[test]
    fn query_heads_split_only_as_far_as_the_threads_need() {
        // Qwen3.5 decode: 2 KV heads of 8 query heads, 2 threads: whole groups.
        assert_eq!(heads_per_item(8, 2, 2), 8);
        // 6 threads: quarters of each group (8 items).
        assert_eq!(heads_per_item(8, 2, 6), 2);
        // Gemma 3 270M decode: one KV head of 4, 2 threads: halves.
        assert_eq!(heads_per_item(4, 1, 2), 2);
        // More threads than heads: one head per item; prefill: whole groups.
        assert_eq!(heads_per_item(4, 1, 8), 1);
        assert_eq!(heads_per_item(4, 128, 8), 4);
        assert_eq!(heads_per_item(1, 1, 2), 1);
    }
}
