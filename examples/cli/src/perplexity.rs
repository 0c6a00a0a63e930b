//! `pocket perplexity`: llama.cpp's method — the text is cut into
//! non-overlapping chunks of `--ctx` tokens, each chunk starts with BOS (when
//! the model adds one) and is evaluated from an empty context, and the second
//! half of each chunk is scored. Prints PPL ± its standard error.
//!
//! `--save-logits FILE` keeps the top 64 log-probabilities of every scored
//! position; `--kl-base FILE` compares this run with such a file (KL
//! divergence over the saved tokens plus the remaining mass, and top-1
//! agreement), which is how quantisation quality is judged.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};

use pocket_core::model::{KvType, Logits, Model, Observer, State};
use pocket_core::threads::ThreadPool;
use serde_json::json;

/// Perplexity as llama-perplexity computes it; KL divergence against a saved run
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file
    #[arg(long, value_name = "FILE")]
    model: String,
    #[command(flatten)]
    budget: crate::memory::Budget,
    /// The text file to score
    #[arg(long, value_name = "TEXT")]
    file: String,
    /// Chunk length in tokens (at least 4); the second half of each chunk is scored
    #[arg(long, value_name = "N", default_value_t = 128, allow_negative_numbers = true)]
    ctx: usize,
    /// Score at most N chunks [default: all the text holds]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    chunks: Option<usize>,
    /// Worker threads [default: the performance cores, else every core]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<usize>,
    /// KV cache type: f32, f16 or q8_0
    #[arg(long, value_name = "TYPE", default_value = KvType::default().name())]
    kv: KvType,
    #[arg(long, value_name = "OUT")]
    #[arg(help = format!("Save the top {TOP} log-probabilities of every scored position to this file"))]
    save_logits: Option<String>,
    /// Compare with a --save-logits file: KL divergence and top-1 agreement
    #[arg(long, value_name = "BASE")]
    kl_base: Option<String>,
    /// Print one JSON object instead
    #[arg(long)]
    json: bool,
}

/// Log-probabilities kept per position by `--save-logits`.
const TOP: usize = 64;
const MAGIC: &[u8; 8] = b"PKTLOGP1";

/// One scored position of a saved run.
struct Saved {
    target: u32,
    ids: Vec<u32>,
    logp: Vec<f32>,
}

pub fn run(args: Args) -> Result<(), String> {
    let (path, text_path, n_ctx, kv) = (&args.model, &args.file, args.ctx, args.kv);
    if n_ctx < 4 {
        return Err("--ctx must be at least 4".into());
    }
    let threads = args.threads.unwrap_or_else(crate::default_threads).max(1);
    let text = std::fs::read_to_string(text_path).map_err(|e| format!("{text_path}: {e}"))?;

    let model = args.budget.load(path)?;
    let tok = model.tokenizer();
    let tokens = tok.encode(&text, true, false).map_err(|e| e.to_string())?;
    if tokens.len() < 2 * n_ctx {
        return Err(format!(
            "{text_path} has {} tokens; a context of {n_ctx} needs at least {}",
            tokens.len(),
            2 * n_ctx
        ));
    }
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(c) = args.chunks {
        n_chunks = n_chunks.min(c.max(1));
    }
    let base = match &args.kl_base {
        Some(p) => Some(load_saved(p)?),
        None => None,
    };
    let mut saved = Vec::new();

    let pool = ThreadPool::new(threads);
    let n_vocab = model.n_vocab();
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let (mut kl_sum, mut kl_n, mut same_top) = (0f64, 0usize, 0usize);
    let t0 = std::time::Instant::now();
    for c in 0..n_chunks {
        let state = eval_chunk(&model, &pool, &tokens[c * n_ctx..(c + 1) * n_ctx], kv, None)?;
        let logits = state.logits();
        for p in first..n_ctx - 1 {
            let row = &logits[p * n_vocab..(p + 1) * n_vocab];
            let target = tokens[c * n_ctx + p + 1];
            let lse = log_sum_exp(row);
            let lp = row[target as usize] as f64 - lse;
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
            if args.save_logits.is_some() {
                saved.push(top_logp(row, lse, target));
            }
            if let Some(b) = &base {
                let Some(s) = b.get(kl_n) else { return Err("--kl-base file covers fewer positions".into()) };
                if s.target != target {
                    return Err("--kl-base file was made from different text or settings".into());
                }
                kl_sum += kl_vs_saved(s, row, lse);
                same_top += (s.ids[0] as usize == argmax(row)) as usize;
                kl_n += 1;
            }
        }
        if !args.json {
            eprint!("[{}]{:.4} ", c + 1, (nll / count as f64).exp());
        }
    }
    if !args.json {
        eprintln!();
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };

    if let Some(out) = &args.save_logits {
        save(out, n_ctx, n_vocab, &saved)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    if args.json {
        let mut v = json!({
            "ppl": ppl, "ppl_error": err, "chunks": n_chunks, "ctx": n_ctx, "scored_tokens": count,
            "tokens": tokens.len(), "seconds": secs,
        });
        if base.is_some() {
            v["kl_divergence"] = json!(kl_sum / kl_n as f64);
            v["top1_agreement"] = json!(same_top as f64 / kl_n as f64);
        }
        outln!("{v}");
    } else {
        outln!("PPL = {ppl:.4} +/- {err:.5}  ({n_chunks} chunks of {n_ctx}, {count} tokens scored, {secs:.1} s)");
        if base.is_some() {
            outln!(
                "KL divergence vs base = {:.6}, top-1 agreement = {:.2} % ({kl_n} positions)",
                kl_sum / kl_n as f64,
                100.0 * same_top as f64 / kl_n as f64
            );
        }
    }
    Ok(())
}

/// One chunk as llama.cpp's perplexity and imatrix tools evaluate it: its
/// first token replaced by BOS (when the model adds one), evaluated from an
/// empty context with every position's logits kept; `observer` sees the
/// weights' inputs.
pub fn eval_chunk(
    model: &Model,
    pool: &ThreadPool,
    chunk: &[u32],
    kv: KvType,
    observer: Option<&dyn Observer>,
) -> Result<State, String> {
    let mut chunk = chunk.to_vec();
    if let (true, Some(b)) = (model.tokenizer().add_bos(), model.tokenizer().bos()) {
        chunk[0] = b;
    }
    let mut state = model.new_state(chunk.len(), kv).map_err(|e| e.to_string())?;
    model.forward_observed(pool, &mut state, &chunk, Logits::All, observer).map_err(|e| e.to_string())?;
    Ok(state)
}

pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
    max as f64 + sum.ln()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn top_logp(row: &[f32], lse: f64, target: u32) -> Saved {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = TOP.min(row.len());
    idx.select_nth_unstable_by(k - 1, |&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    let logp = idx.iter().map(|&i| (row[i as usize] as f64 - lse) as f32).collect();
    Saved { target, ids: idx, logp }
}

/// KL(base ‖ this run) over the base's saved tokens plus one bucket for the
/// rest of the vocabulary (a lower bound of the full KL).
fn kl_vs_saved(s: &Saved, row: &[f32], lse: f64) -> f64 {
    let (mut kl, mut p_rest, mut q_rest) = (0f64, 1f64, 1f64);
    for (&id, &lp) in s.ids.iter().zip(&s.logp) {
        let p = (lp as f64).exp();
        let lq = row[id as usize] as f64 - lse;
        kl += p * (lp as f64 - lq);
        p_rest -= p;
        q_rest -= lq.exp();
    }
    if p_rest > 1e-12 && q_rest > 1e-12 {
        kl += p_rest * (p_rest / q_rest).ln();
    }
    kl
}

fn save(path: &str, n_ctx: usize, n_vocab: usize, saved: &[Saved]) -> Result<(), String> {
    let f = File::create(path).map_err(|e| format!("{path}: {e}"))?;
    let mut w = BufWriter::new(f);
    let mut put = |b: &[u8]| w.write_all(b).map_err(|e| format!("{path}: {e}"));
    put(MAGIC)?;
    for v in [n_ctx as u32, n_vocab as u32, saved.len() as u32, TOP as u32] {
        put(&v.to_le_bytes())?;
    }
    for s in saved {
        put(&s.target.to_le_bytes())?;
        for i in 0..TOP {
            put(&s.ids.get(i).copied().unwrap_or(0).to_le_bytes())?;
        }
        for i in 0..TOP {
            put(&s.logp.get(i).copied().unwrap_or(f32::NEG_INFINITY).to_le_bytes())?;
        }
    }
    w.flush().map_err(|e| format!("{path}: {e}"))
}

fn load_saved(path: &str) -> Result<Vec<Saved>, String> {
    let f = File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let mut r = BufReader::new(f);
    let bad = || format!("{path}: not a pocket perplexity logits file");
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| bad())?;
    if &magic != MAGIC {
        return Err(bad());
    }
    let mut word = || -> Result<u32, String> {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).map_err(|_| bad())?;
        Ok(u32::from_le_bytes(b))
    };
    let (_ctx, _vocab, n, k) = (word()?, word()?, word()? as usize, word()? as usize);
    if k == 0 || k > 4096 || n > 1 << 28 {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let target = word()?;
        let ids = (0..k).map(|_| word()).collect::<Result<Vec<_>, _>>()?;
        let logp = (0..k).map(|_| word().map(f32::from_bits)).collect::<Result<Vec<_>, _>>()?;
        out.push(Saved { target, ids, logp });
    }
    Ok(out)
}
