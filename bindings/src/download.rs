//! `downloadModel`: a model file (or the shards of one) fetched on a
//! background thread, resumable and verified (pocket-download).

use std::sync::{Arc, Mutex};

use pocket_download::{Cancel, Error as DownloadError, Options, Request};

use crate::error::{guard, PocketError};

/// What to download and where.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct DownloadRequest {
    /// `https://…`, `http://…` or `hf://OWNER/REPO/FILE[@REVISION]` (the hub's
    /// resolve URL; `HF_ENDPOINT` and `HF_TOKEN` are honoured). Several URLs
    /// are the parts of one model (e.g. `llama-gguf-split` shards), fetched as
    /// one download with one progress.
    pub urls: Vec<String>,
    /// The expected SHA-256 of each URL's file, 64 hex digits, in the same
    /// order. Required unless `allowUnverified` (then it may be empty).
    pub sha256: Vec<String>,
    /// One URL: the file to write (an existing folder, or a path ending in
    /// '/', receives the URL's file name). Several: the folder that receives
    /// them under their URLs' file names. Bytes go to `DEST.part` beside it
    /// (with a small `DEST.part.meta`) and become `DEST` only once verified.
    pub destination: String,
    /// Accept a file without an expected hash (nothing then checks its bytes).
    #[uniffi(default = false)]
    pub allow_unverified: bool,
}

/// Receives a download's progress and its end, on the download's thread.
#[uniffi::export(with_foreign)]
pub trait DownloadListener: Send + Sync {
    /// Bytes on disk of all parts, and their total (0 while unknown); a few
    /// times a second at most.
    fn on_progress(&self, done_bytes: u64, total_bytes: u64);
    /// Every part verified and in place; `path` is the file (of several
    /// parts, the first: what `PocketModel.load` takes).
    fn on_finished(&self, path: String);
    /// `Network`, `Integrity`, `Storage`, `Cancelled` (after `cancel()`) or `Internal`.
    /// Except after `Integrity`, the partial file stays: the same request resumes it.
    fn on_failed(&self, error: PocketError);
}

/// A running download.
#[derive(uniffi::Object)]
pub struct DownloadHandle {
    cancel: Cancel,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[uniffi::export]
impl DownloadHandle {
    /// Stop the download (from any thread; returns at once): the listener
    /// then gets `onFailed(Cancelled)` within a fraction of a second, and the
    /// partial file is kept (synced) for a resume.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Block until the download has ended and its listener was told. (Not
    /// `wait`: Kotlin objects have one.)
    pub fn join(&self) {
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Start downloading `request` on a background thread. The request is
/// checked first (a hash that is not 64 hex digits, a missing hash, no URL:
/// `InvalidArgument`, thrown here); everything after arrives at `listener`.
/// Dropping the handle does not stop the download: call `cancel()`.
#[uniffi::export]
pub fn download_model(
    request: DownloadRequest,
    listener: Arc<dyn DownloadListener>,
) -> Result<Arc<DownloadHandle>, PocketError> {
    guard(|| {
        crate::logging::init();
        let req = core_request(&request)?;
        pocket_download::destinations(&req).map_err(PocketError::from)?;
        let cancel = Cancel::new();
        let c = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("pocket-download".into())
            .spawn(move || {
                let result = guard(|| {
                    let mut on_progress = |p: pocket_download::Progress| listener.on_progress(p.done, p.total);
                    Ok(pocket_download::download(&req, &Options::default(), &c, &mut on_progress)?)
                });
                match result {
                    Ok(outcome) => listener.on_finished(outcome.paths[0].to_string_lossy().into_owned()),
                    Err(e) => listener.on_failed(e),
                }
            })
            .map_err(|e| PocketError::internal(format!("cannot start the download thread: {e}")))?;
        Ok(Arc::new(DownloadHandle { cancel, thread: Mutex::new(Some(thread)) }))
    })
}

/// The URL a download of `url` fetches: `hf://OWNER/REPO/FILE[@REVISION]` as
/// the hub's `resolve` URL (its endpoint from `HF_ENDPOINT` when set), any
/// other URL unchanged. For handing a download to the platform (a background
/// `URLSession`, WorkManager) and verifying the file with `downloadModel` after.
#[uniffi::export]
pub fn resolve_download_url(url: String) -> Result<String, PocketError> {
    guard(|| pocket_download::hub::resolve(&url).map_err(PocketError::invalid_argument))
}

fn core_request(r: &DownloadRequest) -> Result<Request, PocketError> {
    Ok(Request::from_lists(&r.urls, &r.sha256, &r.destination, r.allow_unverified, "set allowUnverified")?)
}

impl From<DownloadError> for PocketError {
    fn from(e: DownloadError) -> Self {
        let reason = e.reason();
        match e {
            DownloadError::Network(_) => PocketError::Network { reason },
            DownloadError::Integrity(_) => PocketError::Integrity { reason },
            DownloadError::Storage(_) => PocketError::Storage { reason },
            DownloadError::Cancelled => PocketError::Cancelled { reason },
            DownloadError::InvalidArgument(_) => PocketError::InvalidArgument { reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(urls: &[&str], sha: &[&str], allow: bool) -> DownloadRequest {
        DownloadRequest {
            urls: urls.iter().map(|s| s.to_string()).collect(),
            sha256: sha.iter().map(|s| s.to_string()).collect(),
            destination: "/tmp/pocket-never/m.gguf".into(),
            allow_unverified: allow,
        }
    }

    #[test]
    fn requests_are_checked_before_anything_starts() {
        let h = "ab".repeat(32);
        assert!(core_request(&req(&["http://h/m"], &[&h], false)).is_ok());
        let bad = [
            req(&[], &[], false),
            req(&["http://h/m"], &[], false),
            req(&["http://h/m"], &["xyz"], false),
            req(&["http://h/a", "http://h/b"], &[&h], false),
        ];
        for r in bad {
            assert!(matches!(core_request(&r), Err(PocketError::InvalidArgument { .. })), "{r:?}");
        }
        assert!(core_request(&req(&["http://h/m"], &[], true)).is_ok());
    }

    #[test]
    fn download_errors_keep_their_kind() {
        let e = PocketError::from(DownloadError::Integrity("x: SHA-256 differs".into()));
        assert_eq!(e, PocketError::Integrity { reason: "x: SHA-256 differs".into() });
        assert!(matches!(PocketError::from(DownloadError::Network("n".into())), PocketError::Network { .. }));
        assert!(matches!(PocketError::from(DownloadError::Storage("s".into())), PocketError::Storage { .. }));
        assert!(matches!(PocketError::from(DownloadError::Cancelled), PocketError::Cancelled { .. }));
    }
}
