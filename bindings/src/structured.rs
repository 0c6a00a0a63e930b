//! Structured output across FFI: the records and enums of core's
//! `structured` module (tools, tool calls, thinking, events) and the foreign
//! `EventListener`. Conversions only: core checks every value (a bad schema,
//! an unknown tool, thinking on a model without a thinking format are
//! `PocketError.InvalidArgument` naming the field).

use pocket_core::structured as core;

use crate::error::PocketError;

/// A tool the model may call: its name, what it does, and a JSON Schema of
/// its arguments (an object schema as JSON text; `{}` or "" = no arguments).
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    #[uniffi(default = "{}")]
    pub parameters_json: String,
}

/// A call the model made. Answer it with a `ChatMessage` of role "tool"
/// whose `toolCallId` is this `id`, after the assistant message that holds
/// the call in its `toolCalls`.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object (valid against the tool's schema).
    pub arguments_json: String,
}

/// `ToolCall` under another name, for `GenerationEvent.ToolCall`'s field
/// only: Kotlin resolves a variant's field type `ToolCall` to the variant
/// class itself (`GenerationEvent.ToolCall`), so the field is declared with
/// this alias (`typealias ToolCallValue = ToolCall` in Kotlin and Swift; the
/// same type everywhere).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallValue(pub ToolCall);

uniffi::custom_newtype!(ToolCallValue, ToolCall);

/// Whether and how the model may call tools. (`GenerateOptions.toolChoice`
/// is optional: absent = `Auto`, since UniFFI records cannot default to an
/// enum variant.)
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum ToolChoice {
    /// Free text until the model opens a call; then the call is constrained to the tools' schemas.
    Auto,
    /// The answer is one or more calls, from its first token.
    Required,
    /// The tools are shown to the model but no call is allowed.
    Off,
    /// The answer is a call of the tool `name`.
    Named { name: String },
}

/// Thinking before the answer (models with a thinking format: `<think>`,
/// Gemma 4's thought channel). `On` and `Budget` on a model without one are
/// `InvalidArgument`. (`GenerateOptions.reasoning` is optional: absent =
/// `Default`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum Reasoning {
    /// The template's own behaviour.
    Default,
    /// No thinking.
    Off,
    /// Thinking on.
    On,
    /// Thinking on, closed after `max_tokens` tokens.
    Budget { max_tokens: u32 },
}

/// What a streaming request reports, in the order it happens.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum GenerationEvent {
    /// A piece of the answer (whole UTF-8 characters).
    Text { piece: String },
    /// A piece of the thinking.
    Reasoning { piece: String },
    /// A complete tool call, its arguments valid against the tool's schema.
    ToolCall { call: ToolCallValue },
}

/// Receives a request's events, on the thread that called chatEvents/generateEvents.
#[uniffi::export(with_foreign)]
pub trait EventListener: Send + Sync {
    /// Return false to stop. An error thrown here stops generation and is
    /// rethrown by chatEvents/generateEvents.
    fn on_event(&self, event: GenerationEvent) -> Result<bool, PocketError>;
}

impl From<ToolSpec> for core::ToolSpec {
    fn from(t: ToolSpec) -> Self {
        core::ToolSpec { name: t.name, description: t.description, parameters_json: t.parameters_json }
    }
}

impl From<ToolCall> for core::ToolCall {
    fn from(c: ToolCall) -> Self {
        core::ToolCall { id: c.id, name: c.name, arguments_json: c.arguments_json }
    }
}

impl From<core::ToolCall> for ToolCall {
    fn from(c: core::ToolCall) -> Self {
        ToolCall { id: c.id, name: c.name, arguments_json: c.arguments_json }
    }
}

impl From<ToolChoice> for core::ToolChoice {
    fn from(c: ToolChoice) -> Self {
        match c {
            ToolChoice::Auto => core::ToolChoice::Auto,
            ToolChoice::Required => core::ToolChoice::Required,
            ToolChoice::Off => core::ToolChoice::Off,
            ToolChoice::Named { name } => core::ToolChoice::Named(name),
        }
    }
}

impl From<Reasoning> for core::Reasoning {
    fn from(r: Reasoning) -> Self {
        match r {
            Reasoning::Default => core::Reasoning::Default,
            Reasoning::Off => core::Reasoning::Off,
            Reasoning::On => core::Reasoning::On,
            Reasoning::Budget { max_tokens } => core::Reasoning::Budget(max_tokens),
        }
    }
}

impl From<core::GenerationEvent> for GenerationEvent {
    fn from(e: core::GenerationEvent) -> Self {
        match e {
            core::GenerationEvent::Text(piece) => GenerationEvent::Text { piece },
            core::GenerationEvent::Reasoning(piece) => GenerationEvent::Reasoning { piece },
            core::GenerationEvent::ToolCall(call) => GenerationEvent::ToolCall { call: ToolCallValue(call.into()) },
        }
    }
}
