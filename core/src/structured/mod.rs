//! Structured output: constraints enforced by a token mask at sampling
//! (JSON Schema, Lark grammars, regular expressions, choices), tool calls in
//! each model family's own syntax, and thinking kept apart from the answer.
//!
//! The mask engine is llguidance (`vocab.rs` gives it the vocabulary's
//! bytes); what is Pocket's: which schema keywords are enforced and which are
//! refused (`schema.rs`), the tool-call formats (`tools.rs`: rendering,
//! call grammars, parsers), the thinking formats (`reasoning.rs`), the
//! per-request state machine the session drives (`turn.rs`), and gpt-oss's
//! harmony, whose answer is a run of messages (`harmony.rs`, its turn in
//! `harmony_turn.rs`).

mod harmony;
mod harmony_turn;
mod reasoning;
mod schema;
mod tools;
mod turn;
mod vocab;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;

pub use harmony::{parse_harmony, HarmonyOutput, Header as HarmonyHeader};
pub use reasoning::ThinkFormat;
pub use tools::{generic_messages, parse_tool_calls, validate as validate_tools, ParsedCall, ToolFormat};
pub(crate) use turn::{Channel, Closed, Mask, Turn};
pub use vocab::Grammars;

use crate::{Error, Result};

/// A tool the model may call: its name, what it does, and a JSON Schema of
/// its arguments (an object schema; `{}` or empty text = no arguments).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters_json: String,
}

impl ToolSpec {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters_json: impl Into<String>,
    ) -> ToolSpec {
        ToolSpec { name: name.into(), description: description.into(), parameters_json: parameters_json.into() }
    }
}

/// A call the model made: `id` names it in the tool's result message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object.
    pub arguments_json: String,
}

/// Whether and how the model may call tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// Free text until the model opens a call; then the call is constrained.
    #[default]
    Auto,
    /// The answer is one or more calls, from its first token.
    Required,
    /// The tools are rendered but no call is allowed (the call syntax is
    /// parsed as text).
    Off,
    /// The answer is a call of this tool.
    Named(String),
}

/// Thinking before the answer (models with a thinking format: `<think>`, Gemma 4's thought channel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reasoning {
    /// The template's own behaviour.
    #[default]
    Default,
    /// No thinking: `enable_thinking=false` where the template has it, else an empty thought.
    Off,
    /// Thinking on (`enable_thinking=true`).
    On,
    /// Thinking on, closed after this many tokens as the model's format closes it.
    Budget(u32),
}

/// What a streaming request reports, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenerationEvent {
    /// A piece of the answer.
    Text(String),
    /// A piece of the thinking.
    Reasoning(String),
    /// A complete, validated tool call.
    ToolCall(ToolCall),
}

/// The one constraint of a request, from `GenerateOptions`' fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Constraint {
    JsonSchema(String),
    /// Lark, llguidance's dialect.
    Grammar(String),
    Regex(String),
    Choices(Vec<String>),
}

impl Constraint {
    /// The field of `GenerateOptions` this came from (error messages name it).
    pub fn field(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::Grammar(_) => "grammar",
            Constraint::Regex(_) => "regex",
            Constraint::Choices(_) => "choices",
        }
    }

    /// The constraint of a request, or none; more than one is refused.
    pub fn of(
        json_schema: Option<&str>,
        grammar: Option<&str>,
        regex: Option<&str>,
        choices: &[String],
    ) -> Result<Option<Constraint>> {
        let mut all = Vec::new();
        if let Some(s) = json_schema {
            all.push(Constraint::JsonSchema(s.to_string()));
        }
        if let Some(g) = grammar {
            all.push(Constraint::Grammar(g.to_string()));
        }
        if let Some(r) = regex {
            all.push(Constraint::Regex(r.to_string()));
        }
        if !choices.is_empty() {
            all.push(Constraint::Choices(choices.to_vec()));
        }
        if all.len() > 1 {
            let names: Vec<&str> = all.iter().map(|c| c.field()).collect();
            return Err(Error::InvalidArgument(format!(
                "{}: a request takes one constraint, got {}",
                names[1],
                names.join(" and ")
            )));
        }
        Ok(all.pop())
    }

    /// The grammar llguidance compiles (schemas checked for keywords it
    /// would not enforce first).
    pub(crate) fn grammar(&self) -> Result<TopLevelGrammar> {
        let bad = |m: String| Error::InvalidArgument(format!("{}: {m}", self.field()));
        match self {
            Constraint::JsonSchema(text) => {
                let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
                let value = schema::prepare(value).map_err(bad)?;
                Ok(TopLevelGrammar::from_json_schema(value))
            }
            Constraint::Grammar(text) => {
                if text.trim().is_empty() {
                    return Err(bad("empty grammar".into()));
                }
                Ok(TopLevelGrammar::from_lark(text.clone()))
            }
            Constraint::Regex(rx) => {
                // Checked with the same parser llguidance's regexes use, for a clear message.
                regex_syntax::ParserBuilder::new()
                    .nest_limit(64)
                    .build()
                    .parse(rx)
                    .map_err(|e| bad(format!("invalid regular expression: {e}")))?;
                Ok(TopLevelGrammar::from_regex(rx))
            }
            Constraint::Choices(choices) => {
                if choices.iter().any(|c| c.is_empty()) {
                    return Err(bad("an empty choice".into()));
                }
                let alts: Vec<String> = choices.iter().map(|c| lark_string(c)).collect();
                Ok(TopLevelGrammar::from_lark(format!("start: {}\n", alts.join(" | "))))
            }
        }
    }

    /// Compile against a vocabulary: a matcher at the start of the answer.
    pub fn compile(&self, grammars: &Grammars) -> Result<Matcher> {
        compile(grammars, self.grammar()?, self.field())
    }
}

/// A matcher for a Lark grammar (tests, tools' call grammars).
pub fn compile_lark(grammars: &Grammars, lark: &str) -> Result<Matcher> {
    compile(grammars, TopLevelGrammar::from_lark(lark.to_string()), "grammar")
}

/// A matcher for `grammar`, errors as [`Error::InvalidArgument`] naming `field`.
pub(crate) fn compile(grammars: &Grammars, grammar: TopLevelGrammar, field: &str) -> Result<Matcher> {
    let parser = grammars.factory().create_parser(grammar);
    let m = Matcher::new(parser);
    if let Some(e) = m.get_error() {
        return Err(Error::InvalidArgument(format!("{field}: {}", short(&e))));
    }
    Ok(m)
}

/// An engine message cut to something a person reads (the engine's errors
/// may carry the whole grammar).
fn short(e: &str) -> String {
    let first = e.lines().next().unwrap_or(e);
    let mut s: String = first.chars().take(300).collect();
    if s.len() < first.len() {
        s.push('…');
    }
    s
}

/// `s` as a Lark string literal.
pub(crate) fn lark_string(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}
