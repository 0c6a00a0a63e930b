//! `pocket imatrix`: the importance matrix of a model over a text, for
//! `pocket quantize --imatrix` (and `llama-quantize --imatrix`: the file is
//! llama-imatrix's GGUF format).
//!
//! As llama-imatrix does: the text is cut into chunks of `--ctx` tokens,
//! each starting with BOS (when the model adds one) and evaluated from an
//! empty context; every token's input to every layer weight is counted (the
//! routed experts' only over the tokens routed to them). The chunks'
//! perplexity over their second halves is printed as a check that the model
//! reads the text sensibly.

use std::time::Instant;

use pocket_core::model::KvType;
use pocket_core::quantize::imatrix::Collector;
use pocket_core::threads::ThreadPool;
use serde_json::json;

/// Collect an importance matrix for `pocket quantize --imatrix`
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file (the one you will quantise, or a larger-type copy of it)
    #[arg(long, value_name = "FILE")]
    model: String,
    #[command(flatten)]
    budget: crate::memory::Budget,
    /// The calibration text
    #[arg(long, value_name = "TEXT")]
    file: String,
    /// Chunk length in tokens (at least 4)
    #[arg(long, value_name = "N", default_value_t = 128, allow_negative_numbers = true)]
    ctx: usize,
    /// Evaluate at most N chunks [default: all the text holds]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    chunks: Option<usize>,
    /// Where to write the matrix (GGUF)
    #[arg(long, short = 'o', value_name = "OUT")]
    out: String,
    /// Worker threads [default: the performance cores, else every core]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<usize>,
    /// Print one JSON object instead
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    let n_ctx = args.ctx;
    if n_ctx < 4 {
        return Err("--ctx must be at least 4".into());
    }
    let threads = args.threads.unwrap_or_else(crate::default_threads).max(1);
    let text = std::fs::read_to_string(&args.file).map_err(|e| format!("{}: {e}", args.file))?;
    let model = args.budget.load(&args.model)?;
    let tok = model.tokenizer();
    let tokens = tok.encode(&text, true, false).map_err(|e| e.to_string())?;
    let n_chunks = (tokens.len() / n_ctx).min(args.chunks.unwrap_or(usize::MAX).max(1));
    if n_chunks == 0 {
        return Err(format!("{} has {} tokens, fewer than one chunk of {n_ctx}", args.file, tokens.len()));
    }

    let pool = ThreadPool::new(threads);
    let collector = Collector::new();
    let n_vocab = model.n_vocab();
    let (mut nll, mut count) = (0f64, 0usize);
    let t0 = Instant::now();
    for c in 0..n_chunks {
        let chunk = &tokens[c * n_ctx..(c + 1) * n_ctx];
        let state = crate::perplexity::eval_chunk(&model, &pool, chunk, KvType::default(), Some(&collector))
            .map_err(|e| format!("chunk {}: {e}", c + 1))?;
        let logits = state.logits();
        for p in n_ctx / 2..n_ctx - 1 {
            let row = &logits[p * n_vocab..(p + 1) * n_vocab];
            nll += crate::perplexity::log_sum_exp(row) - row[tokens[c * n_ctx + p + 1] as usize] as f64;
            count += 1;
        }
        if !args.json {
            eprint!("[{}]{:.4} ", c + 1, (nll / count as f64).exp());
        }
    }
    if !args.json {
        eprintln!();
    }
    let secs = t0.elapsed().as_secs_f64();
    let m = collector.imatrix(vec![args.file.clone()], n_chunks as u32, n_ctx as u32);
    let partial = m.entries.values().filter(|e| e.counts.contains(&0)).count();
    m.write(&args.out).map_err(|e| format!("{}: {e}", args.out))?;
    let ppl = (nll / count as f64).exp();
    if args.json {
        let v = json!({
            "entries": m.entries.len(), "partial_entries": partial, "chunks": n_chunks, "ctx": n_ctx,
            "tokens": n_chunks * n_ctx, "ppl": ppl, "seconds": secs, "out": args.out,
        });
        outln!("{v}");
    } else {
        outln!(
            "wrote {} entries ({partial} with experts no token reached) from {n_chunks} chunks of {n_ctx} tokens \
             to {} in {secs:.1} s; PPL over the chunks = {ppl:.4}",
            m.entries.len(),
            args.out
        );
    }
    Ok(())
}
