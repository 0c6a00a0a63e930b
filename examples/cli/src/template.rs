//! `pocket template`: render a chat template, byte for byte, to stdout.

use std::io::Write;

use clap::ArgGroup;
use pocket_core::chat::ChatTemplate;
use pocket_core::gguf::GgufFile;
use pocket_core::structured::ToolFormat;
use serde_json::Value;

/// Render a chat prompt exactly (no newline is added)
#[derive(clap::Args)]
#[command(group(ArgGroup::new("source").required(true).args(["model", "template"])))]
pub struct Args {
    /// Take the template, BOS and EOS from this GGUF file
    #[arg(long, short = 'm', value_name = "FILE")]
    model: Option<String>,
    /// Take the template from this Jinja file
    #[arg(long, value_name = "FILE.jinja")]
    template: Option<String>,
    /// The messages: a JSON array of {"role": ..., "content": ...} (more fields pass through); @PATH reads a file
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    messages: Value,
    /// End with the assistant's turn header
    #[arg(long)]
    add_generation_prompt: bool,
    /// A template variable, repeatable; VALUE is JSON when it parses as JSON, else a string; @PATH reads JSON
    #[arg(long, value_name = "KEY=VALUE", value_parser = var_arg)]
    var: Vec<(String, Value)>,
    /// The bos_token text [default: empty, or the file's with --model]
    #[arg(long, value_name = "TEXT")]
    bos: Option<String>,
    /// The eos_token text [default: empty, or the file's with --model]
    #[arg(long, value_name = "TEXT")]
    eos: Option<String>,
    /// Tools for the template's `tools` variable: a JSON array of {name, description, parameters} (a file)
    #[arg(long, value_name = "FILE")]
    tools: Option<String>,
}

pub fn run(a: Args) -> Result<(), String> {
    let template = match (&a.model, &a.template) {
        (Some(model), _) => {
            let g = GgufFile::open(model).map_err(|e| format!("{model}: {e}"))?;
            let t = ChatTemplate::from_gguf(&g).map_err(|e| format!("{model}: {e}"))?;
            if a.bos.is_some() || a.eos.is_some() {
                let (bos, eos) = t.special_texts();
                ChatTemplate::from_source(t.source(), a.bos.as_deref().unwrap_or(bos), a.eos.as_deref().unwrap_or(eos))
                    .map_err(|e| e.to_string())?
            } else {
                t
            }
        }
        (None, Some(path)) => {
            let src = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            ChatTemplate::from_source(&src, a.bos.as_deref().unwrap_or(""), a.eos.as_deref().unwrap_or(""))
                .map_err(|e| format!("{path}: {e}"))?
        }
        // clap's argument group already refuses this; kept so no input panics.
        (None, None) => return Err("give --model or --template".into()),
    };
    let mut vars = a.var;
    if let Some(path) = &a.tools {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let specs = crate::structure::parse_tools(&text)?;
        pocket_core::structured::validate_tools(&specs).map_err(|e| e.to_string())?;
        let tools = ToolFormat::template_tools(&specs).map_err(|e| e.to_string())?;
        vars.retain(|(k, _)| k != "tools");
        vars.push(("tools".into(), tools));
    }
    let out = template.render_json(&a.messages, a.add_generation_prompt, &vars).map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout().lock();
    crate::out::check(stdout.write_all(out.as_bytes()).and_then(|_| stdout.flush()))
}

/// JSON given inline or as `@PATH` (`--messages`, and `--var` values that
/// start with `@`).
fn json_arg(arg: &str) -> Result<Value, String> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?,
        None => arg.to_string(),
    };
    serde_json::from_str(&text).map_err(|e| format!("invalid JSON: {e}"))
}

/// One `--var KEY=VALUE`: VALUE as JSON when it parses as JSON (true, 3,
/// [..], {..}), else as a string; `@PATH` must hold JSON.
fn var_arg(var: &str) -> Result<(String, Value), String> {
    let (k, v) = var.split_once('=').ok_or("expected KEY=VALUE")?;
    if k.is_empty() {
        return Err("empty name".into());
    }
    let value = if v.starts_with('@') {
        json_arg(v)?
    } else {
        serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
    };
    Ok((k.to_string(), value))
}
