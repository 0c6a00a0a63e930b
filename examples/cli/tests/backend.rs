//! `--backend cpu|gpu` on `run`, `chat`, `bench`, `logits` and
//! `perplexity`; what `pocket bench --json` reports of the backend (config,
//! fingerprint, the GPU's counters). The GPU runs on lavapipe in
//! `scripts/test.sh`; without an adapter the GPU tests say why and pass,
//! unless `POCKET_REQUIRE_GPU=1`.

mod common;

use common::{fixtures, ok, pocket};

fn model(name: &str) -> String {
    fixtures().join("models").join(format!("{name}.gguf")).to_string_lossy().into_owned()
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).expect("JSON output")
}

/// Whether `pocket gpu-info` finds an adapter (a failure when
/// `POCKET_REQUIRE_GPU=1` and it does not).
fn gpu_present() -> bool {
    let out = pocket(&["gpu-info"]);
    if out.status.success() {
        return true;
    }
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(std::env::var("POCKET_REQUIRE_GPU").map_or(true, |v| v != "1"), "POCKET_REQUIRE_GPU=1 but {why}");
    eprintln!("skipping the GPU test: {why}");
    false
}

#[test]
fn every_loading_command_takes_the_backend_flag() {
    let m = model("gemma3-tiny-Q8_0");
    for cmd in ["run", "chat", "bench", "logits", "perplexity"] {
        let out = pocket(&[cmd, "--model", &m, "--backend", "tpu"]);
        assert!(!out.status.success(), "{cmd} accepted --backend tpu");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("'tpu' is not a backend (cpu, gpu or auto)"), "{cmd}: {err}");
        let help = ok(&[cmd, "--help"]);
        assert!(help.contains("--backend <DEVICE>"), "{cmd} --help lacks --backend");
    }
}

#[test]
fn bench_on_the_cpu_names_its_backend_and_no_adapter() {
    let m = model("gemma3-tiny-Q8_0");
    for backend in ["cpu", "auto"] {
        let v = json(&["bench", "--model", &m, "-p", "4", "-n", "2", "--draws", "1", "--backend", backend, "--json"]);
        assert_eq!(v["config"]["backend"], "cpu", "{backend}");
        assert!(v["config"]["adapter"].is_null(), "{backend}");
        assert!(v["gpu"].is_null() && v["gpu_fallback"].is_null(), "{backend}");
        assert!(!v["fingerprint"].as_str().unwrap().contains("gpu:"), "{backend}");
    }
}

#[test]
fn bench_on_the_gpu_reports_the_adapter_and_what_the_device_did() {
    if !gpu_present() {
        return;
    }
    let m = model("gemma3-tiny-Q8_0");
    let v = json(&["bench", "--model", &m, "-p", "4", "-n", "3", "--draws", "2", "--backend", "gpu", "--json"]);
    let config = &v["config"];
    assert_eq!(config["backend"], "gpu");
    let name = config["adapter"]["name"].as_str().unwrap();
    assert!(!name.is_empty() && config["adapter"]["driver"].is_string(), "{config}");
    assert!(config["adapter"]["kernels"].is_string(), "{config}");
    assert!(v["fingerprint"].as_str().unwrap().contains(&format!(" gpu:{}", name.replace(' ', "_"))));

    let g = &v["gpu"];
    eprintln!("{}", serde_json::to_string_pretty(g).unwrap());
    let f = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("gpu.{k} missing: {g}"));
    // A decoded token is one recorded submission with one readback: no
    // product, attention or delta rule of its own on either side.
    assert_eq!(f("one_submission_tokens_per_token"), 1.0, "{g}");
    for k in ["products", "attention", "delta_rule"] {
        assert_eq!((f(&format!("{k}_on_gpu_per_token")), f(&format!("{k}_on_cpu_per_token"))), (0.0, 0.0), "{k}");
    }
    assert_eq!((f("submissions_per_token"), f("readbacks_per_token")), (1.0, 1.0), "{g}");
    assert!(f("dispatches_per_token") > 1.0, "{g}");
    // The KV cache goes up as it grows, not whole per token.
    assert!(f("cache_bytes_uploaded_after_load") > 0.0);
    assert!(f("readback_bytes_per_token") > 0.0 && f("bytes_uploaded_per_token") > 0.0);
    // Warm after the warm-up draw: no buffer is made while decoding.
    assert_eq!(f("buffers_created_per_token"), 0.0);
    // Weights go up at load (the expert stacks whole, every matrix a
    // decoded token reads), none after.
    assert!(f("weight_bytes_uploaded_at_load") > 0.0);
    assert_eq!(f("weight_bytes_uploaded_after_load"), 0.0);
    // Nothing fell back to the CPU.
    assert_eq!(v["gpu_fallback"], serde_json::json!([]), "{v}");

    let text = ok(&["bench", "--model", &m, "-p", "4", "-n", "2", "--draws", "1", "--backend", "gpu"]);
    assert!(text.contains("gpu          per decoded token:"), "{text}");
}

/// Blocks without a device path (LFM2's short conv, Mamba2's scan, MLA's
/// attention) run on the CPU under the GPU backend: `bench --json` names
/// them in `gpu_fallback` and counts their calls per decoded token (one per
/// layer of that kind); `gpu-info` lists them.
#[test]
fn bench_on_the_gpu_names_the_blocks_that_fall_back_to_the_cpu() {
    if !gpu_present() {
        return;
    }
    for (name, block, per_token) in [
        ("lfm2moe-tiny-Q8_0", "short_conv", 2.0),
        ("granitehybrid-tiny-Q8_0", "mamba2_scan", 1.0),
        ("deepseek2-tiny-Q8_0", "mla_attention", 3.0),
    ] {
        let m = model(name);
        let v = json(&["bench", "--model", &m, "-p", "4", "-n", "2", "--draws", "1", "--backend", "gpu", "--json"]);
        assert_eq!(v["gpu_fallback"], serde_json::json!([block]), "{name}: {v}");
        let calls = &v["gpu"]["host_blocks_per_token"];
        assert_eq!(calls[block].as_f64(), Some(per_token), "{name}: {calls}");
        let text = ok(&["bench", "--model", &m, "-p", "4", "-n", "2", "--draws", "1", "--backend", "gpu"]);
        assert!(text.contains(&format!("gpu fallback on the CPU: {block}")), "{name}: {text}");
    }
    let info = ok(&["gpu-info"]);
    assert!(info.contains("on the CPU   short_conv mamba2_scan mla_attention"), "{info}");
    let v = json(&["gpu-info", "--json"]);
    assert_eq!(v["host_blocks"], serde_json::json!(["short_conv", "mamba2_scan", "mla_attention"]));
}

#[test]
fn run_and_logits_on_the_gpu_agree_with_the_cpu() {
    if !gpu_present() {
        return;
    }
    // Greedy text, 32 tokens: identical on the F32 file (only f32 rounding
    // differs). The quantised tiny files have random weights whose
    // near-ties flip within a dozen tokens when one activation moves by one
    // int8 quantum (gemma3-tiny-Q8_0: the 8th token), so their bar is the
    // logits below and the core tests' tolerances.
    let f32_model = model("gemma3-tiny-F32");
    let run = |backend| {
        ok(&["run", "--model", &f32_model, "--prompt", "Once upon", "-n", "32", "--temp", "0", "--backend", backend])
    };
    assert_eq!(run("gpu"), run("cpu"));
    let m = model("gemma3-tiny-Q8_0");
    let logits = |backend| {
        json(&["logits", "--model", &m, "--tokens", "2,100,200", "--top", "1", "--json", "--backend", backend])
    };
    let (cpu, gpu) = (logits("cpu"), logits("gpu"));
    let positions = |v: &serde_json::Value| v["positions"].as_array().unwrap().clone();
    let (cpu, gpu) = (positions(&cpu), positions(&gpu));
    assert_eq!(cpu.len(), 3);
    for (c, g) in cpu.iter().zip(&gpu) {
        let (c, g) = (&c["top"][0], &g["top"][0]);
        assert_eq!(c["id"], g["id"], "top token: cpu {c}, gpu {g}");
        let d = (c["logit"].as_f64().unwrap() - g["logit"].as_f64().unwrap()).abs();
        assert!(d < 0.1, "top logit: cpu {c}, gpu {g}");
    }
}
