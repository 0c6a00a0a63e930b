//! Positional reads of the model file that bypass the page cache (`O_DIRECT`
//! on Linux and Android, `F_NOCACHE` on Apple), for a model that runs under
//! a memory budget: what it reads lands in memory it owns and accounts for,
//! and never also in the page cache, which on a phone counts against the
//! app just the same.
//!
//! Direct I/O needs the file offset, the length and the buffer address
//! aligned to the device's block; [`ALIGN`] (4 KiB) covers every block size
//! in use. A read of an unaligned range therefore reads the aligned range
//! around it into a buffer with room for [`padded`] bytes, and the caller
//! finds its bytes at [`Span::skip`]. Where the OS refuses direct I/O (a
//! file system without it), reads fall back to ordinary positional reads.

use std::fs::File;
use std::io;

use crate::error::{Error, Result};

/// Alignment of direct reads: offsets, lengths and buffer addresses.
pub const ALIGN: usize = 4096;

/// Bytes of buffer needed to read any `len`-byte range directly.
pub fn padded(len: usize) -> usize {
    (len + 2 * ALIGN - 1) / ALIGN * ALIGN
}

/// Where a range's bytes sit in the buffer of its aligned read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The file (of a split model's shards) the read is from.
    pub part: usize,
    /// Aligned offset in the file (not the model) the read starts at.
    pub start: u64,
    /// Aligned length read.
    pub len: usize,
    /// The wanted bytes start this far into the buffer.
    pub skip: usize,
}

impl Span {
    /// The aligned read around `len` bytes at file offset `offset`.
    fn around(offset: u64, len: usize) -> Span {
        let start = offset / ALIGN as u64 * ALIGN as u64;
        let skip = (offset - start) as usize;
        Span { part: 0, start, len: (skip + len).div_ceil(ALIGN) * ALIGN, skip }
    }
}

/// One file of the model (the whole model, or one shard of a split model).
struct Part {
    file: File,
    /// Offset of the part's first byte in its file (a range of an APK).
    base: u64,
    /// Where the part's bytes sit in the model's bytes.
    at: u64,
    /// Bytes of the part.
    len: u64,
}

/// A second descriptor of each of the model's files, for reads around the
/// page cache. Offsets are the model's (those of [`super::Source::bytes`]);
/// a split model's shards sit there one after another, and a read of a
/// range inside one shard reads that shard's file.
pub struct DirectFile {
    parts: Vec<Part>,
    direct: bool,
}

impl DirectFile {
    /// Open `file`'s bytes `base..base + len` for direct reads. `file` is a
    /// descriptor of the model file (it is reopened, not changed).
    pub fn open(file: &File, base: u64, len: u64) -> Result<DirectFile> {
        Self::open_parts(&[(file, base, 0, len)])
    }

    /// Open several files as one model: for each, `(file, base, at, len)`:
    /// its bytes `base..base + len` sit at `at..at + len` of the model
    /// (in increasing `at`, not overlapping).
    pub fn open_parts(parts: &[(&File, u64, u64, u64)]) -> Result<DirectFile> {
        let mut out = Vec::with_capacity(parts.len());
        let mut direct = true;
        for &(file, base, at, len) in parts {
            let (file, d) = reopen_uncached(file)?;
            direct &= d;
            out.push(Part { file, base, at, len });
        }
        if !direct {
            log::info!("direct I/O unavailable on this file system: expert reads go through the page cache");
        }
        Ok(DirectFile { parts: out, direct })
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The part holding the model's byte `offset` (the last part starting at or before it).
    fn part_of(&self, offset: u64) -> usize {
        self.parts.partition_point(|p| p.at <= offset).saturating_sub(1)
    }

    /// The aligned read around the model's bytes `offset..offset + len`
    /// (which lie in one file: a tensor never spans two shards).
    pub fn span(&self, offset: u64, len: usize) -> Span {
        let i = self.part_of(offset);
        let p = &self.parts[i];
        Span { part: i, ..Span::around(p.base + offset.saturating_sub(p.at), len) }
    }

    /// Read `span` (from [`span`](Self::span)) into `buf`, which is
    /// `ALIGN`-aligned and at least `span.len` long. Bytes past the file's
    /// end read as zero; a file that has shrunk below the model's length is
    /// an I/O error.
    pub fn read(&self, span: Span, buf: &mut [u8]) -> Result<()> {
        debug_assert!((buf.as_ptr() as usize).is_multiple_of(ALIGN) && buf.len() >= span.len);
        let p = &self.parts[span.part];
        let end = p.base + p.len;
        let mut done = 0usize;
        while done < span.len {
            let n = read_at(&p.file, &mut buf[done..span.len], span.start + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        // The aligned tail may run past the model's last byte; the model's own bytes may not be missing.
        let needed = ((span.start + span.len as u64).min(end).saturating_sub(span.start)) as usize;
        if done < needed {
            let which = if self.parts.len() > 1 {
                format!("shard {} of the model", span.part + 1)
            } else {
                "the model file".into()
            };
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{which} ends at byte {} of {} (truncated or replaced while loaded?)",
                    span.start + done as u64 - p.base,
                    p.len
                ),
            )));
        }
        buf[done.min(span.len)..span.len].fill(0);
        Ok(())
    }

    /// Copy the model's bytes `offset..offset + out.len()` into `out` (any
    /// alignment), through `bounce` (an aligned buffer; any length of at
    /// least `2 * ALIGN`).
    pub fn read_into(&self, offset: u64, out: &mut [u8], bounce: &mut [u8]) -> Result<()> {
        let mut done = 0usize;
        self.read_each(offset, out.len(), bounce, &mut |bytes| {
            out[done..done + bytes.len()].copy_from_slice(bytes);
            done += bytes.len();
        })
    }

    /// The model's bytes `offset..offset + len`, in order, handed to `put`
    /// a piece at a time as they arrive in `bounce` (as in
    /// [`read_into`](Self::read_into)): for memory that may only be
    /// written (a device buffer mapped for writing). A range may cross from
    /// one shard into the next; the bytes between two shards read as zero.
    pub fn read_each(&self, offset: u64, len: usize, bounce: &mut [u8], put: &mut dyn FnMut(&[u8])) -> Result<()> {
        let step = (bounce.len() / ALIGN - 1) * ALIGN;
        let mut done = 0usize;
        while done < len {
            let off = offset + done as u64;
            let i = self.part_of(off);
            let p = &self.parts[i];
            let in_part = (p.at + p.len).saturating_sub(off);
            if in_part == 0 && i + 1 < self.parts.len() {
                // Between two shards: no file holds these bytes.
                let n = step.min(len - done).min((self.parts[i + 1].at - off) as usize);
                bounce[..n].fill(0);
                put(&bounce[..n]);
                done += n;
                continue;
            }
            // Past the last shard's end, `read` fills zeros as for one file.
            let n = step.min(len - done).min(if in_part == 0 { usize::MAX } else { in_part as usize });
            let s = self.span(off, n);
            self.read(s, bounce)?;
            put(&bounce[s.skip..s.skip + n]);
            done += n;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buf, offset) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::Io(e)),
        }
    }
}

#[cfg(not(unix))]
fn read_at(_: &File, _: &mut [u8], _: u64) -> Result<usize> {
    Err(Error::Io(io::Error::new(io::ErrorKind::Unsupported, "positional reads need a unix platform")))
}

/// A new open file description of `file` without page caching where the OS
/// allows (`true`), else a plain duplicate (`false`).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn reopen_uncached(file: &File) -> Result<(File, bool)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // A fresh description through /proc: O_DIRECT set on a duplicate would
    // also change the caller's descriptor (flags live on the description).
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&proc_path) {
        Ok(f) => Ok((f, true)),
        Err(_) => Ok((file.try_clone()?, false)),
    }
}

#[cfg(target_vendor = "apple")]
fn reopen_uncached(file: &File) -> Result<(File, bool)> {
    use std::os::fd::AsRawFd;
    let f = file.try_clone()?;
    // SAFETY: fcntl on a descriptor we own; F_NOCACHE takes an int.
    let ok = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == 0;
    Ok((f, ok))
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn reopen_uncached(file: &File) -> Result<(File, bool)> {
    Ok((file.try_clone()?, false))
}

/// Memory for direct reads: `len` bytes, page-aligned, zeroed lazily by the
/// OS (untouched pages cost nothing).
pub struct AlignedBuf {
    map: memmap2::MmapMut,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Result<AlignedBuf> {
        let map = memmap2::MmapMut::map_anon(len.max(1))
            .map_err(|e| Error::OutOfMemory(format!("{len} bytes for model weights: {e}")))?;
        Ok(AlignedBuf { map })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// A raw pointer for threads that fill disjoint parts.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_the_range_on_aligned_bounds() {
        for (off, len) in [(0u64, 1usize), (1, 4095), (4095, 2), (8192, 4096), (10_000, 1_138_688), (12_345, 0)] {
            let s = Span::around(off, len);
            assert_eq!(s.start % ALIGN as u64, 0);
            assert_eq!(s.len % ALIGN, 0);
            assert_eq!(s.start + s.skip as u64, off);
            assert!(s.skip + len <= s.len && s.len <= padded(len));
        }
    }

    #[test]
    fn direct_reads_return_the_file_s_bytes_and_fail_on_a_short_file() {
        let path = std::env::temp_dir().join(format!("pocket-direct-{}.bin", std::process::id()));
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let d = DirectFile::open(&f, 0, data.len() as u64).unwrap();
        let mut buf = AlignedBuf::new(padded(9000)).unwrap();
        for (off, len) in [(0usize, 10), (4000, 9000), (19_990, 10), (5, 4096)] {
            let s = d.span(off as u64, len);
            d.read(s, buf.as_mut_slice()).unwrap();
            assert_eq!(&buf.as_slice()[s.skip..s.skip + len], &data[off..off + len]);
        }
        // A model at an unaligned offset in its file (an APK asset), copied through a bounce buffer.
        let inner = DirectFile::open(&f, 1000, 15_000).unwrap();
        let mut out = vec![0u8; 12_345];
        inner.read_into(7, &mut out, buf.as_mut_slice()).unwrap();
        assert_eq!(out, &data[1007..1007 + 12_345]);
        // The model claims more bytes than the file now has: an I/O error, not garbage.
        let short = DirectFile::open(&f, 0, 30_000).unwrap();
        let e = short.read(short.span(24_000, 100), buf.as_mut_slice()).unwrap_err();
        assert!(matches!(e, Error::Io(_)), "{e}");
        std::fs::remove_file(&path).ok();
    }
}
