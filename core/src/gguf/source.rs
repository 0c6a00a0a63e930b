//! Where a GGUF file's bytes come from: a memory map of a whole file, a map of a
//! byte range of an open descriptor (an uncompressed asset inside an APK), or
//! an owned buffer (tests, fuzzing).

use std::fs::File;
use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions};

use crate::error::{Error, Result};

/// The bytes of one GGUF file, immutable for the life of the model.
pub struct Source {
    bytes: Bytes,
}

enum Bytes {
    Mapped(Mmap),
    /// Kept as u64 words so that the start is 8-byte aligned like a mapping.
    Owned {
        words: Vec<u64>,
        len: usize,
    },
}

impl Source {
    /// Map a whole file read-only. Nothing is read until a page is touched.
    pub fn open(path: &Path) -> Result<Source> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Self::map_range(&file, 0, len)
    }

    /// Map `len` bytes of an open file starting at byte `offset`.
    ///
    /// The offset need not be page-aligned: the enclosing pages are mapped and
    /// the view starts at `offset`. The descriptor is only borrowed; the
    /// mapping stays valid after the caller closes it.
    #[cfg(unix)]
    pub fn open_fd(fd: std::os::fd::RawFd, offset: u64, len: u64) -> Result<Source> {
        use std::os::fd::BorrowedFd;
        if fd < 0 {
            return Err(Error::InvalidArgument(format!("file descriptor {fd}")));
        }
        // SAFETY: the caller promises `fd` is open for the duration of this call;
        // we duplicate it and never close the caller's descriptor.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let file = File::from(borrowed.try_clone_to_owned()?);
        Self::map_range(&file, offset, len)
    }

    fn map_range(file: &File, offset: u64, len: u64) -> Result<Source> {
        let file_len = file.metadata()?.len();
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > file_len) {
            return Err(Error::RangeOutsideFile { offset, len, file_len });
        }
        if len == 0 {
            return Ok(Self::from_vec(Vec::new()));
        }
        let len_usize = usize::try_from(len)
            .map_err(|_| Error::OutOfMemory(format!("{len}-byte file exceeds the address space")))?;
        // SAFETY: the map is read-only. Model files must not be modified while
        // loaded (as with every mmap-based engine); the reader validates bounds
        // against the length fixed here, so truncation elsewhere cannot make it
        // index out of range.
        let map = unsafe { MmapOptions::new().offset(offset).len(len_usize).map(file)? };
        Ok(Source { bytes: Bytes::Mapped(map) })
    }

    /// Own a buffer (tests, fuzzing, files read into memory).
    pub fn from_vec(v: Vec<u8>) -> Source {
        let len = v.len();
        let mut words = vec![0u64; len.div_ceil(8)];
        // SAFETY: `words` holds at least `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), words.as_mut_ptr() as *mut u8, len) };
        Source { bytes: Bytes::Owned { words, len } }
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            // SAFETY: the first `len` bytes of `words` were initialised from the vector.
            Bytes::Owned { words, len } => unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, *len) },
        }
    }

    /// Whether the bytes are a memory map (as opposed to an owned buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    /// Tell the kernel how a byte range will be read (best effort, never fails).
    pub fn advise(&self, offset: usize, len: usize, pattern: AccessPattern) {
        if let Bytes::Mapped(m) = &self.bytes {
            let advice = match pattern {
                AccessPattern::Sequential => Advice::Sequential,
                AccessPattern::Random => Advice::Random,
                AccessPattern::WillNeed => Advice::WillNeed,
            };
            if offset.checked_add(len).is_some_and(|e| e <= m.len()) && len > 0 {
                // Advice on the enclosing pages; failures only cost speed.
                let _ = m.advise_range(advice, offset, len);
            }
        }
    }
}

/// How a range of weights will be read; see [`Source::advise`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessPattern {
    /// Read front to back every token (dense weights).
    Sequential,
    /// Read in scattered slabs (routed experts).
    Random,
    /// Read soon.
    WillNeed,
}
