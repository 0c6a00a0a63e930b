//! `pocket bench --json-schema FILE`: what a constraint costs. The same
//! request (a prompt asking for the record, sampled at temperature 0.8)
//! runs with the schema and without it, alternately, each draw on a fresh
//! session; decode speed is compared over the tokens both generated. The
//! schema's compile time (the first request's, and again with the
//! vocabulary's engine already built) is reported apart.

use std::sync::Arc;
use std::time::Instant;

use pocket_core::model::Model;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, GenerationStats, Session, SessionOptions};
use pocket_core::structured::{Constraint, Grammars};
use serde_json::json;

/// The constrained benchmark's figures, printed as one JSON object or a few lines.
pub fn run(
    model: Model,
    schema_arg: &str,
    n_gen: usize,
    draws: usize,
    threads: usize,
    json_out: bool,
) -> Result<(), String> {
    let schema = if schema_arg.trim_start().starts_with('{') {
        schema_arg.to_string()
    } else {
        std::fs::read_to_string(schema_arg).map_err(|e| format!("{schema_arg}: {e}"))?
    };
    let model = Arc::new(model);
    // Compile cost: the vocabulary's engine (once per model), then the schema.
    let t = Instant::now();
    let fresh =
        Grammars::new(Arc::new(pocket_core::tokenizer::Tokenizer::from_gguf(model.file()).map_err(|e| e.to_string())?))
            .map_err(|e| e.to_string())?;
    let engine_ms = t.elapsed().as_secs_f64() * 1e3;
    let c = Constraint::JsonSchema(schema.clone());
    let t = Instant::now();
    c.compile(&fresh).map_err(|e| e.to_string())?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;

    let prompt = "Write one record as JSON with every field filled in: ";
    let opts = |seed: u64, constrained: bool, n: usize| GenerateOptions {
        max_tokens: n,
        sampler: SamplerConfig { temperature: 0.8, seed, ..Default::default() },
        seed: Some(seed),
        json_schema: constrained.then(|| schema.clone()),
        ignore_eos: !constrained,
        ..Default::default()
    };
    let session = || {
        Session::new(model.clone(), SessionOptions { context_length: 1024, threads, ..Default::default() })
            .map_err(|e| e.to_string())
    };
    let request = |o: &GenerateOptions| -> Result<GenerationStats, String> {
        session()?.generate(prompt, o, &mut |_| true).map_err(|e| e.to_string())
    };
    // Warm-up (uncounted): builds the model's engine.
    request(&opts(0, true, n_gen))?;
    let (mut with, mut without, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    for d in 0..draws {
        let seed = 1 + d as u64;
        let s = request(&opts(seed, true, n_gen))?;
        // The same number of tokens unconstrained.
        let u = request(&opts(seed, false, s.generated_tokens.max(2)))?;
        if s.generated_tokens > 1 {
            with.push(s.decode_tokens_per_second);
            without.push(u.decode_tokens_per_second);
            ttft.push((s.time_to_first_token_ms, u.time_to_first_token_ms));
        }
    }
    if with.is_empty() {
        return Err("the schema's answers were one token long: nothing to time".into());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (w, u) = (mean(&with), mean(&without));
    let ttft_with = mean(&ttft.iter().map(|t| t.0).collect::<Vec<_>>());
    let ttft_without = mean(&ttft.iter().map(|t| t.1).collect::<Vec<_>>());
    if json_out {
        let v = json!({
            "schema_bytes": schema.len(),
            "engine_build_ms": engine_ms,
            "schema_compile_ms": compile_ms,
            "draws": with.len(),
            "decode_tps_constrained": with,
            "decode_tps_unconstrained": without,
            "mean_constrained": w,
            "mean_unconstrained": u,
            "ratio": w / u,
            "ttft_ms_constrained": ttft_with,
            "ttft_ms_unconstrained": ttft_without,
        });
        outln!("{v}");
    } else {
        outln!(
            "vocabulary engine built in {engine_ms:.1} ms; schema ({} bytes) compiled in {compile_ms:.1} ms",
            schema.len()
        );
        outln!(
            "decode: {w:.1} t/s with the schema, {u:.1} t/s without ({:.1} %), over {} draws",
            100.0 * w / u,
            with.len()
        );
        outln!("first token: {ttft_with:.1} ms with the schema, {ttft_without:.1} ms without");
    }
    Ok(())
}
