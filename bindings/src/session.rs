//! `PocketSession`: a conversation with a model, usable from several threads.
//!
//! The core session needs `&mut` to generate, so it sits behind a mutex: a
//! second `generate` while one runs waits for it (the first finishes or is
//! cancelled), never races it. `cancel()` does not take that lock: it sets
//! the core's cancel flag and bumps `cancel_epoch`, which also stops any call
//! still waiting for the lock (the core clears its flag when a request starts,
//! so the epoch is what makes a cancel that lands in between stick).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use pocket_core::chat::ChatMessage as CoreChatMessage;
use pocket_core::model::KvType;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{self as core, CancelHandle, ContextPolicy, Session};

use crate::error::{guard, PocketError};
use crate::model::PocketModel;

/// Tokens kept at the start of the context when the window slides (attention sinks).
const SLIDE_SINK: usize = 4;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum KvCacheType {
    F16,
    F32,
    /// 8-bit blocks with an f16 scale: half the memory of F16 (head sizes must be multiples of 32).
    Q8_0,
}

/// Settings fixed for the life of a session. Every field has a default.
#[derive(Clone, Debug, PartialEq, uniffi::Record)]
pub struct SessionOptions {
    /// Context length in tokens; 0 = the model's training context, at most 4096.
    #[uniffi(default = 0)]
    pub context_length: u32,
    /// KV cache element type; absent = F16.
    #[uniffi(default = None)]
    pub kv_cache_type: Option<KvCacheType>,
    /// When the context is full, keep the first few tokens and the most recent
    /// half and go on, instead of failing with `PocketError.ContextFull`.
    #[uniffi(default = false)]
    pub sliding_window: bool,
    /// Worker threads; 0 = the model's `LoadOptions.threads` (0 there = every core).
    #[uniffi(default = 0)]
    pub threads: u32,
    /// Sampler seed of requests that do not set their own.
    #[uniffi(default = 24301)]
    pub seed: u64,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { context_length: 0, kv_cache_type: None, sliding_window: false, threads: 0, seed: 0x5EED }
    }
}

/// Settings of one request. Every field has a default.
#[derive(Clone, Debug, PartialEq, uniffi::Record)]
pub struct GenerateOptions {
    #[uniffi(default = 256)]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[uniffi(default = 0.8)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    #[uniffi(default = 40)]
    pub top_k: u32,
    /// Keep the smallest set whose probability reaches p (1 = off).
    #[uniffi(default = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one (0 = off).
    #[uniffi(default = 0.05)]
    pub min_p: f32,
    /// Penalise recently generated tokens (1 = off).
    #[uniffi(default = 1.0)]
    pub repeat_penalty: f32,
    /// Stop strings: generation ends before any of them, and they are never streamed.
    #[uniffi(default = [])]
    pub stop: Vec<String>,
    /// Sampler seed of this request; absent = the session's.
    #[uniffi(default = None)]
    pub seed: Option<u64>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        let s = SamplerConfig::default();
        GenerateOptions {
            max_tokens: 256,
            temperature: s.temperature,
            top_k: s.top_k as u32,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            stop: Vec::new(),
            seed: None,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfText,
    MaxTokens,
    StopString,
    /// The listener returned false.
    ListenerStopped,
    /// `cancel()` was called.
    Cancelled,
}

/// Figures of one request.
#[derive(Clone, Debug, PartialEq, uniffi::Record)]
pub struct GenerationStats {
    /// Tokens of the prompt (the whole rendered conversation for chat).
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub time_to_first_token_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub stop_reason: StopReason,
    /// Everything streamed to the listener, concatenated.
    pub text: String,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    pub content: String,
}

/// Receives generated text, on the thread that called generate/chat.
#[uniffi::export(with_foreign)]
pub trait TokenListener: Send + Sync {
    /// A piece of text (always whole UTF-8 characters). Return false to stop.
    /// An error thrown here stops generation and is rethrown by generate/chat.
    fn on_token(&self, piece: String) -> Result<bool, PocketError>;
}

/// A conversation with a model: its KV cache, generation and cancellation.
#[derive(uniffi::Object)]
pub struct PocketSession {
    session: Mutex<Session>,
    /// Cancels the running generation without taking `session`'s lock.
    cancel: CancelHandle,
    /// Bumped by every `cancel()`; a request started before a bump is cancelled.
    cancel_epoch: AtomicU64,
    /// The thread holding `session` while it generates (to refuse re-entry from a listener).
    holder: Mutex<Option<ThreadId>>,
}

#[uniffi::export]
impl PocketSession {
    /// A session on `model`; allocates the KV cache for the context length.
    #[uniffi::constructor]
    pub fn new(model: Arc<PocketModel>, options: SessionOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            let model_ctx = model.core().summary().context_length;
            let n_ctx = match options.context_length {
                0 => model_ctx.map_or(4096, |c| c.min(4096) as usize),
                n => n as usize,
            };
            let context_policy = if options.sliding_window {
                ContextPolicy::Slide { sink: SLIDE_SINK.min(n_ctx / 4) }
            } else {
                ContextPolicy::Error
            };
            let threads = if options.threads == 0 { model.default_threads() } else { options.threads };
            let opts = core::SessionOptions {
                context_length: n_ctx,
                kv_type: match options.kv_cache_type.unwrap_or(KvCacheType::F16) {
                    KvCacheType::F16 => KvType::F16,
                    KvCacheType::F32 => KvType::F32,
                    KvCacheType::Q8_0 => KvType::Q8_0,
                },
                threads: threads as usize,
                context_policy,
                seed: options.seed,
            };
            let session = Session::new(model.core().clone(), opts)?;
            Ok(Arc::new(PocketSession {
                cancel: session.cancel_handle(),
                session: Mutex::new(session),
                cancel_epoch: AtomicU64::new(0),
                holder: Mutex::new(None),
            }))
        })
    }

    /// Complete raw text (tokenised with the model's BOS; special tokens are
    /// parsed). Streams pieces to `listener` and blocks until done; a prompt
    /// that extends the previous request's reuses its evaluated tokens.
    pub fn generate(
        &self,
        prompt: String,
        options: GenerateOptions,
        listener: Arc<dyn TokenListener>,
    ) -> Result<GenerationStats, PocketError> {
        let opts = core_options(&options)?;
        self.run(listener.as_ref(), |s, on_piece| s.generate(&prompt, &opts, on_piece))
    }

    /// Answer a conversation rendered through the model's chat template.
    /// Turns already in the context are not evaluated again.
    pub fn chat(
        &self,
        messages: Vec<ChatMessage>,
        options: GenerateOptions,
        listener: Arc<dyn TokenListener>,
    ) -> Result<GenerationStats, PocketError> {
        let opts = core_options(&options)?;
        let messages: Vec<CoreChatMessage> =
            messages.into_iter().map(|m| CoreChatMessage { role: m.role, content: m.content }).collect();
        self.run(listener.as_ref(), |s, on_piece| s.chat(&messages, &opts, on_piece))
    }

    /// Stop the running generation (and any waiting to run) after the current
    /// token. Safe from any thread; never blocks.
    pub fn cancel(&self) {
        self.cancel_epoch.fetch_add(1, Ordering::SeqCst);
        self.cancel.cancel();
    }

    /// Forget the conversation. Waits for a running generation to end (call
    /// `cancel()` first to make that quick).
    pub fn reset(&self) {
        if self.is_held_by_this_thread() {
            log::warn!("reset() called from this session's own token listener: ignored");
            return;
        }
        let _ = guard(|| {
            self.lock().reset();
            Ok(())
        });
    }
}

impl PocketSession {
    /// Run one request under the lock, streaming to `listener`.
    fn run(
        &self,
        listener: &dyn TokenListener,
        request: impl FnOnce(&mut Session, &mut dyn FnMut(&str) -> bool) -> pocket_core::Result<core::GenerationStats>,
    ) -> Result<GenerationStats, PocketError> {
        guard(|| {
            if self.is_held_by_this_thread() {
                return Err(PocketError::invalid_argument(
                    "generate/chat called from this session's own token listener",
                ));
            }
            let epoch = self.cancel_epoch.load(Ordering::SeqCst);
            let mut session = self.lock();
            let _holder = Holder::enter(&self.holder);
            if self.cancel_epoch.load(Ordering::SeqCst) != epoch {
                return Ok(cancelled_before_start());
            }
            let cancelled = || self.cancel_epoch.load(Ordering::SeqCst) != epoch;
            let mut listener_error = None;
            let mut on_piece = |piece: &str| {
                if cancelled() {
                    return false;
                }
                match listener.on_token(piece.to_string()) {
                    Ok(go_on) => go_on,
                    Err(e) => {
                        listener_error = Some(e);
                        false
                    }
                }
            };
            let stats = request(&mut session, &mut on_piece)?;
            if let Some(e) = listener_error {
                return Err(e);
            }
            let mut stats = GenerationStats::from(stats);
            if stats.stop_reason == StopReason::ListenerStopped && cancelled() {
                stats.stop_reason = StopReason::Cancelled;
            }
            Ok(stats)
        })
    }

    /// The core session. A panic during an earlier request poisoned the lock
    /// and may have left the state half-updated: start that conversation afresh.
    fn lock(&self) -> MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|poisoned| {
            let mut s = poisoned.into_inner();
            s.reset();
            self.session.clear_poison();
            s
        })
    }

    fn is_held_by_this_thread(&self) -> bool {
        *self.holder.lock().unwrap_or_else(|p| p.into_inner()) == Some(std::thread::current().id())
    }
}

/// Marks the current thread as generating until dropped (also on panic).
struct Holder<'a>(&'a Mutex<Option<ThreadId>>);

impl<'a> Holder<'a> {
    fn enter(slot: &'a Mutex<Option<ThreadId>>) -> Self {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
        Holder(slot)
    }
}

impl Drop for Holder<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

fn cancelled_before_start() -> GenerationStats {
    GenerationStats {
        prompt_tokens: 0,
        generated_tokens: 0,
        time_to_first_token_ms: 0.0,
        prefill_tokens_per_second: 0.0,
        decode_tokens_per_second: 0.0,
        stop_reason: StopReason::Cancelled,
        text: String::new(),
    }
}

fn core_options(o: &GenerateOptions) -> Result<core::GenerateOptions, PocketError> {
    let finite = |name: &str, v: f32| {
        if v.is_finite() {
            Ok(v)
        } else {
            Err(PocketError::invalid_argument(format!("{name} must be a finite number, not {v}")))
        }
    };
    if finite("temperature", o.temperature)? < 0.0 {
        return Err(PocketError::invalid_argument(format!("temperature {} is negative", o.temperature)));
    }
    if !(0.0..=1.0).contains(&finite("topP", o.top_p)?) || !(0.0..=1.0).contains(&finite("minP", o.min_p)?) {
        return Err(PocketError::invalid_argument(format!("topP {} and minP {} must lie in [0, 1]", o.top_p, o.min_p)));
    }
    if finite("repeatPenalty", o.repeat_penalty)? <= 0.0 {
        return Err(PocketError::invalid_argument(format!("repeatPenalty {} must be positive", o.repeat_penalty)));
    }
    Ok(core::GenerateOptions {
        max_tokens: o.max_tokens as usize,
        sampler: SamplerConfig {
            temperature: o.temperature,
            top_k: o.top_k as usize,
            top_p: o.top_p,
            min_p: o.min_p,
            repeat_penalty: o.repeat_penalty,
            ..SamplerConfig::default()
        },
        stop: o.stop.clone(),
        seed: o.seed,
        ..core::GenerateOptions::default()
    })
}

impl From<core::GenerationStats> for GenerationStats {
    fn from(s: core::GenerationStats) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        GenerationStats {
            prompt_tokens: count(s.prompt_tokens),
            generated_tokens: count(s.generated_tokens),
            time_to_first_token_ms: s.time_to_first_token_ms,
            prefill_tokens_per_second: s.prefill_tokens_per_second,
            decode_tokens_per_second: s.decode_tokens_per_second,
            stop_reason: match s.stop_reason {
                core::StopReason::EndOfText => StopReason::EndOfText,
                core::StopReason::MaxTokens => StopReason::MaxTokens,
                core::StopReason::StopString => StopReason::StopString,
                core::StopReason::ListenerStopped => StopReason::ListenerStopped,
                core::StopReason::Cancelled => StopReason::Cancelled,
            },
            text: s.text,
        }
    }
}
