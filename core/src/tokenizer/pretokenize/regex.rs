//! A small backtracking matcher for the split patterns llama.cpp hands to
//! `std::regex` (the ones it has no hand-written splitter for).
//!
//! Why not a regex crate: the reference ids come from libstdc++'s ECMAScript
//! engine run on llama.cpp's rewritten text, not from Unicode-aware regex
//! semantics. Each code point is first turned into a *symbol* exactly as
//! `unicode_regex_split` does it (see [`Mode`]), `\p{..}` becomes "that
//! category's stand-in byte or its ASCII members", `\s` is ASCII whitespace,
//! and matching is leftmost, first-alternative-wins with greedy backtracking
//! quantifiers and lookahead. The patterns are constants of this crate,
//! parsed by [`super::pattern`].
//!
//! Matching runs on an explicit stack (no recursion on the input), so a long
//! run of one class cannot overflow the call stack.

use super::super::unicode::{flags, Category};
use super::pattern::{mode_of, Ast, Class, Parser};

/// How code points become symbols before matching (llama.cpp's choice per
/// pattern: "collapsed" when the pattern names a Unicode category).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// ASCII stays; other whitespace becomes `\v`; every other code point
    /// becomes its category's stand-in byte (0xD1 number, 0xD2 letter, 0xD3
    /// punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 anything else).
    Collapsed,
    /// Code points as they are, but non-ASCII whitespace becomes `\v`
    /// (`std::wregex`'s `\s` is ASCII only).
    Wide,
}

impl Mode {
    #[inline]
    pub fn symbol(self, cp: u32) -> u32 {
        if cp < 128 {
            return cp;
        }
        let f = flags(cp);
        if f.is_whitespace() {
            return 0x0B;
        }
        match self {
            Mode::Wide => cp,
            Mode::Collapsed => match f.category() {
                Category::Number => 0xD1,
                Category::Letter => 0xD2,
                Category::Punctuation => 0xD3,
                Category::Mark => 0xD4,
                Category::Symbol => 0xD5,
                _ => 0xD0,
            },
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Inst {
    Class(u32),
    /// Try the first target, on failure the second.
    Split(u32, u32),
    Jmp(u32),
    /// Lookahead: the sub-program at `start` must (or, negated, must not)
    /// match here; then continue at the next instruction.
    Look {
        start: u32,
        negate: bool,
    },
    End,
    Match,
}

/// A compiled pattern.
#[derive(Debug)]
pub(crate) struct Regex {
    insts: Vec<Inst>,
    classes: Vec<Class>,
    pub mode: Mode,
}

impl Regex {
    pub fn new(pattern: &str) -> Result<Regex, String> {
        let mode = mode_of(pattern);
        let mut parser = Parser { p: pattern.chars().collect(), i: 0, mode };
        let ast = parser.alt()?;
        if parser.i != parser.p.len() {
            return parser.err("unbalanced )");
        }
        let mut re = Regex { insts: Vec::new(), classes: Vec::new(), mode };
        re.compile(&ast);
        re.insts.push(Inst::Match);
        Ok(re)
    }

    fn pc(&self) -> u32 {
        self.insts.len() as u32
    }

    fn compile(&mut self, ast: &Ast) {
        match ast {
            Ast::Class(c) => {
                self.classes.push(c.clone());
                self.insts.push(Inst::Class(self.classes.len() as u32 - 1));
            }
            Ast::Seq(xs) => xs.iter().for_each(|x| self.compile(x)),
            Ast::Alt(xs) => {
                let mut to_end = Vec::new();
                for (k, x) in xs.iter().enumerate() {
                    if k + 1 == xs.len() {
                        self.compile(x);
                        break;
                    }
                    let split = self.pc();
                    self.insts.push(Inst::Split(split + 1, 0));
                    self.compile(x);
                    to_end.push(self.pc());
                    self.insts.push(Inst::Jmp(0));
                    let next = self.pc();
                    self.insts[split as usize] = Inst::Split(split + 1, next);
                }
                let end = self.pc();
                for j in to_end {
                    self.insts[j as usize] = Inst::Jmp(end);
                }
            }
            Ast::Rep(x, min, max) => {
                for _ in 0..*min {
                    self.compile(x);
                }
                match max {
                    None => {
                        let top = self.pc();
                        self.insts.push(Inst::Split(top + 1, 0));
                        self.compile(x);
                        self.insts.push(Inst::Jmp(top));
                        let end = self.pc();
                        self.insts[top as usize] = Inst::Split(top + 1, end);
                    }
                    Some(max) => {
                        // x? x? ...: once one optional copy is skipped, all
                        // later ones are (one common exit).
                        let mut splits = Vec::new();
                        for _ in *min..*max {
                            splits.push(self.pc());
                            self.insts.push(Inst::Split(0, 0));
                            self.compile(x);
                        }
                        let end = self.pc();
                        for s in splits {
                            self.insts[s as usize] = Inst::Split(s + 1, end);
                        }
                    }
                }
            }
            Ast::Look(x, negate) => {
                // Look, Jmp over the body, body, Match.
                let at = self.pc();
                self.insts.push(Inst::Look { start: at + 2, negate: *negate });
                self.insts.push(Inst::Jmp(0));
                self.compile(x);
                self.insts.push(Inst::Match);
                let after = self.pc();
                self.insts[at as usize + 1] = Inst::Jmp(after);
            }
            Ast::End => self.insts.push(Inst::End),
        }
    }

    /// The end of the first match starting exactly at `start`, ECMAScript
    /// priority. `not_null` rejects an empty match (`match_not_null`).
    fn match_at(
        &self,
        syms: &[u32],
        start: usize,
        pc: u32,
        not_null: bool,
        stack: &mut Vec<(u32, usize)>,
    ) -> Option<usize> {
        let base = stack.len();
        let (mut pc, mut pos) = (pc, start);
        let result = loop {
            let ok = match self.insts[pc as usize] {
                Inst::Class(c) => {
                    let hit = syms.get(pos).is_some_and(|&s| self.classes[c as usize].contains(s));
                    if hit {
                        pos += 1;
                        pc += 1;
                    }
                    hit
                }
                Inst::Split(a, b) => {
                    stack.push((b, pos));
                    pc = a;
                    true
                }
                Inst::Jmp(a) => {
                    pc = a;
                    true
                }
                Inst::Look { start: sub, negate } => {
                    let found = self.match_at(syms, pos, sub, false, stack).is_some();
                    pc += 1;
                    found != negate
                }
                Inst::End => {
                    pc += 1;
                    pos == syms.len()
                }
                Inst::Match => {
                    if !(not_null && pos == start) {
                        break Some(pos);
                    }
                    false
                }
            };
            if !ok {
                if stack.len() == base {
                    break None;
                }
                let (p, q) = stack.pop().unwrap_or((0, 0));
                pc = p;
                pos = q;
            }
        };
        stack.truncate(base);
        result
    }

    /// Split `syms` as llama.cpp's `std::regex_iterator` loop does: every
    /// match and every gap between matches is a piece. Pushes the end of
    /// each piece (symbol indices); empty matches only mark boundaries.
    pub fn split(&self, syms: &[u32], stack: &mut Vec<(u32, usize)>, ends: &mut Vec<usize>) {
        let n = syms.len();
        let (mut from, mut last_end) = (0, 0);
        let mut not_null_at = None;
        while from <= n {
            let mut found = None;
            for p in from..=n {
                if let Some(e) = self.match_at(syms, p, 0, not_null_at == Some(p), stack) {
                    found = Some((p, e));
                    break;
                }
            }
            let Some((p, e)) = found else { break };
            if p > last_end {
                ends.push(p);
            }
            if e > p {
                ends.push(e);
                not_null_at = None;
            } else {
                not_null_at = Some(e);
            }
            last_end = e;
            from = e;
        }
        if n > last_end {
            ends.push(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pattern: &str, text: &str) -> Vec<String> {
        let re = Regex::new(pattern).unwrap();
        let cps: Vec<char> = text.chars().collect();
        let syms: Vec<u32> = cps.iter().map(|&c| re.mode.symbol(c as u32)).collect();
        let mut ends = Vec::new();
        re.split(&syms, &mut Vec::new(), &mut ends);
        let mut prev = 0;
        ends.iter()
            .map(|&e| {
                let s = cps[prev..e].iter().collect();
                prev = e;
                s
            })
            .collect()
    }

    #[test]
    fn gaps_and_matches_are_pieces() {
        assert_eq!(pieces(r"\p{N}+", "ab12c3"), ["ab", "12", "c", "3"]);
        assert_eq!(pieces("[0-9][0-9][0-9]", "12345678"), ["123", "456", "78"]);
    }

    #[test]
    fn first_alternative_wins_and_lookahead_backtracks() {
        assert_eq!(pieces(r"\s+(?!\S)|\s+", "a   b  "), ["a", "  ", " ", "b", "  "]);
        assert_eq!(pieces(r"a|ab", "ab"), ["a", "b"]);
        assert_eq!(pieces(r"\s+$", "a  b  "), ["a  b", "  "]);
    }

    #[test]
    fn empty_matches_split_digit_groups_from_the_right() {
        assert_eq!(pieces(r"(?=(\d{3})+(?!\d))", "1234567"), ["1", "234", "567"]);
        assert_eq!(pieces(r"(?=(\d{3})+(?!\d))", "123456"), ["123", "456"]);
    }

    #[test]
    fn collapsed_categories() {
        // é is a letter, ² a number, the emoji a symbol, U+3000 whitespace.
        assert_eq!(pieces(r"\p{L}+", "é²x\u{3000}😀"), ["é", "²", "x", "\u{3000}😀"]);
        assert_eq!(pieces(r"[^\s\p{L}\p{N}]+", "a😀!\u{3000}"), ["a", "😀!", "\u{3000}"]);
        assert_eq!(mode_of(r"\p{Lu}"), Mode::Collapsed);
        assert_eq!(mode_of("[一-龥]+"), Mode::Wide);
    }

    #[test]
    fn wide_ranges_compare_code_points() {
        assert_eq!(pieces("[一-龥]+", "a中文b"), ["a", "中文", "b"]);
        assert_eq!(pieces(r" ?[^(\s|.,!?…)]+", "hi, you…"), ["hi", ",", " you", "…"]);
    }

    #[test]
    fn rejects_what_it_does_not_implement() {
        for bad in ["a*?", "a++", "(?<=a)", "(a*)*", "[b-a]", "\\p{Han}", "(a", "a)", "é\\p{L}"] {
            assert!(Regex::new(bad).is_err(), "{bad}");
        }
    }
}
