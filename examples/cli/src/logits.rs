//! `pocket logits`: teacher-forced logits for a token sequence, all positions
//! evaluated in one batch.

use std::fs::File;
use std::io::BufWriter;

use clap::ArgGroup;
use pocket_core::model::{KvType, Logits};
use pocket_core::threads::ThreadPool;
use serde_json::json;

/// Teacher-forced logits of every position, all evaluated in one batch
#[derive(clap::Args)]
#[command(group(ArgGroup::new("output").required(true).multiple(true).args(["out", "top"])))]
pub struct Args {
    /// The GGUF model file
    #[arg(long, value_name = "FILE")]
    model: String,
    #[command(flatten)]
    budget: crate::memory::Budget,
    /// Token ids, separated by commas or spaces (e.g. 1,2,3)
    #[arg(long, value_name = "IDS", value_parser = parse_tokens)]
    tokens: Tokens,
    /// Write every position's logits to this .npy file (float32, positions x vocabulary)
    #[arg(long, value_name = "FILE.npy")]
    out: Option<String>,
    /// Print the K largest logits of every position
    #[arg(long, value_name = "K")]
    top: Option<usize>,
    /// With --top: print JSON {"n_vocab", "positions": [{"pos", "token", "top"}]}
    #[arg(long)]
    json: bool,
    /// KV cache type: f32, f16 or q8_0
    #[arg(long, value_name = "TYPE", default_value = KvType::F32.name())]
    kv: KvType,
    /// Worker threads [default: the performance cores, else every core]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// The ids of `--tokens`, parsed once by clap.
#[derive(Clone)]
pub struct Tokens(pub Vec<u32>);

pub fn run(args: Args) -> Result<(), String> {
    let path = &args.model;
    let tokens = args.tokens.0;
    let threads = args.threads.unwrap_or_else(crate::default_threads).max(1);

    let model = args.budget.load(path)?;
    let pool = ThreadPool::new(threads);
    let mut state = model.new_state(tokens.len(), args.kv).map_err(|e| e.to_string())?;
    model.forward(&pool, &mut state, &tokens, Logits::All).map_err(|e| e.to_string())?;
    let n_vocab = model.n_vocab();
    let logits = state.logits();

    if let Some(out) = &args.out {
        let f = File::create(out).map_err(|e| format!("{out}: {e}"))?;
        crate::npy::write_f32(BufWriter::new(f), &[tokens.len(), n_vocab], logits)
            .map_err(|e| format!("{out}: {e}"))?;
    }
    if let Some(k) = args.top {
        let k = k.min(n_vocab);
        let rows: Vec<Vec<(usize, f32)>> = logits.chunks_exact(n_vocab).map(|row| top_k(row, k)).collect();
        if args.json {
            let positions: Vec<_> = rows
                .iter()
                .zip(&tokens)
                .enumerate()
                .map(|(pos, (row, &tok))| {
                    json!({"pos": pos, "token": tok,
                           "top": row.iter().map(|&(id, l)| json!({"id": id, "logit": l})).collect::<Vec<_>>()})
                })
                .collect();
            outln!("{}", json!({"n_vocab": n_vocab, "positions": positions}));
        } else {
            for (pos, (row, tok)) in rows.iter().zip(&tokens).enumerate() {
                let items: Vec<String> = row.iter().map(|(id, l)| format!("{id}:{l:.4}")).collect();
                outln!("{pos:>4} {tok:>8}  {}", items.join(" "));
            }
        }
    }
    Ok(())
}

pub fn parse_tokens(s: &str) -> Result<Tokens, String> {
    let ids: Vec<u32> = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().map_err(|_| format!("invalid token id {p:?}")))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Err("no token ids".into());
    }
    Ok(Tokens(ids))
}

/// The k largest (index, value) pairs, largest first.
fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.into_iter().map(|i| (i, row[i])).collect()
}
