//! Replacing a file so that a crash or a kill at any moment leaves either the
//! old file or the new one, never a torn mix: the new bytes go to a temporary
//! file in the same directory (a rename is atomic only within one file
//! system), are flushed and synced, the temporary file is renamed over the
//! target, and the directory is synced so the rename itself survives a power
//! loss.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Write buffer: one sequential stream of large writes.
const BUFFER: usize = 1 << 20;

/// Write `path` through `write`, atomically (see the module documentation).
/// On failure the target is untouched and the temporary file removed.
pub fn replace(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::InvalidArgument(format!("snapshot path '{}' names no file", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Unique per process and call: two sessions saving to one path never share a temporary file.
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{}-{serial}.tmp", name.to_string_lossy(), std::process::id()));
    let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    let cleanup = Cleanup(Some(tmp.clone()));

    let mut w = BufWriter::with_capacity(BUFFER, file);
    write(&mut w)?;
    let file = w.into_inner().map_err(|e| Error::Io(e.into_error()))?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    std::mem::forget(cleanup);
    sync_dir(&dir)
}

/// Make a rename in `dir` durable (a no-op where directories cannot be opened).
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Removes the temporary file unless disarmed (by `forget`) after the rename.
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pocket-durable-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let d = scratch_dir("ok");
        let p = d.join("s.snap");
        replace(&p, |w: &mut dyn Write| Ok(w.write_all(b"first")?)).unwrap();
        replace(&p, |w: &mut dyn Write| Ok(w.write_all(b"second")?)).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"second");
        assert_eq!(entries(&d), vec!["s.snap"]);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_whole() {
        let d = scratch_dir("fail");
        let p = d.join("s.snap");
        replace(&p, |w: &mut dyn Write| Ok(w.write_all(b"old")?)).unwrap();
        let r = replace(&p, |w: &mut dyn Write| {
            w.write_all(&[7u8; 3 << 20])?; // past the buffer: bytes reach the temporary file
            Err(Error::Cancelled)
        });
        assert!(matches!(r, Err(Error::Cancelled)));
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert_eq!(entries(&d), vec!["s.snap"]);
        assert!(matches!(replace(&d.join("no/such/dir/x"), |_| Ok(())), Err(Error::Io(_))));
        assert!(matches!(replace(Path::new("/"), |_| Ok(())), Err(Error::InvalidArgument(_))));
        fs::remove_dir_all(d).unwrap();
    }
}
