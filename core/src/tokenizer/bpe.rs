//! Byte-level BPE (GPT-2 style): each word starts as one symbol per byte and
//! adjacent pairs merge by rank, lowest first, leftmost on ties. Raw-UTF-8
//! BPE (Gemma 4's SentencePiece-shaped vocabulary) starts from one symbol
//! per character instead and falls back to `<0xXX>` byte tokens.
//!
//! Symbols are token ids, not strings: every text that appears in the merge
//! list is interned once at load (vocabulary tokens keep their id; the rare
//! merge result that is not a token gets an id past the vocabulary), so a
//! merge step is one hash lookup of an id pair.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::unicode::{byte_to_char, utf8_len};
use super::vocab::Vocab;
use crate::gguf::StringArray;

/// No id: a text in neither the vocabulary nor the merges.
const NO_ID: u32 = u32::MAX;

pub(crate) struct BpeModel {
    /// Initial symbol of each byte (the id of its byte-level character).
    byte_ids: [u32; 256],
    /// `(left << 32 | right)` -> (rank, merged id). First rank wins on repeats.
    merges: HashMap<u64, (u32, u32), IdPairHasher>,
    /// Skip merges for words that are whole tokens (Llama 3).
    ignore_merges: bool,
    /// Raw UTF-8 symbols: the merge texts that are not tokens, by text
    /// (`None` for byte-level models).
    raw: Option<HashMap<String, u32>>,
    /// A raw word of newlines that is a token skips the merges (Gemma 4).
    newline_words: bool,
}

#[derive(Default)]
struct Sym {
    id: u32,
    /// Byte range of the symbol in the word; `len == 0` once merged away.
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// Candidate merges: (rank, left symbol, left id, right id, merged id), the
/// smallest on top.
type Heap = BinaryHeap<Reverse<(u32, u32, u32, u32, u32)>>;

/// Reusable buffers for one encode call.
#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: Heap,
    word: String,
}

impl BpeModel {
    /// `raw`: symbols are UTF-8 characters, not GPT-2 byte characters.
    pub fn new(vocab: &Vocab, merges: &StringArray, ignore_merges: bool, raw: bool, newline_words: bool) -> BpeModel {
        let n_vocab = vocab.len() as u32;
        let mut extra: HashMap<String, u32> = HashMap::new();
        let mut intern = |text: &str| -> u32 {
            vocab.find(text.as_bytes()).unwrap_or_else(|| {
                let next = n_vocab + extra.len() as u32;
                *extra.entry(text.to_string()).or_insert(next)
            })
        };
        let mut map = HashMap::with_capacity_and_hasher(merges.len(), IdPairHasher);
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // "left right", split at the first space after the first byte
            let Some(sp) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else { continue };
            let (left, right) = (&m[..sp], &m[sp + 1..]);
            let (l, r) = (intern(left), intern(right));
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merged = intern(&joined);
            map.entry(pair(l, r)).or_insert((rank as u32, merged));
        }
        let mut byte_ids = [NO_ID; 256];
        let mut buf = [0u8; 4];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            let c = byte_to_char(b as u8).encode_utf8(&mut buf);
            *id = vocab.find(c.as_bytes()).or_else(|| extra.get(&*c).copied()).unwrap_or(NO_ID);
        }
        BpeModel { byte_ids, merges: map, ignore_merges, raw: raw.then_some(extra), newline_words }
    }

    /// Append the tokens of one pre-tokenized word.
    pub fn encode_word(&self, vocab: &Vocab, word: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        if let Some(extra) = &self.raw {
            return self.encode_raw(vocab, extra, word, scratch, out);
        }
        match word.len() {
            0 => return,
            1 => return self.emit(vocab, word, self.byte_ids[word[0] as usize], out),
            _ => {}
        }
        if self.ignore_merges {
            scratch.word.clear();
            scratch.word.extend(word.iter().map(|&b| byte_to_char(b)));
            if let Some(id) = vocab.find(scratch.word.as_bytes()) {
                out.push(id);
                return;
            }
        }

        let syms = &mut scratch.syms;
        syms.clear();
        let n = word.len() as u32;
        syms.extend((0..n).map(|i| Sym {
            id: self.byte_ids[word[i as usize] as usize],
            start: i,
            len: 1,
            prev: i.wrapping_sub(1),
            next: if i + 1 < n { i + 1 } else { NO_ID },
        }));
        self.merge_and_emit(vocab, word, scratch, out);
    }

    /// Raw UTF-8: one symbol per character (its token, else its merge-only
    /// id, else none). A word of newlines that is a token stays whole, as
    /// llama.cpp does for Gemma 4.
    fn encode_raw(
        &self,
        vocab: &Vocab,
        extra: &HashMap<String, u32>,
        word: &[u8],
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges || (self.newline_words && word.iter().all(|&b| b == b'\n')) {
            if let Some(id) = vocab.find(word) {
                out.push(id);
                return;
            }
        }
        let syms = &mut scratch.syms;
        syms.clear();
        let mut i = 0;
        while i < word.len() {
            // By the lead byte, as llama.cpp (the text is valid UTF-8).
            let n = utf8_len(word[i]).min(word.len() - i);
            let text = &word[i..i + n];
            let id = vocab
                .find(text)
                .or_else(|| std::str::from_utf8(text).ok().and_then(|t| extra.get(t).copied()))
                .unwrap_or(NO_ID);
            let k = syms.len() as u32;
            syms.push(Sym { id, start: i as u32, len: n as u32, prev: k.wrapping_sub(1), next: k + 1 });
            i += n;
        }
        if let Some(last) = syms.last_mut() {
            last.next = NO_ID;
        }
        self.merge_and_emit(vocab, word, scratch, out);
    }

    /// Run the merges over `scratch.syms` and append the resulting tokens.
    fn merge_and_emit(&self, vocab: &Vocab, word: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let syms = &mut scratch.syms;
        let n = syms.len() as u32;
        let heap = &mut scratch.heap;
        heap.clear();
        for i in 1..n {
            self.push_pair(syms, heap, i - 1, i);
        }
        // Lowest rank first; on equal ranks the leftmost pair.
        while let Some(Reverse((_, left, l_id, r_id, merged))) = heap.pop() {
            let right = syms[left as usize].next;
            if right == NO_ID {
                continue;
            }
            let (l, r) = (&syms[left as usize], &syms[right as usize]);
            // A pair is stale once either side has merged into something else.
            if l.len == 0 || r.len == 0 || l.id != l_id || r.id != r_id {
                continue;
            }
            let (r_len, r_next) = (r.len, r.next);
            syms[right as usize].len = 0;
            let l = &mut syms[left as usize];
            l.id = merged;
            l.len += r_len;
            l.next = r_next;
            if r_next != NO_ID {
                syms[r_next as usize].prev = left;
            }
            let prev = syms[left as usize].prev;
            if prev != NO_ID {
                self.push_pair(syms, heap, prev, left);
            }
            if r_next != NO_ID {
                self.push_pair(syms, heap, left, r_next);
            }
        }
        let mut i = 0;
        while i != NO_ID {
            let s = &syms[i as usize];
            self.emit(vocab, &word[s.start as usize..(s.start + s.len) as usize], s.id, out);
            i = s.next;
        }
    }

    #[inline]
    fn push_pair(&self, syms: &[Sym], heap: &mut Heap, left: u32, right: u32) {
        let (l_id, r_id) = (syms[left as usize].id, syms[right as usize].id);
        if let Some(&(rank, merged)) = self.merges.get(&pair(l_id, r_id)) {
            heap.push(Reverse((rank, left, l_id, r_id, merged)));
        }
    }

    /// A finished symbol: its token, or (when its text is not a token) the
    /// single-character tokens of its bytes where they exist, as llama.cpp
    /// (`<0xXX>` tokens for raw UTF-8).
    fn emit(&self, vocab: &Vocab, bytes: &[u8], id: u32, out: &mut Vec<u32>) {
        if (id as usize) < vocab.len() {
            out.push(id);
            return;
        }
        if self.raw.is_some() {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            for &b in bytes {
                let name = [b'<', b'0', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize], b'>'];
                out.extend(vocab.find(&name));
            }
            return;
        }
        for &b in bytes {
            let c = byte_to_char(b);
            if c.is_ascii() {
                if let Some(t) = vocab.find(&[c as u8]) {
                    out.push(t);
                }
            }
        }
    }
}

#[inline]
fn pair(l: u32, r: u32) -> u64 {
    ((l as u64) << 32) | r as u64
}

/// Hasher for id pairs: one multiply, good enough for keys that are already
/// well spread.
#[derive(Clone, Copy, Default)]
pub(crate) struct IdPairHasher;

impl std::hash::BuildHasher for IdPairHasher {
    type Hasher = IdPairHash;
    fn build_hasher(&self) -> IdPairHash {
        IdPairHash(0)
    }
}

pub(crate) struct IdPairHash(u64);

impl std::hash::Hasher for IdPairHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        let h = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}
