//! Structured output through the FFI types from Rust: messages with tool
//! calls converted both ways, events in order, a tool call and its result
//! sent back, constraints and refusals. (Python and Kotlin run the same
//! requests in bindings/tests/python and bindings/tests/kotlin.)

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pocket_core::chat::ChatMessage as CoreChatMessage;
use pocket_core::structured as core;
use pocket_ffi::{
    ChatMessage, EventListener, GenerateOptions, GenerationEvent, LoadOptions, PocketError, PocketModel, PocketSession,
    Reasoning, SessionOptions, StopReason, TokenListener, ToolCall, ToolCallValue, ToolChoice, ToolSpec,
};

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let store = std::env::var_os("POCKET_FIXTURES").map_or_else(|| root.join("../shared/fixtures"), PathBuf::from);
    store.join("models").join(name).to_string_lossy().into_owned()
}

fn session() -> Arc<PocketSession> {
    let model = PocketModel::load(fixture("qwen3moe-tiny-Q4_K_M.gguf"), LoadOptions::default()).expect("fixture model");
    PocketSession::new(model, SessionOptions { context_length: 512, ..SessionOptions::default() }).unwrap()
}

fn greedy(max_tokens: u32) -> GenerateOptions {
    GenerateOptions { max_tokens, temperature: 0.0, ..GenerateOptions::default() }
}

/// Records every event; fails with `fail` when given.
#[derive(Default)]
struct Events {
    seen: Mutex<Vec<GenerationEvent>>,
    fail: Option<PocketError>,
}

impl EventListener for Events {
    fn on_event(&self, event: GenerationEvent) -> Result<bool, PocketError> {
        self.seen.lock().unwrap().push(event);
        match &self.fail {
            Some(e) => Err(e.clone()),
            None => Ok(true),
        }
    }
}

impl Events {
    fn take(&self) -> Vec<GenerationEvent> {
        std::mem::take(&mut self.seen.lock().unwrap())
    }
}

struct Pieces(Mutex<Vec<String>>);

impl TokenListener for Pieces {
    fn on_token(&self, piece: String) -> Result<bool, PocketError> {
        self.0.lock().unwrap().push(piece);
        Ok(true)
    }
}

fn clock_tool() -> ToolSpec {
    ToolSpec {
        name: "get_time".into(),
        description: "The current time in a time zone".into(),
        parameters_json: r#"{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","local"]}},"required":["zone"],"additionalProperties":false}"#.into(),
    }
}

#[test]
fn tool_calls_round_trip_through_chat_messages() {
    let call = ToolCall { id: "call_1".into(), name: "get_time".into(), arguments_json: r#"{"zone":"UTC"}"#.into() };
    let assistant = ChatMessage {
        role: "assistant".into(),
        content: String::new(),
        tool_calls: vec![call.clone()],
        tool_call_id: None,
    };
    let result = ChatMessage {
        role: "tool".into(),
        content: r#"{"time":"12:00"}"#.into(),
        tool_calls: Vec::new(),
        tool_call_id: Some("call_1".into()),
    };
    for m in [assistant.clone(), result.clone()] {
        let core = CoreChatMessage::from(m.clone());
        assert_eq!(ChatMessage::from(core), m);
    }
    let core = CoreChatMessage::from(assistant);
    assert_eq!(
        core.tool_calls,
        vec![core::ToolCall {
            id: "call_1".into(),
            name: "get_time".into(),
            arguments_json: r#"{"zone":"UTC"}"#.into()
        }]
    );
    assert_eq!(CoreChatMessage::from(result).tool_call_id.as_deref(), Some("call_1"));
}

#[test]
fn core_events_keep_their_kind_and_order() {
    let call = core::ToolCall { id: "c".into(), name: "n".into(), arguments_json: "{}".into() };
    let core_events = [
        core::GenerationEvent::Reasoning("hmm".into()),
        core::GenerationEvent::Text("Hi".into()),
        core::GenerationEvent::ToolCall(call),
        core::GenerationEvent::Text("!".into()),
    ];
    let events: Vec<GenerationEvent> = core_events.into_iter().map(GenerationEvent::from).collect();
    let want_call = ToolCall { id: "c".into(), name: "n".into(), arguments_json: "{}".into() };
    assert_eq!(
        events,
        [
            GenerationEvent::Reasoning { piece: "hmm".into() },
            GenerationEvent::Text { piece: "Hi".into() },
            GenerationEvent::ToolCall { call: ToolCallValue(want_call) },
            GenerationEvent::Text { piece: "!".into() },
        ]
    );
}

#[test]
fn text_events_are_the_token_listener_s_pieces() {
    let s = session();
    let messages = vec![ChatMessage::new("user", "Hello")];
    let pieces = Arc::new(Pieces(Mutex::new(Vec::new())));
    let plain = s.chat(messages.clone(), greedy(12), pieces.clone()).unwrap();
    s.reset();
    let events = Arc::new(Events::default());
    let stats = s.chat_events(messages, greedy(12), events.clone()).unwrap();
    let texts: Vec<String> = events
        .take()
        .into_iter()
        .map(|e| match e {
            GenerationEvent::Text { piece } => piece,
            other => panic!("only text from a model without thinking or tools: {other:?}"),
        })
        .collect();
    assert_eq!(texts, *pieces.0.lock().unwrap());
    assert_eq!(stats.text, plain.text);
    assert_eq!(texts.concat(), stats.text);
    assert!(stats.reasoning.is_empty() && stats.tool_calls.is_empty());

    // generate_events too.
    let g = s.generate_events("Once upon a time".into(), greedy(6), events.clone()).unwrap();
    assert_eq!(g.generated_tokens, 6);
    assert!(events.take().iter().all(|e| matches!(e, GenerationEvent::Text { .. })));
}

#[test]
fn a_required_tool_call_and_its_result_sent_back() {
    let s = session();
    let user = ChatMessage::new("user", "What time is it?");
    let opts = GenerateOptions { tools: vec![clock_tool()], tool_choice: Some(ToolChoice::Required), ..greedy(96) };
    let events = Arc::new(Events::default());
    let first = s.chat_events(vec![user.clone()], opts.clone(), events.clone()).unwrap();
    assert_eq!(first.stop_reason, StopReason::ToolCalls, "{first:?}");
    let calls: Vec<ToolCall> = events
        .take()
        .into_iter()
        .filter_map(|e| match e {
            GenerationEvent::ToolCall { call } => Some(call.0),
            _ => None,
        })
        .collect();
    assert_eq!(calls, first.tool_calls);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_time");
    assert!(!calls[0].id.is_empty());
    assert!(
        calls[0].arguments_json == r#"{"zone":"UTC"}"# || calls[0].arguments_json == r#"{"zone":"local"}"#,
        "{}",
        calls[0].arguments_json
    );

    // The app runs the tool and answers with the call's id; the next turn renders both.
    let history = vec![
        user,
        ChatMessage { role: "assistant".into(), content: String::new(), tool_calls: calls.clone(), tool_call_id: None },
        ChatMessage {
            role: "tool".into(),
            content: r#"{"time":"12:00"}"#.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(calls[0].id.clone()),
        },
    ];
    let second =
        s.chat_events(history, GenerateOptions { tools: vec![clock_tool()], ..greedy(4) }, events.clone()).unwrap();
    assert!(second.prompt_tokens > first.prompt_tokens, "{second:?}");
    assert_ne!(second.stop_reason, StopReason::ToolCalls);
}

#[test]
fn constraints_and_refusals_are_invalid_arguments() {
    let s = session();
    let user = vec![ChatMessage::new("user", "Pick one.")];
    let choice = GenerateOptions { choices: vec!["red".into(), "green".into()], ..greedy(8) };
    let stats = s.chat(user.clone(), choice, Arc::new(Pieces(Mutex::new(Vec::new())))).unwrap();
    assert!(stats.text == "red" || stats.text == "green", "{:?}", stats.text);

    let refused = |opts: GenerateOptions, field: &str| {
        let e = s.chat_events(user.clone(), opts, Arc::new(Events::default())).unwrap_err();
        assert!(matches!(&e, PocketError::InvalidArgument { reason } if reason.contains(field)), "{field}: {e:?}");
    };
    refused(GenerateOptions { json_schema: Some("{not json".into()), ..greedy(8) }, "json_schema");
    refused(GenerateOptions { json_schema: Some(r#"{"not":{}}"#.into()), ..greedy(8) }, "json_schema");
    refused(GenerateOptions { regex: Some("(".into()), ..greedy(8) }, "regex");
    refused(GenerateOptions { regex: Some("a".into()), choices: vec!["a".into()], ..greedy(8) }, "constraint");
    refused(GenerateOptions { reasoning: Some(Reasoning::On), ..greedy(8) }, "reasoning");
    refused(GenerateOptions { reasoning: Some(Reasoning::Budget { max_tokens: 8 }), ..greedy(8) }, "reasoning");
    refused(GenerateOptions { tool_choice: Some(ToolChoice::Named { name: "x".into() }), ..greedy(8) }, "tool_choice");
    // The session is unharmed.
    assert_eq!(s.chat(user, greedy(3), Arc::new(Pieces(Mutex::new(Vec::new())))).unwrap().generated_tokens, 3);
}

#[test]
fn a_failing_event_listener_is_the_request_s_error() {
    let s = session();
    let failing =
        Arc::new(Events { fail: Some(PocketError::Internal { reason: "listener bug".into() }), ..Default::default() });
    let e = s.generate_events("Hello".into(), greedy(8), failing.clone()).unwrap_err();
    assert_eq!(e, PocketError::Internal { reason: "listener bug".into() });
    // Nothing more reached it after it failed.
    assert_eq!(failing.take().len(), 1);
    assert_eq!(s.generate_events("Hello".into(), greedy(2), Arc::new(Events::default())).unwrap().generated_tokens, 2);
}

#[test]
fn a_chat_template_of_the_caller_replaces_the_file_s() {
    let template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]";
    let opts = LoadOptions { chat_template: Some(template.into()), ..LoadOptions::default() };
    let model = PocketModel::load(fixture("qwen3moe-tiny-Q4_K_M.gguf"), opts).unwrap();
    let s = PocketSession::new(model, SessionOptions::default()).unwrap();
    let stats =
        s.chat(vec![ChatMessage::new("user", "Hi")], greedy(2), Arc::new(Pieces(Mutex::new(Vec::new())))).unwrap();
    assert_eq!(stats.generated_tokens, 2);
    let bad = LoadOptions { chat_template: Some("{% if %}".into()), ..LoadOptions::default() };
    let e =
        PocketModel::load(fixture("qwen3moe-tiny-Q4_K_M.gguf"), bad).err().expect("a template that does not compile");
    assert!(matches!(&e, PocketError::InvalidArgument { reason } if reason.contains("chat_template")), "{e:?}");
}
