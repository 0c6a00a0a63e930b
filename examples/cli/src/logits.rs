//! `pocket logits`: teacher-forced logits for a token sequence, all positions
//! evaluated in one batch.

use std::fs::File;
use std::io::BufWriter;

use pocket_core::model::{KvType, Logits, Model};
use pocket_core::threads::ThreadPool;
use serde_json::json;

use crate::args::{Args, Spec};

const SPEC: Spec =
    Spec { values: &["--model", "--tokens", "--out", "--kv", "--threads", "--top"], switches: &["--json"] };

const USAGE: &str = "usage: pocket logits --model FILE --tokens 1,2,3 (--out FILE.npy | --top K [--json]) \
                     [--kv f32|f16] [--threads N]";

pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &SPEC).map_err(|e| format!("{e}\n{USAGE}"))?;
    let path = args.required("--model")?;
    let tokens = parse_tokens(args.required("--tokens")?)?;
    let kv: KvType = args.value("--kv").unwrap_or("f32").parse().map_err(|e: pocket_core::Error| e.to_string())?;
    let threads = args.parsed::<usize>("--threads")?.unwrap_or_else(crate::default_threads).max(1);
    let top = args.parsed::<usize>("--top")?;
    let out = args.value("--out");
    if out.is_none() && top.is_none() {
        return Err(format!("give --out FILE.npy or --top K\n{USAGE}"));
    }

    let model = Model::load(path).map_err(|e| format!("{path}: {e}"))?;
    let pool = ThreadPool::new(threads);
    let mut state = model.new_state(tokens.len(), kv).map_err(|e| e.to_string())?;
    model.forward(&pool, &mut state, &tokens, Logits::All).map_err(|e| e.to_string())?;
    let n_vocab = model.n_vocab();
    let logits = state.logits();

    if let Some(out) = out {
        let f = File::create(out).map_err(|e| format!("{out}: {e}"))?;
        crate::npy::write_f32(BufWriter::new(f), &[tokens.len(), n_vocab], logits)
            .map_err(|e| format!("{out}: {e}"))?;
    }
    if let Some(k) = top {
        let k = k.min(n_vocab);
        let rows: Vec<Vec<(usize, f32)>> = logits.chunks_exact(n_vocab).map(|row| top_k(row, k)).collect();
        if args.switch("--json") {
            let positions: Vec<_> = rows
                .iter()
                .zip(&tokens)
                .enumerate()
                .map(|(pos, (row, &tok))| {
                    json!({"pos": pos, "token": tok,
                           "top": row.iter().map(|&(id, l)| json!({"id": id, "logit": l})).collect::<Vec<_>>()})
                })
                .collect();
            println!("{}", json!({"n_vocab": n_vocab, "positions": positions}));
        } else {
            for (pos, (row, tok)) in rows.iter().zip(&tokens).enumerate() {
                let items: Vec<String> = row.iter().map(|(id, l)| format!("{id}:{l:.4}")).collect();
                println!("{pos:>4} {tok:>8}  {}", items.join(" "));
            }
        }
    }
    Ok(())
}

fn parse_tokens(s: &str) -> Result<Vec<u32>, String> {
    let ids: Vec<u32> = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().map_err(|_| format!("invalid token id {p:?}")))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Err("--tokens is empty".into());
    }
    Ok(ids)
}

/// The k largest (index, value) pairs, largest first.
fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.into_iter().map(|i| (i, row[i])).collect()
}
