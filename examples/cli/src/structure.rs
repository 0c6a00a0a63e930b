//! The structure flags of `run`, `chat` and `bench`: one constraint on the
//! answer (`--json-schema`, `--grammar`, `--regex`, `--choice`), tools
//! (`--tools`, `--tool-choice`), thinking (`--reasoning`) and a template
//! (`--chat-template`); and the JSON shapes of messages and tool calls.

use pocket_core::chat::ChatMessage;
use pocket_core::session::GenerateOptions;
use pocket_core::structured::{Reasoning, ToolCall, ToolChoice, ToolSpec};
use serde_json::{json, Value};

/// What the answer must look like, which tools it may call, and thinking.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Structure {
    /// Constrain the answer to a JSON Schema (a file, or the schema's JSON)
    #[arg(long, value_name = "SCHEMA")]
    pub json_schema: Option<String>,
    /// Constrain the answer to a Lark grammar (llguidance's dialect) read from FILE
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<String>,
    /// Constrain the answer to a regular expression
    #[arg(long, value_name = "RE", allow_hyphen_values = true)]
    pub regex: Option<String>,
    /// The answer is exactly one of these texts; repeatable
    #[arg(long = "choice", value_name = "TEXT", allow_hyphen_values = true)]
    pub choices: Vec<String>,
    /// Tools the model may call: a JSON array of {name, description, parameters} (a file)
    #[arg(long, value_name = "FILE")]
    pub tools: Option<String>,
    /// Tool calls: auto (the model decides), required, off, or a tool's name
    #[arg(long, value_name = "CHOICE", default_value = "auto")]
    pub tool_choice: String,
    /// Thinking: default (the template's), off, on, or a number (on, at most that many tokens)
    #[arg(long, value_name = "MODE", default_value = "default", value_parser = parse_reasoning)]
    pub reasoning: Reasoning,
    /// A Jinja chat template used instead of the file's
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<String>,
}

impl Structure {
    /// `opts` with this structure.
    pub fn apply(&self, opts: &mut GenerateOptions) -> Result<(), String> {
        opts.json_schema = match &self.json_schema {
            None => None,
            Some(s) if s.trim_start().starts_with('{') || s.trim() == "true" => Some(s.clone()),
            Some(path) => Some(read(path)?),
        };
        opts.grammar = self.grammar.as_deref().map(read).transpose()?;
        opts.regex = self.regex.clone();
        opts.choices = self.choices.clone();
        opts.tools = match &self.tools {
            None => Vec::new(),
            Some(path) => parse_tools(&read(path)?)?,
        };
        opts.tool_choice = match self.tool_choice.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "off" | "none" => ToolChoice::Off,
            name => ToolChoice::Named(name.to_string()),
        };
        opts.reasoning = self.reasoning;
        Ok(())
    }

    /// The template file's text, if one is given.
    pub fn template_source(&self) -> Result<Option<String>, String> {
        self.chat_template.as_deref().map(read).transpose()
    }
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn parse_reasoning(s: &str) -> Result<Reasoning, String> {
    match s {
        "default" => Ok(Reasoning::Default),
        "off" => Ok(Reasoning::Off),
        "on" => Ok(Reasoning::On),
        n => n
            .parse::<u32>()
            .map(Reasoning::Budget)
            .map_err(|_| format!("'{s}' is not default, off, on or a number of thinking tokens")),
    }
}

/// Tools as a JSON array of `{name, description, parameters}` (the OpenAI
/// shape `{type: function, function: {...}}` is accepted too).
pub fn parse_tools(text: &str) -> Result<Vec<ToolSpec>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("tools: invalid JSON: {e}"))?;
    let Value::Array(items) = v else { return Err("tools: expected a JSON array".into()) };
    items
        .iter()
        .map(|t| {
            let t = t.get("function").unwrap_or(t);
            let name = t.get("name").and_then(Value::as_str).ok_or("tools: a tool without a name")?;
            let description = t.get("description").and_then(Value::as_str).unwrap_or("");
            let parameters = t.get("parameters").map_or_else(|| "{}".to_string(), Value::to_string);
            Ok(ToolSpec::new(name, description, parameters))
        })
        .collect()
}

/// Messages as a JSON array of `{role, content, tool_calls?, tool_call_id?}`;
/// a call is `{id, name, arguments}` or OpenAI's `{id, type, function: {name, arguments}}`.
pub fn parse_messages(v: &Value) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = v else { return Err("messages: expected a JSON array".into()) };
    items
        .iter()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str).ok_or("messages: a message without a role")?;
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            let mut msg = ChatMessage::new(role, content);
            if let Some(Value::Array(calls)) = m.get("tool_calls") {
                for c in calls {
                    let f = c.get("function").unwrap_or(c);
                    let name = f.get("name").and_then(Value::as_str).ok_or("messages: a tool call without a name")?;
                    let arguments = match f.get("arguments") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => "{}".into(),
                    };
                    let id = c.get("id").and_then(Value::as_str).unwrap_or("").to_string();
                    msg.tool_calls.push(ToolCall { id, name: name.to_string(), arguments_json: arguments });
                }
            }
            msg.tool_call_id = m.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
            Ok(msg)
        })
        .collect()
}

/// A call as the CLI prints it: `{id, name, arguments}` with the arguments as JSON.
pub fn call_json(c: &ToolCall) -> Value {
    let args = serde_json::from_str::<Value>(&c.arguments_json).unwrap_or(Value::String(c.arguments_json.clone()));
    json!({"id": c.id, "name": c.name, "arguments": args})
}
