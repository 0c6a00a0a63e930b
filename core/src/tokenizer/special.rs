//! Splitting special tokens out of text before tokenization.
//!
//! llama.cpp takes the special tokens longest first and, for each, splits
//! every remaining text fragment at each of its occurrences (stripping
//! whitespace beside tokens marked LSTRIP/RSTRIP). The result depends on that
//! order, so we keep it; to keep it fast on vocabularies with thousands of
//! special tokens, one trie walk over the text first finds the few tokens
//! that occur at all, and only those are split out.

use super::vocab::{attr, Vocab};

/// A piece of the input: raw text (a byte range) or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(usize, usize),
    Token(u32),
}

pub(crate) struct SpecialTokens {
    /// Control, user-defined and unknown tokens, longest text first (ties by
    /// id): the order in which they are split out.
    order: Vec<u32>,
    /// Position of each token in `order`, by id (`u32::MAX` when absent).
    rank: Vec<u32>,
    trie: Trie,
}

impl SpecialTokens {
    pub fn new(vocab: &Vocab) -> SpecialTokens {
        let special = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut order: Vec<u32> = (0..vocab.len() as u32).filter(|&id| vocab.has_attr(id, special)).collect();
        order.sort_by_key(|&id| std::cmp::Reverse(vocab.text(id).len()));
        let mut rank = vec![u32::MAX; vocab.len()];
        let mut trie = Trie::default();
        for (r, &id) in order.iter().enumerate() {
            rank[id as usize] = r as u32;
            trie.insert(vocab.text(id), id);
        }
        SpecialTokens { order, rank, trie }
    }

    /// Split `text` into fragments. Without `parse_special`, only
    /// user-defined tokens are split out (control and unknown tokens stay text).
    pub fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool, out: &mut Vec<Fragment>) {
        out.clear();
        if text.is_empty() {
            return;
        }
        let usable = |id: u32| parse_special || !vocab.has_attr(id, attr::CONTROL | attr::UNKNOWN);
        let mut present: Vec<u32> = Vec::new();
        self.trie.for_each_match(text.as_bytes(), |id| {
            if usable(id) && !present.contains(&id) {
                present.push(id);
            }
        });
        out.push(Fragment::Text(0, text.len()));
        if present.is_empty() {
            return;
        }
        present.sort_by_key(|&id| self.rank[id as usize]);

        let bytes = text.as_bytes();
        let mut next = Vec::with_capacity(out.len() + 8);
        for id in present {
            let tok = vocab.text(id);
            let (lstrip, rstrip) = (vocab.has_attr(id, attr::LSTRIP), vocab.has_attr(id, attr::RSTRIP));
            next.clear();
            for &f in out.iter() {
                let Fragment::Text(mut start, end) = f else {
                    next.push(f);
                    continue;
                };
                loop {
                    let Some(m) = find(&bytes[start..end], tok).map(|p| p + start) else {
                        if start < end {
                            next.push(Fragment::Text(start, end));
                        }
                        break;
                    };
                    let mut left_end = m;
                    if lstrip {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(id));
                    let mut right = m + tok.len();
                    if right >= end {
                        break;
                    }
                    if rstrip {
                        while right < end && is_c_space(bytes[right]) {
                            right += 1;
                        }
                    }
                    start = right;
                }
            }
            std::mem::swap(out, &mut next);
        }
    }

    /// Set (or clear) attribute bits on every special token.
    pub fn set_attr_all(&self, vocab: &mut Vocab, bits: u16) {
        for &id in &self.order {
            vocab.attrs[id as usize] |= bits;
        }
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// First occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        let p = hay[i..=hay.len() - needle.len()].iter().position(|&b| b == first)? + i;
        if &hay[p..p + needle.len()] == needle {
            return Some(p);
        }
        i = p + 1;
    }
    None
}

/// A byte trie of token texts. Children are kept sorted in one flat edge list
/// per node.
#[derive(Default)]
struct Trie {
    nodes: Vec<Node>,
    /// Child of the root for each first byte (0: none).
    root: Vec<u32>,
}

#[derive(Default)]
struct Node {
    edges: Vec<(u8, u32)>,
    token: Option<u32>,
}

impl Trie {
    fn insert(&mut self, text: &[u8], id: u32) {
        if self.nodes.is_empty() {
            self.nodes.push(Node::default());
            self.root = vec![0; 256];
        }
        let Some((&first, rest)) = text.split_first() else { return };
        let mut node = match self.root[first as usize] {
            0 => {
                self.nodes.push(Node::default());
                let n = (self.nodes.len() - 1) as u32;
                self.root[first as usize] = n;
                n
            }
            n => n,
        };
        for &b in rest {
            let edges = &self.nodes[node as usize].edges;
            node = match edges.binary_search_by_key(&b, |e| e.0) {
                Ok(i) => edges[i].1,
                Err(i) => {
                    let n = self.nodes.len() as u32;
                    self.nodes[node as usize].edges.insert(i, (b, n));
                    self.nodes.push(Node::default());
                    n
                }
            };
        }
        self.nodes[node as usize].token.get_or_insert(id);
    }

    /// Call `f` with every token that occurs anywhere in `text`.
    fn for_each_match(&self, text: &[u8], mut f: impl FnMut(u32)) {
        if self.nodes.is_empty() {
            return;
        }
        for start in 0..text.len() {
            let mut node = self.root[text[start] as usize];
            let mut i = start + 1;
            while node != 0 {
                let n = &self.nodes[node as usize];
                if let Some(id) = n.token {
                    f(id);
                }
                let Some(&b) = text.get(i) else { break };
                node = match n.edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(k) => n.edges[k].1,
                    Err(_) => 0,
                };
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_matches_std() {
        let hay = b"abcabcabd<|im_end|>x";
        for needle in [&b"abd"[..], b"<|im_end|>", b"x", b"zz", b"abcabcabd<|im_end|>xy"] {
            let want = hay.windows(needle.len()).position(|w| w == needle);
            assert_eq!(find(hay, needle), want);
        }
    }

    #[test]
    fn trie_reports_every_occurring_token() {
        let mut t = Trie::default();
        t.insert(b"<a>", 1);
        t.insert(b"<ab>", 2);
        t.insert(b"b>", 3);
        let mut seen = Vec::new();
        t.for_each_match(b"x<ab>y", |id| seen.push(id));
        assert_eq!(seen, [2, 3]);
    }
}
