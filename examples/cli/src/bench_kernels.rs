//! `pocket bench-kernels`: matvec throughput per weight format and kernel
//! path, single- and multi-threaded, next to the machine's read bandwidth
//! measured in the same run (see `pocket_core::kernels::bench`).

use pocket_core::kernels::bench::{self, Case, Options, Report};
use pocket_core::kernels::Isa;
use pocket_core::quant::GgmlType;
use serde_json::json;
use std::io::Write;
use std::time::Duration;

/// Matvec throughput per weight format and kernel path, next to the read bandwidth
#[derive(clap::Args)]
pub struct Args {
    /// Pool size of the multi-threaded runs [default: every core]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<usize>,
    #[arg(long, value_name = "LIST", help = formats_help())]
    formats: Option<String>,
    /// Kernel paths to measure, comma-separated (e.g. scalar,avx2) [default: every path this CPU has]
    #[arg(long, value_name = "LIST")]
    isa: Option<String>,
    /// Minimum time per measurement, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = Options::default().min_time.as_millis() as u64)]
    #[arg(allow_negative_numbers = true)]
    time_ms: u64,
    /// MiB streamed per measurement cycle [default: three times the last-level cache, at least 512]
    #[arg(long, value_name = "MIB", allow_negative_numbers = true)]
    working_set_mib: Option<usize>,
    /// Rows of the head-sized matrix (2048 columns)
    #[arg(long, value_name = "N", default_value_t = Options::default().head_rows, allow_negative_numbers = true)]
    head_rows: usize,
    /// Activation rows per product: 1 measures decode (GB/s of weights), more
    /// a prompt's tokens meeting each matrix (prefill: G multiply-adds/s)
    #[arg(long, value_name = "N", default_value_t = 1, allow_negative_numbers = true)]
    tokens: usize,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

/// `--formats`' help, naming the default list from core.
fn formats_help() -> String {
    let names: Vec<&str> = Options::default().formats.iter().map(|t| t.name()).collect();
    format!("Weight formats to measure, comma-separated [default: {}]", names.join(","))
}

pub fn run(args: Args) -> Result<(), String> {
    let mut opts = Options::default();
    if let Some(n) = args.threads {
        opts.threads = n.max(1);
    }
    if let Some(list) = &args.formats {
        opts.formats = list
            .split(',')
            .map(|name| {
                GgmlType::all()
                    .find(|t| t.name().eq_ignore_ascii_case(name.trim()))
                    .filter(|&t| pocket_core::kernels::supports(t))
                    .ok_or_else(|| format!("--formats: no kernels for '{name}'"))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(list) = &args.isa {
        opts.isas = list
            .split(',')
            .map(|n| Isa::from_name(n).ok_or_else(|| format!("--isa: unknown path '{n}'")))
            .collect::<Result<_, _>>()?;
    }
    opts.min_time = Duration::from_millis(args.time_ms.max(1));
    if let Some(mib) = args.working_set_mib {
        opts.working_set = Some(mib << 20);
    }
    opts.head_rows = args.head_rows.max(1);
    opts.tokens = args.tokens.max(1);
    let json = args.json;
    let report = bench::run(&opts, |c| {
        if !json {
            eprint!(
                "\r{:<6} {:<16} {:<10} {} thread(s): {:6.1} GB/s {:7.1} GMAC/s   ",
                c.format, c.shape.name, c.isa, c.threads, c.gbps, c.gmacs
            );
            let _ = std::io::stderr().flush();
        }
    });
    if !json {
        eprint!("\r{:80}\r", "");
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&to_json(&report)).map_err(|e| e.to_string())?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn to_json(r: &Report) -> serde_json::Value {
    json!({
        "threads": r.threads,
        "working_set_bytes": r.working_set,
        "last_level_cache_bytes": r.last_level_cache,
        "read_gbps": {"1": r.read_gbps_1, "all": r.read_gbps_all},
        "tokens": r.tokens,
        "selected_isa": pocket_core::kernels::isa().name(),
        "cases": r.cases.iter().map(|c| json!({
            "format": c.format.name(),
            "isa": c.isa.name(),
            "shape": c.shape.name,
            "rows": c.shape.rows,
            "cols": c.shape.cols,
            "threads": c.threads,
            "gbps": c.gbps,
            "us_per_call": c.us_per_call,
            "gmacs": c.gmacs,
            "fraction_of_read_bw": c.gbps / if c.threads == 1 { r.read_gbps_1 } else { r.read_gbps_all },
        })).collect::<Vec<_>>(),
    })
}

fn print_table(r: &Report) {
    let mib = |b: usize| b >> 20;
    let prefill = r.tokens > 1;
    if prefill {
        outln!("{} tokens per product: G multiply-adds per second (weights x tokens)", r.tokens);
    }
    outln!(
        "{} throughput, GB/s of weight bytes (working set {} MiB{}; head {} rows)",
        if prefill { "and" } else { "matvec" },
        mib(r.working_set),
        r.last_level_cache.map_or(String::new(), |c| format!(", last-level cache {} MiB", mib(c))),
        r.cases.iter().find(|c| c.shape.name == "head").map_or(0, |c| c.shape.rows),
    );
    outln!(
        "read bandwidth (multi-threaded sum): 1 thread {:.1} GB/s, {} threads {:.1} GB/s",
        r.read_gbps_1,
        r.threads,
        r.read_gbps_all
    );
    outln!();
    outln!(
        "{:<6} {:<16} {:<11} {:>18} {:>18}",
        "format",
        "shape",
        "path",
        "1 thread",
        if r.threads > 1 { format!("{} threads", r.threads) } else { String::new() }
    );
    let mut last: Option<(GgmlType, &str)> = None;
    let find = |c: &Case, t: usize| {
        r.cases.iter().find(|d| d.format == c.format && d.shape == c.shape && d.isa == c.isa && d.threads == t)
    };
    for c in r.cases.iter().filter(|c| c.threads == 1) {
        let key = (c.format, c.shape.name);
        let (f, s) = if last == Some(key) { (String::new(), "") } else { (c.format.to_string(), c.shape.name) };
        last = Some(key);
        let cell = |d: Option<&Case>, bw: f64| match d {
            None => String::from("-"),
            Some(d) if prefill => format!("{:7.1} GMAC/s", d.gmacs),
            Some(d) => format!("{:6.1} ({:3.0}%)", d.gbps, 100.0 * d.gbps / bw),
        };
        outln!(
            "{:<6} {:<16} {:<11} {:>18} {:>18}",
            f,
            s,
            c.isa.name(),
            cell(Some(c), r.read_gbps_1),
            if r.threads > 1 { cell(find(c, r.threads), r.read_gbps_all) } else { String::new() },
        );
    }
    if !prefill {
        outln!("\n(percentages: of the read bandwidth with the same thread count)");
    }
}
