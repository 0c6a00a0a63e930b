//! Where a GGUF file's bytes come from: a memory map of a whole file, a map of a
//! byte range of an open descriptor (an uncompressed asset inside an APK), or
//! an owned buffer (tests, fuzzing).

use std::fs::File;
use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions};

use super::direct::{AlignedBuf, DirectFile};
use crate::error::{Error, Result};

/// The bytes of one GGUF file, immutable for the life of the model.
pub struct Source {
    bytes: Bytes,
    /// The file the bytes came from and where in it they start (for direct
    /// reads); `None` for a buffer given in memory.
    origin: Option<(File, u64)>,
}

enum Bytes {
    Mapped(Mmap),
    /// Read into memory the model owns: only the ranges a budgeted model
    /// keeps resident; the rest is never touched (see [`Source::into_resident`]).
    /// With the bytes the kept ranges hold.
    Resident(AlignedBuf, u64),
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
        Ok(Source { bytes: Bytes::Mapped(map), origin: Some((file.try_clone()?, offset)) })
    }

    /// Own a buffer (tests, fuzzing, files read into memory).
    pub fn from_vec(v: Vec<u8>) -> Source {
        let len = v.len();
        let mut words = vec![0u64; len.div_ceil(8)];
        // SAFETY: `words` holds at least `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), words.as_mut_ptr() as *mut u8, len) };
        Source { bytes: Bytes::Owned { words, len }, origin: None }
    }

    /// A second descriptor of the file for reads that bypass the page cache,
    /// if the bytes came from a file.
    pub fn direct(&self) -> Result<Option<DirectFile>> {
        match &self.origin {
            Some((file, base)) => Ok(Some(DirectFile::open(file, *base, self.bytes().len() as u64)?)),
            None => Ok(None),
        }
    }

    /// The same file with only the byte ranges `keep` held, read into owned
    /// memory (around the page cache) and the mapping dropped: a budgeted
    /// model's resident weights. Offsets stay as they were; bytes outside
    /// `keep` read as zero and are never touched, so they cost no memory.
    /// A buffer already in memory is returned as it is.
    pub fn into_resident(self, keep: &[std::ops::Range<usize>]) -> Result<Source> {
        match self.resident_copy(keep)? {
            Some(resident) => Ok(resident),
            None => Ok(self),
        }
    }

    /// [`into_resident`](Self::into_resident) leaving this source as it is
    /// (a model that takes a memory budget while it runs); `None` for a
    /// buffer already in memory.
    pub fn resident_copy(&self, keep: &[std::ops::Range<usize>]) -> Result<Option<Source>> {
        let Some(direct) = self.direct()? else { return Ok(None) };
        let len = self.bytes().len();
        let mut buf = AlignedBuf::new(len)?;
        let mut bounce = AlignedBuf::new(8 << 20)?;
        for r in keep {
            if r.end > len || r.start > r.end {
                return Err(Error::RangeOutsideFile {
                    offset: r.start as u64,
                    len: r.len() as u64,
                    file_len: len as u64,
                });
            }
            direct.read_into(r.start as u64, &mut buf.as_mut_slice()[r.clone()], bounce.as_mut_slice())?;
        }
        let origin = match &self.origin {
            Some((file, base)) => Some((file.try_clone()?, *base)),
            None => None,
        };
        let kept = keep.iter().map(|r| r.len() as u64).sum();
        Ok(Some(Source { bytes: Bytes::Resident(buf, kept), origin }))
    }

    /// Let the OS take back the pages of the mapping this process has
    /// touched (`MADV_DONTNEED` on a read-only file mapping: they stay in the
    /// page cache, reclaimable, and are read again if touched). Nothing for
    /// memory the source owns. Best effort.
    pub fn release(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &self.bytes {
            if !m.is_empty() {
                // SAFETY: a private read-only file mapping: dropping its pages
                // loses nothing (they are the file's bytes, read back on the
                // next touch), and no reference into it can observe a change.
                let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
            }
        }
    }

    /// Bytes of the source in memory now: of a mapping, its pages in the
    /// page cache (`mincore`); memory the source owns, whole.
    pub fn resident_bytes(&self) -> u64 {
        match &self.bytes {
            Bytes::Mapped(m) => mapped_resident(m),
            Bytes::Resident(_, kept) => *kept,
            Bytes::Owned { len, .. } => *len as u64,
        }
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Resident(b, _) => b.as_slice(),
            // SAFETY: the first `len` bytes of `words` were initialised from the vector.
            Bytes::Owned { words, len } => unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, *len) },
        }
    }

    /// Whether the bytes are a memory map (as opposed to an owned buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    /// Tell the kernel a mapped byte range will be read soon
    /// (`MADV_WILLNEED`: it starts reading the whole range in large
    /// requests). Best effort, never fails; nothing for a buffer in memory.
    pub fn will_need(&self, offset: usize, len: usize) {
        if let Bytes::Mapped(m) = &self.bytes {
            if offset.checked_add(len).is_some_and(|e| e <= m.len()) && len > 0 {
                // Advice on the enclosing pages; failures only cost speed.
                let _ = m.advise_range(Advice::WillNeed, offset, len);
            }
        }
    }
}

/// Bytes of `m` whose pages are in memory (`mincore`, a GiB at a time).
#[cfg(unix)]
fn mapped_resident(m: &Mmap) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let base = m.as_ptr() as usize;
    // The mapping starts on a page (the view may start inside it: see map_range).
    let start = base / page * page;
    let end = base + m.len();
    let mut vec = Vec::new();
    let mut resident = 0u64;
    let mut at = start;
    while at < end {
        let len = (end - at).min(1 << 30);
        let pages = len.div_ceil(page);
        vec.resize(pages, 0u8);
        // SAFETY: `at..at + len` lies inside the live mapping (rounded out
        // to its pages); `vec` has one byte per page.
        let rc = unsafe { libc::mincore(at as *mut libc::c_void, len, vec.as_mut_ptr() as *mut _) };
        if rc != 0 {
            return m.len() as u64;
        }
        resident += vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64;
        at += len;
    }
    resident.min(m.len() as u64)
}

#[cfg(not(unix))]
fn mapped_resident(m: &Mmap) -> u64 {
    m.len() as u64
}
