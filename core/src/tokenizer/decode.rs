//! From tokens back to text: per-token pieces, whole-sequence detokenizing,
//! and the streaming decoder generation uses.

use super::unicode::char_to_byte;
use super::vocab::{attr, Vocab};
use super::Tokenizer;

/// Control and unknown tokens print nothing unless special tokens are shown.
const HIDDEN: u16 = attr::CONTROL | attr::UNKNOWN;

/// Which leading space decoding removes at the start of a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstSpace {
    /// None (byte-level BPE, SentencePiece without a prefix space).
    Keep,
    /// The first token's: the space SentencePiece's prefix added (as
    /// llama.cpp: a BOS in front uses the rule up).
    FirstToken,
    /// The first visible piece's: WordPiece's word-start marker (llama.cpp
    /// keeps it; Hugging Face's decoder, which joins words with spaces, does
    /// not).
    FirstVisible,
}

impl FirstSpace {
    /// `piece` with the rule applied; `pending` stays true until it is spent.
    fn apply<'p>(self, pending: &mut bool, piece: &'p [u8]) -> &'p [u8] {
        if !*pending || (self == FirstSpace::FirstVisible && piece.is_empty()) {
            return piece;
        }
        *pending = false;
        piece.strip_prefix(b" ").unwrap_or(piece)
    }
}

/// Every token's piece (llama.cpp's `token_to_piece` with special tokens
/// shown), in one arena.
pub(crate) struct Pieces {
    arena: Vec<u8>,
    ends: Vec<u32>,
}

impl Pieces {
    pub fn new(vocab: &Vocab, byte_level: bool) -> Pieces {
        let mut arena = Vec::new();
        let mut ends = Vec::with_capacity(vocab.len());
        for id in 0..vocab.len() as u32 {
            piece_of(vocab, id, byte_level, &mut arena);
            ends.push(arena.len() as u32);
        }
        Pieces { arena, ends }
    }

    pub fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match self.ends.get(i) {
            None => &[],
            Some(&end) => &self.arena[if i == 0 { 0 } else { self.ends[i - 1] as usize }..end as usize],
        }
    }
}

fn piece_of(vocab: &Vocab, id: u32, byte_level: bool, out: &mut Vec<u8>) {
    let a = vocab.attr(id);
    let text = vocab.text(id);
    if a & (HIDDEN | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text);
    } else if a & attr::NORMAL != 0 {
        if byte_level {
            decode_byte_level(text, out);
        } else {
            // SentencePiece: '▁' stands for a space.
            let mut rest = text;
            while let Some(p) = rest.windows(3).position(|w| w == "▁".as_bytes()) {
                out.extend_from_slice(&rest[..p]);
                out.push(b' ');
                rest = &rest[p + 3..];
            }
            out.extend_from_slice(rest);
        }
    } else if a & attr::BYTE != 0 {
        // "<0xAB>": the byte it stands for (llama.cpp's strtol yields 0 on junk).
        let hex = text.get(3..5).and_then(|h| std::str::from_utf8(h).ok());
        out.push(hex.and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0));
    }
}

/// GPT-2 byte-level text back to bytes; characters outside the byte alphabet
/// are written as llama.cpp does (`[UNK_BYTE_0x..<text>]`).
fn decode_byte_level(text: &[u8], out: &mut Vec<u8>) {
    let s = String::from_utf8_lossy(text);
    for c in s.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
}

impl Tokenizer {
    /// The piece of `id` for decoding: empty for hidden tokens.
    pub fn visible_piece(&self, id: u32, show_special: bool) -> &[u8] {
        if !show_special && self.vocab.has_attr(id, HIDDEN) {
            return &[];
        }
        self.pieces.get(id)
    }
}

/// llama.cpp's `llama_detokenize` (special tokens not removed).
pub(crate) fn detokenize(tok: &Tokenizer, ids: &[u32], show_special: bool) -> Vec<u8> {
    let mut text = Vec::new();
    let mut pending = tok.first_space != FirstSpace::Keep;
    for &id in ids {
        let piece = tok.visible_piece(id, show_special);
        text.extend_from_slice(tok.first_space.apply(&mut pending, piece));
    }
    if tok.clean_spaces {
        clean_up_spaces(&mut text);
    }
    text
}

/// GPT-2's `clean_up_tokenization_spaces`, as llama.cpp's three passes: drop
/// the space before `? ! . ,`, around a lone `'`, and before `'s 'm 're 've`.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // 1. " ?", " !", " .", " ,"
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // 2. " ' " -> "'"
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // 3. " 's", " 'm", " 're", " 've"
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Turns generated tokens into text as they arrive: each [`push`] returns
/// only complete UTF-8, holding back the start of a character split across
/// tokens (byte-fallback tokens, or byte-level BPE pieces of one emoji).
/// Control tokens print nothing unless `show_special`.
///
/// [`push`]: StreamDecoder::push
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    show_special: bool,
    /// Strip one leading space from the next piece.
    strip_space: bool,
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// For text that continues a prompt: every piece is kept as is (a
    /// generated "▁Paris" prints " Paris"), as llama.cpp prints generations.
    pub fn new(tok: &'t Tokenizer, show_special: bool) -> Self {
        StreamDecoder { tok, show_special, strip_space: false, pending: Vec::new() }
    }

    /// For a sequence that starts the text: the first token loses the space
    /// a SentencePiece prefix added (the first word WordPiece's marker), so
    /// the stream reads exactly as [`Tokenizer::decode`] (less the space
    /// clean-up of GPT-2 and BERT).
    pub fn at_text_start(tok: &'t Tokenizer, show_special: bool) -> Self {
        StreamDecoder { strip_space: tok.first_space != FirstSpace::Keep, ..Self::new(tok, show_special) }
    }

    /// Add one token; returns the text it completes (often empty or one piece).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tok.visible_piece(id, self.show_special);
        let piece = self.tok.first_space.apply(&mut self.strip_space, piece);
        self.pending.extend_from_slice(piece);
        self.take_complete()
    }

    /// Add raw bytes (text a token produced in part; see `structured`'s markers).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.take_complete()
    }

    /// The rest at the end of generation: an unfinished character becomes U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Bytes that can never start a character: replace them.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + bad;
                        }
                        // A character still incomplete: keep it for later.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_up_matches_reference_passes() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(clean("it 's I 'm we 're you 've don 't I 'd we 'll"), "it's I'm we're you've don 't I 'd we 'll");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }
}
