//! `pocket tokenize`: a model's token ids for a text, as llama-tokenize prints
//! them, or as JSON; `--bench` measures encode throughput.

use std::io::{Read, Write};
use std::time::Instant;

use pocket_core::gguf::GgufFile;
use pocket_core::tokenizer::Tokenizer;

use crate::args::{Args, Spec};

const HELP: &str = "\
usage: pocket tokenize --model FILE [options] TEXT
       pocket tokenize --model FILE --bench FILE [--runs N] [--no-special]

Tokenizes TEXT with the model's tokenizer. The defaults are llama-tokenize's:
escapes such as \\n in the text are processed, BOS is added when the model asks
for it, and special tokens in the text (<|im_start|>, <start_of_turn>) are
parsed; each token prints as `    ID -> 'piece'`.

options:
  --json          print {\"ids\": [...], \"pieces\": [...]} instead
  --ids           print the ids only, as [1, 2, 3]
  --no-bos        do not add BOS (or EOS) even if the model asks for it
  --no-special    tokenize special-token text as plain text
  --file PATH     read the text from a file instead of TEXT
  --stdin         read the text from standard input
  --no-escape     take the text verbatim (by default, as llama-tokenize,
                  \\n \\r \\t \\' \\\" \\\\ \\xHH escapes are processed)
  --show-count    print the number of tokens at the end
  --bench PATH    encode the file repeatedly and print MB/s (--runs N, default 10)
";

const SPEC: Spec = Spec {
    values: &["--model", "-m", "--file", "-f", "--bench", "--runs"],
    switches: &[
        "--json",
        "--ids",
        "--no-bos",
        "--no-special",
        "--stdin",
        "--escape",
        "--no-escape",
        "--show-count",
        "--help",
        "-h",
    ],
};

pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &SPEC)?;
    if a.switch("--help") || a.switch("-h") {
        print!("{HELP}");
        return Ok(());
    }
    let model = a.value("--model").or(a.value("-m")).ok_or("--model is required (see `pocket tokenize --help`)")?;
    let g = GgufFile::open(model).map_err(|e| format!("{model}: {e}"))?;
    let tok = Tokenizer::from_gguf(&g).map_err(|e| format!("{model}: {e}"))?;
    let parse_special = !a.switch("--no-special");
    if let Some(path) = a.value("--bench") {
        return bench(&tok, path, a.parsed::<usize>("--runs")?.unwrap_or(10).max(1), parse_special);
    }

    let mut text = if let Some(path) = a.value("--file").or(a.value("-f")) {
        std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?
    } else if a.switch("--stdin") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| format!("stdin: {e}"))?;
        s
    } else {
        match a.positional() {
            [t] => t.clone(),
            [] => return Err("no text to tokenize (give TEXT, --file or --stdin)".into()),
            _ => return Err("give the text as one argument (quote it)".into()),
        }
    };
    if !a.switch("--no-escape") {
        text = process_escapes(&text);
    }

    // As llama-tokenize: BOS (and EOS) per the model unless --no-bos.
    let add_special = tok.add_bos() && !a.switch("--no-bos");
    let ids = tok.encode(&text, add_special, parse_special).map_err(|e| e.to_string())?;

    let mut out = Vec::new();
    if a.switch("--json") {
        let pieces: Vec<serde_json::Value> =
            ids.iter().map(|&id| String::from_utf8_lossy(tok.token_piece(id)).into_owned().into()).collect();
        let ids_json: Vec<String> = ids.iter().map(u32::to_string).collect();
        let pieces_json: Vec<String> = pieces.iter().map(serde_json::Value::to_string).collect();
        writeln!(out, "{{\"ids\": [{}], \"pieces\": [{}]}}", ids_json.join(", "), pieces_json.join(", "))
            .map_err(|e| e.to_string())?;
    } else if a.switch("--ids") {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", ")).map_err(|e| e.to_string())?;
    } else {
        for &id in &ids {
            out.extend_from_slice(format!("{id:6} -> '").as_bytes());
            out.extend_from_slice(tok.token_piece(id));
            out.extend_from_slice(b"'\n");
        }
    }
    if a.switch("--show-count") {
        writeln!(out, "Total number of tokens: {}", ids.len()).map_err(|e| e.to_string())?;
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&out).and_then(|_| stdout.flush()).map_err(|e| format!("stdout: {e}"))
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
    println!(
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
