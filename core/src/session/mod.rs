//! Sessions: a model's conversation state, the generate loop, streaming,
//! cancellation, stop conditions and statistics.
//!
//! A session caches the tokens it has evaluated. Each request (a raw prompt
//! or chat messages rendered through the template) is tokenised and compared
//! with that cache: only the tokens after the common prefix are evaluated, so
//! a chat turn costs its new tokens, not the whole history. Recurrent models
//! (qwen35moe) cannot drop tokens, so the session keeps state checkpoints at
//! the end of each prompt and of each answer and rewinds to the best one.
//!
//! A session can be saved to a file and restored, in this process or a later
//! one, exactly where it stood (`session/snapshot/mod.rs` says what a snapshot holds).

mod cancel;
mod draft;
mod mtp;
mod options;
mod output;
mod shared;
mod snapshot;
mod speculate;
mod stop;

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::chat::ChatMessage;
use crate::error::{Error, Result};
use crate::model::{Checkpoint, Logits, Model, State};
use crate::sampler::{Sampler, SamplerConfig};
use crate::structured::{
    Closed, GenerationEvent, Mask, Reasoning, ThinkFormat, ToolCall, ToolChoice, ToolFormat, Turn,
};
use crate::threads::ThreadPool;

pub use crate::sampler::DEFAULT_SEED;
pub use cancel::CancelHandle;
pub(crate) use cancel::Ticket;
use draft::DraftSession;
use mtp::MtpDraft;
pub use mtp::{mtp_draft_extra_tokens, mtp_draft_head_rows, MTP_DRAFT_VOCAB};
pub use options::{
    ContextPolicy, GenerateOptions, GenerationStats, SessionOptions, StopReason, DEFAULT_MAX_CONTEXT,
    DEFAULT_SLIDE_SINK,
};
pub use output::Plan;
use output::{check_reasoning, sample_under, text_only, Output};
pub use shared::SharedSession;
use speculate::Drafter;
pub use speculate::{testing, Speculation, MAX_DRAFT, MAX_NGRAM, MAX_PAUSE};

/// Tokens a recurrent model's rollbacks may leave to replay before the next
/// verify pass; more are evaluated in a pass without drafts (see the decode
/// loop in `Session::run`).
const MAX_REPLAY: usize = 8;

/// Prompt tokens are evaluated in batches of this many (cancellation is checked between them).
const PREFILL_BATCH: usize = 512;
/// Recurrent models: checkpoints kept (end of prompt, end of answer).
const MAX_CHECKPOINTS: usize = 2;

/// A conversation with a model.
pub struct Session {
    model: Arc<Model>,
    opts: SessionOptions,
    pool: ThreadPool,
    state: State,
    /// Tokens evaluated into `state`, in order.
    cached: Vec<u32>,
    checkpoints: Vec<(Vec<u32>, Checkpoint)>,
    cancel: CancelHandle,
    /// The session on [`SessionOptions::draft_model`], if any.
    draft: Option<Box<DraftSession>>,
    /// The multi-token-prediction layer's state (made by the first
    /// [`Speculation::Mtp`] request).
    mtp: Option<Box<MtpDraft>>,
    /// Recurrent models: the checkpoint a verify pass took, kept for the
    /// next one to reuse its memory.
    spare_checkpoint: Option<Checkpoint>,
    /// The speculation gate's costs measured by earlier requests.
    measured: speculate::Measured,
}

impl Session {
    /// A session with `opts` resolved against the model: the context length
    /// (0 = the training context, at most [`DEFAULT_MAX_CONTEXT`]) and the
    /// sliding window's sink are fixed here, and the state is allocated.
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session> {
        let opts = Self::resolve(&model, opts)?;
        let state = model.new_state(opts.context_length, opts.kv_type)?;
        Session::assemble(model, opts, snapshot::Conversation { state, cached: Vec::new(), checkpoints: Vec::new() })
    }

    /// A session restored from the snapshot at `path` (written by
    /// [`save`](Self::save)), on `model` with `opts`: the next request goes
    /// on exactly as the saved session's would have, evaluating only its new
    /// tokens. The snapshot must come from this model file (same size and
    /// header) and from options with the same context length and KV type;
    /// the other options (threads, sliding window, seed) are `opts`'. The
    /// seed is not in the snapshot: pass the saved session's to sample as it would.
    ///
    /// Errors: [`Error::Io`] when the file cannot be read,
    /// [`Error::InvalidArgument`] naming what is wrong when it is not a
    /// usable snapshot (corrupt, truncated, another model, other options).
    pub fn restore(model: Arc<Model>, path: impl AsRef<Path>, opts: SessionOptions) -> Result<Session> {
        let path = path.as_ref();
        let opts = Self::resolve(&model, opts)?;
        let conversation = read_file(path, &model, &opts)?;
        Session::assemble(model, opts, conversation)
    }

    /// [`restore`](Self::restore) from `len` bytes of `r` (a snapshot kept
    /// somewhere other than a file, or fuzzing).
    pub fn restore_from(model: Arc<Model>, r: &mut dyn Read, len: u64, opts: SessionOptions) -> Result<Session> {
        let opts = Self::resolve(&model, opts)?;
        let conversation = snapshot::read(r, len, &model, opts.context_length, opts.kv_type, MAX_CHECKPOINTS)?;
        Session::assemble(model, opts, conversation)
    }

    /// Save the conversation to `path`, replacing the file crash-safely: a
    /// kill or power loss at any moment leaves the previous file or the new
    /// one, never a torn mix. Writes only the used part of the state (see
    /// `session/snapshot`); the file's size grows with the conversation.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        snapshot::replace(path, |w| self.write_snapshot(w)).map_err(|e| at_path(path, e))
    }

    /// Write the snapshot that [`save`](Self::save) puts in a file to `w`
    /// (no durability: that is the caller's).
    pub fn write_snapshot(&self, w: &mut dyn Write) -> Result<()> {
        snapshot::write(
            w,
            &snapshot::Saved {
                model: &self.model,
                kv: self.opts.kv_type,
                state: &self.state,
                cached: &self.cached,
                checkpoints: &self.checkpoints,
            },
        )
    }

    /// Replace this session's conversation with the snapshot at `path` (see
    /// [`restore`](Self::restore); checked against this session's model and
    /// options). On any error the session is left as it was.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let c = read_file(path.as_ref(), &self.model, &self.opts)?;
        self.state = c.state;
        self.cached = c.cached;
        self.checkpoints = c.checkpoints;
        Ok(())
    }

    /// `opts` with the context length and the sliding window's sink fixed for `model`.
    fn resolve(model: &Model, mut opts: SessionOptions) -> Result<SessionOptions> {
        let n_ctx = opts.resolved_context(model.summary().context_length);
        opts.context_length = n_ctx;
        opts.context_policy = opts.resolved_policy(n_ctx)?;
        Ok(opts)
    }

    /// A session of resolved `opts` over `conversation`, with its draft
    /// model's session (whose vocabulary must be the model's).
    fn assemble(model: Arc<Model>, opts: SessionOptions, conversation: snapshot::Conversation) -> Result<Session> {
        let draft = match &opts.draft_model {
            Some(d) => Some(Box::new(DraftSession::open(&model, d.clone(), &opts)?)),
            None => None,
        };
        Ok(Session {
            pool: ThreadPool::new(crate::threads::resolve(opts.threads).threads),
            model,
            opts,
            state: conversation.state,
            cached: conversation.cached,
            checkpoints: conversation.checkpoints,
            cancel: CancelHandle::default(),
            draft,
            mtp: None,
            spare_checkpoint: None,
            measured: speculate::Measured::default(),
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The options as resolved at creation (the context length and sink filled in).
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    pub fn context_length(&self) -> usize {
        self.state.n_ctx()
    }

    /// Tokens currently held in the context.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Cancels this session's requests from any thread (see [`CancelHandle`]).
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Bytes held by the KV cache, recurrent state and checkpoints (the
    /// draft model's included).
    pub fn memory_bytes(&self) -> usize {
        let draft = self.draft.as_ref().map_or(0, |d| d.memory_bytes());
        let mtp = self.mtp.as_ref().map_or(0, |m| m.memory_bytes());
        let spare = self.spare_checkpoint.as_ref().map_or(0, Checkpoint::bytes);
        self.state.cache_bytes() + self.checkpoints.iter().map(|(_, c)| c.bytes()).sum::<usize>() + draft + mtp + spare
    }

    /// Forget the conversation.
    pub fn reset(&mut self) {
        self.state.clear();
        self.cached.clear();
        self.checkpoints.clear();
        if let Some(m) = self.mtp.as_mut() {
            m.reset();
        }
    }

    /// Complete raw text. The prompt is tokenised with the model's BOS (and
    /// special tokens parsed); a prompt that extends the previous one reuses
    /// its evaluated tokens. `on_piece` receives the answer's text only.
    pub fn generate(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        self.generate_events(prompt, opts, &mut text_only(on_piece))
    }

    /// [`generate`](Self::generate) reporting every event: answer text,
    /// thinking and tool calls as they happen.
    pub fn generate_events(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        let ticket = self.cancel.issue();
        self.generate_issued(&ticket, prompt, opts, on_event)
    }

    /// [`generate_events`](Self::generate_events) for a request issued at `ticket`.
    pub(crate) fn generate_issued(
        &mut self,
        ticket: &Ticket,
        prompt: &str,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        let start = Instant::now();
        opts.validate()?;
        if !opts.tools.is_empty() {
            return Err(Error::InvalidArgument("tools: a raw prompt has no template to render them; use chat".into()));
        }
        let think = self.think_format();
        check_reasoning(opts.reasoning, think.as_ref())?;
        let mut prompt = prompt.to_string();
        if let (Reasoning::Off, Some(f)) = (opts.reasoning, &think) {
            if f.open_at_end(&prompt) {
                prompt.push_str(f.close_text);
            }
        }
        let tokens = self.model.tokenizer().encode(&prompt, true, true)?;
        self.run(ticket, tokens, opts, on_event, start, Plan { think, tools: None, prompt })
    }

    /// [`generate_events`](Self::generate_events) for a prompt given as
    /// token ids, evaluated as they are (no BOS added; an id outside the
    /// vocabulary is refused).
    pub fn generate_tokens(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        let ticket = self.cancel.issue();
        let start = Instant::now();
        opts.validate()?;
        if !opts.tools.is_empty() {
            return Err(Error::InvalidArgument("tools: a raw prompt has no template to render them; use chat".into()));
        }
        let n_vocab = self.model.n_vocab();
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::InvalidArgument(format!("token id {bad} is outside the vocabulary of {n_vocab}")));
        }
        let think = self.think_format();
        check_reasoning(opts.reasoning, think.as_ref())?;
        let text = self.model.tokenizer().decode(prompt, true);
        self.run(&ticket, prompt.to_vec(), opts, on_event, start, Plan { think, tools: None, prompt: text })
    }

    /// Answer the conversation `messages` (rendered through the model's chat
    /// template with the generation prompt). Earlier turns already in the
    /// context are not evaluated again. `on_piece` receives the answer's text only.
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        self.chat_events(messages, opts, &mut text_only(on_piece))
    }

    /// [`chat`](Self::chat) reporting every event: answer text, thinking
    /// and tool calls as they happen.
    pub fn chat_events(
        &mut self,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        let ticket = self.cancel.issue();
        self.chat_issued(&ticket, messages, opts, on_event)
    }

    /// [`chat_events`](Self::chat_events) for a request issued at `ticket`.
    pub(crate) fn chat_issued(
        &mut self,
        ticket: &Ticket,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        let start = Instant::now();
        opts.validate()?;
        let (text, plan) = self.render_chat(messages, opts)?;
        // The template writes BOS itself where the model wants one.
        let tokens = self.model.tokenizer().encode(&text, false, true)?;
        self.run(ticket, tokens, opts, on_event, start, plan)
    }

    /// The prompt of `messages` under `opts` (tools, thinking), and how the
    /// answer is structured.
    pub fn render_chat(&self, messages: &[ChatMessage], opts: &GenerateOptions) -> Result<(String, Plan)> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument("no messages".into()));
        }
        for m in messages {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
                return Err(Error::InvalidArgument(format!("unknown chat role '{}'", m.role)));
            }
        }
        let template = self.model.chat_template()?;
        let think = ThinkFormat::detect(self.model.tokenizer(), template.source());
        check_reasoning(opts.reasoning, think.as_ref())?;
        let mut extra: Vec<(String, serde_json::Value)> = Vec::new();
        match opts.reasoning {
            Reasoning::Default => {}
            Reasoning::Off => extra.push(("enable_thinking".into(), false.into())),
            Reasoning::On | Reasoning::Budget(_) => extra.push(("enable_thinking".into(), true.into())),
        }
        let format = ToolFormat::detect(template.source());
        let tool_turns = messages.iter().any(|m| m.role == "tool" || !m.tool_calls.is_empty());
        let generic = format == ToolFormat::GenericJson && (tool_turns || !opts.tools.is_empty());
        let mut owned;
        let mut msgs = messages;
        if generic {
            // The template knows nothing of tools: calls and results as
            // plain turns, the tools described in the system turn.
            owned = crate::structured::generic_messages(messages);
            if !opts.tools.is_empty() {
                let about = ToolFormat::generic_instructions(&opts.tools)?;
                match owned.first_mut() {
                    Some(m) if m.role == "system" => m.content = format!("{}\n\n{about}", m.content),
                    _ => owned.insert(0, ChatMessage::new("system", about)),
                }
            }
            msgs = &owned;
        } else if !opts.tools.is_empty() {
            extra.push(("tools".into(), ToolFormat::template_tools(&opts.tools)?));
        }
        let mut text = match template.render(msgs, true, &extra) {
            // A template without a system role (Gemma 2): the tools go in the first user turn.
            Err(Error::TemplateRaised(_)) if format == ToolFormat::GenericJson && !opts.tools.is_empty() => {
                let about = ToolFormat::generic_instructions(&opts.tools)?;
                let mut folded = crate::structured::generic_messages(messages);
                let first_user = folded.iter_mut().find(|m| m.role == "user");
                match first_user {
                    Some(m) => m.content = format!("{about}\n{}", m.content),
                    None => return Err(Error::InvalidArgument("tools: no user message to describe them in".into())),
                }
                template.render(&folded, true, &extra)?
            }
            r => r?,
        };
        if let (Reasoning::Off, Some(f)) = (opts.reasoning, &think) {
            // A template without `enable_thinking`: close the thought it
            // opened, or prefill an empty one after its generation prompt.
            if f.open_at_end(&text) {
                text.push_str(f.close_text);
            } else if !text.trim_end().ends_with(f.close) {
                text.push_str(f.empty);
            }
        }
        let tools = (!opts.tools.is_empty()).then(|| (format, opts.tools.clone(), opts.tool_choice.clone()));
        Ok((text.clone(), Plan { think, tools, prompt: text }))
    }

    /// The model's thinking format, if its template has one.
    fn think_format(&self) -> Option<ThinkFormat> {
        let template = self.model.chat_template().ok()?;
        ThinkFormat::detect(self.model.tokenizer(), template.source())
    }

    /// Evaluate `prompt` (reusing the cache) and sample up to `max_tokens`.
    fn run(
        &mut self,
        ticket: &Ticket,
        prompt: Vec<u32>,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
        start: Instant,
        plan: Plan,
    ) -> Result<GenerationStats> {
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        // The prompt itself must fit (a sliding window only drops older turns
        // and generated text).
        let n_ctx = self.state.n_ctx();
        if prompt.len() >= n_ctx {
            return Err(Error::ContextFull { n_ctx });
        }
        let model = self.model.clone();
        let tok = model.tokenizer();
        let mut drafter = opts.speculation.drafter(&model, self.draft.is_some())?;
        if let Some(d) = drafter.as_mut() {
            d.resume(&self.measured);
        }
        self.follow_with_mtp(matches!(opts.speculation, Speculation::Mtp { .. }), &prompt)?;
        // The structure of the answer is compiled on a worker thread while
        // the prompt is evaluated (the vocabulary's engine, built on a
        // model's first constrained request, takes a second on a 262k vocabulary).
        let constraint = opts.constraint()?;
        let tools = plan.tools.filter(|(_, _, choice)| *choice != ToolChoice::Off);
        let structured = constraint.is_some() || tools.is_some();
        let (think, prompt_text) = (plan.think, plan.prompt);
        let build_turn = || -> Result<Turn> {
            let grammars = if structured { Some(model.grammars()?) } else { None };
            let answer = match (&constraint, &grammars) {
                (Some(c), Some(g)) => Some(c.compile(g)?),
                _ => None,
            };
            Turn::new(tok, grammars, think, opts.reasoning, &prompt_text, answer, tools, opts.show_special)
        };
        let mut sampler =
            Sampler::new(SamplerConfig { seed: opts.seed.unwrap_or(self.opts.seed), ..opts.sampler.clone() });
        for &t in &prompt {
            sampler.accept(t);
        }
        let mut stats = GenerationStats::empty(prompt.len());
        let io_start = self.state.expert_io();
        let (turn, prefilled) = if structured {
            std::thread::scope(|s| {
                let worker = s.spawn(build_turn);
                let prefilled = self.prefill(ticket, &prompt, &mut stats);
                let turn = worker
                    .join()
                    .unwrap_or_else(|_| Err(Error::InvalidArgument("constraint: the compiler failed".into())));
                (turn, prefilled)
            })
        } else {
            let prefilled = self.prefill(ticket, &prompt, &mut stats);
            (build_turn(), prefilled)
        };
        let cancelled = prefilled?;
        let mut turn = turn?;
        if let (Some(draft), Some(_), Speculation::DraftModel { .. }, false) =
            (self.draft.as_mut(), &drafter, opts.speculation, cancelled)
        {
            // The draft model evaluates the prompt as the model just did.
            draft.prefill(ticket, &prompt)?;
        }
        if cancelled {
            stats.stop_reason = StopReason::Cancelled;
            stats.set_expert_io(self.state.expert_io() - io_start);
            return Ok(stats);
        }

        // ---- decode ----
        let mut out = Output::new(tok, opts, turn.think_header());
        let mut decode_start = Instant::now();
        let mut pending: Vec<u32> = Vec::new();
        let mut mask = turn.mask()?;
        let mut masked: Vec<f32> = Vec::new();
        let call_base = prompt.len();
        // The verify pass whose rows are being sampled (speculation).
        let mut verify: Option<Verify> = None;
        // `pending` begins with `replay` tokens a rollback replays (recurrent
        // models): evaluated as the verify pass did, row by row. The tokens
        // after them are those decoding evaluates in one pass: the sampled
        // token, or it and the tokens forced after it (a grammar's
        // fast-forward), a batch that only a pass of its own computes as
        // decoding does, so it is not verified beside drafts.
        //
        // A verify pass takes its checkpoint before its replayed tokens: if it
        // rejects a draft too, the next replay holds them again with the newly
        // accepted ones. So once `MAX_REPLAY` tokens wait, they are evaluated
        // in a pass without drafts (which commits them) rather than replayed
        // before more drafts: else a run of rejecting passes would replay ever
        // more tokens in every pass.
        let mut replay = 0;
        loop {
            let drafts = match drafter.as_mut() {
                Some(d) if !pending.is_empty() && pending.len() <= replay + 1 && replay < MAX_REPLAY => {
                    // Room in the context (no slide inside a verify pass) and in the token budget.
                    let room = n_ctx.saturating_sub(self.state.n_past() + pending.len());
                    let left = opts.max_tokens.saturating_sub(stats.generated_tokens + 1);
                    let mut history = Vec::with_capacity(self.cached.len() + pending.len());
                    history.extend_from_slice(&self.cached);
                    history.extend_from_slice(&pending);
                    let mtp = self.mtp.as_deref_mut().map(|m| (m, &*model, &self.pool));
                    let mut drafts = d.propose(&history, room.min(left), self.draft.as_deref_mut(), mtp)?;
                    // Drafts the constraint refuses would be rejected: they are not verified.
                    let allowed = turn.allowed_prefix(&drafts)?;
                    drafts.truncate(allowed);
                    drafts
                }
                _ => Vec::new(),
            };
            if !drafts.is_empty() {
                // Evaluate the pending tokens and the drafts in one pass, a logits row for each.
                let base = self.cached.len();
                let pass_start = Instant::now();
                let checkpoint = match (self.state.is_recurrent(), self.spare_checkpoint.take()) {
                    (false, _) => None,
                    (true, Some(mut cp)) => {
                        self.state.checkpoint_into(&mut cp)?;
                        Some(cp)
                    }
                    (true, None) => Some(self.state.checkpoint()?),
                };
                let first_row = pending.len() - 1;
                let mut batch = std::mem::take(&mut pending);
                batch.extend_from_slice(&drafts);
                // Rows computed as decoding computes them: the tokens are those without speculation.
                // The first row's mask is computed while the pass runs; each next
                // row's after the token before it is accepted (below).
                let (evaluated, first_mask) = self.eval_beside(&mut turn, &batch, Logits::All, true);
                evaluated?;
                mask = first_mask?;
                if let (Some(d), 0) = (drafter.as_mut(), replay) {
                    d.timed_verify(drafts.len(), pass_start.elapsed().as_secs_f64());
                }
                replay = 0;
                stats.drafted_tokens += drafts.len();
                verify = Some(Verify { drafts, accepted: 0, first_row, base, checkpoint });
            } else if !pending.is_empty() {
                // The next mask is computed while the forward pass runs.
                let pass_start = Instant::now();
                let (evaluated, next_mask) = self.eval_pending(Some(&mut turn), &pending, replay, Logits::Last);
                evaluated?;
                if let (Some(d), 1, 0) = (drafter.as_mut(), pending.len(), replay) {
                    // A decode step's pass: what a verified row's cost is measured against.
                    d.timed_decode(pass_start.elapsed().as_secs_f64());
                }
                mask = next_mask?;
                pending.clear();
                replay = 0;
            }
            for closed in turn.take_closed() {
                let event = match closed {
                    Closed::Call(c) => {
                        let call = ToolCall {
                            id: format!("call_{call_base}_{}", stats.tool_calls.len()),
                            name: c.name,
                            arguments_json: c.arguments.to_string(),
                        };
                        stats.tool_calls.push(call.clone());
                        GenerationEvent::ToolCall(call)
                    }
                    Closed::Text(t) => {
                        stats.text.push_str(&t);
                        GenerationEvent::Text(t)
                    }
                };
                if !out.emit(ticket, &mut stats, on_event, event) {
                    break;
                }
            }
            if out.stopped.is_some() {
                break;
            }
            if matches!(mask, Mask::Complete) {
                out.stopped = Some(StopReason::EndOfText);
                break;
            }
            if stats.generated_tokens >= opts.max_tokens {
                out.stopped = Some(StopReason::MaxTokens);
                break;
            }
            if ticket.cancelled() {
                out.stopped = Some(StopReason::Cancelled);
                break;
            }
            let logits = match &verify {
                Some(v) => {
                    let n_vocab = self.state.logits().len() / self.state.logit_rows().max(1);
                    let row = v.first_row + v.accepted;
                    &self.state.logits()[row * n_vocab..(row + 1) * n_vocab]
                }
                None => self.state.logits(),
            };
            let mut next = sample_under(&mut sampler, logits, &mask, &mut masked);
            if turn.opens_json_call(next, tok)? {
                mask = turn.mask()?;
                next = sample_under(&mut sampler, logits, &mask, &mut masked);
            }
            if stats.generated_tokens == 0 {
                stats.time_to_first_token_ms = start.elapsed().as_secs_f64() * 1e3;
                decode_start = Instant::now();
            }
            if tok.is_end_of_generation(next) {
                if let Some(step) = turn.close_thought_instead_of_ending(tok)? {
                    // The thought closes in place of the end token; the answer
                    // follows (forced tokens replace the drafts after this row).
                    if let Some(v) = verify.take() {
                        replay += self.settle(v, &mut pending, &mut drafter)?;
                    }
                    for &f in &step.forced {
                        stats.generated_tokens += 1;
                        stats.tokens.push(f);
                        sampler.accept(f);
                        pending.push(f);
                    }
                    out.route(ticket, &mut stats, on_event, &step.segments);
                    continue;
                }
            }
            // Speculation: the sampled token keeps the next draft, or ends the verification.
            let mut evaluated = false;
            if let Some(v) = verify.as_mut() {
                if v.accepted < v.drafts.len() && next == v.drafts[v.accepted] {
                    v.accepted += 1;
                    stats.accepted_tokens += 1;
                    evaluated = true;
                } else if let Some(v) = verify.take() {
                    replay += self.settle(v, &mut pending, &mut drafter)?;
                }
            }
            stats.generated_tokens += 1;
            stats.tokens.push(next);
            sampler.accept(next);
            if tok.is_end_of_generation(next) && !opts.ignore_eos {
                out.stopped = Some(StopReason::EndOfText);
                // Evaluated lazily: the next request's prompt usually contains it.
                break;
            }
            let step = turn.accept(next, tok)?;
            if !evaluated {
                pending.push(next);
            }
            if !step.forced.is_empty() {
                // Forced tokens replace the drafts after this one.
                if let Some(mut v) = verify.take() {
                    if evaluated {
                        // Decoding evaluates this token in one pass with the
                        // tokens forced after it: its verified row is dropped
                        // and it is evaluated with them, as decoding would.
                        v.accepted -= 1;
                        replay += self.settle(v, &mut pending, &mut drafter)?;
                        pending.push(next);
                    } else {
                        replay += self.settle(v, &mut pending, &mut drafter)?;
                    }
                }
            }
            for &f in &step.forced {
                stats.generated_tokens += 1;
                stats.tokens.push(f);
                sampler.accept(f);
                pending.push(f);
            }
            out.route(ticket, &mut stats, on_event, &step.segments);
            if out.stopped.is_some() {
                break;
            }
            if verify.is_some() {
                // The next verified row's mask, after the token before it.
                mask = turn.mask()?;
            }
        }
        let mut reason = out.stopped.unwrap_or(StopReason::MaxTokens);
        if reason == StopReason::EndOfText && turn.n_calls() > 0 {
            reason = StopReason::ToolCalls;
        }
        stats.stop_reason = reason;
        // Text held back (a partial stop string or partial UTF-8) is released when no stop matched.
        if !matches!(reason, StopReason::StopString | StopReason::ListenerStopped | StopReason::Cancelled) {
            let rest = turn.finish();
            out.route(ticket, &mut stats, on_event, &rest.segments);
            out.flush(&mut stats, on_event);
        }
        if let Some(v) = verify.take() {
            replay += self.settle(v, &mut pending, &mut drafter)?;
        }
        if !pending.is_empty() {
            // Keep the cache equal to the conversation so far.
            self.eval_pending(None, &pending, replay, Logits::Last).0?;
        }
        self.save_checkpoint()?;
        if let Some(d) = &drafter {
            d.record(&mut self.measured);
        }
        let decode_secs = decode_start.elapsed().as_secs_f64();
        if stats.generated_tokens > 1 && decode_secs > 0.0 {
            stats.decode_tokens_per_second = (stats.generated_tokens - 1) as f64 / decode_secs;
        }
        stats.set_expert_io(self.state.expert_io() - io_start);
        Ok(stats)
    }

    /// Evaluate what the cache does not already hold of `prompt`, to its
    /// last token's logits; true when cancelled on the way.
    fn prefill(&mut self, ticket: &Ticket, prompt: &[u32], stats: &mut GenerationStats) -> Result<bool> {
        let reuse = self.rewind_to_prefix(prompt)?;
        let prefill_start = Instant::now();
        if reuse == prompt.len() {
            // Everything is cached but the logits of the last token: evaluate it again.
            self.rewind_one(prompt)?;
        }
        let todo: Vec<u32> = prompt[self.cached.len()..].to_vec();
        for (i, chunk) in todo.chunks(PREFILL_BATCH).enumerate() {
            if ticket.cancelled() {
                return Ok(true);
            }
            let last = (i + 1) * PREFILL_BATCH >= todo.len();
            self.eval(chunk, if last { Logits::Last } else { Logits::None })?;
            stats.prompt_tokens_evaluated += chunk.len();
        }
        self.save_checkpoint()?;
        let prefill_secs = prefill_start.elapsed().as_secs_f64();
        if stats.prompt_tokens_evaluated > 0 && prefill_secs > 0.0 {
            stats.prefill_tokens_per_second = stats.prompt_tokens_evaluated as f64 / prefill_secs;
        }
        Ok(false)
    }

    /// End a verification: drop the drafts after the accepted ones from the
    /// state (truncate the KV cache; a recurrent model restores the
    /// checkpoint taken before the pass and puts the accepted tokens in front
    /// of `pending`, replayed by the next pass) and adapt the draft length.
    /// Returns how many tokens were put in front of `pending`.
    fn settle(&mut self, mut v: Verify, pending: &mut Vec<u32>, drafter: &mut Option<Drafter>) -> Result<usize> {
        if let Some(d) = drafter {
            d.update(v.drafts.len(), v.accepted);
        }
        let keep = v.base + v.first_row + 1 + v.accepted;
        let checkpoint = v.checkpoint.take();
        let replayed = self.roll_back(&v, keep, checkpoint.as_ref(), pending);
        // The checkpoint's memory serves the next verify pass.
        self.spare_checkpoint = checkpoint;
        replayed
    }

    /// [`settle`](Self::settle)'s rollback to `keep` tokens.
    fn roll_back(&mut self, v: &Verify, keep: usize, cp: Option<&Checkpoint>, pending: &mut Vec<u32>) -> Result<usize> {
        if keep >= self.cached.len() {
            return Ok(0);
        }
        if let Some(m) = self.mtp.as_mut() {
            m.truncate(keep);
        }
        match cp {
            None => {
                self.state.truncate(keep)?;
                self.cached.truncate(keep);
            }
            Some(cp) => {
                self.state.restore(cp)?;
                let replay = self.cached[v.base..keep].to_vec();
                self.cached.truncate(v.base);
                let n = replay.len();
                pending.splice(0..0, replay);
                return Ok(n);
            }
        }
        Ok(0)
    }

    /// Evaluate `pending` as decoding without speculation would have: its
    /// first `replay` tokens row by row (as the verify pass that rolled them
    /// back did), the rest in one pass; the turn's next mask beside it.
    fn eval_pending(
        &mut self,
        turn: Option<&mut Turn>,
        pending: &[u32],
        replay: usize,
        want: Logits,
    ) -> (Result<()>, Result<Mask>) {
        let (rows, batch) =
            if replay > 0 && pending.len() > replay + 1 { pending.split_at(replay) } else { (&[][..], pending) };
        if !rows.is_empty() {
            if let Err(e) = self.eval_rows(rows, Logits::None, true) {
                return (Err(e), Ok(Mask::Free));
            }
        }
        let one_row = rows.is_empty() && replay > 0;
        match turn {
            Some(turn) => self.eval_beside(turn, batch, want, one_row),
            None => (self.eval_rows(batch, want, one_row), Ok(Mask::Free)),
        }
    }

    /// [`eval_rows`](Self::eval_rows) with the turn's next mask computed on
    /// a worker thread meanwhile (where the turn has masks to compute).
    fn eval_beside(
        &mut self,
        turn: &mut Turn,
        tokens: &[u32],
        want: Logits,
        one_row: bool,
    ) -> (Result<()>, Result<Mask>) {
        if !turn.is_structured() {
            return (self.eval_rows(tokens, want, one_row), turn.mask());
        }
        std::thread::scope(|s| {
            let worker = s.spawn(move || turn.mask());
            let evaluated = self.eval_rows(tokens, want, one_row);
            let m =
                worker.join().unwrap_or_else(|_| Err(Error::InvalidArgument("constraint: mask worker failed".into())));
            (evaluated, m)
        })
    }

    /// [`eval`](Self::eval), with `one_row`: every token computed as a pass
    /// of one token computes it (the pool's one-row mode), bit for bit.
    fn eval_rows(&mut self, tokens: &[u32], want: Logits, one_row: bool) -> Result<()> {
        self.pool.set_one_row(one_row);
        let evaluated = self.eval(tokens, want);
        self.pool.set_one_row(false);
        evaluated
    }

    /// Evaluate tokens after the cache, sliding the window if it is full.
    fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<()> {
        if self.state.n_past() + tokens.len() > self.state.n_ctx() {
            match self.opts.context_policy {
                ContextPolicy::Error => return Err(Error::ContextFull { n_ctx: self.state.n_ctx() }),
                ContextPolicy::Slide { sink } => self.slide(sink.unwrap_or(0), tokens.len())?,
            }
        }
        let pos0 = self.state.n_past();
        self.model.forward(&self.pool, &mut self.state, tokens, want)?;
        if let Some(m) = self.mtp.as_mut() {
            m.process(&self.model, &self.pool, pos0, tokens, self.state.hidden())?;
        }
        self.cached.extend_from_slice(tokens);
        Ok(())
    }

    /// Before a request: with `on`, the multi-token-prediction layer follows
    /// every pass (made on first use; when it is out of step with the
    /// cached tokens, or the prompt would rewind them, the session starts
    /// from an empty state, as the layer cannot catch up on tokens evaluated
    /// without it). Without, the state keeps no hidden rows and the layer
    /// forgets what it held.
    fn follow_with_mtp(&mut self, on: bool, prompt: &[u32]) -> Result<()> {
        self.state.keep_hidden(on);
        if !on {
            if let Some(m) = self.mtp.as_mut() {
                m.reset();
            }
            return Ok(());
        }
        if self.mtp.is_none() {
            self.mtp = Some(Box::new(MtpDraft::new(&self.model, self.state.n_ctx(), self.opts.kv_type)?));
        }
        let extends = prompt.len() > self.cached.len() && prompt.starts_with(&self.cached);
        if !(extends && self.mtp.as_ref().is_some_and(|m| m.in_step(&self.cached))) {
            self.reset();
        }
        Ok(())
    }

    /// Make room for `incoming` tokens: keep the first `sink` and the most
    /// recent tokens (half the context), re-evaluated from scratch.
    fn slide(&mut self, sink: usize, incoming: usize) -> Result<()> {
        let n_ctx = self.state.n_ctx();
        let keep_recent = (n_ctx / 2).saturating_sub(sink).min(n_ctx.saturating_sub(sink + incoming));
        let sink = sink.min(self.cached.len());
        let mut kept: Vec<u32> = self.cached[..sink].to_vec();
        let tail_start = self.cached.len().saturating_sub(keep_recent).max(sink);
        kept.extend_from_slice(&self.cached[tail_start..]);
        log::debug!("context full: keeping {} of {} tokens", kept.len(), self.cached.len());
        self.reset();
        for chunk in kept.chunks(PREFILL_BATCH) {
            self.model.forward(&self.pool, &mut self.state, chunk, Logits::Last)?;
            self.cached.extend_from_slice(chunk);
        }
        Ok(())
    }

    /// Rewind the state to the longest usable prefix of `prompt`; returns its length.
    fn rewind_to_prefix(&mut self, prompt: &[u32]) -> Result<usize> {
        let common = self.cached.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if common == self.cached.len() {
            return Ok(common);
        }
        if !self.state.is_recurrent() {
            self.state.truncate(common)?;
            self.cached.truncate(common);
            return Ok(common);
        }
        // Recurrent: the latest checkpoint inside the common prefix.
        let best = self
            .checkpoints
            .iter()
            .filter(|(toks, cp)| cp.n_past() <= common && prompt.starts_with(toks))
            .max_by_key(|(_, cp)| cp.n_past())
            .map(|(toks, cp)| (toks.clone(), cp.clone()));
        match best {
            Some((toks, cp)) if self.state.restore(&cp).is_ok() => {
                self.cached = toks;
                Ok(self.cached.len())
            }
            _ => {
                self.reset();
                Ok(0)
            }
        }
    }

    /// The prompt is fully cached but its last logits are gone: drop and
    /// re-evaluate its last token.
    fn rewind_one(&mut self, prompt: &[u32]) -> Result<()> {
        let keep = prompt.len() - 1;
        if !self.state.is_recurrent() {
            self.state.truncate(keep)?;
            self.cached.truncate(keep);
            return Ok(());
        }
        let best = self
            .checkpoints
            .iter()
            .filter(|(toks, cp)| cp.n_past() <= keep && prompt.starts_with(toks))
            .max_by_key(|(_, cp)| cp.n_past())
            .map(|(toks, cp)| (toks.clone(), cp.clone()));
        match best {
            Some((toks, cp)) if self.state.restore(&cp).is_ok() => self.cached = toks,
            _ => self.reset(),
        }
        Ok(())
    }

    /// Recurrent models: remember the current position (which reads a
    /// recurrent state the GPU holds back; only that can fail).
    fn save_checkpoint(&mut self) -> Result<()> {
        if !self.state.is_recurrent() || self.cached.is_empty() {
            return Ok(());
        }
        if self.checkpoints.iter().any(|(t, _)| *t == self.cached) {
            return Ok(());
        }
        if self.checkpoints.len() == MAX_CHECKPOINTS {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push((self.cached.clone(), self.state.checkpoint()?));
        Ok(())
    }
}

/// A verify pass being sampled: the drafts, how many were accepted so far,
/// the logits row of the first draft's position minus one, and where to roll back to.
struct Verify {
    drafts: Vec<u32>,
    accepted: usize,
    /// The row of the last token before the drafts.
    first_row: usize,
    /// Tokens in the cache before the pass.
    base: usize,
    /// Recurrent models: the state before the pass.
    checkpoint: Option<Checkpoint>,
}

/// Read the snapshot at `path` for a session of `model` with resolved `opts`.
fn read_file(path: &Path, model: &Model, opts: &SessionOptions) -> Result<snapshot::Conversation> {
    let read = || {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut r = BufReader::with_capacity(1 << 16, file);
        snapshot::read(&mut r, len, model, opts.context_length, opts.kv_type, MAX_CHECKPOINTS)
    };
    read().map_err(|e| at_path(path, e))
}

/// `e` with the snapshot's path in its message (an I/O error keeps its kind).
fn at_path(path: &Path, e: Error) -> Error {
    match e {
        Error::Io(io) => Error::Io(std::io::Error::new(io.kind(), format!("{}: {io}", path.display()))),
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", path.display())),
        other => other,
    }
}
