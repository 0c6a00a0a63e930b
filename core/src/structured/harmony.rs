//! gpt-oss's "harmony" format: an answer is a run of messages, each a
//! header and a body,
//!
//! ```text
//! <|channel|>analysis<|message|>THOUGHT<|end|><|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//! <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>
//! ```
//!
//! The header names the channel (`analysis`: thinking; `final`: the answer;
//! `commentary`: a preamble the user sees, or a tool call), may name a
//! recipient (`to=functions.NAME`, before or after the channel: the
//! template renders ` to=functions.NAME<|channel|>commentary json`, the
//! model usually writes `<|channel|>commentary to=functions.NAME
//! <|constrain|>json`) and a content type. `<|end|>` closes a message,
//! `<|return|>` the answer, `<|call|>` a call (both end generation).
//!
//! Here: reading a whole answer back ([`parse_harmony`]) and the Lark
//! grammar of a message's header, with the call's arguments held to the
//! tool's schema ([`header_grammar`]). The streaming side is `harmony_turn.rs`.

use serde_json::Value;

use super::tools::{call_parameters, special_or_text, tool_error, ParsedCall};
use super::{lark_string, schema, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub(crate) const START: &str = "<|start|>";
pub(crate) const CHANNEL: &str = "<|channel|>";
pub(crate) const MESSAGE: &str = "<|message|>";
pub(crate) const END: &str = "<|end|>";
pub(crate) const RETURN: &str = "<|return|>";
pub(crate) const CALL: &str = "<|call|>";
pub(crate) const CONSTRAIN: &str = "<|constrain|>";

/// The markers that close a message's body.
pub(crate) const BODY_ENDS: [&str; 3] = [END, RETURN, CALL];

/// A header longer than this is not one (model output is untrusted).
pub(crate) const MAX_HEADER: usize = 512;

/// Whether a template writes harmony (gpt-oss).
pub fn is_harmony_template(template: &str) -> bool {
    template.contains("<|channel|>") && template.contains("<|message|>") && template.contains("<|start|>")
}

/// A message's header, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// `assistant` where the header names its author.
    pub role: String,
    pub channel: String,
    /// `functions.NAME` for a call.
    pub recipient: Option<String>,
    /// `json` (after `<|constrain|>` or bare).
    pub content_type: Option<String>,
}

impl Header {
    /// The header between a message's start and `<|message|>` (a leading
    /// `<|start|>` and whitespace allowed); none when it is not a header:
    /// no channel (harmony requires one), markers inside, too long.
    pub fn parse(text: &str) -> Option<Header> {
        let text = text.trim_start();
        let text = text.strip_prefix(START).unwrap_or(text);
        if text.len() > MAX_HEADER
            || [START, MESSAGE, END, RETURN, CALL].iter().any(|m| text.contains(m))
            || text.matches(CHANNEL).count() != 1
        {
            return None;
        }
        let (role_part, channel_part) = text.split_once(CHANNEL)?;
        let words = |s: &str| -> Vec<String> {
            s.replace(CONSTRAIN, " ").split_whitespace().map(str::to_string).collect::<Vec<_>>()
        };
        let mut h = Header::default();
        for w in words(role_part) {
            match w.strip_prefix("to=") {
                Some(r) => h.recipient = Some(r.to_string()),
                None if h.role.is_empty() => h.role = w,
                None => return None,
            }
        }
        let mut rest = words(channel_part).into_iter();
        h.channel = rest.next().filter(|c| c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_'))?;
        for w in rest {
            match w.strip_prefix("to=") {
                Some(r) => h.recipient = Some(r.to_string()),
                None if h.content_type.is_none() => h.content_type = Some(w),
                None => return None,
            }
        }
        Some(h)
    }

    /// The tool a call message is for (`to=functions.NAME`).
    pub fn function(&self) -> Option<&str> {
        self.recipient.as_deref()?.strip_prefix("functions.").filter(|n| !n.is_empty())
    }
}

/// What an answer in harmony holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HarmonyOutput {
    /// The `analysis` messages' bodies.
    pub reasoning: String,
    /// The `final` and `commentary` (preamble) bodies, and every message
    /// that did not read as one (kept whole, never dropped).
    pub text: String,
    /// Messages to `functions.NAME` whose body is a JSON object.
    pub calls: Vec<ParsedCall>,
}

/// Read a whole answer (the text after the prompt's `<|start|>assistant`).
/// Bodies of one channel in a row are joined by a blank line.
pub fn parse_harmony(text: &str) -> HarmonyOutput {
    let mut out = HarmonyOutput::default();
    let mut rest = text;
    while !rest.is_empty() {
        let Some(m) = rest.find(MESSAGE) else {
            // Text after the messages (whitespace between them is not the answer's).
            if rest.len() == text.len() || !rest.trim().is_empty() {
                out.text.push_str(rest);
            }
            break;
        };
        let Some(header) = Header::parse(&rest[..m]) else {
            out.text.push_str(rest);
            break;
        };
        let body_and_after = &rest[m + MESSAGE.len()..];
        let (body, whole_len) = match earliest(body_and_after, &BODY_ENDS) {
            Some((at, marker)) => (&body_and_after[..at], m + MESSAGE.len() + at + marker.len()),
            None => (body_and_after, rest.len()),
        };
        let whole = &rest[..whole_len];
        if header.recipient.is_some() {
            match header.function().and_then(|name| call_from(name, body)) {
                Some(call) => out.calls.push(call),
                None => join(&mut out.text, whole.trim_start()),
            }
        } else if header.channel == "analysis" {
            join(&mut out.reasoning, body);
        } else {
            join(&mut out.text, body);
        }
        rest = &rest[whole_len..];
    }
    out
}

fn join(to: &mut String, piece: &str) {
    if piece.is_empty() {
        return;
    }
    if !to.is_empty() {
        to.push_str("\n\n");
    }
    to.push_str(piece);
}

/// A call's arguments: a JSON object (or a JSON string holding one).
fn call_from(name: &str, body: &str) -> Option<ParsedCall> {
    let arguments = match serde_json::from_str::<Value>(body.trim()).ok()? {
        v @ Value::Object(_) => v,
        Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object)?,
        _ => return None,
    };
    Some(ParsedCall { name: name.to_string(), arguments })
}

/// The first of `markers` in `text`: where, and which.
pub(crate) fn earliest<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers.iter().filter_map(|m| text.find(m).map(|at| (at, *m))).min_by_key(|(at, _)| *at)
}

/// Which messages a header grammar allows.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Allowed {
    /// After `<|end|>`: the header opens with `<|start|>assistant`.
    pub after_end: bool,
    pub analysis: bool,
    /// A `commentary` message to the user.
    pub preamble: bool,
    /// The answer (its body is the request's constraint, or free).
    pub final_: bool,
}

/// The header markers as Lark atoms: tokens where the vocabulary has them
/// as one, else text.
#[derive(Clone, Debug)]
pub(crate) struct Atoms {
    start: String,
    channel: String,
    message: String,
    constrain: String,
}

impl Atoms {
    pub(crate) fn of(tok: &Tokenizer) -> Atoms {
        Atoms {
            start: special_or_text(tok, START),
            channel: special_or_text(tok, CHANNEL),
            message: special_or_text(tok, MESSAGE),
            constrain: special_or_text(tok, CONSTRAIN),
        }
    }
}

/// The Lark grammar of one message's header: the allowed plain headers up
/// to `<|message|>`, and for each tool a call header in either of its
/// forms followed by arguments valid against the tool's schema.
pub(crate) fn header_grammar(tools: &[&ToolSpec], atoms: &Atoms, allowed: Allowed) -> Result<String> {
    let (ch, msg) = (&atoms.channel, &atoms.message);
    let content_type = format!("(\" \" {}? \"json\")?", atoms.constrain);
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    if allowed.analysis {
        alts.push(format!("{ch} \"analysis\" {msg}"));
    }
    if allowed.preamble {
        alts.push(format!("{ch} \"commentary\" {msg}"));
    }
    if allowed.final_ {
        alts.push(format!("{ch} \"final\" {content_type} {msg}"));
    }
    for (i, t) in tools.iter().enumerate() {
        let params = schema::prepare(call_parameters(t)?).map_err(|e| tool_error(t, e))?;
        let to = lark_string(&format!(" to=functions.{}", t.name));
        let in_channel = format!("{ch} \"commentary\" {to} {content_type}");
        let in_role = format!("{to} {ch} \"commentary\" {content_type}");
        rules.push(format!("call_{i}: ({in_channel} | {in_role}) {msg} %json {params}"));
        alts.push(format!("call_{i}"));
    }
    if alts.is_empty() {
        return Err(Error::InvalidArgument("tools: no message the answer may write".into()));
    }
    let prefix = if allowed.after_end { format!("{} \"assistant\" ", atoms.start) } else { String::new() };
    rules.insert(0, format!("start: {prefix}({})", alts.join(" | ")));
    Ok(rules.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn headers_in_both_forms() {
        let h = Header::parse("<|channel|>commentary to=functions.get_weather <|constrain|>json").unwrap();
        assert_eq!(
            (h.channel.as_str(), h.function(), h.content_type.as_deref()),
            ("commentary", Some("get_weather"), Some("json"))
        );
        let h = Header::parse("<|start|>assistant to=functions.calculate<|channel|>commentary json").unwrap();
        assert_eq!((h.role.as_str(), h.function()), ("assistant", Some("calculate")));
        assert_eq!(Header::parse(" to=functions.f<|channel|>commentary").unwrap().function(), Some("f"));
        assert_eq!(Header::parse("<|channel|>final").unwrap().recipient, None);
        for bad in
            ["assistant", "<|channel|>", "<|channel|>a<|channel|>b", "x y<|channel|>final", "<|end|><|channel|>final"]
        {
            assert_eq!(Header::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn thought_answer_and_calls() {
        let out = parse_harmony(
            "<|channel|>analysis<|message|>Need price.<|end|><|start|>assistant<|channel|>commentary to=functions.get_stock_price <|constrain|>json<|message|>{\"ticker\": \"NVDA\"}<|call|>",
        );
        assert_eq!(out.reasoning, "Need price.");
        assert_eq!(out.text, "");
        assert_eq!(
            out.calls,
            vec![ParsedCall { name: "get_stock_price".into(), arguments: json!({"ticker": "NVDA"}) }]
        );
        let out = parse_harmony(
            "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Paris.<|return|>",
        );
        assert_eq!((out.reasoning.as_str(), out.text.as_str(), out.calls.len()), ("Hm.", "Paris.", 0));
        // The template's own form of a call; a body cut off at the end.
        let out = parse_harmony(" to=functions.calc<|channel|>commentary json<|message|>{\"e\": \"1+1\"}");
        assert_eq!(out.calls[0].arguments, json!({"e": "1+1"}));
        let out = parse_harmony("<|channel|>final<|message|>Half an ans");
        assert_eq!(out.text, "Half an ans");
    }

    #[test]
    fn what_is_not_harmony_stays_text() {
        for text in ["Plain words.", " \n", "<|channel|>final garbage words<|message|>x", "<|message|>x"] {
            let out = parse_harmony(text);
            assert_eq!((out.text.as_str(), out.calls.len()), (text, 0), "{text}");
        }
        // A call whose arguments do not parse, and an unknown recipient: kept whole.
        let bad = "<|channel|>commentary to=functions.f<|message|>{oops<|call|>";
        assert_eq!(parse_harmony(bad).text, bad);
        let other = "<|channel|>commentary to=browser.search<|message|>{}<|call|>";
        assert_eq!(parse_harmony(other).text, other);
        // A preamble and the answer, a blank line between.
        let out = parse_harmony(
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        );
        assert_eq!(out.text, "Checking.\n\nDone.");
    }
}
