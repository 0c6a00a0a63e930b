//! `PocketSession`: a conversation with a model, usable from several threads.
//!
//! A thin layer over core's [`SharedSession`], which owns the semantics:
//! requests queue for their turn, `cancel()` stops the running request and
//! those waiting without taking the lock, a listener cannot re-enter its own
//! session. This file converts options, messages, stats and listener errors
//! (the structured-output types are in `structured.rs`). Sessions can be
//! saved to a file and restored (core's `session::snapshot`).

use std::sync::Arc;

use pocket_core::chat::ChatMessage as CoreChatMessage;
use pocket_core::model::KvType;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{self as core, ContextPolicy, SharedSession};

use crate::error::{guard, PocketError};
use crate::model::PocketModel;
use crate::structured::{EventListener, GenerationEvent, Reasoning, ToolCall, ToolChoice, ToolSpec};

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum KvCacheType {
    F16,
    F32,
    /// 8-bit blocks with an f16 scale: half the memory of F16 (head sizes must be multiples of 32).
    Q8_0,
}

/// Settings fixed for the life of a session. Every field has a default.
#[derive(Clone, uniffi::Record)]
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
    /// Worker threads; 0 = the model's `LoadOptions.threads` (0 there = the performance cores, else every core).
    #[uniffi(default = 0)]
    pub threads: u32,
    /// Sampler seed of requests that do not set their own.
    #[uniffi(default = 24301)]
    pub seed: u64,
    /// The drafter of `Speculation.DraftModel`: a smaller model with the same
    /// vocabulary (a different one is `InvalidArgument` naming the first
    /// difference, when the session is created).
    #[uniffi(default = None)]
    pub draft_model: Option<Arc<PocketModel>>,
}

impl std::fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionOptions")
            .field("context_length", &self.context_length)
            .field("kv_cache_type", &self.kv_cache_type)
            .field("sliding_window", &self.sliding_window)
            .field("threads", &self.threads)
            .field("seed", &self.seed)
            .field("draft_model", &self.draft_model.is_some())
            .finish()
    }
}

/// Equal settings; draft models are equal when they are the same object.
impl PartialEq for SessionOptions {
    fn eq(&self, other: &Self) -> bool {
        let same_draft = match (&self.draft_model, &other.draft_model) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_draft
            && (self.context_length, self.kv_cache_type, self.sliding_window, self.threads, self.seed)
                == (other.context_length, other.kv_cache_type, other.sliding_window, other.threads, other.seed)
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            context_length: 0,
            kv_cache_type: None,
            sliding_window: false,
            threads: 0,
            seed: core::DEFAULT_SEED,
            draft_model: None,
        }
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
    /// The answer is JSON valid against this JSON Schema (JSON text),
    /// enforced token by token. A request takes at most one of `jsonSchema`,
    /// `grammar`, `regex` and `choices`; a schema keyword the engine would not
    /// enforce, a bad grammar or regex, or two constraints are
    /// `InvalidArgument` naming the field.
    #[uniffi(default = None)]
    pub json_schema: Option<String>,
    /// The answer follows this Lark grammar (llguidance's dialect).
    #[uniffi(default = None)]
    pub grammar: Option<String>,
    /// The answer matches this regular expression.
    #[uniffi(default = None)]
    pub regex: Option<String>,
    /// The answer is exactly one of these texts (empty = no constraint).
    #[uniffi(default = [])]
    pub choices: Vec<String>,
    /// Tools the model may call (chat only; rendered through the model's
    /// template). Calls arrive in `GenerationStats.toolCalls` and as
    /// `GenerationEvent.ToolCall`.
    #[uniffi(default = [])]
    pub tools: Vec<ToolSpec>,
    /// Absent = `ToolChoice.Auto`. (Optional because UniFFI records cannot
    /// default to an enum variant.)
    #[uniffi(default = None)]
    pub tool_choice: Option<ToolChoice>,
    /// Absent = `Reasoning.Default` (the template's behaviour).
    #[uniffi(default = None)]
    pub reasoning: Option<Reasoning>,
    /// Speculative decoding; absent = `Speculation.Off`. Greedy and seeded
    /// output is the same with it, under a constraint or tools too.
    #[uniffi(default = None)]
    pub speculation: Option<Speculation>,
}

/// How a request drafts tokens to verify in one pass (`GenerateOptions.speculation`;
/// optional there: absent = `Off`). `Mtp` drafts with the file's own
/// multi-token-prediction layer (`InvalidArgument` for a file without one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum Speculation {
    /// One token per forward pass.
    Off,
    /// Prompt lookup: the tokens that followed the last `ngram` (down to 1)
    /// tokens earlier in the prompt or answer, up to `maxDraft` of them.
    Lookup { ngram: u32, max_draft: u32 },
    /// The model's multi-token-prediction head (not yet supported).
    Mtp { max_draft: u32 },
    /// A smaller model of the same vocabulary, `SessionOptions.draftModel`
    /// (without one: `InvalidArgument`), drafting greedily up to `maxDraft` tokens.
    DraftModel { max_draft: u32 },
}

impl From<Speculation> for core::Speculation {
    fn from(s: Speculation) -> Self {
        match s {
            Speculation::Off => core::Speculation::Off,
            Speculation::Lookup { ngram, max_draft } => {
                core::Speculation::Lookup { ngram: ngram as usize, max_draft: max_draft as usize }
            }
            Speculation::Mtp { max_draft } => core::Speculation::Mtp { max_draft: max_draft as usize },
            Speculation::DraftModel { max_draft } => core::Speculation::DraftModel { max_draft: max_draft as usize },
        }
    }
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
            json_schema: None,
            grammar: None,
            regex: None,
            choices: Vec::new(),
            tools: Vec::new(),
            tool_choice: None,
            reasoning: None,
            speculation: None,
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
    /// The turn ended by calling tools (`GenerationStats.toolCalls`).
    ToolCalls,
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
    /// The answer streamed to the listener, concatenated (never the thinking or calls).
    pub text: String,
    /// Under a memory budget: routed experts found in the expert cache, read
    /// from storage, and the bytes read (0 without a budget).
    pub expert_cache_hits: u64,
    pub expert_cache_misses: u64,
    pub storage_bytes_read: u64,
    /// The thinking, apart from the answer ("" without).
    #[uniffi(default = "")]
    pub reasoning: String,
    /// The tools the model called, in order (`stopReason` is then `ToolCalls`).
    #[uniffi(default = [])]
    pub tool_calls: Vec<ToolCall>,
    /// Speculation: tokens drafted and verified, and how many the model accepted (0 without).
    #[uniffi(default = 0)]
    pub drafted_tokens: u32,
    #[uniffi(default = 0)]
    pub accepted_tokens: u32,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls (as `GenerationStats.toolCalls` gave them).
    #[uniffi(default = [])]
    pub tool_calls: Vec<ToolCall>,
    /// A tool result (role "tool"): the `id` of the call it answers.
    #[uniffi(default = None)]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with no tool calls (Rust callers; foreign ones get the defaults).
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
}

impl From<ChatMessage> for CoreChatMessage {
    fn from(m: ChatMessage) -> Self {
        CoreChatMessage {
            role: m.role,
            content: m.content,
            tool_calls: m.tool_calls.into_iter().map(Into::into).collect(),
            tool_call_id: m.tool_call_id,
        }
    }
}

impl From<CoreChatMessage> for ChatMessage {
    fn from(m: CoreChatMessage) -> Self {
        ChatMessage {
            role: m.role,
            content: m.content,
            tool_calls: m.tool_calls.into_iter().map(Into::into).collect(),
            tool_call_id: m.tool_call_id,
        }
    }
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
    session: SharedSession,
}

#[uniffi::export]
impl PocketSession {
    /// A session on `model`; allocates the KV cache for the context length.
    #[uniffi::constructor]
    pub fn new(model: Arc<PocketModel>, options: SessionOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            let session = SharedSession::new(model.core().clone(), core_session_options(&model, &options))?;
            Ok(Arc::new(PocketSession { session }))
        })
    }

    /// A session that continues from the snapshot at `path` (written by
    /// `save`): the next generate/chat evaluates only its new tokens and
    /// answers exactly as the saved session would have. `model` must be the
    /// same file, and `options` must give the same context length and KV
    /// cache type (the seed is not saved: pass the same one to sample the
    /// same). `InvalidArgument` names what does not match or is damaged;
    /// `Io` when the file cannot be read (e.g. it does not exist).
    #[uniffi::constructor]
    pub fn restore(model: Arc<PocketModel>, path: String, options: SessionOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            let session = SharedSession::restore(model.core().clone(), &path, core_session_options(&model, &options))?;
            Ok(Arc::new(PocketSession { session }))
        })
    }

    /// Save the conversation to `path` (evaluated tokens, KV cache of the used
    /// positions, recurrent state), replacing the file crash-safely: a kill
    /// at any moment leaves the old file or the new one. Waits for a running
    /// generation to end (call `cancel()` first to make that quick); refused
    /// from this session's own listener.
    pub fn save(&self, path: String) -> Result<(), PocketError> {
        guard(|| Ok(self.session.save(&path)?))
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
        let opts = core_options(options);
        stream(listener.as_ref(), |on_piece| self.session.generate(&prompt, &opts, on_piece))
    }

    /// `generate`, reporting every event to `listener` as it happens: answer
    /// text, and thinking on a model that thinks. (Tools need `chatEvents`.)
    pub fn generate_events(
        &self,
        prompt: String,
        options: GenerateOptions,
        listener: Arc<dyn EventListener>,
    ) -> Result<GenerationStats, PocketError> {
        let opts = core_options(options);
        stream_events(listener.as_ref(), |on_event| self.session.generate_events(&prompt, &opts, on_event))
    }

    /// Answer a conversation rendered through the model's chat template.
    /// Turns already in the context are not evaluated again.
    pub fn chat(
        &self,
        messages: Vec<ChatMessage>,
        options: GenerateOptions,
        listener: Arc<dyn TokenListener>,
    ) -> Result<GenerationStats, PocketError> {
        let opts = core_options(options);
        let messages: Vec<CoreChatMessage> = messages.into_iter().map(Into::into).collect();
        stream(listener.as_ref(), |on_piece| self.session.chat(&messages, &opts, on_piece))
    }

    /// `chat`, reporting every event to `listener` as it happens: answer
    /// text, thinking, and tool calls (each complete and valid against its
    /// tool's schema). `chat`'s `TokenListener` receives the answer text only.
    pub fn chat_events(
        &self,
        messages: Vec<ChatMessage>,
        options: GenerateOptions,
        listener: Arc<dyn EventListener>,
    ) -> Result<GenerationStats, PocketError> {
        let opts = core_options(options);
        let messages: Vec<CoreChatMessage> = messages.into_iter().map(Into::into).collect();
        stream_events(listener.as_ref(), |on_event| self.session.chat_events(&messages, &opts, on_event))
    }

    /// Stop the running generation (and any waiting to run) after the current
    /// token. Safe from any thread; never blocks. A request made after this
    /// call is not affected.
    pub fn cancel(&self) {
        self.session.cancel();
    }

    /// Forget the conversation. Waits for a running generation to end (call
    /// `cancel()` first to make that quick).
    pub fn reset(&self) {
        if let Err(e) = guard(|| Ok(self.session.reset()?)) {
            log::warn!("reset(): {e}");
        }
    }
}

/// The core options of `options` (threads 0 = the model's default).
fn core_session_options(model: &PocketModel, options: &SessionOptions) -> core::SessionOptions {
    let threads = if options.threads == 0 { model.default_threads() } else { options.threads };
    core::SessionOptions {
        context_length: options.context_length as usize,
        kv_type: match options.kv_cache_type.unwrap_or(KvCacheType::F16) {
            KvCacheType::F16 => KvType::F16,
            KvCacheType::F32 => KvType::F32,
            KvCacheType::Q8_0 => KvType::Q8_0,
        },
        threads: threads as usize,
        context_policy: if options.sliding_window { ContextPolicy::Slide { sink: None } } else { ContextPolicy::Error },
        seed: options.seed,
        draft_model: options.draft_model.as_ref().map(|m| m.core().clone()),
    }
}

/// Run one request, streaming to `listener`; an error the listener throws
/// stops generation and is what the request returns.
fn stream(
    listener: &dyn TokenListener,
    request: impl FnOnce(&mut dyn FnMut(&str) -> bool) -> pocket_core::Result<core::GenerationStats>,
) -> Result<GenerationStats, PocketError> {
    guard(|| {
        let mut listener_error = None;
        let mut on_piece = |piece: &str| match listener.on_token(piece.to_string()) {
            Ok(go_on) => go_on,
            Err(e) => {
                listener_error = Some(e);
                false
            }
        };
        let stats = request(&mut on_piece)?;
        match listener_error {
            Some(e) => Err(e),
            None => Ok(GenerationStats::from(stats)),
        }
    })
}

/// Run one request, reporting its events to `listener`; an error the
/// listener throws stops generation and is what the request returns.
fn stream_events(
    listener: &dyn EventListener,
    request: impl FnOnce(
        &mut dyn FnMut(pocket_core::structured::GenerationEvent) -> bool,
    ) -> pocket_core::Result<core::GenerationStats>,
) -> Result<GenerationStats, PocketError> {
    guard(|| {
        let mut listener_error = None;
        let mut on_event = |event: pocket_core::structured::GenerationEvent| {
            // Core may flush held-back text after a stop: nothing reaches a listener that failed.
            if listener_error.is_some() {
                return false;
            }
            match listener.on_event(GenerationEvent::from(event)) {
                Ok(go_on) => go_on,
                Err(e) => {
                    listener_error = Some(e);
                    false
                }
            }
        };
        let stats = request(&mut on_event)?;
        match listener_error {
            Some(e) => Err(e),
            None => Ok(GenerationStats::from(stats)),
        }
    })
}

/// The core request options (core validates them when the request runs).
pub(crate) fn core_options(o: GenerateOptions) -> core::GenerateOptions {
    core::GenerateOptions {
        max_tokens: o.max_tokens as usize,
        sampler: SamplerConfig {
            temperature: o.temperature,
            top_k: o.top_k as usize,
            top_p: o.top_p,
            min_p: o.min_p,
            repeat_penalty: o.repeat_penalty,
            ..SamplerConfig::default()
        },
        stop: o.stop,
        seed: o.seed,
        json_schema: o.json_schema,
        grammar: o.grammar,
        regex: o.regex,
        choices: o.choices,
        tools: o.tools.into_iter().map(Into::into).collect(),
        tool_choice: o.tool_choice.map(Into::into).unwrap_or_default(),
        reasoning: o.reasoning.map(Into::into).unwrap_or_default(),
        speculation: o.speculation.map(Into::into).unwrap_or_default(),
        ..core::GenerateOptions::default()
    }
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
                core::StopReason::ToolCalls => StopReason::ToolCalls,
            },
            text: s.text,
            expert_cache_hits: s.expert_cache_hits,
            expert_cache_misses: s.expert_cache_misses,
            storage_bytes_read: s.storage_bytes_read,
            reasoning: s.reasoning,
            tool_calls: s.tool_calls.into_iter().map(Into::into).collect(),
            drafted_tokens: count(s.drafted_tokens),
            accepted_tokens: count(s.accepted_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use pocket_core::structured::{GenerationEvent as CoreEvent, ToolCall as CoreCall};

    use super::*;
    use crate::structured::ToolCallValue;

    /// Records events; fails at the `fail_at`th.
    struct Record(Mutex<Vec<GenerationEvent>>, usize);

    impl EventListener for Record {
        fn on_event(&self, event: GenerationEvent) -> Result<bool, PocketError> {
            let mut seen = self.0.lock().unwrap();
            seen.push(event);
            if seen.len() == self.1 {
                return Err(PocketError::internal("listener bug"));
            }
            Ok(true)
        }
    }

    /// A request that reports thinking, text and a call, then flushes text
    /// whatever the listener said (as core's end of request does).
    fn request(on_event: &mut dyn FnMut(CoreEvent) -> bool) -> pocket_core::Result<core::GenerationStats> {
        let call = CoreCall { id: "call_0".into(), name: "clock".into(), arguments_json: "{}".into() };
        for e in [CoreEvent::Reasoning("hm".into()), CoreEvent::Text("It is".into()), CoreEvent::ToolCall(call)] {
            if !on_event(e) {
                break;
            }
        }
        on_event(CoreEvent::Text(" noon".into()));
        Ok(core::GenerationStats {
            prompt_tokens: 3,
            prompt_tokens_evaluated: 3,
            generated_tokens: 4,
            time_to_first_token_ms: 1.0,
            prefill_tokens_per_second: 1.0,
            decode_tokens_per_second: 1.0,
            stop_reason: core::StopReason::ToolCalls,
            expert_cache_hits: 0,
            expert_cache_misses: 0,
            storage_bytes_read: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
            tokens: vec![1, 2, 3, 4],
            text: "It is noon".into(),
            reasoning: "hm".into(),
            tool_calls: vec![CoreCall { id: "call_0".into(), name: "clock".into(), arguments_json: "{}".into() }],
        })
    }

    #[test]
    fn events_arrive_in_order_and_stats_carry_thinking_and_calls() {
        let listener = Record(Mutex::new(Vec::new()), usize::MAX);
        let stats = stream_events(&listener, request).unwrap();
        let call = ToolCall { id: "call_0".into(), name: "clock".into(), arguments_json: "{}".into() };
        assert_eq!(
            *listener.0.lock().unwrap(),
            [
                GenerationEvent::Reasoning { piece: "hm".into() },
                GenerationEvent::Text { piece: "It is".into() },
                GenerationEvent::ToolCall { call: ToolCallValue(call.clone()) },
                GenerationEvent::Text { piece: " noon".into() },
            ]
        );
        assert_eq!(stats.stop_reason, StopReason::ToolCalls);
        assert_eq!((stats.reasoning.as_str(), stats.tool_calls), ("hm", vec![call]));
    }

    #[test]
    fn nothing_reaches_a_listener_after_it_failed() {
        let listener = Record(Mutex::new(Vec::new()), 2);
        let e = stream_events(&listener, request).unwrap_err();
        assert_eq!(e, PocketError::internal("listener bug"));
        assert_eq!(listener.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn absent_tool_choice_and_reasoning_are_core_s_defaults() {
        let o = core_options(GenerateOptions::default());
        assert_eq!(o, core::GenerateOptions { sampler: o.sampler.clone(), ..core::GenerateOptions::default() });
        let o = core_options(GenerateOptions {
            tools: vec![ToolSpec { name: "t".into(), description: "d".into(), parameters_json: "{}".into() }],
            tool_choice: Some(ToolChoice::Named { name: "t".into() }),
            reasoning: Some(Reasoning::Budget { max_tokens: 9 }),
            choices: vec!["a".into()],
            ..GenerateOptions::default()
        });
        assert_eq!(o.tool_choice, pocket_core::structured::ToolChoice::Named("t".into()));
        assert_eq!(o.reasoning, pocket_core::structured::Reasoning::Budget(9));
        assert_eq!((o.tools[0].name.as_str(), o.choices.as_slice()), ("t", ["a".to_string()].as_slice()));
    }

    #[test]
    fn the_exported_seed_default_is_core_s() {
        // `#[uniffi(default = ...)]` takes only a literal: keep it equal to core's.
        assert_eq!(SessionOptions::default().seed, 24301);
        assert_eq!(pocket_core::session::DEFAULT_SEED, 24301);
    }
}
