//! DeepSeek-V2/V3 (`deepseek2`) against its references
//! (`manifest_moe_families.json`, `deepseek2-tiny`): llama.cpp's logits of
//! both files (as one batch and token by token), transformers' fp32 logits
//! of the exact-weight F16 file, greedy continuations, a session restored
//! from a snapshot, and malformed files.

mod common;

use common::arrays::{argmax, kl, max_abs_diff, median, read_npy};
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::threads::ThreadPool;

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

fn model_entry() -> serde_json::Value {
    let m = common::manifest_named("manifest_moe_families.json");
    let models = m["models"].as_array().unwrap();
    models.iter().find(|x| x["name"] == "deepseek2-tiny").expect("deepseek2-tiny in the manifest").clone()
}

/// Median KL(reference ‖ ours) over the rows and top-1 agreements.
fn compare(reference: &[f32], ours: &[f32], v: usize) -> (f64, usize) {
    let (mut kls, mut top1) = (Vec::new(), 0);
    for (a, b) in reference.chunks_exact(v).zip(ours.chunks_exact(v)) {
        kls.push(kl(a, b));
        top1 += (argmax(a) == argmax(b)) as usize;
    }
    (median(kls), top1)
}

#[test]
fn both_deepseek2_files_match_llama_cpp_as_a_batch_and_decoding() {
    let dir = common::fixtures();
    let m = model_entry();
    let tokens = common::ids(&m, "prompt");
    let p = pool();
    let mut checked = 0;
    for f in m["files"].as_array().unwrap() {
        let file = f["gguf"].as_str().unwrap();
        let model = Model::load(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let v = model.n_vocab();
        let (batch, decode) = common::batch_and_decode_logits(&model, &p, &tokens);
        let reference = read_npy(&dir.join(f["llama_logits"].as_str().unwrap()));
        assert_eq!(reference.shape, [tokens.len(), v]);
        for (path, ours) in [("batch", &batch), ("decode", &decode)] {
            let (med, top1) = compare(&reference.f32, ours, v);
            let d = max_abs_diff(ours, &reference.f32);
            eprintln!("{file} {path}: median KL {med:.2e}, top-1 {top1}/16, max |Δ| {d:.3e} vs llama.cpp");
            assert!(med <= 5e-3, "{file} {path}: median KL {med}");
            assert!(top1 >= 12, "{file} {path}: top-1 {top1}/16");
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "F16 and Q8_0");
}
