//! Tokenizers from hand-built GGUF files: typed errors for what this engine
//! does not know, and vocabulary-only files with no tensors.

use pocket_core::gguf::{Array, GgufFile, GgufWriter, StringArray, Value};
use pocket_core::tokenizer::Tokenizer;
use pocket_core::Error;

fn strings(items: &[&str]) -> Value {
    let mut a = StringArray::default();
    for s in items {
        a.push(s);
    }
    Value::Array(Array::String(a))
}

fn file(kvs: &[(&str, Value)]) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.kv(k, v.clone());
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |_, _| {}).unwrap();
    GgufFile::from_bytes(bytes).unwrap()
}

/// A byte-level vocabulary: the byte alphabet's printable ASCII part plus "ab".
fn bpe_file(pre: &str) -> GgufFile {
    let mut tokens: Vec<String> = (b'!'..=b'~').map(|b| (b as char).to_string()).collect();
    tokens.push("ab".into());
    tokens.push("<|end|>".into());
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![1i32; tokens.len()];
    *types.last_mut().unwrap() = 3;
    file(&[
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strings(&refs)),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges", strings(&["a b"])),
    ])
}

#[test]
fn unknown_models_are_named_in_typed_errors() {
    let g = file(&[("tokenizer.ggml.model", Value::String("rwkv".into())), ("tokenizer.ggml.tokens", strings(&["a"]))]);
    match Tokenizer::from_gguf(&g) {
        Err(Error::UnknownTokenizer(name)) => assert_eq!(name, "rwkv"),
        other => panic!("{other:?}"),
    }
    match Tokenizer::from_gguf(&bpe_file("mystery-pre")) {
        Err(Error::UnknownPreTokenizer(name)) => assert_eq!(name, "mystery-pre"),
        other => panic!("{other:?}"),
    }
    let g = file(&[("general.name", Value::String("x".into()))]);
    assert!(matches!(Tokenizer::from_gguf(&g), Err(Error::MissingKey(_))));
}

#[test]
fn a_vocab_only_file_tokenizes() {
    let tok = Tokenizer::from_gguf(&bpe_file("qwen2")).unwrap();
    let ab = tok.token_id("ab").unwrap();
    let end = tok.token_id("<|end|>").unwrap();
    assert_eq!(tok.encode("ab<|end|>", false, true).unwrap(), [ab, end]);
    assert!(tok.is_end_of_generation(end) && tok.is_control(end));
    assert_eq!(tok.decode(&[ab, end], false), "ab");
    // Without special-token parsing the control token's text is plain text.
    assert_ne!(tok.encode("<|end|>", false, false).unwrap(), [end]);
}

#[test]
fn wordpiece_follows_the_normalizer_keys_and_needs_unk_only_when_used() {
    let bert = |extra: &[(&str, Value)]| {
        let mut kvs = vec![
            ("tokenizer.ggml.model", Value::String("bert".into())),
            ("tokenizer.ggml.tokens", strings(&["▁a", "▁A", "b", "▁é"])),
        ];
        kvs.extend(extra.iter().cloned());
        Tokenizer::from_gguf(&file(&kvs)).unwrap()
    };
    // Default: lowercase and strip accents; the default [UNK] (100) is out of
    // range, so a word no token covers is a typed error, not a panic.
    let tok = bert(&[]);
    assert_eq!(tok.unk(), None);
    assert_eq!(tok.encode("Ab ÁB", false, false).unwrap(), [0, 2, 0, 2]);
    assert!(matches!(tok.encode("c", false, false), Err(Error::Tokenizer(_))));
    let cased = bert(&[("tokenizer.ggml.normalizer.lowercase", Value::Bool(false))]);
    assert_eq!(cased.encode("Ab é", false, false).unwrap(), [1, 2, 3]);
    let unk = bert(&[("tokenizer.ggml.unknown_token_id", Value::U32(2))]);
    assert_eq!(unk.encode("a c ab", false, false).unwrap(), [0, 2, 0, 2]);
}

#[test]
fn tokenizer_and_template_are_shareable_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<pocket_core::chat::ChatTemplate>();
}
