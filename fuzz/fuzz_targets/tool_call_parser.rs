//! Fuzz the tool-call parsers: any model output, in every format, must parse
//! without panicking, and what comes back must account for the input:
//! - every call's arguments are a JSON object;
//! - formats with markers: the text splits into segments, each an open
//!   marker up to the next close marker (or the end), and parsing is local to
//!   them: the kept text is the text between the segments plus every segment
//!   that is not a call, and the calls are the segments' calls in order (so
//!   the kept text and the calls' segments cover the input, nothing dropped);
//! - Hermes: a call's segment is a JSON object naming it; Gemma 4: a call's
//!   name is non-empty, trimmed and has no `{`;
//! - the JSON forms: at most one call, and then the trimmed text is a JSON
//!   object naming it and nothing is kept; no call keeps the text as is;
//! - harmony: text without a message is kept as is, and calls are named.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pocket_core::structured::{parse_tool_calls, ParsedCall, ToolFormat, ToolSpec};
use serde_json::Value;

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            "get_stock_price",
            "Price",
            r#"{"type":"object","properties":{"ticker":{"type":"string"},"count":{"type":"integer"}},"required":["ticker"]}"#,
        ),
        ToolSpec::new(
            "set_mode",
            "Mode",
            r#"{"type":"object","properties":{"mode":{"type":"string","enum":["fast","slow"]},"code":{"type":"string","pattern":"^[A-Z]+$"},"opts":{"type":"object"}}}"#,
        ),
    ]
}

/// The JSON object a JSON-form call was read from, and the name it gives.
fn json_name(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    Some(v.as_object()?.get("name")?.as_str()?.to_string())
}

fn check(format: ToolFormat, text: &str, tools: &[ToolSpec]) {
    let (kept, calls) = parse_tool_calls(format, text, tools);
    for c in &calls {
        assert!(c.arguments.is_object(), "{format:?}: arguments {} not an object", c.arguments);
    }
    if format == ToolFormat::Harmony {
        // Calls come from messages (their header before `<|message|>`):
        // text without one is kept as it is.
        if !text.contains("<|message|>") {
            assert!(calls.is_empty(), "harmony: a call without a message");
            assert_eq!(kept, text, "harmony: no message, but the text changed");
        }
        for c in &calls {
            assert!(!c.name.is_empty() && !c.name.contains(char::is_whitespace), "harmony name {:?}", c.name);
        }
        return;
    }
    let Some((open, close)) = format.markers() else {
        assert!(calls.len() <= 1, "{format:?}: {} calls in a JSON-form answer", calls.len());
        match calls.first() {
            Some(c) => {
                assert_eq!(kept, "", "{format:?}: a call and kept text");
                assert_eq!(json_name(text).as_deref(), Some(c.name.as_str()), "{format:?}: call not the text's object");
            }
            None => assert_eq!(kept, text, "{format:?}: no call, but the text changed"),
        }
        return;
    };
    // The segments, as the parser must cut them.
    let mut want_kept = String::new();
    let mut want_calls: Vec<ParsedCall> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(open) {
        want_kept.push_str(&rest[..at]);
        let after = &rest[at + open.len()..];
        let (body, end) = match after.find(close) {
            Some(e) => (&after[..e], e + close.len()),
            None => (after, after.len()),
        };
        let segment = &rest[at..at + open.len() + end];
        // A segment alone: all of it a call, or all of it kept.
        let (k, c) = parse_tool_calls(format, segment, tools);
        match c.len() {
            0 => {
                assert_eq!(k, segment, "{format:?}: a segment that is not a call must be kept whole");
                want_kept.push_str(segment);
            }
            1 => {
                assert_eq!(k, "", "{format:?}: a call's segment left text");
                match format {
                    ToolFormat::Hermes => assert_eq!(json_name(body).as_deref(), Some(c[0].name.as_str())),
                    ToolFormat::Gemma4 => {
                        let n = &c[0].name;
                        assert!(!n.is_empty() && n.trim() == n && !n.contains('{'), "gemma4 name {n:?}");
                    }
                    _ => {}
                }
                want_calls.extend(c);
            }
            n => panic!("{format:?}: one segment gave {n} calls"),
        }
        rest = &rest[at + open.len() + end..];
    }
    want_kept.push_str(rest);
    assert_eq!(kept, want_kept, "{format:?}: kept text");
    assert_eq!(calls, want_calls, "{format:?}: calls");
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tools = tools();
    for format in ToolFormat::ALL {
        check(format, &text, &tools);
        check(format, &text, &[]);
    }
});
