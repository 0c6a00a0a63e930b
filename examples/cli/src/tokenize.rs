//! `pocket tokenize`: a model's token ids for a text, as llama-tokenize prints
//! them, or as JSON; `--bench` measures encode throughput.

use std::io::{Read, Write};
use std::time::Instant;

use pocket_core::gguf::GgufFile;
use pocket_core::tokenizer::Tokenizer;

/// Token ids of a text, as llama-tokenize prints them
#[derive(clap::Args)]
#[command(after_help = DEFAULTS)]
pub struct Args {
    /// The GGUF file whose tokenizer is used
    #[arg(long, short = 'm', value_name = "FILE")]
    model: String,
    /// The text, as one argument (quote it)
    #[arg(allow_negative_numbers = true)]
    text: Option<String>,
    /// Read the text from a file instead of TEXT
    #[arg(long, short = 'f', value_name = "PATH")]
    file: Option<String>,
    /// Read the text from standard input
    #[arg(long)]
    stdin: bool,
    /// Print {"ids": [...], "pieces": [...]} instead
    #[arg(long)]
    json: bool,
    /// Print the ids only, as [1, 2, 3]
    #[arg(long)]
    ids: bool,
    /// Do not add BOS (or EOS) even if the model asks for it
    #[arg(long)]
    no_bos: bool,
    /// Tokenize special-token text as plain text
    #[arg(long)]
    no_special: bool,
    /// Take the text verbatim (by default \n \r \t \' \" \\ \xHH escapes are processed)
    #[arg(long, overrides_with = "escape")]
    no_escape: bool,
    /// Process escapes (the default; cancels an earlier --no-escape)
    #[arg(long, overrides_with = "no_escape")]
    escape: bool,
    /// Print the number of tokens at the end
    #[arg(long)]
    show_count: bool,
    /// Encode this file repeatedly and print MB/s instead
    #[arg(long, value_name = "PATH")]
    bench: Option<String>,
    /// With --bench: how many encodings
    #[arg(long, value_name = "N", default_value_t = 10)]
    runs: usize,
}

/// Shown under the options (by `-h` and `--help` alike, which keeps the
/// compact one-line-per-flag layout).
const DEFAULTS: &str = "\
The defaults are llama-tokenize's: escapes such as \\n in the text are processed,
BOS is added when the model asks for it, and special tokens in the text
(<|im_start|>, <start_of_turn>) are parsed; each token prints as `    ID -> 'piece'`.";

pub fn run(a: Args) -> Result<(), String> {
    let model = &a.model;
    let g = GgufFile::open(model).map_err(|e| format!("{model}: {e}"))?;
    let tok = Tokenizer::from_gguf(&g).map_err(|e| format!("{model}: {e}"))?;
    let parse_special = !a.no_special;
    if let Some(path) = &a.bench {
        return bench(&tok, path, a.runs.max(1), parse_special);
    }

    let mut text = if let Some(path) = &a.file {
        std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?
    } else if a.stdin {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| format!("stdin: {e}"))?;
        s
    } else {
        a.text.ok_or("no text to tokenize (give TEXT, --file or --stdin)")?
    };
    // The two flags override each other, so the last one given decides.
    if a.escape || !a.no_escape {
        text = process_escapes(&text);
    }

    // As llama-tokenize: BOS (and EOS) per the model unless --no-bos.
    let add_special = tok.add_bos() && !a.no_bos;
    let ids = tok.encode(&text, add_special, parse_special).map_err(|e| e.to_string())?;

    let mut out = Vec::new();
    if a.json {
        let pieces: Vec<serde_json::Value> =
            ids.iter().map(|&id| String::from_utf8_lossy(tok.token_piece(id)).into_owned().into()).collect();
        let ids_json: Vec<String> = ids.iter().map(u32::to_string).collect();
        let pieces_json: Vec<String> = pieces.iter().map(serde_json::Value::to_string).collect();
        writeln!(out, "{{\"ids\": [{}], \"pieces\": [{}]}}", ids_json.join(", "), pieces_json.join(", "))
            .map_err(|e| e.to_string())?;
    } else if a.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", ")).map_err(|e| e.to_string())?;
    } else {
        for &id in &ids {
            out.extend_from_slice(format!("{id:6} -> '").as_bytes());
            out.extend_from_slice(tok.token_piece(id));
            out.extend_from_slice(b"'\n");
        }
    }
    if a.show_count {
        writeln!(out, "Total number of tokens: {}", ids.len()).map_err(|e| e.to_string())?;
    }
    let mut stdout = std::io::stdout().lock();
    crate::out::check(stdout.write_all(&out).and_then(|_| stdout.flush()))
}

/// Encode a file `runs` times; print the best and median throughput.
fn bench(tok: &Tokenizer, path: &str, runs: usize, parse_special: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut times = Vec::with_capacity(runs);
    let mut n_tokens = 0;
    for _ in 0..runs {
        let t0 = Instant::now();
        n_tokens = tok.encode(&text, false, parse_special).map_err(|e| e.to_string())?.len();
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let mb = text.len() as f64 / 1e6;
    let median = times[times.len() / 2];
    outln!(
        "{path}: {} bytes -> {n_tokens} tokens; {runs} runs: median {:.1} ms ({:.2} MB/s), best {:.1} ms ({:.2} MB/s)",
        text.len(),
        median * 1e3,
        mb / median,
        times[0] * 1e3,
        mb / times[0]
    );
    Ok(())
}

/// llama.cpp's `string_process_escapes`: `\n \r \t \' \" \\ \xHH`; other
/// backslashes stay. Bytes that do not form UTF-8 become U+FFFD.
fn process_escapes(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        i += 1;
        match b[i] {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            c @ (b'\'' | b'"' | b'\\') => out.push(c),
            b'x' if i + 2 < b.len() && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("0");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 2;
            }
            c => out.extend_from_slice(&[b'\\', c]),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_as_llama_cpp() {
        assert_eq!(super::process_escapes(r"a\nb\t\\\x41\q\"), "a\nb\t\\A\\q\\");
    }
}
