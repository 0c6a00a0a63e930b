//! A multi-token-prediction (NextN) layer: Qwen3.5's `mtp.*` block, kept by
//! llama.cpp's converter as `blk.{n_layer}.*` with `nextn.*` tensors, which
//! drafts the token after next from a token and the trunk's hidden state.
//!
//! For the token x_p at position p and the trunk's final-normed hidden state
//! h_{p-1} of the position before (what the trunk's head read to predict x_p):
//!
//! ```text
//! y  = EhProj · [EnNorm(Embed(x_p)) ; HNorm(h_{p-1})]     [2*n_embd] -> [n_embd]
//! y += Attn(RMSNorm(y))        gated full attention over the layer's own KV cache
//! y += MoE(RMSNorm(y))         routed experts + the sigmoid-gated shared expert
//! h' = HeadNorm(y)             shared_head_norm (else the trunk's final norm)
//! logits = Head · h'           shared_head_head (else the trunk's output head)
//! ```
//!
//! The logits predict x_{p+1}; h' stands in for the trunk's hidden state when
//! drafts are chained (the next draft pairs x_{p+1} with h'). Exactly
//! llama.cpp's `graph_mtp` (src/models/qwen35moe.cpp) and the pairing of its
//! `common/speculative.cpp` (`draft-mtp`).

use super::blocks::attention::{Attention, AttnParams};
use super::blocks::moe::{Moe, MoeParams};
use super::blocks::norm::RmsNorm;
use super::cache::KvCache;
use super::pass::Pass;
use super::scratch::take;
use super::state::Scratch;
use super::trunk::Trunk;
use super::weights::{Experts, Loader, Matrix};
use crate::error::Result;
use crate::gguf::TensorKind;
use crate::kernels::{ops, Layout, MatJob, QActs};

/// The layer's weights.
pub struct Mtp {
    enorm: RmsNorm, // [n_embd]
    hnorm: RmsNorm, // [n_embd]
    /// `[n_embd, 2*n_embd]`: the normed embedding's columns first.
    eh_proj: Matrix,
    /// `nextn.embed_tokens` `[n_vocab, n_embd]`, else the trunk's embedding.
    embed: Option<Matrix>,
    attn_norm: RmsNorm,
    /// q+gate [2*n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd], q/k norm [hd]
    attn: Attention,
    post_norm: RmsNorm,
    moe: Moe,
    /// `nextn.shared_head_norm`, else the trunk's final norm.
    head_norm: Option<RmsNorm>,
    /// `nextn.shared_head_head` `[n_vocab, n_embd]`, else the trunk's head.
    head: Option<Matrix>,
}

/// The shapes the layer shares with the trunk's full-attention layers.
pub struct MtpShape {
    pub n_embd: usize,
    pub n_vocab: usize,
    pub attn: AttnParams,
    pub moe: MoeParams,
    pub n_ff_shexp: usize,
    pub eps: f32,
}

impl Mtp {
    /// Layer `il`'s multi-token-prediction block (every shape checked).
    pub fn load(ld: &Loader, il: usize, shape: MtpShape) -> Result<Mtp> {
        let MtpShape { n_embd: e, n_vocab, attn, moe, n_ff_shexp, eps } = shape;
        let norm = |kind| RmsNorm::load(ld, kind, il, e, eps);
        let head_norm = ld.vector_opt(TensorKind::NextnSharedHeadNorm, il, e)?.map(|w| RmsNorm { w, eps });
        Ok(Mtp {
            enorm: norm(TensorKind::NextnEnorm)?,
            hnorm: norm(TensorKind::NextnHnorm)?,
            eh_proj: ld.matrix(TensorKind::NextnEhProj, il, e, 2 * e)?,
            embed: ld.matrix_opt(TensorKind::NextnEmbedTokens, il, n_vocab, e)?,
            attn_norm: norm(TensorKind::AttnNorm)?,
            attn: Attention::load(ld, il, e, attn, true)?,
            post_norm: norm(TensorKind::AttnPostNorm)?,
            moe: Moe::load(ld, il, e, moe)?.with_shared_expert(ld, il, e, n_ff_shexp)?,
            head_norm,
            head: ld.matrix_opt(TensorKind::NextnSharedHeadHead, il, n_vocab, e)?,
        })
    }

    /// The shape of its attention (its KV cache's).
    pub fn attn_params(&self) -> &AttnParams {
        &self.attn.p
    }

    /// Its routed-expert stacks, with its layer number (the expert cache's key).
    pub(crate) fn experts(&self) -> [(usize, &Experts); 3] {
        let m = &self.moe;
        [(m.layer, &m.gate), (m.layer, &m.up), (m.layer, &m.down)]
    }

    /// Run the layer over `tokens` at positions `pass.pos0..` paired with
    /// the hidden states `h` (`[n][n_embd]`, row t the state before token
    /// t), appending to `cache`. Leaves the head-normed outputs in `hidden`
    /// (`[n][n_embd]`) and, with `logits`, the last token's logits of the
    /// tokens [`HeadOut`] names there.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        pass: &Pass,
        trunk: &Trunk,
        cache: &mut KvCache,
        s: &mut Scratch,
        cat: &mut Vec<f32>,
        tokens: &[u32],
        h: &[f32],
        hidden: &mut Vec<f32>,
        logits: Option<HeadOut<'_>>,
    ) -> Result<()> {
        let (n, e) = (tokens.len(), trunk.n_embd);
        // cat = [EnNorm(Embed(x)) ; HNorm(h)] per token   [n][2*n_embd]
        let cat = take(cat, n * 2 * e);
        for ((row, &tok), hr) in cat.chunks_exact_mut(2 * e).zip(tokens).zip(h.chunks_exact(e)) {
            let (er, hn) = row.split_at_mut(e);
            match &self.embed {
                Some(m) => m.row_f32(pass.file, tok as usize, er),
                None => trunk.embed_row(pass.file, tok, er),
            }
            ops::rms_norm_inplace(er, Some(&self.enorm.w), self.enorm.eps);
            self.hnorm.forward(hr, hn);
        }
        let Scratch { x, xn, out, head: acts, blocks: b } = s;
        let (x, xn, out) = (take(x, n * e), take(xn, n * e), take(out, n * e));
        // y = EhProj · cat
        pass.project(&self.eh_proj, acts, cat, x);
        // y += Attn(RMSNorm(y))   (gated, QK-normed, partial rotary)
        self.attn_norm.forward(x, xn);
        self.attn.forward(pass, cache, &mut b.attn, xn, out);
        ops::add(x, out);
        // y += MoE(RMSNorm(y))    (with the gated shared expert)
        self.post_norm.forward(x, xn);
        self.moe.forward(pass, &mut b.moe, xn, out, None)?;
        ops::add(x, out);
        // h' = HeadNorm(y); logits = Head · h' for the last token
        let hidden = take(hidden, n * e);
        self.head_norm.as_ref().unwrap_or(&trunk.norm).forward(x, hidden);
        if let Some(HeadOut { logits, rows, extra, scored }) = logits {
            let head = self.head.as_ref().unwrap_or(&trunk.output);
            let rows = rows.clamp(1, trunk.n_vocab);
            scored.clear();
            scored.extend(extra.iter().copied().filter(|&t| (rows..trunk.n_vocab).contains(&(t as usize))));
            scored.sort_unstable();
            scored.dedup();
            let out = take(logits, rows + scored.len());
            let w = head.view(pass.file);
            acts.quantize(w.ty, &hidden[(n - 1) * e..], 1, w.cols);
            let acts: &QActs = acts;
            // The head's first `rows` rows: the logits of tokens 0..rows;
            // then the extra tokens', a product per run of consecutive ids.
            let spans: Vec<(usize, usize)> = std::iter::once((0, rows))
                .chain(scored.chunk_by(|a, b| b == &(a + 1)).map(|run| (run[0] as usize, run.len())))
                .collect();
            if w.layout == Layout::Rows {
                let mut rest = &mut out[..];
                let mut jobs = Vec::with_capacity(spans.len());
                for &(t0, n) in &spans {
                    let (o, r) = std::mem::take(&mut rest).split_at_mut(n);
                    rest = r;
                    jobs.push(MatJob { w: w.rows_slice(t0, n), x: acts, rows: None, out: o });
                }
                pass.matmul(&mut jobs);
            } else {
                // Interleaved rows are read in whole groups of four: each
                // span widened to its groups, its logits then copied out.
                let wide = |(t0, n): (usize, usize)| (t0 / 4 * 4, (t0 + n).next_multiple_of(4));
                let mut all = vec![0.0f32; spans.iter().map(|&s| wide(s).1 - wide(s).0).sum()];
                let mut rest = &mut all[..];
                let mut jobs = Vec::with_capacity(spans.len());
                for &span in &spans {
                    let (g0, g1) = wide(span);
                    let (o, r) = std::mem::take(&mut rest).split_at_mut(g1 - g0);
                    rest = r;
                    jobs.push(MatJob { w: w.rows_slice(g0, g1 - g0), x: acts, rows: None, out: o });
                }
                pass.matmul(&mut jobs);
                let (mut at, mut o) = (0, 0);
                for &(t0, n) in &spans {
                    let (g0, g1) = wide((t0, n));
                    out[o..o + n].copy_from_slice(&all[at + t0 - g0..][..n]);
                    (at, o) = (at + g1 - g0, o + n);
                }
            }
        }
        Ok(())
    }
}

/// What a pass of the layer scores of the head: the first `rows` tokens of
/// the vocabulary, then the tokens of `extra` past them (each once, in id
/// order, into `scored`), their logits into `logits` in that order.
pub struct HeadOut<'a> {
    pub logits: &'a mut Vec<f32>,
    pub rows: usize,
    pub extra: &'a [u32],
    pub scored: &'a mut Vec<u32>,
}

/// One sequence's state of the layer: its KV cache (positions line up with
/// the trunk's) and the buffers its passes reuse.
pub struct MtpState {
    pub(crate) cache: KvCache,
    pub(crate) n_past: usize,
    pub(crate) scratch: Scratch,
    pub(crate) cat: Vec<f32>,
    /// Head-normed outputs of the last pass, `[n][n_embd]`.
    pub(crate) hidden: Vec<f32>,
    /// The last token's logits of the last pass that asked for them.
    pub(crate) logits: Vec<f32>,
    /// Tokens of the vocabulary (the first ones) whose logits a pass computes.
    pub(crate) head_rows: usize,
    /// Tokens past them a pass scores too, and those the last pass scored.
    pub(crate) head_extra: Vec<u32>,
    pub(crate) scored: Vec<u32>,
}

impl MtpState {
    pub(crate) fn new(cache: KvCache) -> MtpState {
        MtpState {
            cache,
            n_past: 0,
            scratch: Scratch::default(),
            cat: Vec::new(),
            hidden: Vec::new(),
            logits: Vec::new(),
            head_rows: usize::MAX,
            head_extra: Vec::new(),
            scored: Vec::new(),
        }
    }

    /// Score these tokens too where they are past the first rows (the
    /// drafter's end-of-turn and control tokens: an answer's last token,
    /// `</think>`, a tool call's markers); their logits follow the first
    /// rows' in [`logits`](Self::logits), in id order.
    pub fn set_head_extra(&mut self, tokens: Vec<u32>) {
        self.head_extra = tokens;
    }

    /// The token whose logit is `logits()[i]`.
    pub fn logit_token(&self, i: usize) -> u32 {
        let rows = self.logits.len() - self.scored.len();
        match i.checked_sub(rows) {
            Some(j) => self.scored[j],
            None => i as u32,
        }
    }

    /// Compute the logits of the first `rows` tokens of the vocabulary only
    /// (`usize::MAX`: all of them, the default).
    pub fn set_head_rows(&mut self, rows: usize) {
        self.head_rows = rows;
    }

    /// Positions in the layer's cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Drop the positions from `n` on.
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// The head-normed output of each token of the last pass, `[n][n_embd]`.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// The last token's logits of the last pass that asked for them.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Bytes its cache holds.
    pub fn cache_bytes(&self) -> usize {
        self.cache.allocated_bytes()
    }
}
