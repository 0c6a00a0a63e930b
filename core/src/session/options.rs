//! What a caller chooses for a session and for each request, and the
//! defaults every front end (the CLI, the bindings, Rust callers) shares.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::{ExpertIo, KvType, Model};
use crate::sampler::{SamplerConfig, DEFAULT_SEED};
use crate::structured::{Constraint, Reasoning, ToolCall, ToolChoice, ToolSpec};

use super::speculate::Speculation;

pub use crate::model::DEFAULT_MAX_CONTEXT;

/// Tokens kept at the start of the context when the window slides
/// (attention sinks), unless the caller says otherwise; at most a quarter of
/// the context.
pub const DEFAULT_SLIDE_SINK: usize = 4;

/// What the session does when the context is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextPolicy {
    /// Stop with [`Error::ContextFull`].
    #[default]
    Error,
    /// Keep the first `sink` tokens and the most recent half of the context,
    /// drop the rest, and go on (the kept tokens are re-evaluated). `None`:
    /// [`DEFAULT_SLIDE_SINK`], at most a quarter of the context.
    Slide { sink: Option<usize> },
}

/// Settings fixed for the life of a session.
#[derive(Clone)]
pub struct SessionOptions {
    /// Context length in tokens; 0 = the model's training context, at most 4096.
    pub context_length: usize,
    pub kv_type: KvType,
    /// Worker threads; 0 = the performance cores where the OS tells them
    /// apart, else every core ([`crate::threads::default_threads`]).
    pub threads: usize,
    pub context_policy: ContextPolicy,
    /// Seed of the sampler when a request does not set one.
    pub seed: u64,
    /// The drafter of [`Speculation::DraftModel`]: a smaller model with the
    /// same vocabulary (checked when the session is created), run in a
    /// session of its own with these options.
    pub draft_model: Option<Arc<Model>>,
}

impl fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionOptions")
            .field("context_length", &self.context_length)
            .field("kv_type", &self.kv_type)
            .field("threads", &self.threads)
            .field("context_policy", &self.context_policy)
            .field("seed", &self.seed)
            .field("draft_model", &self.draft_model.as_ref().map(|m| m.summary().architecture.clone()))
            .finish()
    }
}

/// Equal settings; draft models are equal when they are the same loaded model.
impl PartialEq for SessionOptions {
    fn eq(&self, other: &Self) -> bool {
        let same_draft = match (&self.draft_model, &other.draft_model) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_draft
            && (self.context_length, self.kv_type, self.threads, self.context_policy, self.seed)
                == (other.context_length, other.kv_type, other.threads, other.context_policy, other.seed)
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            context_length: 0,
            kv_type: KvType::F16,
            threads: 0,
            context_policy: ContextPolicy::Error,
            seed: DEFAULT_SEED,
            draft_model: None,
        }
    }
}

impl SessionOptions {
    /// The context length these options give on a model trained for
    /// `trained` tokens (if the file says).
    pub fn resolved_context(&self, trained: Option<u64>) -> usize {
        match self.context_length {
            0 => crate::model::default_context(trained),
            n => n,
        }
    }

    /// The policy with its sink resolved for a context of `n_ctx`, or why
    /// the options cannot work.
    pub(super) fn resolved_policy(&self, n_ctx: usize) -> Result<ContextPolicy> {
        match self.context_policy {
            ContextPolicy::Error => Ok(ContextPolicy::Error),
            ContextPolicy::Slide { sink: None } => {
                Ok(ContextPolicy::Slide { sink: Some(DEFAULT_SLIDE_SINK.min(n_ctx / 4)) })
            }
            ContextPolicy::Slide { sink: Some(sink) } if sink >= n_ctx / 2 => {
                Err(Error::InvalidArgument(format!("{sink} sink tokens do not fit a context of {n_ctx}")))
            }
            p => Ok(p),
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
    /// At most one constraint on the answer (enforced by a token mask; see
    /// [`crate::structured`]): a JSON Schema, a Lark grammar (llguidance's
    /// dialect), a regular expression, or a choice among strings (empty = none).
    pub json_schema: Option<String>,
    pub grammar: Option<String>,
    pub regex: Option<String>,
    pub choices: Vec<String>,
    /// Tools the model may call (rendered through the chat template; calls
    /// constrained to the tools' schemas) and whether it may.
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    /// Thinking: the template's default, off, on, or on with a token budget.
    pub reasoning: Reasoning,
    /// Draft tokens and verify them in one pass (see `session/speculate.rs`);
    /// under a constraint or tools each verified row is sampled under its own mask.
    pub speculation: Speculation,
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
            json_schema: None,
            grammar: None,
            regex: None,
            choices: Vec::new(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            reasoning: Reasoning::Default,
            speculation: Speculation::Off,
        }
    }
}

impl GenerateOptions {
    /// Every setting in its range (see [`crate::sampler::check`]).
    pub fn validate(&self) -> Result<()> {
        self.sampler.validate()?;
        self.speculation.validate()?;
        self.constraint()?;
        crate::structured::validate_tools(&self.tools)?;
        if self.constraint()?.is_some() && !self.tools.is_empty() && self.tool_choice != ToolChoice::Off {
            return Err(Error::InvalidArgument(
                "tools: a request with a constraint on its answer cannot also call tools (set tool_choice off)".into(),
            ));
        }
        if self.tools.is_empty() && matches!(self.tool_choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return Err(Error::InvalidArgument("tool_choice: a call is required but no tools are given".into()));
        }
        Ok(())
    }

    /// The request's one constraint, or none (more than one is refused).
    pub fn constraint(&self) -> Result<Option<Constraint>> {
        Constraint::of(self.json_schema.as_deref(), self.grammar.as_deref(), self.regex.as_deref(), &self.choices)
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
    /// The turn ended by calling tools ([`GenerationStats::tool_calls`]).
    ToolCalls,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndOfText => "end_of_text",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopString => "stop_string",
            StopReason::ListenerStopped => "listener_stopped",
            StopReason::Cancelled => "cancelled",
            StopReason::ToolCalls => "tool_calls",
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
    /// Routed experts found in the expert cache, read from storage, and the
    /// bytes read (all 0 without a memory budget).
    pub expert_cache_hits: u64,
    pub expert_cache_misses: u64,
    pub storage_bytes_read: u64,
    /// Speculation: tokens drafted and verified, and how many of them the
    /// model accepted (both 0 without speculation).
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// The answer streamed to the listener (never the thinking or calls).
    pub text: String,
    /// The thinking, apart from the answer.
    pub reasoning: String,
    /// The tools the model called, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl GenerationStats {
    /// The figures of a request that has evaluated nothing yet.
    pub(super) fn empty(prompt_tokens: usize) -> GenerationStats {
        GenerationStats {
            prompt_tokens,
            prompt_tokens_evaluated: 0,
            generated_tokens: 0,
            time_to_first_token_ms: 0.0,
            prefill_tokens_per_second: 0.0,
            decode_tokens_per_second: 0.0,
            stop_reason: StopReason::MaxTokens,
            expert_cache_hits: 0,
            expert_cache_misses: 0,
            storage_bytes_read: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
            tokens: Vec::new(),
            text: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
        }
    }

    pub(super) fn set_expert_io(&mut self, io: ExpertIo) {
        (self.expert_cache_hits, self.expert_cache_misses, self.storage_bytes_read) =
            (io.hits, io.misses, io.bytes_read);
    }

    /// A request cancelled before it started.
    pub(super) fn cancelled() -> GenerationStats {
        GenerationStats { stop_reason: StopReason::Cancelled, ..GenerationStats::empty(0) }
    }
}
