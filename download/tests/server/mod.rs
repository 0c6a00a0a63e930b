//! A fault-injecting HTTP/1.1 server for the download tests (std only:
//! `TcpListener`, one thread per connection, one request per connection).
//!
//! Each test gives a route function that sees the request (method, path,
//! `Range`, `If-Range`, how many requests that path had) and answers with a
//! [`Reply`]: a file served with or without range support, cut after some
//! bytes, with a corrupted byte, a Content-Length that lies, throttled; a
//! status; a redirect. Also used by the CLI's tests (included by path).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request as the route sees it.
#[derive(Clone, Debug)]
pub struct Req {
    pub method: String,
    pub path: String,
    /// The first byte of `Range: bytes=N-`.
    pub range_from: Option<u64>,
    pub if_range: Option<String>,
    pub authorization: Option<String>,
    /// Requests of this method and path before this one.
    pub nth: usize,
}

/// A file the server can send.
#[derive(Clone)]
pub struct Served {
    pub data: Arc<Vec<u8>>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    /// Answer `Range` with 206 (when `If-Range` matches or is absent).
    pub ranges: bool,
    /// Answer `Range` with 206 whatever `If-Range` says.
    pub ignore_if_range: bool,
    /// Close the connection after this many body bytes of this response.
    pub cut_after: Option<u64>,
    /// Never send the file's bytes from this absolute offset on (close there).
    pub cut_at: Option<u64>,
    /// Flip this absolute byte.
    pub corrupt_at: Option<u64>,
    /// Say this Content-Length (and send that many bytes) instead of the file's.
    pub claim_len: Option<u64>,
    /// Bytes per second (sent in 16 KiB slices).
    pub rate: Option<u64>,
}

impl Served {
    pub fn new(data: Arc<Vec<u8>>) -> Served {
        Served {
            data,
            etag: Some("\"v1\"".into()),
            last_modified: None,
            ranges: true,
            ignore_if_range: false,
            cut_after: None,
            cut_at: None,
            corrupt_at: None,
            claim_len: None,
            rate: None,
        }
    }
}

pub enum Reply {
    File(Served),
    Status(u16, Vec<(String, String)>),
    Redirect(u16, String),
}

type Route = dyn Fn(&Req) -> Reply + Send + Sync;

pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    pub log: Arc<Mutex<Vec<Req>>>,
}

impl Server {
    pub fn start(route: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let route: Arc<Route> = Arc::new(route);
        let counts = Arc::new(Mutex::new(HashMap::<(String, String), usize>::new()));
        let (stop2, log2) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (route, counts, log) = (route.clone(), counts.clone(), log2.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &*route, &counts, &log);
                });
            }
        });
        Server { addr, stop, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// GET requests seen for `path`.
    pub fn gets(&self, path: &str) -> Vec<Req> {
        self.log.lock().unwrap().iter().filter(|r| r.method == "GET" && r.path == path).cloned().collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(
    conn: TcpStream,
    route: &Route,
    counts: &Mutex<HashMap<(String, String), usize>>,
    log: &Mutex<Vec<Req>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (Some(method), Some(path)) = (words.next(), words.next()) else { return Ok(()) };
    let (method, path) = (method.to_string(), path.to_string());
    let mut range_from = None;
    let mut if_range = None;
    let mut authorization = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        let Some((name, value)) = h.split_once(':') else { continue };
        let value = value.trim().to_string();
        match name.trim().to_ascii_lowercase().as_str() {
            "range" => {
                range_from = value.strip_prefix("bytes=").and_then(|r| r.strip_suffix('-')).and_then(|n| n.parse().ok())
            }
            "if-range" => if_range = Some(value),
            "authorization" => authorization = Some(value),
            _ => {}
        }
    }
    let nth = {
        let mut c = counts.lock().unwrap();
        let n = c.entry((method.clone(), path.clone())).or_insert(0);
        *n += 1;
        *n - 1
    };
    let req = Req { method, path, range_from, if_range, authorization, nth };
    log.lock().unwrap().push(req.clone());
    let reply = route(&req);
    let mut out = conn;
    let head_only = req.method == "HEAD";
    match reply {
        Reply::Status(code, headers) => {
            let mut text = format!("HTTP/1.1 {code} Status\r\nContent-Length: 0\r\nConnection: close\r\n");
            for (k, v) in headers {
                text += &format!("{k}: {v}\r\n");
            }
            out.write_all(format!("{text}\r\n").as_bytes())
        }
        Reply::Redirect(code, location) => out.write_all(
            format!("HTTP/1.1 {code} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        ),
        Reply::File(f) => send_file(&mut out, &req, &f, head_only),
    }
}

fn send_file(out: &mut TcpStream, req: &Req, f: &Served, head_only: bool) -> std::io::Result<()> {
    let total = f.claim_len.unwrap_or(f.data.len() as u64);
    let validator_ok = match (&req.if_range, &f.etag, &f.last_modified) {
        _ if f.ignore_if_range => true,
        (None, _, _) => true,
        (Some(v), Some(e), _) if v == e => true,
        (Some(v), _, Some(m)) if v == m => true,
        _ => false,
    };
    let mut headers = String::from("Connection: close\r\nAccept-Ranges: bytes\r\n");
    if let Some(e) = &f.etag {
        headers += &format!("ETag: {e}\r\n");
    }
    if let Some(m) = &f.last_modified {
        headers += &format!("Last-Modified: {m}\r\n");
    }
    let start = match req.range_from {
        Some(from) if f.ranges && validator_ok => {
            if from >= total {
                return out.write_all(
                    format!("HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\n{headers}\r\n")
                        .as_bytes(),
                );
            }
            out.write_all(
                format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{total}\r\nContent-Length: {}\r\n{headers}\r\n",
                    total - 1,
                    total - from
                )
                .as_bytes(),
            )?;
            from
        }
        _ => {
            out.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n{headers}\r\n").as_bytes())?;
            0
        }
    };
    if head_only {
        return Ok(());
    }
    let mut end = total.min(f.data.len() as u64);
    if let Some(n) = f.cut_after {
        end = end.min(start + n);
    }
    if let Some(at) = f.cut_at {
        end = end.min(at.max(start));
    }
    let slice = if f.rate.is_some() { 16 * 1024 } else { 1 << 20 };
    let mut at = start;
    while at < end {
        let n = (end - at).min(slice);
        let mut piece = f.data[at as usize..(at + n) as usize].to_vec();
        if let Some(c) = f.corrupt_at {
            if (at..at + n).contains(&c) {
                piece[(c - at) as usize] ^= 0x5a;
            }
        }
        out.write_all(&piece)?;
        at += n;
        if let Some(rate) = f.rate {
            std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
        }
    }
    // A cut: close without the rest (the client sees fewer bytes than Content-Length).
    out.flush()?;
    let _ = out.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Deterministic bytes (an LCG), so that tests need no file on disk.
pub fn bytes(len: usize, seed: u64) -> Arc<Vec<u8>> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        v.extend_from_slice(&(x >> 16).to_le_bytes()[..(len - v.len()).min(6)]);
    }
    Arc::new(v)
}

/// The SHA-256 of `data` as hex (through the crate's own hasher).
pub fn sha256_hex(data: &[u8]) -> String {
    let mut h = pocket_download::sha256::Sha256::new();
    h.update(data);
    pocket_download::sha256::to_hex(&h.finish())
}

/// A fresh empty folder under the system's temporary folder.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pocket-dl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
