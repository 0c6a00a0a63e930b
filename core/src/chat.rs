//! Chat templates: the model's `tokenizer.chat_template` (Jinja) rendered with
//! minijinja as Hugging Face renders it (jinja2 sandbox, `trim_blocks`,
//! `lstrip_blocks`, HF's `tojson`, `raise_exception`, `strftime_now`, Python
//! string/dict methods). A file without a template gets its architecture's
//! own turn format ([`fallback_for`]). The clock `strftime_now` reads is
//! `SOURCE_DATE_EPOCH` where set (reproducible prompts), else the system's.
//!
//! Templates come from files and are untrusted: there is no loader (no
//! `include` reaches the file system), no network, and rendering is bounded
//! in instructions (fuel), recursion depth and output size.

mod hf;

use std::io;

use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior, Value};
use serde_json::{Map, Value as Json};

use crate::gguf::{Arch, GgufFile, Key};
use crate::structured::ToolCall;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// ChatML: the Qwen family's turns, and the fallback of last resort.
pub const CHATML: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + \
message['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' \
}}{%- endif %}";

/// Gemma's turns: `user` and `model`, a system message folded into the
/// first user turn (Gemma has no system role).
pub const GEMMA_TURNS: &str = "{{- bos_token }}{%- if messages and messages[0]['role'] == 'system' %}\
{%- set prefix = messages[0]['content'] + '\n\n' %}{%- set turns = messages[1:] %}{%- else %}{%- set prefix = '' %}\
{%- set turns = messages %}{%- endif %}{%- for message in turns %}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}\
{{- '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}\
{%- endfor %}{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}";

/// Gemma 4's turns (`<|turn>user ... <turn|>`), a system turn of its own.
pub const GEMMA4_TURNS: &str = "{{- bos_token }}{%- for message in messages %}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}\
{{- '<|turn>' + role + '\n' + message['content'] | trim + '<turn|>\n' }}\
{%- endfor %}{%- if add_generation_prompt %}{{- '<|turn>model\n' }}{%- endif %}";

/// Llama 3's header turns.
pub const LLAMA3_HEADERS: &str = "{{- bos_token }}{%- for message in messages %}\
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}\
{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";

/// Llama 2 / Mistral instruction turns (`[INST] ... [/INST]`), a system
/// message folded into the first instruction.
pub const INST_TURNS: &str = "{{- bos_token }}{%- if messages and messages[0]['role'] == 'system' %}\
{%- set prefix = messages[0]['content'] + '\n\n' %}{%- set turns = messages[1:] %}{%- else %}{%- set prefix = '' %}\
{%- set turns = messages %}{%- endif %}{%- for message in turns %}{%- if message['role'] == 'assistant' %}\
{{- ' ' + message['content'] | trim + eos_token }}{%- else %}\
{{- '[INST] ' + (prefix if loop.first else '') + message['content'] | trim + ' [/INST]' }}{%- endif %}{%- endfor %}";

/// The turn format of a file without a template: its architecture's own
/// (Gemma's turns for gemma3 and gemma4, Llama 3's headers where a Llama vocabulary has
/// them, else the Llama 2 / Mistral instruction format), ChatML for the Qwen
/// family and anything else.
pub fn fallback_for(g: &GgufFile, tok: &Tokenizer) -> &'static str {
    let arch = g.architecture().ok().flatten().and_then(Arch::from_name);
    match arch {
        Some(Arch::Gemma3) => GEMMA_TURNS,
        Some(Arch::Gemma4) => GEMMA4_TURNS,
        Some(Arch::Llama) if tok.token_id("<|start_header_id|>").is_some() && tok.token_id("<|eot_id|>").is_some() => {
            LLAMA3_HEADERS
        }
        Some(Arch::Llama) => INST_TURNS,
        _ => CHATML,
    }
}

/// Rendering stops after this many VM instructions.
const FUEL: u64 = 50_000_000;
/// Macro and include nesting limit.
const RECURSION_LIMIT: usize = 100;
/// A rendered prompt larger than this is an error.
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation: `system`, `user`, `assistant` (with the
/// tool calls it made) or `tool` (a call's result, naming the call's id).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls.
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call.
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), ..Default::default() }
    }

    /// The message as a template reads it (transformers' shape: calls as
    /// `{id, type: function, function: {name, arguments: {...}}}`).
    pub fn to_json(&self) -> Json {
        let mut o = Map::new();
        o.insert("role".into(), Json::String(self.role.clone()));
        o.insert("content".into(), Json::String(self.content.clone()));
        if !self.tool_calls.is_empty() {
            let calls = self
                .tool_calls
                .iter()
                .map(|c| {
                    let args = serde_json::from_str::<Json>(&c.arguments_json).unwrap_or(Json::Object(Map::new()));
                    serde_json::json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
                })
                .collect();
            o.insert("tool_calls".into(), Json::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            o.insert("tool_call_id".into(), Json::String(id.clone()));
        }
        Json::Object(o)
    }
}

/// A compiled chat template with the model's BOS and EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bytes", &self.source.len()).field("bos", &self.bos).finish()
    }
}

impl ChatTemplate {
    /// The template of a GGUF file (its architecture's turn format when it
    /// has none, see [`fallback_for`]), with BOS/EOS texts from its vocabulary.
    pub fn from_gguf(g: &GgufFile) -> Result<ChatTemplate> {
        Self::for_model(g, &Tokenizer::from_gguf(g)?)
    }

    /// As [`from_gguf`](Self::from_gguf) with the file's tokenizer already loaded.
    pub fn for_model(g: &GgufFile, tok: &Tokenizer) -> Result<ChatTemplate> {
        let source = match g.get_str(Key::TokenizerChatTemplate.name())? {
            Some(s) => s,
            None => fallback_for(g, tok),
        };
        Self::with_texts_of(source, tok)
    }

    /// Compile `source` with the BOS/EOS texts of `tok`'s vocabulary.
    pub fn with_texts_of(source: &str, tok: &Tokenizer) -> Result<ChatTemplate> {
        let text = |id: Option<u32>| id.map(|i| String::from_utf8_lossy(tok.token_piece(i)).into_owned());
        Self::from_source(source, &text(tok.bos()).unwrap_or_default(), &text(tok.eos()).unwrap_or_default())
    }

    /// Compile a template given as Jinja source.
    pub fn from_source(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(hf::formatter);
        env.add_filter("tojson", hf::tojson);
        env.add_filter("string", |v: Value| Value::from(hf::py_str(&v)));
        env.add_function("strftime_now", hf::strftime_now);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
        });
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(template_error)?;
        Ok(ChatTemplate { env, source: source.to_string(), bos: bos.to_string(), eos: eos.to_string() })
    }

    /// Fix the clock `strftime_now` reads for this template (seconds since
    /// the epoch, UTC); `None` goes back to `SOURCE_DATE_EPOCH`, else the
    /// system clock ([`hf::now`]).
    pub fn set_clock(&mut self, unix: Option<i64>) {
        match unix {
            Some(t) => self.env.add_function("strftime_now", move |format: String| {
                Ok::<_, minijinja::Error>(Value::from(hf::strftime(&format, t)))
            }),
            None => self.env.add_function("strftime_now", hf::strftime_now),
        }
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` and `eos_token` texts the template sees.
    pub fn special_texts(&self) -> (&str, &str) {
        (&self.bos, &self.eos)
    }

    /// Render plain text messages. `extra` adds or overrides template
    /// variables (`tools`, `enable_thinking`, `date_string`, ...).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &[(String, Json)],
    ) -> Result<String> {
        let msgs: Vec<Json> = messages.iter().map(ChatMessage::to_json).collect();
        self.render_json(&Json::Array(msgs), add_generation_prompt, extra)
    }

    /// Render messages given as JSON (an array of objects with `role`,
    /// `content` and any other fields the template reads: `tool_calls`,
    /// `reasoning_content`, `name`, ...).
    pub fn render_json(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
        extra: &[(String, Json)],
    ) -> Result<String> {
        if !messages.is_array() {
            return Err(Error::InvalidArgument("chat messages must be a JSON array".into()));
        }
        // The variables transformers passes: tools and documents are defined
        // (as none) even when absent.
        let mut ctx = Map::new();
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("tools".into(), Json::Null);
        ctx.insert("documents".into(), Json::Null);
        ctx.insert("add_generation_prompt".into(), Json::Bool(add_generation_prompt));
        ctx.insert("bos_token".into(), Json::String(self.bos.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos.clone()));
        for (k, v) in extra {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        let mut out = CappedWriter { buf: Vec::new(), cap: MAX_OUTPUT_BYTES };
        match tmpl.render_captured_to(Value::from_serialize(&ctx), &mut out) {
            Ok(_) => String::from_utf8(out.buf).map_err(|_| Error::Template { reason: "output is not UTF-8".into() }),
            Err(e) if e.kind() == ErrorKind::WriteFailure => {
                Err(Error::Template { reason: format!("output exceeds {MAX_OUTPUT_BYTES} bytes") })
            }
            Err(e) => Err(template_error(e)),
        }
    }
}

/// The message of a `raise_exception` call, carried as the error's source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A minijinja error as ours: the template's own exception keeps its message.
fn template_error(e: minijinja::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Error::TemplateRaised(r.0.clone());
        }
        source = s.source();
    }
    Error::Template { reason: e.to_string() }
}

/// Collects output and fails once it passes `cap` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            return Err(io::Error::other("chat template output too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
