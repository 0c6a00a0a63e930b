//! `pocket inspect`, `logits`, `run`, `bench` and `perplexity` through the built binary.

mod common;

use common::{fixtures, ok, pocket};
use std::path::PathBuf;

fn model(name: &str) -> String {
    fixtures().join("models").join(format!("{name}.gguf")).to_string_lossy().into_owned()
}

/// The real Gemma 3 270M, when present (required when POCKET_REQUIRE_GEMMA is set).
fn gemma() -> Option<String> {
    let p = std::env::var_os("POCKET_GEMMA").map(PathBuf::from).or_else(|| {
        let p = PathBuf::from(std::env::var_os("HOME")?).join(".cache/pocket/gemma-3-270m-q4_k_m.gguf");
        p.is_file().then_some(p)
    });
    if p.is_none() {
        assert!(
            std::env::var_os("POCKET_REQUIRE_GEMMA").is_none(),
            "POCKET_REQUIRE_GEMMA is set but the model is absent"
        );
        eprintln!("skipped: Gemma 3 270M not found");
    }
    p.map(|p| p.to_string_lossy().into_owned())
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).expect("JSON output")
}

#[test]
fn inspect_reports_the_contract_keys() {
    let v = json(&["inspect", &model("qwen35moe-tiny-Q4_K_M"), "--json"]);
    for key in [
        "architecture",
        "tensor_count",
        "parameter_count",
        "file_bytes",
        "tensor_types",
        "expert_count",
        "expert_used_count",
        "bytes_per_token_estimate",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["architecture"], "qwen35moe");
    assert_eq!(v["expert_count"], 8);
    assert_eq!(v["expert_used_count"], 2);
    // Every non-expert weight but the embedding, plus 2/8 of the experts.
    let (est, experts) = (v["bytes_per_token_estimate"].as_u64().unwrap(), v["expert_bytes"].as_u64().unwrap());
    assert!(est < v["file_bytes"].as_u64().unwrap() - experts * 3 / 4 + 1);
    let t = json(&["inspect", &model("gemma3-tiny-Q8_0"), "--json", "--tensors"]);
    let first = &t["tensors"][0];
    for key in ["name", "type", "shape", "bytes", "offset"] {
        assert!(first.get(key).is_some(), "tensor entry lacks {key}");
    }
    assert!(ok(&["inspect", &model("gemma3-tiny-Q8_0")]).contains("gemma3"));
}

#[test]
fn a_bad_file_is_one_line_on_stderr() {
    let tmp = std::env::temp_dir().join(format!("pocket-bad-{}.gguf", std::process::id()));
    std::fs::write(&tmp, b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00")
        .unwrap();
    for cmd in ["inspect", "logits", "run", "bench"] {
        let path = tmp.to_string_lossy().into_owned();
        let args: Vec<&str> = match cmd {
            "inspect" => vec!["inspect", &path],
            "logits" => vec!["logits", "--model", &path, "--tokens", "1,2", "--top", "1"],
            "run" => vec!["run", "--model", &path, "--prompt", "hi"],
            _ => vec!["bench", "--model", &path],
        };
        let out = pocket(&args);
        assert!(!out.status.success(), "{cmd} accepted a bad file");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{cmd}: {err}");
        assert!(err.contains("tensor count"), "{cmd}: {err}");
    }
    std::fs::remove_file(&tmp).ok();
}

#[test]
fn logits_writes_npy_and_top_k_json() {
    let out = std::env::temp_dir().join(format!("pocket-logits-{}.npy", std::process::id()));
    let o = out.to_string_lossy().into_owned();
    ok(&["logits", "--model", &model("qwen3moe-tiny-Q4_K_M"), "--tokens", "785,2062,2174", "--out", &o, "--kv", "f32"]);
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert!(String::from_utf8_lossy(&bytes[10..10 + hlen]).contains("'shape': (3, 4096)"));
    assert_eq!(bytes.len() - 10 - hlen, 3 * 4096 * 4);
    std::fs::remove_file(&out).ok();
    let v =
        json(&["logits", "--model", &model("qwen3moe-tiny-Q4_K_M"), "--tokens", "785,2062", "--top", "3", "--json"]);
    assert_eq!(v["positions"].as_array().unwrap().len(), 2);
    assert_eq!(v["positions"][0]["top"].as_array().unwrap().len(), 3);
}

#[test]
fn run_json_has_text_tokens_prompt_tokens_and_stats() {
    let v = json(&[
        "run",
        "--model",
        &model("qwen35moe-tiny-Q4_K_M"),
        "--prompt",
        "The capital of France",
        "-n",
        "6",
        "--temp",
        "0",
        "--json",
        "--ignore-eos",
    ]);
    assert!(v["text"].is_string());
    assert_eq!(v["tokens"].as_array().unwrap().len(), 6);
    assert!(v["prompt_tokens"].as_u64().unwrap() > 0);
    for key in [
        "generated_tokens",
        "time_to_first_token_ms",
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
        "stop_reason",
    ] {
        assert!(v["stats"].get(key).is_some(), "stats lacks {key}");
    }
    // Seeded sampling is reproducible through the CLI too.
    let args = [
        "run",
        "--model",
        &model("gemma3-tiny-Q4_K_M"),
        "--prompt",
        "Once",
        "-n",
        "8",
        "--seed",
        "11",
        "--temp",
        "1.0",
        "--json",
    ];
    assert_eq!(json(&args)["tokens"], json(&args)["tokens"]);
}

#[test]
fn run_greedy_on_gemma_prints_llama_cpp_text() {
    let Some(g) = gemma() else { return };
    let out = ok(&["run", "--model", &g, "--prompt", "The capital of France is", "-n", "16", "--temp", "0"]);
    eprintln!("{out}");
    // llama.cpp: "The capital of France is the capital of the country of France. It is the largest city in France."
    // Its 12th token is a near-tie (0.03 logits) that builds with other float
    // summation orders resolve either way; the text before it is fixed.
    assert!(out.starts_with("The capital of France is the capital of the country of France. It is the"), "{out}");
}

#[test]
fn bench_json_follows_the_protocol() {
    let v =
        json(&["bench", "--model", &model("qwen3moe-tiny-Q4_K_M"), "-p", "16", "-n", "4", "--draws", "3", "--json"]);
    assert!(v["fingerprint"].as_str().unwrap().len() > 12);
    assert!(v["config"]["isa"].is_string());
    let draws = v["draws"].as_array().unwrap();
    assert_eq!(draws.len(), 3);
    for d in draws {
        assert!(d["prefill_tps"].as_f64().unwrap() > 0.0 && d["decode_tps"].as_f64().unwrap() > 0.0);
    }
    for k in ["prefill_tps", "decode_tps"] {
        let s = &v[k];
        let (mean, min, max) = (s["mean"].as_f64().unwrap(), s["min"].as_f64().unwrap(), s["max"].as_f64().unwrap());
        assert!(min <= mean && mean <= max && s["sd"].as_f64().unwrap() >= 0.0, "{k}: {s}");
    }
    let human = ok(&["bench", "--model", &model("qwen3moe-tiny-Q4_K_M"), "-p", "8", "-n", "2", "--draws", "2"]);
    assert!(human.contains("fingerprint") && human.contains("pp8") && human.contains("tg2"));
}

#[test]
fn bench_verify_cost_times_each_draft_length_and_projects_speed() {
    // The hybrid (checkpoints timed) and an attention-only model.
    for name in ["qwen35moe-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"] {
        let v = json(&["bench", "--model", &model(name), "-p", "16", "--verify-cost", "3", "--draws", "2", "--json"]);
        assert!(v["decode_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(v["recurrent"].as_bool().unwrap(), name.starts_with("qwen35moe"), "{v}");
        assert!(v["mtp_draft_ms"].is_null(), "no MTP layer in {name}");
        let verify = v["verify"].as_array().unwrap();
        assert_eq!(verify.iter().map(|r| r["drafts"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(verify.iter().all(|r| r["ms"].as_f64().unwrap() > 0.0 && r["decode_ratio"].as_f64().unwrap() > 0.0));
        let projected = v["projected"].as_array().unwrap();
        let rates: Vec<f64> = projected.iter().map(|p| p["acceptance"].as_f64().unwrap()).collect();
        assert_eq!(rates, [0.5, 0.65, 0.8]);
        for p in projected {
            let by: Vec<f64> = p["by_drafts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            let best = p["best_drafts"].as_u64().unwrap() as usize;
            assert_eq!(p["decode_tps"].as_f64().unwrap(), by[best - 1]);
            assert!(by.iter().all(|&x| x <= by[best - 1]), "{p}");
        }
    }
    let human =
        ok(&["bench", "--model", &model("qwen3moe-tiny-Q4_K_M"), "-p", "8", "--verify-cost", "2", "--draws", "1"]);
    assert!(human.contains("verify ms") && human.contains("acceptance 0.80"), "{human}");
    let out = pocket(&["bench", "--model", &model("qwen3moe-tiny-Q4_K_M"), "--verify-cost", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--verify-cost 0"), "{err}");
}

#[test]
fn perplexity_of_gemma_matches_llama_cpp() {
    let Some(g) = gemma() else { return };
    let text = fixtures().join("tokenizer/ppl_text.txt").to_string_lossy().into_owned();
    let v = json(&["perplexity", "--model", &g, "--file", &text, "--ctx", "128", "--json"]);
    let ppl = v["ppl"].as_f64().unwrap();
    eprintln!("PPL {ppl} +/- {}", v["ppl_error"]);
    assert!((ppl / 24.0815 - 1.0).abs() < 0.005, "PPL {ppl} vs llama.cpp's 24.0815");
}

#[test]
fn perplexity_kl_against_a_saved_run() {
    // Two quantisations of one model over the same text: KL > 0, agreement < 100 %;
    // the same file against itself: KL ~ 0, agreement 100 %.
    let dir = std::env::temp_dir().join(format!("pocket-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    let (t, base) = (text.to_string_lossy().into_owned(), dir.join("base.bin").to_string_lossy().into_owned());
    let f32m = model("qwen3moe-tiny-F32");
    let q2 = model("qwen3moe-tiny-Q2_K");
    json(&["perplexity", "--model", &f32m, "--file", &t, "--ctx", "32", "--save-logits", &base, "--json"]);
    let same = json(&["perplexity", "--model", &f32m, "--file", &t, "--ctx", "32", "--kl-base", &base, "--json"]);
    assert!(same["kl_divergence"].as_f64().unwrap().abs() < 1e-6);
    assert_eq!(same["top1_agreement"].as_f64().unwrap(), 1.0);
    let other = json(&["perplexity", "--model", &q2, "--file", &t, "--ctx", "32", "--kl-base", &base, "--json"]);
    assert!(other["kl_divergence"].as_f64().unwrap() > 1e-4, "{other}");
    std::fs::remove_dir_all(&dir).ok();
}
