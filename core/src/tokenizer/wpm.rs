//! WordPiece (`tokenizer.ggml.model = bert`: BERT, BGE, nomic-embed), as
//! llama.cpp's `llm_tokenizer_wpm`.
//!
//! 1. Normalise as BERT's normaliser does in llama.cpp: with accent stripping
//!    each code point becomes the first code point of its NFD decomposition
//!    (`é` -> `e`; llama.cpp keeps only that one) and combining marks are
//!    dropped; control characters, NUL and U+FFFD are dropped; letters are
//!    lowercased (simple one-to-one mapping).
//! 2. Split into words at whitespace; each punctuation character, ASCII
//!    symbol and CJK ideograph is a word of its own.
//! 3. Each word, prefixed with `▁` (the GGUF converter spells a word-initial
//!    piece `▁x` and a continuation `##x` as plain `x`), is cut greedily into
//!    the longest vocabulary tokens from the left. A word with any position no
//!    token matches becomes one `[UNK]`.

use unicode_normalization::UnicodeNormalization;

use super::unicode::{flags, Category};
use super::vocab::Vocab;
use crate::{Error, Result};

/// The word prefix of the GGUF WordPiece vocabularies.
const WORD_START: &str = "▁";

/// What WordPiece needs beside the vocabulary.
pub(crate) struct WpmModel {
    /// Length in bytes of the longest token text (bounds each match).
    max_len: usize,
    lowercase: bool,
    strip_accents: bool,
}

impl WpmModel {
    pub fn new(vocab: &Vocab, lowercase: bool, strip_accents: bool) -> WpmModel {
        let max_len = (0..vocab.len() as u32).map(|id| vocab.text(id).len()).max().unwrap_or(0);
        WpmModel { max_len, lowercase, strip_accents }
    }

    /// Append the tokens of `text`; words no token covers become `unk`.
    pub fn encode(&self, vocab: &Vocab, text: &str, unk: Option<u32>, out: &mut Vec<u32>) -> Result<()> {
        let mut word = String::from(WORD_START);
        for c in text.chars() {
            let c = if self.strip_accents && !c.is_ascii() { first_of_nfd(c) } else { c };
            let cp = c as u32;
            let f = flags(cp);
            if f.is_whitespace() {
                self.finish_word(vocab, &mut word, unk, out)?;
                continue;
            }
            let cat = f.category();
            if cp == 0 || cp == 0xFFFD || cat == Category::Control {
                continue;
            }
            if self.strip_accents && cat == Category::Mark {
                continue;
            }
            let lower = if self.lowercase { to_lower(c) } else { c };
            if cat == Category::Punctuation || (cp < 0x7F && cat == Category::Symbol) || is_cjk(cp) {
                // A word of its own.
                self.finish_word(vocab, &mut word, unk, out)?;
                word.push(lower);
                self.finish_word(vocab, &mut word, unk, out)?;
            } else {
                word.push(lower);
            }
        }
        self.finish_word(vocab, &mut word, unk, out)
    }

    /// Tokenize the word gathered so far (if any) and start a new one.
    fn finish_word(&self, vocab: &Vocab, word: &mut String, unk: Option<u32>, out: &mut Vec<u32>) -> Result<()> {
        if word.len() > WORD_START.len() {
            self.encode_word(vocab, word.as_bytes(), unk, out)?;
            word.truncate(WORD_START.len());
        }
        Ok(())
    }

    /// Longest match first over `word` (valid UTF-8, `▁` included).
    fn encode_word(&self, vocab: &Vocab, word: &[u8], unk: Option<u32>, out: &mut Vec<u32>) -> Result<()> {
        let start = out.len();
        let mut i = 0;
        while i < word.len() {
            // llama.cpp tries lengths up to one more than the longest token.
            let mut j = word.len().min(i + self.max_len + 1);
            let matched = loop {
                if j <= i {
                    break None;
                }
                if let Some(id) = vocab.find(&word[i..j]) {
                    break Some((id, j));
                }
                j -= 1;
            };
            match matched {
                Some((id, end)) => {
                    out.push(id);
                    i = end;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            let unk =
                unk.ok_or_else(|| Error::Tokenizer("a word has no WordPiece tokens and no [UNK] token".into()))?;
            out.push(unk);
        }
        Ok(())
    }
}

/// The first code point of `c`'s canonical decomposition.
fn first_of_nfd(c: char) -> char {
    std::iter::once(c).nfd().next().unwrap_or(c)
}

/// Simple (one code point) lowercase mapping; the only character whose full
/// mapping is longer, U+0130, maps simply to its first character `i`.
fn to_lower(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    c.to_lowercase().next().unwrap_or(c)
}

/// The CJK ideograph blocks BERT splits into single characters (as
/// Hugging Face's and llama.cpp's tables, including their 0x2B920 start).
fn is_cjk(cp: u32) -> bool {
    matches!(cp,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}
