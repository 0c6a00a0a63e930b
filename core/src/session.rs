//! Sessions: a model's conversation state, the generate loop, streaming,
//! cancellation, stop conditions and statistics.
//!
//! A session caches the tokens it has evaluated. Each request (a raw prompt
//! or chat messages rendered through the template) is tokenised and compared
//! with that cache: only the tokens after the common prefix are evaluated, so
//! a chat turn costs its new tokens, not the whole history. Recurrent models
//! (qwen35moe) cannot drop tokens, so the session keeps state checkpoints at
//! the end of each prompt and of each answer and rewinds to the best one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::chat::ChatMessage;
use crate::error::{Error, Result};
use crate::model::{Checkpoint, KvType, Logits, Model, State};
use crate::sampler::{Sampler, SamplerConfig};
use crate::threads::ThreadPool;

/// What the session does when the context is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextPolicy {
    /// Stop with [`Error::ContextFull`].
    #[default]
    Error,
    /// Keep the first `sink` tokens and the most recent half of the context,
    /// drop the rest, and go on (the kept tokens are re-evaluated).
    Slide { sink: usize },
}

/// Settings fixed for the life of a session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionOptions {
    /// Context length in tokens; 0 = the model's training context, at most 4096.
    pub context_length: usize,
    pub kv_type: KvType,
    /// Worker threads; 0 = every core.
    pub threads: usize,
    pub context_policy: ContextPolicy,
    /// Seed of the sampler when a request does not set one.
    pub seed: u64,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            context_length: 0,
            kv_type: KvType::F16,
            threads: 0,
            context_policy: ContextPolicy::Error,
            seed: 0x5EED,
        }
    }
}

/// Settings of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Generation stops before any of these strings; they are never emitted.
    pub stop: Vec<String>,
    /// Overrides the session seed for this request.
    pub seed: Option<u64>,
    /// Stream control tokens' text too.
    pub show_special: bool,
    /// Keep generating past end-of-generation tokens (benchmarks, tests).
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            seed: None,
            show_special: false,
            ignore_eos: false,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfText,
    MaxTokens,
    StopString,
    /// The listener returned false.
    ListenerStopped,
    Cancelled,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndOfText => "end_of_text",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopString => "stop_string",
            StopReason::ListenerStopped => "listener_stopped",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// Figures of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationStats {
    /// Tokens of the prompt (the whole rendered conversation for chat).
    pub prompt_tokens: usize,
    /// Prompt tokens actually evaluated (the rest came from the cache).
    pub prompt_tokens_evaluated: usize,
    pub generated_tokens: usize,
    pub time_to_first_token_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub stop_reason: StopReason,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// The text streamed to the listener.
    pub text: String,
}

/// Cancels the generation of a session from any thread.
#[derive(Clone, Debug)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Stop the running generation after the current token (a request that
    /// starts later is not affected).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

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
    cancel: Arc<AtomicBool>,
}

impl Session {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session> {
        let n_ctx = match opts.context_length {
            0 => model.summary().context_length.map_or(4096, |c| (c as usize).min(4096)),
            n => n,
        };
        if let ContextPolicy::Slide { sink } = opts.context_policy {
            if sink >= n_ctx / 2 {
                return Err(Error::InvalidArgument(format!("{sink} sink tokens do not fit a context of {n_ctx}")));
            }
        }
        let threads =
            if opts.threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { opts.threads };
        let state = model.new_state(n_ctx, opts.kv_type)?;
        Ok(Session {
            pool: ThreadPool::new(threads),
            model,
            opts,
            state,
            cached: Vec::new(),
            checkpoints: Vec::new(),
            cancel: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

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

    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(self.cancel.clone())
    }

    /// Bytes held by the KV cache, recurrent state and checkpoints.
    pub fn memory_bytes(&self) -> usize {
        self.state.cache_bytes() + self.checkpoints.iter().map(|(_, c)| c.bytes()).sum::<usize>()
    }

    /// Forget the conversation.
    pub fn reset(&mut self) {
        self.state.clear();
        self.cached.clear();
        self.checkpoints.clear();
    }

    /// Complete raw text. The prompt is tokenised with the model's BOS (and
    /// special tokens parsed); a prompt that extends the previous one reuses
    /// its evaluated tokens.
    pub fn generate(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        let start = Instant::now();
        let tokens = self.model.tokenizer().encode(prompt, true, true)?;
        self.run(tokens, opts, on_piece, start)
    }

    /// Answer the conversation `messages` (rendered through the model's chat
    /// template with the generation prompt). Earlier turns already in the
    /// context are not evaluated again.
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        let start = Instant::now();
        if messages.is_empty() {
            return Err(Error::InvalidArgument("no messages".into()));
        }
        for m in messages {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
                return Err(Error::InvalidArgument(format!("unknown chat role '{}'", m.role)));
            }
        }
        let text = self.model.chat_template()?.render(messages, true, &[])?;
        // The template writes BOS itself where the model wants one.
        let tokens = self.model.tokenizer().encode(&text, false, true)?;
        self.run(tokens, opts, on_piece, start)
    }

    /// Evaluate `prompt` (reusing the cache) and sample up to `max_tokens`.
    fn run(
        &mut self,
        prompt: Vec<u32>,
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
        start: Instant,
    ) -> Result<GenerationStats> {
        self.cancel.store(false, Ordering::SeqCst);
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        // The prompt itself must fit (a sliding window only drops older turns
        // and generated text).
        let n_ctx = self.state.n_ctx();
        if prompt.len() >= n_ctx {
            return Err(Error::ContextFull { n_ctx });
        }
        let mut sampler =
            Sampler::new(SamplerConfig { seed: opts.seed.unwrap_or(self.opts.seed), ..opts.sampler.clone() });

        // ---- prefill: only what the cache does not already hold ----
        let reuse = self.rewind_to_prefix(&prompt)?;
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            prompt_tokens_evaluated: 0,
            generated_tokens: 0,
            time_to_first_token_ms: 0.0,
            prefill_tokens_per_second: 0.0,
            decode_tokens_per_second: 0.0,
            stop_reason: StopReason::MaxTokens,
            tokens: Vec::new(),
            text: String::new(),
        };
        for &t in &prompt {
            sampler.accept(t);
        }
        let prefill_start = Instant::now();
        let todo = &prompt[reuse..];
        if todo.is_empty() {
            // Everything is cached but the logits of the last token: evaluate it again.
            self.rewind_one(&prompt)?;
        }
        let todo: Vec<u32> = prompt[self.cached.len()..].to_vec();
        for (i, chunk) in todo.chunks(PREFILL_BATCH).enumerate() {
            if self.cancel.load(Ordering::SeqCst) {
                stats.stop_reason = StopReason::Cancelled;
                return Ok(stats);
            }
            let last = (i + 1) * PREFILL_BATCH >= todo.len();
            self.eval(chunk, if last { Logits::Last } else { Logits::None })?;
            stats.prompt_tokens_evaluated += chunk.len();
        }
        self.save_checkpoint();
        let prefill_secs = prefill_start.elapsed().as_secs_f64();
        if stats.prompt_tokens_evaluated > 0 && prefill_secs > 0.0 {
            stats.prefill_tokens_per_second = stats.prompt_tokens_evaluated as f64 / prefill_secs;
        }

        // ---- decode ----
        let model = self.model.clone();
        let tok = model.tokenizer();
        let mut decoder = tok.stream_decoder(opts.show_special);
        let mut stops = StopMatcher::new(&opts.stop);
        let mut decode_start = Instant::now();
        let mut pending: Option<u32> = None;
        loop {
            if stats.generated_tokens >= opts.max_tokens {
                stats.stop_reason = StopReason::MaxTokens;
                break;
            }
            if self.cancel.load(Ordering::SeqCst) {
                stats.stop_reason = StopReason::Cancelled;
                break;
            }
            if let Some(t) = pending.take() {
                self.eval_generated(t)?;
            }
            let next = sampler.sample(self.state.logits());
            if stats.generated_tokens == 0 {
                stats.time_to_first_token_ms = start.elapsed().as_secs_f64() * 1e3;
                decode_start = Instant::now();
            }
            stats.generated_tokens += 1;
            stats.tokens.push(next);
            sampler.accept(next);
            if tok.is_end_of_generation(next) && !opts.ignore_eos {
                stats.stop_reason = StopReason::EndOfText;
                // Evaluated lazily: the next request's prompt usually contains it.
                break;
            }
            pending = Some(next);
            let piece = decoder.push(next);
            let (emit, hit) = stops.push(&piece);
            if !emit.is_empty() {
                stats.text.push_str(&emit);
                if !on_piece(&emit) {
                    // A listener that stops because the caller cancelled reports the cancel.
                    stats.stop_reason = if self.cancel.load(Ordering::SeqCst) {
                        StopReason::Cancelled
                    } else {
                        StopReason::ListenerStopped
                    };
                    break;
                }
            }
            if hit {
                stats.stop_reason = StopReason::StopString;
                break;
            }
        }
        // Text held back (a partial stop string or partial UTF-8) is released when no stop matched.
        if !matches!(stats.stop_reason, StopReason::StopString | StopReason::ListenerStopped) {
            let mut rest = stops.finish();
            rest.push_str(&decoder.flush());
            if !rest.is_empty() {
                stats.text.push_str(&rest);
                on_piece(&rest);
            }
        }
        if let Some(t) = pending {
            // Keep the cache equal to the conversation so far.
            self.eval_generated(t)?;
        }
        self.save_checkpoint();
        let decode_secs = decode_start.elapsed().as_secs_f64();
        if stats.generated_tokens > 1 && decode_secs > 0.0 {
            stats.decode_tokens_per_second = (stats.generated_tokens - 1) as f64 / decode_secs;
        }
        Ok(stats)
    }

    /// Evaluate tokens after the cache, sliding the window if it is full.
    fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<()> {
        if self.state.n_past() + tokens.len() > self.state.n_ctx() {
            match self.opts.context_policy {
                ContextPolicy::Error => return Err(Error::ContextFull { n_ctx: self.state.n_ctx() }),
                ContextPolicy::Slide { sink } => self.slide(sink, tokens.len())?,
            }
        }
        self.model.forward(&self.pool, &mut self.state, tokens, want)?;
        self.cached.extend_from_slice(tokens);
        Ok(())
    }

    /// Evaluate one generated token.
    fn eval_generated(&mut self, t: u32) -> Result<()> {
        self.eval(&[t], Logits::Last)
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

    /// Recurrent models: remember the current position.
    fn save_checkpoint(&mut self) {
        if !self.state.is_recurrent() || self.cached.is_empty() {
            return;
        }
        if self.checkpoints.iter().any(|(t, _)| *t == self.cached) {
            return;
        }
        if self.checkpoints.len() == MAX_CHECKPOINTS {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push((self.cached.clone(), self.state.checkpoint()));
    }
}

/// Finds stop strings across token boundaries: text that might be the start
/// of a stop string is held back until it is known not to be.
struct StopMatcher<'a> {
    stops: &'a [String],
    held: String,
    done: bool,
}

impl<'a> StopMatcher<'a> {
    fn new(stops: &'a [String]) -> Self {
        StopMatcher { stops, held: String::new(), done: false }
    }

    /// Add generated text; returns the text that is safe to emit and whether a stop string was hit.
    fn push(&mut self, piece: &str) -> (String, bool) {
        if self.done {
            return (String::new(), true);
        }
        self.held.push_str(piece);
        let active = self.stops.iter().filter(|s| !s.is_empty());
        // A complete stop string: emit what precedes the earliest one.
        if let Some(at) = active.clone().filter_map(|s| self.held.find(s.as_str())).min() {
            let emit = self.held[..at].to_string();
            self.held.clear();
            self.done = true;
            return (emit, true);
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut hold = 0;
        for s in active {
            for (i, _) in self.held.char_indices() {
                let suffix = &self.held[i..];
                if suffix.len() > hold && s.starts_with(suffix) {
                    hold = suffix.len();
                    break;
                }
            }
        }
        let cut = self.held.len() - hold;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        (emit, false)
    }

    /// What is still held when generation ends without a stop.
    fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (e, hit) = m.push(p);
            out.push_str(&e);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_split_across_pieces_are_never_emitted() {
        assert_eq!(run(&["</end>"], &["Hello </", "en", "d> more"]), ("Hello ".into(), true));
        assert_eq!(run(&["STOP"], &["aST", "OPb"]), ("a".into(), true));
        // A false start is released.
        assert_eq!(run(&["STOP"], &["aST", "x"]), ("aSTx".into(), false));
        // Held text at the end without a stop is released.
        assert_eq!(run(&["STOP"], &["abc", "ST"]), ("abcST".into(), false));
        // The earliest of several stops wins.
        assert_eq!(run(&["b", "zz"], &["azzb"]), ("a".into(), true));
        // Multi-byte text is cut at character boundaries.
        assert_eq!(run(&["éé"], &["xé", "é!"]), ("x".into(), true));
        assert_eq!(run(&[], &["free ", "text"]), ("free text".into(), false));
    }
}
