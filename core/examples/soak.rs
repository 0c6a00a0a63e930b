//! The soak for BENCHMARKS.md: one request generating N tokens through a
//! sliding window, the process's resident memory sampled every 500 tokens
//! (Linux: /proc/self/statm). Memory must stay flat: the window reuses the
//! state's buffers, and nothing grows with the generated text but the
//! returned text itself.
//!
//! cargo run --release -p pocket-core --example soak -- MODEL.gguf [TOKENS=10000] [CONTEXT=4096] [THREADS=2]

use std::sync::Arc;
use std::time::Instant;

use pocket_core::model::Model;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{ContextPolicy, GenerateOptions, Session, SessionOptions};

/// Resident set size in MiB.
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

fn main() -> pocket_core::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: soak MODEL.gguf [TOKENS=10000] [CONTEXT=4096] [THREADS=2]");
        std::process::exit(2);
    };
    let tokens: usize = args.get(1).map_or(10_000, |s| s.parse().expect("TOKENS"));
    let context: usize = args.get(2).map_or(4096, |s| s.parse().expect("CONTEXT"));
    let threads: usize = args.get(3).map_or(2, |s| s.parse().expect("THREADS"));
    let model = Arc::new(Model::load(path)?);
    let opts = SessionOptions {
        context_length: context,
        threads,
        context_policy: ContextPolicy::Slide { sink: None },
        ..Default::default()
    };
    let mut s = Session::new(model, opts)?;
    // Seeded sampling (not greedy): greedy text on a small model soon repeats one phrase.
    let o = GenerateOptions {
        max_tokens: tokens,
        sampler: SamplerConfig { temperature: 0.8, ..Default::default() },
        seed: Some(7),
        ignore_eos: true,
        ..Default::default()
    };
    let start = Instant::now();
    println!("tokens,rss_mib,seconds");
    println!("0,{:.1},0.0", rss_mib());
    // The listener sees one piece per token except where a piece is held back
    // (partial UTF-8): the count is sampled on pieces, the final line on the stats.
    let mut pieces = 0usize;
    let stats = s.generate("Tell me a very long story about a lighthouse keeper.", &o, &mut |_| {
        pieces += 1;
        if pieces.is_multiple_of(500) {
            println!("{pieces},{:.1},{:.1}", rss_mib(), start.elapsed().as_secs_f64());
        }
        true
    })?;
    println!("{},{:.1},{:.1}", stats.generated_tokens, rss_mib(), start.elapsed().as_secs_f64());
    eprintln!(
        "{} tokens in {:.0} s ({:.1} t/s), stop: {}, context holds {} tokens",
        stats.generated_tokens,
        start.elapsed().as_secs_f64(),
        stats.decode_tokens_per_second,
        stats.stop_reason.as_str(),
        s.cached_tokens().len()
    );
    Ok(())
}
