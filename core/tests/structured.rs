//! Structured output end to end: every schema of the JSON Schema Test Suite
//! is enforced or refused (an invalid instance never passes a compiled
//! schema); constrained generation on the fixture models always satisfies
//! its constraint; tool calls in each family's format on the real
//! templates, with a result sent back; thinking off, budgeted, and a schema
//! after the thought; bad constraints refused by name; all of it with
//! speculative decoding giving the same tokens.

mod common;

use std::sync::Arc;

use pocket_core::chat::ChatMessage;
use pocket_core::model::{LoadOptions, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{
    testing, GenerateOptions, GenerationStats, Session, SessionOptions, Speculation, StopReason,
};
use pocket_core::structured::{Constraint, GenerationEvent, Grammars, Reasoning, ToolChoice, ToolFormat, ToolSpec};
use pocket_core::tokenizer::Tokenizer;
use pocket_core::Error;
use serde_json::{json, Value};

fn model(name: &str, template: Option<&str>) -> Arc<Model> {
    let chat_template =
        template.map(|t| std::fs::read_to_string(common::fixtures().join("templates").join(t)).expect("template"));
    let path = common::fixtures().join("models").join(name);
    Arc::new(Model::load_with(&path, &LoadOptions { chat_template, ..Default::default() }).expect("model"))
}

fn session(m: &Arc<Model>) -> Session {
    Session::new(m.clone(), SessionOptions { context_length: 2048, threads: 2, ..Default::default() }).unwrap()
}

fn sampled(seed: u64, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler: SamplerConfig { temperature: 0.8, seed, ..Default::default() },
        seed: Some(seed),
        ..Default::default()
    }
}

/// Whether `text` satisfies `c` by a fresh matcher over `tok`'s vocabulary.
fn satisfies(g: &Grammars, _tok: &Tokenizer, c: &Constraint, text: &str) -> bool {
    let mut m = c.compile(g).unwrap();
    let ids = g.tokenize_bytes(text.as_bytes());
    m.validate_tokens(&ids).ok() == Some(ids.len()) && m.consume_tokens(&ids).is_ok() && m.is_accepting().unwrap()
}

#[test]
fn the_schema_suite_is_enforced_or_refused() {
    let text = std::fs::read_to_string(common::fixtures().join("structured/schema_suite.json")).unwrap();
    let suite: Value = serde_json::from_str(&text).unwrap();
    let tok = Arc::new(
        Tokenizer::from_gguf(
            &pocket_core::gguf::GgufFile::open(common::fixtures().join("models/qwen3moe-tiny-Q4_0.gguf")).unwrap(),
        )
        .unwrap(),
    );
    let g = Grammars::new(tok.clone()).unwrap();
    let (mut compiled, mut refused, mut valid_refused) = (0, 0, 0);
    let mut leaks = Vec::new();
    for case in suite["schemas"].as_array().unwrap() {
        let c = Constraint::JsonSchema(case["schema"].to_string());
        match c.compile(&g) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.starts_with("json_schema: "), "{m}");
                refused += 1;
                continue;
            }
            Err(e) => panic!("{}: {e}", case["file"]),
            Ok(_) => compiled += 1,
        }
        for inst in case["invalid"].as_array().unwrap() {
            if satisfies(&g, &tok, &c, &inst.to_string()) {
                leaks.push(format!("{} / {}: {inst} passed {}", case["file"], case["group"], case["schema"]));
            }
        }
        for inst in case["valid"].as_array().unwrap() {
            if !satisfies(&g, &tok, &c, &inst.to_string()) {
                valid_refused += 1;
            }
        }
    }
    eprintln!("schema suite: {compiled} compiled, {refused} refused; {valid_refused} valid instances outside the compiled grammars");
    assert!(compiled >= 150, "only {compiled} schemas compiled");
    assert!(leaks.is_empty(), "{} invalid instances passed:\n{}", leaks.len(), leaks.join("\n"));
}

/// The schemas of the issue: objects, nested `$ref`, bounded arrays, enums,
/// ranges, patterns, `anyOf`, nullable.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": false}},
               "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}),
        json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "level": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"type": "null"}]}}, "required": ["code", "level"], "additionalProperties": false}),
        json!({"type": ["string", "null"], "maxLength": 8}),
    ]
}

#[test]
fn constrained_answers_always_satisfy_their_constraint() {
    for (name, template) in [("gemma3-tiny-Q8_0.gguf", None), ("qwen35moe-tiny-Q4_K_M.gguf", Some("Qwen3.5-4B.jinja"))]
    {
        let m = model(name, template);
        let g = m.grammars().unwrap();
        let mut s = session(&m);
        let msgs = [ChatMessage::new("user", "Answer.")];
        let mut constraints: Vec<Constraint> =
            schemas().iter().map(|s| Constraint::JsonSchema(s.to_string())).collect();
        constraints.push(Constraint::Regex("(yes|no), [0-9]{1,3} items".into()));
        constraints.push(Constraint::Choices(vec!["positive".into(), "negative".into(), "neutral".into()]));
        constraints.push(Constraint::Grammar(
            "start: greeting \" \" name \"!\"\ngreeting: \"hello\" | \"hi\"\nname: /[a-z]{2,6}/\n".into(),
        ));
        for c in &constraints {
            for seed in 1..=3 {
                let mut o = GenerateOptions { reasoning: Reasoning::Off, ..sampled(seed, 200) };
                match c {
                    Constraint::JsonSchema(s) => o.json_schema = Some(s.clone()),
                    Constraint::Regex(r) => o.regex = Some(r.clone()),
                    Constraint::Choices(v) => o.choices = v.clone(),
                    Constraint::Grammar(l) => o.grammar = Some(l.clone()),
                }
                let st = s.chat(&msgs, &o, &mut |_| true).unwrap();
                if st.stop_reason == StopReason::MaxTokens {
                    continue; // a random model may write a long string: the partial text is all it gets
                }
                assert_eq!(st.stop_reason, StopReason::EndOfText, "{name} {c:?}");
                assert!(satisfies(&g, m.tokenizer(), c, &st.text), "{name} seed {seed}: {:?} breaks {c:?}", st.text);
                if let Constraint::JsonSchema(_) = c {
                    // JSON numbers have no range; a random model writes 9e2925751816818.
                    if let Err(e) = serde_json::from_str::<Value>(&st.text) {
                        assert!(e.to_string().contains("number out of range"), "{:?}: {e}", st.text);
                    }
                }
                if let Constraint::Choices(v) = c {
                    assert!(v.contains(&st.text), "{:?}", st.text);
                }
            }
        }
    }
}

#[test]
fn bad_constraints_are_refused_by_name() {
    let m = model("gemma3-tiny-Q8_0.gguf", None);
    let mut s = session(&m);
    let refused = |s: &mut Session, o: GenerateOptions| match s.generate("Hi", &o, &mut |_| true) {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let base = GenerateOptions { max_tokens: 4, ..Default::default() };
    let two = GenerateOptions { json_schema: Some("{}".into()), regex: Some("a".into()), ..base.clone() };
    assert!(refused(&mut s, two).contains("one constraint"));
    let bad_json = GenerateOptions { json_schema: Some("{\"type\":".into()), ..base.clone() };
    assert!(refused(&mut s, bad_json).starts_with("json_schema:"));
    for kw in [
        json!({"not": {"type": "string"}}),
        json!({"type": "array", "uniqueItems": true}),
        json!({"if": {}, "then": {}}),
    ] {
        let o = GenerateOptions { json_schema: Some(kw.to_string()), ..base.clone() };
        let msg = refused(&mut s, o);
        assert!(msg.starts_with("json_schema:") && msg.contains("not enforced"), "{msg}");
    }
    let unknown_format =
        GenerateOptions { json_schema: Some(r#"{"type":"string","format":"no-such"}"#.into()), ..base.clone() };
    assert!(refused(&mut s, unknown_format).starts_with("json_schema:"));
    let bad_regex = GenerateOptions { regex: Some("(a".into()), ..base.clone() };
    assert!(refused(&mut s, bad_regex).starts_with("regex:"));
    let bad_grammar = GenerateOptions { grammar: Some("start: (".into()), ..base.clone() };
    assert!(refused(&mut s, bad_grammar).starts_with("grammar:"));
    let no_thinking = GenerateOptions { reasoning: Reasoning::On, ..base.clone() };
    assert!(refused(&mut s, no_thinking).starts_with("reasoning:"));
    let bad_tool = GenerateOptions { tools: vec![ToolSpec::new("a b", "", "{}")], ..base.clone() };
    assert!(refused(&mut s, bad_tool).starts_with("tools:"));
    let no_tools = GenerateOptions { tool_choice: ToolChoice::Required, ..base };
    assert!(refused(&mut s, no_tools).starts_with("tool_choice:"));
}

fn alarm_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            "set_alarm",
            "Set an alarm.",
            r#"{"type":"object","properties":{"hour":{"type":"integer","minimum":0,"maximum":23},"minute":{"type":"integer","minimum":0,"maximum":59},"repeat":{"type":"string","enum":["once","daily"]}},"required":["hour","minute"]}"#,
        ),
        ToolSpec::new("get_battery", "The battery level.", "{}"),
    ]
}

/// A call's arguments hold to its tool's schema (checked by a fresh matcher).
fn check_call(g: &Grammars, tok: &Tokenizer, name: &str, args: &str) {
    let tool = alarm_tools().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("unknown tool {name}"));
    let mut schema: Value = serde_json::from_str(&tool.parameters_json).unwrap();
    schema.as_object_mut().unwrap().insert("additionalProperties".into(), false.into());
    let compact = serde_json::to_string(&serde_json::from_str::<Value>(args).unwrap()).unwrap();
    assert!(satisfies(g, tok, &Constraint::JsonSchema(schema.to_string()), &compact), "{name}({args})");
}

#[test]
fn tool_calls_in_every_family_with_a_result_and_a_second_turn() {
    for (name, template, format) in [
        ("qwen35moe-tiny-Q4_K_M.gguf", "Qwen3.5-4B.jinja", ToolFormat::Qwen35Xml),
        ("qwen3moe-tiny-Q4_K_M.gguf", "Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes),
        ("gemma3-tiny-Q8_0.gguf", "meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::Llama3),
        ("gemma3-tiny-Q8_0.gguf", "google-gemma-2-2b-it.jinja", ToolFormat::GenericJson),
    ] {
        let m = model(name, Some(template));
        assert_eq!(ToolFormat::detect(m.chat_template().unwrap().source()), format);
        let g = m.grammars().unwrap();
        let mut s = session(&m);
        let mut msgs = vec![ChatMessage::new("user", "Wake me at seven.")];
        for (choice, seed) in [(ToolChoice::Required, 1), (ToolChoice::Named("set_alarm".into()), 2)] {
            s.reset();
            let o = GenerateOptions {
                tools: alarm_tools(),
                tool_choice: choice.clone(),
                reasoning: Reasoning::Off,
                ..sampled(seed, 300)
            };
            let mut events = Vec::new();
            let st = s
                .chat_events(&msgs, &o, &mut |e| {
                    events.push(e);
                    true
                })
                .unwrap_or_else(|e| panic!("{template}: {e}"));
            assert_eq!(st.stop_reason, StopReason::ToolCalls, "{template} {choice:?}: {:?}", st.text);
            assert!(!st.tool_calls.is_empty());
            let streamed: Vec<_> = events
                .iter()
                .filter_map(|e| if let GenerationEvent::ToolCall(c) = e { Some(c.clone()) } else { None })
                .collect();
            assert_eq!(streamed, st.tool_calls);
            for c in &st.tool_calls {
                if let ToolChoice::Named(n) = &choice {
                    assert_eq!(&c.name, n);
                }
                check_call(&g, m.tokenizer(), &c.name, &c.arguments_json);
            }
            if choice == ToolChoice::Required {
                // The result goes back; the second turn reuses the first.
                let call = st.tool_calls[0].clone();
                msgs.push(ChatMessage {
                    tool_calls: st.tool_calls.clone(),
                    ..ChatMessage::new("assistant", st.text.clone())
                });
                msgs.push(ChatMessage {
                    tool_call_id: Some(call.id.clone()),
                    ..ChatMessage::new("tool", "{\"ok\": true}")
                });
                let o2 = GenerateOptions { tools: alarm_tools(), reasoning: Reasoning::Off, ..sampled(seed, 8) };
                let second = s.chat(&msgs, &o2, &mut |_| true).unwrap();
                assert!(
                    second.prompt_tokens_evaluated < second.prompt_tokens,
                    "{template}: the second turn evaluated all {} tokens",
                    second.prompt_tokens
                );
                msgs.truncate(1);
            }
        }
    }
}

#[test]
fn gemma4_calls_follow_its_grammar_on_its_vocabulary() {
    // Gemma 4's network arrives with its own issue; its vocabulary and call
    // syntax are here: random walks under the call grammar always parse.
    let tok = Arc::new(
        Tokenizer::from_gguf(
            &pocket_core::gguf::GgufFile::open(common::fixtures().join("models/gemma4-e-tiny-Q8_0.gguf")).unwrap(),
        )
        .unwrap(),
    );
    let g = Grammars::new(tok.clone()).unwrap();
    let tools = alarm_tools();
    let refs: Vec<&ToolSpec> = tools.iter().collect();
    let grammar = ToolFormat::Gemma4.call_grammar(&refs, &tok, true).unwrap();
    let mut rng = pocket_core::sampler::Rng::new(7);
    for _ in 0..20 {
        let mut m = pocket_core::structured::compile_lark(&g, &grammar).unwrap();
        let mut text = Vec::new();
        for _ in 0..200 {
            if m.is_stopped() {
                break;
            }
            let mask = m.compute_mask().unwrap();
            let allowed: Vec<u32> = mask.to_list().into_iter().filter(|&t| !tok.is_end_of_generation(t)).collect();
            if allowed.is_empty() {
                break;
            }
            let t = allowed[(rng.next_u64() % allowed.len() as u64) as usize];
            m.consume_token(t).unwrap();
            text.extend_from_slice(tok.token_piece(t));
        }
        let text = String::from_utf8_lossy(&text);
        let (kept, calls) = pocket_core::structured::parse_tool_calls(ToolFormat::Gemma4, &text, &tools);
        assert_eq!((kept.as_str(), calls.len()), ("", 1), "{text}");
        check_call(&g, &tok, &calls[0].name, &calls[0].arguments.to_string());
    }
}

fn thinking_model() -> Arc<Model> {
    model("qwen35moe-tiny-Q4_K_M.gguf", Some("Qwen3.5-4B.jinja"))
}

#[test]
fn thinking_is_apart_off_or_budgeted_and_a_schema_follows_it() {
    let m = thinking_model();
    let mut s = session(&m);
    let msgs = [ChatMessage::new("user", "Think, then answer.")];
    // The template opens a thought by default: it is reported apart.
    let mut reasoning_events = String::new();
    let on = GenerateOptions { reasoning: Reasoning::Budget(12), ..sampled(3, 40) };
    let st = s
        .chat_events(&msgs, &on, &mut |e| {
            if let GenerationEvent::Reasoning(r) = e {
                reasoning_events.push_str(&r);
            }
            true
        })
        .unwrap();
    assert!(!st.reasoning.is_empty(), "no thinking reported");
    assert_eq!(st.reasoning, reasoning_events);
    assert!(!st.text.contains("<think>") && !st.text.contains("</think>"), "{:?}", st.text);
    // The budget: 12 thinking tokens, then the forced close, then the answer.
    let closed = m.tokenizer().encode("\n</think>\n\n", false, true).unwrap();
    let at = st.tokens.windows(closed.len()).position(|w| w == closed.as_slice()).expect("the thought was closed");
    assert!(at <= 12, "{at} thinking tokens");
    // Off: no thought at all.
    let off = GenerateOptions { reasoning: Reasoning::Off, ..sampled(3, 20) };
    let st = s.chat(&msgs, &off, &mut |_| true).unwrap();
    assert_eq!(st.reasoning, "");
    let (prompt, _) = s.render_chat(&msgs, &off).unwrap();
    assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt:?}");
    // A schema applies to the answer after the thought, never to the thought.
    let schema = schemas()[0].to_string();
    for seed in 1..=3 {
        let o = GenerateOptions {
            reasoning: Reasoning::Budget(8),
            json_schema: Some(schema.clone()),
            ..sampled(seed, 120)
        };
        let st: GenerationStats = s.chat(&msgs, &o, &mut |_| true).unwrap();
        assert!(!st.reasoning.is_empty());
        if st.stop_reason == StopReason::EndOfText {
            let v: Value = serde_json::from_str(&st.text).unwrap_or_else(|e| panic!("{:?}: {e}", st.text));
            assert!(v["age"].is_i64() && v["name"].is_string(), "{v}");
        }
    }
}

#[test]
fn speculation_under_tools_thinking_and_a_schema_gives_the_same_tokens() {
    // Drafts: each request's own tokens, every 4th swapped for the one
    // before it (accepted, and rejected by sampling under the mask).
    let schema = schemas()[0].to_string();
    let call = |choice: ToolChoice| GenerateOptions {
        tools: alarm_tools(),
        tool_choice: choice,
        reasoning: Reasoning::Off,
        ..Default::default()
    };
    let cases: Vec<(&str, &str, GenerateOptions)> = vec![
        ("qwen35moe-tiny-Q4_K_M.gguf", "Qwen3.5-4B.jinja", call(ToolChoice::Required)),
        ("qwen3moe-tiny-Q4_K_M.gguf", "Qwen-Qwen3-0.6B.jinja", call(ToolChoice::Named("set_alarm".into()))),
        ("gemma3-tiny-Q8_0.gguf", "google-gemma-2-2b-it.jinja", call(ToolChoice::Required)),
        (
            "qwen35moe-tiny-Q4_K_M.gguf",
            "Qwen3.5-4B.jinja",
            GenerateOptions { reasoning: Reasoning::Budget(8), json_schema: Some(schema), ..Default::default() },
        ),
    ];
    let msgs = [ChatMessage::new("user", "Wake me at seven.")];
    let (mut drafted, mut accepted) = (0, 0);
    for (name, template, o) in cases {
        let m = model(name, Some(template));
        for seed in [1, 2] {
            let off =
                GenerateOptions { max_tokens: 120, sampler: sampled(seed, 0).sampler, seed: Some(seed), ..o.clone() };
            let on = GenerateOptions { speculation: Speculation::Lookup { ngram: 3, max_draft: 6 }, ..off.clone() };
            let mut a = session(&m);
            let sa = a.chat(&msgs, &off, &mut |_| true).unwrap();
            testing::script_drafts(Some(common::swapped(a.cached_tokens(), sa.prompt_tokens)));
            let sb = session(&m).chat(&msgs, &on, &mut |_| true);
            testing::script_drafts(None);
            let sb = sb.unwrap_or_else(|e| panic!("{template}: {e}"));
            assert_eq!(sa.tokens, sb.tokens, "{template} seed {seed}");
            assert_eq!((&sa.text, &sa.reasoning, &sa.tool_calls), (&sb.text, &sb.reasoning, &sb.tool_calls));
            assert_eq!(sa.stop_reason, sb.stop_reason);
            (drafted, accepted) = (drafted + sb.drafted_tokens, accepted + sb.accepted_tokens);
        }
    }
    eprintln!("tools, thinking, schema with speculation: drafted {drafted}, accepted {accepted}");
    assert!(accepted > 0 && accepted < drafted, "drafted {drafted}, accepted {accepted}");
}
