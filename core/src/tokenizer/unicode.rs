//! Code point classes as llama.cpp's pre-tokenizers see them, and the GPT-2
//! byte <-> character map.
//!
//! llama.cpp classifies each code point into one general category (letter,
//! number, mark, ...) from the Unicode 15.1 character database, plus a
//! separate `White_Space` bit. We rebuild the same table at first use from
//! `regex-syntax`'s Unicode tables (which are newer, so each category is
//! intersected with `Age <= 15.1`): code points assigned later stay
//! "undefined", exactly as in the reference.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// General category of a code point (llama.cpp's `unicode_cpt_flags`, one of).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Category {
    /// Unassigned (`Cn`), or assigned after Unicode 15.1.
    Undefined = 0,
    Number = 1,
    Letter = 2,
    Separator = 3,
    Mark = 4,
    Punctuation = 5,
    Symbol = 6,
    Control = 7,
}

const WHITESPACE_BIT: u8 = 0x08;
const CATEGORY_MASK: u8 = 0x07;

/// Category and whitespace bit of one code point, packed in a byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flags(u8);

impl Flags {
    /// The flags of a position outside the text being split: no category at
    /// all (llama.cpp's all-zero flags), so every class test fails on it.
    pub const OUTSIDE: Flags = Flags(0xF0);

    pub fn category(self) -> Category {
        match self.0 & CATEGORY_MASK {
            1 => Category::Number,
            2 => Category::Letter,
            3 => Category::Separator,
            4 => Category::Mark,
            5 => Category::Punctuation,
            6 => Category::Symbol,
            7 => Category::Control,
            _ => Category::Undefined,
        }
    }

    #[inline]
    pub fn is_outside(self) -> bool {
        self.0 == Self::OUTSIDE.0
    }
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & CATEGORY_MASK == Category::Letter as u8
    }
    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & CATEGORY_MASK == Category::Number as u8
    }
    #[inline]
    pub fn is_mark(self) -> bool {
        self.0 & CATEGORY_MASK == Category::Mark as u8
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE_BIT != 0
    }
}

/// Two-level lookup: `blocks[index[cp >> 8]][cp & 0xFF]`.
struct Table {
    index: Vec<u16>,
    blocks: Vec<u8>,
}

const N_CODEPOINTS: usize = 0x110000;

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(build_table)
}

/// The code point ranges of a regex class such as `[\p{L}&&\p{Age=15.1}]`.
fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    // The patterns are constants of this file: a parse failure is a bug here.
    let hir = regex_syntax::Parser::new().parse(pattern).expect("valid built-in Unicode class");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect(),
        _ => panic!("built-in pattern {pattern} is not a Unicode class"),
    }
}

fn build_table() -> Table {
    let mut flat = vec![Category::Undefined as u8; N_CODEPOINTS];
    let categories = [
        (Category::Number, r"\p{N}"),
        (Category::Letter, r"\p{L}"),
        (Category::Separator, r"\p{Z}"),
        (Category::Mark, r"\p{M}"),
        (Category::Punctuation, r"\p{P}"),
        (Category::Symbol, r"\p{S}"),
        (Category::Control, r"[\p{Cc}\p{Cf}\p{Co}]"),
    ];
    for (cat, class) in categories {
        for (lo, hi) in class_ranges(&format!(r"[{class}&&\p{{Age=15.1}}]")) {
            flat[lo as usize..=hi as usize].fill(cat as u8);
        }
    }
    for (lo, hi) in class_ranges(r"\p{White_Space}") {
        for f in &mut flat[lo as usize..=hi as usize] {
            *f |= WHITESPACE_BIT;
        }
    }
    // Deduplicate 256-entry blocks: most of the code space is a handful of
    // distinct blocks (unassigned, CJK, Hangul, private use).
    let mut index = Vec::with_capacity(N_CODEPOINTS >> 8);
    let mut blocks: Vec<u8> = Vec::new();
    let mut seen: std::collections::HashMap<&[u8], u16> = std::collections::HashMap::new();
    for chunk in flat.chunks(256) {
        let id = *seen.entry(chunk).or_insert_with(|| {
            blocks.extend_from_slice(chunk);
            (blocks.len() / 256 - 1) as u16
        });
        index.push(id);
    }
    Table { index, blocks }
}

/// Flags of ASCII code points, the hot path of every pre-tokenizer.
fn ascii_flags() -> &'static [Flags; 128] {
    static ASCII: OnceLock<[Flags; 128]> = OnceLock::new();
    ASCII.get_or_init(|| std::array::from_fn(|c| lookup(c as u32)))
}

fn lookup(cp: u32) -> Flags {
    let t = table();
    match t.index.get((cp >> 8) as usize) {
        Some(&b) => Flags(t.blocks[(b as usize) * 256 + (cp & 0xFF) as usize]),
        None => Flags(Category::Undefined as u8),
    }
}

/// The flags of a code point.
#[inline]
pub(crate) fn flags(cp: u32) -> Flags {
    if cp < 128 {
        ascii_flags()[cp as usize]
    } else {
        lookup(cp)
    }
}

/// Length of the UTF-8 sequence that starts with byte `b` (llama.cpp's
/// `unicode_len_utf8`: by the high nibble; continuation bytes count as 1).
#[inline]
pub(crate) fn utf8_len(b: u8) -> usize {
    const LEN: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[(b >> 4) as usize] as usize
}

/// The code point starting at byte `i` of valid UTF-8 `s`, and its length.
#[inline]
pub(crate) fn decode_at(s: &[u8], i: usize) -> (u32, usize) {
    let b0 = s[i] as u32;
    if b0 < 0x80 {
        return (b0, 1);
    }
    let cont = |k: usize| (s[i + k] & 0x3F) as u32;
    if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | cont(1), 2)
    } else if b0 < 0xF0 {
        (((b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2), 3)
    } else {
        (((b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3), 4)
    }
}

/// GPT-2's byte-level alphabet: each byte maps to one printable character.
/// Printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in order.
pub(crate) fn byte_to_char(b: u8) -> char {
    byte_char_maps().0[b as usize]
}

/// The inverse of [`byte_to_char`]: `None` for characters outside the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    byte_char_maps().1.get(c as usize).copied().flatten()
}

type ByteCharMaps = ([char; 256], Vec<Option<u8>>);

fn byte_char_maps() -> &'static ByteCharMaps {
    static MAPS: OnceLock<ByteCharMaps> = OnceLock::new();
    MAPS.get_or_init(|| {
        let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut to_char = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            to_char[b as usize] = if printable(b) {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('\0')
            };
        }
        let mut to_byte = vec![None; next as usize];
        for (b, &c) in to_char.iter().enumerate() {
            to_byte[c as usize] = Some(b as u8);
        }
        (to_char, to_byte)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_llama_cpp() {
        assert_eq!(flags('a' as u32).category(), Category::Letter);
        assert_eq!(flags('7' as u32).category(), Category::Number);
        assert_eq!(flags('!' as u32).category(), Category::Punctuation);
        assert_eq!(flags('$' as u32).category(), Category::Symbol);
        assert_eq!(flags(0x301).category(), Category::Mark);
        assert_eq!(flags(0x4E2D).category(), Category::Letter);
        assert_eq!(flags(0x1F600).category(), Category::Symbol);
        assert!(flags(' ' as u32).is_whitespace() && flags(' ' as u32).category() == Category::Separator);
        assert!(flags('\n' as u32).is_whitespace() && flags('\n' as u32).category() == Category::Control);
        assert!(flags(0x3000).is_whitespace());
        assert!(!flags(0x200B).is_whitespace()); // zero width space is Cf, not White_Space
                                                 // Assigned in Unicode 15.1 (CJK Ext. I) vs 16.0 (Cyrillic TJE): the
                                                 // reference table is 15.1.
        assert_eq!(flags(0x2EBF0).category(), Category::Letter);
        assert_eq!(flags(0x1C89).category(), Category::Undefined);
        assert!(Flags::OUTSIDE.is_outside() && !Flags::OUTSIDE.is_letter() && !Flags::OUTSIDE.is_whitespace());
    }

    #[test]
    fn byte_alphabet() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), '\u{120}');
        assert_eq!(byte_to_char(b'\n'), '\u{10A}');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('\u{4E2D}'), None);
    }
}
