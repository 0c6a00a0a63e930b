//! Every command ends quietly when its reader goes away (`pocket … | head`):
//! status 0 (or death by SIGPIPE, the shell's 141), no panic, no error line.
//! A command added to the CLI without a case here fails the first test.

mod common;
#[path = "../../../download/tests/server/mod.rs"]
mod server;

use std::io::Read;
use std::process::{Command, Stdio};

use common::fixtures;

fn model() -> String {
    fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf").to_string_lossy().into_owned()
}

/// One invocation of each command, producing output after its work.
fn cases(tmp: &std::path::Path, url: &str, sha256: &str) -> Vec<(&'static str, Vec<String>)> {
    let m = model();
    let f32 = fixtures().join("models/qwen3moe-tiny-F32.gguf").to_string_lossy().into_owned();
    let text = fixtures().join("tokenizer/ppl_text.txt").to_string_lossy().into_owned();
    let out = |name: &str| tmp.join(name).to_string_lossy().into_owned();
    let messages = r#"[{"role":"user","content":"Hi"}]"#.to_string();
    let v = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("inspect", v(&["inspect", &m, "--tensors"])),
        ("logits", v(&["logits", "--model", &m, "--tokens", "1,2,3,4,5,6", "--top", "5"])),
        ("tokenize", v(&["tokenize", "--model", &m, "--file", &text, "--ids"])),
        ("template", v(&["template", "--model", &m, "--messages", &messages])),
        ("run", v(&["run", "--model", &m, "--prompt", "Once", "-n", "16", "--temp", "0"])),
        ("chat", v(&["chat", "--model", &m, "--messages", &messages, "-n", "16", "--temp", "0"])),
        ("bench", v(&["bench", "--model", &m, "-p", "4", "-n", "2", "--draws", "1"])),
        ("perplexity", v(&["perplexity", "--model", &m, "--file", &text, "--ctx", "32", "--chunks", "1"])),
        ("bench-kernels", v(&["bench-kernels", "--formats", "q8_0", "--time-ms", "1", "--working-set-mib", "1"])),
        ("gpu-info", v(&["gpu-info"])),
        (
            "imatrix",
            v(&["imatrix", "--model", &m, "--file", &text, "--ctx", "32", "--chunks", "1", "-o", &out("m.imatrix")]),
        ),
        ("quantize", v(&["quantize", &f32, &out("q.gguf"), "Q8_0"])),
        ("split", v(&["split", "--max-tensors", "10", &m, &out("shard")])),
        ("merge", v(&["merge", &out("shard-00001-of-00003.gguf"), &out("merged.gguf")])),
        ("pull", v(&["pull", url, "--sha256", sha256, "-o", &out("pulled.bin"), "--json"])),
        ("help", v(&["--help"])),
    ]
}

/// The binary, with no proxy for the tests' loopback server.
fn pocket() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pocket"));
    c.env("NO_PROXY", "*");
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        c.env_remove(var);
    }
    c
}

/// The subcommands `pocket --help` lists.
fn listed_commands() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_pocket")).arg("--help").output().expect("run pocket --help");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let list = help.split("Commands:").nth(1).expect("a command list").split("\n\n").next().unwrap_or_default();
    list.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

#[test]
fn every_command_has_a_case() {
    let tmp = std::env::temp_dir();
    let covered: Vec<&str> = cases(&tmp, "http://127.0.0.1:9/x", "00").iter().map(|(name, _)| *name).collect();
    for command in listed_commands() {
        assert!(covered.contains(&command.as_str()), "`pocket {command}` has no closed-pipe case in tests/pipes.rs");
    }
}

#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    let tmp = std::env::temp_dir().join(format!("pocket-pipes-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let data = server::bytes(1 << 20, 7);
    let sha256 = server::sha256_hex(&data);
    let served = data.clone();
    let http = server::Server::start(move |_| server::Reply::File(server::Served::new(served.clone())));
    for (name, args) in cases(&tmp, &http.url("/m.bin"), &sha256) {
        // `merge` refuses to overwrite its output.
        let _ = std::fs::remove_file(tmp.join("merged.gguf"));
        // Sanity: the case works and writes something when read to the end.
        let full = pocket().args(&args).output().expect("run pocket");
        assert!(full.status.success(), "pocket {name}: {}", String::from_utf8_lossy(&full.stderr));
        assert!(!full.stdout.is_empty(), "pocket {name} printed nothing");

        let _ = std::fs::remove_file(tmp.join("merged.gguf"));
        // The reader closes at once, before the command has written anything.
        let mut child =
            pocket().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn pocket");
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
        let status = child.wait().expect("wait");
        #[cfg(unix)]
        let by_sigpipe = std::os::unix::process::ExitStatusExt::signal(&status) == Some(13);
        #[cfg(not(unix))]
        let by_sigpipe = false;
        assert!(status.success() || by_sigpipe, "pocket {name} | (closed): {status}, stderr: {stderr}");
        for bad in ["panicked", "Broken pipe", "internal error", "stdout:"] {
            assert!(!stderr.contains(bad), "pocket {name} | (closed) said {bad:?}: {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
