//! Unigram (`tokenizer.ggml.model = t5`: T5, XLM-RoBERTa and the embedding
//! models built on them), as llama.cpp's `llm_tokenizer_ugm`.
//!
//! 1. Normalise with the SentencePiece model's precompiled character map
//!    (`tokenizer.ggml.precompiled_charsmap`): at each position the longest
//!    input prefix the map knows is replaced (NFKC-style folding), else one
//!    character is kept; the longest prefix of a user-defined token is kept
//!    as it is. Spaces become `▁`; a `▁` goes in front of the text
//!    (`add_space_prefix`) or of every word when runs of spaces collapse
//!    (`remove_extra_whitespaces`, which also drops the trailing ones).
//! 2. Viterbi over the normalised bytes: the segmentation into normal,
//!    user-defined (score 0) and unused tokens with the highest sum of
//!    scores, a character no token covers costing the lowest normal score
//!    less 10 as `[UNK]`; consecutive unknowns merge into one.

use super::vocab::{attr, Vocab};
use crate::{Error, Result};

const SPACE: &[u8] = "▁".as_bytes();

/// llama.cpp's penalty below the lowest normal score for an unknown character.
const UNKNOWN_PENALTY: f32 = 10.0;

/// Tokens the segmentation may use.
const USABLE: u16 = attr::NORMAL | attr::USER_DEFINED | attr::UNUSED;

/// The precompiled character map: a XOR-compressed compact double array
/// (XCDA) over input bytes whose leaves index NUL-terminated replacements.
struct Charsmap {
    xcda: Vec<u32>,
    replacements: Vec<u8>,
}

impl Charsmap {
    /// Parse the map as llama.cpp lays it out: a little-endian u32 byte
    /// length of the array, the array, then the replacement strings.
    fn parse(bytes: &[u8]) -> Result<Charsmap> {
        let bad = |why: &str| Err(Error::Tokenizer(format!("precompiled_charsmap: {why}")));
        let Some(head) = bytes.get(..4) else { return bad("shorter than its header") };
        let size = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if size.checked_add(4).is_none_or(|end| end >= bytes.len()) {
            return bad("array larger than the map");
        }
        let xcda = bytes[4..4 + size].chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok(Charsmap { xcda, replacements: bytes[4 + size..].to_vec() })
    }

    fn node(&self, i: u32) -> Result<u32> {
        self.xcda
            .get(i as usize)
            .copied()
            .ok_or_else(|| Error::Tokenizer("precompiled_charsmap: node out of range".into()))
    }

    fn base(&self, i: u32) -> Result<u32> {
        let n = self.node(i)?;
        Ok((n >> 10) << ((n & (1 << 9)) >> 6))
    }

    /// The longest prefix of `input` the map replaces: its length and the
    /// replacement.
    fn longest(&self, input: &[u8]) -> Result<Option<(usize, &[u8])>> {
        if self.xcda.is_empty() {
            return Ok(None);
        }
        let mut found = None;
        let mut node = self.base(0)?;
        for (len, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= c as u32;
            let packed = self.node(node)?;
            // LCHECK: this node is a child of the previous one for `c`.
            if packed & ((1 << 31) | 0xFF) != c as u32 {
                break;
            }
            let leaf = (packed >> 8) & 1 == 1;
            node ^= self.base(node)?;
            if leaf {
                found = Some((len + 1, self.node(node)? & ((1 << 31) - 1)));
            }
        }
        let Some((len, offset)) = found else { return Ok(None) };
        let rest = self.replacements.get(offset as usize..).unwrap_or_default();
        match rest.iter().position(|&b| b == 0) {
            Some(end) => Ok(Some((len, &rest[..end]))),
            None => Err(Error::Tokenizer("precompiled_charsmap: replacement out of range or unterminated".into())),
        }
    }
}

/// What unigram segmentation needs beside the vocabulary.
pub(crate) struct UgmModel {
    charsmap: Option<Charsmap>,
    /// User-defined token texts, sorted (their longest common prefix with
    /// the input is kept unnormalised, as llama.cpp's trie walk keeps it).
    user_defined: Vec<Vec<u8>>,
    /// Longest usable token, in bytes.
    max_len: usize,
    unknown_score: f32,
}

/// The best segmentation of the normalised prefix ending at one byte.
#[derive(Clone, Copy)]
struct Best {
    id: Option<u32>,
    start: usize,
    score: f64,
}

impl UgmModel {
    pub fn new(vocab: &Vocab, charsmap: Option<&[u8]>) -> Result<UgmModel> {
        let charsmap = charsmap.filter(|c| !c.is_empty()).map(Charsmap::parse).transpose()?;
        let (mut min, mut max_len) = (f32::MAX, 0);
        let mut user_defined = Vec::new();
        for id in 0..vocab.len() as u32 {
            if vocab.has_attr(id, attr::NORMAL) {
                min = min.min(vocab.scores[id as usize]);
            }
            if vocab.has_attr(id, USABLE) {
                max_len = max_len.max(vocab.text(id).len());
            }
            if vocab.has_attr(id, attr::USER_DEFINED) {
                user_defined.push(vocab.text(id).to_vec());
            }
        }
        user_defined.sort_unstable();
        Ok(UgmModel { charsmap, user_defined, max_len, unknown_score: min - UNKNOWN_PENALTY })
    }

    /// The longest common prefix of `input` with any user-defined token (the
    /// nearest texts in sorted order share the most).
    fn user_defined_prefix(&self, input: &[u8]) -> usize {
        let at = self.user_defined.partition_point(|t| t.as_slice() < input);
        let common = |t: &Vec<u8>| t.iter().zip(input).take_while(|(a, b)| a == b).count();
        let before = at.checked_sub(1).and_then(|i| self.user_defined.get(i)).map_or(0, common);
        before.max(self.user_defined.get(at).map_or(0, common))
    }

    /// llama.cpp's `normalize`: the text with the map applied and spaces
    /// escaped (`space_prefix`: a `▁` before the first word; `merge`: one
    /// `▁` before every word instead of one per space).
    fn normalize(&self, text: &str, space_prefix: bool, merge: bool, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let input = text.as_bytes();
        let (mut in_word, mut prefixed) = (false, false);
        let mut pos = 0;
        while pos < input.len() {
            let rest = &input[pos..];
            let (piece, used): (&[u8], usize) = match self.user_defined_prefix(rest) {
                0 => match self.charsmap.as_ref().map(|c| c.longest(rest)).transpose()?.flatten() {
                    Some((len, replacement)) => (replacement, len),
                    None => {
                        let n = super::unicode::utf8_len(rest[0]).min(rest.len());
                        (&rest[..n], n)
                    }
                },
                n => (&rest[..n], n),
            };
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (space_prefix && !prefixed) || merge {
                            out.extend_from_slice(SPACE);
                            prefixed = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(SPACE);
                    }
                }
            }
            pos += used;
        }
        Ok(())
    }

    /// Append the tokens of `text`.
    pub fn encode(
        &self,
        vocab: &Vocab,
        text: &str,
        (space_prefix, merge): (bool, bool),
        unk: Option<u32>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let mut s = Vec::with_capacity(text.len() * 3 / 2 + 3);
        self.normalize(text, space_prefix, merge, &mut s)?;
        if s.is_empty() {
            return Ok(());
        }
        let n = s.len();
        let mut best = vec![Best { id: None, start: 0, score: f64::MIN }; n + 1];
        best[0].score = 0.0;
        let mut i = 0;
        while i < n {
            let char_len = super::unicode::utf8_len(s[i]).min(n - i);
            let here = best[i].score;
            let mut whole_char = false;
            for j in i + 1..=n.min(i + self.max_len) {
                let Some(id) = vocab.find(&s[i..j]).filter(|&id| vocab.has_attr(id, USABLE)) else { continue };
                whole_char |= j - i == char_len;
                let score = if vocab.has_attr(id, attr::USER_DEFINED) { 0.0 } else { vocab.scores[id as usize] as f64 };
                if here + score > best[j].score {
                    best[j] = Best { id: Some(id), start: i, score: here + score };
                }
            }
            if !whole_char {
                let score = here + self.unknown_score as f64;
                if score > best[i + char_len].score {
                    best[i + char_len] = Best { id: None, start: i, score };
                }
            }
            i += char_len;
        }
        // Back from the end; runs of unknown characters become one [UNK].
        let start = out.len();
        let (mut at, mut prev_unknown) = (n, false);
        loop {
            let b = best[at];
            match b.id {
                Some(id) => out.push(id),
                None if !prev_unknown => {
                    out.push(unk.ok_or_else(|| Error::Tokenizer("a character has no token and no [UNK]".into()))?)
                }
                None => {}
            }
            prev_unknown = b.id.is_none();
            if b.start == 0 {
                break;
            }
            at = b.start;
        }
        out[start..].reverse();
        Ok(())
    }
}
