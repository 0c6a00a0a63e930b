//! `pocket tokenize` and `pocket template` through the built binary.

mod common;

use common::{fixtures, ok, pocket};

fn vocab(name: &str) -> String {
    fixtures().join("tokenizer").join(format!("ggml-vocab-{name}.gguf")).to_string_lossy().into_owned()
}

#[test]
fn tokenize_json_has_exactly_ids_and_pieces() {
    let out = ok(&["tokenize", "--model", &vocab("qwen2"), "--json", "Hello world<|im_end|>"]);
    assert_eq!(out, "{\"ids\": [9707, 1879, 151645], \"pieces\": [\"Hello\", \" world\", \"<|im_end|>\"]}\n");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), ["ids", "pieces"]);
}

#[test]
fn tokenize_defaults_follow_llama_tokenize() {
    // BOS per metadata (Llama SPM adds it), special tokens parsed, plain lines.
    let spm = vocab("llama-spm");
    assert_eq!(ok(&["tokenize", "--model", &spm, "Hello"]), "     1 -> '<s>'\n 15043 -> ' Hello'\n");
    assert_eq!(ok(&["tokenize", "--model", &spm, "--no-bos", "--ids", "Hello"]), "[15043]\n");
    let qwen = vocab("qwen2");
    let parsed = ok(&["tokenize", "--model", &qwen, "--ids", "<|im_start|>"]);
    assert_eq!(parsed, "[151644]\n");
    let plain = ok(&["tokenize", "--model", &qwen, "--ids", "--no-special", "<|im_start|>"]);
    assert_ne!(plain, parsed);
}

#[test]
fn tokenize_processes_escapes_unless_told_not_to() {
    let qwen = vocab("qwen2");
    assert_eq!(ok(&["tokenize", "--model", &qwen, "--ids", r"a\nb"]), "[64, 198, 65]\n");
    assert_ne!(ok(&["tokenize", "--model", &qwen, "--ids", "--no-escape", r"a\nb"]), "[64, 198, 65]\n");
}

#[test]
fn tokenize_errors_are_one_line() {
    let out = pocket(&["tokenize", "--model", "/nonexistent.gguf", "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn template_prints_exact_bytes_without_newline() {
    let t = fixtures().join("templates/google-gemma-2-2b-it.jinja");
    let out = ok(&[
        "template",
        "--template",
        t.to_str().unwrap(),
        "--bos",
        "<bos>",
        "--messages",
        r#"[{"role": "user", "content": "Hi"}]"#,
        "--add-generation-prompt",
    ]);
    assert_eq!(out, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}

#[test]
fn template_vars_and_file_messages() {
    let t = fixtures().join("templates/meta-llama-Llama-3.2-3B-Instruct.jinja");
    let msgs = std::env::temp_dir().join(format!("pocket-msgs-{}.json", std::process::id()));
    std::fs::write(&msgs, r#"[{"role": "user", "content": "Hello!"}]"#).unwrap();
    let out = ok(&[
        "template",
        "--template",
        t.to_str().unwrap(),
        "--bos",
        "<|begin_of_text|>",
        "--messages",
        &format!("@{}", msgs.display()),
        "--var",
        "date_string=26 Jul 2024",
    ]);
    std::fs::remove_file(&msgs).ok();
    assert!(out.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"), "{out}");
    assert!(out.contains("Today Date: 26 Jul 2024\n"), "{out}");
    assert!(out.ends_with("Hello!<|eot_id|>"), "{out:?}");
}

#[test]
fn template_from_model_without_one_is_chatml() {
    let m = fixtures().join("models/qwen35moe-tiny-F32.gguf");
    let out = ok(&["template", "--model", m.to_str().unwrap(), "--messages", r#"[{"role":"user","content":"Hi"}]"#]);
    assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
}

#[test]
fn template_exception_is_an_error() {
    let t = fixtures().join("templates/google-gemma-2-2b-it.jinja");
    let out =
        pocket(&["template", "--template", t.to_str().unwrap(), "--messages", r#"[{"role":"system","content":"S"}]"#]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("System role not supported"), "{err}");
    assert!(out.stdout.is_empty());
}
