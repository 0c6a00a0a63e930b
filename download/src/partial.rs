//! The sidecar of a partial file: `DEST.part.meta` beside `DEST.part`.
//!
//! It says what the partial file is a prefix of (the URL asked for, the
//! expected hash, the server's validator and size) and holds the SHA-256
//! state at a block boundary not past the bytes synced to disk, so a resumed
//! download re-reads only what came after it. `complete` is set once the
//! whole part is verified (a part of a multi-part download waits there for
//! the others). Written to a temporary file, synced and renamed over the old
//! one: a kill leaves the old sidecar or the new one.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &str = "pocket-download 1";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// The URL as the caller gave it (before `hf://` resolution).
    pub url: String,
    /// The expected SHA-256 (hex), "" for none.
    pub expected: String,
    /// `If-Range` validator: a strong ETag or Last-Modified.
    pub validator: Option<String>,
    /// The whole file's size, as the server gave it.
    pub size: Option<u64>,
    /// [`crate::sha256::Sha256::checkpoint`] text.
    pub state: String,
    /// The verified SHA-256 (hex) once the part is complete.
    pub complete: Option<String>,
}

impl Meta {
    pub fn read(path: &Path) -> Option<Meta> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let mut m = Meta::default();
        for line in lines {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "url" => m.url = value.into(),
                "expected" => m.expected = value.into(),
                "validator" => m.validator = Some(value.into()),
                "size" => m.size = Some(value.parse().ok()?),
                "state" => m.state = value.into(),
                "complete" => m.complete = Some(value.into()),
                _ => {}
            }
        }
        Some(m)
    }

    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut text = format!("{MAGIC}\nurl {}\nexpected {}\nstate {}\n", self.url, self.expected, self.state);
        if let Some(v) = &self.validator {
            text += &format!("validator {v}\n");
        }
        if let Some(s) = self.size {
            text += &format!("size {s}\n");
        }
        if let Some(c) = &self.complete {
            text += &format!("complete {c}\n");
        }
        if text.lines().count()
            != 4 + usize::from(self.validator.is_some())
                + usize::from(self.size.is_some())
                + usize::from(self.complete.is_some())
        {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a line break in a sidecar value"));
        }
        let tmp = with_suffix(path, ".tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

/// `path` with `suffix` appended to its file name.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sidecar_reads_back() {
        let dir = std::env::temp_dir().join(format!("pocket-meta-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.part.meta");
        let m = Meta {
            url: "hf://o/r/f.gguf".into(),
            expected: "ab".repeat(32),
            validator: Some("\"etag-1\"".into()),
            size: Some(123),
            state: "64:00".into(),
            complete: None,
        };
        m.write(&path).unwrap();
        assert_eq!(Meta::read(&path), Some(m.clone()));
        let bad = Meta { validator: Some("a\nb".into()), ..m };
        assert!(bad.write(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
