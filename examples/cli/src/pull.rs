//! `pocket pull`: download a model file (or the shards of one), resumable and
//! verified (pocket-download). A killed or failed pull resumes from
//! `DEST.part` when run again.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use pocket_download::sha256::to_hex;
use pocket_download::{Cancel, Options, Progress, Request};
use serde_json::json;

/// Download a model file (or the shards of one), resumable and verified by SHA-256
#[derive(clap::Args)]
#[command(after_help = "hf://OWNER/REPO/FILE[@REVISION] is the hub's resolve URL (HF_ENDPOINT, default \
    https://huggingface.co; HF_TOKEN for gated repositories).\nSeveral URLs are the parts of one model: \
    -o names their folder, each saved under its URL's file name.\nA pull that was killed or failed resumes \
    from PATH.part when run again.")]
pub struct Args {
    /// https://, http:// or hf://OWNER/REPO/FILE[@REVISION]; repeat for the parts of one model
    #[arg(value_name = "URL", required = true)]
    urls: Vec<String>,
    /// The expected SHA-256 of each URL's file, in the same order (repeat with the URLs)
    #[arg(long = "sha256", value_name = "HEX")]
    sha256: Vec<String>,
    /// Accept the files without an expected hash (nothing checks their bytes)
    #[arg(long, conflicts_with = "sha256")]
    no_verify: bool,
    /// The file to write (several URLs: the folder that receives them)
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    output: PathBuf,
    /// Progress as JSON lines on stdout, then one line for the result (or the error)
    #[arg(long)]
    json: bool,
    /// Failed attempts in a row (no byte received between them) before giving up
    #[arg(long, value_name = "N", default_value_t = 8)]
    retries: u32,
}

pub fn run(a: Args) -> Result<(), String> {
    let json_out = a.json;
    let result = pull(a);
    if let Err((kind, reason)) = &result {
        if json_out {
            // A closed pipe must not hide the failure: the status says it.
            let _ = writeln!(std::io::stdout(), "{}", json!({"event": "error", "kind": kind, "reason": reason}));
        }
    }
    result.map_err(|(kind, reason)| format!("pull: {kind} error: {reason}"))
}

fn pull(a: Args) -> Result<(), (&'static str, String)> {
    let request = Request::from_lists(&a.urls, &a.sha256, a.output.clone(), a.no_verify, "--no-verify")
        .map_err(|e| (e.kind(), e.reason()))?;
    let options = Options { retries: a.retries, ..Options::default() };
    let bar = !a.json && std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut on_progress = |p: Progress| {
        if a.json {
            let line = json!({"event": "progress", "done": p.done, "total": p.total,
                              "bytes_per_second": p.bytes_per_second.round()});
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        } else if bar {
            eprint!("\r{}", bar_line(&p));
        }
    };
    let result = pocket_download::download(&request, &options, &Cancel::new(), &mut on_progress);
    if bar {
        eprintln!();
    }
    let out = result.map_err(|e| (e.kind(), e.reason()))?;
    let seconds = start.elapsed().as_secs_f64();
    let paths: Vec<String> = out.paths.iter().map(|p| p.display().to_string()).collect();
    let hashes: Vec<String> = out.sha256.iter().map(to_hex).collect();
    if a.json {
        outln!(
            "{}",
            json!({"event": "done", "paths": paths, "sha256": hashes, "bytes": out.total_bytes,
                   "received_bytes": out.received_bytes, "resumed_bytes": out.resumed_bytes,
                   "reread_bytes": out.reread_bytes, "retries": out.retries, "restarts": out.restarts,
                   "seconds": (seconds * 1000.0).round() / 1000.0, "verified": !a.no_verify})
        );
    } else {
        for (p, h) in paths.iter().zip(&hashes) {
            outln!("{p}  sha256 {h}{}", if a.no_verify { " (not verified)" } else { " (verified)" });
        }
        let mb = out.received_bytes as f64 / 1e6;
        eprintln!(
            "{:.1} MB received in {seconds:.1} s ({:.1} MB/s); {} bytes resumed, {} re-read, {} retries",
            mb,
            mb / seconds.max(1e-9),
            out.resumed_bytes,
            out.reread_bytes,
            out.retries
        );
    }
    Ok(())
}

/// `[#########...........]  45.2%  1.23 / 2.70 GB  85.3 MB/s  ETA 0:17`
fn bar_line(p: &Progress) -> String {
    let gb = |b: u64| b as f64 / 1e9;
    let rate = format!("{:.1} MB/s", p.bytes_per_second / 1e6);
    if p.total == 0 {
        return format!("{:.2} GB  {rate}          ", gb(p.done));
    }
    let frac = (p.done as f64 / p.total as f64).clamp(0.0, 1.0);
    let width = 30;
    let filled = (frac * width as f64).round() as usize;
    let eta = if p.bytes_per_second > 0.0 {
        let s = ((p.total - p.done.min(p.total)) as f64 / p.bytes_per_second) as u64;
        format!("ETA {}:{:02}", s / 60, s % 60)
    } else {
        "ETA --".into()
    };
    format!(
        "[{}{}] {:5.1}%  {:.2} / {:.2} GB  {rate}  {eta}   ",
        "#".repeat(filled),
        ".".repeat(width - filled),
        frac * 100.0,
        gb(p.done),
        gb(p.total)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_shows_fraction_sizes_rate_and_eta() {
        let p = Progress { done: 1_230_000_000, total: 2_700_000_000, bytes_per_second: 85_300_000.0 };
        let line = bar_line(&p);
        assert!(
            line.starts_with("[##############................]  45.6%  1.23 / 2.70 GB  85.3 MB/s  ETA 0:17"),
            "{line}"
        );
        let unknown = bar_line(&Progress { done: 5_000_000, total: 0, bytes_per_second: 0.0 });
        assert!(unknown.starts_with("0.01 GB  0.0 MB/s"), "{unknown}");
    }
}
