//! Token ids identical to the reference on every corpus of the fixture store.
//!
//! The corpora are read the way llama.cpp's `test-tokenizer-0` reads them:
//! `.inp` holds the strings separated by `\n__ggml_vocab_test__\n`, `.out` one
//! line of ids per string; each string is tokenized without BOS/EOS and
//! without parsing special tokens.

mod common;

use std::path::{Path, PathBuf};

use pocket_core::gguf::GgufFile;
use pocket_core::tokenizer::Tokenizer;

const SEP: &str = "\n__ggml_vocab_test__\n";

/// The (string, expected ids) pairs of one corpus.
fn read_corpus(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).unwrap_or_else(|e| panic!("{}: {e}", inp.display()));
    let expected = std::fs::read_to_string(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let mut strings = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(SEP) {
            Some(i) => {
                strings.push(raw[pos..pos + i].to_string());
                pos += i + SEP.len();
            }
            None => {
                strings.push(raw[pos..].to_string());
                break;
            }
        }
    }
    let lines: Vec<&str> = expected.lines().collect();
    assert_eq!(strings.len(), lines.len(), "{}: strings and id lines differ in number", inp.display());
    strings
        .into_iter()
        .zip(lines)
        .map(|(s, l)| (s, l.split_whitespace().map(|t| t.parse().expect("token id")).collect()))
        .collect()
}

/// Tokenize every string; panic with every mismatch listed.
fn check(model: &Path, inp: &Path, out: &Path) {
    let g = GgufFile::open(model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let corpus = read_corpus(inp, out);
    let mut failures = Vec::new();
    for (text, want) in &corpus {
        let got = tok.encode(text, false, false).expect("encode");
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {} strings differ:\n{}",
        inp.display(),
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );
}

fn vocab_corpus(name: &str) {
    let dir = common::fixtures().join("tokenizer");
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    check(&gguf, &dir.join(format!("ggml-vocab-{name}.gguf.inp")), &dir.join(format!("ggml-vocab-{name}.gguf.out")));
}

/// The llama.cpp tree's corpora this suite checks: every
/// `models/ggml-vocab-*.gguf` that has an `.inp`/`.out` pair, but those of
/// [`NOT_YET`].
const LLAMA_CORPORA: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// Corpora of tokenizer models this engine does not implement yet.
const NOT_YET: &[&str] = &[];

/// One corpus of the llama.cpp source tree (skipped, or failed under
/// `POCKET_REQUIRE_LLAMA_SRC=1`, when the tree is absent).
fn llama_corpus(name: &str) {
    let Some(src) = common::llama_src(name) else { return };
    let m = src.join("models");
    let gguf = m.join(format!("ggml-vocab-{name}.gguf"));
    check(&gguf, &m.join(format!("ggml-vocab-{name}.gguf.inp")), &m.join(format!("ggml-vocab-{name}.gguf.out")));
}

/// A corpus added to the tree must be added to [`LLAMA_CORPORA`] (or, for a
/// model not implemented, to [`NOT_YET`]).
#[test]
fn llama_tree_corpora_are_all_listed() {
    let Some(src) = common::llama_src("llama_tree_corpora_are_all_listed") else { return };
    let mut found: Vec<String> = std::fs::read_dir(src.join("models"))
        .expect("read models/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| Some(f.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf.inp")?.to_string()))
        .collect();
    found.sort();
    let mut listed: Vec<&str> = LLAMA_CORPORA.iter().chain(NOT_YET).copied().collect();
    listed.sort();
    assert_eq!(found, listed);
}

macro_rules! llama_corpora {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                llama_corpus($name);
            }
        )*
    };
}

llama_corpora! {
    llama_bert_bge => "bert-bge",
    llama_command_r => "command-r",
    llama_deepseek_coder => "deepseek-coder",
    llama_deepseek_llm => "deepseek-llm",
    llama_falcon => "falcon",
    llama_gemma_4 => "gemma-4",
    llama_gpt_2 => "gpt-2",
    llama_llama_bpe => "llama-bpe",
    llama_llama_spm => "llama-spm",
    llama_mpt => "mpt",
    llama_phi_3 => "phi-3",
    llama_qwen2 => "qwen2",
    llama_qwen35 => "qwen35",
    llama_refact => "refact",
    llama_starcoder => "starcoder",
}

/// A vocabulary of the llama.cpp tree for which the tree has no corpus:
/// llama.cpp's ids on our strings (`data/tokenizer/`, made by
/// `scripts/tokenizer-reference.sh` with llama.cpp's own tokenizer).
fn llama_vocab_own_corpus(vocab: &str, corpus: &str) {
    let Some(src) = common::llama_src(corpus) else { return };
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer");
    let gguf = src.join("models").join(format!("ggml-vocab-{vocab}.gguf"));
    check(&gguf, &data.join(format!("{corpus}.inp")), &data.join(format!("{corpus}.out")));
}

/// Unigram (`t5`): nomic-embed-text-v2-moe's XLM-RoBERTa vocabulary, with its
/// precompiled character map.
#[test]
fn llama_nomic_bert_moe_unigram() {
    llama_vocab_own_corpus("nomic-bert-moe", "nomic-bert-moe");
}

fn model_corpus(corpus: &str, gguf: &str) {
    let dir = common::fixtures();
    let t = dir.join("tokenizer");
    check(&dir.join("models").join(gguf), &t.join(format!("{corpus}.inp")), &t.join(format!("{corpus}.out")));
}

#[test]
fn vocab_qwen2() {
    vocab_corpus("qwen2");
}

#[test]
fn vocab_qwen35() {
    vocab_corpus("qwen35");
}

#[test]
fn vocab_gpt_2() {
    vocab_corpus("gpt-2");
}

#[test]
fn vocab_llama_bpe() {
    vocab_corpus("llama-bpe");
}

#[test]
fn vocab_llama_spm() {
    vocab_corpus("llama-spm");
}

#[test]
fn vocab_phi_3() {
    vocab_corpus("phi-3");
}

#[test]
fn tiny_qwen35moe() {
    model_corpus("qwen35moe-tiny", "qwen35moe-tiny-F32.gguf");
}

#[test]
fn tiny_qwen3moe() {
    model_corpus("qwen3moe-tiny", "qwen3moe-tiny-F32.gguf");
}

#[test]
fn tiny_gemma3() {
    model_corpus("gemma3-tiny", "gemma3-tiny-F32.gguf");
}

#[test]
fn tiny_lfm2moe() {
    model_corpus("lfm2moe-tiny", "lfm2moe-tiny-F16.gguf");
}

#[test]
fn tiny_mixtral() {
    model_corpus("mixtral-tiny", "mixtral-tiny-Q8_0.gguf");
}

/// Granite 4.0-H's `dbrx` pre-tokenizer (the llama3 regex), no BOS.
#[test]
fn tiny_granitehybrid() {
    model_corpus("granitehybrid-tiny", "granitehybrid-tiny-F16.gguf");
}

/// The real Gemma 3 270M file, or `None` (test skipped) when it is absent and
/// `POCKET_REQUIRE_GEMMA=1` is not set.
pub fn gemma_or_skip(test: &str) -> Option<PathBuf> {
    match common::gemma_270m() {
        Some(p) => Some(p),
        None if std::env::var("POCKET_REQUIRE_GEMMA").as_deref() == Ok("1") => {
            panic!("{test}: the Gemma 3 270M file is required (POCKET_REQUIRE_GEMMA=1) but absent: set POCKET_GEMMA")
        }
        None => {
            eprintln!("{test}: skipped, Gemma 3 270M file absent (set POCKET_GEMMA)");
            None
        }
    }
}

#[test]
fn gemma_3_270m() {
    let Some(model) = gemma_or_skip("gemma_3_270m") else { return };
    let t = common::fixtures().join("tokenizer");
    check(&model, &t.join("gemma-3-270m.inp"), &t.join("gemma-3-270m.out"));
}

#[test]
fn gemma_3_270m_chat_tokens() {
    let Some(model) = gemma_or_skip("gemma_3_270m_chat_tokens") else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    assert_eq!((tok.bos(), tok.add_bos(), tok.add_space_prefix()), (Some(2), true, false));
    // The same ids as llama-tokenize gives for this prompt.
    let ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>", true, true).unwrap();
    assert_eq!(ids, [2, 105, 2364, 107, 10979, 106]);
    assert!(tok.is_end_of_generation(106) && tok.is_end_of_generation(1));
    assert!(!tok.is_end_of_generation(105));
    assert_eq!(tok.decode(&ids, false), "user\nHi");
}

/// `deepseek-v3` pre-tokenizer (its three split regexes), ids from the HF tokenizer.
#[test]
fn tiny_deepseek2() {
    model_corpus("deepseek2-tiny", "deepseek2-tiny-F16.gguf");
}
