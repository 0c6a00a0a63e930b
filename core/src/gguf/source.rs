//! Where a GGUF file's bytes come from: a memory map of a whole file, a map of a
//! byte range of an open descriptor (an uncompressed asset inside an APK), the
//! shards of a split model mapped one after another into one range of
//! addresses, or an owned buffer (tests, fuzzing).

use std::fs::File;
use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions};

use super::direct::{AlignedBuf, DirectFile};
use crate::error::{Error, Result};

/// The bytes of one GGUF file (or of a split model's files, one after
/// another), immutable for the life of the model.
pub struct Source {
    bytes: Bytes,
    /// The files the bytes came from (for direct reads): one, or a split
    /// model's shards in order; empty for a buffer given in memory.
    origins: Vec<Origin>,
}

/// One file behind a [`Source`].
struct Origin {
    file: File,
    /// Where the bytes start in the file.
    offset: u64,
    /// Where they sit in [`Source::bytes`].
    at: u64,
    len: u64,
}

enum Bytes {
    Mapped(Mmap),
    /// Several files mapped one after another into one reserved range.
    #[cfg(unix)]
    Joined(Joined),
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
        let origin = Origin { file: file.try_clone()?, offset, at: 0, len };
        Ok(Source { bytes: Bytes::Mapped(map), origins: vec![origin] })
    }

    /// Several sources as one: each one's bytes at the returned offset of
    /// the new source's bytes, in order, on page boundaries (a tensor's
    /// bytes keep the alignment they had). Mapped files are mapped again
    /// side by side in one range of addresses (nothing is read); anything
    /// else is copied into one buffer. One source is returned as it is.
    pub fn join(parts: Vec<Source>) -> Result<(Source, Vec<u64>)> {
        if parts.len() == 1 {
            return Ok((parts.into_iter().next().expect("one part"), vec![0]));
        }
        #[cfg(unix)]
        if parts.iter().all(|p| matches!(p.bytes, Bytes::Mapped(_)) && p.origins.len() == 1) {
            let origins: Vec<Origin> =
                parts.into_iter().map(|p| p.origins.into_iter().next().expect("one origin")).collect();
            let (joined, ats) = Joined::map(&origins)?;
            let origins = origins.into_iter().zip(&ats).map(|(o, &at)| Origin { at, ..o }).collect();
            return Ok((Source { bytes: Bytes::Joined(joined), origins }, ats));
        }
        let mut ats = Vec::with_capacity(parts.len());
        let mut end = 0u64;
        for p in &parts {
            let at = end.next_multiple_of(JOIN_ALIGN);
            ats.push(at);
            end = at + p.bytes().len() as u64;
        }
        let len = usize::try_from(end).map_err(|_| Error::OutOfMemory(format!("{end} bytes of model")))?;
        let mut words: Vec<u64> = Vec::new();
        words
            .try_reserve_exact(len.div_ceil(8))
            .map_err(|_| Error::OutOfMemory(format!("{len} bytes to hold the model's files")))?;
        words.resize(len.div_ceil(8), 0);
        for (p, &at) in parts.iter().zip(&ats) {
            let b = p.bytes();
            // SAFETY: `words` holds `len` bytes and `at + b.len() <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(b.as_ptr(), (words.as_mut_ptr() as *mut u8).add(at as usize), b.len())
            };
        }
        Ok((Source { bytes: Bytes::Owned { words, len }, origins: Vec::new() }, ats))
    }

    /// Own a buffer (tests, fuzzing, files read into memory).
    pub fn from_vec(v: Vec<u8>) -> Source {
        let len = v.len();
        let mut words = vec![0u64; len.div_ceil(8)];
        // SAFETY: `words` holds at least `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), words.as_mut_ptr() as *mut u8, len) };
        Source { bytes: Bytes::Owned { words, len }, origins: Vec::new() }
    }

    /// A second descriptor of the file (of each file of a split model) for
    /// reads that bypass the page cache, if the bytes came from files.
    pub fn direct(&self) -> Result<Option<DirectFile>> {
        if self.origins.is_empty() {
            return Ok(None);
        }
        let parts: Vec<_> = self.origins.iter().map(|o| (&o.file, o.offset, o.at, o.len)).collect();
        Ok(Some(DirectFile::open_parts(&parts)?))
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
        let origins = self
            .origins
            .iter()
            .map(|o| Ok(Origin { file: o.file.try_clone()?, offset: o.offset, at: o.at, len: o.len }))
            .collect::<Result<Vec<_>>>()?;
        let kept = keep.iter().map(|r| r.len() as u64).sum();
        Ok(Some(Source { bytes: Bytes::Resident(buf, kept), origins }))
    }

    /// Let the OS take back the pages of the mapping this process has
    /// touched (`MADV_DONTNEED` on a read-only file mapping: they stay in the
    /// page cache, reclaimable, and are read again if touched). Nothing for
    /// memory the source owns. Best effort.
    pub fn release(&self) {
        #[cfg(unix)]
        match &self.bytes {
            Bytes::Mapped(m) if !m.is_empty() => {
                // SAFETY: a private read-only file mapping: dropping its pages
                // loses nothing (they are the file's bytes, read back on the
                // next touch), and no reference into it can observe a change.
                let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
            }
            Bytes::Joined(j) => j.release(),
            _ => {}
        }
    }

    /// Bytes of the source in memory now: of a mapping, its pages in the
    /// page cache (`mincore`); memory the source owns, whole.
    pub fn resident_bytes(&self) -> u64 {
        match &self.bytes {
            Bytes::Mapped(m) => mapped_resident(m.as_ptr(), m.len()),
            #[cfg(unix)]
            Bytes::Joined(j) => mapped_resident(j.bytes().as_ptr(), j.bytes().len()),
            Bytes::Resident(_, kept) => *kept,
            Bytes::Owned { len, .. } => *len as u64,
        }
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            #[cfg(unix)]
            Bytes::Joined(j) => j.bytes(),
            Bytes::Resident(b, _) => b.as_slice(),
            // SAFETY: the first `len` bytes of `words` were initialised from the vector.
            Bytes::Owned { words, len } => unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, *len) },
        }
    }

    /// Whether the bytes are a memory map (as opposed to an owned buffer).
    pub fn is_mapped(&self) -> bool {
        match self.bytes {
            Bytes::Mapped(_) => true,
            #[cfg(unix)]
            Bytes::Joined(_) => true,
            _ => false,
        }
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
        #[cfg(unix)]
        if let Bytes::Joined(j) = &self.bytes {
            j.will_need(offset, len);
        }
    }
}

/// Where each part starts in a joined buffer (when the parts are copied):
/// a page, as when they are mapped.
const JOIN_ALIGN: u64 = 4096;

/// Files mapped side by side: one range of addresses reserved, then each
/// file's pages mapped over its part of it. Each file starts on a page
/// boundary (plus its offset within its first page), so the files' bytes
/// are separated by at most the rest of a page of each, which the mappings
/// also cover: every byte of the range is mapped.
#[cfg(unix)]
struct Joined {
    /// The reserved range.
    base: *mut u8,
    reserved: usize,
    /// The first file's first byte is `skip` bytes into the range.
    skip: usize,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value; the pointer is
// only read through shared slices.
#[cfg(unix)]
unsafe impl Send for Joined {}
#[cfg(unix)]
unsafe impl Sync for Joined {}

#[cfg(unix)]
impl Joined {
    /// Map the files of `origins` one after another. Returns the mapping and
    /// where each file's bytes start in it.
    fn map(origins: &[Origin]) -> Result<(Joined, Vec<u64>)> {
        use std::os::fd::AsRawFd;
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64;
        let too_big = || Error::OutOfMemory("the model's files exceed the address space".into());
        // (start of the part's pages in the range, offset of those pages in the file, bytes mapped)
        let mut chunks = Vec::with_capacity(origins.len());
        let mut reserved = 0u64;
        for o in origins {
            let file_off = o.offset / page * page;
            let mapped = (o.offset - file_off).checked_add(o.len).ok_or_else(too_big)?.next_multiple_of(page);
            chunks.push((reserved, file_off, mapped));
            reserved = reserved.checked_add(mapped).ok_or_else(too_big)?;
        }
        let reserved = usize::try_from(reserved).map_err(|_| too_big())?;
        // SAFETY: a fresh anonymous mapping with no access: address space only.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), reserved, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANON, -1, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        let base = base as *mut u8;
        let skip = (origins[0].offset % page) as usize;
        let mut joined = Joined { base, reserved, skip, len: 0 };
        let mut ats = Vec::with_capacity(origins.len());
        for (o, &(start, file_off, mapped)) in origins.iter().zip(&chunks) {
            let file_off = libc::off_t::try_from(file_off).map_err(|_| too_big())?;
            // SAFETY: the target lies inside the range reserved above (which
            // `joined` unmaps on every path out); MAP_FIXED replaces the
            // reservation's pages there with the file's, read-only.
            let got = unsafe {
                libc::mmap(
                    base.add(start as usize) as *mut libc::c_void,
                    mapped as usize,
                    libc::PROT_READ,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    o.file.as_raw_fd(),
                    file_off,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(Error::Io(std::io::Error::last_os_error()));
            }
            ats.push(start + o.offset % page - skip as u64);
        }
        joined.len = (ats[ats.len() - 1] + origins[origins.len() - 1].len) as usize;
        Ok((joined, ats))
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `skip + len <= reserved`, and every page of the range from
        // the first file's first byte to the last file's last byte is mapped
        // from a file (see the type's documentation) for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.base.add(self.skip), self.len) }
    }

    /// Drop the pages this process touched (see [`Source::release`]).
    fn release(&self) {
        // SAFETY: our own read-only file mappings over the whole reserved
        // range: their pages are the files' bytes, read back on the next touch.
        let _ = unsafe { libc::madvise(self.base as *mut libc::c_void, self.reserved, libc::MADV_DONTNEED) };
    }

    fn will_need(&self, offset: usize, len: usize) {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > self.len) {
            return;
        }
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(1) as usize;
        let start = (self.skip + offset) / page * page;
        let end = self.skip + offset + len;
        // SAFETY: advice on pages of our own mapping; failures only cost speed.
        unsafe { libc::madvise(self.base.add(start) as *mut libc::c_void, end - start, libc::MADV_WILLNEED) };
    }
}

#[cfg(unix)]
impl Drop for Joined {
    fn drop(&mut self) {
        // SAFETY: the range this value reserved, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.reserved) };
    }
}

/// Bytes of `m` whose pages are in memory (`mincore`, a GiB at a time).
#[cfg(unix)]
fn mapped_resident(ptr: *const u8, bytes: usize) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let base = ptr as usize;
    // The mapping starts on a page (the view may start inside it: see map_range).
    let start = base / page * page;
    let end = base + bytes;
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
            return bytes as u64;
        }
        resident += vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64;
        at += len;
    }
    resident.min(bytes as u64)
}

#[cfg(not(unix))]
fn mapped_resident(_ptr: *const u8, bytes: usize) -> u64 {
    bytes as u64
}
