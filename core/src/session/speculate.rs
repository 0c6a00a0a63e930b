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
//! **Exactness.** The multi-row kernels (K-quant panels, tiled attention)
//! round differently from the one-row kernels in the last bits, which flips
//! a near-tie now and then (seen on Gemma 3 270M Q4_K_M). A verify pass
//! therefore runs with the pool in one-row mode ([`crate::threads::ThreadPool::set_one_row`]):
//! every position is computed as decoding would compute it, bit for bit,
//! while each tile of weights is still read once for all positions.
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
//! agreement, and a drafter that keeps missing costs one extra position per pass.
//!
//! Speculation is switched off for a request with a constraint or tools (a
//! mask per verified position would need the matcher advanced over accepted
//! drafts and rolled back on rejection; not built): such a request decodes
//! one token per pass, exactly as with [`Speculation::Off`].

use crate::error::{Error, Result};
use crate::gguf::Key;
use crate::model::Model;

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
    /// The model's multi-token-prediction head (not yet supported).
    Mtp { max_draft: usize },
    /// A smaller model of the same vocabulary (not yet supported).
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

    /// The drafter for a request on `model`, or why this kind cannot run.
    pub(super) fn drafter(&self, model: &Model) -> Result<Option<Drafter>> {
        self.validate()?;
        match *self {
            Speculation::Off => Ok(None),
            Speculation::Lookup { ngram, max_draft } => {
                let mut d = Drafter::new(ngram, max_draft);
                d.script = testing::SCRIPT.with(|s| s.borrow().clone());
                Ok(Some(d))
            }
            Speculation::Mtp { .. } => {
                let file = model.file();
                let arch = file.architecture()?.unwrap_or("");
                let layers = file.get_u64(&Key::NextnPredictLayers.for_arch(arch))?.unwrap_or(0);
                let tensors = file.tensors().iter().any(|t| t.name.contains("nextn"));
                if layers > 0 || tensors {
                    Err(Error::InvalidArgument(format!(
                        "speculation: mtp: this file has an MTP layer ({arch}.nextn_predict_layers = {layers}) \
                         but MTP drafting is not yet supported; use lookup"
                    )))
                } else {
                    Err(Error::InvalidArgument("speculation: mtp: this file has no MTP layer; use lookup".into()))
                }
            }
            Speculation::DraftModel { .. } => {
                Err(Error::InvalidArgument("speculation: draft model drafting is not yet supported; use lookup".into()))
            }
        }
    }
}

/// Prompt lookup with an adaptive draft length.
#[derive(Clone, Debug)]
pub(super) struct Drafter {
    ngram: usize,
    max_draft: usize,
    /// The current draft length.
    k: usize,
    /// Tests: drafts read from this token sequence at the history's length
    /// instead of looked up (see [`testing`]).
    script: Option<Vec<u32>>,
}

impl Drafter {
    pub fn new(ngram: usize, max_draft: usize) -> Drafter {
        Drafter { ngram, max_draft, k: max_draft, script: None }
    }

    /// Up to `min(k, limit)` drafts to follow `history` (prompt and answer so far).
    pub fn propose(&self, history: &[u32], limit: usize) -> Vec<u32> {
        let k = self.k.min(limit);
        if let Some(script) = &self.script {
            let from = history.len().min(script.len());
            return script[from..(from + k).min(script.len())].to_vec();
        }
        lookup(history, self.ngram, k)
    }

    /// Adapt the draft length after a verification that accepted
    /// `accepted` of `drafted` drafts.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        self.k =
            if accepted == drafted { (self.k + 1).min(self.max_draft) } else { (accepted + 1).min(self.max_draft) };
    }

    #[cfg(test)]
    fn k(&self) -> usize {
        self.k
    }
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
        let mut d = Drafter::new(3, 6);
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
