//! Snapshot size and speed for BENCHMARKS.md: fill a session with N tokens
//! (a long prompt, then generated tokens up to exactly N), save it, restore
//! it, and check that the restored session continues like the original.
//!
//! cargo run --release -p pocket-core --example snapshot_bench -- MODEL.gguf [TOKENS=4096] [THREADS=2] [DIR=.]

use std::sync::Arc;
use std::time::Instant;

use pocket_core::model::Model;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions};

fn main() -> pocket_core::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: snapshot_bench MODEL.gguf [TOKENS=4096] [THREADS=2] [DIR=.]");
        std::process::exit(2);
    };
    let tokens: usize = args.get(1).map_or(4096, |s| s.parse().expect("TOKENS"));
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("THREADS"));
    let dir = std::path::PathBuf::from(args.get(3).map_or(".", String::as_str));
    let model = Arc::new(Model::load(path)?);
    let opts = SessionOptions { context_length: tokens + 64, threads, ..Default::default() };

    // A prompt of about TOKENS - 32 tokens; generation fills the rest.
    let sentence = "The quick brown fox jumps over the lazy dog while the river keeps flowing to the sea. ";
    let mut prompt = String::new();
    while model.tokenizer().encode(&prompt, true, true)?.len() + sentence.len() / 3 < tokens - 32 {
        prompt.push_str(sentence);
    }
    let n_prompt = model.tokenizer().encode(&prompt, true, true)?.len();
    let greedy =
        |n| GenerateOptions { max_tokens: n, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let mut s = Session::new(model.clone(), opts.clone())?;
    let t = Instant::now();
    let st = s.generate(&prompt, &greedy(tokens - n_prompt), &mut |_| true)?;
    eprintln!(
        "filled {} tokens ({} prompt at {:.1} t/s, {} generated) in {:.1} s",
        s.cached_tokens().len(),
        n_prompt,
        st.prefill_tokens_per_second,
        st.generated_tokens,
        t.elapsed().as_secs_f64()
    );
    assert_eq!(s.cached_tokens().len(), tokens);

    let file = dir.join("snapshot_bench.snap");
    let (mut saves, mut restores) = (Vec::new(), Vec::new());
    let mut restored = None;
    for _ in 0..3 {
        let t = Instant::now();
        s.save(&file)?;
        saves.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        restored = Some(Session::restore(model.clone(), &file, opts.clone())?);
        restores.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let bytes = std::fs::metadata(&file)?.len();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut r = restored.expect("three restores");
    let next = format!("{prompt} And");
    let a = s.generate(&next, &greedy(8), &mut |_| true)?;
    let b = r.generate(&next, &greedy(8), &mut |_| true)?;
    assert_eq!(a.tokens, b.tokens, "the restored session continues like the original");
    assert_eq!(a.prompt_tokens_evaluated, b.prompt_tokens_evaluated);
    println!(
        "{}: {tokens} tokens, snapshot {bytes} bytes ({:.1} MiB, {:.1} KiB/token); save {:.0} ms (median of 3: {:?}), \
         restore {:.0} ms ({:?}); in-memory state {:.1} MiB; continuation identical ({} prompt tokens evaluated)",
        path,
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / 1024.0 / tokens as f64,
        median(&mut saves),
        saves.iter().map(|x| x.round()).collect::<Vec<_>>(),
        median(&mut restores),
        restores.iter().map(|x| x.round()).collect::<Vec<_>>(),
        s.memory_bytes() as f64 / (1 << 20) as f64,
        b.prompt_tokens_evaluated,
    );
    std::fs::remove_file(file)?;
    Ok(())
}
