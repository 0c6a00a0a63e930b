//! Pre-tokenizers: split text into the words BPE merges within.
//!
//! Each model family's split regex is written out by hand, following
//! llama.cpp's hand-written matchers (`unicode.cpp`) step by step, quirks
//! included, because those — not the regexes — define the reference ids. They
//! walk the UTF-8 bytes directly and only append `(start, end)` byte ranges to
//! a caller's vector: no allocation per character or per word.

use super::unicode::{decode_at, flags, Category, Flags};

/// The split rules of a BPE vocabulary, chosen by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// As Llama 3 with single digits: `\p{N}` instead of `\p{N}{1,3}`.
    Qwen2,
    /// As Qwen2 with combining marks inside words: `[\p{L}\p{M}]+`.
    Qwen35,
    /// llama.cpp's fallback: punctuation runs, then GPT-2, then digit runs,
    /// then groups of three ASCII digits.
    Default,
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
    /// Text is NFC-normalized first (Hugging Face's Qwen2 tokenizer has an
    /// NFC normalizer; llama.cpp skips it, so it differs on decomposed text).
    pub nfc: bool,
}

/// `(names, pre-tokenizer, ignore_merges, clean_spaces, add_bos)`, as llama.cpp
/// maps them (`llama-vocab.cpp`, `load`).
type PreEntry = (&'static [&'static str], PreTokenizer, bool, bool, bool);
const PRE_NAMES: &[PreEntry] = &[
    (&["default"], PreTokenizer::Default, false, true, false),
    (
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
        PreTokenizer::Llama3,
        true,
        true,
        true,
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "mpt",
            "olmo",
        ],
        PreTokenizer::Gpt2,
        false,
        true,
        false,
    ),
    (&["trillion", "granite-docling"], PreTokenizer::Gpt2, false, false, false),
    (
        &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"],
        PreTokenizer::Qwen2,
        false,
        false,
        false,
    ),
    (&["stablelm2"], PreTokenizer::Qwen2, false, true, false),
    (&["qwen35"], PreTokenizer::Qwen35, false, false, false),
];

impl PreConfig {
    /// The configuration for a pre-tokenizer name; `None` when unknown.
    pub fn from_name(name: &str) -> Option<PreConfig> {
        let nfc = matches!(name, "qwen2" | "deepseek-r1-qwen");
        PRE_NAMES.iter().find(|e| e.0.contains(&name)).map(|&(_, pre, ignore_merges, clean_spaces, add_bos)| {
            PreConfig { pre, ignore_merges, clean_spaces, add_bos, nfc }
        })
    }
}

impl PreTokenizer {
    /// Append the words of `text` to `out` as byte ranges (offset by `base`).
    pub fn split(self, text: &str, base: usize, out: &mut Vec<(usize, usize)>) {
        let s = Cursor { s: text.as_bytes(), base };
        match self {
            PreTokenizer::Gpt2 => split_gpt2(s, out),
            PreTokenizer::Llama3 => split_llama3_family(s, Family::Llama3, out),
            PreTokenizer::Qwen2 => split_llama3_family(s, Family::Qwen2, out),
            PreTokenizer::Qwen35 => split_llama3_family(s, Family::Qwen35, out),
            PreTokenizer::Default => split_default(text, base, out),
        }
    }
}

/// Positions are byte offsets into one fragment; out of range reads as
/// "outside" (no code point, no flags), as llama.cpp's `_get_cpt`/`_get_flags`.
#[derive(Clone, Copy)]
struct Cursor<'a> {
    s: &'a [u8],
    base: usize,
}

const NONE: u32 = u32::MAX;

impl Cursor<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.s.len()
    }
    /// Code point at `i` (NONE outside) and the offset of the next one.
    #[inline]
    fn at(&self, i: usize) -> (u32, usize) {
        if i < self.s.len() {
            let (cp, n) = decode_at(self.s, i);
            (cp, i + n)
        } else {
            (NONE, i)
        }
    }
    #[inline]
    fn flags(&self, i: usize) -> Flags {
        if i < self.s.len() {
            flags(decode_at(self.s, i).0)
        } else {
            Flags::OUTSIDE
        }
    }
    #[inline]
    fn next(&self, i: usize) -> usize {
        self.at(i).1
    }
}

/// Emits words: each call closes the word that started where the last ended.
struct Words<'o> {
    out: &'o mut Vec<(usize, usize)>,
    prev_end: usize,
    base: usize,
}

impl Words<'_> {
    #[inline]
    fn add(&mut self, end: usize) {
        if end > self.prev_end {
            self.out.push((self.base + self.prev_end, self.base + end));
        }
        self.prev_end = end;
    }
}

/// `'s 't 'm 'd 're 've 'll` at `pos` (which holds `'`): the end of the
/// contraction, if any. `fold` makes the letters case-insensitive.
#[inline]
fn contraction(s: Cursor, pos: usize, fold: bool) -> Option<usize> {
    let (_, p1) = s.at(pos);
    if p1 >= s.len() {
        return None;
    }
    let lower = |c: u32| if fold && (b'A' as u32..=b'Z' as u32).contains(&c) { c + 32 } else { c };
    let (c1, p2) = s.at(p1);
    let c1 = lower(c1);
    if [b's', b't', b'm', b'd'].iter().any(|&b| c1 == b as u32) {
        return Some(p2);
    }
    if p2 < s.len() {
        let (c2, p3) = s.at(p2);
        let c2 = lower(c2);
        let pair = |a: u8, b: u8| c1 == a as u32 && c2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return Some(p3);
        }
    }
    None
}

/// A run of whitespace code points.
#[derive(Clone, Copy)]
struct Run {
    /// End of the run.
    end: usize,
    /// Start of its last code point.
    last_start: usize,
    /// End of its last `\r`/`\n`, if any.
    newline_end: Option<usize>,
    /// Number of code points.
    count: usize,
}

impl Run {
    /// Where a piece at the run's start ends, the text being `len` bytes and
    /// the code point there ending at `next`: `\s+(?!\S)` leaves the last
    /// whitespace to the next word, `\s+` takes a run that ends the text,
    /// and no run at all is one code point.
    fn piece_end(self, len: usize, next: usize) -> usize {
        if self.count > 1 && self.end < len {
            self.last_start
        } else if self.count > 0 {
            self.end
        } else {
            next
        }
    }
}

/// The whitespace run at `pos` (empty if there is none).
#[inline]
fn whitespace_run(s: Cursor, pos: usize) -> Run {
    let (mut p, mut last_start, mut newline_end, mut count) = (pos, pos, None, 0);
    while s.flags(p).is_whitespace() {
        let (cp, next) = s.at(p);
        if cp == '\r' as u32 || cp == '\n' as u32 {
            newline_end = Some(next);
        }
        last_start = p;
        p = next;
        count += 1;
    }
    Run { end: p, last_start, newline_end, count }
}

fn split_gpt2(s: Cursor, out: &mut Vec<(usize, usize)>) {
    let mut w = Words { out, prev_end: 0, base: s.base };
    let mut pos = 0;
    while pos < s.len() {
        let (cpt, next) = s.at(pos);
        let f = s.flags(pos);
        // 's|'t|'re|'ve|'m|'ll|'d
        if cpt == '\'' as u32 {
            if let Some(end) = contraction(s, pos, false) {
                w.add(end);
                pos = end;
                continue;
            }
        }
        let space = cpt == ' ' as u32;
        let mut f2 = if space { s.flags(next) } else { f };
        // ' ?\p{L}+', ' ?\p{N}+' and ' ?[^\s\p{L}\p{N}]+'
        let classes: [fn(Flags) -> bool; 3] = [Flags::is_letter, Flags::is_number, |f| {
            !(f.is_whitespace() || f.is_letter() || f.is_number() || f.is_outside())
        }];
        if let Some(class) = classes.iter().find(|c| c(f2)) {
            if space {
                pos = next;
            }
            while class(f2) {
                pos = s.next(pos);
                f2 = s.flags(pos);
            }
            w.add(pos);
            continue;
        }
        // \s+(?!\S) | \s+ | any one character
        pos = whitespace_run(s, pos).piece_end(s.len(), next);
        w.add(pos);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama3,
    Qwen2,
    Qwen35,
}

fn split_llama3_family(s: Cursor, family: Family, out: &mut Vec<(usize, usize)>) {
    let marks = family == Family::Qwen35;
    let in_word = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let mut w = Words { out, prev_end: 0, base: s.base };
    let mut pos = 0;
    while pos < s.len() {
        let (cpt, next) = s.at(pos);
        let f = s.flags(pos);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if cpt == '\'' as u32 {
            if let Some(end) = contraction(s, pos, true) {
                w.add(end);
                pos = end;
                continue;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+   (Qwen3.5: [\p{L}\p{M}]+)
        if !(cpt == '\r' as u32 || cpt == '\n' as u32 || f.is_number()) && (in_word(f) || in_word(s.flags(next))) {
            pos = next;
            while in_word(s.flags(pos)) {
                pos = s.next(pos);
            }
            w.add(pos);
            continue;
        }
        // \p{N}{1,3} (Llama 3) or \p{N}
        if f.is_number() {
            if family == Family::Llama3 {
                let mut run = 0;
                while s.flags(pos).is_number() {
                    pos = s.next(pos);
                    run += 1;
                    if run == 3 {
                        w.add(pos);
                        run = 0;
                    }
                }
            } else {
                pos = next;
            }
            w.add(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'   (Qwen3.5 also excludes \p{M})
        let other = |f: Flags| !(f.is_whitespace() || in_word(f) || f.is_number());
        let space = cpt == ' ' as u32;
        let mut f2 = if space { s.flags(next) } else { f };
        if other(f2) && !f.is_outside() {
            if space {
                pos = next;
            }
            while other(f2) && !f2.is_outside() {
                pos = s.next(pos);
                f2 = s.flags(pos);
            }
            loop {
                let (c, n) = s.at(pos);
                if c != '\r' as u32 && c != '\n' as u32 {
                    break;
                }
                pos = n;
            }
            w.add(pos);
            continue;
        }
        // \s*[\r\n]+ | \s+(?!\S) | \s+ | any one character
        let run = whitespace_run(s, pos);
        pos = run.newline_end.unwrap_or_else(|| run.piece_end(s.len(), next));
        w.add(pos);
    }
}

/// llama.cpp's default BPE pre-tokenizer: four passes, each splitting the
/// pieces of the one before.
fn split_default(text: &str, base: usize, out: &mut Vec<(usize, usize)>) {
    let bytes = text.as_bytes();
    let mut cur = vec![(0, bytes.len())];
    let mut next = Vec::new();

    // 1. [\p{P}\$\+<=>\^~\|]+ : runs of punctuation (ASCII: every symbol but '`')
    let punct = |cp: u32| {
        if cp < 128 {
            (cp as u8).is_ascii_punctuation() && cp != '`' as u32
        } else {
            let f = flags(cp);
            !f.is_whitespace() && f.category() == Category::Punctuation
        }
    };
    for &(a, b) in &cur {
        isolate_runs(bytes, a, b, punct, &mut next);
    }
    std::mem::swap(&mut cur, &mut next);
    next.clear();

    // 2. GPT-2's regex within each piece
    for &(a, b) in &cur {
        split_gpt2(Cursor { s: &bytes[a..b], base: a }, &mut next);
    }
    std::mem::swap(&mut cur, &mut next);
    next.clear();

    // 3. \p{N}+ : runs of numbers
    let number = |cp: u32| {
        if cp < 128 {
            (cp as u8).is_ascii_digit()
        } else {
            let f = flags(cp);
            !f.is_whitespace() && f.category() == Category::Number
        }
    };
    for &(a, b) in &cur {
        isolate_runs(bytes, a, b, number, &mut next);
    }
    std::mem::swap(&mut cur, &mut next);
    next.clear();

    // 4. [0-9][0-9][0-9] : groups of three ASCII digits, left to right
    for &(a, b) in &cur {
        let mut start = a;
        let mut i = a;
        while i + 3 <= b {
            if bytes[i..i + 3].iter().all(u8::is_ascii_digit) {
                if i > start {
                    next.push((start, i));
                }
                next.push((i, i + 3));
                i += 3;
                start = i;
            } else {
                i += 1;
            }
        }
        if b > start {
            next.push((start, b));
        }
    }
    out.extend(next.iter().map(|&(a, b)| (a + base, b + base)));
}

/// Split `bytes[a..b]` into maximal runs of code points in `class` and the
/// gaps between them.
fn isolate_runs(bytes: &[u8], a: usize, b: usize, class: impl Fn(u32) -> bool, out: &mut Vec<(usize, usize)>) {
    let mut start = a;
    let mut i = a;
    let mut in_run = false;
    while i < b {
        let (cp, n) = decode_at(bytes, i);
        let c = class(cp);
        if c != in_run && i > start {
            out.push((start, i));
            start = i;
        }
        in_run = c;
        i += n;
    }
    if b > start {
        out.push((start, b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(text, 0, &mut out);
        out.iter().map(|&(a, b)| &text[a..b]).collect()
    }

    #[test]
    fn qwen2_splits_like_llama_cpp() {
        let t = "Hello, y'all! How're you 😁 ?我想在apple 3333  \n\n  x";
        assert_eq!(
            words(PreTokenizer::Qwen2, t),
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
        assert_eq!(words(PreTokenizer::Llama3, "1234567 x"), ["123", "456", "7", " x"]);
    }

    #[test]
    fn qwen35_keeps_marks_in_words() {
        assert_eq!(words(PreTokenizer::Qwen35, "re\u{301}sume\u{301}"), ["re\u{301}sume\u{301}"]);
        assert_eq!(words(PreTokenizer::Qwen2, "re\u{301}sume\u{301}"), ["re", "\u{301}sume", "\u{301}"]);
    }

    #[test]
    fn gpt2_and_default() {
        assert_eq!(words(PreTokenizer::Gpt2, "I'm  here 12ab"), ["I", "'m", " ", " here", " 12", "ab"]);
        assert_eq!(words(PreTokenizer::Default, "a+=b 12345"), ["a", "+=", "b", " ", "123", "45"]);
    }

    #[test]
    fn every_byte_lands_in_one_word() {
        let t = "  a\t\n\r\n b ' 'S 's \u{85}x\u{a0}\u{3000}y !!\n";
        for pre in
            [PreTokenizer::Gpt2, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Qwen35, PreTokenizer::Default]
        {
            assert_eq!(words(pre, t).concat(), t, "{pre:?}");
        }
    }
}
