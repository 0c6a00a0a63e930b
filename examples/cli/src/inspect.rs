//! `pocket inspect FILE [--json] [--tensors]`: what a GGUF file holds (a
//! split model from its first shard: every shard, listed).

use std::time::Instant;

use pocket_core::gguf::{GgufFile, Summary};
use pocket_core::model::Model;
use serde_json::{json, Map, Value};

/// What a GGUF file holds: architecture, sizes, quantization, experts
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (of a split model: its first shard)
    file: String,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
    /// Also list every tensor: name, type, shape, bytes, offset
    #[arg(long)]
    tensors: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    let path = &args.file;
    let t0 = Instant::now();
    let g = GgufFile::open(path).map_err(|e| format!("{path}: {e}"))?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let s = Summary::of(&g).map_err(|e| format!("{path}: {e}"))?;
    // The budget figures need the model built (a file of an unsupported architecture has none).
    let plan = Model::load(path).ok().map(|m| m.memory_plan(0));
    // How the file was quantised, when an importance matrix was used:
    // `quantize.imatrix.{file,dataset,entries_count,chunks_count}`.
    let imatrix: Map<String, Value> = g
        .metadata()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("quantize.imatrix.")?;
            let v = v
                .as_u64()
                .map_or_else(|| json!(v.as_str().map_or_else(|| v.to_string(), str::to_string)), |n| json!(n));
            Some((key.to_string(), v))
        })
        .collect();
    if args.json {
        let mut v = summary_json(&s);
        v["quantize_imatrix"] = if imatrix.is_empty() { Value::Null } else { Value::Object(imatrix) };
        v["open_ms"] = json!(open_ms);
        v["shards"] = g
            .shards()
            .iter()
            .map(|s| json!({"file": s.name, "bytes": s.bytes, "tensor_count": s.tensor_count}))
            .collect();
        v["minimum_memory_budget"] = json!(plan.map(|p| p.minimum_budget_bytes));
        v["memory_plan"] = json!(plan.map(|p| json!({
            "resident_bytes": p.resident_bytes,
            "expert_bytes": p.expert_bytes,
            "session_bytes": p.session_bytes,
            "expert_slot_bytes": p.slot_bytes,
        })));
        if args.tensors {
            v["tensors"] = g
                .tensors()
                .iter()
                .map(|t| {
                    json!({"name": t.name, "type": t.ty.name(), "shape": t.shape(), "bytes": t.size,
                           "offset": shard_offset(&g, t), "shard": t.shard})
                })
                .collect();
        }
        outln!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        print_human(&s, open_ms);
        if g.is_split() {
            outln!("shards            {}", g.shards().len());
            for (i, sh) in g.shards().iter().enumerate() {
                outln!("  {:>5}  {}  {} tensors, {}", i + 1, sh.name, sh.tensor_count, human_bytes(sh.bytes));
            }
        }
        for (k, v) in &imatrix {
            outln!(
                "{:<17} {}",
                format!("imatrix {}", k.trim_end_matches("_count")),
                v.as_str().map_or_else(|| v.to_string(), str::to_string)
            );
        }
        if let Some(p) = plan {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            outln!(
                "memory budget     at least {:.0} MiB ({} bytes: {:.0} MiB resident weights, {:.0} MiB of routed experts on storage)",
                mib(p.minimum_budget_bytes),
                p.minimum_budget_bytes,
                mib(p.resident_bytes),
                mib(p.expert_bytes)
            );
        }
        if args.tensors {
            // The offset is in the tensor's own file (its shard's, with a shard column).
            let shard = |t: &pocket_core::gguf::TensorInfo| {
                if g.is_split() {
                    format!(" {:>5}", t.shard + 1)
                } else {
                    String::new()
                }
            };
            let head = if g.is_split() { " shard" } else { "" };
            outln!("\n{:<40} {:<8} {:<24} {:>14} {:>14}{head}", "tensor", "type", "shape", "bytes", "offset");
            for t in g.tensors() {
                let shape = t.shape().iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");
                outln!(
                    "{:<40} {:<8} {:<24} {:>14} {:>14}{}",
                    t.name,
                    t.ty.name(),
                    shape,
                    t.size,
                    shard_offset(&g, t),
                    shard(t)
                );
            }
        }
    }
    Ok(())
}

/// Where a tensor's bytes start in its own file (its shard, in a split model).
fn shard_offset(g: &GgufFile, t: &pocket_core::gguf::TensorInfo) -> u64 {
    g.shards()[t.shard].data_offset + t.offset
}

fn summary_json(s: &Summary) -> Value {
    let types: Map<String, Value> = s
        .tensor_types
        .iter()
        .map(|(ty, t)| (ty.name().to_string(), json!({"count": t.count, "bytes": t.bytes})))
        .collect();
    json!({
        "architecture": s.architecture,
        "name": s.name,
        "gguf_version": s.version,
        "file_bytes": s.file_bytes,
        "tensor_count": s.tensor_count,
        "parameter_count": s.parameter_count,
        "quantization": s.quantization,
        "tensor_types": types,
        "block_count": s.block_count,
        "context_length": s.context_length,
        "vocab_size": s.vocab_size,
        "embedding_length": s.embedding_length,
        "expert_count": s.expert_count,
        "expert_used_count": s.expert_used_count,
        "expert_bytes": s.expert_bytes,
        "has_chat_template": s.has_chat_template,
        "bytes_per_token_estimate": s.bytes_per_token_estimate,
        "ignored_tensors": s.ignored_tensors,
    })
}

fn print_human(s: &Summary, open_ms: f64) {
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    outln!("architecture      {}", s.architecture);
    outln!("name              {}", s.name.as_deref().unwrap_or("-"));
    outln!("file              {} (GGUF v{}, opened in {open_ms:.1} ms)", human_bytes(s.file_bytes), s.version);
    outln!("parameters        {} ({})", s.parameter_count, human_count(s.parameter_count));
    outln!("quantization      {}", s.quantization);
    outln!("tensors           {}", s.tensor_count);
    outln!("layers            {}", opt(s.block_count));
    outln!("context length    {}", opt(s.context_length));
    outln!("vocab size        {}", opt(s.vocab_size));
    outln!("embedding length  {}", opt(s.embedding_length));
    match (s.expert_count, s.expert_used_count) {
        (Some(n), Some(k)) => {
            outln!("experts           {k} of {n} per token ({} of expert weights)", human_bytes(s.expert_bytes))
        }
        _ => outln!("experts           - (dense)"),
    }
    outln!("chat template     {}", if s.has_chat_template { "yes" } else { "no" });
    outln!("bytes/token (est) {}", human_bytes(s.bytes_per_token_estimate));
    if !s.ignored_tensors.is_empty() {
        // Tensors a text model does not read (vision/audio towers, drafters).
        let shown: Vec<&str> = s.ignored_tensors.iter().take(8).map(String::as_str).collect();
        let more = s.ignored_tensors.len() - shown.len();
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        outln!("ignored           {} tensors, not read: {}{more}", s.ignored_tensors.len(), shown.join(", "));
    }
    outln!("\n{:<8} {:>7} {:>12}", "type", "tensors", "bytes");
    for (ty, t) in &s.tensor_types {
        outln!("{:<8} {:>7} {:>12}", ty.name(), t.count, human_bytes(t.bytes));
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {} ({b} bytes)", UNITS[u])
    }
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
