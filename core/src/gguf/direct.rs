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
        Span { start, len: (skip + len).div_ceil(ALIGN) * ALIGN, skip }
    }
}

/// A second descriptor of the model file, for reads around the page cache.
pub struct DirectFile {
    file: File,
    /// Offset of the model's first byte in the file (a range of an APK).
    base: u64,
    /// Bytes of the model.
    len: u64,
    direct: bool,
}

impl DirectFile {
    /// Open `file`'s bytes `base..base + len` for direct reads. `file` is a
    /// descriptor of the model file (it is reopened, not changed).
    pub fn open(file: &File, base: u64, len: u64) -> Result<DirectFile> {
        let (file, direct) = reopen_uncached(file)?;
        if !direct {
            log::info!("direct I/O unavailable on this file system: expert reads go through the page cache");
        }
        Ok(DirectFile { file, base, len, direct })
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The aligned read around the model's bytes `offset..offset + len`.
    pub fn span(&self, offset: u64, len: usize) -> Span {
        Span::around(self.base + offset, len)
    }

    /// Read `span` (from [`span`](Self::span)) into `buf`, which is
    /// `ALIGN`-aligned and at least `span.len` long. Bytes past the model's
    /// end read as zero; a file that has shrunk below the model's length is
    /// an I/O error.
    pub fn read(&self, span: Span, buf: &mut [u8]) -> Result<()> {
        debug_assert!((buf.as_ptr() as usize).is_multiple_of(ALIGN) && buf.len() >= span.len);
        let end = self.base + self.len;
        let mut done = 0usize;
        while done < span.len {
            let n = read_at(&self.file, &mut buf[done..span.len], span.start + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        // The aligned tail may run past the model's last byte; the model's own bytes may not be missing.
        let needed = ((span.start + span.len as u64).min(end).saturating_sub(span.start)) as usize;
        if done < needed {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the model file ends at byte {} of {} (truncated or replaced while loaded?)",
                    span.start + done as u64 - self.base,
                    self.len
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
    /// written (a device buffer mapped for writing).
    pub fn read_each(&self, offset: u64, len: usize, bounce: &mut [u8], put: &mut dyn FnMut(&[u8])) -> Result<()> {
        let step = (bounce.len() / ALIGN - 1) * ALIGN;
        let mut done = 0usize;
        while done < len {
            let n = step.min(len - done);
            let s = self.span(offset + done as u64, n);
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
