//! The routed experts of a model under a memory budget: a cache of fixed
//! slots, each holding one expert's three slabs (gate, up, down) of one
//! layer, filled by direct reads of the file (around the page cache, see
//! [`crate::gguf::direct`]), all of a layer's missing experts at once on
//! several threads, evicting the least recently used unpinned slot.
//!
//! A forward pass [`fetch`](ExpertCache::fetch)es the experts a layer routed
//! to and gets a [`Lease`]: the experts are pinned (no other pass can evict
//! them) until the lease is dropped. One fetch at a time holds the cache's
//! lock, its reads included; a fetch that finds too few unpinned slots waits
//! for other passes' leases to end.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::weights::Experts;
use crate::error::{Error, Result};
use crate::gguf::direct::{padded, AlignedBuf, DirectFile};
use crate::kernels::QMatrix;

/// Read threads per fetch: enough requests in flight for flash storage to
/// reach its parallel bandwidth (UFS and NVMe want 8-32).
const IO_THREADS: usize = 16;

/// What serving experts cost: counted per pass, summed per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertIo {
    /// Experts found in the cache.
    pub hits: u64,
    /// Experts read from storage.
    pub misses: u64,
    /// Bytes read from storage.
    pub bytes_read: u64,
}

impl std::ops::AddAssign for ExpertIo {
    fn add_assign(&mut self, o: ExpertIo) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.bytes_read += o.bytes_read;
    }
}

impl std::ops::Sub for ExpertIo {
    type Output = ExpertIo;
    fn sub(self, o: ExpertIo) -> ExpertIo {
        ExpertIo {
            hits: self.hits - o.hits,
            misses: self.misses - o.misses,
            bytes_read: self.bytes_read - o.bytes_read,
        }
    }
}

/// One slot's bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// `(layer << 32) | expert`, or `None` when empty.
    key: Option<u64>,
    /// Leases holding it.
    pins: u32,
    /// Clock of its last use (LRU).
    last: u64,
    /// Where each slab's bytes start in its part of the slot.
    skip: [usize; 3],
}

struct Inner {
    map: HashMap<u64, usize>,
    slots: Vec<Slot>,
    clock: u64,
}

/// The expert cache of one model.
pub struct ExpertCache {
    direct: DirectFile,
    /// Bytes of each slab's part of a slot (the padded size of the largest
    /// slab of that projection over all layers), and of a whole slot.
    part: [usize; 3],
    slot_bytes: usize,
    n_slots: usize,
    /// `n_slots * slot_bytes`, written only by a fetch, in slots it has
    /// pinned and not yet handed out.
    mem: UnsafeCell<AlignedBuf>,
    inner: Mutex<Inner>,
    released: Condvar,
}

// SAFETY: `mem` is written only under `inner`'s lock, in slots that no lease
// can read (they were just taken for the fetch holding the lock); leases read
// only slots they pin, which are never written while pinned.
unsafe impl Sync for ExpertCache {}
unsafe impl Send for ExpertCache {}

impl ExpertCache {
    /// Bytes one slot takes for experts shaped like `tensors` (every
    /// routed-expert tensor of the model, as `[gate, up, down]` per layer).
    pub fn slot_bytes(tensors: &[[&Experts; 3]]) -> usize {
        Self::parts(tensors).iter().sum()
    }

    fn parts(tensors: &[[&Experts; 3]]) -> [usize; 3] {
        let mut part = [0usize; 3];
        for layer in tensors {
            for (p, x) in part.iter_mut().zip(layer) {
                *p = (*p).max(padded(x.slab_bytes()));
            }
        }
        part
    }

    /// A cache of `n_slots` slots for experts shaped like `tensors`, read through `direct`.
    pub fn new(direct: DirectFile, tensors: &[[&Experts; 3]], n_slots: usize) -> Result<ExpertCache> {
        let part = Self::parts(tensors);
        let slot_bytes: usize = part.iter().sum();
        let total = slot_bytes
            .checked_mul(n_slots)
            .ok_or_else(|| Error::OutOfMemory(format!("{n_slots} expert slots of {slot_bytes} bytes")))?;
        Ok(ExpertCache {
            direct,
            part,
            slot_bytes,
            n_slots,
            mem: UnsafeCell::new(AlignedBuf::new(total)?),
            inner: Mutex::new(Inner { map: HashMap::new(), slots: vec![Slot::default(); n_slots], clock: 0 }),
            released: Condvar::new(),
        })
    }

    /// Experts the cache can hold at once.
    pub fn capacity(&self) -> usize {
        self.n_slots
    }

    /// Make `experts` (at most [`capacity`](Self::capacity), distinct) of
    /// `layer` resident and pin them; `tensors` are that layer's gate, up and
    /// down stacks. Reads every missing slab on several threads.
    pub fn fetch(&self, layer: usize, experts: &[usize], tensors: [&Experts; 3]) -> Result<Lease<'_>> {
        assert!(experts.len() <= self.n_slots, "fetch of {} experts from {} slots", experts.len(), self.n_slots);
        let key = |e: usize| ((layer as u64) << 32) | e as u64;
        let mut inner = self.lock();
        // Wait until the unpinned slots, less those this fetch hits, can take its misses.
        loop {
            let (mut misses, mut unpinned_hits) = (0, 0);
            for &e in experts {
                match inner.map.get(&key(e)) {
                    Some(&s) if inner.slots[s].pins == 0 => unpinned_hits += 1,
                    Some(_) => {}
                    None => misses += 1,
                }
            }
            let unpinned = inner.slots.iter().filter(|s| s.pins == 0).count();
            if misses <= unpinned - unpinned_hits {
                break;
            }
            inner = self.released.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
        inner.clock += 1;
        let clock = inner.clock;
        let mut slots = Vec::with_capacity(experts.len());
        let mut loads: Vec<(usize, usize)> = Vec::new(); // (slot, expert)
        let mut io = ExpertIo::default();
        for &e in experts {
            let k = key(e);
            let slot = match inner.map.get(&k) {
                Some(&s) => {
                    io.hits += 1;
                    s
                }
                None => {
                    let victim = (0..self.n_slots)
                        .filter(|&s| inner.slots[s].pins == 0)
                        .min_by_key(|&s| (inner.slots[s].key.is_some(), inner.slots[s].last))
                        .expect("a free slot was waited for");
                    if let Some(old) = inner.slots[victim].key.take() {
                        inner.map.remove(&old);
                    }
                    inner.slots[victim].key = Some(k);
                    inner.map.insert(k, victim);
                    loads.push((victim, e));
                    io.misses += 1;
                    victim
                }
            };
            let s = &mut inner.slots[slot];
            s.pins += 1;
            s.last = clock;
            slots.push(slot);
        }
        if let Err(e) = self.load(&mut inner, &loads, tensors, &mut io) {
            // Nothing half-read stays: the loaded slots are emptied, every pin undone.
            for &(slot, _) in &loads {
                if let Some(k) = inner.slots[slot].key.take() {
                    inner.map.remove(&k);
                }
            }
            for &s in &slots {
                inner.slots[s].pins -= 1;
            }
            self.released.notify_all();
            return Err(e);
        }
        let skips = slots.iter().map(|&s| inner.slots[s].skip).collect();
        Ok(Lease { cache: self, slots, skips, io })
    }

    /// Read the slabs of `loads` into their slots, on up to [`IO_THREADS`] threads.
    fn load(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        loads: &[(usize, usize)],
        tensors: [&Experts; 3],
        io: &mut ExpertIo,
    ) -> Result<()> {
        if loads.is_empty() {
            return Ok(());
        }
        // One job per slab: (slot, part, span).
        let mut jobs = Vec::with_capacity(3 * loads.len());
        for &(slot, e) in loads {
            for (p, x) in tensors.iter().enumerate() {
                let r = x.slab_range(e);
                let span = self.direct.span(r.start as u64, r.len());
                inner.slots[slot].skip[p] = span.skip;
                io.bytes_read += span.len as u64;
                jobs.push((slot, p, span));
            }
        }
        // SAFETY: the slots being loaded were taken under the lock held by
        // our caller; no lease reads them until this fetch returns.
        let base = unsafe { (*self.mem.get()).as_mut_ptr() } as usize;
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(slot, p, span)) = jobs.get(i) else { break };
            let off = slot * self.slot_bytes + self.part[..p].iter().sum::<usize>();
            // SAFETY: disjoint parts of slots this fetch owns, inside `mem`.
            let buf = unsafe { std::slice::from_raw_parts_mut((base + off) as *mut u8, self.part[p]) };
            if let Err(e) = self.direct.read(span, buf) {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                break;
            }
        };
        let threads = IO_THREADS.min(jobs.len());
        std::thread::scope(|s| {
            for _ in 1..threads {
                s.spawn(work);
            }
            work();
        });
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Experts of one layer pinned in the cache, in the order they were fetched.
pub struct Lease<'a> {
    cache: &'a ExpertCache,
    slots: Vec<usize>,
    skips: Vec<[usize; 3]>,
    /// What this fetch found and read.
    pub io: ExpertIo,
}

impl Lease<'_> {
    /// The slab of projection `p` (0 gate, 1 up, 2 down; `x` its stack) of
    /// the `i`-th fetched expert, as a kernel view.
    pub fn slab(&self, i: usize, p: usize, x: &Experts) -> QMatrix<'_> {
        let c = self.cache;
        let off = self.slots[i] * c.slot_bytes + c.part[..p].iter().sum::<usize>() + self.skips[i][p];
        // SAFETY: the slot is pinned by this lease and fully read; nothing
        // writes a pinned slot.
        let mem = unsafe { (*c.mem.get()).as_slice() };
        QMatrix { ty: x.all.ty, data: &mem[off..off + x.slab_bytes()], rows: x.rows, cols: x.all.cols }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut inner = self.cache.lock();
        for &s in &self.slots {
            inner.slots[s].pins -= 1;
        }
        drop(inner);
        self.cache.released.notify_all();
    }
}
