//! The forward pass against the references: transformers (F32 files),
//! llama.cpp (every file), decode == prefill, and the real Gemma 3 270M.

mod common;

use std::path::Path;

use common::arrays::{argmax, kl, max_abs_diff, median, read_npy, read_npz};
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::threads::ThreadPool;

/// The fixture models (every architecture the engine runs).
const ARCHES: &[&str] = &["qwen3moe-tiny", "qwen35moe-tiny", "gemma3-tiny", "mixtral-tiny"];

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

/// Teacher-forced logits of every position, evaluated as one batch.
fn batch_logits(model: &Model, tokens: &[u32], kv: KvType) -> Vec<f32> {
    let mut st = model.new_state(tokens.len() + 8, kv).unwrap();
    model.forward(&pool(), &mut st, tokens, Logits::All).unwrap();
    assert_eq!(st.logit_rows(), tokens.len());
    st.logits().to_vec()
}

fn prompt(model: &serde_json::Value) -> Vec<u32> {
    model["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn models() -> Vec<serde_json::Value> {
    let m = common::manifest();
    m["models"].as_array().unwrap().iter().filter(|m| ARCHES.contains(&m["name"].as_str().unwrap())).cloned().collect()
}

#[test]
fn f32_files_match_transformers() {
    let dir = common::fixtures();
    let mut checked = 0;
    for m in models() {
        let name = m["name"].as_str().unwrap();
        let Some(f32_file) = m["files"].as_array().unwrap().iter().find(|f| f["type"] == "F32") else { continue };
        let model = Model::load(dir.join(f32_file["gguf"].as_str().unwrap())).unwrap();
        let tokens = prompt(&m);
        let ours = batch_logits(&model, &tokens, KvType::F32);
        let hf = read_npy(&dir.join(m["hf_logits"].as_str().unwrap()));
        assert_eq!(hf.shape, [tokens.len(), model.n_vocab()]);
        let tol = if name.starts_with("gemma3") { 1e-3 } else { 1e-4 };
        let d = max_abs_diff(&ours, &hf.f32);
        eprintln!("{name} F32 vs transformers: max |Δ| = {d:.3e} (tolerance {tol:.0e})");
        assert!(d <= tol, "{name}: max |Δ| {d} > {tol}");
        checked += 1;
    }
    assert_eq!(checked, 3);
}

#[test]
fn every_file_matches_llama_cpp() {
    let dir = common::fixtures();
    let mut checked = 0;
    for m in models() {
        let tokens = prompt(&m);
        for f in m["files"].as_array().unwrap() {
            let file = f["gguf"].as_str().unwrap();
            let model = Model::load(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            let ours = batch_logits(&model, &tokens, KvType::F32);
            let reference = read_npy(&dir.join(f["llama_logits"].as_str().unwrap()));
            let v = model.n_vocab();
            let (mut kls, mut top1) = (Vec::new(), 0);
            for (a, b) in reference.f32.chunks_exact(v).zip(ours.chunks_exact(v)) {
                kls.push(kl(a, b));
                top1 += (argmax(a) == argmax(b)) as usize;
            }
            let med = median(kls.clone());
            let d = max_abs_diff(&ours, &reference.f32);
            eprintln!(
                "{file}: median KL {med:.2e}, max KL {:.2e}, top-1 {top1}/16, max |Δ| {d:.3e}",
                kls.iter().cloned().fold(0.0, f64::max)
            );
            assert!(med <= 5e-3, "{file}: median KL {med}");
            assert!(top1 >= 12, "{file}: top-1 agreement {top1}/16");
            checked += 1;
        }
    }
    assert_eq!(checked, 14);
}

#[test]
fn decoding_one_token_at_a_time_equals_the_batch() {
    let dir = common::fixtures();
    for m in models() {
        let tokens = prompt(&m);
        for f in m["files"].as_array().unwrap() {
            let file = f["gguf"].as_str().unwrap();
            let model = Model::load(dir.join(file)).unwrap();
            let batch = batch_logits(&model, &tokens, KvType::F32);
            let mut st = model.new_state(tokens.len(), KvType::F32).unwrap();
            let p = pool();
            let v = model.n_vocab();
            let (mut worst, mut kls, mut top1) = (0f32, vec![], 0);
            for (i, &t) in tokens.iter().enumerate() {
                model.forward(&p, &mut st, &[t], Logits::Last).unwrap();
                let b = &batch[i * v..(i + 1) * v];
                worst = worst.max(max_abs_diff(st.logits(), b));
                kls.push(kl(b, st.logits()));
                top1 += (argmax(b) == argmax(st.logits())) as usize;
            }
            let med = median(kls.clone());
            eprintln!("{file}: decode vs batch max |Δ| = {worst:.3e}, median KL {med:.2e}, top-1 {top1}/16");
            if f["type"] == "F32" {
                assert!(worst <= 1e-4, "{file}: {worst}");
            } else {
                // Quantised prefill runs multi-token kernels that sum in
                // another order than decode's rows kernels: equal to
                // rounding, but where an expert routing is a near-tie the
                // rounding can pick another expert, and in a recurrent
                // model (Gated DeltaNet) that difference carries on to the
                // later positions; in an attention model, through the KV
                // cache. Measured: qwen3moe-tiny-Q2_K on the AVX-512 panels
                // (experts from 8 tokens) has one such flip, median KL
                // 8.2e-5, max |Δ| 0.08; with either its Q2_K or its Q3_K
                // panels off, 3e-14 and 3e-6 (so a near-tie met by the two
                // formats' rounding together, not a wrong product; every
                // other path and llama.cpp agree within 3e-6). So: the same
                // distribution, 20x tighter than the llama.cpp comparison
                // (median KL 5e-3, top-1 12).
                assert!(med <= 2.5e-4 && top1 >= 15, "{file}: median KL {med}, top-1 {top1}/16, max |Δ| {worst}");
            }
        }
    }
}

#[test]
fn f16_cache_stays_close_to_f32() {
    let dir = common::fixtures();
    let m = &models()[0];
    let tokens = prompt(m);
    let model = Model::load(dir.join(m["files"][0]["gguf"].as_str().unwrap())).unwrap();
    let a = batch_logits(&model, &tokens, KvType::F32);
    let b = batch_logits(&model, &tokens, KvType::F16);
    let d = max_abs_diff(&a, &b);
    assert!(d < 2e-2, "f16 cache drift {d}");
}

/// Runs a routed-expert model twice: the second time with every expert the
/// first run did not route to overwritten with NaN. Identical logits prove
/// that unrouted expert bytes are never read.
#[test]
fn unrouted_experts_are_never_read() {
    let dir = common::fixtures();
    let src = dir.join("models/qwen3moe-tiny-F32.gguf");
    let model = Model::load(&src).unwrap();
    let tokens = [785u32, 2062, 2174];
    let mut st = model.new_state(8, KvType::F32).unwrap();
    st.trace = Some(Vec::new());
    model.forward(&pool(), &mut st, &tokens, Logits::All).unwrap();
    let first = st.logits().to_vec();
    let trace = st.trace.take().unwrap();
    assert_eq!(trace.len(), 2, "one routing per MoE layer");

    let mut bytes = std::fs::read(&src).unwrap();
    let mut poisoned = 0;
    // Every layer of this model is MoE: trace[i] is layer i's routing.
    for (layer, slabs) in model.expert_slabs() {
        let used: std::collections::HashSet<u32> = trace[layer].experts.iter().copied().collect();
        for (e, r) in slabs.iter().enumerate() {
            if !used.contains(&(e as u32)) {
                for w in bytes[r.clone()].chunks_exact_mut(4) {
                    w.copy_from_slice(&f32::NAN.to_le_bytes());
                }
                poisoned += 1;
            }
        }
    }
    assert!(poisoned > 0, "nothing to poison: every expert was routed");
    let tmp = std::env::temp_dir().join(format!("pocket-poisoned-{}.gguf", std::process::id()));
    std::fs::write(&tmp, &bytes).unwrap();
    let model2 = Model::load(&tmp).unwrap();
    let mut st2 = model2.new_state(8, KvType::F32).unwrap();
    model2.forward(&pool(), &mut st2, &tokens, Logits::All).unwrap();
    std::fs::remove_file(&tmp).ok();
    assert!(st2.logits().iter().all(|v| v.is_finite()));
    assert_eq!(first, st2.logits(), "poisoning unrouted experts changed the output");
    eprintln!("poisoned {poisoned} unrouted expert slabs; logits unchanged");
}

fn gemma() -> Option<std::path::PathBuf> {
    let p = common::gemma_270m();
    if p.is_none() {
        assert!(
            std::env::var_os("POCKET_REQUIRE_GEMMA").is_none(),
            "POCKET_REQUIRE_GEMMA is set but the model is absent"
        );
        eprintln!("skipped: Gemma 3 270M not found (set POCKET_GEMMA)");
    }
    p
}

/// Logit gap under which two candidates count as tied: llama.cpp itself
/// resolves such ties differently across machines (the reference commit built
/// on this repository's AMD test machine gets 15/16 here and continues the
/// capital prompt differently at a 0.03-logit tie; flash attention on vs off
/// moves its logits by up to 0.77).
const NEAR_TIE: f32 = 0.1;

/// The same for the greedy continuation's first difference, which comes
/// after a dozen decoded positions that each carry the prompt's rounding:
/// this file's step 11 is such a tie, at 0.03 logits through the four-token
/// kernels (AVX2, or AVX-512 below five tokens) and at 0.16 through the
/// AVX-512 Q4_K panels, which take the 6-token prompt. Neither is nearer
/// the scalar twins: the prompt's logits differ from the scalar path's by
/// up to 1.3 at single positions either way (the int8 activations of the
/// next layer round differently).
const GREEDY_TIE: f32 = 0.25;

#[test]
fn gemma_270m_agrees_with_llama_cpp() {
    let Some(path) = gemma() else { return };
    let manifest = common::manifest();
    let real = &manifest["real_model"];
    let run = real["runs"].as_array().unwrap().iter().find(|r| r["tag"] == "llama_faoff").unwrap();
    let tokens: Vec<u32> = run["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let model = Model::load(&path).unwrap();
    let ours = batch_logits(&model, &tokens, KvType::F32);
    let top = read_npz(&common::fixtures().join(run["top64"].as_str().unwrap()));
    let (ids, logits) = (&top["ids"], &top["logits"]);
    let v = model.n_vocab();
    let (mut strict, mut agree) = (0, 0);
    let mut worst = 0f32;
    for p in 0..tokens.len() {
        let row = &ours[p * v..(p + 1) * v];
        let (ref1, ref2) = (ids.i32[p * 64] as usize, ids.i32[p * 64 + 1] as usize);
        let ref_gap = logits.f32[p * 64] - logits.f32[p * 64 + 1];
        let mine = argmax(row);
        strict += (mine == ref1) as usize;
        agree += (mine == ref1 || (mine == ref2 && ref_gap < NEAR_TIE)) as usize;
        for j in 0..64 {
            let id = ids.i32[p * 64 + j] as usize;
            worst = worst.max((row[id] - logits.f32[p * 64 + j]).abs());
        }
    }
    eprintln!(
        "gemma-3-270m: top-1 {strict}/16 ({agree}/16 counting near-ties), max |Δ| over llama's top-64 = {worst:.3}"
    );
    assert!(agree >= 15 && strict >= 14, "top-1 agreement {strict}/16 ({agree} with near-ties)");

    // Greedy continuation of "The capital of France is": equal to llama.cpp's
    // up to the first near-tie, and that must come late.
    let cap = &real["capital_prompt"];
    let prompt: Vec<u32> = cap["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let expected: Vec<u32> =
        cap["llama_greedy16"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let mut st = model.new_state(64, KvType::F32).unwrap();
    let p = pool();
    model.forward(&p, &mut st, &prompt, Logits::Last).unwrap();
    let mut matched = 0;
    for &want in &expected {
        let row = st.logits();
        let next = argmax(row) as u32;
        if next != want {
            let gap = row[next as usize] - row[want as usize];
            eprintln!("greedy: step {matched} chose {next} over llama's {want} by {gap:.3} logits");
            assert!(gap < GREEDY_TIE, "step {matched}: {next} beats llama's {want} by {gap}");
            break;
        }
        matched += 1;
        model.forward(&p, &mut st, &[next], Logits::Last).unwrap();
    }
    eprintln!("greedy: {matched}/16 tokens equal to llama.cpp's");
    assert!(matched >= 10, "only {matched} greedy tokens match");
}

#[test]
fn bad_inputs_are_errors() {
    let dir = common::fixtures();
    let model = Model::load(dir.join("models/gemma3-tiny-Q8_0.gguf")).unwrap();
    let mut st = model.new_state(4, KvType::F16).unwrap();
    let p = pool();
    assert!(matches!(model.forward(&p, &mut st, &[], Logits::All), Err(pocket_core::Error::InvalidArgument(_))));
    assert!(matches!(model.forward(&p, &mut st, &[5000], Logits::All), Err(pocket_core::Error::InvalidArgument(_))));
    assert!(matches!(
        model.forward(&p, &mut st, &[1, 2, 3, 4, 5], Logits::All),
        Err(pocket_core::Error::ContextFull { .. })
    ));
    assert!(Path::new(&dir).exists());
    // Unsupported architecture: a vocab-only file names its architecture.
    let err = Model::load(dir.join("tokenizer/ggml-vocab-phi-3.gguf")).err().expect("vocab-only file loads no model");
    eprintln!("vocab-only: {err}");
}
