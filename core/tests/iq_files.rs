//! The IQ formats, MXFP4 and the ternary TQ1_0/TQ2_0 end to end, without
//! llama.cpp at hand: Pocket quantises the fixture `qwen3moe-tiny-F32.gguf`
//! to each of their presets with
//! llama-imatrix's matrix (the files are byte for byte llama-quantize's:
//! `quantize_files.rs`), runs them, and compares its logits of the
//! manifest's prompt (as one batch and token by token) with llama.cpp's on
//! the same files: per position the 32 most likely tokens' log-probabilities
//! (`data/iq_logits/`, made by `scripts/iq-logits/top32.py` from
//! `dump_logits.c`'s output), KL divergence over them plus the remaining mass.

mod common;

use std::path::Path;

use common::arrays::{argmax, median};
use pocket_core::gguf::{GgufFile, Summary};
use pocket_core::model::Model;
use pocket_core::quant::GgmlType;
use pocket_core::quantize::file::{quantize_file, Options};
use pocket_core::quantize::imatrix::Imatrix;
use pocket_core::quantize::mix::FileType;
use pocket_core::threads::ThreadPool;

/// Each preset and the IQ (MXFP4, ternary) type it must contain.
const PRESETS: [(&str, GgmlType); 12] = [
    ("IQ4_XS", GgmlType::IQ4XS),
    ("IQ4_NL", GgmlType::IQ4NL),
    ("IQ3_S", GgmlType::IQ3S),
    ("IQ3_XXS", GgmlType::IQ3XXS),
    ("MXFP4_MOE", GgmlType::MXFP4),
    ("IQ2_XXS", GgmlType::IQ2XXS),
    ("IQ2_S", GgmlType::IQ2XS),
    ("IQ2_M", GgmlType::IQ2S),
    ("IQ1_S", GgmlType::IQ1S),
    ("IQ1_M", GgmlType::IQ1M),
    ("TQ1_0", GgmlType::TQ1_0),
    ("TQ2_0", GgmlType::TQ2_0),
];
const TOP: usize = 32;

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// KL(llama.cpp || ours) over llama.cpp's top tokens and the rest of the mass.
fn kl_top(saved: &[(u32, f32)], ours: &[f32]) -> f64 {
    let m = ours.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + ours.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    let (mut kl, mut p_top, mut q_top) = (0f64, 0f64, 0f64);
    for &(id, lp) in saved {
        let (lp, lq) = (lp as f64, ours[id as usize] as f64 - lse);
        kl += lp.exp() * (lp - lq);
        p_top += lp.exp();
        q_top += lq.exp();
    }
    let (p_rest, q_rest) = ((1.0 - p_top).max(1e-12), (1.0 - q_top).max(1e-12));
    kl + p_rest * (p_rest / q_rest).ln()
}

#[test]
fn iq_presets_give_llama_cpp_s_logits() {
    let manifest = common::manifest();
    let m = manifest["models"].as_array().unwrap().iter().find(|m| m["name"] == "qwen3moe-tiny").unwrap();
    let tokens: Vec<u32> = m["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let input = common::fixtures().join("models/qwen3moe-tiny-F32.gguf");
    let imatrix = Imatrix::read(data("quantize/qwen3moe-tiny.llama.imatrix.gguf")).unwrap();
    let dir = std::env::temp_dir().join(format!("pocket-iq-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = ThreadPool::new(2);
    for (preset, ty) in PRESETS {
        let file = dir.join(format!("qwen3moe-tiny-{preset}.gguf"));
        let ftype = FileType::from_name(preset).unwrap();
        let opts = Options { ftype, imatrix: Some((&imatrix, "m".into())), allow_requantize: false, threads: 2 };
        quantize_file(&input, &file, &opts, &mut |_, _, _| {}).unwrap();
        let g = GgufFile::open(&file).unwrap();
        assert!(g.tensors().iter().any(|t| t.ty == ty), "{preset}: no {ty} tensor");
        // What `pocket inspect` and `PocketModel.info()` print.
        let summary = Summary::of(&g).unwrap();
        assert_eq!(summary.quantization, preset, "{preset}: the file type's name");
        assert!(summary.tensor_types.contains_key(&ty), "{preset}: {ty} among the tensor types");
        let model = Model::load(&file).unwrap();
        std::fs::remove_file(&file).unwrap();

        let saved: Vec<(u32, f32)> = std::fs::read(data(&format!("iq_logits/qwen3moe-tiny-{preset}.top32")))
            .unwrap()
            .chunks_exact(8)
            .map(|b| (u32::from_le_bytes([b[0], b[1], b[2], b[3]]), f32::from_le_bytes([b[4], b[5], b[6], b[7]])))
            .collect();
        assert_eq!(saved.len(), tokens.len() * TOP, "{preset}: saved logits");
        let v = model.n_vocab();
        let (batch, decode) = common::batch_and_decode_logits(&model, &pool, &tokens);
        for (how, ours) in [("batch", &batch), ("decode", &decode)] {
            let (mut kls, mut top1) = (Vec::new(), 0);
            for (s, o) in saved.chunks_exact(TOP).zip(ours.chunks_exact(v)) {
                kls.push(kl_top(s, o));
                top1 += (argmax(o) == s[0].0 as usize) as usize;
            }
            let med = median(kls);
            eprintln!("{preset} ({how}): median KL {med:.2e}, top-1 {top1}/{}", tokens.len());
            assert!(med <= 5e-3 && top1 >= 12, "{preset} ({how}): median KL {med:e}, top-1 {top1}/{}", tokens.len());
        }
    }
    let _ = std::fs::remove_dir(&dir);
}
