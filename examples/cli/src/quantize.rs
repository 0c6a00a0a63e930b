//! `pocket quantize`: a GGUF file to another type, with llama-quantize's
//! presets and per-tensor mix, optionally weighted by an importance matrix
//! (`pocket imatrix`, or llama-imatrix's GGUF or legacy `.dat`).

use std::path::Path;
use std::time::Instant;

use pocket_core::gguf::GgufFile;
use pocket_core::quantize::file::{plan, quantize_file, Options, Planned, Report};
use pocket_core::quantize::imatrix::Imatrix;
use pocket_core::quantize::mix::FileType;
use serde_json::json;

/// Quantise a model file (IN.gguf -> OUT.gguf) to a preset TYPE
#[derive(clap::Args)]
#[command(after_help = format!("TYPE is one of: {}\n(Q3_K, Q4_K, Q5_K: their _M mixes.) \
    IQ1_S, IQ2_XXS, IQ2_XS (and most tensors of IQ1_M, IQ2_S, IQ2_M, IQ3_XXS) need --imatrix.",
    FileType::all().map(FileType::name).collect::<Vec<_>>().join(", ")))]
pub struct Args {
    /// The model to read (F32, F16, BF16; quantised with --allow-requantize)
    #[arg(value_name = "IN.gguf")]
    input: String,
    /// The file to write (replaced only when complete)
    #[arg(value_name = "OUT.gguf")]
    output: String,
    /// The preset: Q4_K_M, Q2_K, IQ2_XXS, ... (see below)
    #[arg(value_name = "TYPE", value_parser = parse_file_type)]
    ftype: FileType,
    /// Importance matrix: pocket imatrix's or llama-imatrix's (GGUF or legacy .dat)
    #[arg(long, value_name = "FILE")]
    imatrix: Option<String>,
    /// Convert tensors that are already quantised (their errors add up)
    #[arg(long)]
    allow_requantize: bool,
    /// Worker threads [default: every core]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<usize>,
    /// Print each tensor's type and the output size; write nothing
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object at the end instead of the summary line
    #[arg(long)]
    json: bool,
}

fn parse_file_type(s: &str) -> Result<FileType, String> {
    FileType::from_name(s).ok_or_else(|| {
        let all: Vec<_> = FileType::all().map(FileType::name).collect();
        format!("'{s}' is not a quantisation type (one of {})", all.join(", "))
    })
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn line(i: usize, n: usize, p: &Planned) -> String {
    let dims: Vec<String> = p.dims.iter().map(u64::to_string).collect();
    let what = if p.converted() {
        let w = if p.weighted { ", weighted" } else { "" };
        format!("{} -> {}{w}  {:.2} -> {:.2} MiB", p.from, p.to, mib(p.bytes(p.from)), mib(p.bytes(p.to)))
    } else {
        format!("{} kept  {:.2} MiB", p.from, mib(p.bytes(p.from)))
    };
    format!("[{:>4}/{n:>4}] {:<36} [{}]  {what}", i + 1, p.name, dims.join(" x "))
}

pub fn run(a: Args) -> Result<(), String> {
    // Every core: rows are handed out from a queue, so little cores add to
    // the throughput instead of holding a barrier up.
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    if Path::new(&a.input) == Path::new(&a.output) {
        return Err("IN and OUT are the same file".into());
    }
    let imatrix = match &a.imatrix {
        Some(f) => Some((Imatrix::read(f).map_err(|e| format!("{f}: {e}"))?, f.clone())),
        None => None,
    };
    let opts = Options {
        ftype: a.ftype,
        imatrix: imatrix.as_ref().map(|(m, f)| (m, f.clone())),
        allow_requantize: a.allow_requantize,
        threads,
    };
    let t0 = Instant::now();
    let report = if a.dry_run {
        let src = GgufFile::open(&a.input).map_err(|e| format!("{}: {e}", a.input))?;
        let (planned, fallbacks) = plan(&src, &opts).map_err(|e| format!("{}: {e}", a.input))?;
        for (i, p) in planned.iter().enumerate() {
            eprintln!("{}", line(i, planned.len(), p));
        }
        Report::of(&planned, fallbacks)
    } else {
        quantize_file(Path::new(&a.input), Path::new(&a.output), &opts, &mut |i, n, p| eprintln!("{}", line(i, n, p)))
            .map_err(|e| format!("{}: {e}", a.input))?
    };
    let secs = t0.elapsed().as_secs_f64();
    let bpw = report.bytes_out as f64 * 8.0 / report.weights.max(1) as f64;
    if a.json {
        outln!(
            "{}",
            json!({
                "type": a.ftype.name(), "tensors": report.tensors, "converted": report.converted,
                "fallbacks": report.fallbacks, "bytes_in": report.bytes_in, "bytes_out": report.bytes_out,
                "bits_per_weight": bpw, "seconds": secs, "threads": threads, "dry_run": a.dry_run,
                "imatrix": a.imatrix,
            })
        );
    } else {
        if report.fallbacks > 0 {
            eprintln!(
                "{} tensor(s) have rows that are not whole {} blocks: given the nearest type that fits, as llama-quantize does",
                report.fallbacks,
                a.ftype.default_type()
            );
        }
        let done = if a.dry_run { "would quantise" } else { "quantised" };
        outln!(
            "{done} {} of {} tensors to {}: {:.2} MiB -> {:.2} MiB ({bpw:.2} bits per weight) in {secs:.1} s",
            report.converted,
            report.tensors,
            a.ftype.name(),
            mib(report.bytes_in),
            mib(report.bytes_out)
        );
    }
    Ok(())
}
