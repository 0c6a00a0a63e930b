//! `pocket bench-kernels`: matvec throughput per weight format and kernel
//! path, single- and multi-threaded, next to the machine's read bandwidth
//! measured in the same run (see `pocket_core::kernels::bench`).

use crate::args::{Args, Spec};
use pocket_core::kernels::bench::{self, Case, Options, Report};
use pocket_core::kernels::Isa;
use pocket_core::quant::GgmlType;
use serde_json::json;
use std::io::Write;
use std::time::Duration;

const SPEC: Spec = Spec {
    values: &["--threads", "--formats", "--isa", "--time-ms", "--working-set-mib", "--head-rows"],
    switches: &["--json"],
};

const USAGE: &str = "usage: pocket bench-kernels [--threads N] [--json] [--formats Q4_K,Q2_K,..] \
[--isa scalar,avx2,..] [--time-ms MS] [--working-set-mib MIB] [--head-rows N]";

pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &SPEC).map_err(|e| format!("{e}\n{USAGE}"))?;
    if !args.positional().is_empty() {
        return Err(USAGE.into());
    }
    let mut opts = Options::default();
    if let Some(n) = args.parsed::<usize>("--threads")? {
        opts.threads = n.max(1);
    }
    if let Some(list) = args.value("--formats") {
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
    if let Some(list) = args.value("--isa") {
        opts.isas = list
            .split(',')
            .map(|n| Isa::from_name(n).ok_or_else(|| format!("--isa: unknown path '{n}'")))
            .collect::<Result<_, _>>()?;
    }
    if let Some(ms) = args.parsed::<u64>("--time-ms")? {
        opts.min_time = Duration::from_millis(ms.max(1));
    }
    if let Some(mib) = args.parsed::<usize>("--working-set-mib")? {
        opts.working_set = Some(mib << 20);
    }
    if let Some(rows) = args.parsed::<usize>("--head-rows")? {
        opts.head_rows = rows.max(1);
    }
    let json = args.switch("--json");
    let report = bench::run(&opts, |c| {
        if !json {
            eprint!(
                "\r{:<6} {:<16} {:<10} {} thread(s): {:6.1} GB/s   ",
                c.format, c.shape.name, c.isa, c.threads, c.gbps
            );
            let _ = std::io::stderr().flush();
        }
    });
    if !json {
        eprint!("\r{:80}\r", "");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&to_json(&report)).map_err(|e| e.to_string())?);
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
            "fraction_of_read_bw": c.gbps / if c.threads == 1 { r.read_gbps_1 } else { r.read_gbps_all },
        })).collect::<Vec<_>>(),
    })
}

fn print_table(r: &Report) {
    let mib = |b: usize| b >> 20;
    println!(
        "matvec throughput, GB/s of weight bytes (working set {} MiB{}; head {} rows)",
        mib(r.working_set),
        r.last_level_cache.map_or(String::new(), |c| format!(", last-level cache {} MiB", mib(c))),
        r.cases.iter().find(|c| c.shape.name == "head").map_or(0, |c| c.shape.rows),
    );
    println!(
        "read bandwidth (multi-threaded sum): 1 thread {:.1} GB/s, {} threads {:.1} GB/s",
        r.read_gbps_1, r.threads, r.read_gbps_all
    );
    println!();
    println!(
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
        let cell = |d: Option<&Case>, bw: f64| {
            d.map_or(String::from("-"), |d| format!("{:6.1} ({:3.0}%)", d.gbps, 100.0 * d.gbps / bw))
        };
        println!(
            "{:<6} {:<16} {:<11} {:>18} {:>18}",
            f,
            s,
            c.isa.name(),
            cell(Some(c), r.read_gbps_1),
            if r.threads > 1 { cell(find(c, r.threads), r.read_gbps_all) } else { String::new() },
        );
    }
    println!("\n(percentages: of the read bandwidth with the same thread count)");
}
