//! Speculative decoding: a drafter proposes the next few tokens, the model
//! evaluates the last accepted token and the drafts in one batched pass
//! (logits for every position), and the generate loop samples each position
//! in turn, keeping drafts while the sampled token equals them.
//!
//! **Verification.** At each verified position the sampler chain (penalties
//! over the tokens before that position, top-k/p, min-p, temperature) gives
//! the distribution p exactly as without speculation, and one token x is
//! drawn from it. The draft d is accepted when x = d; otherwise x is the
//! model's own token and the rest of the drafts are dropped. The drafters
//! here are deterministic (q is one-hot on d), and for a one-hot q this *is*
//! speculative sampling: d is accepted with probability p(d) = min(1, p/q),
//! and on rejection x follows p with d's mass removed, renormalised
//! (= normalise(max(0, p − q))). Each emitted token takes one draw from the
//! generator, as without speculation, so a seeded request gives the same
//! tokens with or without it (greedy: argmax, the same tokens by construction).
//!
//! **Exactness.** The prefill kernels (K-quant panels, four-token tails,
//! tiled attention) round differently from the one-row kernels in the last
//! bits, which flips a near-tie now and then (seen on Gemma 3 270M Q4_K_M).
//! A verify pass therefore runs with the pool in one-row mode
//! ([`crate::threads::ThreadPool::set_one_row`]): every position is computed
//! as decoding would compute it, bit for bit. The weight products take the
//! exact multi-row kernels (`kernels::table::Exact`: up to four positions per
//! pass over the weights, each by the one-row kernel's float operations)
//! where the weight type has them, else the decode kernels position by
//! position; attention runs position by position.
//!
//! **Rollback.** Rejected drafts were evaluated into the state. Attention
//! layers truncate their KV cache to the accepted length. Recurrent layers
//! (qwen35moe's Gated DeltaNet: delta-rule state and conv window) cannot drop
//! tokens: the session takes a checkpoint before the verify pass and on a
//! rejection restores it and replays the accepted tokens in front of the next
//! pass's batch (so the replay costs no extra pass).
//!
//! **Adaptive draft length.** The draft length k starts at `max_draft`. A
//! verification that accepts every draft grows k by one (up to
//! `max_draft`); one that rejects a draft sets k to the accepted count plus
//! one (at least 1): the next draft is about as long as the last run of
//! agreement. A verify pass is wider than a decode step (on the small models
//! a row costs most of what a one-token pass costs), so a drafter that keeps
//! missing must stop drafting, not just draft less: after two verifications
//! in a row that accept nothing, the drafter pauses for 2 decode steps, then
//! 4, 8, ... up to [`MAX_PAUSE`] (each pause ends with one probe: a draft of
//! one token); any accepted draft ends the back-off. Free chat, where lookup
//! finds n-grams that the answer does not follow, then costs one probe row
//! every [`MAX_PAUSE`] tokens instead of one wasted row per token.
//!
//! **Constraints and tools.** A request with a constraint or tools
//! speculates too: each verified row is sampled under the turn's mask for
//! that position (the first row's computed while the verify pass runs, each
//! next one after the token before it is accepted), so a draft the
//! structure forbids is simply rejected. The matcher only ever consumes
//! sampled tokens, never drafts: a rejection leaves nothing to roll back.
//! Before the pass, drafts are cut at the first one the constraint (or an
//! open call's grammar) refuses ([`crate::structured::Turn::allowed_prefix`]),
//! so no row is spent on them. Forced tokens (a grammar's fast-forward, a
//! thought closed in place of the end) end the verification, as they replace
//! the drafts after them.

use crate::error::{Error, Result};
use crate::gguf::Key;
use crate::model::Model;

use super::draft::DraftSession;
use super::mtp::MtpDraft;
use crate::threads::ThreadPool;

/// How a request drafts tokens for verification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    /// One token per forward pass.
    #[default]
    Off,
    /// Prompt lookup: the tokens that followed the most recent earlier
    /// occurrence of the last `ngram` (down to 1) tokens of the prompt and
    /// the answer so far, up to `max_draft` of them.
    Lookup { ngram: usize, max_draft: usize },
    /// The model's multi-token-prediction layer (qwen35moe files that keep
    /// it: `nextn_predict_layers`), drafting greedily: up to `max_draft` tokens.
    Mtp { max_draft: usize },
    /// A smaller model of the same vocabulary, the session's
    /// [`SessionOptions::draft_model`](super::SessionOptions::draft_model),
    /// drafting greedily: up to `max_draft` tokens.
    DraftModel { max_draft: usize },
}

/// Largest draft a request may ask for (a verify pass's batch is one more).
pub const MAX_DRAFT: usize = 64;
/// Longest n-gram prompt lookup matches.
pub const MAX_NGRAM: usize = 16;

impl Speculation {
    /// The settings in range (model-independent checks).
    pub fn validate(&self) -> Result<()> {
        let draft = |n: usize| {
            if (1..=MAX_DRAFT).contains(&n) {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!("speculation: max_draft {n} is not in 1..={MAX_DRAFT}")))
            }
        };
        match *self {
            Speculation::Off => Ok(()),
            Speculation::Lookup { ngram, max_draft } => {
                if !(1..=MAX_NGRAM).contains(&ngram) {
                    return Err(Error::InvalidArgument(format!(
                        "speculation: ngram {ngram} is not in 1..={MAX_NGRAM}"
                    )));
                }
                draft(max_draft)
            }
            Speculation::Mtp { max_draft } | Speculation::DraftModel { max_draft } => draft(max_draft),
        }
    }

    /// The drafter for a request on `model` (in a session with a draft
    /// model or not), or why this kind cannot run.
    pub(super) fn drafter(&self, model: &Model, has_draft_model: bool) -> Result<Option<Drafter>> {
        self.validate()?;
        match *self {
            Speculation::Off => Ok(None),
            Speculation::Lookup { ngram, max_draft } => {
                let script = testing::SCRIPT.with(|s| s.borrow().clone());
                Ok(Some(Drafter::with(Source::Lookup { ngram, script }, max_draft)))
            }
            Speculation::Mtp { max_draft } => match model.has_mtp() {
                Ok(true) => Ok(Some(Drafter::with(Source::Mtp, max_draft))),
                Ok(false) => {
                    let file = model.file();
                    let arch = file.architecture()?.unwrap_or("");
                    let layers = file.get_u64(&Key::NextnPredictLayers.for_arch(arch))?.unwrap_or(0);
                    let tensors = file.tensors().iter().any(|t| t.name.contains("nextn"));
                    if layers > 0 || tensors {
                        Err(Error::InvalidArgument(format!(
                            "speculation: mtp: this file has an MTP layer ({arch}.nextn_predict_layers = {layers}) \
                             but MTP drafting is not supported for {arch}; use lookup"
                        )))
                    } else {
                        Err(Error::InvalidArgument("speculation: mtp: this file has no MTP layer; use lookup".into()))
                    }
                }
                Err(e) => Err(Error::InvalidArgument(format!("speculation: mtp: {e}"))),
            },
            Speculation::DraftModel { max_draft } if has_draft_model => {
                Ok(Some(Drafter::with(Source::Model, max_draft)))
            }
            Speculation::DraftModel { .. } => Err(no_draft_model()),
        }
    }
}

/// Decode steps a drafter that keeps missing waits, at most, between probes.
pub const MAX_PAUSE: usize = 32;

/// A drafter with an adaptive draft length and back-off.
pub(super) struct Drafter {
    source: Source,
    max_draft: usize,
    /// The current draft length.
    k: usize,
    /// Verifications in a row that accepted no draft.
    misses: u32,
    /// Decode steps left before the next draft.
    pause: usize,
}

/// Where drafts come from.
enum Source {
    /// Prompt lookup; `script`: tests' drafts read from this token sequence
    /// at the history's length instead of looked up (see [`testing`]).
    Lookup { ngram: usize, script: Option<Vec<u32>> },
    /// The session's draft model, greedy (`session/draft.rs`).
    Model,
    /// The model's multi-token-prediction layer, greedy (`session/mtp.rs`).
    Mtp,
}

impl Drafter {
    #[cfg(test)]
    pub fn lookup(ngram: usize, max_draft: usize) -> Drafter {
        Drafter::with(Source::Lookup { ngram, script: None }, max_draft)
    }

    fn with(source: Source, max_draft: usize) -> Drafter {
        Drafter { source, max_draft, k: max_draft, misses: 0, pause: 0 }
    }

    /// Up to `min(k, limit)` drafts to follow `history` (prompt and answer
    /// so far); none while backing off. Called once per decode step.
    /// `draft`: the session's draft model, which [`Source::Model`] drafts
    /// with; `mtp`: the multi-token-prediction layer, [`Source::Mtp`]'s.
    pub fn propose(
        &mut self,
        history: &[u32],
        limit: usize,
        draft: Option<&mut DraftSession>,
        mtp: Option<(&mut MtpDraft, &Model, &ThreadPool)>,
    ) -> Result<Vec<u32>> {
        if self.pause > 0 {
            self.pause -= 1;
            return Ok(Vec::new());
        }
        let k = self.k.min(limit);
        if k == 0 {
            return Ok(Vec::new());
        }
        if let Source::Mtp = self.source {
            return match mtp {
                Some((m, model, pool)) => m.propose(model, pool, history, k),
                None => Ok(Vec::new()),
            };
        }
        match (&self.source, draft) {
            (Source::Lookup { script: Some(script), .. }, _) => {
                let from = history.len().min(script.len());
                Ok(script[from..(from + k).min(script.len())].to_vec())
            }
            (Source::Lookup { ngram, script: None }, _) => Ok(lookup(history, *ngram, k)),
            (Source::Model, Some(d)) => d.propose(history, k),
            (Source::Model, None) => Err(no_draft_model()),
            (Source::Mtp, _) => Ok(Vec::new()),
        }
    }

    /// Adapt the draft length and the back-off after a verification that
    /// accepted `accepted` of `drafted` drafts.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        self.k =
            if accepted == drafted { (self.k + 1).min(self.max_draft) } else { (accepted + 1).min(self.max_draft) };
        if accepted > 0 {
            self.misses = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
            // 0 after the first miss, then 2, 4, 8, ... steps.
            self.pause = match self.misses {
                0 | 1 => 0,
                m => 1usize.checked_shl(m - 1).unwrap_or(MAX_PAUSE).min(MAX_PAUSE),
            };
        }
    }

    #[cfg(test)]
    fn k(&self) -> usize {
        self.k
    }
}

fn no_draft_model() -> Error {
    Error::InvalidArgument(
        "speculation: draft model: the session has no draft model (SessionOptions.draft_model)".into(),
    )
}

/// The up to `max` tokens that followed the most recent earlier occurrence
/// of `history`'s last n tokens, for n from `ngram` down to 1 (the longest
/// match that has a continuation wins).
pub(super) fn lookup(history: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let len = history.len();
    if max == 0 {
        return Vec::new();
    }
    for n in (1..=ngram.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Occurrences starting at j with a token after them: j + n < len.
        for j in (0..len - n).rev() {
            if &history[j..j + n] == tail {
                let from = j + n;
                return history[from..(from + max).min(len)].to_vec();
            }
        }
    }
    Vec::new()
}

/// A hook for tests of the verification itself: the fixture models have
/// random weights and never repeat themselves, so lookup's drafts are never
/// accepted on them. A test scripts the drafts instead (the model's own
/// greedy tokens with some changed, so that drafts are both accepted and
/// rejected); everything else (verify pass, sampling, rollback) is the
/// `Lookup` path. Not part of the API.
#[doc(hidden)]
pub mod testing {
    use std::cell::RefCell;

    thread_local! {
        pub(super) static SCRIPT: RefCell<Option<Vec<u32>>> = const { RefCell::new(None) };
    }

    /// Requests on this thread with `Speculation::Lookup` draft
    /// `script[n..]` at a history of n tokens (prompt included), up to the
    /// draft length; `None` restores lookup.
    pub fn script_drafts(script: Option<Vec<u32>>) {
        SCRIPT.with(|s| *s.borrow_mut() = script);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_follows_the_most_recent_longest_match() {
        // "1 2 3 9 ... 1 2 3 7 ... 2 3" -> the latest "2 3" is followed by 7.
        let h = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 2, 3];
        assert_eq!(lookup(&h, 2, 3), vec![7, 8, 2]);
        // A longer n-gram is preferred to a more recent shorter one.
        let h = [4, 5, 6, 1, 6, 2, 5, 6];
        assert_eq!(lookup(&h, 2, 2), vec![1, 6]);
        assert_eq!(lookup(&h, 1, 2), vec![2, 5]);
        // The continuation may run to the end of the history.
        let h = [1, 2, 1];
        assert_eq!(lookup(&h, 3, 5), vec![2, 1]);
        // No match, no history, no room.
        assert!(lookup(&[1, 2, 3], 2, 4).is_empty());
        assert!(lookup(&[], 2, 4).is_empty());
        assert!(lookup(&[1, 1], 2, 0).is_empty());
    }

    #[test]
    fn draft_length_shrinks_on_rejection_and_grows_on_full_acceptance() {
        let mut d = Drafter::lookup(3, 6);
        assert_eq!(d.k(), 6);
        d.update(6, 1);
        assert_eq!(d.k(), 2);
        d.update(2, 0);
        assert_eq!(d.k(), 1);
        d.update(1, 1);
        assert_eq!(d.k(), 2);
        for _ in 0..10 {
            d.update(d.k(), d.k());
        }
        assert_eq!(d.k(), 6);
        d.update(6, 2);
        assert_eq!(d.k(), 3);
        // A short proposal (the history ran out) fully accepted still grows.
        d.update(2, 2);
        assert_eq!(d.k(), 4);
    }

    #[test]
    fn a_drafter_that_keeps_missing_backs_off_and_probes_again() {
        // A history where lookup always finds a match (with 5 tokens after it).
        let h = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2];
        let mut d = Drafter::lookup(2, 4);
        let mut passes = Vec::new();
        for step in 0..200 {
            let drafts = d.propose(&h, 8, None, None).unwrap();
            if !drafts.is_empty() {
                passes.push(step);
                d.update(drafts.len(), 0);
            }
        }
        // Two misses, then pauses of 2, 4, 8, 16 and 32 steps between probes.
        assert_eq!(&passes[..7], &[0, 1, 4, 9, 18, 35, 68]);
        assert!(passes.windows(2).all(|w| w[1] - w[0] <= MAX_PAUSE + 1), "{passes:?}");
        assert!(passes.len() <= 11, "{} verify passes in 200 steps", passes.len());
        // Every probe is one draft (k fell to 1), and an accepted one ends the back-off.
        assert_eq!(d.k(), 1);
        while d.propose(&h, 8, None, None).unwrap().is_empty() {}
        d.update(1, 1);
        assert_eq!(d.propose(&h, 8, None, None).unwrap().len(), 2);
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        assert!(Speculation::Off.validate().is_ok());
        assert!(Speculation::Lookup { ngram: 3, max_draft: 8 }.validate().is_ok());
        for bad in [
            Speculation::Lookup { ngram: 0, max_draft: 8 },
            Speculation::Lookup { ngram: 3, max_draft: 0 },
            Speculation::Lookup { ngram: 3, max_draft: MAX_DRAFT + 1 },
            Speculation::Mtp { max_draft: 0 },
        ] {
            let e = bad.validate().expect_err("out of range").to_string();
            assert!(e.contains("speculation"), "{e}");
        }
    }
}
