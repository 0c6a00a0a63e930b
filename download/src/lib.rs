//! pocket-download: resumable, verified downloads of model files (one file,
//! or the shards of one model as one download), for Pocket's bindings and
//! CLI. The engine (pocket-core) has no network code; this crate has nothing
//! of the engine.
//!
//! What a download guarantees:
//! - **Verified or nothing.** Bytes go to `DEST.part`; the SHA-256 is computed
//!   as they arrive and the size checked against the server's. Only a part
//!   whose hash matches the expected one becomes `DEST`, by an fsync'ed
//!   rename (the shards of a multi-part download are renamed once all are
//!   verified). A mismatch deletes the partial file and is
//!   [`Error::Integrity`]. An expected hash is required unless the request
//!   allows an unverified file.
//! - **Resumable.** A dropped connection, a 5xx or 429, a stalled read are
//!   retried with backoff from where the partial file ends (`Range`, with
//!   `If-Range` on the server's validator: a strong ETag, else
//!   Last-Modified). A server that ignores `Range` (200) or whose file changed
//!   (a new validator) starts the part over. A cancelled or killed download
//!   resumes from `DEST.part`; the sidecar `DEST.part.meta` keeps the hash
//!   state of a synced prefix, so at most 1/32 of what was downloaded (and
//!   at least 1 MiB) is read back from disk to resume.
//! - **Redirects** are followed (10 at most), never from https to http.
//! - **Free space** is checked before the download starts.
//! - **Progress** (bytes done, total, rate) is reported a few times a second;
//!   [`Cancel`] stops a download from any thread within ~0.1 s.
//!
//! `hf://OWNER/REPO/FILE[@REVISION]` names the hub's `resolve` URL (see [`hub`]).

mod http;
pub mod hub;
mod lock;
mod partial;
pub mod sha256;
mod space;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Client, Failure, Head};
use partial::{with_suffix, Meta};
use sha256::{from_hex, to_hex, Sha256};

/// One file to fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// `http://`, `https://` or `hf://OWNER/REPO/FILE[@REVISION]`.
    pub url: String,
    /// The expected SHA-256; `None` only when the request allows unverified files.
    pub sha256: Option<[u8; 32]>,
}

impl Part {
    /// A part with its expected hash as hex ("" or `None`: no hash).
    pub fn new(url: impl Into<String>, sha256_hex: Option<&str>) -> Result<Part, Error> {
        let url = url.into();
        let sha256 = match sha256_hex.map(str::trim).filter(|h| !h.is_empty()) {
            None => None,
            Some(h) => Some(from_hex(h).ok_or_else(|| {
                Error::InvalidArgument(format!("{url}: expected SHA-256 {h:?} is not 64 hex digits"))
            })?),
        };
        Ok(Part { url, sha256 })
    }
}

/// What to download, and where.
#[derive(Clone, Debug)]
pub struct Request {
    pub parts: Vec<Part>,
    /// One part: the file to write (or an existing folder, or a path ending in
    /// '/': the URL's file name inside it). Several parts: the folder that
    /// receives them, each under its URL's file name.
    pub destination: PathBuf,
    /// Accept parts without an expected hash (their SHA-256 is still computed and reported).
    pub allow_unverified: bool,
}

impl Request {
    /// A request from the lists an API or a command line takes: one URL per
    /// part and, for each, its expected SHA-256 as hex (`sha256` empty: none
    /// given). A hash count other than the URLs' is refused, and so is a part
    /// without a hash unless `allow_unverified`; `opt_out` names the caller's
    /// switch for that in the error ("--no-verify", "allowUnverified").
    pub fn from_lists(
        urls: &[String],
        sha256: &[String],
        destination: impl Into<PathBuf>,
        allow_unverified: bool,
        opt_out: &str,
    ) -> Result<Request, Error> {
        if urls.is_empty() {
            return Err(Error::InvalidArgument("no URL to download".into()));
        }
        if !sha256.is_empty() && sha256.len() != urls.len() {
            return Err(Error::InvalidArgument(format!(
                "{} URL(s) and {} SHA-256 hash(es): give one hash per URL",
                urls.len(),
                sha256.len()
            )));
        }
        let parts = urls
            .iter()
            .enumerate()
            .map(|(i, url)| Part::new(url.clone(), sha256.get(i).map(String::as_str)))
            .collect::<Result<Vec<_>, _>>()?;
        if !allow_unverified {
            if let Some(p) = parts.iter().find(|p| p.sha256.is_none()) {
                return Err(Error::InvalidArgument(format!("{}: no expected SHA-256 (give one, or {opt_out})", p.url)));
            }
        }
        Ok(Request { parts, destination: destination.into(), allow_unverified })
    }
}

/// How a download behaves; the defaults suit a phone's network.
#[derive(Clone, Debug)]
pub struct Options {
    /// Failed attempts in a row (no byte received between them) before giving up.
    pub retries: u32,
    /// The first wait before a retry, doubled each time up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub connect_timeout: Duration,
    /// A connection that sends nothing for this long is dropped and retried.
    pub read_timeout: Duration,
    /// The least time between two progress reports.
    pub progress_interval: Duration,
    pub max_redirects: u32,
    pub user_agent: String,
    /// Use `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY` (and `NO_PROXY`) from the environment.
    pub use_env_proxy: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            retries: 8,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            progress_interval: Duration::from_millis(250),
            max_redirects: 10,
            user_agent: format!("pocket-download/{}", env!("CARGO_PKG_VERSION")),
            use_env_proxy: true,
        }
    }
}

/// Where a download stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Bytes of all parts on disk (verified parts, and the partial file of the current one).
    pub done: u64,
    /// All parts' size; 0 while a server has not said.
    pub total: u64,
    /// Received from the network, bytes per second (recent average).
    pub bytes_per_second: f64,
}

/// Stops a download from any thread: it ends with [`Error::Cancelled`] and
/// keeps its partial file (with a synced checkpoint) for a later resume.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// How a download failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The server could not be reached, refused (4xx), kept failing (5xx,
    /// dropped connections past the retries), or redirected to plain http.
    #[error("network error: {0}")]
    Network(String),
    /// The file is not what was expected: its SHA-256 or size differs. The
    /// partial file was deleted.
    #[error("integrity error: {0}")]
    Integrity(String),
    /// The destination cannot hold it: not enough free space, a full disk, a
    /// write or rename that failed. The partial file is kept for a resume.
    #[error("storage error: {0}")]
    Storage(String),
    #[error("cancelled")]
    Cancelled,
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// "network", "integrity", "storage", "cancelled" or "invalid-argument".
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Network(_) => "network",
            Error::Integrity(_) => "integrity",
            Error::Storage(_) => "storage",
            Error::Cancelled => "cancelled",
            Error::InvalidArgument(_) => "invalid-argument",
        }
    }

    /// The text after the kind.
    pub fn reason(&self) -> String {
        match self {
            Error::Network(r) | Error::Integrity(r) | Error::Storage(r) | Error::InvalidArgument(r) => r.clone(),
            Error::Cancelled => "the download was cancelled".into(),
        }
    }
}

/// What a finished download did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The verified files, in the request's order.
    pub paths: Vec<PathBuf>,
    pub sha256: Vec<[u8; 32]>,
    /// All parts' size.
    pub total_bytes: u64,
    /// Received from the network by this call.
    pub received_bytes: u64,
    /// Kept from partial files of an earlier call.
    pub resumed_bytes: u64,
    /// Read back from disk to restore the hash state on resume (or to check
    /// a destination that was already there).
    pub reread_bytes: u64,
    /// Times a partial file was started over (Range ignored, the file changed).
    pub restarts: u32,
    /// Attempts that failed and were retried.
    pub retries: u32,
}

/// The files a request writes, in its order.
pub fn destinations(request: &Request) -> Result<Vec<PathBuf>, Error> {
    let dest = &request.destination;
    if request.parts.len() == 1 {
        let as_folder = dest.is_dir() || dest.as_os_str().to_string_lossy().ends_with('/');
        if !as_folder {
            return Ok(vec![dest.clone()]);
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for part in &request.parts {
        let path = dest.join(file_name(&part.url)?);
        if out.contains(&path) {
            return Err(Error::InvalidArgument(format!("two parts would both be saved as {}", path.display())));
        }
        out.push(path);
    }
    Ok(out)
}

/// The last path segment of a URL, percent-decoded, usable as a file name.
fn file_name(url: &str) -> Result<String, Error> {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let path = path.strip_prefix("hf://").map(|p| p.rsplit_once('@').map_or(p, |(f, _)| f)).unwrap_or(path);
    let last = path.rsplit('/').next().unwrap_or("");
    let name = percent_decode(last);
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) || path.ends_with("//") {
        return Err(Error::InvalidArgument(format!("{url}: no file name to save it under")));
    }
    Ok(name)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// Download `request`, reporting progress to `on_progress` (on the calling
/// thread, at most every `options.progress_interval`, and once at the end).
pub fn download(
    request: &Request,
    options: &Options,
    cancel: &Cancel,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<Outcome, Error> {
    if request.parts.is_empty() {
        return Err(Error::InvalidArgument("no URL to download".into()));
    }
    for part in &request.parts {
        if part.url.trim().is_empty() {
            return Err(Error::InvalidArgument("an empty URL".into()));
        }
        if part.sha256.is_none() && !request.allow_unverified {
            return Err(Error::InvalidArgument(format!(
                "{}: no expected SHA-256 (give one, or allow an unverified file)",
                part.url
            )));
        }
    }
    let dests = destinations(request)?;
    let mut jobs = Vec::new();
    for (part, dest) in request.parts.iter().zip(dests) {
        let resolved = hub::resolve(&part.url).map_err(Error::InvalidArgument)?;
        let partial = with_suffix(&dest, ".part");
        jobs.push(Job {
            url: part.url.clone(),
            resolved,
            meta_path: with_suffix(&partial, ".meta"),
            partial,
            dest,
            expected: part.sha256,
            size: None,
            done: None,
        });
    }
    let folder = jobs[0].dest.parent().map(Path::to_path_buf).unwrap_or_default();
    let folder = if folder.as_os_str().is_empty() { PathBuf::from(".") } else { folder };
    std::fs::create_dir_all(&folder).map_err(|e| Error::Storage(format!("{}: {e}", folder.display())))?;
    // Held until this call returns (a waiting download then finds what this one left).
    let lock_path = with_suffix(&jobs[0].partial, ".lock");
    let _lock = lock::exclusive(&lock_path, jobs.iter().map(|j| j.partial.clone()).collect(), cancel)?;

    let auth = if request.parts.iter().any(|p| p.url.starts_with("hf://")) { hub::auth() } else { None };
    let client = Arc::new(Client::new(options, auth).map_err(Error::Network)?);
    let mut run = Run {
        client,
        options,
        cancel,
        meter: Meter::new(on_progress, options.progress_interval),
        outcome: Outcome::default(),
    };

    // What is already there: verified parts waiting (or renamed), a destination that matches.
    for job in &mut jobs {
        run.check_local(job)?;
    }
    // Sizes and reachability of the rest, before a byte is written.
    for job in jobs.iter_mut().filter(|j| j.done.is_none()) {
        job.size = run.probe(&job.resolved)?;
    }
    run.meter.total = if jobs.iter().all(|j| j.size.is_some()) { jobs.iter().filter_map(|j| j.size).sum() } else { 0 };
    let needed: u64 =
        jobs.iter().filter(|j| j.done.is_none()).map(|j| j.size.unwrap_or(0).saturating_sub(resumable_len(j))).sum();
    if let Some(free) = space::available(&folder) {
        if needed > free {
            return Err(Error::Storage(format!(
                "{} needs {needed} more bytes, {free} are free on {}",
                request.parts[0].url,
                folder.display()
            )));
        }
    }
    run.meter.done_parts = jobs.iter().filter(|j| j.done.is_some()).filter_map(|j| j.size).sum();
    // The first report counts a partial file already there.
    run.meter.current = jobs.iter().find(|j| j.done.is_none()).map_or(0, resumable_len);
    run.meter.emit();

    for job in jobs.iter_mut() {
        if job.done.is_some() {
            continue;
        }
        let digest = run.fetch(job)?;
        job.done = Some(digest);
        run.meter.done_parts += job.size.unwrap_or(0);
        run.meter.current = 0;
    }

    // Every part verified: into place, then the sidecars go.
    for job in &jobs {
        if job.partial.exists() {
            std::fs::rename(&job.partial, &job.dest).map_err(|e| {
                Error::Storage(format!("renaming {} to {}: {e}", job.partial.display(), job.dest.display()))
            })?;
        }
    }
    sync_dir(&folder).map_err(|e| Error::Storage(format!("{}: {e}", folder.display())))?;
    for job in &jobs {
        let _ = std::fs::remove_file(&job.meta_path);
    }
    run.meter.total = jobs.iter().filter_map(|j| j.size).sum();
    run.meter.done_parts = run.meter.total;
    run.meter.emit();
    let mut outcome = run.outcome;
    outcome.total_bytes = run.meter.total;
    outcome.paths = jobs.iter().map(|j| j.dest.clone()).collect();
    outcome.sha256 = jobs.iter().map(|j| j.done.expect("every part done")).collect();
    Ok(outcome)
}

struct Job {
    /// As the caller gave it.
    url: String,
    /// What is fetched (`hf://` resolved).
    resolved: String,
    dest: PathBuf,
    partial: PathBuf,
    meta_path: PathBuf,
    expected: Option<[u8; 32]>,
    size: Option<u64>,
    /// The verified digest, once the part is complete.
    done: Option<[u8; 32]>,
}

impl Job {
    fn meta_matches(&self, m: &Meta) -> bool {
        m.url == self.url && m.expected == self.expected.map(|d| to_hex(&d)).unwrap_or_default()
    }
}

/// Bytes of a usable partial file of `job` (0 without a matching sidecar).
fn resumable_len(job: &Job) -> u64 {
    match Meta::read(&job.meta_path) {
        Some(m) if job.meta_matches(&m) => std::fs::metadata(&job.partial).map_or(0, |md| md.len()),
        _ => 0,
    }
}

struct Run<'a> {
    client: Arc<Client>,
    options: &'a Options,
    cancel: &'a Cancel,
    meter: Meter<'a>,
    outcome: Outcome,
}

/// How one attempt ended, when it did not complete the part.
enum Stop {
    /// Retry after a backoff (the attempt received `progressed` bytes).
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Start the part over at once (the server's file is not the one the partial file holds).
    Restart(String),
    Fail(Error),
}

const CHUNK: usize = 256 * 1024;
/// A checkpoint is taken once this many bytes, or 1/32 of the partial file, arrived since the last.
const MIN_CHECKPOINT: u64 = 1 << 20;

impl Run<'_> {
    /// A part already verified (waiting as `.part`, or renamed before a kill)
    /// or a destination already holding the expected bytes.
    fn check_local(&mut self, job: &mut Job) -> Result<(), Error> {
        if let Some(m) = Meta::read(&job.meta_path).filter(|m| job.meta_matches(m)) {
            if let (Some(hex), Some(size)) = (&m.complete, m.size) {
                let at = if job.partial.exists() { &job.partial } else { &job.dest };
                if std::fs::metadata(at).is_ok_and(|md| md.len() == size) {
                    job.done = from_hex(hex);
                    job.size = Some(size);
                    return Ok(());
                }
            }
        }
        if let (Some(expected), Ok(md)) = (job.expected, std::fs::metadata(&job.dest)) {
            if md.is_file() && !job.partial.exists() {
                let digest = self.hash_file(&job.dest, 0, Sha256::new())?.finish();
                if digest == expected {
                    log::info!("{} already holds {}", job.dest.display(), to_hex(&expected));
                    job.done = Some(digest);
                    job.size = Some(md.len());
                }
            }
        }
        Ok(())
    }

    /// The size the server gives for `url` (HEAD), retried like a download.
    fn probe(&mut self, url: &str) -> Result<Option<u64>, Error> {
        let mut fails = 0;
        loop {
            self.check_cancel()?;
            match self.client.head(url) {
                Ok(head) if head.status == 200 => return Ok(head.content_length),
                Ok(_) => return Ok(None),
                Err(Failure::Fatal(reason)) => return Err(Error::Network(reason)),
                Err(Failure::Transient { reason, retry_after }) => {
                    fails += 1;
                    self.backoff(fails, &reason, retry_after)?;
                }
            }
        }
    }

    fn check_cancel(&self) -> Result<(), Error> {
        if self.cancel.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Wait before retry number `fails`, or give up after `options.retries`.
    fn backoff(&mut self, fails: u32, reason: &str, retry_after: Option<Duration>) -> Result<(), Error> {
        if fails > self.options.retries {
            return Err(Error::Network(format!("{reason} (after {} retries)", self.options.retries)));
        }
        self.outcome.retries += 1;
        let exp = self.options.backoff.saturating_mul(1 << (fails - 1).min(16));
        // ±25 % jitter, so that many clients do not retry in step.
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let jitter = 0.75 + f64::from(nanos % 1000) / 2000.0;
        let wait = retry_after.unwrap_or(exp.mul_f64(jitter)).min(self.options.max_backoff);
        log::info!("{reason}: retry {fails} in {wait:?}");
        let until = Instant::now() + wait;
        while Instant::now() < until {
            self.check_cancel()?;
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
        Ok(())
    }

    /// Hash `path` from `from` to its end into `hasher` (re-read bytes are counted).
    fn hash_file(&mut self, path: &Path, from: u64, mut hasher: Sha256) -> Result<Sha256, Error> {
        let storage = |e: std::io::Error| Error::Storage(format!("{}: {e}", path.display()));
        let mut f = File::open(path).map_err(storage)?;
        f.seek(SeekFrom::Start(from)).map_err(storage)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            self.check_cancel()?;
            let n = f.read(&mut buf).map_err(storage)?;
            if n == 0 {
                return Ok(hasher);
            }
            hasher.update(&buf[..n]);
            self.outcome.reread_bytes += n as u64;
        }
    }

    /// Bring `job`'s partial file to the whole verified part; its digest.
    fn fetch(&mut self, job: &mut Job) -> Result<[u8; 32], Error> {
        let storage = |what: &Path, e: std::io::Error| Error::Storage(format!("{}: {}", what.display(), describe(&e)));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&job.partial)
            .map_err(|e| storage(&job.partial, e))?;
        let have_on_disk = file.metadata().map_err(|e| storage(&job.partial, e))?.len();

        // Resume from the sidecar's checkpoint, or start over.
        let resumed = Meta::read(&job.meta_path)
            .filter(|m| job.meta_matches(m) && m.complete.is_none())
            .and_then(|m| Some((Sha256::restore(&m.state)?, m)))
            .filter(|(h, m)| h.len() <= have_on_disk && m.size.is_none_or(|s| have_on_disk <= s))
            .filter(|(_, m)| m.validator.is_some() || job.expected.is_some());
        let (mut hasher, mut meta, mut have) = match resumed {
            Some((h, m)) => {
                let from = h.len();
                let h = self.hash_file(&job.partial, from, h)?;
                log::info!("resuming {} at {have_on_disk} (re-read {} bytes)", job.url, have_on_disk - from);
                self.outcome.resumed_bytes += have_on_disk;
                (h, m, have_on_disk)
            }
            None => {
                let meta = Meta {
                    url: job.url.clone(),
                    expected: job.expected.map(|d| to_hex(&d)).unwrap_or_default(),
                    state: Sha256::new().checkpoint().1,
                    ..Meta::default()
                };
                file.set_len(0).map_err(|e| storage(&job.partial, e))?;
                meta.write(&job.meta_path).map_err(|e| storage(&job.meta_path, e))?;
                (Sha256::new(), meta, 0)
            }
        };
        if meta.size.is_some() && job.size != meta.size {
            log::info!("{}: the server now gives size {:?}, the partial file {:?}", job.url, job.size, meta.size);
        }
        self.meter.set_current(have);

        let mut fails = 0u32;
        let mut restarts = 0u32;
        let mut use_range = true;
        let mut checkpoint_at = hasher.len();
        loop {
            if meta.size == Some(have) {
                break;
            }
            if let Err(e) = self.check_cancel() {
                let _ = checkpoint(&file, &hasher, &mut meta, &job.meta_path);
                return Err(e);
            }
            let from = (have > 0 && use_range).then(|| (have, meta.validator.clone()));
            let received_before = self.meter.received;
            let stop = self.attempt(job, from, &mut file, &mut hasher, &mut meta, &mut have, &mut checkpoint_at);
            let progressed = self.meter.received > received_before;
            match stop {
                None => break,
                Some(Stop::Fail(e)) => {
                    if !matches!(e, Error::Integrity(_)) {
                        let _ = checkpoint(&file, &hasher, &mut meta, &job.meta_path);
                    }
                    return Err(e);
                }
                Some(Stop::Restart(reason)) => {
                    restarts += 1;
                    self.outcome.restarts += 1;
                    if restarts > 4 {
                        return Err(Error::Network(format!("{}: {reason}, again and again", job.url)));
                    }
                    log::info!("{}: {reason}: starting over", job.url);
                    // The next request asks for the whole file.
                    use_range = false;
                    have = 0;
                    hasher = Sha256::new();
                    checkpoint_at = 0;
                    meta = Meta { validator: None, size: None, state: hasher.checkpoint().1, ..meta };
                    self.meter.set_current(0);
                    file.set_len(0).map_err(|e| storage(&job.partial, e))?;
                    meta.write(&job.meta_path).map_err(|e| storage(&job.meta_path, e))?;
                }
                Some(Stop::Retry { reason, retry_after }) => {
                    use_range = true;
                    if let Err(e) = checkpoint(&file, &hasher, &mut meta, &job.meta_path) {
                        return Err(storage(&job.meta_path, e));
                    }
                    checkpoint_at = hasher.len();
                    if progressed {
                        fails = 0;
                    }
                    fails += 1;
                    self.backoff(fails, &reason, retry_after)?;
                }
            }
        }

        file.sync_all().map_err(|e| storage(&job.partial, e))?;
        let len = file.metadata().map_err(|e| storage(&job.partial, e))?.len();
        let digest = hasher.finish();
        let fail = |why: String| {
            drop(std::fs::remove_file(&job.partial));
            drop(std::fs::remove_file(&job.meta_path));
            Err(Error::Integrity(format!("{}: {why}; the partial file was deleted", job.url)))
        };
        if let Some(size) = meta.size {
            if len != size {
                return fail(format!("{len} bytes on disk, the server's size is {size}"));
            }
        }
        if let Some(expected) = job.expected {
            if digest != expected {
                return fail(format!("SHA-256 {} where {} was expected", to_hex(&digest), to_hex(&expected)));
            }
        }
        job.size = Some(len);
        meta.size = Some(len);
        meta.complete = Some(to_hex(&digest));
        meta.write(&job.meta_path).map_err(|e| storage(&job.meta_path, e))?;
        Ok(digest)
    }

    /// One request: `None` once the part's bytes are all on disk.
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &mut self,
        job: &mut Job,
        from: Option<(u64, Option<String>)>,
        file: &mut File,
        hasher: &mut Sha256,
        meta: &mut Meta,
        have: &mut u64,
        checkpoint_at: &mut u64,
    ) -> Option<Stop> {
        let storage = |what: &Path, e: std::io::Error| Error::Storage(format!("{}: {}", what.display(), describe(&e)));
        let (rx, recycle) = spawn_request(self.client.clone(), job.resolved.clone(), from.clone(), self.cancel.clone());
        let mut head: Option<Head> = None;
        // Checkpoints while bytes arrive (started at the first; joined when this attempt returns).
        let mut bg: Option<std::io::Result<Background>> = None;
        loop {
            let msg = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    if self.cancel.is_cancelled() {
                        return Some(Stop::Fail(Error::Cancelled));
                    }
                    self.meter.tick();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Some(Stop::Retry { reason: "the request thread ended".into(), retry_after: None });
                }
            };
            match msg {
                Msg::Fail(Failure::Fatal(reason)) => return Some(Stop::Fail(Error::Network(reason))),
                Msg::Fail(Failure::Transient { mut reason, retry_after }) => {
                    if head.is_some() {
                        let of = meta.size.map(|s| format!(" of {s}")).unwrap_or_default();
                        reason += &format!(" (at byte {have}{of})");
                    }
                    return Some(Stop::Retry { reason, retry_after });
                }
                Msg::Head(h) => {
                    let ranged = from.is_some();
                    match h.status {
                        206 if ranged => {
                            let Some((start, _, total)) = h.content_range else {
                                return Some(Stop::Restart("a 206 without Content-Range".into()));
                            };
                            if start != *have {
                                return Some(Stop::Restart(format!("asked for byte {have}, got {start}")));
                            }
                            if total.is_some() && meta.size.is_some() && total != meta.size {
                                return Some(Stop::Restart("the file's size changed".into()));
                            }
                            let (old, new) = (meta.validator.as_deref(), h.validator());
                            if old.is_some() && new.is_some() && old != new.as_deref() {
                                return Some(Stop::Restart("the file changed on the server".into()));
                            }
                            meta.size = meta.size.or(total);
                        }
                        200 | 206 => {
                            if h.status == 206 {
                                // A range we did not ask for.
                                return Some(Stop::Restart("an unrequested 206".into()));
                            }
                            if *have > 0 {
                                log::info!(
                                    "{}: the server sent the whole file ({}): starting over",
                                    job.url,
                                    if meta.validator.is_some() && h.validator() != meta.validator {
                                        "it changed"
                                    } else {
                                        "Range ignored"
                                    }
                                );
                                self.outcome.restarts += 1;
                            }
                            *have = 0;
                            *hasher = Sha256::new();
                            *checkpoint_at = 0;
                            self.meter.set_current(0);
                            if let Err(e) = file.set_len(0).and_then(|()| file.seek(SeekFrom::Start(0)).map(drop)) {
                                return Some(Stop::Fail(storage(&job.partial, e)));
                            }
                            meta.validator = h.validator();
                            meta.size = h.content_length;
                            meta.state = hasher.checkpoint().1;
                            if let Err(e) = meta.write(&job.meta_path) {
                                return Some(Stop::Fail(storage(&job.meta_path, e)));
                            }
                        }
                        416 if ranged => {
                            let total = h.content_range.and_then(|r| r.2);
                            if meta.size == Some(*have) || (meta.size.is_none() && total == Some(*have)) {
                                meta.size = Some(*have);
                                return None;
                            }
                            return Some(Stop::Restart("the partial file is longer than the server's".into()));
                        }
                        s => return Some(Stop::Fail(Error::Network(format!("{}: unexpected HTTP {s}", h.url)))),
                    }
                    if let Some(size) = meta.size {
                        if job.size != Some(size) {
                            self.meter.resize(job.size.unwrap_or(0), size);
                            job.size = Some(size);
                        }
                    }
                    if let Err(e) = file.seek(SeekFrom::Start(*have)) {
                        return Some(Stop::Fail(storage(&job.partial, e)));
                    }
                    head = Some(h);
                }
                Msg::Data(buf, n) => {
                    let data = &buf[..n];
                    if let Some(size) = meta.size {
                        if *have + n as u64 > size {
                            return Some(Stop::Fail(Error::Integrity(format!(
                                "{}: the server sent more than its size, {size} bytes",
                                job.url
                            ))));
                        }
                    }
                    if let Err(e) = file.write_all(data) {
                        return Some(Stop::Fail(storage(&job.partial, e)));
                    }
                    hasher.update(data);
                    *have += n as u64;
                    self.meter.received += n as u64;
                    self.outcome.received_bytes += n as u64;
                    let _ = recycle.send(buf);
                    self.meter.set_current(*have);
                    if *have - *checkpoint_at >= MIN_CHECKPOINT.max(*have / 32) {
                        if bg.is_none() {
                            bg = Some(Background::start(file, &job.meta_path));
                        }
                        let Some(Ok(b)) = bg.as_ref() else {
                            // No helper thread: a checkpoint on this one.
                            if let Err(e) = checkpoint(file, hasher, meta, &job.meta_path) {
                                return Some(Stop::Fail(storage(&job.meta_path, e)));
                            }
                            *checkpoint_at = hasher.len();
                            continue;
                        };
                        if let Some(e) = b.take_error() {
                            return Some(Stop::Fail(storage(&job.meta_path, e)));
                        }
                        let snapshot = Meta { state: hasher.checkpoint().1, ..meta.clone() };
                        if b.offer(snapshot) {
                            *checkpoint_at = hasher.len();
                        }
                    }
                }
                Msg::End => {
                    let url = head.as_ref().map_or(job.resolved.as_str(), |h| h.url.as_str());
                    return match meta.size {
                        Some(size) if *have < size => Some(Stop::Retry {
                            reason: format!("{url}: the connection closed at byte {have} of {size}"),
                            retry_after: None,
                        }),
                        Some(_) => None,
                        None => {
                            meta.size = Some(*have);
                            None
                        }
                    };
                }
            }
        }
    }
}

/// Checkpoints taken beside the transfer: a helper thread syncs the partial
/// file and then writes the sidecar, while the network and the hash go on
/// (a sync waits for the disk: on the transfer's thread it would stall it).
/// The state offered was taken after its bytes were written, so the sync
/// covers them. One at a time: an offer while one runs is declined. Dropped =
/// joined, so no sidecar write outlives the attempt that offered it.
struct Background {
    tx: Option<mpsc::SyncSender<Meta>>,
    thread: Option<std::thread::JoinHandle<()>>,
    busy: Arc<AtomicBool>,
    error: Arc<std::sync::Mutex<Option<std::io::Error>>>,
}

impl Background {
    fn start(file: &File, path: &Path) -> std::io::Result<Background> {
        let file = file.try_clone()?;
        let path = path.to_path_buf();
        let (tx, rx) = mpsc::sync_channel::<Meta>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let error = Arc::new(std::sync::Mutex::new(None));
        let (b, e) = (busy.clone(), error.clone());
        let thread = std::thread::Builder::new().name("pocket-download-sync".into()).spawn(move || {
            for meta in rx {
                if let Err(err) = file.sync_data().and_then(|()| meta.write(&path)) {
                    if let Ok(mut slot) = e.lock() {
                        slot.get_or_insert(err);
                    }
                }
                b.store(false, Ordering::SeqCst);
            }
        })?;
        Ok(Background { tx: Some(tx), thread: Some(thread), busy, error })
    }

    /// Take this checkpoint unless one is running.
    fn offer(&self, meta: Meta) -> bool {
        if self.busy.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.tx.as_ref().is_some_and(|tx| tx.send(meta).is_ok())
    }

    fn take_error(&self) -> Option<std::io::Error> {
        self.error.lock().ok().and_then(|mut e| e.take())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sync the partial file, then record the hash state of its synced prefix.
fn checkpoint(file: &File, hasher: &Sha256, meta: &mut Meta, path: &Path) -> std::io::Result<()> {
    file.sync_data()?;
    meta.state = hasher.checkpoint().1;
    meta.write(path)
}

/// ENOSPC and EDQUOT said plainly.
fn describe(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::StorageFull || matches!(e.raw_os_error(), Some(28) | Some(122)) {
        format!("disk full ({e})")
    } else {
        e.to_string()
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

enum Msg {
    Head(Head),
    /// A buffer and how many of its bytes are data.
    Data(Vec<u8>, usize),
    End,
    Fail(Failure),
}

/// The request on its own thread, so that the caller's thread hashes and
/// writes while the next bytes arrive, and a cancel is seen within 0.1 s even
/// while the network is silent. Buffers come back through the second channel.
fn spawn_request(
    client: Arc<Client>,
    url: String,
    from: Option<(u64, Option<String>)>,
    cancel: Cancel,
) -> (mpsc::Receiver<Msg>, mpsc::Sender<Vec<u8>>) {
    let (tx, rx) = mpsc::sync_channel::<Msg>(16);
    let (recycle, spare) = mpsc::channel::<Vec<u8>>();
    let spawned = std::thread::Builder::new().name("pocket-download".into()).spawn(move || {
        let range = from.as_ref().map(|(at, v)| (*at, v.as_deref()));
        let (head, mut body) = match client.get(&url, range) {
            Ok(r) => r,
            Err(f) => {
                let _ = tx.send(Msg::Fail(f));
                return;
            }
        };
        let url = head.url.clone();
        if tx.send(Msg::Head(head)).is_err() {
            return;
        }
        loop {
            if cancel.is_cancelled() {
                return;
            }
            let mut buf = spare.try_recv().unwrap_or_else(|_| vec![0; CHUNK]);
            let msg = match body.read(&mut buf) {
                Ok(0) => Msg::End,
                Ok(n) => Msg::Data(buf, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Msg::Fail(Failure::Transient { reason: format!("{url}: {e}"), retry_after: None }),
            };
            let last = !matches!(msg, Msg::Data(..));
            if tx.send(msg).is_err() || last {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        let (tx2, rx2) = mpsc::sync_channel(1);
        let _ = tx2
            .send(Msg::Fail(Failure::Transient { reason: format!("cannot start a thread: {e}"), retry_after: None }));
        return (rx2, recycle);
    }
    (rx, recycle)
}

/// Progress, throttled, with a smoothed rate.
struct Meter<'a> {
    on_progress: &'a mut dyn FnMut(Progress),
    interval: Duration,
    /// Bytes of the parts already complete.
    done_parts: u64,
    /// Bytes of the current part's partial file.
    current: u64,
    total: u64,
    /// Received from the network (never goes back: the rate's counter).
    received: u64,
    last: Option<(Instant, u64)>,
    rate: f64,
}

impl<'a> Meter<'a> {
    fn new(on_progress: &'a mut dyn FnMut(Progress), interval: Duration) -> Self {
        Meter { on_progress, interval, done_parts: 0, current: 0, total: 0, received: 0, last: None, rate: 0.0 }
    }

    fn set_current(&mut self, current: u64) {
        self.current = current;
        self.tick();
    }

    /// A part's size became known or changed.
    fn resize(&mut self, old: u64, new: u64) {
        if self.total > 0 {
            self.total = self.total - old.min(self.total) + new;
        }
    }

    fn tick(&mut self) {
        if self.last.is_none_or(|(t, _)| t.elapsed() >= self.interval) {
            self.emit();
        }
    }

    fn emit(&mut self) {
        let now = Instant::now();
        if let Some((t, received)) = self.last {
            let dt = now.duration_since(t).as_secs_f64();
            if dt > 0.0 {
                let inst = (self.received - received) as f64 / dt;
                self.rate = if self.rate == 0.0 { inst } else { 0.6 * self.rate + 0.4 * inst };
            }
        }
        self.last = Some((now, self.received));
        (self.on_progress)(Progress {
            done: self.done_parts + self.current,
            total: self.total,
            bytes_per_second: self.rate,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_from_lists_hold_the_hash_rules() {
        let urls = |n: usize| (0..n).map(|i| format!("http://h/m-{i}.gguf")).collect::<Vec<_>>();
        let hash = "ab".repeat(32);
        let refused = |r: Result<Request, Error>| match r {
            Err(Error::InvalidArgument(reason)) => reason,
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        // One hash per URL: the parts carry them.
        let r = Request::from_lists(&urls(2), &[hash.clone(), hash.clone()], "/tmp/d/", false, "--no-verify").unwrap();
        assert_eq!(r.parts.len(), 2);
        assert!(r.parts.iter().all(|p| p.sha256 == Some([0xab; 32])));
        // A count other than the URLs' is refused, with or without the opt-out.
        for allow in [false, true] {
            let reason = refused(Request::from_lists(&urls(2), std::slice::from_ref(&hash), "/tmp/d/", allow, "x"));
            assert!(reason.contains("2 URL(s) and 1 SHA-256"), "{reason}");
        }
        // No hash: refused naming the caller's opt-out, accepted with it.
        let reason = refused(Request::from_lists(&urls(1), &[], "/tmp/m", false, "set allowUnverified"));
        assert!(reason.contains("http://h/m-0.gguf") && reason.contains("set allowUnverified"), "{reason}");
        assert!(Request::from_lists(&urls(1), &[], "/tmp/m", true, "x").unwrap().parts[0].sha256.is_none());
        // No URL, and a hash that is not 64 hex digits.
        assert!(refused(Request::from_lists(&[], &[], "/tmp/m", true, "x")).contains("no URL"));
        assert!(refused(Request::from_lists(&urls(1), &["xyz".into()], "/tmp/m", false, "x")).contains("64 hex"));
    }

    #[test]
    fn destinations_follow_the_urls() {
        let part = |u: &str| Part { url: u.into(), sha256: None };
        let one = Request {
            parts: vec![part("http://h/a/m.gguf?x=1")],
            destination: "/tmp/x/model.gguf".into(),
            allow_unverified: true,
        };
        assert_eq!(destinations(&one).unwrap(), [PathBuf::from("/tmp/x/model.gguf")]);
        let folder = Request { destination: "/tmp/x/".into(), ..one.clone() };
        assert_eq!(destinations(&folder).unwrap(), [PathBuf::from("/tmp/x/m.gguf")]);
        let shards = Request {
            parts: vec![part("hf://o/r/q/m-00001-of-00002.gguf@v2"), part("http://h/m%2D00002-of-00002.gguf")],
            destination: "/d".into(),
            allow_unverified: true,
        };
        assert_eq!(
            destinations(&shards).unwrap(),
            [PathBuf::from("/d/m-00001-of-00002.gguf"), PathBuf::from("/d/m-00002-of-00002.gguf")]
        );
        let same = Request { parts: vec![part("http://h/a/m"), part("http://g/m")], ..shards.clone() };
        assert!(matches!(destinations(&same), Err(Error::InvalidArgument(_))));
        let none = Request { parts: vec![part("http://h/a/"), part("http://g/m")], ..shards };
        assert!(matches!(destinations(&none), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_hash_is_required_unless_allowed() {
        let r = Request {
            parts: vec![Part::new("http://127.0.0.1:1/f", None).unwrap()],
            destination: std::env::temp_dir().join("pocket-never-written"),
            allow_unverified: false,
        };
        let e = download(&r, &Options::default(), &Cancel::new(), &mut |_| {}).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(matches!(Part::new("http://h/f", Some("12")), Err(Error::InvalidArgument(_))));
    }
}
