//! Pre-tokenizers: split text into the words BPE merges within.
//!
//! A `tokenizer.ggml.pre` name selects one of llama.cpp's splitting rules
//! ([`names`]); a rule is a list of patterns applied in turn, each splitting
//! the pieces of the one before ([`rules`]). Patterns llama.cpp splits by
//! hand run through the matching hand-written splitter ([`custom`]); the rest
//! through a small matcher with `std::regex`'s semantics ([`regex`]).

mod custom;
mod names;
mod pattern;
mod regex;
mod rules;

use std::sync::Arc;

use custom::{Cursor, Family};
use regex::Regex;
pub(crate) use rules::PreType;

use super::unicode::decode_at;
use crate::{Error, Result};

/// One pattern of a rule, ready to run.
#[derive(Debug)]
enum Step {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    KimiK2,
    DigitGroups,
    Newlines,
    Regex(Regex),
}

impl Step {
    /// The hand-written splitter llama.cpp uses for this exact pattern text,
    /// else the pattern compiled.
    fn new(pattern: &str) -> Result<Step> {
        Ok(match pattern {
            rules::GPT2 => Step::Gpt2,
            rules::LLAMA3 => Step::Llama3,
            rules::QWEN2 => Step::Qwen2,
            rules::QWEN35 => Step::Qwen35,
            rules::HAN => Step::KimiK2,
            rules::AFMOE_DIGITS | rules::TINY_AYA_DIGITS => Step::DigitGroups,
            rules::NEWLINES => Step::Newlines,
            p => Step::Regex(Regex::new(p).map_err(|e| Error::Tokenizer(format!("split pattern: {e}")))?),
        })
    }

    /// Split `text[a..b]`, appending the pieces (offsets into `text`).
    fn split(&self, text: &str, a: usize, b: usize, scratch: &mut Scratch, out: &mut Vec<(usize, usize)>) {
        let s = Cursor { s: &text.as_bytes()[a..b], base: a };
        match self {
            Step::Gpt2 => custom::split_gpt2(s, out),
            Step::Llama3 => custom::split_llama3_family(s, Family::Llama3, out),
            Step::Qwen2 => custom::split_llama3_family(s, Family::Qwen2, out),
            Step::Qwen35 => custom::split_llama3_family(s, Family::Qwen35, out),
            Step::KimiK2 => custom::split_kimi_k2(s, out),
            Step::DigitGroups => custom::split_digit_groups(s, out),
            Step::Newlines => custom::split_newlines(s, out),
            Step::Regex(re) => {
                let Scratch { syms, offsets, stack, ends } = scratch;
                syms.clear();
                offsets.clear();
                let bytes = s.s;
                let mut i = 0;
                while i < bytes.len() {
                    let (cp, n) = decode_at(bytes, i);
                    syms.push(re.mode.symbol(cp));
                    offsets.push(a + i);
                    i += n;
                }
                offsets.push(b);
                ends.clear();
                re.split(syms, stack, ends);
                let mut prev = a;
                for &e in ends.iter() {
                    out.push((prev, offsets[e]));
                    prev = offsets[e];
                }
            }
        }
    }
}

/// Buffers reused across the pieces of one call.
#[derive(Default)]
struct Scratch {
    syms: Vec<u32>,
    offsets: Vec<usize>,
    stack: Vec<(u32, usize)>,
    ends: Vec<usize>,
}

/// The splitting rule of a BPE vocabulary.
#[derive(Clone)]
pub(crate) struct PreTokenizer {
    kind: PreType,
    steps: Arc<[Step]>,
}

impl std::fmt::Debug for PreTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind)
    }
}

impl PreTokenizer {
    pub fn new(kind: PreType) -> Result<PreTokenizer> {
        let steps = kind.patterns().iter().map(|p| Step::new(p)).collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer { kind, steps: steps.into() })
    }

    /// Append the words of `text` to `out` as byte ranges (offset by `base`).
    pub fn split(&self, text: &str, base: usize, out: &mut Vec<(usize, usize)>) {
        let mut scratch = Scratch::default();
        if let [step] = &*self.steps {
            let start = out.len();
            step.split(text, 0, text.len(), &mut scratch, out);
            out[start..].iter_mut().for_each(|r| *r = (r.0 + base, r.1 + base));
            return;
        }
        let mut cur = vec![(0, text.len())];
        let mut next = Vec::new();
        for step in self.steps.iter() {
            for &(a, b) in &cur {
                step.split(text, a, b, &mut scratch, &mut next);
            }
            std::mem::swap(&mut cur, &mut next);
            next.clear();
        }
        out.extend(cur.iter().map(|&(a, b)| (a + base, b + base)));
    }
}

/// What a `tokenizer.ggml.pre` name selects.
pub(crate) struct PreConfig {
    pub pre: PreTokenizer,
    /// Whole words that are tokens skip the merges (Llama 3).
    pub ignore_merges: bool,
    /// Detokenizing removes spaces before punctuation (GPT-2's
    /// `clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// The model adds BOS unless the file says otherwise.
    pub add_bos: bool,
    /// The model has no default BOS token (ChatGLM/GLM-4).
    pub no_bos: bool,
    /// BOS is added even when the file says not to (llama.cpp's Gemma 4
    /// workaround).
    pub force_bos: bool,
    /// Words are raw UTF-8 with `<0xXX>` byte tokens, not GPT-2 byte
    /// characters (SentencePiece-shaped BPE).
    pub raw: bool,
    /// Spaces become `▁` before splitting.
    pub escape_whitespaces: bool,
    /// A word of newlines that is a token skips the merges (Gemma 4).
    pub newline_words: bool,
    /// Text is NFC-normalized first (Hugging Face's Qwen2 tokenizer has an
    /// NFC normalizer; llama.cpp skips it, so it differs on decomposed text).
    pub nfc: bool,
}

impl PreConfig {
    /// The configuration for a pre-tokenizer name: [`Error::UnknownPreTokenizer`]
    /// naming it when llama.cpp does not know it either.
    pub fn from_name(name: &str) -> Result<PreConfig> {
        let (kind, f) = names::lookup(name).ok_or_else(|| Error::UnknownPreTokenizer(name.to_string()))?;
        Ok(PreConfig {
            pre: PreTokenizer::new(kind)?,
            ignore_merges: f.ignore_merges,
            clean_spaces: f.clean_spaces,
            add_bos: f.add_bos,
            no_bos: f.no_bos,
            force_bos: kind == PreType::Gemma4,
            raw: !kind.byte_encode(),
            escape_whitespaces: f.escape_whitespaces,
            newline_words: kind == PreType::Gemma4,
            nfc: matches!(name, "qwen2" | "deepseek-r1-qwen"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(name: &str, text: &str) -> Vec<String> {
        let pre = PreConfig::from_name(name).unwrap().pre;
        let mut out = Vec::new();
        pre.split(text, 0, &mut out);
        out.iter().map(|&(a, b)| text[a..b].to_string()).collect()
    }

    #[test]
    fn every_rule_compiles() {
        for name in names::all_names() {
            let (kind, _) = names::lookup(name).unwrap();
            PreTokenizer::new(kind).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn unknown_names_are_typed_errors() {
        assert!(matches!(PreConfig::from_name("nope"), Err(Error::UnknownPreTokenizer(n)) if n == "nope"));
    }

    #[test]
    fn qwen2_splits_like_llama_cpp() {
        let t = "Hello, y'all! How're you 😁 ?我想在apple 3333  \n\n  x";
        assert_eq!(
            words("qwen2", t),
            [
                "Hello",
                ",",
                " y",
                "'all",
                "!",
                " How",
                "'re",
                " you",
                " 😁",
                " ?",
                "我想在apple",
                " ",
                "3",
                "3",
                "3",
                "3",
                "  \n\n",
                " ",
                " x"
            ]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(words("llama-bpe", "1234567 x"), ["123", "456", "7", " x"]);
    }

    #[test]
    fn qwen35_keeps_marks_in_words() {
        assert_eq!(words("qwen35", "re\u{301}sume\u{301}"), ["re\u{301}sume\u{301}"]);
        assert_eq!(words("qwen2", "re\u{301}sume\u{301}"), ["re", "\u{301}sume", "\u{301}"]);
    }

    #[test]
    fn gpt2_and_default() {
        assert_eq!(words("gpt-2", "I'm  here 12ab"), ["I", "'m", " ", " here", " 12", "ab"]);
        assert_eq!(words("default", "a+=b 12345"), ["a", "+=", "b", " ", "123", "45"]);
    }

    #[test]
    fn starcoder_isolates_digits_deepseek_coder_splits_scripts() {
        assert_eq!(words("starcoder", "x 123"), ["x", " ", "1", "2", "3"]);
        assert_eq!(words("deepseek-coder", "a\nb 中文12"), ["a", "\n", "b", " ", "中文", "1", "2"]);
    }

    #[test]
    fn kimi_and_digit_groups() {
        assert_eq!(words("kimi-k2", "中文abc's 12345"), ["中文", "abc's", " ", "123", "45"]);
        assert_eq!(words("afmoe", "ab1234"), ["ab", "1", "234"]);
        assert_eq!(words("superbpe", "x1234567"), ["x", "1", "234", "567"]);
    }

    #[test]
    fn every_byte_lands_in_one_word() {
        let t = "  a\t\n\r\n b ' 'S 's \u{85}x\u{a0}\u{3000}y !!\n中文 12345 é\u{301} <sentinel:3> IMGIMGABZ";
        for name in names::all_names() {
            let Ok(cfg) = PreConfig::from_name(name) else { continue };
            let mut out = Vec::new();
            cfg.pre.split(t, 7, &mut out);
            let mut at = 7;
            for &(a, b) in &out {
                assert!(a == at && b > a, "{name}: {out:?}");
                at = b;
            }
            assert_eq!(at, 7 + t.len(), "{name}");
        }
    }
}
