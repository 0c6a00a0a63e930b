//! Downloads against a local fault-injecting server: every case ends in a
//! verified file or in its typed error, and the destination never holds an
//! unverified file.

mod server;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pocket_download::{download, Cancel, Error, Options, Outcome, Part, Progress, Request};
use server::{bytes, sha256_hex, temp_dir, Reply, Served, Server};

/// Quick retries, so that the fault cases take milliseconds.
fn fast() -> Options {
    Options {
        retries: 4,
        backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        read_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        progress_interval: Duration::from_millis(20),
        use_env_proxy: false,
        ..Options::default()
    }
}

fn request(urls: &[String], hashes: &[&str], dest: &Path) -> Request {
    Request {
        parts: urls.iter().zip(hashes).map(|(u, h)| Part::new(u.clone(), Some(h)).unwrap()).collect(),
        destination: dest.to_path_buf(),
        allow_unverified: false,
    }
}

/// Download, checking at every progress report that the destination does not exist yet.
fn fetch(req: &Request, opts: &Options) -> Result<Outcome, Error> {
    let dests = pocket_download::destinations(req).unwrap();
    let existed: Vec<bool> = dests.iter().map(|d| d.exists()).collect();
    download(req, opts, &Cancel::new(), &mut |p| {
        // (The last report comes once every part is verified and in place.)
        let finished = p.total > 0 && p.done == p.total;
        for (d, e) in dests.iter().zip(&existed) {
            assert!(*e || finished || !d.exists(), "{} exists before the download is verified", d.display());
        }
    })
}

fn no_leftovers(dest: &Path) {
    for suffix in [".part", ".part.meta", ".part.meta.tmp", ".part.lock"] {
        let p = PathBuf::from(format!("{}{suffix}", dest.display()));
        assert!(!p.exists(), "{} left behind", p.display());
    }
}

fn file_server(data: Arc<Vec<u8>>) -> Server {
    Server::start(move |_| Reply::File(Served::new(data.clone())))
}

#[test]
fn a_plain_download_is_verified_and_renamed() {
    let data = bytes(3_000_000, 1);
    let server = file_server(data.clone());
    let dir = temp_dir("plain");
    let dest = dir.join("m.gguf");
    let out = fetch(&request(&[server.url("/m.gguf")], &[&sha256_hex(&data)], &dest), &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert_eq!(out.paths, std::slice::from_ref(&dest));
    assert_eq!((out.total_bytes, out.received_bytes, out.reread_bytes), (3_000_000, 3_000_000, 0));
    no_leftovers(&dest);
    // Again: the destination already holds it, so nothing is fetched (it is re-hashed).
    let gets = server.gets("/m.gguf").len();
    let again = fetch(&request(&[server.url("/m.gguf")], &[&sha256_hex(&data)], &dest), &fast()).unwrap();
    assert_eq!((again.received_bytes, again.reread_bytes), (0, 3_000_000));
    assert_eq!(server.gets("/m.gguf").len(), gets);
}

#[test]
fn dropped_connections_at_random_offsets_resume() {
    let data = bytes(4_000_000, 2);
    // Each response stops after a pseudo-random 50..350 KB.
    let seed = Arc::new(AtomicU64::new(12345));
    let d2 = data.clone();
    let server = Server::start(move |req| {
        let x = seed.fetch_add(0x9e3779b97f4a7c15, Ordering::SeqCst).wrapping_mul(0xff51afd7ed558ccd) >> 33;
        let mut f = Served::new(d2.clone());
        if req.method == "GET" {
            f.cut_after = Some(50_000 + x % 300_000);
        }
        Reply::File(f)
    });
    let dir = temp_dir("drops");
    let dest = dir.join("m.gguf");
    let opts = Options { retries: 2, ..fast() };
    let out = fetch(&request(&[server.url("/m.gguf")], &[&sha256_hex(&data)], &dest), &opts).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    let gets = server.gets("/m.gguf");
    assert!(gets.len() >= 12, "{} requests", gets.len());
    assert_eq!(out.retries as usize, gets.len() - 1);
    // Every request after the first resumed where the previous one stopped, with the validator.
    assert!(gets[1..].iter().all(|r| r.range_from.is_some() && r.if_range.as_deref() == Some("\"v1\"")));
    assert_eq!(out.received_bytes, 4_000_000);
    no_leftovers(&dest);
}

#[test]
fn a_server_that_ignores_range_restarts_cleanly() {
    let data = bytes(2_000_000, 3);
    let d2 = data.clone();
    let server = Server::start(move |req| {
        let mut f = Served::new(d2.clone());
        f.ranges = false;
        if req.method == "GET" && req.nth == 0 {
            f.cut_after = Some(700_000);
        }
        Reply::File(f)
    });
    let dir = temp_dir("norange");
    let dest = dir.join("m.gguf");
    let out = fetch(&request(&[server.url("/m.gguf")], &[&sha256_hex(&data)], &dest), &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert_eq!(out.restarts, 1);
    assert_eq!(out.received_bytes, 2_700_000);
    no_leftovers(&dest);
}

#[test]
fn service_unavailable_then_ok() {
    let data = bytes(500_000, 4);
    let d2 = data.clone();
    let server = Server::start(move |req| {
        if req.method == "GET" && req.nth < 2 {
            return Reply::Status(503, vec![("Retry-After".into(), "0".into())]);
        }
        Reply::File(Served::new(d2.clone()))
    });
    let dir = temp_dir("503");
    let dest = dir.join("m.gguf");
    let out = fetch(&request(&[server.url("/m.gguf")], &[&sha256_hex(&data)], &dest), &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert_eq!(out.retries, 2);
    // Always 503: a network error after the retries, nothing at the destination.
    let always = Server::start(|_| Reply::Status(503, vec![]));
    let e = fetch(&request(&[always.url("/m.gguf")], &[&sha256_hex(&data)], &dir.join("x")), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Network(r) if r.contains("503")), "{e}");
    assert!(!dir.join("x").exists());
}

#[test]
fn a_redirect_chain_is_followed() {
    let data = bytes(1_000_000, 5);
    let d2 = data.clone();
    let server = Server::start(move |req| match req.path.as_str() {
        "/a" => Reply::Redirect(302, "/b/c".into()),
        "/b/c" => Reply::Redirect(307, "d?sig=1".into()),
        "/b/d?sig=1" => Reply::Redirect(301, "/files/m.gguf".into()),
        "/files/m.gguf" => Reply::File(Served::new(d2.clone())),
        "/loop" => Reply::Redirect(302, "/loop".into()),
        _ => Reply::Status(404, vec![]),
    });
    let dir = temp_dir("redirect");
    let dest = dir.join("m.gguf");
    fetch(&request(&[server.url("/a")], &[&sha256_hex(&data)], &dest), &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    let e = fetch(&request(&[server.url("/loop")], &[&sha256_hex(&data)], &dir.join("l")), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Network(r) if r.contains("redirects")), "{e}");
}

#[test]
fn a_corrupted_byte_is_an_integrity_error_and_nothing_is_kept() {
    let data = bytes(1_500_000, 6);
    let d2 = data.clone();
    let server = Server::start(move |_| Reply::File(Served { corrupt_at: Some(1_234_567), ..Served::new(d2.clone()) }));
    let dir = temp_dir("corrupt");
    let dest = dir.join("m.gguf");
    let e = fetch(&request(&[server.url("/m.gguf")], &[&sha256_hex(&data)], &dest), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Integrity(r) if r.contains("SHA-256")), "{e}");
    assert!(!dest.exists());
    no_leftovers(&dest);
}

#[test]
fn a_truncated_body_is_resumed_or_refused() {
    let data = bytes(1_000_000, 7);
    let hash = sha256_hex(&data);
    let dir = temp_dir("truncated");
    // The connection always closes at byte 600 000: retried, then a network error; the
    // partial file stays for a later resume.
    let d2 = data.clone();
    let server = Server::start(move |_| Reply::File(Served { cut_at: Some(600_000), ..Served::new(d2.clone()) }));
    let dest = dir.join("cut.gguf");
    let e = fetch(&request(&[server.url("/m")], &[&hash], &dest), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Network(r) if r.contains("at byte 600000 of 1000000")), "{e}");
    assert!(!dest.exists());
    assert_eq!(std::fs::metadata(dir.join("cut.gguf.part")).unwrap().len(), 600_000);
    // A proxy that serves a shorter file with a matching Content-Length: the hash says no.
    let d3 = data.clone();
    let short = Server::start(move |_| Reply::File(Served { claim_len: Some(999_000), ..Served::new(d3.clone()) }));
    let dest = dir.join("short.gguf");
    let e = fetch(&request(&[short.url("/m")], &[&hash], &dest), &fast()).unwrap_err();
    assert!(matches!(e, Error::Integrity(_)), "{e}");
    assert!(!dest.exists());
    no_leftovers(&dest);
}

#[test]
fn resuming_a_truncated_download_from_the_same_url() {
    let data = bytes(1_000_000, 8);
    let hash = sha256_hex(&data);
    let healthy = Arc::new(Mutex::new(false));
    let (d2, h2) = (data.clone(), healthy.clone());
    let server = Server::start(move |_| {
        let cut = if *h2.lock().unwrap() { None } else { Some(600_000) };
        Reply::File(Served { cut_at: cut, ..Served::new(d2.clone()) })
    });
    let dir = temp_dir("resume-cut");
    let dest = dir.join("m.gguf");
    let req = request(&[server.url("/m")], &[&hash], &dest);
    assert!(matches!(fetch(&req, &fast()), Err(Error::Network(_))));
    *healthy.lock().unwrap() = true;
    let out = fetch(&req, &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert_eq!((out.resumed_bytes, out.received_bytes), (600_000, 400_000));
    // The hash state was saved after the last bytes of the failed run: almost nothing re-read.
    assert!(out.reread_bytes < 64, "re-read {}", out.reread_bytes);
    no_leftovers(&dest);
}

#[test]
fn not_found_is_a_network_error_before_anything_is_written() {
    let server = Server::start(|_| Reply::Status(404, vec![]));
    let dir = temp_dir("404");
    let dest = dir.join("m.gguf");
    let e = fetch(&request(&[server.url("/m.gguf")], &["00".repeat(32).as_str()], &dest), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Network(r) if r.contains("404")), "{e}");
    assert!(!dest.exists());
    no_leftovers(&dest);
    assert_eq!(server.gets("/m.gguf").len(), 0, "the HEAD probe failed first");
}

#[test]
fn a_file_changed_on_the_server_starts_over() {
    let old = bytes(2_000_000, 9);
    let new = bytes(2_100_000, 10);
    // The first GET is cut at 800 KB; then the file is replaced (new ETag).
    let (o2, n2) = (old.clone(), new.clone());
    let serve = move |req: &server::Req| {
        if req.method == "GET" && req.nth == 0 {
            return Reply::File(Served { cut_after: Some(800_000), ..Served::new(o2.clone()) });
        }
        Reply::File(Served { etag: Some("\"v2\"".into()), ..Served::new(n2.clone()) })
    };
    let dir = temp_dir("changed");
    // Expecting the new file: If-Range fails, the server sends it whole, it verifies.
    let server = Server::start(serve.clone());
    let dest = dir.join("new.gguf");
    let out = fetch(&request(&[server.url("/m")], &[&sha256_hex(&new)], &dest), &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *new);
    assert_eq!(out.restarts, 1);
    let gets = server.gets("/m");
    assert_eq!((gets[1].range_from, gets[1].if_range.as_deref()), (Some(800_000), Some("\"v1\"")));
    no_leftovers(&dest);
    // Expecting the old one: the new file does not match, an integrity error.
    let server = Server::start(serve);
    let dest = dir.join("old.gguf");
    let e = fetch(&request(&[server.url("/m")], &[&sha256_hex(&old)], &dest), &fast()).unwrap_err();
    assert!(matches!(e, Error::Integrity(_)), "{e}");
    assert!(!dest.exists());
    no_leftovers(&dest);

    // A server that ignores If-Range and sends the new file's range anyway: its ETag gives it away.
    let (o3, n3) = (old.clone(), new.clone());
    let sloppy = Server::start(move |req| {
        if req.method == "GET" && req.nth == 0 {
            return Reply::File(Served { cut_after: Some(800_000), ..Served::new(o3.clone()) });
        }
        // Whatever If-Range says, a range of the new file.
        Reply::File(Served { etag: Some("\"v2\"".into()), ignore_if_range: true, ..Served::new(n3.clone()) })
    });
    let dest = dir.join("sloppy.gguf");
    let out = fetch(&request(&[sloppy.url("/m")], &[&sha256_hex(&new)], &dest), &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *new);
    assert_eq!(out.restarts, 1);
}

#[test]
fn not_enough_space_is_a_storage_error_before_the_download() {
    let data = bytes(1000, 11);
    let d2 = data.clone();
    // The server claims an exabyte.
    let server = Server::start(move |_| Reply::File(Served { claim_len: Some(1 << 60), ..Served::new(d2.clone()) }));
    let dir = temp_dir("space");
    let dest = dir.join("m.gguf");
    let e = fetch(&request(&[server.url("/m")], &[&sha256_hex(&data)], &dest), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Storage(r) if r.contains("free")), "{e}");
    assert!(server.gets("/m").is_empty());
    assert!(!dest.exists());
    no_leftovers(&dest);
}

#[test]
fn parts_download_as_one_with_one_progress() {
    let shards: Vec<Arc<Vec<u8>>> = (0..3).map(|i| bytes(700_000 + i * 100_000, 20 + i as u64)).collect();
    let s2 = shards.clone();
    let server = Server::start(move |req| {
        let i = ["/m-00001-of-00003.gguf", "/m-00002-of-00003.gguf", "/m-00003-of-00003.gguf"]
            .iter()
            .position(|p| *p == req.path);
        match i {
            Some(i) => Reply::File(Served { rate: Some(8_000_000), ..Served::new(s2[i].clone()) }),
            None => Reply::Status(404, vec![]),
        }
    });
    let dir = temp_dir("parts");
    let urls: Vec<String> = (1..=3).map(|i| server.url(&format!("/m-0000{i}-of-00003.gguf"))).collect();
    let hashes: Vec<String> = shards.iter().map(|s| sha256_hex(s)).collect();
    let hashes: Vec<&str> = hashes.iter().map(String::as_str).collect();
    let req = request(&urls, &hashes, &dir.join("model"));
    let seen = Mutex::new(Vec::<Progress>::new());
    let out = download(&req, &fast(), &Cancel::new(), &mut |p| {
        // No shard is in place before all are verified.
        assert!(!dir.join("model/m-00001-of-00003.gguf").exists() || p.done == 2_400_000);
        seen.lock().unwrap().push(p);
    })
    .unwrap();
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(std::fs::read(&out.paths[i]).unwrap(), **s);
        no_leftovers(&out.paths[i]);
    }
    let seen = seen.into_inner().unwrap();
    assert!(seen.iter().all(|p| p.total == 2_400_000), "one total for all parts");
    assert!(seen.windows(2).all(|w| w[0].done <= w[1].done), "done only grows");
    assert_eq!(seen.last().unwrap().done, 2_400_000);
    // Throttled: about 0.3 s of transfer at 20 ms reports.
    assert!(seen.len() < 40, "{} reports", seen.len());
    assert!(seen.iter().any(|p| p.bytes_per_second > 1e6));
    // A wrong hash for one shard: an integrity error, and no shard is put in place.
    let dir2 = temp_dir("parts-bad");
    let mut bad = hashes.clone();
    bad[2] = hashes[0];
    let e = fetch(&request(&urls, &bad, &dir2), &fast()).unwrap_err();
    assert!(matches!(&e, Error::Integrity(r) if r.contains("00003")), "{e}");
    assert!(!dir2.join("m-00001-of-00003.gguf").exists());
}

#[test]
fn a_cancelled_download_resumes_from_its_partial_file() {
    let data = bytes(8_000_000, 30);
    let d2 = data.clone();
    let server = Server::start(move |_| Reply::File(Served { rate: Some(10_000_000), ..Served::new(d2.clone()) }));
    let dir = temp_dir("cancel");
    let dest = dir.join("m.gguf");
    let req = request(&[server.url("/m")], &[&sha256_hex(&data)], &dest);
    let cancel = Cancel::new();
    let c2 = cancel.clone();
    let t = Instant::now();
    let e = download(&req, &fast(), &cancel, &mut |p| {
        if p.done > 2_000_000 {
            c2.cancel();
        }
    })
    .unwrap_err();
    assert_eq!(e, Error::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(!dest.exists());
    let had = std::fs::metadata(dir.join("m.gguf.part")).unwrap().len();
    assert!(had >= 2_000_000);
    let out = fetch(&req, &fast()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert_eq!(out.resumed_bytes, had);
    assert!(out.reread_bytes < had / 10, "re-read {} of {had}", out.reread_bytes);
    no_leftovers(&dest);
}

#[test]
fn a_download_restarted_while_the_cancelled_one_winds_down_waits_for_it() {
    let data = bytes(6_000_000, 33);
    let d2 = data.clone();
    let server = Server::start(move |_| Reply::File(Served { rate: Some(8_000_000), ..Served::new(d2.clone()) }));
    let dir = temp_dir("restart");
    let dest = dir.join("m.gguf");
    let req = request(&[server.url("/m")], &[&sha256_hex(&data)], &dest);
    let cancel = Cancel::new();
    let (c2, r2) = (cancel.clone(), req.clone());
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let first = std::thread::spawn(move || {
        download(&r2, &fast(), &c2, &mut |p| {
            if p.done > 1_000_000 {
                let _ = started_tx.send(());
            }
        })
    });
    started_rx.recv().unwrap();
    // Cancel and start again at once, as a Cancel-then-Resume tap does: the
    // first thread may still be writing its partial file.
    cancel.cancel();
    let second = std::thread::spawn({
        let req = req.clone();
        move || download(&req, &fast(), &Cancel::new(), &mut |_| {})
    });
    assert_eq!(first.join().unwrap().unwrap_err(), Error::Cancelled);
    let out = second.join().unwrap().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    assert!(out.resumed_bytes > 0, "the second download resumes the first one's partial file");
    no_leftovers(&dest);
    // Two at once: the second waits, then finds the verified file in place.
    std::fs::remove_file(&dest).unwrap();
    let both: Vec<_> = (0..2)
        .map(|_| {
            let req = req.clone();
            std::thread::spawn(move || download(&req, &fast(), &Cancel::new(), &mut |_| {}))
        })
        .collect();
    let outs: Vec<Outcome> = both.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    assert_eq!(outs.iter().map(|o| o.received_bytes).sum::<u64>(), 6_000_000, "the file is fetched once");
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
    no_leftovers(&dest);
}

#[test]
fn unverified_files_need_the_caller_s_consent() {
    let data = bytes(10_000, 31);
    let server = file_server(data.clone());
    let dir = temp_dir("unverified");
    let dest = dir.join("m.gguf");
    let mut req = Request {
        parts: vec![Part::new(server.url("/m"), None).unwrap()],
        destination: dest.clone(),
        allow_unverified: false,
    };
    assert!(matches!(fetch(&req, &fast()), Err(Error::InvalidArgument(_))));
    req.allow_unverified = true;
    let out = fetch(&req, &fast()).unwrap();
    assert_eq!(pocket_download::sha256::to_hex(&out.sha256[0]), sha256_hex(&data));
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
}

#[test]
fn last_modified_serves_as_the_validator_without_an_etag() {
    let data = bytes(900_000, 32);
    let d2 = data.clone();
    let server = Server::start(move |req| {
        let mut f = Served::new(d2.clone());
        f.etag = Some("W/\"weak\"".into());
        f.last_modified = Some("Tue, 01 Jul 2025 00:00:00 GMT".into());
        if req.method == "GET" && req.nth == 0 {
            f.cut_after = Some(300_000);
        }
        Reply::File(f)
    });
    let dir = temp_dir("lastmod");
    let dest = dir.join("m.gguf");
    let out = fetch(&request(&[server.url("/m")], &[&sha256_hex(&data)], &dest), &fast()).unwrap();
    assert_eq!(out.restarts, 0);
    assert_eq!(server.gets("/m")[1].if_range.as_deref(), Some("Tue, 01 Jul 2025 00:00:00 GMT"));
}
