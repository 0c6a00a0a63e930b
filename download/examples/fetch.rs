//! `cargo run --release -p pocket-download --example fetch -- URL SHA256|- DEST`:
//! one download through the library, for measurements
//! (`scripts/download-bench.py` compares it with `curl -o`). Prints one JSON
//! line: seconds, bytes, and what was received, resumed and re-read.

use std::time::Instant;

use pocket_download::{download, Cancel, Options, Part, Request};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, sha, dest] = args.as_slice() else {
        eprintln!("usage: fetch URL SHA256|- DEST");
        std::process::exit(2);
    };
    let sha = (sha != "-").then_some(sha.as_str());
    let request = Request {
        parts: vec![Part::new(url.clone(), sha).unwrap_or_else(|e| fail(e))],
        destination: dest.into(),
        allow_unverified: sha.is_none(),
    };
    let t = Instant::now();
    let out = download(&request, &Options::default(), &Cancel::new(), &mut |_| {}).unwrap_or_else(|e| fail(e));
    let s = t.elapsed().as_secs_f64();
    println!(
        "{{\"seconds\": {s:.3}, \"bytes\": {}, \"received\": {}, \"resumed\": {}, \"reread\": {}, \"sha256\": \"{}\"}}",
        out.total_bytes,
        out.received_bytes,
        out.resumed_bytes,
        out.reread_bytes,
        pocket_download::sha256::to_hex(&out.sha256[0])
    );
}

fn fail(e: pocket_download::Error) -> ! {
    eprintln!("fetch: {e}");
    std::process::exit(1);
}
