//! Tool calls in each family's own syntax: detecting the family from the
//! template, the tools as the template receives them, the grammar that
//! constrains a call (names among the tools, arguments valid against their
//! schema) and the parser that reads calls back out of the model's text.
//!
//! | format | a call |
//! |---|---|
//! | `Qwen35Xml` (Qwen3.5/3.6) | `<tool_call>\n<function=NAME>\n<parameter=K>\nvalue\n</parameter>\n</function>\n</tool_call>` |
//! | `Hermes` (Qwen3, Qwen2.5) | `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>` |
//! | `Gemma4` | `<\|tool_call>call:NAME{key:<\|"\|>text<\|"\|>,n:5}<tool_call\|>` |
//! | `Llama3` | `{"name": NAME, "parameters": {...}}` (the whole answer) |
//! | `Harmony` (gpt-oss) | `<\|channel\|>commentary to=functions.NAME <\|constrain\|>json<\|message\|>{...}<\|call\|>` (`harmony.rs`) |
//! | `GenericJson` (templates without tools) | `{"name": NAME, "arguments": {...}}` (the whole answer) |
//!
//! Model output is untrusted: the parsers never panic, a malformed call is
//! kept as text (never dropped), and the JSON form is accepted inside the
//! Qwen3.5 markers too (models drift between the two).

use serde_json::{json, Map, Value};

use super::{harmony, schema};
use super::{lark_string, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A family's call syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    Qwen35Xml,
    Hermes,
    Gemma4,
    Llama3,
    GenericJson,
    Harmony,
}

/// A call read from the model's text.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// Always a JSON object.
    pub arguments: Value,
}

impl ToolFormat {
    /// Every format, for tests and fuzzing.
    pub const ALL: [ToolFormat; 6] = [
        ToolFormat::Qwen35Xml,
        ToolFormat::Hermes,
        ToolFormat::Gemma4,
        ToolFormat::Llama3,
        ToolFormat::GenericJson,
        ToolFormat::Harmony,
    ];

    /// The format a template writes calls in (`GenericJson` when it does
    /// not render tools at all).
    pub fn detect(template: &str) -> ToolFormat {
        if harmony::is_harmony_template(template) {
            ToolFormat::Harmony
        } else if template.contains("<|tool_call>") {
            ToolFormat::Gemma4
        } else if template.contains("<tool_call>") && template.contains("<function=") {
            ToolFormat::Qwen35Xml
        } else if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("<|start_header_id|>") && template.contains("tools") {
            ToolFormat::Llama3
        } else {
            ToolFormat::GenericJson
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Qwen35Xml => "qwen3.5-xml",
            ToolFormat::Hermes => "hermes-json",
            ToolFormat::Gemma4 => "gemma4",
            ToolFormat::Llama3 => "llama3-json",
            ToolFormat::GenericJson => "generic-json",
            ToolFormat::Harmony => "harmony",
        }
    }

    /// The marker that opens a call and the one that closes it; the JSON
    /// forms have none (a call is the whole answer, opening with `{`), nor
    /// has harmony (a call is a message, its recipient in the header).
    pub fn markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            ToolFormat::Qwen35Xml | ToolFormat::Hermes => Some(("<tool_call>", "</tool_call>")),
            ToolFormat::Gemma4 => Some(("<|tool_call>", "<tool_call|>")),
            ToolFormat::Llama3 | ToolFormat::GenericJson | ToolFormat::Harmony => None,
        }
    }

    /// The key the JSON forms put the arguments under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// The Lark grammar of one call of one of `tools`, starting right after
    /// the open marker, or at it (`with_open`; the JSON forms: at the start
    /// of the answer either way; harmony: at the message's header).
    pub fn call_grammar(self, tools: &[&ToolSpec], tok: &Tokenizer, with_open: bool) -> Result<String> {
        if tools.is_empty() {
            return Err(Error::InvalidArgument("tools: no tool to call".into()));
        }
        if self == ToolFormat::Harmony {
            return harmony::header_grammar(tools, &harmony::Atoms::of(tok), harmony::Allowed::default());
        }
        let mut g = Lark::default();
        let mut alts = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let params = call_parameters(t)?;
            let rule = format!("call_{i}");
            match self {
                ToolFormat::Hermes | ToolFormat::Llama3 | ToolFormat::GenericJson => {
                    let key = self.arguments_key();
                    let whole = json!({
                        "type": "object",
                        "properties": {"name": {"const": t.name}, key: params},
                        "required": ["name", key],
                        "additionalProperties": false,
                    });
                    let whole = schema::prepare(whole).map_err(|e| tool_error(t, e))?;
                    g.rule(&rule, &format!("%json {whole}"));
                }
                ToolFormat::Qwen35Xml => {
                    let body = qwen_xml_params(&mut g, &rule, &params, t)?;
                    g.rule(
                        &rule,
                        &format!(
                            "{} nl {body} {}",
                            lark_string(&format!("<function={}>", t.name)),
                            lark_string("</function>")
                        ),
                    );
                }
                ToolFormat::Harmony => unreachable!("harmony's grammar is written above"),
                ToolFormat::Gemma4 => {
                    let quote = special_or_text(tok, "<|\"|>");
                    let body = gemma_value(&mut g, &rule, &params, t, &quote, 0)?;
                    g.rule(&rule, &format!("{} {body}", lark_string(&t.name)));
                }
            }
            alts.push(rule);
        }
        let call = alts.join(" | ");
        let open = match self.markers() {
            Some((open, _)) if with_open => special_or_text(tok, open) + " ",
            _ => String::new(),
        };
        let start = match self {
            ToolFormat::Hermes | ToolFormat::Qwen35Xml => {
                format!("start: {open}nl ({call}) nl {}", special_or_text(tok, "</tool_call>"))
            }
            ToolFormat::Gemma4 => {
                format!("start: {open}{} ({call}) {}", lark_string("call:"), special_or_text(tok, "<tool_call|>"))
            }
            ToolFormat::Llama3 | ToolFormat::GenericJson | ToolFormat::Harmony => format!("start: {call}"),
        };
        g.rules.insert(0, start);
        g.rules.push("nl: \"\\n\"?".to_string());
        Ok(g.rules.join("\n") + "\n")
    }

    /// Tools for the template's `tools` variable, as transformers passes
    /// OpenAI-style function tools.
    pub fn template_tools(tools: &[ToolSpec]) -> Result<Value> {
        let mut out = Vec::new();
        for t in tools {
            out.push(json!({
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": parameters(t)?},
            }));
        }
        Ok(Value::Array(out))
    }

    /// A system prompt describing `tools` for templates that do not render
    /// them (the generic JSON form).
    pub fn generic_instructions(tools: &[ToolSpec]) -> Result<String> {
        let mut s = String::from(
            "You can call the following tools. To call one, answer with only a JSON object \
             {\"name\": <tool name>, \"arguments\": <arguments object>} and nothing else.\n\nTools:\n",
        );
        for t in tools {
            let line = json!({"name": t.name, "description": t.description, "parameters": parameters(t)?});
            s.push_str(&line.to_string());
            s.push('\n');
        }
        Ok(s)
    }
}

/// A conversation for a template that knows nothing of tools: an
/// assistant's calls written as the JSON it was asked to answer with, a
/// tool's result as a user turn naming the call, and turns of one role in a
/// row merged (templates that want roles to alternate).
pub fn generic_messages(messages: &[crate::chat::ChatMessage]) -> Vec<crate::chat::ChatMessage> {
    use crate::chat::ChatMessage;
    let mut out: Vec<ChatMessage> = Vec::new();
    for m in messages {
        let (role, content) = match m.role.as_str() {
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<String> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let args = serde_json::from_str::<Value>(&c.arguments_json).unwrap_or(json!({}));
                        json!({"name": c.name, "arguments": args}).to_string()
                    })
                    .collect();
                let mut content = m.content.clone();
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&calls.join("\n"));
                ("assistant", content)
            }
            "tool" => {
                let call = messages
                    .iter()
                    .flat_map(|m| m.tool_calls.iter())
                    .find(|c| Some(&c.id) == m.tool_call_id.as_ref())
                    .map_or("the tool".to_string(), |c| format!("'{}'", c.name));
                ("user", format!("Result of {call}: {}", m.content))
            }
            r => (r, m.content.clone()),
        };
        match out.last_mut() {
            Some(last) if last.role == role && role != "system" => {
                last.content.push_str("\n\n");
                last.content.push_str(&content);
            }
            _ => out.push(ChatMessage::new(role, content)),
        }
    }
    out
}

/// Check a request's tools: names unique and usable, parameters an object schema the engine enforces.
pub fn validate(tools: &[ToolSpec]) -> Result<()> {
    for (i, t) in tools.iter().enumerate() {
        if t.name.is_empty()
            || t.name.len() > 128
            || !t.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(Error::InvalidArgument(format!(
                "tools: name '{}' must be 1-128 letters, digits, '_', '-' or '.'",
                t.name
            )));
        }
        if tools[..i].iter().any(|o| o.name == t.name) {
            return Err(Error::InvalidArgument(format!("tools: '{}' is defined twice", t.name)));
        }
        let p = parameters(t)?;
        schema::prepare(p).map_err(|e| tool_error(t, e))?;
    }
    Ok(())
}

pub(super) fn tool_error(t: &ToolSpec, e: String) -> Error {
    Error::InvalidArgument(format!("tools: '{}' parameters: {e}", t.name))
}

/// A tool's parameters schema (`{}` when none is given), an object schema.
fn parameters(t: &ToolSpec) -> Result<Value> {
    let text = t.parameters_json.trim();
    if text.is_empty() {
        return Ok(json!({"type": "object", "properties": {}}));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| tool_error(t, format!("not JSON: {e}")))?;
    match &v {
        Value::Object(m) if m.is_empty() => Ok(json!({"type": "object", "properties": {}})),
        Value::Object(m) if m.get("type").is_none_or(|ty| ty == "object") => Ok(v),
        _ => Err(tool_error(t, "must be a JSON Schema of type object".into())),
    }
}

/// The schema a call's arguments are held to: the tool's parameters with no
/// properties beyond its own unless it says so (as OpenAI's strict mode
/// reads a tool).
pub(super) fn call_parameters(t: &ToolSpec) -> Result<Value> {
    let mut v = parameters(t)?;
    if let Value::Object(m) = &mut v {
        m.entry("additionalProperties").or_insert(Value::Bool(false));
    }
    Ok(v)
}

/// `text` as a Lark atom: the token by id where the vocabulary has it as
/// one token (a control token cannot be spelled in text), else the literal text.
pub(super) fn special_or_text(tok: &Tokenizer, text: &str) -> String {
    match tok.token_id(text) {
        Some(id) if tok.token_piece(id) == text.as_bytes() => format!("<[{id}]>"),
        _ => lark_string(text),
    }
}

/// Rules being written.
#[derive(Default)]
struct Lark {
    rules: Vec<String>,
}

impl Lark {
    fn rule(&mut self, name: &str, body: &str) {
        self.rules.push(format!("{name}: {body}"));
    }
}

/// The properties of an object schema in order, with whether each is required.
fn properties<'a>(params: &'a Value, t: &ToolSpec) -> Result<Vec<(&'a String, &'a Value, bool)>> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    let props = params.get("properties").and_then(Value::as_object).unwrap_or_else(|| EMPTY.get_or_init(Map::new));
    let required: Vec<&str> = params
        .get("required")
        .and_then(Value::as_array)
        .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).collect());
    for r in &required {
        if !props.contains_key(*r) {
            return Err(tool_error(t, format!("required property '{r}' is not among the properties")));
        }
    }
    for k in params.as_object().into_iter().flat_map(|m| m.keys()) {
        if matches!(
            k.as_str(),
            "patternProperties" | "minProperties" | "maxProperties" | "anyOf" | "oneOf" | "allOf" | "$ref"
        ) {
            return Err(tool_error(
                t,
                format!("'{k}' at the top of the arguments is not supported in this model's call format"),
            ));
        }
    }
    Ok(props.iter().map(|(k, v)| (k, v, required.contains(&k.as_str()))).collect())
}

/// Whether a property is written as raw text (an unconstrained string).
fn is_plain_string(s: &Value) -> bool {
    let Some(m) = s.as_object() else { return false };
    m.get("type") == Some(&json!("string"))
        && !m.keys().any(|k| matches!(k.as_str(), "enum" | "const" | "pattern" | "minLength" | "maxLength" | "format"))
}

/// Whether a property is a set of strings written raw.
fn string_enum(s: &Value) -> Option<Vec<&str>> {
    let m = s.as_object()?;
    if let Some(c) = m.get("const") {
        return c.as_str().map(|c| vec![c]);
    }
    let e = m.get("enum")?.as_array()?;
    let all: Vec<&str> = e.iter().filter_map(Value::as_str).collect();
    (all.len() == e.len() && !all.is_empty()).then_some(all)
}

/// Qwen3.5's parameters, in the schema's order, required ones mandatory.
fn qwen_xml_params(g: &mut Lark, rule: &str, params: &Value, t: &ToolSpec) -> Result<String> {
    let mut seq = Vec::new();
    for (j, (name, s, required)) in properties(params, t)?.into_iter().enumerate() {
        let p = format!("{rule}_p{j}");
        let open = lark_string(&format!("<parameter={name}>"));
        let close = lark_string("</parameter>");
        let value = if is_plain_string(s) {
            // Raw text up to the closing tag (the tag itself is the stop).
            g.rule(&format!("{p}_v[stop={close}]"), "/(?s:.*)/");
            format!("{open} {p}_v nl")
        } else if let Some(options) = string_enum(s) {
            let alts: Vec<String> = options.iter().map(|o| lark_string(o)).collect();
            format!("{open} nl ({}) nl {close} nl", alts.join(" | "))
        } else {
            let sub = schema::prepare(s.clone()).map_err(|e| tool_error(t, e))?;
            format!("{open} nl %json {sub} nl {close} nl")
        };
        g.rule(&p, &value);
        seq.push(if required { p } else { format!("{p}?") });
    }
    Ok(if seq.is_empty() { "\"\"".into() } else { seq.join(" ") })
}

/// Gemma 4's argument syntax for a value of schema `s`: objects with bare
/// keys in sorted order, strings between `<|"|>` markers, numbers and
/// booleans as JSON.
fn gemma_value(g: &mut Lark, rule: &str, s: &Value, t: &ToolSpec, quote: &str, depth: usize) -> Result<String> {
    if depth > 16 {
        return Err(tool_error(t, "arguments nested deeper than 16".into()));
    }
    let ty = s.get("type").and_then(Value::as_str);
    if ty == Some("object") || (ty.is_none() && s.get("properties").is_some()) {
        let mut props = properties(s, t)?;
        props.sort_by(|a, b| a.0.cmp(b.0));
        if s.get("additionalProperties").is_some_and(|a| a != &json!(false)) && !props.is_empty() {
            return Err(tool_error(
                t,
                "'additionalProperties' beside properties is not supported in Gemma 4's call format".into(),
            ));
        }
        // first_i: items i.. with no comma before; next_i: with one.
        let n = props.len();
        let name = |k: &str, i: usize| format!("{rule}_{k}{i}");
        g.rule(&name("first", n), "\"\"");
        g.rule(&name("next", n), "\"\"");
        for (i, (key, sub, required)) in props.iter().enumerate().rev() {
            let v = gemma_value(g, &format!("{rule}_{i}"), sub, t, quote, depth + 1)?;
            let item = name("item", i);
            g.rule(&item, &format!("{} {v}", lark_string(&format!("{key}:"))));
            let (f1, n1) = (name("first", i + 1), name("next", i + 1));
            let (first, next) = if *required {
                (format!("{item} {n1}"), format!("\",\" {item} {n1}"))
            } else {
                (format!("{item} {n1} | {f1}"), format!("\",\" {item} {n1} | {n1}"))
            };
            g.rule(&name("first", i), &first);
            g.rule(&name("next", i), &next);
        }
        return Ok(format!("\"{{\" {} \"}}\"", name("first", 0)));
    }
    if ty == Some("array") {
        if s.get("minItems").is_some() || s.get("maxItems").is_some() || s.get("prefixItems").is_some() {
            return Err(tool_error(t, "array bounds are not supported in Gemma 4's call format".into()));
        }
        let item = gemma_value(g, &format!("{rule}_it"), s.get("items").unwrap_or(&json!({})), t, quote, depth + 1)?;
        let r = format!("{rule}_arr");
        g.rule(&r, &format!("\"[\" ({item} (\",\" {item})*)? \"]\""));
        return Ok(r);
    }
    if let Some(options) = string_enum(s) {
        let alts: Vec<String> = options.iter().map(|o| format!("{quote} {} {quote}", lark_string(o))).collect();
        return Ok(format!("({})", alts.join(" | ")));
    }
    if ty == Some("string") {
        if !is_plain_string(s) {
            return Err(tool_error(
                t,
                "string constraints (pattern, lengths, format) are not supported in Gemma 4's call format".into(),
            ));
        }
        let r = format!("{rule}_s");
        // Text between the quote markers: anything where the marker is one
        // control token (text cannot spell it), else text without its first character.
        let text = if quote.starts_with("<[") { "/(?s:.*)/" } else { "/[^<]*/" };
        g.rule(&r, &format!("{quote} {text} {quote}"));
        return Ok(r);
    }
    if matches!(ty, Some("integer" | "number" | "boolean" | "null")) {
        let sub = schema::prepare(s.clone()).map_err(|e| tool_error(t, e))?;
        return Ok(format!("%json {sub}"));
    }
    Err(tool_error(t, format!("a value of schema {s} is not supported in Gemma 4's call format")))
}

// ---- parsing ---------------------------------------------------------------

/// Read the calls out of an answer in `format`: the text outside the calls
/// (a malformed call stays in it), and the calls in order. `tools` types
/// Qwen3.5's raw parameter values (a string parameter stays text; others are
/// read as JSON where they parse). Harmony: the kept text is the answer's
/// (`final` and preamble messages, and messages that did not read); its
/// thinking is in [`parse_harmony`](super::parse_harmony)'s output.
pub fn parse_tool_calls(format: ToolFormat, text: &str, tools: &[ToolSpec]) -> (String, Vec<ParsedCall>) {
    if format == ToolFormat::Harmony {
        let out = harmony::parse_harmony(text);
        return (out.text, out.calls);
    }
    match format.markers() {
        Some((open, close)) => {
            let mut rest = text;
            let mut kept = String::new();
            let mut calls = Vec::new();
            while let Some(at) = rest.find(open) {
                kept.push_str(&rest[..at]);
                let after = &rest[at + open.len()..];
                let (body, next) = match after.find(close) {
                    Some(end) => (&after[..end], &after[end + close.len()..]),
                    None => (after, ""),
                };
                match parse_body(format, body, tools) {
                    Some(call) => calls.push(call),
                    None => {
                        let whole = &rest[at..rest.len() - next.len()];
                        kept.push_str(whole);
                    }
                }
                rest = next;
            }
            kept.push_str(rest);
            (kept, calls)
        }
        None => match parse_json_call(format, text.trim()) {
            Some(call) => (String::new(), vec![call]),
            None => (text.to_string(), Vec::new()),
        },
    }
}

fn parse_body(format: ToolFormat, body: &str, tools: &[ToolSpec]) -> Option<ParsedCall> {
    match format {
        ToolFormat::Qwen35Xml => {
            parse_qwen_xml(body, tools).or_else(|| parse_json_call(ToolFormat::Hermes, body.trim()))
        }
        ToolFormat::Hermes => parse_json_call(format, body.trim()),
        ToolFormat::Gemma4 => parse_gemma(body),
        ToolFormat::Llama3 | ToolFormat::GenericJson | ToolFormat::Harmony => parse_json_call(format, body.trim()),
    }
}

/// `{"name": ..., "arguments"|"parameters": {...}}`.
fn parse_json_call(format: ToolFormat, text: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(text).ok()?;
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_string();
    let args = o.get(format.arguments_key()).or_else(|| o.get("arguments")).or_else(|| o.get("parameters"));
    let arguments = match args {
        None => json!({}),
        Some(Value::Object(m)) => Value::Object(m.clone()),
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Value::Object(m),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments })
}

/// `<function=NAME><parameter=K>value</parameter>…</function>`.
fn parse_qwen_xml(body: &str, tools: &[ToolSpec]) -> Option<ParsedCall> {
    let body = body.trim();
    let rest = body.strip_prefix("<function=")?;
    let end = rest.find('>')?;
    let name = rest[..end].trim().to_string();
    if name.is_empty() || name.contains('<') {
        return None;
    }
    let mut rest = &rest[end + 1..];
    let close = rest.rfind("</function>")?;
    if !rest[close + "</function>".len()..].trim().is_empty() {
        return None;
    }
    rest = &rest[..close];
    let schema = tools.iter().find(|t| t.name == name).and_then(|t| parameters(t).ok());
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let end = r.find('>')?;
        let key = r[..end].trim().to_string();
        let r = &r[end + 1..];
        let vend = r.find("</parameter>")?;
        let raw = r[..vend].strip_prefix('\n').unwrap_or(&r[..vend]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let prop = schema.as_ref().and_then(|s| s.get("properties")).and_then(|p| p.get(&key));
        let value = if prop.is_some_and(|p| p.get("type") == Some(&json!("string"))) {
            match serde_json::from_str::<Value>(raw.trim()) {
                // A constrained string is written as JSON text.
                Ok(Value::String(s)) if prop.is_some_and(|p| !is_plain_string(p)) => Value::String(s),
                _ => Value::String(raw.to_string()),
            }
        } else {
            serde_json::from_str::<Value>(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_string()))
        };
        args.insert(key, value);
        rest = &r[vend + "</parameter>".len()..];
    }
    Some(ParsedCall { name, arguments: Value::Object(args) })
}

/// `call:NAME{key:value,…}` in Gemma 4's syntax.
fn parse_gemma(body: &str) -> Option<ParsedCall> {
    let rest = body.trim().strip_prefix("call:")?;
    let brace = rest.find('{')?;
    let name = rest[..brace].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let mut p = GemmaParser { s: &rest.as_bytes()[brace..], i: 0, depth: 0 };
    let arguments = p.value()?;
    p.skip_ws();
    if p.i != p.s.len() || !arguments.is_object() {
        return None;
    }
    Some(ParsedCall { name, arguments })
}

struct GemmaParser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

const GEMMA_QUOTE: &[u8] = b"<|\"|>";

impl GemmaParser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn quoted(&mut self) -> Option<String> {
        let start = self.i + GEMMA_QUOTE.len();
        let len = self.s.get(start..)?.windows(GEMMA_QUOTE.len()).position(|w| w == GEMMA_QUOTE)?;
        self.i = start + len + GEMMA_QUOTE.len();
        String::from_utf8(self.s[start..start + len].to_vec()).ok()
    }

    fn value(&mut self) -> Option<Value> {
        self.depth += 1;
        if self.depth > 64 {
            return None;
        }
        self.skip_ws();
        let v = if self.s[self.i..].starts_with(GEMMA_QUOTE) {
            Value::String(self.quoted()?)
        } else if self.eat(b'{') {
            let mut m = Map::new();
            if !self.eat(b'}') {
                loop {
                    self.skip_ws();
                    let key = if self.s[self.i..].starts_with(GEMMA_QUOTE) {
                        self.quoted()?
                    } else {
                        let start = self.i;
                        while self.i < self.s.len() && self.s[self.i] != b':' && self.s[self.i] != b'}' {
                            self.i += 1;
                        }
                        String::from_utf8(self.s[start..self.i].to_vec()).ok()?.trim().to_string()
                    };
                    if key.is_empty() || !self.eat(b':') {
                        return None;
                    }
                    m.insert(key, self.value()?);
                    if self.eat(b'}') {
                        break;
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            Value::Object(m)
        } else if self.eat(b'[') {
            let mut a = Vec::new();
            if !self.eat(b']') {
                loop {
                    a.push(self.value()?);
                    if self.eat(b']') {
                        break;
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            Value::Array(a)
        } else {
            // A JSON scalar: up to the next delimiter.
            let start = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b',' | b'}' | b']') {
                self.i += 1;
            }
            let text = std::str::from_utf8(&self.s[start..self.i]).ok()?.trim();
            match serde_json::from_str::<Value>(text) {
                Ok(v) if !v.is_object() && !v.is_array() => v,
                _ => return None,
            }
        };
        self.depth -= 1;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec::new(
            "get_stock_price",
            "Price",
            r#"{"type":"object","properties":{"ticker":{"type":"string"},"count":{"type":"integer"}},"required":["ticker"]}"#,
        )]
    }

    #[test]
    fn qwen_xml_calls_keep_text_before_them() {
        let text = "Let me look.\n<tool_call>\n<function=get_stock_price>\n<parameter=ticker>\nNVDA\n</parameter>\n<parameter=count>\n3\n</parameter>\n</function>\n</tool_call>";
        let (kept, calls) = parse_tool_calls(ToolFormat::Qwen35Xml, text, &tools());
        assert_eq!(kept, "Let me look.\n");
        assert_eq!(
            calls,
            vec![ParsedCall { name: "get_stock_price".into(), arguments: json!({"ticker": "NVDA", "count": 3}) }]
        );
        // The JSON form inside the same markers.
        let json_form =
            "<tool_call>\n{\"name\": \"get_stock_price\", \"arguments\": {\"ticker\": \"AMD\"}}\n</tool_call>";
        let (_, calls) = parse_tool_calls(ToolFormat::Qwen35Xml, json_form, &tools());
        assert_eq!(calls[0].arguments, json!({"ticker": "AMD"}));
    }

    #[test]
    fn malformed_calls_stay_text() {
        let text = "a <tool_call>\n<function=x>\n<parameter=y>oops</function>\n</tool_call> b";
        let (kept, calls) = parse_tool_calls(ToolFormat::Qwen35Xml, text, &tools());
        assert!(calls.is_empty());
        assert_eq!(kept, text);
        let (kept, calls) = parse_tool_calls(ToolFormat::Hermes, "<tool_call>{\"name\": 3}", &[]);
        assert!(calls.is_empty());
        assert_eq!(kept, "<tool_call>{\"name\": 3}");
    }

    #[test]
    fn gemma_calls() {
        let text =
            "<|tool_call>call:get_stock_price{count:2,ticker:<|\"|>NV,DA<|\"|>,x:{a:[1,<|\"|>b<|\"|>]}}<tool_call|>";
        let (kept, calls) = parse_tool_calls(ToolFormat::Gemma4, text, &[]);
        assert_eq!(kept, "");
        assert_eq!(calls[0].arguments, json!({"count": 2, "ticker": "NV,DA", "x": {"a": [1, "b"]}}));
    }

    #[test]
    fn json_calls() {
        let (_, calls) = parse_tool_calls(ToolFormat::Llama3, " {\"name\": \"f\", \"parameters\": {\"a\": 1}}", &[]);
        assert_eq!(calls[0], ParsedCall { name: "f".into(), arguments: json!({"a": 1}) });
        let (kept, calls) = parse_tool_calls(ToolFormat::GenericJson, "Paris.", &[]);
        assert_eq!((kept.as_str(), calls.len()), ("Paris.", 0));
    }

    #[test]
    fn formats_are_detected_from_the_fixture_templates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/templates");
        let dir = std::env::var("POCKET_FIXTURES").map(|f| std::path::Path::new(&f).join("templates")).unwrap_or(dir);
        for (file, want) in [
            ("Qwen3.5-4B.jinja", ToolFormat::Qwen35Xml),
            ("Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes),
            ("google-gemma-4-31B-it.jinja", ToolFormat::Gemma4),
            ("meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::Llama3),
            ("google-gemma-2-2b-it.jinja", ToolFormat::GenericJson),
            ("openai-gpt-oss-120b.jinja", ToolFormat::Harmony),
        ] {
            let src = std::fs::read_to_string(dir.join(file)).expect("fixture template");
            assert_eq!(ToolFormat::detect(&src), want, "{file}");
        }
    }
}
