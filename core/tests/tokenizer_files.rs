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
fn unigram_checks_its_character_map() {
    let t5 = |charsmap: Option<Value>| {
        let mut kvs = vec![
            ("tokenizer.ggml.model", Value::String("t5".into())),
            ("tokenizer.ggml.tokens", strings(&["<pad>", "</s>", "<unk>", "▁a", "b"])),
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![3, 3, 2, 1, 1]))),
            ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0, 0.0, 0.0, -1.0, -2.0]))),
            ("tokenizer.ggml.add_space_prefix", Value::Bool(true)),
        ];
        kvs.extend(charsmap.map(|c| ("tokenizer.ggml.precompiled_charsmap", c)));
        Tokenizer::from_gguf(&file(&kvs))
    };
    // No map: "▁ab▁c"; "▁" and "c" have no token and merge into one [UNK].
    let tok = t5(None).unwrap();
    assert_eq!((tok.eos(), tok.unk(), tok.add_bos()), (Some(1), Some(2), false));
    assert_eq!(tok.encode("ab c", false, false).unwrap(), [3, 4, 2]);
    // A map shorter than its header, or whose array runs past its end.
    let bytes = |b: Vec<u8>| Some(Value::Array(Array::U8(b)));
    assert!(matches!(t5(bytes(vec![1, 2])), Err(Error::Tokenizer(_))));
    assert!(matches!(t5(bytes(vec![8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])), Err(Error::Tokenizer(_))));
    assert!(matches!(t5(Some(Value::Array(Array::F32(vec![0.0; 8])))), Err(Error::WrongValueType { .. })));
    // A map whose root points outside its array fails the encode, typed.
    let tok = t5(bytes(vec![4, 0, 0, 0, 0x00, 0x04, 0, 0, b'x', 0])).unwrap();
    assert!(matches!(tok.encode("a", false, false), Err(Error::Tokenizer(_))));
}

#[test]
fn tokenizer_and_template_are_shareable_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<pocket_core::chat::ChatTemplate>();
}
