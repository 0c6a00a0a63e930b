//! `cargo xtask insn-count --by-function`: where the instructions of a qemu
//! run go, by symbol of the guest's executable.
//!
//! The plugin (`tools/insn-count/insn_count.c`, argument `by_function=1`)
//! writes the total, then one `count<TAB>symbol` line per symbol. A token's
//! profile is the difference of two runs that differ only in how many tokens
//! they evaluate, divided by that many tokens, as the totals are.
//! Names are demangled by `c++filt` (Rust's legacy mangling and C++'s; the
//! Rust hash suffix is dropped so that copies of one function add up).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Instructions by (mangled) symbol; `?` for code outside the executable's symbols.
#[derive(Default)]
pub struct Profile {
    pub total: u64,
    by_symbol: HashMap<String, u64>,
}

impl Profile {
    /// The plugin's output file.
    pub fn read(path: &Path) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        let total = first
            .strip_prefix("insns: ")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| format!("plugin output {first:?}"))?;
        let mut by_symbol = HashMap::new();
        for line in lines {
            let (n, name) = line.split_once('\t').ok_or_else(|| format!("plugin line {line:?}"))?;
            let n: u64 = n.parse().map_err(|_| format!("plugin line {line:?}"))?;
            *by_symbol.entry(name.to_string()).or_insert(0) += n;
        }
        Ok(Profile { total, by_symbol })
    }
}

/// Per-token instructions by demangled function: `(more - less) / tokens`,
/// largest first (functions that only the smaller run used come out negative
/// and are dropped).
pub fn per_token(more: &Profile, less: &Profile, tokens: usize) -> Vec<(String, f64)> {
    let mut diff: HashMap<&str, i64> = HashMap::new();
    for (name, &n) in &more.by_symbol {
        *diff.entry(name).or_insert(0) += n as i64;
    }
    for (name, &n) in &less.by_symbol {
        *diff.entry(name).or_insert(0) -= n as i64;
    }
    let names: Vec<&str> = diff.keys().copied().collect();
    let plain = demangle(&names);
    let mut merged: HashMap<String, i64> = HashMap::new();
    for (name, shown) in names.iter().zip(plain) {
        *merged.entry(shown).or_insert(0) += diff[name];
    }
    let mut rows: Vec<(String, f64)> =
        merged.into_iter().filter(|&(_, n)| n > 0).map(|(s, n)| (s, n as f64 / tokens as f64)).collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rows
}

/// Prints the `top` largest rows with their share of `per_token_total`.
pub fn print(label: &str, rows: &[(String, f64)], per_token_total: f64, top: usize) {
    println!("{label}: top functions, instructions per token (total {:.2}M)", per_token_total / 1e6);
    for (name, n) in rows.iter().take(top) {
        let short: String = name.chars().take(110).collect();
        println!("  {:>12.0} {:>5.1}%  {short}", n, 100.0 * n / per_token_total);
    }
}

/// `c++filt` over the names (one per line), the Rust hash suffix dropped;
/// the names unchanged where `c++filt` is missing.
fn demangle(names: &[&str]) -> Vec<String> {
    let filtered = (|| {
        let mut child =
            Command::new("c++filt").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
        let input: String = names.iter().map(|n| format!("{n}\n")).collect();
        // Written from a thread: c++filt's output could fill its pipe before
        // it has read all of ours.
        let mut stdin = child.stdin.take()?;
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().ok()?;
        writer.join().ok()?.ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        (lines.len() == names.len()).then_some(lines)
    })();
    let lines = filtered.unwrap_or_else(|| names.iter().map(|n| n.to_string()).collect());
    lines.into_iter().map(|l| strip_hash(&l).to_string()).collect()
}

/// `a::b::h0123456789abcdef` -> `a::b`.
fn strip_hash(name: &str) -> &str {
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => head,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_token_subtracts_merges_and_sorts() {
        let p = |pairs: &[(&str, u64)]| Profile {
            total: pairs.iter().map(|p| p.1).sum(),
            by_symbol: pairs.iter().map(|&(s, n)| (s.to_string(), n)).collect(),
        };
        let more = p(&[("f::h0123456789abcdef", 300), ("f::hfedcba9876543210", 100), ("g", 50), ("setup", 10)]);
        let less = p(&[("f::h0123456789abcdef", 100), ("g", 40), ("setup", 10), ("only_less", 5)]);
        let rows = per_token(&more, &less, 2);
        assert_eq!(rows, vec![("f".to_string(), 150.0), ("g".to_string(), 5.0)]);
    }

    #[test]
    fn strip_hash_only_strips_a_hash() {
        assert_eq!(strip_hash("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(strip_hash("a::b::hello"), "a::b::hello");
        assert_eq!(strip_hash("ggml_gemv"), "ggml_gemv");
    }
}
