//! The harmony turn fed known output token by token, on a fixture's
//! vocabulary (which spells the markers in text).

use std::sync::Arc;

use serde_json::json;

use super::super::tools::ParsedCall;
use super::*;
use crate::gguf::GgufFile;

fn tokenizer() -> Arc<Tokenizer> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
    let dir = std::env::var("POCKET_FIXTURES").map(std::path::PathBuf::from).unwrap_or(dir);
    let g = GgufFile::open(dir.join("models/qwen3moe-tiny-Q4_0.gguf")).expect("fixture model");
    Arc::new(Tokenizer::from_gguf(&g).expect("tokenizer"))
}

/// What a run of tokens became: thinking, answer text, calls, and the
/// tokens the turn forced.
#[derive(Debug, Default)]
struct Seen {
    reasoning: String,
    text: String,
    calls: Vec<ParsedCall>,
    forced: Vec<u32>,
}

/// The tokens of `text` one at a time as the turn takes them: each checked
/// against the mask, the bytes of tokens the turn forces skipped; false
/// when the turn refuses a token or forces other bytes.
fn walk(turn: &mut HarmonyTurn, tok: &Tokenizer, text: &str, mut on_step: impl FnMut(&mut HarmonyTurn, Step)) -> bool {
    let mut rest = text.to_string();
    while !rest.is_empty() {
        let t = tok.encode(&rest, false, true).unwrap()[0];
        if let Mask::Allowed(m) = turn.mask().unwrap() {
            if !m.is_allowed(t) {
                return false;
            }
        }
        let step = turn.accept(t, tok).unwrap();
        let mut took = tok.token_piece(t).to_vec();
        step.forced.iter().for_each(|&f| took.extend_from_slice(tok.token_piece(f)));
        let n = took.len().min(rest.len());
        if rest.as_bytes()[..n] != took[..n] {
            // The turn forced other bytes than the text's.
            return false;
        }
        rest = String::from_utf8_lossy(&rest.as_bytes()[n..]).into_owned();
        on_step(turn, step);
    }
    true
}

/// Feed `output` (every token allowed by the mask), then finish.
fn feed(turn: &mut HarmonyTurn, tok: &Tokenizer, output: &str) -> Seen {
    let mut seen = Seen::default();
    fn route(seen: &mut Seen, step: Step) {
        for (c, b) in step.segments {
            let s = String::from_utf8_lossy(&b).into_owned();
            match c {
                Channel::Reasoning => seen.reasoning.push_str(&s),
                Channel::Text => seen.text.push_str(&s),
            }
        }
        seen.forced.extend(step.forced);
    }
    let took_all = walk(turn, tok, output, |turn, step| {
        route(&mut seen, step);
        for c in turn.take_closed() {
            match c {
                Closed::Call(c) => seen.calls.push(c),
                Closed::Text(t) => seen.text.push_str(&t),
            }
        }
    });
    assert!(took_all, "a token of {output:?} was refused");
    let _ = turn.mask().unwrap();
    for c in turn.take_closed() {
        if let Closed::Call(c) = c {
            seen.calls.push(c);
        }
    }
    route(&mut seen, turn.finish());
    seen
}

/// Whether the turn's masks refuse one of `text`'s tokens (those before it are taken).
fn refuses(turn: &mut HarmonyTurn, tok: &Tokenizer, text: &str) -> bool {
    !walk(turn, tok, text, |_, _| {})
}

fn free(tok: &Tokenizer, reasoning: Reasoning) -> HarmonyTurn {
    HarmonyTurn::new(tok, None, reasoning, "<|start|>user<|message|>Hi<|end|><|start|>assistant", None, vec![], false)
        .unwrap()
}

#[test]
fn messages_go_to_their_channels() {
    let tok = tokenizer();
    let seen = feed(
        &mut free(&tok, Reasoning::Default),
        &tok,
        "<|channel|>analysis<|message|>Think hard.<|end|><|start|>assistant<|channel|>final<|message|>Paris is big.",
    );
    assert_eq!((seen.reasoning.as_str(), seen.text.as_str()), ("Think hard.", "Paris is big."));
    // A preamble, then the answer: a blank line between.
    let seen = feed(
        &mut free(&tok, Reasoning::Default),
        &tok,
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
    );
    assert_eq!((seen.reasoning.as_str(), seen.text.as_str()), ("", "Checking.\n\nDone."));
    // Output that is not harmony is the answer's text.
    let seen = feed(&mut free(&tok, Reasoning::Default), &tok, "Just words.");
    assert_eq!(seen.text, "Just words.");
    // A call nobody asked for stays text, whole.
    let call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}";
    assert_eq!(feed(&mut free(&tok, Reasoning::Default), &tok, call).text, call);
}

#[test]
fn a_thought_budget_closes_the_message() {
    let tok = tokenizer();
    let mut turn = free(&tok, Reasoning::Budget(3));
    let seen = feed(&mut turn, &tok, "<|channel|>analysis<|message|> one two three");
    assert_eq!(seen.forced, tok.encode("<|end|>", false, true).unwrap());
    assert_eq!(turn.think_tokens, 3);
    assert!(!seen.reasoning.is_empty() && " one two three".starts_with(&seen.reasoning), "{:?}", seen.reasoning);
    assert_eq!(turn.state, State::Header { after_end: true });
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec::new(
        "get_weather",
        "Weather",
        r#"{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1}},"required":["city"]}"#,
    )]
}

#[test]
fn calls_are_constrained_and_read_in_both_forms() {
    let tok = tokenizer();
    let g = Arc::new(Grammars::new(tok.clone()).unwrap());
    let prompt = "<|start|>assistant";
    for output in [
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\", \"days\": 2}",
        " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\", \"days\": 2}",
    ] {
        let mut turn = HarmonyTurn::new(&tok, Some(g.clone()), Reasoning::Default, prompt, None, tools(), false).unwrap();
        let seen = feed(&mut turn, &tok, output);
        assert_eq!(seen.calls.len(), 1, "{output}: {seen:?}");
        assert_eq!(seen.calls[0].name, "get_weather");
        assert_eq!(seen.calls[0].arguments, json!({"city": "Oslo", "days": 2}));
        assert_eq!(seen.text, "");
        assert_eq!(turn.n_calls(), 1);
        assert!(matches!(turn.mask().unwrap(), Mask::Allowed(_)));
    }
    // The grammar refuses an unknown tool and arguments against the schema.
    for bad in [
        "<|channel|>commentary to=functions.get_time",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"days\": 0}",
    ] {
        let mut turn =
            HarmonyTurn::new(&tok, Some(g.clone()), Reasoning::Default, prompt, None, tools(), false).unwrap();
        let refused = refuses(&mut turn, &tok, bad);
        assert!(refused, "{bad} went through");
    }
}

#[test]
fn a_forced_call_may_follow_a_thought_but_no_answer() {
    let tok = tokenizer();
    let g = Arc::new(Grammars::new(tok.clone()).unwrap());
    let mut turn =
        HarmonyTurn::new(&tok, Some(g), Reasoning::Default, "<|start|>assistant", None, tools(), true).unwrap();
    // The model would end inside its thought: the message closes instead.
    let seen = feed(&mut turn, &tok, "<|channel|>analysis<|message|>Hmm");
    assert_eq!(seen.reasoning, "Hmm");
    let step = turn.close_instead_of_ending().unwrap().expect("a call is owed");
    assert_eq!(step.forced, tok.encode("<|end|>", false, true).unwrap());
    // Only a call header may follow (after `<|start|>assistant`).
    assert!(refuses(&mut turn, &tok, "<|start|>assistant<|channel|>final"), "an answer where a call is owed");
}
