//! Detokenizing: round trips over the corpora, and the streaming decoder
//! (partial UTF-8 held back, control tokens hidden, same text as `decode`).

mod common;

use pocket_core::gguf::GgufFile;
use pocket_core::tokenizer::{StreamDecoder, Tokenizer};

const SEP: &str = "\n__ggml_vocab_test__\n";

fn load(path: &std::path::Path) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap()
}

fn vocab(name: &str) -> Tokenizer {
    load(&common::fixtures().join(format!("tokenizer/ggml-vocab-{name}.gguf")))
}

fn corpus(file: &str) -> Vec<String> {
    let raw = std::fs::read_to_string(common::fixtures().join("tokenizer").join(file)).unwrap();
    let mut v: Vec<String> = raw.split(SEP).map(str::to_string).collect();
    if v.last().is_some_and(String::is_empty) {
        v.pop();
    }
    v
}

/// Stream every token of `ids` and return the concatenated text, checking
/// that no chunk ends inside a character (each is a `String`) and that
/// nothing is left at the end.
fn stream_all(tok: &Tokenizer, ids: &[u32], show_special: bool) -> String {
    let mut d = StreamDecoder::at_text_start(tok, show_special);
    let mut text: String = ids.iter().map(|&id| d.push(id)).collect();
    text.push_str(&d.flush());
    text
}

fn round_trip(tok: &Tokenizer, file: &str, skip: impl Fn(&str) -> bool) {
    let mut checked = 0;
    for s in corpus(file) {
        if skip(&s) {
            continue;
        }
        let ids = tok.encode(&s, false, false).unwrap();
        assert_eq!(tok.decode(&ids, false), s, "{file}: decode(encode(x)) != x");
        assert_eq!(stream_all(tok, &ids, false), s, "{file}: streamed text differs");
        checked += 1;
    }
    assert!(checked > 30, "{file}: only {checked} strings checked");
}

#[test]
fn round_trips_where_the_model_allows() {
    // Qwen3.5 and the SentencePiece vocabularies are lossless.
    round_trip(&vocab("qwen35"), "ggml-vocab-qwen35.gguf.inp", |_| false);
    round_trip(&vocab("llama-spm"), "ggml-vocab-llama-spm.gguf.inp", |_| false);
    let dir = common::fixtures();
    round_trip(&load(&dir.join("models/gemma3-tiny-F32.gguf")), "gemma3-tiny.inp", |_| false);
    round_trip(&load(&dir.join("models/mixtral-tiny-Q8_0.gguf")), "mixtral-tiny.inp", |_| false);
    // Qwen2 normalizes to NFC: decomposed accents come back composed.
    let decomposed = |s: &str| s.chars().any(|c| ('\u{300}'..='\u{36f}').contains(&c));
    round_trip(&vocab("qwen2"), "ggml-vocab-qwen2.gguf.inp", decomposed);
    // GPT-2 and Llama 3 clean up spaces before punctuation on decoding.
    let cleaned = |s: &str| [" ?", " !", " .", " ,", " '"].iter().any(|p| s.contains(p));
    round_trip(&vocab("gpt-2"), "ggml-vocab-gpt-2.gguf.inp", cleaned);
    round_trip(&vocab("llama-bpe"), "ggml-vocab-llama-bpe.gguf.inp", cleaned);
}

#[test]
fn decode_removes_the_spm_prefix_space_only_at_the_start() {
    let tok = vocab("llama-spm");
    let ids = tok.encode(" Hello world", true, false).unwrap();
    assert_eq!(ids[0], 1, "BOS first");
    // After BOS the first piece keeps its space (BOS consumed the rule).
    assert_eq!(tok.decode(&ids, false), "  Hello world");
    assert_eq!(tok.decode(&ids[1..], false), " Hello world");
    assert_eq!(tok.decode(&ids, true), "<s>  Hello world");
}

#[test]
fn stream_holds_back_split_characters() {
    // Byte-fallback tokens: "ö" is two byte tokens in the tiny SentencePiece vocabulary.
    let tok = load(&common::fixtures().join("models/gemma3-tiny-F32.gguf"));
    let ids = tok.encode("wörld", false, false).unwrap();
    let mut d = tok.stream_decoder(false);
    let chunks: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    assert!(chunks.iter().any(String::is_empty), "a byte token alone completes nothing: {chunks:?}");
    assert_eq!(chunks.concat(), "wörld");
    assert!(d.pending().is_empty());

    // Byte-level BPE: " 🦙" is three tokens, the first two partial bytes.
    let tok = vocab("qwen2");
    let ids = tok.encode(" 🦙 ok", false, false).unwrap();
    assert_eq!(&ids[..3], [11162, 99, 247]);
    let mut d = tok.stream_decoder(false);
    assert_eq!(d.push(ids[0]), " ");
    assert_eq!(d.push(ids[1]), "");
    assert_eq!(d.push(ids[2]), "🦙");
    assert_eq!(ids[3..].iter().map(|&id| d.push(id)).collect::<String>(), " ok");

    // An unfinished character at the end is flushed as U+FFFD.
    let mut d = tok.stream_decoder(false);
    assert_eq!(d.push(ids[0]), " ");
    assert_eq!(d.flush(), "\u{fffd}");
}

#[test]
fn control_tokens_are_hidden_unless_asked() {
    let tok = vocab("qwen2");
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false, true).unwrap();
    assert_eq!(ids[0], 151644);
    assert!(tok.is_control(ids[0]));
    assert_eq!(stream_all(&tok, &ids, false), "user\nHi");
    assert_eq!(stream_all(&tok, &ids, true), "<|im_start|>user\nHi<|im_end|>");
    assert_eq!(tok.decode(&ids, false), "user\nHi");
    assert!(tok.is_end_of_generation(*ids.last().unwrap()));
    assert!(tok.is_end_of_generation(151643)); // <|endoftext|>
    assert!(!tok.is_end_of_generation(151644));
}

#[test]
fn special_ids_and_flags_come_from_metadata() {
    let spm = vocab("llama-spm");
    assert_eq!((spm.bos(), spm.eos(), spm.add_bos(), spm.add_space_prefix()), (Some(1), Some(2), true, true));
    let l3 = vocab("llama-bpe");
    assert_eq!((l3.bos(), l3.add_bos()), (Some(128000), true));
    assert_eq!(l3.encode("Hi", true, false).unwrap(), [128000, 13347]);
    let q = vocab("qwen2");
    assert!(!q.add_bos());
    assert_eq!(q.n_vocab(), 151936);
    assert_eq!(q.token_piece(9707), b"Hello");
    assert_eq!(q.token_text(21927), Some("ĠHello"));
}

#[test]
fn wordpiece_frames_cls_sep_and_decodes_words() {
    let Some(src) = common::llama_src("wordpiece_frames_cls_sep_and_decodes_words") else { return };
    let tok = load(&src.join("models/ggml-vocab-bert-bge.gguf"));
    assert_eq!((tok.bos(), tok.unk(), tok.add_bos()), (Some(101), Some(100), true));
    let ids = tok.encode("Héllo, World! It's unaffable 🦙.", true, false).unwrap();
    // [CLS] hello , world ! it ' s un ##aff ##able [UNK] . [SEP]
    let word = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(ids[..6], [101, word("▁hello"), word("▁,"), word("▁world"), word("▁!"), word("▁it")]);
    assert!(ids.len() > 12 && ids.contains(&100), "{ids:?}");
    assert_eq!(ids[ids.len() - 2..], [word("▁."), 102]);
    // Words joined by spaces, the spaces before punctuation cleaned up.
    assert_eq!(tok.decode(&ids, false), "hello, world! it's unaffable.");
    // Special tokens' pieces are their text, no word marker (llama.cpp's).
    assert_eq!(tok.decode(&ids, true), "[CLS] hello, world! it's unaffable[UNK].[SEP]");
    // The stream has no clean-up, but loses the first word's space too.
    assert_eq!(stream_all(&tok, &ids, false), "hello , world ! it ' s unaffable .");
    // Without special tokens' framing, special text stays text.
    assert_eq!(tok.encode("[SEP]", false, false).unwrap(), [word("▁["), word("▁sep"), word("▁]")]);
    assert_eq!(tok.encode("[SEP]", false, true).unwrap(), [102]);
}

#[test]
fn unigram_normalises_frames_and_decodes() {
    let Some(src) = common::llama_src("unigram_normalises_frames_and_decodes") else { return };
    let tok = load(&src.join("models/ggml-vocab-nomic-bert-moe.gguf"));
    // The file asks for <s> ... </s> and a prefix space.
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos(), tok.add_eos(), tok.add_space_prefix()),
        (Some(0), Some(2), true, true, true)
    );
    let ids = tok.encode("Ｈｅｌｌｏ，  ｗｏｒｌｄ！ ﬁne", true, false).unwrap();
    assert_eq!((ids[0], *ids.last().unwrap()), (0, 2));
    // The character map folds full-width forms and ligatures; runs of spaces
    // collapse (remove_extra_whitespaces). The prefix space goes at the start
    // of the text only (after a BOS it stays, as in llama.cpp).
    let text = &ids[1..ids.len() - 1];
    assert_eq!(tok.decode(text, false), "Hello, world! fine");
    assert_eq!(stream_all(&tok, text, false), "Hello, world! fine");
    assert_eq!(tok.decode(&ids, false), " Hello, world! fine");
    assert_eq!(tok.decode(&ids, true), "<s> Hello, world! fine</s>");
    assert_eq!(tok.encode("", true, false).unwrap(), [0, 2]);
}
