//! `pocket pull` against a local server: a pull killed with SIGKILL resumes
//! from its partial file re-reading less than a tenth of it; errors exit
//! non-zero with their kind; `hf://` follows HF_ENDPOINT; parts are one pull.

#[path = "../../../download/tests/server/mod.rs"]
mod server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use server::{bytes, sha256_hex, temp_dir, Reply, Served, Server};

fn pocket() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pocket"));
    // The tests' server is on loopback: no proxy from the environment.
    c.env("NO_PROXY", "*").env_remove("HTTP_PROXY").env_remove("HTTPS_PROXY").env_remove("ALL_PROXY");
    c.env_remove("http_proxy").env_remove("https_proxy").env_remove("all_proxy");
    c
}

fn last_json(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    serde_json::from_str(text.lines().last().expect("a line")).expect("JSON")
}

#[test]
fn a_killed_pull_resumes_reading_back_less_than_a_tenth() {
    let data = bytes(48 << 20, 40);
    let hash = sha256_hex(&data);
    let d2 = data.clone();
    // 24 MB/s: the kill lands mid-download.
    let server = Server::start(move |_| Reply::File(Served { rate: Some(24 << 20), ..Served::new(d2.clone()) }));
    let dir = temp_dir("cli-kill");
    let dest = dir.join("m.gguf");
    let url = server.url("/m.gguf");
    let dest_s = dest.to_str().unwrap();
    let mut child = pocket()
        .args(["pull", &url, "--sha256", &hash, "-o", dest_s, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let t = Instant::now();
    loop {
        let line = lines.next().expect("progress before the end").unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "progress", "{line}");
        assert_eq!(v["total"], 48 << 20);
        if v["done"].as_u64().unwrap() >= 24 << 20 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!dest.exists());
    let had = std::fs::metadata(dir.join("m.gguf.part")).unwrap().len();
    assert!(had >= 24 << 20, "{had}");

    let out = pocket().args(["pull", &url, "--sha256", &hash, "-o", dest_s, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = last_json(&out.stdout);
    assert_eq!(done["event"], "done");
    assert_eq!(done["resumed_bytes"], had);
    let reread = done["reread_bytes"].as_u64().unwrap();
    assert!(reread < had / 10, "re-read {reread} of {had}");
    assert_eq!(done["received_bytes"], (48u64 << 20) - had);
    assert_eq!(done["sha256"][0], hash);
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert!(!dir.join("m.gguf.part").exists() && !dir.join("m.gguf.part.meta").exists());
    eprintln!("killed at {had} bytes; the resume re-read {reread}");
}

#[test]
fn errors_exit_non_zero_with_their_kind() {
    let data = bytes(100_000, 41);
    let d2 = data.clone();
    let server = Server::start(move |req| match req.path.as_str() {
        "/m.gguf" => Reply::File(Served::new(d2.clone())),
        _ => Reply::Status(404, vec![]),
    });
    let dir = temp_dir("cli-errors");
    let dest = dir.join("m.gguf");
    let dest_s = dest.to_str().unwrap();
    let wrong = "0".repeat(64);
    let out = pocket().args(["pull", &server.url("/m.gguf"), "--sha256", &wrong, "-o", dest_s]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("pocket: pull: integrity error: ") && err.contains("SHA-256"), "{err}");
    assert!(!dest.exists());
    let out = pocket()
        .args(["pull", &server.url("/nope.gguf"), "--sha256", &wrong, "-o", dest_s, "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = last_json(&out.stdout);
    assert_eq!((e["event"].as_str(), e["kind"].as_str()), (Some("error"), Some("network")));
    assert!(e["reason"].as_str().unwrap().contains("404"));
    // A hash is required unless --no-verify.
    let out = pocket().args(["pull", &server.url("/m.gguf"), "-o", dest_s]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid-argument error"));
    let out = pocket().args(["pull", &server.url("/m.gguf"), "--no-verify", "-o", dest_s]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&sha256_hex(&data)));
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
}

#[test]
fn hub_urls_and_parts() {
    let a = bytes(300_000, 42);
    let b = bytes(200_000, 43);
    let (a2, b2) = (a.clone(), b.clone());
    let server = Server::start(move |req| match req.path.as_str() {
        "/org/model/resolve/main/m-00001-of-00002.gguf" => Reply::File(Served::new(a2.clone())),
        "/org/model/resolve/v2/m-00002-of-00002.gguf" => Reply::File(Served::new(b2.clone())),
        _ => Reply::Status(404, vec![]),
    });
    let dir = temp_dir("cli-hub");
    let out = pocket()
        .env("HF_ENDPOINT", format!("http://{}", server.addr))
        .args(["pull", "hf://org/model/m-00001-of-00002.gguf", "hf://org/model/m-00002-of-00002.gguf@v2"])
        .args(["--sha256", &sha256_hex(&a), "--sha256", &sha256_hex(&b), "-o", dir.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = last_json(&out.stdout);
    assert_eq!(done["bytes"], 500_000);
    assert_eq!(std::fs::read(dir.join("m-00001-of-00002.gguf")).unwrap(), *a);
    assert_eq!(std::fs::read(dir.join("m-00002-of-00002.gguf")).unwrap(), *b);
}
