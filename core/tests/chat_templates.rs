//! Chat templates render exactly as transformers does (fixture
//! `templates/expected.json`), raise as the template says, and fall back to
//! ChatML for files without a template.

mod common;

use pocket_core::chat::{ChatMessage, ChatTemplate};
use pocket_core::gguf::GgufFile;
use pocket_core::Error;
use serde_json::{json, Value};

fn template(name: &str, bos: &str, eos: &str) -> ChatTemplate {
    let path = common::fixtures().join("templates").join(name);
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ChatTemplate::from_source(&src, bos, eos).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_expected_rendering_is_identical() {
    let text = std::fs::read_to_string(common::fixtures().join("templates/expected.json")).expect("expected.json");
    let cases: Value = serde_json::from_str(&text).expect("json");
    let cases = cases["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"].as_str().unwrap();
        let t = template(name, case["bos_token"].as_str().unwrap(), case["eos_token"].as_str().unwrap());
        let extra: Vec<(String, Value)> = case["extra_variables"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        match t.render_json(&case["messages"], agp, &extra) {
            Ok(got) if got == case["expected"].as_str().unwrap() => {}
            Ok(got) => {
                failures.push(format!("case {i} ({name}, agp={agp}):\n want {:?}\n got  {got:?}", case["expected"]))
            }
            Err(e) => failures.push(format!("case {i} ({name}): {e}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn gemma2_rejects_a_system_message_with_its_own_words() {
    let t = template("google-gemma-2-2b-it.jinja", "<bos>", "<eos>");
    let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    match t.render(&msgs, true, &[]) {
        Err(Error::TemplateRaised(msg)) => assert_eq!(msg, "System role not supported"),
        other => panic!("expected the template's exception, got {other:?}"),
    }
}

#[test]
fn files_without_a_template_get_chatml() {
    let g = GgufFile::open(common::fixtures().join("models/qwen3moe-tiny-F32.gguf")).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap();
    let msgs = [ChatMessage::new("system", "S"), ChatMessage::new("user", "Hi")];
    assert_eq!(
        t.render(&msgs, true, &[]).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn files_without_a_template_get_their_architecture_s_turns() {
    let msgs = [ChatMessage::new("system", "S"), ChatMessage::new("user", " Hi "), ChatMessage::new("assistant", "Yo")];
    let gemma = GgufFile::open(common::fixtures().join("models/gemma3-tiny-F32.gguf")).unwrap();
    let t = ChatTemplate::from_gguf(&gemma).unwrap();
    let bos = t.special_texts().0.to_string();
    assert!(!bos.is_empty());
    assert_eq!(
        t.render(&msgs, true, &[]).unwrap(),
        format!("{bos}<start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n<start_of_turn>model\n")
    );
    let mixtral = GgufFile::open(common::fixtures().join("models/mixtral-tiny-Q8_0.gguf")).unwrap();
    let t = ChatTemplate::from_gguf(&mixtral).unwrap();
    let (bos, eos) = (t.special_texts().0.to_string(), t.special_texts().1.to_string());
    assert_eq!(t.render(&msgs, false, &[]).unwrap(), format!("{bos}[INST] S\n\nHi [/INST] Yo{eos}"));
}

#[test]
fn tool_role_and_tool_calls_render() {
    let t = template("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>");
    let msgs = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}}
        ]},
        {"role": "tool", "content": "{\"temp\": 21}"}
    ]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let out = t.render_json(&msgs, true, &[("tools".into(), tools)]).unwrap();
    // transformers' tojson: Python separators, non-ASCII kept, key order kept.
    assert!(out.contains(r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}"#), "{out}");
    assert!(
        out.contains(r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}"#)
    );
    assert!(out.contains("<tool_response>\n{\"temp\": 21}\n</tool_response>"), "{out}");
}

#[test]
fn tojson_follows_python_json_dumps() {
    let t = ChatTemplate::from_source(
        "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(ensure_ascii=true) }}|{{ y | tojson(separators=[',', ':']) }}",
        "",
        "",
    )
    .unwrap();
    let extra =
        [("x".to_string(), json!({"b": [1, 2.5, true, null], "a": "é<&>\n"})), ("y".into(), json!([1, {"k": 1.0}]))];
    assert_eq!(
        t.render(&[], false, &extra).unwrap(),
        "{\"b\": [1, 2.5, true, null], \"a\": \"é<&>\\n\"}|{\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"a\": \"é<&>\\n\"\n}|{\"b\": [1, 2.5, true, null], \"a\": \"\\u00e9<&>\\n\"}|[1,{\"k\":1.0}]"
    );
}

#[test]
fn values_print_as_python_does() {
    let t = ChatTemplate::from_source(
        "{{ n }} {{ t }} {{ f }} {{ x }} {{ l }} {{ m }} {{ t | string }} {{ 2.0 }} {{ u }}|",
        "",
        "",
    )
    .unwrap();
    let extra = [
        ("n".to_string(), json!(null)),
        ("t".into(), json!(true)),
        ("f".into(), json!(false)),
        ("x".into(), json!("it's")),
        ("l".into(), json!(["a", 1, null, "it's"])),
        ("m".into(), json!({"k": [true]})),
    ];
    assert_eq!(
        t.render(&[], false, &extra).unwrap(),
        "None True False it's ['a', 1, None, \"it's\"] {'k': [True]} True 2.0 |"
    );
}

#[test]
fn rendering_is_bounded() {
    // An endless loop runs out of fuel; a huge output hits the size cap.
    let t = ChatTemplate::from_source("{% for i in range(100000000) %}{% endfor %}", "", "").unwrap();
    assert!(matches!(t.render(&[], false, &[]), Err(Error::Template { .. })));
    let t =
        ChatTemplate::from_source("{% for i in range(2000000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", "", "")
            .unwrap();
    assert!(matches!(t.render(&[], false, &[]), Err(Error::Template { .. })));
    let t = ChatTemplate::from_source("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "", "").unwrap();
    assert!(matches!(t.render(&[], false, &[]), Err(Error::Template { .. })));
    // No file system: include finds nothing.
    let t = ChatTemplate::from_source("{% include '/etc/passwd' %}", "", "").unwrap();
    assert!(matches!(t.render(&[], false, &[]), Err(Error::Template { .. })));
    assert!(matches!(ChatTemplate::from_source("{% if %}", "", ""), Err(Error::Template { .. })));
}

/// Tools and tool turns render as transformers renders them
/// (`templates/expected_tools.json`): tools given as Pocket's `ToolSpec`s,
/// messages as Pocket's `ChatMessage`s (calls, results by id).
#[test]
fn tool_renderings_are_identical() {
    use pocket_core::structured::{ToolCall, ToolFormat, ToolSpec};
    let text =
        std::fs::read_to_string(common::fixtures().join("templates/expected_tools.json")).expect("expected_tools.json");
    let cases: Value = serde_json::from_str(&text).expect("json");
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases["cases"].as_array().expect("cases") {
        let name = case["template"].as_str().unwrap();
        let mut t = template(name, case["bos_token"].as_str().unwrap(), case["eos_token"].as_str().unwrap());
        if let Some(now) = case.get("fixed_now") {
            // gpt-oss prints today's date: rendered with the clock at that instant.
            t.set_clock(Some(unix_time(now.as_str().unwrap())));
        }
        let specs: Vec<ToolSpec> = case["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let f = &t["function"];
                ToolSpec::new(
                    f["name"].as_str().unwrap(),
                    f["description"].as_str().unwrap_or(""),
                    f["parameters"].to_string(),
                )
            })
            .collect();
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                tool_calls: m["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| ToolCall {
                                id: c["id"].as_str().unwrap_or("").into(),
                                name: c["function"]["name"].as_str().unwrap().into(),
                                arguments_json: c["function"]["arguments"].to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                tool_call_id: m["tool_call_id"].as_str().map(str::to_string),
                ..ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap_or(""))
            })
            .collect();
        let mut extra: Vec<(String, Value)> = case["extra_variables"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        extra.push(("tools".into(), ToolFormat::template_tools(&specs).unwrap()));
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        checked += 1;
        match t.render(&messages, agp, &extra) {
            Ok(got) if got == case["expected"].as_str().unwrap() => {}
            Ok(got) => failures.push(format!("{name} {}:\n want {:?}\n got  {got:?}", case["id"], case["expected"])),
            Err(e) => failures.push(format!("{name} {}: {e}", case["id"])),
        }
    }
    assert!(checked >= 14, "only {checked} cases");
    assert!(failures.is_empty(), "{} of {checked} differ:\n{}", failures.len(), failures.join("\n"));
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) as seconds since the epoch.
fn unix_time(iso: &str) -> i64 {
    let n: Vec<i64> = iso.split(['-', 'T', ':']).map(|p| p.parse().expect("a number")).collect();
    let (y, m, d) = if n[1] <= 2 { (n[0] - 1, n[1] + 9, n[2]) } else { (n[0], n[1] - 3, n[2]) };
    let days = 365 * y + y / 4 - y / 100 + y / 400 + (153 * m + 2) / 5 + d - 1 - 719_468;
    days * 86_400 + n[3] * 3600 + n[4] * 60 + n[5]
}

/// The clock templates see honours `SOURCE_DATE_EPOCH`, and a fixed clock
/// overrides it.
#[test]
fn the_template_clock_is_source_date_epoch() {
    assert_eq!(unix_time("2024-07-26T12:00:00"), 1_721_995_200);
    let mut t = ChatTemplate::from_source("{{ strftime_now('%Y-%m-%d %H:%M') }}", "", "").unwrap();
    // This test binary's only reader of the variable is this test.
    std::env::set_var("SOURCE_DATE_EPOCH", "951782400");
    assert_eq!(t.render(&[], false, &[]).unwrap(), "2000-02-29 00:00");
    t.set_clock(Some(1_721_995_200));
    assert_eq!(t.render(&[], false, &[]).unwrap(), "2024-07-26 12:00");
    t.set_clock(None);
    assert_eq!(t.render(&[], false, &[]).unwrap(), "2000-02-29 00:00");
    std::env::remove_var("SOURCE_DATE_EPOCH");
}
