//! gpt-oss's harmony chat format end to end (issue 49): what the template
//! renders reads back (an answer with its thought, a call); OpenAI's
//! examples parse; and on a fixture model given the gpt-oss template (no
//! gpt-oss file is at hand; its vocabulary spells the markers in text)
//! calls are constrained to the tools' schemas, thinking is reported apart,
//! a schema holds the answer after the thought, and a result goes back.

mod common;

use std::sync::Arc;

use pocket_core::chat::{ChatMessage, ChatTemplate};
use pocket_core::model::{LoadOptions, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions, StopReason};
use pocket_core::structured::{
    parse_harmony, parse_tool_calls, Constraint, GenerationEvent, Reasoning, ThinkFormat, ToolChoice, ToolFormat,
    ToolSpec,
};
use serde_json::{json, Value};

const TEMPLATE: &str = "openai-gpt-oss-120b.jinja";

fn template_source() -> String {
    std::fs::read_to_string(common::fixtures().join("templates").join(TEMPLATE)).expect("template")
}

fn model() -> Arc<Model> {
    let path = common::fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf");
    let opts = LoadOptions { chat_template: Some(template_source()), ..Default::default() };
    Arc::new(Model::load_with(&path, &opts).expect("model"))
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

/// A call's arguments hold to its tool's schema (a fresh matcher).
fn check_call(m: &Model, name: &str, args: &str) {
    let tool = alarm_tools().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("unknown tool {name}"));
    let mut schema: Value = serde_json::from_str(&tool.parameters_json).unwrap();
    schema.as_object_mut().unwrap().insert("additionalProperties".into(), false.into());
    let g = m.grammars().unwrap();
    let mut matcher = Constraint::JsonSchema(schema.to_string()).compile(&g).unwrap();
    let compact = serde_json::to_string(&serde_json::from_str::<Value>(args).unwrap()).unwrap();
    let ids = g.tokenize_bytes(compact.as_bytes());
    assert!(
        matcher.validate_tokens(&ids).ok() == Some(ids.len())
            && matcher.consume_tokens(&ids).is_ok()
            && matcher.is_accepting().unwrap(),
        "{name}({args}) breaks its schema"
    );
}

#[test]
fn the_template_is_detected_as_harmony() {
    let src = template_source();
    assert_eq!(ToolFormat::detect(&src), ToolFormat::Harmony);
    let m = model();
    let think = ThinkFormat::detect(m.tokenizer(), &src).expect("harmony thinks");
    assert!(think.is_harmony());
}

#[test]
fn what_the_template_renders_reads_back() {
    let t = ChatTemplate::from_source(&template_source(), "", "").unwrap();
    let after_prompt = |rendered: &str| -> String {
        let at = rendered.find("<|end|><|start|>assistant").expect("an assistant turn") + "<|end|>".len();
        rendered[at..].strip_prefix("<|start|>assistant").unwrap().to_string()
    };
    // An answer with its thought (the last turn, as in training).
    let msgs = json!([
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "thinking": "Easy one.", "content": "Paris."}
    ]);
    let out = parse_harmony(&after_prompt(&t.render_json(&msgs, false, &[]).unwrap()));
    assert_eq!((out.reasoning.as_str(), out.text.as_str(), out.calls.len()), ("Easy one.", "Paris.", 0));
    // A call, as Pocket's messages carry it.
    let call = pocket_core::structured::ToolCall {
        id: "call_1".into(),
        name: "set_alarm".into(),
        arguments_json: r#"{"hour": 7, "minute": 0}"#.into(),
    };
    let msgs = [
        ChatMessage::new("user", "Wake me at seven."),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") },
    ];
    let rendered = t.render(&msgs, false, &[]).unwrap();
    let (kept, calls) = parse_tool_calls(ToolFormat::Harmony, &after_prompt(&rendered), &alarm_tools());
    assert_eq!(kept, "");
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].name.as_str(), &calls[0].arguments), ("set_alarm", &json!({"hour": 7, "minute": 0})));
}

#[test]
fn openai_s_examples_parse() {
    // From OpenAI's harmony guide: a thought, then the answer.
    let out = parse_harmony(
        "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
    );
    assert_eq!(out.reasoning, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
    assert_eq!(out.text, "2 + 2 = 4.");
    // A thought, then a call with the recipient in the channel header.
    let out = parse_harmony(
        "<|channel|>analysis<|message|>Need to use function get_current_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>",
    );
    assert_eq!(out.reasoning, "Need to use function get_current_weather.");
    assert_eq!(out.calls.len(), 1);
    assert_eq!(out.calls[0].name, "get_current_weather");
    assert_eq!(out.calls[0].arguments, json!({"location": "San Francisco"}));
    // A preamble to the user before the call.
    let out = parse_harmony(
        "<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant to=functions.get_current_weather<|channel|>commentary json<|message|>{\"location\": \"Tokyo\"}<|call|>",
    );
    assert_eq!(
        (out.text.as_str(), out.calls[0].arguments["location"].as_str()),
        ("Checking the weather.", Some("Tokyo"))
    );
}

#[test]
fn calls_on_a_model_hold_to_the_tools_and_the_result_goes_back() {
    let m = model();
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
        let (prompt, _) = s.render_chat(&msgs, &o).unwrap();
        assert!(prompt.ends_with("<|channel|>analysis<|message|><|end|><|start|>assistant"), "{prompt:?}");
        assert!(prompt.contains("Current date: "), "{prompt:?}");
        let mut events = Vec::new();
        let st = s
            .chat_events(&msgs, &o, &mut |e| {
                events.push(e);
                true
            })
            .unwrap();
        assert_eq!(st.stop_reason, StopReason::ToolCalls, "{choice:?}: {:?}", st.text);
        assert_eq!(st.tool_calls.len(), 1);
        let streamed: Vec<_> = events
            .iter()
            .filter_map(|e| if let GenerationEvent::ToolCall(c) = e { Some(c.clone()) } else { None })
            .collect();
        assert_eq!(streamed, st.tool_calls);
        let c = &st.tool_calls[0];
        if let ToolChoice::Named(n) = &choice {
            assert_eq!(&c.name, n);
        }
        check_call(&m, &c.name, &c.arguments_json);
        if choice == ToolChoice::Required {
            msgs.push(ChatMessage { tool_calls: st.tool_calls.clone(), ..ChatMessage::new("assistant", "") });
            msgs.push(ChatMessage { tool_call_id: Some(c.id.clone()), ..ChatMessage::new("tool", "{\"ok\": true}") });
            let o2 = GenerateOptions { tools: alarm_tools(), ..sampled(seed, 8) };
            let (prompt, _) = s.render_chat(&msgs, &o2).unwrap();
            let result = format!("<|start|>functions.{} to=assistant<|channel|>commentary<|message|>", c.name);
            assert!(prompt.contains(&result), "{prompt:?}");
            let second = s.chat(&msgs, &o2, &mut |_| true).unwrap();
            assert!(second.prompt_tokens_evaluated < second.prompt_tokens, "the second turn evaluated every token");
            msgs.truncate(1);
        }
    }
}

#[test]
fn thinking_is_apart_and_a_schema_holds_the_answer_after_it() {
    let m = model();
    let mut s = session(&m);
    let msgs = [ChatMessage::new("user", "Think, then answer.")];
    let schema = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"],"additionalProperties":false}"#;
    let (mut thought, mut answered) = (0, 0);
    for seed in 1..=4 {
        let o =
            GenerateOptions { reasoning: Reasoning::Budget(8), json_schema: Some(schema.into()), ..sampled(seed, 160) };
        let mut reasoning = String::new();
        let st = s
            .chat_events(&msgs, &o, &mut |e| {
                if let GenerationEvent::Reasoning(r) = e {
                    reasoning.push_str(&r);
                }
                true
            })
            .unwrap();
        assert_eq!(st.reasoning, reasoning);
        for text in [&st.text, &st.reasoning] {
            assert!(!text.contains("<|channel|>") && !text.contains("<|message|>"), "{text:?}");
        }
        if st.stop_reason == StopReason::EndOfText {
            let v: Value = serde_json::from_str(&st.text).unwrap_or_else(|e| panic!("{:?}: {e}", st.text));
            assert!(v["age"].is_i64() && v["name"].is_string(), "{v}");
            answered += 1;
        }
        // At most the budget's 8 tokens of thought, then `<|end|>` and the answer's header.
        thought += usize::from(!st.reasoning.is_empty());
    }
    assert!(thought > 0 && answered > 0, "{thought} thoughts, {answered} answers in 4 runs");
    // Auto tools: whatever the model writes, calls hold to the schema and
    // no marker leaks into the text.
    for seed in 4..=6 {
        let o = GenerateOptions { tools: alarm_tools(), ..sampled(seed, 120) };
        let st = s.chat(&msgs, &o, &mut |_| true).unwrap();
        for c in &st.tool_calls {
            check_call(&m, &c.name, &c.arguments_json);
        }
        assert!(!st.text.contains("<|channel|>"), "{:?}", st.text);
    }
}
