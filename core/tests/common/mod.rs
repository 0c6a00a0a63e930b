//! Shared helpers for integration tests: locating the fixture store.
#![allow(dead_code)]

pub mod arrays;
pub mod npy;
pub mod synth;

use std::path::{Path, PathBuf};

/// The fixture store: `$POCKET_FIXTURES`, else `../shared/fixtures` next to the
/// repository. Panics (fails the test loudly) when it is absent: a missing
/// store must never turn into silently skipped tests.
pub fn fixtures() -> PathBuf {
    let dir = match std::env::var_os("POCKET_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
    };
    assert!(
        dir.join("manifest.json").is_file(),
        "fixture store not found at {} (set POCKET_FIXTURES to the folder holding manifest.json)",
        dir.display()
    );
    dir
}

/// The parsed `manifest.json`.
pub fn manifest() -> serde_json::Value {
    manifest_named("manifest.json")
}

/// A parsed manifest of the store by file name (`manifest_gemma4.json`, ...).
pub fn manifest_named(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {name}: {e}"))
}

/// A manifest entry's `key` as token ids (`prompt`, `hf_greedy32`, ...).
pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}: not an array"))
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// A fixture model by name: `models/NAME.gguf` in the store.
pub fn model_file(name: &str) -> PathBuf {
    fixtures().join(format!("models/{name}.gguf"))
}

/// A generation's streamed text and its statistics (the request must succeed).
pub fn generate_text(
    s: &mut pocket_core::session::Session,
    prompt: &str,
    o: &pocket_core::session::GenerateOptions,
) -> (String, pocket_core::session::GenerationStats) {
    let mut text = String::new();
    let stats = s
        .generate(prompt, o, &mut |p| {
            text.push_str(p);
            true
        })
        .unwrap();
    (text, stats)
}

/// `tokens` with every 4th from `from` on replaced by the one before it
/// where they differ: as speculative drafts (`testing::script_drafts`), the
/// model's own tokens accepted and, every 4th, a token a constraint over the
/// same alphabet still allows but sampling rejects.
pub fn swapped(tokens: &[u32], from: usize) -> Vec<u32> {
    let mut t = tokens.to_vec();
    for i in (from + 3..t.len()).step_by(4) {
        t[i] = t[i - 1];
    }
    t
}

/// The real Gemma 3 270M file: `$POCKET_GEMMA` or the cache the README's
/// commands fill (`~/.cache/pocket/gemma-3-270m-q4_k_m.gguf`). `None` when absent.
pub fn gemma_270m() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("POCKET_GEMMA") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".cache/pocket/gemma-3-270m-q4_k_m.gguf");
    p.is_file().then_some(p)
}

/// The llama.cpp source tree `cargo xtask llama-source` unpacks (the
/// llama-cpp-python 0.3.36 sdist, commit 0c1e570): under `$POCKET_CACHE`,
/// else `~/.cache/pocket`, at `llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp`.
/// `None` (the caller skips) when absent, unless `POCKET_REQUIRE_LLAMA_SRC=1`:
/// then a missing tree fails the test.
pub fn llama_src(test: &str) -> Option<PathBuf> {
    let cache = match std::env::var_os("POCKET_CACHE") {
        Some(d) => PathBuf::from(d),
        None => Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/pocket"),
    };
    let src = cache.join("llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp");
    if src.join("models").is_dir() {
        return Some(src);
    }
    if std::env::var("POCKET_REQUIRE_LLAMA_SRC").as_deref() == Ok("1") {
        panic!(
            "{test}: the llama.cpp source tree is required (POCKET_REQUIRE_LLAMA_SRC=1) but absent at {}: \
             run `cargo xtask llama-source`",
            src.display()
        );
    }
    eprintln!("{test}: skipped, llama.cpp source tree absent at {} (run `cargo xtask llama-source`)", src.display());
    None
}

/// Teacher-forced logits of `tokens` (f32 KV cache), evaluated as one batch
/// (the multi-token kernels) and token by token (the rows kernels).
pub fn batch_and_decode_logits(
    model: &pocket_core::model::Model,
    pool: &pocket_core::threads::ThreadPool,
    tokens: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    use pocket_core::model::{KvType, Logits};
    let mut st = model.new_state(tokens.len() + 8, KvType::F32).unwrap();
    model.forward(pool, &mut st, tokens, Logits::All).unwrap();
    let batch = st.logits().to_vec();
    let mut st = model.new_state(tokens.len(), KvType::F32).unwrap();
    let mut decode = Vec::with_capacity(batch.len());
    for &t in tokens {
        model.forward(pool, &mut st, &[t], Logits::Last).unwrap();
        decode.extend_from_slice(st.logits());
    }
    (batch, decode)
}

/// Model `name`'s entry in the fixture manifest `manifest` (e.g. `manifest_moe_families.json`).
pub fn manifest_model(manifest: &str, name: &str) -> serde_json::Value {
    let m = manifest_named(manifest);
    let models = m["models"].as_array().unwrap();
    models.iter().find(|x| x["name"] == name).unwrap_or_else(|| panic!("{name} in {manifest}")).clone()
}

/// Every file of manifest entry `m` against llama.cpp's logits of its
/// prompt, as one batch and token by token: median KL ≤ 5e-3 and top-1 on
/// at least 12 of 16 rows. Returns each file's name and (batch, decode) logits.
pub fn files_match_llama_cpp(m: &serde_json::Value) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    use arrays::{max_abs_diff, median_kl_and_top1, read_npy};
    use pocket_core::model::Model;
    let (dir, pool) = (fixtures(), pocket_core::threads::ThreadPool::new(2));
    let tokens = ids(m, "prompt");
    let mut out = Vec::new();
    for f in m["files"].as_array().unwrap() {
        let file = f["gguf"].as_str().unwrap();
        let model = Model::load(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let v = model.n_vocab();
        let (batch, decode) = batch_and_decode_logits(&model, &pool, &tokens);
        let reference = read_npy(&dir.join(f["llama_logits"].as_str().unwrap()));
        assert_eq!(reference.shape, [tokens.len(), v]);
        for (path, ours) in [("batch", &batch), ("decode", &decode)] {
            let (med, top1) = median_kl_and_top1(&reference.f32, ours, v);
            let d = max_abs_diff(ours, &reference.f32);
            eprintln!("{file} {path}: median KL {med:.2e}, top-1 {top1}/16, max |Δ| {d:.3e} vs llama.cpp");
            assert!(med <= 5e-3, "{file} {path}: median KL {med}");
            assert!(top1 >= 12, "{file} {path}: top-1 {top1}/16");
        }
        out.push((file.to_string(), batch, decode));
    }
    out
}
