//! `pocket quantize` and `pocket imatrix` against llama.cpp's tools on the
//! fixture models: the fixture store's quantised files remade byte for byte
//! from its F32 files; every preset, with llama-imatrix's matrix and
//! without, giving the file llama-quantize gives (its SHA-256, in
//! `data/quantize/llama-quantize.txt`, from `scripts/quantize-compare.sh`);
//! the collector's statistics against llama-imatrix's; and bad input ending
//! as one error with no file left behind.

mod common;

#[path = "../../xtask/src/sha256.rs"]
mod sha256;

use std::path::{Path, PathBuf};

use pocket_core::error::Error;
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::quantize::file::{quantize_file, Options};
use pocket_core::quantize::imatrix::{Collector, Imatrix};
use pocket_core::quantize::mix::FileType;
use pocket_core::threads::ThreadPool;

fn model(name: &str) -> PathBuf {
    common::fixtures().join("models").join(format!("{name}.gguf"))
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quantize").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pocket-quantize-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn opts(ftype: FileType, imatrix: Option<(&Imatrix, String)>) -> Options<'_> {
    Options { ftype, imatrix, allow_requantize: false, threads: 2 }
}

fn quantize(input: &Path, out: &Path, o: &Options) -> pocket_core::error::Result<Vec<u8>> {
    quantize_file(input, out, o, &mut |_, _, _| {})?;
    let bytes = std::fs::read(out).unwrap();
    std::fs::remove_file(out).unwrap();
    Ok(bytes)
}

#[test]
fn the_fixture_files_are_remade_byte_for_byte() {
    for (name, preset) in [
        ("qwen3moe-tiny", "Q2_K"),
        ("qwen3moe-tiny", "Q3_K_M"),
        ("qwen3moe-tiny", "Q4_0"),
        ("qwen3moe-tiny", "Q4_K_M"),
        ("qwen35moe-tiny", "Q2_K"),
        ("qwen35moe-tiny", "Q4_K_M"),
        ("gemma3-tiny", "Q4_1"),
        ("gemma3-tiny", "Q4_K_M"),
        ("gemma3-tiny", "Q5_0"),
        ("gemma3-tiny", "Q8_0"),
    ] {
        let ftype = FileType::from_name(preset).unwrap();
        let ours =
            quantize(&model(&format!("{name}-F32")), &scratch(&format!("{name}-{preset}.gguf")), &opts(ftype, None))
                .unwrap();
        let theirs = std::fs::read(model(&format!("{name}-{preset}"))).unwrap();
        assert!(ours == theirs, "{name} {preset}: not the fixture file ({} vs {} bytes)", ours.len(), theirs.len());
    }
}

/// Every preset with llama-imatrix's matrix on the qwen35moe fixture, the
/// refusals without one, the presets with the most distinct mixes on the
/// other two, and the ternary presets everywhere, against the SHA-256 of
/// llama-quantize's output. `POCKET_QUANTIZE_FULL=1` checks all 192 golden
/// files (every preset of every fixture model, with and without a matrix:
/// 3 minutes on two cores).
#[test]
fn every_preset_gives_llama_quantize_s_file() {
    check_goldens(
        "llama-quantize.txt",
        "F32",
        |name, with, expect| name == "qwen35moe-tiny" && (with == "with" || expect == "refused"),
        50,
        192,
    );
}

/// Gemma 4's fixtures (from their F16 files: no F32 is shipped), the same
/// way: llama-quantize's files from `SOURCE=F16 MODELS="gemma4-moe-tiny
/// gemma4-e-tiny" scripts/quantize-compare.sh` (all 128 byte-identical when
/// recorded); the distinct presets with llama-imatrix's matrix, the ternary
/// ones and the refusals run here (`POCKET_QUANTIZE_FULL=1`: every line).
#[test]
fn every_preset_gives_llama_quantize_s_file_for_gemma4() {
    check_goldens("llama-quantize-gemma4.txt", "F16", |_, _, expect| expect == "refused", 30, 128);
}

/// Quantise `{name}-{source}` for each golden line that is sampled (a
/// distinct preset with the matrix, a refusal, a ternary type, or `extra`)
/// or every line under `POCKET_QUANTIZE_FULL=1`, and compare with the hash.
fn check_goldens(file: &str, source: &str, extra: impl Fn(&str, &str, &str) -> bool, sampled: usize, all: usize) {
    let golden = std::fs::read_to_string(data(file)).unwrap();
    let full = std::env::var_os("POCKET_QUANTIZE_FULL").is_some_and(|v| v == "1");
    let mut checked = 0;
    let mut imatrices = std::collections::HashMap::new();
    for line in golden.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [name, preset, with, expect] = f[..] else { panic!("bad golden line {line}") };
        let distinct = ["Q2_K", "Q3_K_M", "Q4_K_M", "IQ2_M", "IQ3_XXS", "IQ4_XS"].contains(&preset);
        let sample = extra(name, with, expect) || (distinct && with == "with") || preset.starts_with("TQ");
        if !(full || sample) {
            continue;
        }
        let ftype = FileType::from_name(preset).unwrap();
        // The name llama-quantize recorded in the file's metadata.
        let im_name = format!("{name}.llama.imatrix.gguf");
        let m = imatrices.entry(name).or_insert_with(|| Imatrix::read(data(&im_name)).unwrap());
        let im = (with == "with").then(|| (&*m, im_name.clone()));
        let out = scratch(&format!("{name}-{preset}-{with}.gguf"));
        let got = quantize(&model(&format!("{name}-{source}")), &out, &opts(ftype, im));
        match (expect, got) {
            ("refused", Err(Error::InvalidArgument(e))) => assert!(e.contains("importance matrix"), "{e}"),
            ("refused", other) => panic!("{line}: llama-quantize refuses, we gave {:?}", other.map(|b| b.len())),
            (hash, Ok(bytes)) => assert_eq!(sha256::hex(&bytes), hash, "{name} {preset} ({with} imatrix)"),
            (_, Err(e)) => panic!("{line}: {e}"),
        }
        assert!(!out.exists() && !Path::new(&format!("{}.part", out.display())).exists());
        checked += 1;
    }
    assert!(checked >= if full { all } else { sampled }, "only {checked} golden lines");
}

/// The collector over the fixture text, as `pocket imatrix --ctx 128
/// --chunks 16` runs it, against llama-imatrix's file.
#[test]
fn the_collector_agrees_with_llama_imatrix() {
    let text = std::fs::read_to_string(common::fixtures().join("tokenizer/ppl_text.txt")).unwrap();
    for (name, tolerance) in [("gemma3-tiny", 1e-2), ("qwen35moe-tiny", 1e-2)] {
        let model = Model::load(model(&format!("{name}-F32"))).unwrap();
        let tok = model.tokenizer();
        let tokens = tok.encode(&text, true, false).unwrap();
        let (pool, c) = (ThreadPool::new(2), Collector::new());
        for chunk in tokens.chunks_exact(128).take(16) {
            let mut chunk = chunk.to_vec();
            if let (true, Some(b)) = (tok.add_bos(), tok.bos()) {
                chunk[0] = b;
            }
            let mut st = model.new_state(128, KvType::default()).unwrap();
            model.forward_observed(&pool, &mut st, &chunk, Logits::None, Some(&c)).unwrap();
        }
        let ours = c.imatrix(vec![], 16, 128);
        let theirs = Imatrix::read(data(&format!("{name}.llama.imatrix.gguf"))).unwrap();
        assert_eq!(ours.entries.keys().collect::<Vec<_>>(), theirs.entries.keys().collect::<Vec<_>>(), "{name}");
        for (tensor, e) in &theirs.entries {
            assert_eq!(ours.entries[tensor].counts, e.counts, "{name} {tensor}: tokens counted");
            let (a, b) = (ours.weights(tensor).unwrap(), theirs.weights(tensor).unwrap());
            let worst =
                a.iter().zip(&b).map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-30)).fold(0f32, f32::max);
            assert!(worst < tolerance, "{name} {tensor}: mean squares differ by {worst:e} (relative)");
        }
    }
}

/// A legacy `.dat` matrix (`llama-imatrix --output-format dat`): the file
/// llama-quantize makes with it (its SHA-256 from the run that made the
/// `.dat`, which recorded the path `/tmp/q35.imatrix.dat`).
#[test]
fn a_legacy_dat_matrix_gives_llama_quantize_s_file() {
    let m = Imatrix::read(data("qwen35moe-tiny.llama.imatrix.dat")).unwrap();
    assert!(m.legacy && m.chunk_count == 16 && m.entries.len() > 40);
    let o = opts(FileType::IQ2XXS, Some((&m, "/tmp/q35.imatrix.dat".into())));
    let bytes = quantize(&model("qwen35moe-tiny-F32"), &scratch("dat.gguf"), &o).unwrap();
    assert_eq!(sha256::hex(&bytes), "7a25b286308b2545c7d9a33ea921cfb88ec86b857cc7e0cb59c5ba2c41483a64");
}

#[test]
fn bad_input_is_one_error_and_no_file() {
    let out = scratch("bad.gguf");
    let part = PathBuf::from(format!("{}.part", out.display()));
    let q35 = model("qwen35moe-tiny-F32");
    let gemma_im = Imatrix::read(data("gemma3-tiny.llama.imatrix.gguf")).unwrap();
    let cases: Vec<(&str, PathBuf, Options)> = vec![
        ("a quantised input without --allow-requantize", model("qwen35moe-tiny-Q4_K_M"), opts(FileType::Q2K, None)),
        ("IQ2_XXS without an importance matrix", q35.clone(), opts(FileType::IQ2XXS, None)),
        ("another model's importance matrix", q35.clone(), opts(FileType::Q4KM, Some((&gemma_im, "g".into())))),
    ];
    for (what, input, o) in cases {
        let e = quantize_file(&input, &out, &o, &mut |_, _, _| {}).expect_err(what);
        assert!(!e.to_string().contains('\n'), "{what}: {e}");
        assert!(!out.exists() && !part.exists(), "{what}: a file was left behind");
    }
    // With the flag, requantising works (and the K-quant input is read).
    let o = Options { allow_requantize: true, ..opts(FileType::Q2K, None) };
    quantize(&model("qwen35moe-tiny-Q4_K_M"), &out, &o).unwrap();
    // An existing output is replaced only by a complete file.
    std::fs::write(&out, b"old").unwrap();
    assert!(quantize_file(&q35, &out, &opts(FileType::IQ1S, None), &mut |_, _, _| {}).is_err());
    assert_eq!(std::fs::read(&out).unwrap(), b"old");
    std::fs::remove_file(&out).unwrap();
}

/// `quantize_file_with`: the caller's types for the tensors the preset
/// converts (the others as they were); a type that needs an importance
/// matrix, or one Pocket does not make, is one error and no file.
#[test]
fn a_mix_of_one_s_own_is_written_and_checked() {
    use pocket_core::gguf::GgufFile;
    use pocket_core::quant::GgmlType;
    use pocket_core::quantize::file::quantize_file_with;
    let input = model("qwen3moe-tiny-F32");
    let out = scratch("own-mix.gguf");
    let o = opts(FileType::Q4_0, None);
    let mut pick = |p: &pocket_core::quantize::file::Planned| {
        if p.name.contains("ffn_down") {
            GgmlType::Q5_1
        } else {
            p.to
        }
    };
    quantize_file_with(&input, &out, &o, &mut pick, &mut |_, _, _| {}).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let src = GgufFile::open(&input).unwrap();
    for t in f.tensors() {
        if t.name.contains("ffn_down") {
            assert_eq!(t.ty, GgmlType::Q5_1, "{}", t.name);
        } else if src.tensor(&t.name).unwrap().ty == GgmlType::F32 && t.n_dims == 1 {
            assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
        }
    }
    drop(f);
    std::fs::remove_file(&out).unwrap();
    for bad in [GgmlType::IQ2XXS, GgmlType::Q8K] {
        let r = quantize_file_with(&input, &out, &o, &mut |_| bad, &mut |_, _, _| {});
        assert!(matches!(r, Err(pocket_core::Error::InvalidArgument(_))), "{bad}: {r:?}");
        assert!(!out.exists(), "{bad}");
    }
}
