//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`: Llama 2,
//! Mistral/Mixtral, Gemma): spaces become `▁`, the text starts as one symbol
//! per character, and the adjacent pair whose concatenation is the
//! highest-scoring token merges first (leftmost on ties). Symbols that end up
//! as no token fall back to `<0xXX>` byte tokens.
//!
//! The merge loop follows llama.cpp's `llm_tokenizer_spm_session` step by
//! step. llama.cpp merges over the whole fragment at once; we cut it before
//! each `▁` that no token can join to the character before it (no token
//! contains that character followed by `▁`): no merge can cross such a cut,
//! so the pieces merge exactly as the whole would, with small heaps.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::cache::WordCache;
use super::unicode::utf8_len;
use super::vocab::Vocab;
use crate::{Error, Result};

/// No neighbour.
const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge of `left` with its right neighbour into a token of
/// `score`, valid while the two still measure `size` bytes together.
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost (scores compare
    /// as floats, so -0 ties with +0 as in the reference).
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.partial_cmp(&o.score).unwrap_or(Ordering::Equal).then(o.left.cmp(&self.left))
    }
}

/// Reusable buffers for one encode call.
#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
    cache: WordCache,
}

/// What SentencePiece encoding needs beside the vocabulary.
pub(crate) struct SpmModel {
    /// The byte-fallback token of each byte: `<0xXX>`, else the one-byte text.
    byte_ids: [Option<u32>; 256],
    /// Characters that some token contains right before a `▁` (sorted).
    joins_space: Vec<char>,
}

impl SpmModel {
    pub fn new(vocab: &Vocab) -> SpmModel {
        let byte_ids =
            std::array::from_fn(|b| vocab.find(format!("<0x{b:02X}>").as_bytes()).or_else(|| vocab.find(&[b as u8])));
        let mut joins_space = Vec::new();
        for id in 0..vocab.len() as u32 {
            let text = String::from_utf8_lossy(vocab.text(id));
            let mut prev = None;
            for c in text.chars() {
                if c == '▁' {
                    joins_space.extend(prev);
                }
                prev = Some(c);
            }
        }
        joins_space.sort_unstable();
        joins_space.dedup();
        SpmModel { byte_ids, joins_space }
    }

    /// Append the tokens of `text`, whose spaces are already escaped as `▁`.
    pub fn encode(&self, vocab: &Vocab, text: &str, scratch: &mut Scratch, out: &mut Vec<u32>) -> Result<()> {
        let mut start = 0;
        let mut prev: Option<char> = None;
        for (i, c) in text.char_indices() {
            if c == '▁' && i > start && prev.is_some_and(|p| self.joins_space.binary_search(&p).is_err()) {
                self.encode_cached(vocab, &text.as_bytes()[start..i], scratch, out)?;
                start = i;
            }
            prev = Some(c);
        }
        self.encode_cached(vocab, &text.as_bytes()[start..], scratch, out)
    }

    fn encode_cached(&self, vocab: &Vocab, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) -> Result<()> {
        if scratch.cache.lookup(piece, out) {
            return Ok(());
        }
        let start = out.len();
        encode_piece(vocab, &self.byte_ids, piece, scratch, out)?;
        scratch.cache.insert(piece, &out[start..]);
        Ok(())
    }
}

/// llama.cpp's SentencePiece merge loop over one piece of text.
fn encode_piece(
    vocab: &Vocab,
    byte_ids: &[Option<u32>; 256],
    text: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u32>,
) -> Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    let syms = &mut scratch.syms;
    syms.clear();
    let mut offs = 0;
    while offs < text.len() {
        let n = utf8_len(text[offs]).min(text.len() - offs);
        let i = syms.len() as u32;
        offs += n;
        syms.push(Sym { start: (offs - n) as u32, len: n as u32, prev: i.wrapping_sub(1), next: i + 1 });
    }
    if let Some(last) = syms.last_mut() {
        last.next = NONE;
    }

    let heap = &mut scratch.heap;
    heap.clear();
    for i in 1..syms.len() as u32 {
        try_add_bigram(vocab, text, syms, heap, i - 1, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (syms[b.left as usize], syms[b.right as usize]);
        // Skip pairs one of whose symbols has merged since.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        syms[b.left as usize].len += r.len;
        syms[b.right as usize].len = 0;
        syms[b.left as usize].next = r.next;
        if r.next != NONE {
            syms[r.next as usize].prev = b.left;
        }
        if l.prev != NONE {
            try_add_bigram(vocab, text, syms, heap, l.prev, b.left);
        }
        if r.next != NONE {
            try_add_bigram(vocab, text, syms, heap, b.left, r.next);
        }
    }

    let mut i = 0;
    while i != NONE {
        let s = syms[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match vocab.find(piece) {
            Some(id) => out.push(id),
            None => {
                for &byte in piece {
                    let id = byte_ids[byte as usize]
                        .ok_or_else(|| Error::Tokenizer(format!("no byte-fallback token for byte 0x{byte:02X}")))?;
                    out.push(id);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}

fn try_add_bigram(vocab: &Vocab, text: &[u8], syms: &[Sym], heap: &mut BinaryHeap<Bigram>, left: u32, right: u32) {
    let (l, r) = (syms[left as usize], syms[right as usize]);
    let size = l.len + r.len;
    let joined = &text[l.start as usize..(l.start + size) as usize];
    if let Some(id) = vocab.find(joined) {
        heap.push(Bigram { score: vocab.scores[id as usize], left, right, size });
    }
}
