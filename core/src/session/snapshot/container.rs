//! The snapshot container: a magic and a version, then sections, each a
//! tag, a length and a checksum of its payload. The reader checks every
//! length against the bytes that remain (and against what the section must
//! hold) before it allocates, and every checksum before the payload is
//! decoded: a torn, truncated or corrupted file is an error naming the
//! section at fault, never a panic or a huge allocation.

use std::io::{self, Read, Write};

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};

/// The first eight bytes of every snapshot.
pub const MAGIC: [u8; 8] = *b"PKTSNAP\0";
/// The layout described in [`super`]; a reader refuses any other.
pub const VERSION: u32 = 1;
/// Tag, payload length (u64) and XXH3-64 of the payload.
pub const SECTION_HEADER: u64 = 4 + 8 + 8;

/// The error of a file that is not a usable snapshot.
pub fn invalid(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("snapshot: {what}"))
}

/// Writes the magic, the version, then sections, sequentially.
pub struct Writer<'a> {
    w: &'a mut dyn Write,
}

impl<'a> Writer<'a> {
    pub fn new(w: &'a mut dyn Write) -> io::Result<Writer<'a>> {
        w.write_all(&MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        Ok(Writer { w })
    }

    pub fn section(&mut self, tag: [u8; 4], payload: &[u8]) -> io::Result<()> {
        let mut header = [0u8; SECTION_HEADER as usize];
        header[..4].copy_from_slice(&tag);
        header[4..12].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        header[12..].copy_from_slice(&xxh3_64(payload).to_le_bytes());
        self.w.write_all(&header)?;
        self.w.write_all(payload)
    }
}

/// Reads sections back in the order they must come, verified.
pub struct Reader<'a> {
    r: &'a mut dyn Read,
    /// Bytes of the snapshot not read yet.
    remaining: u64,
    /// Sections read so far (for messages).
    index: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `len` bytes from `r`, after checking the magic and the version.
    pub fn new(r: &'a mut dyn Read, len: u64) -> Result<Reader<'a>> {
        let mut reader = Reader { r, remaining: len, index: 0 };
        let mut head = [0u8; 12];
        if len < head.len() as u64 {
            return Err(invalid(format!("{len} bytes are too few for a snapshot")));
        }
        reader.fill(&mut head, "the header")?;
        if head[..8] != MAGIC {
            return Err(invalid(format!("not a Pocket session snapshot (magic bytes {:02x?})", &head[..8])));
        }
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != VERSION {
            return Err(invalid(format!("unsupported snapshot version {version} (this build reads {VERSION})")));
        }
        Ok(reader)
    }

    /// The next section's payload into `buf`: it must carry `tag`, hold
    /// between `min` and `max` bytes, and match its checksum. `what` names
    /// the section in errors.
    pub fn section(&mut self, tag: [u8; 4], what: &str, min: u64, max: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.index += 1;
        let index = self.index;
        let at = || format!("section {index} ({what})");
        if self.remaining < SECTION_HEADER {
            return Err(invalid(format!("truncated: {} is missing", at())));
        }
        let mut header = [0u8; SECTION_HEADER as usize];
        self.fill(&mut header, what)?;
        let found: [u8; 4] = header[..4].try_into().unwrap_or_default();
        if found != tag {
            return Err(invalid(format!(
                "{} should be '{}', found tag {:02x?}",
                at(),
                String::from_utf8_lossy(&tag),
                found
            )));
        }
        let len = u64::from_le_bytes(header[4..12].try_into().unwrap_or_default());
        let sum = u64::from_le_bytes(header[12..].try_into().unwrap_or_default());
        if len > self.remaining {
            return Err(invalid(format!(
                "{} claims {len} bytes but only {} remain (truncated or corrupt)",
                at(),
                self.remaining
            )));
        }
        if len < min || len > max {
            let expected = if min == max { format!("{min}") } else { format!("{min} to {max}") };
            return Err(invalid(format!("{} holds {len} bytes, expected {expected}", at())));
        }
        buf.clear();
        buf.resize(len as usize, 0);
        self.fill(buf, what)?;
        if xxh3_64(buf) != sum {
            return Err(invalid(format!("{} fails its checksum (the file is corrupt)", at())));
        }
        Ok(())
    }

    /// Nothing may follow the last section.
    pub fn finish(self) -> Result<()> {
        if self.remaining > 0 {
            return Err(invalid(format!("{} unexpected bytes after the last section", self.remaining)));
        }
        Ok(())
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        match self.r.read_exact(buf) {
            Ok(()) => {
                self.remaining -= buf.len() as u64;
                Ok(())
            }
            // The file was shorter than its length said (shrunk while being read).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(invalid(format!("truncated in {what}"))),
            Err(e) => Err(Error::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sections: &[([u8; 4], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out).unwrap();
        for (tag, p) in sections {
            w.section(*tag, p).unwrap();
        }
        out
    }

    fn read_all(bytes: &[u8], sections: &[[u8; 4]]) -> Result<Vec<Vec<u8>>> {
        let mut r: &[u8] = bytes;
        let mut reader = Reader::new(&mut r, bytes.len() as u64)?;
        let mut out = Vec::new();
        for tag in sections {
            let mut buf = Vec::new();
            reader.section(*tag, "test", 0, 100, &mut buf)?;
            out.push(buf);
        }
        reader.finish()?;
        Ok(out)
    }

    #[test]
    fn sections_round_trip() {
        let bytes = file(&[(*b"AAAA", b"hello"), (*b"BBBB", b"")]);
        assert_eq!(bytes.len() as u64, 12 + 2 * SECTION_HEADER + 5);
        assert_eq!(read_all(&bytes, &[*b"AAAA", *b"BBBB"]).unwrap(), vec![b"hello".to_vec(), vec![]]);
    }

    #[test]
    fn every_damage_is_an_invalid_argument_naming_it() {
        let bytes = file(&[(*b"AAAA", b"hello"), (*b"BBBB", b"!")]);
        let err = |b: &[u8], tags: &[[u8; 4]]| match read_all(b, tags) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        assert!(err(&bytes[..bytes.len() - 1], &[*b"AAAA", *b"BBBB"]).contains("only 0 remain"));
        assert!(err(&bytes[..37], &[*b"AAAA", *b"BBBB"]).contains("section 2 (test) is missing"));
        assert!(err(&bytes, &[*b"AAAA", *b"CCCC"]).contains("should be 'CCCC'"));
        assert!(err(&bytes, &[*b"AAAA"]).contains("unexpected bytes"));
        let mut flipped = bytes.clone();
        flipped[33] ^= 1;
        assert!(err(&flipped, &[*b"AAAA", *b"BBBB"]).contains("checksum"));
        let mut version = bytes.clone();
        version[8] = 9;
        assert!(err(&version, &[]).contains("version 9"));
        assert!(err(b"GGUF\x03\0\0\0\0\0\0\0", &[]).contains("not a Pocket"));
        assert!(err(b"PKT", &[]).contains("too few"));
        let mut r: &[u8] = &bytes;
        let mut reader = Reader::new(&mut r, bytes.len() as u64).unwrap();
        let m = match reader.section(*b"AAAA", "sized", 6, 6, &mut Vec::new()) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(m.contains("holds 5 bytes, expected 6"), "{m}");
    }
}
