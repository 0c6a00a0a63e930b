//! The drafter of [`Speculation::Mtp`](super::Speculation::Mtp): the
//! model's own multi-token-prediction layer (`model/mtp.rs`), kept in step
//! with the session's state as llama.cpp's `draft-mtp` keeps it.
//!
//! **Pairing.** The layer's cache has a position for every token the session
//! evaluated: token x_p paired with the trunk's final-normed hidden state
//! h_{p-1} of the position before (zeros before the first token). Every pass
//! of the session (prompt batches, decode steps, verify passes) is fed to
//! the layer right after it, with the hidden rows the pass left
//! ([`State::keep_hidden`](crate::model::State::keep_hidden)).
//!
//! **Drafting.** With the conversation x_0..x_{L-1} (the last token sampled,
//! not evaluated yet), the layer runs (x_{L-1}, h_{L-2}) at position L-1:
//! its argmax is the first draft d_1; then (d_1, its own output) at L gives
//! d_2, and so on, one token per pass. Those positions are dropped again:
//! the verify pass evaluates x_{L-1} and the drafts, and the layer then
//! takes them with the trunk's hidden states, as for any pass.
//!
//! **A smaller head for drafting.** On a large vocabulary the output head
//! is most of a draft step (Qwen3.5's 248k rows: ~420 MB of the ~1.1 GB a
//! draft step reads at Q2_K). Drafts score only the first
//! [`MTP_DRAFT_VOCAB`] tokens: byte-level BPE numbers tokens in merge
//! order, so the first ids are the most frequent pieces (the idea of
//! FR-Spec's frequency-ranked drafting), and the end-of-turn and added
//! tokens past them (a chat format's markers, numbered last: an answer's
//! end, `</think>`, a tool call's tags are drafted too). Any other token is
//! never drafted; verification keeps the output exact whatever is drafted.
//!
//! **Rollback.** When the session drops rejected drafts, the layer drops the
//! same positions; the hidden state that pairs with the next token comes
//! from the verify pass's rows (an accepted row is what decoding computes).
//! A recurrent model replays the accepted tokens in its next pass: the layer
//! already holds those positions and skips them.
//!
//! **Out of step.** The layer cannot catch up on tokens evaluated without
//! it (their hidden states are gone): a request that would reuse such a
//! prefix evaluates its prompt from the start; a context slide stops the
//! drafts until the next request.

use crate::error::Result;
use crate::model::{KvType, Model, MtpState};
use crate::sampler::argmax;
use crate::threads::ThreadPool;

/// Tokens a draft step scores on a vocabulary of more than twice as many
/// (see the module's account); smaller vocabularies are scored whole.
pub const MTP_DRAFT_VOCAB: usize = 32768;

/// How many of the first tokens of a vocabulary of `n_vocab` a draft step scores.
pub fn mtp_draft_head_rows(n_vocab: usize) -> usize {
    if n_vocab > 2 * MTP_DRAFT_VOCAB {
        MTP_DRAFT_VOCAB
    } else {
        n_vocab
    }
}

/// The tokens past a draft head of `rows` that it scores too: those that
/// end a turn and the added ones (control and user-defined: a chat format's
/// markers).
pub fn mtp_draft_extra_tokens(model: &Model, rows: usize) -> Vec<u32> {
    let tok = model.tokenizer();
    (rows..model.n_vocab()).map(|t| t as u32).filter(|&t| tok.is_end_of_generation(t) || tok.is_added(t)).collect()
}

/// The layer's state, in step with the session's evaluated tokens.
pub(super) struct MtpDraft {
    state: MtpState,
    n_embd: usize,
    /// The tokens at the layer's positions (the session's evaluated tokens).
    tokens: Vec<u32>,
    /// The trunk's hidden state at the last of `tokens` (pairs with the next token).
    h_next: Vec<f32>,
    /// The hidden rows of the session's last pass, and the position of the first.
    rows: Vec<f32>,
    rows_pos0: usize,
    /// Lost step with the session: drafts nothing until [`reset`](Self::reset).
    lost: bool,
}

impl MtpDraft {
    /// The layer's state for a session of `n_ctx` positions.
    pub fn new(model: &Model, n_ctx: usize, kv: KvType) -> Result<MtpDraft> {
        let n_embd = model.n_embd();
        let mut state = model.new_mtp_state(n_ctx, kv)?;
        let rows = mtp_draft_head_rows(model.n_vocab());
        state.set_head_rows(rows);
        state.set_head_extra(mtp_draft_extra_tokens(model, rows));
        Ok(MtpDraft {
            state,
            n_embd,
            tokens: Vec::new(),
            h_next: vec![0.0; n_embd],
            rows: Vec::new(),
            rows_pos0: 0,
            lost: false,
        })
    }

    /// Forget everything (the session starts from an empty state).
    pub fn reset(&mut self) {
        self.state.truncate(0);
        self.tokens.clear();
        self.h_next.iter_mut().for_each(|v| *v = 0.0);
        self.rows.clear();
        self.lost = false;
    }

    /// Whether the layer holds exactly the session's evaluated tokens `cached`.
    pub fn in_step(&self, cached: &[u32]) -> bool {
        !self.lost && self.tokens == cached
    }

    /// Bytes its cache holds.
    pub fn memory_bytes(&self) -> usize {
        self.state.cache_bytes()
    }

    /// The session evaluated `tokens` at positions `pos0..`, leaving the
    /// hidden rows `h` (`[n][n_embd]`): take the positions the layer does not hold.
    pub fn process(&mut self, model: &Model, pool: &ThreadPool, pos0: usize, tokens: &[u32], h: &[f32]) -> Result<()> {
        let (n, e, m) = (tokens.len(), self.n_embd, self.tokens.len());
        if self.lost || n == 0 {
            return Ok(());
        }
        if h.len() != n * e || pos0 > m {
            // A pass the layer did not see (or no hidden rows): out of step.
            self.lost = true;
            return Ok(());
        }
        self.rows.clear();
        self.rows.extend_from_slice(h);
        self.rows_pos0 = pos0;
        // Positions pos0..m are held already (a replay): they must be the same tokens.
        let held = (m - pos0).min(n);
        if tokens[..held] != self.tokens[pos0..pos0 + held] {
            self.lost = true;
            return Ok(());
        }
        if held < n {
            // Token t (at pos0 + t >= m) pairs with the hidden state of the position before it.
            let mut paired = Vec::with_capacity((n - held) * e);
            for t in held..n {
                match t {
                    0 => paired.extend_from_slice(&self.h_next),
                    _ => paired.extend_from_slice(&h[(t - 1) * e..t * e]),
                }
            }
            model.mtp_forward(pool, &mut self.state, &tokens[held..], &paired, false)?;
            self.tokens.extend_from_slice(&tokens[held..]);
        } else {
            self.drop_from(pos0 + n);
        }
        self.h_next.copy_from_slice(&h[(n - 1) * e..]);
        Ok(())
    }

    /// The session dropped its positions from `n` on (rejected drafts).
    pub fn truncate(&mut self, n: usize) {
        if n >= self.tokens.len() || self.lost {
            return;
        }
        self.drop_from(n);
        let e = self.n_embd;
        if n == 0 {
            self.h_next.iter_mut().for_each(|v| *v = 0.0);
        } else if (self.rows_pos0..self.rows_pos0 + self.rows.len() / e).contains(&(n - 1)) {
            let r = n - 1 - self.rows_pos0;
            self.h_next.copy_from_slice(&self.rows[r * e..(r + 1) * e]);
        } else {
            self.lost = true;
        }
    }

    fn drop_from(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.state.truncate(n);
    }

    /// Up to `k` greedy drafts to follow `history` (the session's evaluated
    /// tokens and the sampled one after them); none when out of step.
    pub fn propose(&mut self, model: &Model, pool: &ThreadPool, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let m = self.tokens.len();
        if self.lost || k == 0 || history.len() != m + 1 || history[..m] != self.tokens[..] {
            return Ok(Vec::new());
        }
        let mut drafts = Vec::with_capacity(k);
        let (mut token, mut h) = (history[m], self.h_next.clone());
        let run = (|| {
            for _ in 0..k {
                model.mtp_forward(pool, &mut self.state, &[token], &h, true)?;
                token = self.state.logit_token(argmax(self.state.logits()));
                drafts.push(token);
                h.copy_from_slice(self.state.hidden());
            }
            Ok(())
        })();
        // The drafts' positions are taken again, with the trunk's states, after the verify pass.
        self.state.truncate(m);
        run.map(|()| drafts)
    }
}
