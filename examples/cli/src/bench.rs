//! `pocket bench`: prefill and decode speed under a fixed protocol.
//!
//! One uncounted warm-up draw, then `--draws` draws, each on a fresh state:
//! a prompt of `-p` tokens evaluated as one batch (prefill), then `-n` tokens
//! evaluated one at a time (decode), as llama-bench's pp/tg tests do. Every
//! draw is reported with mean, standard deviation, min and max, next to a
//! fingerprint of the configuration, so figures are only compared on the
//! same base.

use std::time::Instant;

use pocket_core::gguf::Summary;
use pocket_core::model::{BackendCounters, ExpertIo, HostBlock, KvType, Logits};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions, Speculation};
use pocket_core::threads::{ThreadPool, ThreadSource};
use serde_json::json;

use crate::fingerprint;

/// Prefill and decode speed under a fixed protocol (a warm-up, then --draws draws)
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file
    #[arg(long, value_name = "FILE")]
    model: String,
    #[command(flatten)]
    budget: crate::memory::Budget,
    /// Prompt tokens evaluated as one batch (prefill); 0 = none
    #[arg(short = 'p', value_name = "N", default_value_t = 128, allow_negative_numbers = true)]
    n_prompt: usize,
    /// Tokens evaluated one at a time after the prompt (decode); 0 = none
    #[arg(short = 'n', value_name = "N", default_value_t = 32, allow_negative_numbers = true)]
    n_gen: usize,
    /// Counted draws, each on a fresh state
    #[arg(long, value_name = "N", default_value_t = 5, allow_negative_numbers = true)]
    draws: usize,
    /// Worker threads [default: the performance cores, else every core]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<usize>,
    /// KV cache type: f32, f16 or q8_0
    #[arg(long, value_name = "TYPE", default_value = KvType::default().name())]
    kv: KvType,
    /// Context length [default and least: -p + -n + 1]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    ctx: Option<usize>,
    /// Print JSON: fingerprint, config, each draw, and mean/sd/min/max of both speeds
    #[arg(long)]
    json: bool,
    /// Skip the uncounted warm-up draw (cold-start figures: an app's first request after launch)
    #[arg(long)]
    no_warmup: bool,
    /// Another prompt each draw and another token each decode step (as llama-bench's
    /// random tokens), instead of one prompt and one repeated token: what a cache of
    /// experts meets with real text rather than a replay
    #[arg(long)]
    varied: bool,
    /// Measure what a JSON Schema costs instead (FILE or the schema): the same sampled
    /// request with and without it, decode t/s over the same tokens, and the compile time
    #[arg(long, value_name = "FILE|JSON")]
    json_schema: Option<String>,
    /// Measure speculative decoding's verify pass instead: one decoded token against
    /// passes of 1..=K drafts (and an MTP draft step where the file has the layer),
    /// after a -p prompt, medians of --draws; with the decode speed it projects at
    /// acceptance 0.5, 0.65 and 0.8
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    verify_cost: Option<usize>,
    /// With --speculate other than off, each draw runs through a session
    /// instead (greedy, end tokens ignored) over the same prompt, and reports
    /// the drafts made and accepted (the synthetic prompt gives lookup little
    /// to find: measure input-grounded prompts with `run --json`).
    #[command(flatten)]
    speculate: crate::speculate::Speculate,
}

/// One draw's figures.
struct Draw {
    pp: f64,
    tg: f64,
    /// Time to the first token's logits: load-free prefill of the prompt.
    ttft_ms: f64,
    io: ExpertIo,
    /// Storage bytes read during decode.
    decode_bytes: u64,
    /// What the GPU backend did during decode (`None` on the CPU).
    decode_gpu: Option<BackendCounters>,
    /// Speculation: tokens drafted and accepted.
    drafted: usize,
    accepted: usize,
    /// A hash of the last logits (after the draw's last token): two engines
    /// that computed the same thing agree on it.
    logits_digest: u64,
}

impl Draw {
    /// Experts found in the cache, of those used (`None` without a budget).
    fn hit_rate(&self) -> Option<f64> {
        let used = self.io.hits + self.io.misses;
        (used > 0).then(|| self.io.hits as f64 / used as f64)
    }
}

/// FNV-1a over the bits of `logits`.
fn digest(logits: &[f32]) -> u64 {
    logits.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3))
}

struct Spread {
    mean: f64,
    sd: f64,
    min: f64,
    max: f64,
}

fn spread(v: &[f64]) -> Spread {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    Spread {
        mean,
        sd: var.sqrt(),
        min: v.iter().cloned().fold(f64::INFINITY, f64::min),
        max: v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    }
}

pub fn run(args: Args) -> Result<(), String> {
    let path = &args.model;
    let (n_prompt, n_gen, kv) = (args.n_prompt, args.n_gen, args.kv);
    let draws = args.draws.max(1);
    let chosen = pocket_core::threads::resolve(args.threads.unwrap_or(0));
    let threads = chosen.threads;
    let threads_source = match chosen.source {
        ThreadSource::Given => "--threads".to_string(),
        other => other.to_string(),
    };
    if n_prompt == 0 && n_gen == 0 {
        return Err("nothing to measure: -p and -n are both 0".into());
    }

    // The routing benchmark hook (`POCKET_ROUTING`), refused when malformed.
    let routing = pocket_core::model::LocalRouting::from_env()?.map_or("router".to_string(), |r| r.describe());
    let t_load = Instant::now();
    let model = args.budget.load(path)?;
    if let Some(schema) = &args.json_schema {
        return crate::bench_structured::run(model, schema, n_gen.max(2), draws, threads, args.json);
    }
    if let Some(k) = args.verify_cost {
        if !(1..=pocket_core::session::MAX_DRAFT).contains(&k) {
            return Err(format!("--verify-cost {k}: not in 1..={}", pocket_core::session::MAX_DRAFT));
        }
        let pool = ThreadPool::new(threads);
        let costs = crate::bench_verify::measure(&model, &pool, kv, n_prompt, k, draws)?;
        if args.json {
            let mut v = crate::bench_verify::to_json(&costs);
            v["model"] = json!(path);
            v["threads"] = json!(threads);
            v["isa"] = json!(pocket_core::kernels::isa().to_string());
            v["n_prompt"] = json!(n_prompt);
            v["draws"] = json!(draws);
            v["memory_budget"] = json!(model.memory_budget());
            outln!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        } else {
            crate::bench_verify::text(&costs).iter().for_each(|l| outln!("{l}"));
        }
        return Ok(());
    }
    let model = std::sync::Arc::new(model);
    let speculation = args.speculate.speculation()?;
    let draft_model = args.speculate.draft_model()?;
    let load_ms = t_load.elapsed().as_secs_f64() * 1e3;
    let gpu_at_load = model.backend_counters();
    let n_ctx = args.ctx.unwrap_or(n_prompt + n_gen + 1).max(n_prompt + n_gen + 1);
    let pool = ThreadPool::new(threads);
    let summary: &Summary = model.summary();
    let file_fp = fingerprint::file(path).map_err(|e| format!("{path}: {e}"))?;
    let isa = pocket_core::kernels::isa().to_string();
    let build = fingerprint::build();
    let config = json!({
        "model": path,
        "architecture": summary.architecture,
        "quantization": summary.quantization,
        "file_bytes": summary.file_bytes,
        "bytes_per_token_estimate": summary.bytes_per_token_estimate,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "threads": threads,
        "threads_source": threads_source,
        "isa": isa,
        "kv_type": kv.name(),
        "context": n_ctx,
        "draws": draws,
        "build": build,
        "load_ms": load_ms,
        "memory_budget": model.memory_budget(),
        "memory_budget_given": args.budget.describe(),
        "backend": model.backend_name(),
        "adapter": model.adapter().map(|a| {
            json!({"name": a.name, "driver": a.driver, "driver_info": a.driver_info, "kernels": a.kernels.name()})
        }),
        "warmup": !args.no_warmup,
        "varied": args.varied,
        "speculation": format!("{speculation:?}"),
        "routing": routing,
    });
    let budget = match args.budget.size {
        crate::memory::Size::Bytes(0) => String::new(),
        crate::memory::Size::Bytes(b) => format!(" budget:{b}"),
        crate::memory::Size::Auto => " budget:auto".into(),
    };
    let mut follower = args.budget.follower(&model);
    // CPU runs keep the fingerprint they always had; a GPU run names its adapter.
    let device = model.adapter().map_or(String::new(), |a| format!(" gpu:{}", a.name.replace(' ', "_")));
    let fingerprint = format!(
        "{file_fp} {} {} t{threads} {isa} kv:{} ctx:{n_ctx} p{n_prompt} n{n_gen}{budget}{device}{}{} {build}",
        summary.architecture,
        summary.quantization,
        kv.name(),
        if args.varied { " varied" } else { "" },
        if args.speculate.is_off() {
            String::new()
        } else {
            format!(" spec:{}", format!("{speculation:?}").replace(' ', ""))
        }
    );

    // Deterministic pseudo-random tokens, away from control tokens: token `i`
    // of draw `d` (the same token for every `i` and `d` of a plain bench's decode).
    let vocab = model.n_vocab() as u64;
    let token = |d: u64, i: u64| ((i * 7919 + 1009 + d * 104_729) % (vocab - 300) + 256) as u32;
    let varied = args.varied;
    let gen_token = move |d: u64, i: u64| if varied { token(d + 1_000, i) } else { (vocab / 2) as u32 };

    let mut samples: Vec<Draw> = Vec::with_capacity(draws);
    let mut warmup: Option<Draw> = None;
    let first = if args.no_warmup { 1 } else { 0 };
    for d in first..=draws {
        if speculation != Speculation::Off {
            let prompt: Vec<u32> =
                (0..n_prompt.max(1) as u64).map(|i| token(if varied { d as u64 } else { 0 }, i)).collect();
            let opts = SessionOptions {
                context_length: n_ctx,
                kv_type: kv,
                threads,
                draft_model: draft_model.clone(),
                ..Default::default()
            };
            let mut session = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
            let gen = GenerateOptions {
                max_tokens: n_gen.max(1),
                sampler: SamplerConfig::greedy(),
                ignore_eos: true,
                speculation,
                ..Default::default()
            };
            let st = session.generate_tokens(&prompt, &gen, &mut |_| true).map_err(|e| e.to_string())?;
            let draw = Draw {
                pp: st.prefill_tokens_per_second,
                tg: st.decode_tokens_per_second,
                ttft_ms: st.time_to_first_token_ms,
                io: ExpertIo::default(),
                decode_bytes: st.storage_bytes_read,
                decode_gpu: None,
                drafted: st.drafted_tokens,
                accepted: st.accepted_tokens,
                logits_digest: 0,
            };
            if d == 0 {
                warmup = Some(draw);
                continue;
            }
            if !args.json {
                eprintln!(
                    "draw {d}/{draws}: prefill {:.2} t/s, decode {:.2} t/s, drafts {}/{} accepted",
                    draw.pp, draw.tg, draw.accepted, draw.drafted
                );
            }
            samples.push(draw);
            continue;
        }
        let mut state = model.new_state(n_ctx, kv).map_err(|e| e.to_string())?;
        let prompt: Vec<u32> = (0..n_prompt as u64).map(|i| token(if varied { d as u64 } else { 0 }, i)).collect();
        let mut pp = 0.0;
        let t = Instant::now();
        if n_prompt > 0 {
            model.forward(&pool, &mut state, &prompt, Logits::Last).map_err(|e| e.to_string())?;
            pp = n_prompt as f64 / t.elapsed().as_secs_f64();
        } else {
            model.forward(&pool, &mut state, &[gen_token(d as u64, 0)], Logits::Last).map_err(|e| e.to_string())?;
        }
        let ttft_ms = t.elapsed().as_secs_f64() * 1e3;
        let after_prefill = state.expert_io();
        let gpu_before = model.backend_counters();
        let mut tg = 0.0;
        if n_gen > 0 {
            let t = Instant::now();
            for i in 0..n_gen {
                let t = gen_token(d as u64, i as u64 + 1);
                model.forward(&pool, &mut state, &[t], Logits::Last).map_err(|e| e.to_string())?;
                if let Some(f) = &mut follower {
                    f.tick(&model);
                }
            }
            tg = n_gen as f64 / t.elapsed().as_secs_f64();
        }
        let io = state.expert_io();
        let decode_gpu = model.backend_counters().zip(gpu_before).map(|(after, before)| after - before);
        let draw = Draw {
            pp,
            tg,
            ttft_ms,
            io,
            decode_bytes: (io - after_prefill).bytes_read,
            decode_gpu,
            drafted: 0,
            accepted: 0,
            logits_digest: digest(state.logits()),
        };
        if d == 0 {
            // Warm-up: pages in the weights, spins up the threads; reported apart (a cold start).
            warmup = Some(draw);
            continue;
        }
        if !args.json {
            let cache = match draw.hit_rate() {
                Some(h) => format!(
                    ", expert hit rate {:.1} %, {:.1} MB read per token",
                    h * 100.0,
                    per_token(&draw, n_gen) / 1e6
                ),
                None => String::new(),
            };
            eprintln!("draw {d}/{draws}: prefill {pp:.2} t/s, decode {tg:.2} t/s{cache}");
        }
        samples.push(draw);
    }

    let mem = memory();
    let pps: Vec<f64> = samples.iter().map(|s| s.pp).collect();
    let tgs: Vec<f64> = samples.iter().map(|s| s.tg).collect();
    let mut total = ExpertIo::default();
    samples.iter().for_each(|s| total += s.io);
    let total_decode_bytes: u64 = samples.iter().map(|s| s.decode_bytes).sum();
    let total_hit_rate = {
        let used = total.hits + total.misses;
        (used > 0).then(|| total.hits as f64 / used as f64)
    };
    let total_per_token = match n_gen {
        0 => 0.0,
        n => total_decode_bytes as f64 / (n * samples.len()) as f64,
    };
    let (p, t) = (spread(&pps), spread(&tgs));
    let drafted: usize = samples.iter().map(|s| s.drafted).sum();
    let accepted: usize = samples.iter().map(|s| s.accepted).sum();
    let acceptance = crate::speculate::acceptance(drafted, accepted);
    let gpu = gpu_at_load.zip(model.backend_counters()).map(|(at_load, end)| GpuReport {
        at_load,
        after_load: end - at_load,
        decode: samples.iter().filter_map(|d| d.decode_gpu).fold(BackendCounters::default(), |a, d| a + d),
        tokens: n_gen * samples.len(),
    });
    if args.json {
        let sj = |s: &Spread| json!({"mean": s.mean, "sd": s.sd, "min": s.min, "max": s.max});
        let v = json!({
            "fingerprint": fingerprint,
            "config": config,
            "draws": samples.iter().map(|d| json!({
                "prefill_tps": d.pp,
                "decode_tps": d.tg,
                "time_to_first_token_ms": d.ttft_ms,
                "expert_hit_rate": d.hit_rate(),
                "storage_bytes_per_token": per_token(d, n_gen),
                "storage_bytes_read": d.io.bytes_read,
                "experts_read_ahead": d.io.prefetched,
                "drafted_tokens": d.drafted,
                "accepted_tokens": d.accepted,
                "logits_digest": format!("{:016x}", d.logits_digest),
            })).collect::<Vec<_>>(),
            "prefill_tps": sj(&p),
            "decode_tps": sj(&t),
            "warmup": warmup.as_ref().map(|d| json!({
                "prefill_tps": d.pp,
                "decode_tps": d.tg,
                "time_to_first_token_ms": d.ttft_ms,
                "expert_hit_rate": d.hit_rate(),
                "storage_bytes_read": d.io.bytes_read,
                "logits_digest": format!("{:016x}", d.logits_digest),
            })),
            "expert_hit_rate": total_hit_rate,
            "storage_bytes_per_token": total_per_token,
            "storage_bytes_read": total.bytes_read,
            "experts_read_ahead": total.prefetched,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance": acceptance,
            "gpu": gpu.as_ref().map(GpuReport::json),
            // What ran on the CPU under the GPU backend (the warm-up and draws): blocks
            // without a device path, and operations whose device calls fell back.
            "gpu_fallback": gpu.as_ref().map(|g| g.after_load.on_host()),
            "memory": mem.map(|m| json!({
                "peak_rss_bytes": m.peak_rss,
                "anon_rss_bytes": m.anon_rss,
                "file_rss_bytes": m.file_rss,
            })),
        });
        outln!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        outln!("fingerprint  {fingerprint}");
        outln!(
            "model        {} ({}, {:.2} GiB, {:.0} MiB read per token est.)",
            summary.architecture,
            summary.quantization,
            summary.file_bytes as f64 / (1u64 << 30) as f64,
            summary.bytes_per_token_estimate as f64 / (1u64 << 20) as f64
        );
        outln!("load         {load_ms:.1} ms");
        if let Some(h) = total_hit_rate {
            outln!(
                "experts      hit rate {:.1} %, {:.1} MB read per decoded token ({:.2} GB in all, {} experts read ahead)",
                h * 100.0,
                total_per_token / 1e6,
                total.bytes_read as f64 / 1e9,
                total.prefetched
            );
        }
        if let Some(g) = &gpu {
            outln!("{}", g.text());
            let fallback = g.after_load.on_host();
            if !fallback.is_empty() {
                outln!("gpu fallback on the CPU: {}", fallback.join(", "));
            }
        }
        if let Some(a) = acceptance {
            outln!("drafts       {accepted}/{drafted} accepted ({:.1} %)", a * 100.0);
        }
        if let Some(m) = mem {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            outln!(
                "memory       peak RSS {:.0} MiB (now: {:.0} MiB private, {:.0} MiB mapped file pages)",
                mib(m.peak_rss),
                mib(m.anon_rss),
                mib(m.file_rss)
            );
        }
        outln!("{:<14} {:>10} {:>8} {:>10} {:>10}", "test", "mean t/s", "sd", "min", "max");
        if n_prompt > 0 {
            outln!("{:<14} {:>10.2} {:>8.2} {:>10.2} {:>10.2}", format!("pp{n_prompt}"), p.mean, p.sd, p.min, p.max);
        }
        if n_gen > 0 {
            outln!("{:<14} {:>10.2} {:>8.2} {:>10.2} {:>10.2}", format!("tg{n_gen}"), t.mean, t.sd, t.min, t.max);
        }
    }
    Ok(())
}

/// What the GPU backend did, from its counters: since load, and in the
/// decode phase of the counted draws (per decoded token).
struct GpuReport {
    /// At the end of the load (the weights are uploaded then).
    at_load: BackendCounters,
    /// From the end of the load to the end of the last draw (the warm-up included).
    after_load: BackendCounters,
    /// Summed over the counted draws' decode phases.
    decode: BackendCounters,
    /// Tokens decoded in those phases.
    tokens: usize,
}

impl GpuReport {
    /// `v / tokens`, or `None` when nothing was decoded.
    fn per_token(&self, v: u64) -> Option<f64> {
        (self.tokens > 0).then(|| v as f64 / self.tokens as f64)
    }

    fn json(&self) -> serde_json::Value {
        let (d, after) = (&self.decode.device, &self.after_load.device);
        json!({
            "products_on_gpu_per_token": self.per_token(self.decode.gpu_products),
            "products_on_cpu_per_token": self.per_token(self.decode.cpu_products),
            "attention_on_gpu_per_token": self.per_token(self.decode.gpu_attention),
            "attention_on_cpu_per_token": self.per_token(self.decode.cpu_attention),
            "delta_rule_on_gpu_per_token": self.per_token(self.decode.gpu_delta),
            "delta_rule_on_cpu_per_token": self.per_token(self.decode.cpu_delta),
            "one_submission_tokens_per_token": self.per_token(self.decode.graph_tokens),
            "host_blocks_per_token": HostBlock::ALL
                .iter()
                .map(|&b| (b.name().to_string(), json!(self.per_token(self.decode.host_blocks[b as usize]))))
                .collect::<serde_json::Map<_, _>>(),
            "submissions_per_token": self.per_token(d.submissions),
            "dispatches_per_token": self.per_token(d.dispatches),
            "readbacks_per_token": self.per_token(d.readbacks),
            "readback_bytes_per_token": self.per_token(d.readback_bytes),
            "bytes_uploaded_per_token": self.per_token(d.bytes_uploaded()),
            "buffers_created_per_token": self.per_token(d.buffers_created),
            "state_uploads_per_token": self.per_token(d.state_uploads),
            "state_readbacks_per_token": self.per_token(d.state_readbacks),
            "weight_bytes_uploaded_at_load": self.at_load.device.weight_bytes_uploaded,
            "bytes_uploaded_after_load": after.bytes_uploaded(),
            "weight_bytes_uploaded_after_load": after.weight_bytes_uploaded,
            "activation_bytes_uploaded_after_load": after.activation_bytes_uploaded,
            "cache_bytes_uploaded_after_load": after.cache_bytes_uploaded,
            "state_bytes_uploaded_after_load": after.state_bytes_uploaded,
            "buffers_created_after_load": after.buffers_created,
        })
    }

    fn text(&self) -> String {
        let (d, after) = (&self.decode.device, &self.after_load.device);
        let t = |v: u64| self.per_token(v).unwrap_or(0.0);
        format!(
            "gpu          per decoded token: {:.0}% as one recorded submission; otherwise {:.0} products on the GPU, {:.0} on the CPU, {:.0} attention and \
             {:.0} delta-rule calls on the GPU, {:.0} on the CPU; {:.0} submissions, {:.0} dispatches, {:.1} KB uploaded, {:.1} KB read back; after load: {:.1} MiB of weights uploaded, \
             {} buffers created",
            100.0 * t(self.decode.graph_tokens),
            t(self.decode.gpu_products),
            t(self.decode.cpu_products),
            t(self.decode.gpu_attention),
            t(self.decode.gpu_delta),
            t(self.decode.cpu_attention + self.decode.cpu_delta),
            t(d.submissions),
            t(d.dispatches),
            t(d.bytes_uploaded()) / 1e3,
            t(d.readback_bytes) / 1e3,
            after.weight_bytes_uploaded as f64 / (1u64 << 20) as f64,
            after.buffers_created
        )
    }
}

/// Storage bytes read per decoded token in a draw (per prompt token when it decodes none).
fn per_token(d: &Draw, n_gen: usize) -> f64 {
    match n_gen {
        0 => d.io.bytes_read as f64,
        n => d.decode_bytes as f64 / n as f64,
    }
}

/// The process's memory as Linux reports it (`/proc/self/status`): peak
/// resident set, and the current private (anonymous) and file-backed parts.
/// Mapped weights count as file pages: the kernel can drop them at will.
#[derive(Clone, Copy)]
struct Memory {
    peak_rss: u64,
    anon_rss: u64,
    file_rss: u64,
}

fn memory() -> Option<Memory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        Some(line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
    };
    Some(Memory { peak_rss: kib("VmHWM:")?, anon_rss: kib("RssAnon:")?, file_rss: kib("RssFile:")? })
}
