//! The drafter of [`Speculation::DraftModel`](super::Speculation::DraftModel):
//! a second session on a smaller model of the same vocabulary
//! ([`SessionOptions::draft_model`]), kept in step with the conversation the
//! session holds, drafting greedily.
//!
//! **Vocabulary.** Checked when the session is created: the same number of
//! tokens, and every token the same text and type; the first difference is
//! named ([`Error::InvalidArgument`]).
//!
//! **In step.** The draft session evaluates each request's prompt right
//! after the session does, in the same batches, and every later token in
//! one-row mode, as the session's decode steps and verify passes compute
//! them. Before drafting it catches up with the conversation (the tokens
//! accepted since its last drafts, in one pass), then drafts its argmax k
//! times, one token per pass. A draft model that is the session's own file
//! therefore proposes exactly the session's greedy tokens.
//!
//! **Rollback.** Drafts the session rejected were evaluated into the draft
//! state (all but the last). They are dropped as the session drops its own:
//! the KV cache truncates; a recurrent draft model restores the checkpoint
//! taken before it drafted and replays the accepted tokens in the catch-up pass.
//!
//! **Greedy.** q is one-hot on the draft's argmax, so the verification in
//! `speculate.rs` stays exact speculative sampling whatever the drafts are.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::{Checkpoint, Logits, Model};
use crate::sampler::argmax;

use super::{GenerationStats, Session, SessionOptions, Ticket};

/// The draft model's session.
pub(super) struct DraftSession {
    session: Session,
    /// Recurrent draft models: the state before the last drafts.
    mark: Option<Checkpoint>,
}

impl DraftSession {
    /// A draft session on `draft` for a session on `model` with the
    /// resolved `opts` (the same context, KV type, threads and policy).
    pub fn open(model: &Model, draft: Arc<Model>, opts: &SessionOptions) -> Result<DraftSession> {
        check_vocabulary(model, &draft)?;
        let opts = SessionOptions { draft_model: None, ..opts.clone() };
        Ok(DraftSession { session: Session::new(draft, opts)?, mark: None })
    }

    /// Evaluate `prompt` as the session's prefill did (what is not cached
    /// yet, in the same batches).
    pub fn prefill(&mut self, ticket: &Ticket, prompt: &[u32]) -> Result<()> {
        let mut stats = GenerationStats::empty(prompt.len());
        self.mark = None;
        self.session.prefill(ticket, prompt, &mut stats)?;
        Ok(())
    }

    /// `k` (at least 1) greedy drafts to follow `history`, the session's
    /// conversation so far. The draft context must hold `history` and
    /// `k - 1` more tokens (the session's verify pass needs as much room).
    pub fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        self.catch_up(history)?;
        let s = &mut self.session;
        self.mark = if s.state.is_recurrent() { Some(s.state.checkpoint()?) } else { None };
        let n_vocab = s.model.tokenizer().n_vocab();
        let mut drafts = Vec::with_capacity(k);
        loop {
            let logits = s.state.logits();
            let next = argmax(&logits[..n_vocab.min(logits.len())]) as u32;
            drafts.push(next);
            if drafts.len() >= k {
                return Ok(drafts);
            }
            s.eval_rows(&[next], Logits::Last, true)?;
        }
    }

    /// Bring the draft state to the end of `history`, with its last token's logits.
    fn catch_up(&mut self, history: &[u32]) -> Result<()> {
        let s = &mut self.session;
        let common = s.cached.iter().zip(history).take_while(|(a, b)| a == b).count();
        if common < s.cached.len() {
            // Rejected drafts (or another conversation): drop what differs.
            match self.mark.take() {
                Some(cp) if cp.n_past() <= common && s.state.restore(&cp).is_ok() => s.cached.truncate(cp.n_past()),
                _ => {
                    s.rewind_to_prefix(history)?;
                }
            }
        }
        if s.cached.len() >= history.len() {
            // Everything is cached but the last token's logits.
            s.rewind_one(history)?;
        }
        let todo = history[s.cached.len()..].to_vec();
        s.eval_rows(&todo, Logits::Last, true)
    }

    /// Bytes held by the draft session's state.
    pub fn memory_bytes(&self) -> usize {
        self.session.memory_bytes()
    }
}

/// Refuse a draft model whose vocabulary differs from the model's, naming
/// the first difference.
fn check_vocabulary(model: &Model, draft: &Model) -> Result<()> {
    let (a, b) = (model.tokenizer(), draft.tokenizer());
    match a.first_difference(b) {
        None => Ok(()),
        Some(what) => {
            Err(Error::InvalidArgument(format!("draft model: its vocabulary differs from the model's: {what}")))
        }
    }
}
