//! The token table: texts, scores, attributes and a text -> id index.
//!
//! Texts live in one arena; the index is an open-addressing hash table over
//! it, so a vocabulary of 262k tokens costs two allocations, and a lookup by
//! any byte slice (a substring of the input) allocates nothing.

use crate::gguf::{Array, GgufFile, Key};
use crate::{Error, Result};

/// Token attributes (llama.cpp's `llama_token_attr` bits).
pub(crate) mod attr {
    pub const UNDEFINED: u16 = 1 << 0;
    pub const UNKNOWN: u16 = 1 << 1;
    pub const UNUSED: u16 = 1 << 2;
    pub const NORMAL: u16 = 1 << 3;
    pub const CONTROL: u16 = 1 << 4;
    pub const USER_DEFINED: u16 = 1 << 5;
    pub const BYTE: u16 = 1 << 6;
    /// Strip whitespace left of this token when it is split out of text.
    pub const LSTRIP: u16 = 1 << 8;
    /// Strip whitespace right of this token when it is split out of text.
    pub const RSTRIP: u16 = 1 << 9;
}

/// GGUF `tokenizer.ggml.token_type` values.
fn attr_of_type(ty: i64) -> u16 {
    match ty {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

/// Upper bound on the vocabulary size we accept from a file.
const MAX_TOKENS: usize = 16 << 20;

pub(crate) struct Vocab {
    arena: Vec<u8>,
    /// End offset of each token's text in `arena`.
    ends: Vec<u32>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    index: StrTable,
}

impl Vocab {
    /// Tokens, scores and types from the file.
    pub fn from_gguf(g: &GgufFile) -> Result<Vocab> {
        let key = Key::TokenizerTokens.name();
        let tokens = g.require(key, g.get_array(key))?;
        let tokens = tokens.as_strings().ok_or_else(|| Error::WrongValueType {
            key: key.to_string(),
            expected: "array of strings",
            found: tokens.element_type().name(),
        })?;
        let n = tokens.len();
        if n == 0 || n > MAX_TOKENS {
            return Err(Error::Tokenizer(format!("'{key}' holds {n} tokens")));
        }
        let scores = match g.get_array(Key::TokenizerScores.name())? {
            None => vec![0.0; n],
            Some(a) => per_token(Key::TokenizerScores, n, a.to_f32_vec().or_else(|| ints_as_f32(a)))?,
        };
        let attrs = match g.get_array(Key::TokenizerTokenType.name())? {
            None => vec![attr::NORMAL; n],
            Some(a) => {
                let types = per_token(Key::TokenizerTokenType, n, a.to_i64_vec())?;
                types.into_iter().map(attr_of_type).collect()
            }
        };

        let mut arena = Vec::with_capacity(tokens.iter().map(str::len).sum());
        let mut ends = Vec::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            if t.is_empty() {
                // llama.cpp names empty tokens so that each text stays unique.
                arena.extend_from_slice(format!("[EMPTY_{i}]").as_bytes());
            } else {
                arena.extend_from_slice(t.as_bytes());
            }
            let end =
                u32::try_from(arena.len()).map_err(|_| Error::Tokenizer("token texts exceed 4 GiB".to_string()))?;
            ends.push(end);
        }
        let mut v = Vocab { arena, ends, scores, attrs, index: StrTable::default() };
        v.index = StrTable::build(n, |i| v.text(i as u32));
        Ok(v)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The stored text of a token (SentencePiece `▁` and GPT-2 byte
    /// characters included). Empty for an id out of range.
    pub fn text(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match self.ends.get(i) {
            None => &[],
            Some(&end) => {
                let start = if i == 0 { 0 } else { self.ends[i - 1] };
                &self.arena[start as usize..end as usize]
            }
        }
    }

    /// The token whose text is exactly `text`; the last such id when a file
    /// repeats a text (llama.cpp's map keeps the last).
    #[inline]
    pub fn find(&self, text: &[u8]) -> Option<u32> {
        self.index.find(text, |id| self.text(id))
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    pub fn has_attr(&self, id: u32, bits: u16) -> bool {
        self.attr(id) & bits != 0
    }
}

fn ints_as_f32(a: &Array) -> Option<Vec<f32>> {
    a.to_i64_vec().map(|v| v.into_iter().map(|x| x as f32).collect())
}

/// A per-token array: the right element type and at least one entry per token.
fn per_token<T>(key: Key, n: usize, v: Option<Vec<T>>) -> Result<Vec<T>> {
    let mut v = v.ok_or_else(|| Error::Tokenizer(format!("'{}' has the wrong element type", key.name())))?;
    if v.len() < n {
        return Err(Error::Tokenizer(format!("'{}' has {} entries for {n} tokens", key.name(), v.len())));
    }
    v.truncate(n);
    Ok(v)
}

/// Open-addressing hash index from text to id; the texts stay with the caller.
/// Each slot keeps 32 bits of the hash beside the id, so a probe that misses
/// rarely touches the texts.
#[derive(Default)]
pub(crate) struct StrTable {
    /// `tag << 32 | (id + 1)` per slot, 0 for empty. Length is a power of two.
    slots: Vec<u64>,
    mask: usize,
}

impl StrTable {
    /// Index ids `0..n` by the text `text_of(id)`; a later id replaces an
    /// earlier one with the same text.
    pub fn build<'a>(n: usize, text_of: impl Fn(usize) -> &'a [u8]) -> StrTable {
        let cap = (n * 2).next_power_of_two().max(16);
        let mut t = StrTable { slots: vec![0; cap], mask: cap - 1 };
        for id in 0..n {
            let text = text_of(id);
            let h = hash(text);
            let tag = h >> 32;
            let mut i = h as usize & t.mask;
            loop {
                let s = t.slots[i];
                if s == 0 || (s >> 32 == tag && text_of((s as u32 - 1) as usize) == text) {
                    t.slots[i] = tag << 32 | (id as u64 + 1);
                    break;
                }
                i = (i + 1) & t.mask;
            }
        }
        t
    }

    #[inline]
    pub fn find<'a>(&self, text: &[u8], text_of: impl Fn(u32) -> &'a [u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let h = hash(text);
        let tag = h >> 32;
        let mut i = h as usize & self.mask;
        loop {
            let s = self.slots[i];
            if s == 0 {
                return None;
            }
            if s >> 32 == tag {
                let id = s as u32 - 1;
                if text_of(id) == text {
                    return Some(id);
                }
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// A fast non-cryptographic hash of a byte string (8 bytes at a time).
#[inline]
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(buf)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn str_table_finds_every_text_and_nothing_else() {
        let texts: Vec<String> = (0..1000).map(|i| format!("tok{i}")).chain(["".into(), "a".into()]).collect();
        let t = StrTable::build(texts.len(), |i| texts[i].as_bytes());
        for (i, s) in texts.iter().enumerate() {
            assert_eq!(t.find(s.as_bytes(), |id| texts[id as usize].as_bytes()), Some(i as u32));
        }
        assert_eq!(t.find(b"tok1000", |id| texts[id as usize].as_bytes()), None);
    }
}
