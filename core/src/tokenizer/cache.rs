//! A per-call memo of word -> tokens. Pre-tokenized words (and SentencePiece
//! pieces) are tokenized independently of their context, and natural text
//! repeats its words, so most words are looked up rather than merged again.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::vocab::hash;

/// Longer words are rare enough not to be worth keeping.
const MAX_WORD: usize = 48;
/// Stop adding words past this many (bounds memory on huge inputs).
const MAX_WORDS: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct WordCache {
    map: HashMap<Box<[u8]>, (u32, u32), BuildHasherDefault<BytesHasher>>,
    ids: Vec<u32>,
}

impl WordCache {
    /// Append the cached tokens of `word` to `out`; false when not cached.
    #[inline]
    pub fn lookup(&self, word: &[u8], out: &mut Vec<u32>) -> bool {
        if word.len() > MAX_WORD {
            return false;
        }
        match self.map.get(word) {
            Some(&(start, len)) => {
                out.extend_from_slice(&self.ids[start as usize..(start + len) as usize]);
                true
            }
            None => false,
        }
    }

    pub fn insert(&mut self, word: &[u8], tokens: &[u32]) {
        if word.len() > MAX_WORD || self.map.len() >= MAX_WORDS {
            return;
        }
        let start = self.ids.len() as u32;
        self.ids.extend_from_slice(tokens);
        self.map.insert(word.into(), (start, tokens.len() as u32));
    }
}

/// Hashes the whole key at once with the vocabulary's byte hash.
#[derive(Default)]
pub(crate) struct BytesHasher(u64);

impl Hasher for BytesHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = self.0.rotate_left(7) ^ hash(bytes);
    }
}
