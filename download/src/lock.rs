//! One download of a destination at a time. An app that cancels a download
//! and starts the same one again at once (a Cancel then Resume tap, a quick
//! trip to the background) would otherwise have two threads writing one
//! partial file: the cancelled one still finishing its last write and
//! checkpoint. The second download waits for the first to let go of an
//! advisory lock on a sidecar file (`DEST.part.lock`), cancellably, then
//! looks at what is on disk as any download does. The sidecar goes when
//! the download that holds it leaves no partial file behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Cancel, Error};

/// How often a waiting download looks again (and at its cancel flag).
const POLL: Duration = Duration::from_millis(20);

/// A held lock; dropping it removes the sidecar (while still holding it)
/// unless one of `partials` is on disk for a later resume, then unlocks.
pub(crate) struct Exclusive {
    file: Option<File>,
    path: PathBuf,
    partials: Vec<PathBuf>,
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        if !self.partials.iter().any(|p| p.exists()) {
            let _ = std::fs::remove_file(&self.path);
        }
        self.file.take();
    }
}

/// The lock on `path`, taken once no other download holds it. A file system
/// without locks (`Unsupported`) gets no lock rather than no download.
pub(crate) fn exclusive(path: &Path, partials: Vec<PathBuf>, cancel: &Cancel) -> Result<Exclusive, Error> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::Storage(format!("{}: {e}", path.display())))?;
    let held = |file| Ok(Exclusive { file, path: path.to_path_buf(), partials: partials.clone() });
    loop {
        match file.try_lock() {
            Ok(()) => return held(Some(file)),
            Err(TryLockError::WouldBlock) => {
                if cancel.is_cancelled() {
                    return Err(Error::Cancelled);
                }
                std::thread::sleep(POLL);
            }
            Err(TryLockError::Error(e)) if e.kind() == ErrorKind::Unsupported => return held(None),
            Err(TryLockError::Error(e)) => return Err(Error::Storage(format!("locking {}: {e}", path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_and_a_cancelled_waiter_gives_up() {
        let dir = std::env::temp_dir().join(format!("pocket-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf.part.lock");
        let partial = dir.join("m.gguf.part");
        std::fs::write(&partial, b"some bytes").unwrap();
        let first = exclusive(&path, vec![partial.clone()], &Cancel::new()).unwrap();
        assert!(first.file.is_some());
        // Cancelled while waiting: Cancelled, not a lock.
        let cancel = Cancel::new();
        let (c2, p2) = (cancel.clone(), path.clone());
        let waiter = std::thread::spawn(move || exclusive(&p2, vec![], &c2).map(|_| ()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished(), "the lock is held: the second download waits");
        cancel.cancel();
        assert_eq!(waiter.join().unwrap(), Err(Error::Cancelled));
        // Released with a partial file to resume: the sidecar stays; the next one takes the lock at once.
        drop(first);
        assert!(path.exists());
        let second = exclusive(&path, vec![partial.clone()], &Cancel::new()).unwrap();
        // Released with nothing left to resume: the sidecar goes.
        std::fs::remove_file(&partial).unwrap();
        drop(second);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
