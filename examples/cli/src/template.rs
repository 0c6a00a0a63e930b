//! `pocket template`: render a chat template, byte for byte, to stdout.

use std::io::Write;

use pocket_core::chat::ChatTemplate;
use pocket_core::gguf::GgufFile;
use serde_json::Value;

use crate::args::{Args, Spec};

const HELP: &str = "\
usage: pocket template (--model FILE | --template FILE.jinja [--bos TEXT] [--eos TEXT])
                       --messages JSON [--add-generation-prompt] [--var KEY=VALUE ...]

Renders the chat prompt exactly (no newline is added). With --model the
template, BOS and EOS come from the GGUF file (ChatML when it has no template).

options:
  --messages JSON            the messages: a JSON array of {\"role\": ..., \"content\": ...}
                             (more fields such as tool_calls are passed through);
                             @PATH reads the JSON from a file
  --add-generation-prompt    end with the assistant's turn header
  --var KEY=VALUE            a template variable; VALUE is parsed as JSON when it is
                             valid JSON (true, 3, [..], {..}), else taken as a string;
                             repeatable (e.g. --var enable_thinking=false --var tools=@t.json)
  --bos TEXT, --eos TEXT     the bos_token / eos_token texts (default empty; with
                             --model they override the file's)
";

const SPEC: Spec = Spec {
    values: &["--model", "-m", "--template", "--bos", "--eos", "--messages", "--var"],
    switches: &["--add-generation-prompt", "--help", "-h"],
};

pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &SPEC)?;
    if a.switch("--help") || a.switch("-h") {
        print!("{HELP}");
        return Ok(());
    }
    if let Some(extra) = a.positional().first() {
        return Err(format!("unexpected argument '{extra}' (see `pocket template --help`)"));
    }
    let template = match (a.value("--model").or(a.value("-m")), a.value("--template")) {
        (Some(_), Some(_)) => return Err("give either --model or --template, not both".into()),
        (None, None) => return Err("--model or --template is required (see `pocket template --help`)".into()),
        (Some(model), None) => {
            let g = GgufFile::open(model).map_err(|e| format!("{model}: {e}"))?;
            let t = ChatTemplate::from_gguf(&g).map_err(|e| format!("{model}: {e}"))?;
            if a.value("--bos").is_some() || a.value("--eos").is_some() {
                let (bos, eos) = t.special_texts();
                ChatTemplate::from_source(t.source(), a.value("--bos").unwrap_or(bos), a.value("--eos").unwrap_or(eos))
                    .map_err(|e| e.to_string())?
            } else {
                t
            }
        }
        (None, Some(path)) => {
            let src = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            ChatTemplate::from_source(&src, a.value("--bos").unwrap_or(""), a.value("--eos").unwrap_or(""))
                .map_err(|e| format!("{path}: {e}"))?
        }
    };
    let messages = json_arg("--messages", a.required("--messages")?)?;
    let mut extra = Vec::new();
    for var in a.values("--var") {
        let (k, v) = var.split_once('=').ok_or_else(|| format!("--var {var}: expected KEY=VALUE"))?;
        if k.is_empty() {
            return Err(format!("--var {var}: empty name"));
        }
        let value = if v.starts_with('@') {
            json_arg("--var", v)?
        } else {
            serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
        };
        extra.push((k.to_string(), value));
    }
    let out =
        template.render_json(&messages, a.switch("--add-generation-prompt"), &extra).map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).and_then(|_| stdout.flush()).map_err(|e| format!("stdout: {e}"))
}

/// JSON given inline or as `@PATH`.
fn json_arg(flag: &str, arg: &str) -> Result<Value, String> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{flag} {arg}: {e}"))?,
        None => arg.to_string(),
    };
    serde_json::from_str(&text).map_err(|e| format!("{flag}: invalid JSON: {e}"))
}
