//! Files in the IQ formats, MXFP4 and TQ1_0/TQ2_0, as llama.cpp's quantiser writes them
//! (mixed with K-quants and Q8_0 in one file), against llama.cpp's logits.
//!
//! The files are not in the fixture store: `scripts/iq-logits.sh` makes
//! them from `qwen3moe-tiny-F32.gguf` with `llama-quantize` (and
//! `llama-imatrix` for IQ3_XXS and IQ1/IQ2), dumps llama.cpp's teacher-forced logits of
//! the manifest's prompt next to each (`<file>.llama.f32`, positions x vocab,
//! little-endian f32) and runs this test with `POCKET_IQ_DIR` set to that
//! folder. Without it the test is ignored.

mod common;

use common::arrays::{argmax, kl, max_abs_diff, median};
use pocket_core::model::Model;
use pocket_core::threads::ThreadPool;

const TYPES: [&str; 12] = [
    "IQ4_XS",
    "IQ4_NL",
    "IQ3_S",
    "IQ3_XXS",
    "MXFP4_MOE",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_M",
    "IQ1_S",
    "IQ1_M",
    "TQ1_0",
    "TQ2_0",
];

#[test]
#[ignore = "needs POCKET_IQ_DIR: files made by scripts/iq-logits.sh"]
fn iq_files_match_llama_cpp() {
    let dir = std::path::PathBuf::from(std::env::var_os("POCKET_IQ_DIR").expect("POCKET_IQ_DIR"));
    let manifest = common::manifest();
    let m = manifest["models"].as_array().unwrap().iter().find(|m| m["name"] == "qwen3moe-tiny").unwrap();
    let tokens: Vec<u32> = m["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let pool = ThreadPool::new(2);
    let mut checked = 0;
    for ty in TYPES {
        let file = dir.join(format!("qwen3moe-tiny-{ty}.gguf"));
        if !file.is_file() {
            eprintln!("{}: not made, skipped", file.display());
            continue;
        }
        let model = Model::load(&file).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let reference: Vec<f32> = std::fs::read(dir.join(format!("qwen3moe-tiny-{ty}.llama.f32")))
            .expect("llama.cpp logits")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let v = model.n_vocab();
        assert_eq!(reference.len(), tokens.len() * v, "{ty}: logits shape");
        let (batch, decode) = common::batch_and_decode_logits(&model, &pool, &tokens);
        for (how, ours) in [("batch", &batch), ("decode", &decode)] {
            let (mut kls, mut top1) = (Vec::new(), 0);
            for (a, b) in reference.chunks_exact(v).zip(ours.chunks_exact(v)) {
                kls.push(kl(a, b));
                top1 += (argmax(a) == argmax(b)) as usize;
            }
            let med = median(kls.clone());
            let d = max_abs_diff(ours, &reference);
            eprintln!(
                "{ty} {how}: median KL {med:.2e}, max KL {:.2e}, top-1 {top1}/16, max |Δ| {d:.3e}",
                kls.iter().cloned().fold(0.0, f64::max)
            );
            assert!(med <= 5e-3, "{ty} {how}: median KL {med}");
            assert!(top1 >= 12, "{ty} {how}: top-1 agreement {top1}/16");
        }
        checked += 1;
    }
    assert!(checked > 0, "no files in {}", dir.display());
}
