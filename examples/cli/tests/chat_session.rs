//! `pocket chat --session FILE`: a conversation saved after each answer and
//! restored by the next run, which answers as one uninterrupted run would.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::fixtures;

/// `pocket chat` fed `lines` on stdin: (stdout, stderr).
fn chat(model: &str, extra: &[&str], lines: &str) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args(["chat", "--model", model, "-n", "6", "--temp", "0", "--threads", "2"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pocket chat");
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "pocket chat failed: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn a_saved_chat_continues_in_the_next_run_as_one_run_would() {
    for name in ["qwen35moe-tiny-Q4_K_M", "gemma3-tiny-Q8_0"] {
        let model = fixtures().join(format!("models/{name}.gguf"));
        let model = model.to_str().unwrap();
        let dir = std::env::temp_dir().join(format!("pocket-chat-session-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("chat.snapshot");
        let session = file.to_str().unwrap();

        let (both, _) = chat(model, &[], "Hello there\nTell me more\n");
        let (first, _) = chat(model, &["--session", session], "Hello there\n");
        assert!(file.exists(), "{name}: no snapshot saved");
        let (second, err) = chat(model, &["--session", session], "Tell me more\n");
        assert!(err.contains("(restored 2 messages"), "{name}: {err}");
        assert_eq!(format!("{first}{second}"), both, "{name}: the restored chat answers differently");

        // /save and /load by name inside one run, and a damaged snapshot is refused, not fatal.
        let other = dir.join("other.snapshot");
        let (_, err) = chat(model, &[], &format!("Hello there\n/save {}\n", other.display()));
        assert!(err.contains("(saved to"), "{err}");
        let mut bytes = std::fs::read(&other).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&other, bytes).unwrap();
        let (_, err) = chat(model, &[], &format!("/load {}\nHi\n", other.display()));
        assert!(err.contains("error:"), "{name}: a damaged snapshot loaded: {err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
