//! The pattern syntax of llama.cpp's split regexes, parsed into a tree:
//! exactly the subset they use (alternation, groups, lookahead, bracket
//! classes, `\s \S \d \p{..}`, `$`, greedy `? * + {n,m}`); anything else
//! is an error, so a pattern is never silently read differently.
//!
//! Classes are sets of *symbols* ([`super::regex::Mode`]): a `\p{..}` is
//! its category's stand-in byte plus the ASCII members llama.cpp's rewrite
//! keeps, `\s` is ASCII whitespace (what libstdc++'s `\s` matches; other
//! whitespace is already `\v` in the symbols).

use super::regex::Mode;

/// A `\p{..}` name, its stand-in byte and the ASCII ranges it keeps.
type CategoryClass = (&'static str, u32, &'static [(u32, u32)]);

/// The `\p{..}` names llama.cpp collapses (the letter subclasses all become
/// "letter"), with the ASCII members its rewritten class keeps.
const CATEGORIES: &[CategoryClass] = &[
    ("N", 0xD1, &[(0x30, 0x39)]),
    ("L", 0xD2, &[(0x41, 0x5A), (0x61, 0x7A)]),
    ("Lu", 0xD2, &[(0x41, 0x5A), (0x61, 0x7A)]),
    ("Ll", 0xD2, &[(0x41, 0x5A), (0x61, 0x7A)]),
    ("Lt", 0xD2, &[(0x41, 0x5A), (0x61, 0x7A)]),
    ("Lm", 0xD2, &[(0x41, 0x5A), (0x61, 0x7A)]),
    ("Lo", 0xD2, &[(0x41, 0x5A), (0x61, 0x7A)]),
    (
        "P",
        0xD3,
        &[
            (0x21, 0x23),
            (0x25, 0x2A),
            (0x2C, 0x2F),
            (0x3A, 0x3B),
            (0x3F, 0x40),
            (0x5B, 0x5D),
            (0x5F, 0x5F),
            (0x7B, 0x7B),
            (0x7D, 0x7D),
        ],
    ),
    ("M", 0xD4, &[]),
    ("S", 0xD5, &[(0x24, 0x24), (0x2B, 0x2B), (0x3C, 0x3E), (0x5E, 0x5E), (0x60, 0x60), (0x7C, 0x7C), (0x7E, 0x7E)]),
];

const SPACE: &[(u32, u32)] = &[(0x09, 0x0D), (0x20, 0x20)];
const DIGIT: &[(u32, u32)] = &[(0x30, 0x39)];

/// Whether the pattern names a category llama.cpp collapses (then the
/// whole pattern runs on collapsed symbols).
pub(super) fn mode_of(pattern: &str) -> Mode {
    let collapsed = CATEGORIES.iter().any(|(name, _, _)| pattern.contains(&format!("\\p{{{name}}}")));
    if collapsed {
        Mode::Collapsed
    } else {
        Mode::Wide
    }
}

/// A set of symbols.
#[derive(Clone, Debug)]
pub(super) struct Class {
    pub ranges: Vec<(u32, u32)>,
    pub negate: bool,
}

impl Class {
    #[inline]
    pub fn contains(&self, s: u32) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= s && s <= hi) != self.negate
    }
}

#[derive(Clone, Debug)]
pub(super) enum Ast {
    Class(Class),
    Seq(Vec<Ast>),
    Alt(Vec<Ast>),
    /// Greedy `x{min,max}` (`max` None: unbounded).
    Rep(Box<Ast>, u32, Option<u32>),
    /// `(?=x)` or, negated, `(?!x)`.
    Look(Box<Ast>, bool),
    /// `$`: the end of the piece being split.
    End,
}

impl Ast {
    pub fn nullable(&self) -> bool {
        match self {
            Ast::Class(_) => false,
            Ast::Seq(xs) => xs.iter().all(Ast::nullable),
            Ast::Alt(xs) => xs.iter().any(Ast::nullable),
            Ast::Rep(x, min, _) => *min == 0 || x.nullable(),
            Ast::Look(..) | Ast::End => true,
        }
    }
}

/// Recursive-descent parser over the pattern's code points.
pub(super) struct Parser {
    pub p: Vec<char>,
    pub i: usize,
    pub mode: Mode,
}

pub(super) type Parsed<T> = Result<T, String>;

impl Parser {
    fn peek(&self) -> Option<char> {
        self.p.get(self.i).copied()
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    pub fn err<T>(&self, what: &str) -> Parsed<T> {
        Err(format!("{what} at {} in {:?}", self.i, self.p.iter().collect::<String>()))
    }

    pub fn alt(&mut self) -> Parsed<Ast> {
        let mut alts = vec![self.seq()?];
        while self.eat('|') {
            alts.push(self.seq()?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or(Ast::Seq(Vec::new())) } else { Ast::Alt(alts) })
    }

    fn seq(&mut self) -> Parsed<Ast> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(Ast::Seq(items))
    }

    fn atom(&mut self) -> Parsed<Ast> {
        let Some(c) = self.peek() else { return self.err("unexpected end") };
        self.i += 1;
        match c {
            '(' => {
                let look = if self.eat('?') {
                    if self.eat(':') {
                        None
                    } else if self.eat('=') {
                        Some(false)
                    } else if self.eat('!') {
                        Some(true)
                    } else {
                        return self.err("unsupported group");
                    }
                } else {
                    None
                };
                let inner = self.alt()?;
                if !self.eat(')') {
                    return self.err("unclosed group");
                }
                Ok(match look {
                    Some(negate) => Ast::Look(Box::new(inner), negate),
                    None => inner,
                })
            }
            '[' => self.class(),
            '$' => Ok(Ast::End),
            '\\' => {
                let (ranges, negate) = self.escape()?;
                Ok(Ast::Class(Class { ranges, negate }))
            }
            '*' | '+' | '?' | '{' | ')' | ']' | '^' | '.' => self.err("unsupported syntax"),
            c => Ok(Ast::Class(Class { ranges: vec![self.literal(c)?], negate: false })),
        }
    }

    fn literal(&self, c: char) -> Parsed<(u32, u32)> {
        if self.mode == Mode::Collapsed && !c.is_ascii() {
            // llama.cpp refuses these too: the text has no such code points.
            return self.err("non-ASCII literal in a pattern with categories");
        }
        Ok((c as u32, c as u32))
    }

    /// After a backslash: the ranges of the class it names and whether it
    /// is negated (`\S`).
    fn escape(&mut self) -> Parsed<(Vec<(u32, u32)>, bool)> {
        let Some(c) = self.peek() else { return self.err("dangling backslash") };
        self.i += 1;
        Ok(match c {
            's' => (SPACE.to_vec(), false),
            'S' => (SPACE.to_vec(), true),
            'd' => (DIGIT.to_vec(), false),
            'r' => (vec![(0x0D, 0x0D)], false),
            'n' => (vec![(0x0A, 0x0A)], false),
            't' => (vec![(0x09, 0x09)], false),
            'p' => {
                if !self.eat('{') {
                    return self.err("expected {");
                }
                let start = self.i;
                while self.peek().is_some_and(|c| c != '}') {
                    self.i += 1;
                }
                let name: String = self.p[start..self.i].iter().collect();
                if !self.eat('}') {
                    return self.err("unclosed \\p{");
                }
                let Some(&(_, byte, ascii)) = CATEGORIES.iter().find(|(n, _, _)| *n == name) else {
                    return self.err("unknown category");
                };
                let mut r = ascii.to_vec();
                r.push((byte, byte));
                (r, false)
            }
            c if c.is_ascii_punctuation() => (vec![(c as u32, c as u32)], false),
            _ => return self.err("unsupported escape"),
        })
    }

    /// After `[`: a bracket class.
    fn class(&mut self) -> Parsed<Ast> {
        let negate = self.eat('^');
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let Some(c) = self.peek() else { return self.err("unclosed class") };
            if c == ']' && !first {
                self.i += 1;
                break;
            }
            first = false;
            self.i += 1;
            let lo = if c == '\\' {
                let (r, neg) = self.escape()?;
                match (r.as_slice(), neg) {
                    ([(a, b)], false) if a == b => *a,
                    (_, false) => {
                        ranges.extend(r);
                        continue;
                    }
                    (_, true) => return self.err("negated escape inside a class"),
                }
            } else {
                self.literal(c)?.0
            };
            // A range `lo-hi`, unless the '-' closes the class.
            if self.peek() == Some('-') && self.p.get(self.i + 1).is_some_and(|&c| c != ']') {
                self.i += 1;
                let c = self.p[self.i];
                self.i += 1;
                let hi = if c == '\\' {
                    match self.escape()? {
                        (r, false) if r.len() == 1 && r[0].0 == r[0].1 => r[0].0,
                        _ => return self.err("class as a range end"),
                    }
                } else {
                    self.literal(c)?.0
                };
                if hi < lo {
                    return self.err("reversed range");
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Ast::Class(Class { ranges, negate }))
    }

    fn number(&mut self) -> Parsed<u32> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let s: String = self.p[start..self.i].iter().collect();
        s.parse().or_else(|_| self.err("expected a number"))
    }

    fn quantified(&mut self, atom: Ast) -> Parsed<Ast> {
        let (min, max) = match self.peek() {
            Some('?') => (0, Some(1)),
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('{') => {
                self.i += 1;
                let min = self.number()?;
                let max = if self.eat(',') {
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number()?)
                    }
                } else {
                    Some(min)
                };
                if self.peek() != Some('}') || max.is_some_and(|m| m < min) {
                    return self.err("bad repetition");
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.i += 1;
        if matches!(self.peek(), Some('?' | '+')) {
            return self.err("lazy or possessive quantifier");
        }
        if max.is_none() && atom.nullable() {
            return self.err("unbounded repetition of something that can match empty");
        }
        Ok(Ast::Rep(Box::new(atom), min, max))
    }
}
