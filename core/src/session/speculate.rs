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
//! pass over the weights, each by the float operations decoding applies to
//! that weight row) where the weight type has them (x86 and NEON: the legacy
//! formats, Q4_K and Q6_K, and on x86 Q3_K and Q5_K), else the decode
//! kernels position by position; attention runs position by position.
//!
//! **Rollback.** Rejected drafts were evaluated into the state. Attention
//! layers truncate their KV cache to the accepted length. Recurrent layers
//! (qwen35moe's Gated DeltaNet: delta-rule state and conv window) cannot drop
//! tokens: the session takes a checkpoint before the verify pass and on a
//! rejection restores it and replays the accepted tokens in front of the next
//! pass's batch (so the replay costs no extra pass). That pass's checkpoint
//! is taken before the replayed tokens, so when it rejects too they are
//! replayed again: once 8 tokens wait (`MAX_REPLAY`) they are evaluated in a
//! pass without drafts instead, which commits them. In one-row mode the
//! delta rule runs step by step however long the pass (a prompt of 32 tokens
//! or more takes its chunked form, which sums in another order).
//!
//! **Adaptive draft length.** The draft length k starts at `max_draft`. A
//! verification that accepts every draft grows k by one (up to
//! `max_draft`); one that rejects a draft sets k to the accepted count plus
//! one (at least 1): the next draft is about as long as the last run of
//! agreement. A verify pass is wider than a decode step (on the small models
//! a row costs most of what a one-token pass costs), so a drafter that keeps
//! missing must stop drafting, not just draft less. The cost gate below
//! sees to that; without it (tests' scripted drafts), after two verifications
//! in a row that accept nothing, the drafter pauses for 2 decode steps, then
//! 4, 8, ... up to [`MAX_PAUSE`] (each pause ends with one probe: a draft of
//! one token); any accepted draft ends the back-off.
//!
//! **The cost gate.** Within that length, a pass is only spent where it is
//! expected to pay. The session times its passes: a decode step's, and a
//! verify pass's cost per verified row beyond it (0.1 of a decode step on
//! Gemma 3 270M, 0.45 on SmolLM2-135M, more under a memory budget, where
//! wider passes read more experts), plus drafting's own cost (an MTP step, a
//! draft model's pass). With the acceptance rate seen so far (for lookup,
//! separately by the length of the n-gram matched: a 1-gram match in free
//! text is a weak guess, a 3-gram match while copying a strong one) the
//! gate picks the draft length with the most expected tokens per unit of
//! cost, and drafts nothing where no length beats decoding by 5 %, apart
//! from a one-token probe every 8 such steps (up to [`MAX_PAUSE`] while
//! probes miss). The output does not depend on it: only the speed does.
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
use std::time::Instant;

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

/// A drafter with an adaptive draft length, back-off and a cost gate.
pub(super) struct Drafter {
    source: Source,
    max_draft: usize,
    /// The current draft length.
    k: usize,
    /// Verifications in a row that accepted no draft.
    misses: u32,
    /// Decode steps left before the next draft.
    pause: usize,
    /// Drafts only where they are expected to pay (`None`: scripted drafts
    /// and the tests' [`testing::ungated`] requests draft whenever they can).
    gate: Option<Gate>,
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
    /// Lookup without the gate (the adaptive length and back-off alone).
    #[cfg(test)]
    pub fn lookup(ngram: usize, max_draft: usize) -> Drafter {
        Drafter { gate: None, ..Drafter::gated_lookup(ngram, max_draft) }
    }

    #[cfg(test)]
    fn gated_lookup(ngram: usize, max_draft: usize) -> Drafter {
        let mut d = Drafter::with(Source::Lookup { ngram, script: None }, max_draft);
        d.gate = Some(Gate::new(ngram + 1));
        d
    }

    fn with(source: Source, max_draft: usize) -> Drafter {
        let rates = match source {
            Source::Lookup { ngram, .. } => ngram + 1,
            _ => 1,
        };
        let ungated = matches!(source, Source::Lookup { script: Some(_), .. }) || testing::UNGATED.with(|u| u.get());
        let gate = (!ungated).then(|| Gate::new(rates));
        Drafter { source, max_draft, k: max_draft, misses: 0, pause: 0, gate }
    }

    /// Up to `min(k, limit)` drafts to follow `history` (prompt and answer
    /// so far), as many as the gate expects to pay; none while backing off.
    /// Called once per decode step. `draft`: the session's draft model,
    /// which [`Source::Model`] drafts with; `mtp`: the multi-token-prediction
    /// layer, [`Source::Mtp`]'s.
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
        if let Source::Lookup { ngram, script } = &self.source {
            let (mut drafts, n) = match script {
                Some(script) => {
                    let from = history.len().min(script.len());
                    (script[from..(from + k).min(script.len())].to_vec(), 0)
                }
                None => lookup_n(history, *ngram, k),
            };
            if let Some(g) = self.gate.as_mut() {
                drafts.truncate(g.choose(n, drafts.len()));
            }
            return Ok(drafts);
        }
        // A model drafts: the gate decides the length before it is paid for.
        let k = match self.gate.as_mut() {
            Some(g) => g.choose(0, k),
            None => k,
        };
        if k == 0 {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let drafts = match (&self.source, draft, mtp) {
            (Source::Mtp, _, Some((m, model, pool))) => m.propose(model, pool, history, k)?,
            (Source::Mtp, _, None) => Vec::new(),
            (Source::Model, Some(d), _) => d.propose(history, k)?,
            (Source::Model, None, _) => return Err(no_draft_model()),
            (Source::Lookup { .. }, ..) => unreachable!("lookup drafts above"),
        };
        if let Some(g) = self.gate.as_mut() {
            g.timed_drafting(drafts.len(), start.elapsed().as_secs_f64());
        }
        Ok(drafts)
    }

    /// Adapt the draft length, the back-off and the gate's acceptance rate
    /// after a verification that accepted `accepted` of `drafted` drafts.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        self.k =
            if accepted == drafted { (self.k + 1).min(self.max_draft) } else { (accepted + 1).min(self.max_draft) };
        if let Some(g) = self.gate.as_mut() {
            // The gate's probes take the place of the back-off.
            g.verified(drafted, accepted);
        } else if accepted > 0 {
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

    /// A decode step's pass (one token, no drafts) took `secs`.
    pub fn timed_decode(&mut self, secs: f64) {
        if let Some(g) = self.gate.as_mut() {
            g.timed_decode(secs);
        }
    }

    /// A verify pass of `drafts` drafts (and the token before them) took `secs`.
    pub fn timed_verify(&mut self, drafts: usize, secs: f64) {
        if let Some(g) = self.gate.as_mut() {
            g.timed_verify(drafts, secs);
        }
    }

    /// Start from the costs an earlier request of the session measured.
    pub fn resume(&mut self, m: &Measured) {
        let drafting = match self.source {
            Source::Lookup { .. } => None,
            Source::Mtp => m.mtp,
            Source::Model => m.model,
        };
        if let Some(g) = self.gate.as_mut() {
            g.costs = Costs { decode: m.decode, verify: m.verify, drafting };
        }
    }

    /// Keep what this request measured for the session's next one.
    pub fn record(&self, m: &mut Measured) {
        let Some(g) = self.gate.as_ref() else { return };
        let c = g.costs;
        m.decode = c.decode.or(m.decode);
        m.verify = c.verify.or(m.verify);
        match self.source {
            Source::Lookup { .. } => {}
            Source::Mtp => m.mtp = c.drafting.or(m.mtp),
            Source::Model => m.model = c.drafting.or(m.model),
        }
    }

    #[cfg(test)]
    fn k(&self) -> usize {
        self.k
    }
}

/// The gate: drafts only where a verify pass is expected to give more
/// tokens per second than decoding. With a per-draft acceptance rate `a`
/// (each draft accepted given the ones before it were) a pass of k drafts
/// gives `1 + a + ... + a^k` tokens and costs `1 + c·k` decode steps, `c`
/// the measured cost of a verified row plus of drafting one token. The
/// length with the best ratio wins if it beats decoding by [`GAIN`];
/// otherwise nothing is drafted, but a one-token probe goes out every
/// `probe_every` such steps (doubling while probes miss), so a rate that
/// has recovered is seen again.
struct Gate {
    /// Acceptance per source of drafts: lookup's by the length of the
    /// n-gram it matched (a 1-gram match in free text is a weak guess, a
    /// 3-gram match while copying a strong one); index 0 for models.
    rates: Vec<Rate>,
    /// The rate the last proposal drew on, and whether it was a probe.
    last: usize,
    probing: bool,
    /// What the passes cost, as measured so far.
    costs: Costs,
    idle: usize,
    probe_every: usize,
}

/// A gate's measured costs (moving averages; `None` until measured).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Costs {
    /// A decode step's pass, seconds.
    decode: Option<f64>,
    /// A verified row's cost beyond the decode step, in decode steps
    /// ([`PRIOR_VERIFY`] until measured).
    verify: Option<f64>,
    /// Drafting one token, in decode steps (0 for lookup).
    drafting: Option<f64>,
}

impl Costs {
    /// A draft's whole cost: its verified row and its drafting, in decode steps.
    fn per_draft(&self) -> f64 {
        self.verify.unwrap_or(PRIOR_VERIFY) + self.drafting.unwrap_or(0.0)
    }
}

/// What a session's gates measured, carried from one request to the next,
/// so that a short request (an extraction of a dozen tokens) chooses its
/// draft lengths from this session's measured costs from its first step
/// rather than from the priors. Acceptance rates are not carried: they
/// belong to the text being written.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Measured {
    decode: Option<f64>,
    verify: Option<f64>,
    /// Drafting one token with the MTP layer, with the draft model.
    mtp: Option<f64>,
    model: Option<f64>,
}

/// Expected tokens per second over decoding a drafting length must give.
const GAIN: f64 = 1.05;
/// The verified row's cost assumed before one is measured (a small model's
/// one-row verification, measured: 0.1-0.45 of a decode step).
const PRIOR_VERIFY: f64 = 0.35;
/// Moving averages' weight of a new measurement.
const EMA: f64 = 0.25;
const FIRST_PROBE: usize = 8;

/// A per-draft acceptance rate, from decayed counts (prior: 0.6 over 2 drafts).
#[derive(Clone, Copy)]
struct Rate {
    hits: f64,
    misses: f64,
}

impl Rate {
    const PRIOR: Rate = Rate { hits: 1.2, misses: 0.8 };
    /// Older verifications count this much less per new one.
    const DECAY: f64 = 0.7;

    fn p(&self) -> f64 {
        self.hits / (self.hits + self.misses)
    }

    fn add(&mut self, accepted: usize, rejected: bool) {
        self.hits = self.hits * Self::DECAY + accepted as f64;
        self.misses = self.misses * Self::DECAY + f64::from(u8::from(rejected));
    }
}

impl Gate {
    fn new(rates: usize) -> Gate {
        Gate {
            rates: vec![Rate::PRIOR; rates.max(1)],
            last: 0,
            probing: false,
            costs: Costs::default(),
            idle: 0,
            probe_every: FIRST_PROBE,
        }
    }

    /// How many of up to `max` drafts (from rate `rate`) to verify.
    fn choose(&mut self, rate: usize, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        self.last = rate.min(self.rates.len() - 1);
        self.probing = false;
        let k = best_length(self.rates[self.last].p(), self.costs.per_draft(), max);
        if k > 0 {
            self.idle = 0;
            return k;
        }
        self.idle += 1;
        if self.idle < self.probe_every {
            return 0;
        }
        self.idle = 0;
        self.probing = true;
        1
    }

    fn verified(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.rates[self.last].add(accepted, accepted < drafted);
        if self.probing {
            self.probe_every = if accepted > 0 { FIRST_PROBE } else { (self.probe_every * 2).min(MAX_PAUSE) };
        }
    }

    fn timed_decode(&mut self, secs: f64) {
        self.costs.decode = Some(match self.costs.decode {
            Some(d) => d + EMA * (secs - d),
            None => secs,
        });
    }

    fn timed_verify(&mut self, drafts: usize, secs: f64) {
        if let (Some(d), true) = (self.costs.decode, drafts > 0) {
            let per_row = ((secs / d - 1.0) / drafts as f64).clamp(0.0, 4.0);
            let v = self.costs.verify.unwrap_or(PRIOR_VERIFY);
            self.costs.verify = Some(v + EMA * (per_row - v));
        }
    }

    fn timed_drafting(&mut self, drafts: usize, secs: f64) {
        if let (Some(d), true) = (self.costs.decode, drafts > 0) {
            let per_draft = (secs / d / drafts as f64).clamp(0.0, 4.0);
            let v = self.costs.drafting.unwrap_or(0.0);
            self.costs.drafting = Some(v + EMA * (per_draft - v));
        }
    }
}

/// The draft length in `0..=max` with the most expected tokens per decode
/// step's cost at acceptance `a` and per-draft cost `c`; 0 when no length
/// beats decoding by [`GAIN`].
fn best_length(a: f64, c: f64, max: usize) -> usize {
    let (mut best, mut best_k) = (GAIN, 0);
    let (mut tokens, mut term) = (1.0, 1.0);
    for k in 1..=max {
        term *= a;
        tokens += term;
        let ratio = tokens / (1.0 + c * k as f64);
        if ratio > best {
            (best, best_k) = (ratio, k);
        }
    }
    best_k
}

fn no_draft_model() -> Error {
    Error::InvalidArgument(
        "speculation: draft model: the session has no draft model (SessionOptions.draft_model)".into(),
    )
}

/// The up to `max` tokens that followed the most recent earlier occurrence
/// of `history`'s last n tokens, for n from `ngram` down to 1 (the longest
/// match that has a continuation wins).
#[cfg(test)]
pub(super) fn lookup(history: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    lookup_n(history, ngram, max).0
}

/// [`lookup`]'s drafts and the length of the n-gram they follow (0: none).
fn lookup_n(history: &[u32], ngram: usize, max: usize) -> (Vec<u32>, usize) {
    let len = history.len();
    if max == 0 {
        return (Vec::new(), 0);
    }
    for n in (1..=ngram.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Occurrences starting at j with a token after them: j + n < len.
        for j in (0..len - n).rev() {
            if &history[j..j + n] == tail {
                let from = j + n;
                return (history[from..(from + max).min(len)].to_vec(), n);
            }
        }
    }
    (Vec::new(), 0)
}

/// A hook for tests of the verification itself: the fixture models have
/// random weights and never repeat themselves, so lookup's drafts are never
/// accepted on them. A test scripts the drafts instead (the model's own
/// greedy tokens with some changed, so that drafts are both accepted and
/// rejected); everything else (verify pass, sampling, rollback) is the
/// `Lookup` path. Not part of the API.
#[doc(hidden)]
pub mod testing {
    use std::cell::{Cell, RefCell};

    thread_local! {
        pub(super) static SCRIPT: RefCell<Option<Vec<u32>>> = const { RefCell::new(None) };
        pub(super) static UNGATED: Cell<bool> = const { Cell::new(false) };
    }

    /// Requests on this thread draft whenever their drafter can (the
    /// adaptive length and back-off still apply) instead of where the cost
    /// gate expects drafts to pay: tests of verification on the fixtures'
    /// random-weight models, whose drafts rarely pay, need drafts to verify.
    pub fn ungated(on: bool) {
        UNGATED.with(|u| u.set(on));
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
    fn the_best_draft_length_follows_acceptance_and_cost() {
        // Drafts that are nearly free: as long as allowed.
        assert_eq!(best_length(0.5, 0.0, 8), 8);
        // Copying (a = 0.9) at a small model's row cost: a middling length.
        let k = best_length(0.9, 0.35, 8);
        assert!((3..=6).contains(&k), "{k}");
        // Cheaper rows: longer drafts.
        assert!(best_length(0.9, 0.1, 8) > k);
        // Free text (a = 0.1), or a row as dear as the tokens it brings: none.
        assert_eq!(best_length(0.1, 0.35, 8), 0);
        assert_eq!(best_length(0.5, 0.5, 8), 0);
        assert_eq!(best_length(0.9, 0.35, 0), 0);
    }

    /// Costs as a session measures them: decode passes of 10 ms, verify
    /// passes costing `per_row` of that per draft.
    fn timed(d: &mut Drafter, per_row: f64) {
        for _ in 0..20 {
            d.timed_decode(0.010);
            d.timed_verify(4, 0.010 * (1.0 + 4.0 * per_row));
        }
    }

    #[test]
    fn the_gate_stops_drafts_that_miss_and_probes_again() {
        let h = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2];
        let mut d = Drafter::gated_lookup(2, 4);
        timed(&mut d, 0.3);
        let mut passes = Vec::new();
        for step in 0..400 {
            let drafts = d.propose(&h, 8, None, None).unwrap();
            if !drafts.is_empty() {
                passes.push((step, drafts.len()));
                d.update(drafts.len(), 0);
            }
        }
        // Without the gate, the back-off alone verifies ~20 passes in 400 steps (see above).
        assert!(passes.len() <= 14, "{passes:?}");
        // After the first misses only one-token probes, further and further apart.
        assert!(passes[3..].iter().all(|&(_, k)| k == 1), "{passes:?}");
        let gaps: Vec<usize> = passes.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(gaps.last() >= gaps.get(2), "{gaps:?}");
        // Accepted probes bring drafting back within a few probes.
        let back = (0..4 * MAX_PAUSE).position(|_| {
            let n = d.propose(&h, 8, None, None).unwrap().len();
            if n > 0 {
                d.update(n, n);
            }
            n >= 2
        });
        assert!(back.is_some_and(|steps| steps <= 2 * MAX_PAUSE), "{back:?}");
    }

    #[test]
    fn the_gate_drafts_long_when_copying_and_rows_are_cheap() {
        let h: Vec<u32> = (0..40).chain(0..10).collect();
        for (per_row, at_least) in [(0.05, 8), (0.3, 3)] {
            let mut d = Drafter::gated_lookup(3, 8);
            timed(&mut d, per_row);
            let mut last = 0;
            for _ in 0..10 {
                last = d.propose(&h, 8, None, None).unwrap().len();
                d.update(last, last);
            }
            assert!(last >= at_least, "row cost {per_row}: {last} drafts");
        }
        // Rows as dear as a decode step: never worth it, even when every draft is accepted.
        let mut d = Drafter::gated_lookup(3, 8);
        timed(&mut d, 1.2);
        let drafted: usize = (0..40)
            .map(|_| {
                let n = d.propose(&h, 8, None, None).unwrap().len();
                d.update(n, n);
                n
            })
            .sum();
        assert!(drafted <= 8, "{drafted} drafted at a row cost of 1.2 decode steps");
    }

    #[test]
    fn a_request_starts_from_the_costs_the_last_one_measured() {
        // Copying (every draft accepted) where rows are cheap: the first
        // request learns that only after its first passes; the next starts there.
        let h: Vec<u32> = (0..40).chain(0..10).collect();
        let first_choice = |d: &mut Drafter| d.propose(&h, 8, None, None).unwrap().len();
        let mut measured = Measured::default();
        let mut first = Drafter::gated_lookup(3, 8);
        first.resume(&measured);
        let untimed = first_choice(&mut first);
        timed(&mut first, 0.05);
        first.record(&mut measured);
        assert!(measured.decode.is_some() && measured.verify.is_some(), "{measured:?}");
        assert!(measured.mtp.is_none() && measured.model.is_none(), "lookup drafts nothing to time: {measured:?}");
        let mut next = Drafter::gated_lookup(3, 8);
        next.resume(&measured);
        let resumed = first_choice(&mut next);
        assert!(resumed > untimed, "resumed {resumed} drafts, from the priors {untimed}");
        // A request that measured nothing (no gate: scripted or ungated) leaves them be.
        Drafter::lookup(3, 8).record(&mut measured);
        assert_eq!(measured.verify, first.gate.as_ref().and_then(|g| g.costs.verify));
        // A model drafter's drafting cost is kept apart from lookup's (none).
        let mut mtp = Drafter::with(Source::Mtp, 4);
        mtp.resume(&measured);
        mtp.gate.as_mut().unwrap().timed_drafting(2, 0.004);
        mtp.record(&mut measured);
        assert!(measured.mtp.is_some_and(|c| c > 0.0) && measured.model.is_none(), "{measured:?}");
    }

    #[test]
    fn lookup_rates_are_kept_by_the_length_of_the_match() {
        // "7" recurs (1-gram matches whose continuation misses); "1 2 3"
        // recurs (3-gram matches whose continuation is accepted).
        let one: Vec<u32> = vec![7, 40, 41, 7];
        let three: Vec<u32> = vec![1, 2, 3, 9, 9, 9, 1, 2, 3];
        assert_eq!(lookup_n(&one, 3, 4).1, 1);
        assert_eq!(lookup_n(&three, 3, 4).1, 3);
        let mut d = Drafter::gated_lookup(3, 4);
        timed(&mut d, 0.3);
        for _ in 0..6 {
            let n = d.propose(&one, 8, None, None).unwrap().len();
            d.update(n, 0);
            let n = d.propose(&three, 8, None, None).unwrap().len();
            d.update(n, n);
        }
        // The 1-gram rate has fallen: no drafts there; the 3-gram one still drafts.
        let mut one_drafts = 0;
        for _ in 0..4 {
            one_drafts += d.propose(&one, 8, None, None).unwrap().len();
        }
        assert!(one_drafts <= 1, "{one_drafts}");
        assert!(!d.propose(&three, 8, None, None).unwrap().is_empty());
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
