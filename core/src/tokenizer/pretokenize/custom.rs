//! The splitters llama.cpp writes by hand instead of running its regex
//! (`unicode.cpp`'s `unicode_regex_split_custom_*`), followed step by step,
//! quirks included, because those — not the regexes — define the reference
//! ids. They walk the UTF-8 bytes directly and only append `(start, end)`
//! byte ranges to a caller's vector: no allocation per character or word.

use super::super::unicode::{decode_at, flags, Flags};

/// Positions are byte offsets into one piece; out of range reads as
/// "outside" (no code point, no flags), as llama.cpp's `_get_cpt`/`_get_flags`.
#[derive(Clone, Copy)]
pub(super) struct Cursor<'a> {
    pub s: &'a [u8],
    pub base: usize,
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

pub(super) fn split_gpt2(s: Cursor, out: &mut Vec<(usize, usize)>) {
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
pub(super) enum Family {
    Llama3,
    Qwen2,
    Qwen35,
}

pub(super) fn split_llama3_family(s: Cursor, family: Family, out: &mut Vec<(usize, usize)>) {
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

/// `unicode_cpt_is_han`: the CJK ideograph blocks Kimi-K2 keeps apart from
/// other letters.
fn is_han(cp: u32) -> bool {
    matches!(
        cp,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B820..=0x2CEAF
            | 0x2CEB0..=0x2EBEF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// Kimi-K2: Han runs, then letter words (non-Han) with an optional leading
/// symbol and trailing contraction, then Llama 3's digits, punctuation and
/// whitespace rules.
pub(super) fn split_kimi_k2(s: Cursor, out: &mut Vec<(usize, usize)>) {
    let mut w = Words { out, prev_end: 0, base: s.base };
    let letter = |p: usize| s.flags(p).is_letter() && !is_han(s.at(p).0);
    let mut pos = 0;
    while pos < s.len() {
        let (cpt, next) = s.at(pos);
        let f = s.flags(pos);
        // [\p{Han}]+
        if is_han(cpt) {
            while is_han(s.at(pos).0) {
                pos = s.next(pos);
            }
            w.add(pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?[letters, no Han]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
        let lead = !(cpt == '\r' as u32 || cpt == '\n' as u32 || f.is_letter() || f.is_number());
        if letter(pos) || (lead && letter(next)) {
            pos = if lead { next } else { pos };
            while letter(pos) {
                pos = s.next(pos);
            }
            if s.at(pos).0 == '\'' as u32 {
                if let Some(end) = contraction(s, pos, true) {
                    pos = end;
                }
            }
            w.add(pos);
            continue;
        }
        // \p{N}{1,3}
        if f.is_number() {
            let mut run = 0;
            while s.flags(pos).is_number() {
                pos = s.next(pos);
                run += 1;
                if run == 3 {
                    w.add(pos);
                    run = 0;
                }
            }
            w.add(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number() || f.is_outside());
        let space = cpt == ' ' as u32;
        if other(if space { s.flags(next) } else { f }) {
            if space {
                pos = next;
            }
            while other(s.flags(pos)) {
                pos = s.next(pos);
            }
            while matches!(s.at(pos).0, 0x0A | 0x0D) {
                pos = s.next(pos);
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

/// AFMoE's digit rule (also llama.cpp's stand-in for Tiny Aya's
/// `\d{1,3}(?=(?:\d{3})*\b)`): a run of numbers splits into a leading group
/// of `len % 3` and then threes. Quirk kept: the text before a run joins its
/// first group, and the text after the last run is one piece.
pub(super) fn split_digit_groups(s: Cursor, out: &mut Vec<(usize, usize)>) {
    let mut w = Words { out, prev_end: 0, base: s.base };
    let mut pos = 0;
    while pos < s.len() {
        if !s.flags(pos).is_number() {
            pos = s.next(pos);
            continue;
        }
        let mut end = pos;
        let mut count = 0;
        while s.flags(end).is_number() {
            end = s.next(end);
            count += 1;
        }
        let lead = count % 3;
        let mut k = 0;
        while pos < end {
            pos = s.next(pos);
            k += 1;
            if k >= lead && (k - lead) % 3 == 0 {
                w.add(pos);
            }
        }
    }
    w.add(s.len());
}

/// `[^\n]+|[\n]+`: runs of newlines and runs of everything else.
pub(super) fn split_newlines(s: Cursor, out: &mut Vec<(usize, usize)>) {
    let mut w = Words { out, prev_end: 0, base: s.base };
    let mut pos = 0;
    while pos < s.len() {
        let newline = s.s[pos] == b'\n';
        while pos < s.len() && (s.s[pos] == b'\n') == newline {
            pos += 1;
        }
        w.add(pos);
    }
}
