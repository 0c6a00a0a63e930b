//! The routed experts of a model under a memory budget: a cache of fixed
//! slots, each holding one expert's three slabs (gate, up, down) of one
//! layer, filled by direct reads of the file (around the page cache, see
//! [`crate::gguf::direct`]) on a pool of read threads, evicting a slot
//! that nobody holds or is filling: of those not used in the last few
//! fetches, the expert used least often (a count that halves as time
//! passes), the least recently used among equals; else the least recently
//! used (see [`victim`]).
//!
//! A forward pass [`fetch`](ExpertCache::fetch)es the experts a layer routed
//! to and gets a [`Lease`] at once: the experts are pinned (no other pass can
//! evict them) until the lease is dropped, and the missing ones are being
//! read. The pass computes the experts that were already there
//! ([`Lease::is_ready`]) while the others arrive, then [`Lease::wait`]s for
//! them. [`prefetch`](ExpertCache::prefetch) starts reading experts a later
//! layer is likely to route to, without pinning or waiting.
//!
//! Each slot has memory of its own, so that the cache can grow and shrink
//! while passes run ([`resize`](ExpertCache::resize)): a slot given back
//! takes no new expert and its memory returns to the OS as soon as no lease
//! holds it and no read is filling it (within one layer of any running
//! pass). A fetch takes as many experts as the cache holds at that moment.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::weights::Experts;
use crate::error::{Error, Result};
use crate::gguf::direct::{padded, AlignedBuf, DirectFile, Span};
use crate::kernels::QMatrix;

/// Read threads: enough requests in flight for flash storage to reach its
/// parallel bandwidth (UFS and NVMe want 8-32). They sleep on a queue and
/// cost no CPU while they wait for the device.
const IO_THREADS: usize = 16;

/// Reads ahead (three per expert) left queued before [`ExpertCache::prefetch`]
/// stops adding more: when storage is the bottleneck, guesses must not
/// pile up behind one another (two layers' worth of experts stay queued).
const AHEAD_QUEUED: usize = 48;

/// Tensors one expert spans at most (gate, up, down).
const MAX_PARTS: usize = 3;

/// What serving experts cost: counted per pass, summed per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertIo {
    /// Experts found in the cache.
    pub hits: u64,
    /// Experts read from storage.
    pub misses: u64,
    /// Bytes read from storage (prefetches included).
    pub bytes_read: u64,
    /// Experts read ahead of their layer's routing (see [`ExpertCache::prefetch`]).
    pub prefetched: u64,
}

impl std::ops::AddAssign for ExpertIo {
    fn add_assign(&mut self, o: ExpertIo) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.bytes_read += o.bytes_read;
        self.prefetched += o.prefetched;
    }
}

impl std::ops::Sub for ExpertIo {
    type Output = ExpertIo;
    fn sub(self, o: ExpertIo) -> ExpertIo {
        ExpertIo {
            hits: self.hits - o.hits,
            misses: self.misses - o.misses,
            bytes_read: self.bytes_read - o.bytes_read,
            prefetched: self.prefetched - o.prefetched,
        }
    }
}

/// The reads of one expert's slabs: done when all three have arrived.
struct Batch {
    left: AtomicUsize,
    /// The first read's failure; also the lock `done` waits with.
    error: Mutex<Option<(io::ErrorKind, String)>>,
    done: Condvar,
}

impl Batch {
    fn new(reads: usize) -> Arc<Batch> {
        Arc::new(Batch { left: AtomicUsize::new(reads), error: Mutex::new(None), done: Condvar::new() })
    }

    fn is_done(&self) -> bool {
        self.left.load(Ordering::Acquire) == 0
    }

    /// Done, and a read failed.
    fn failed(&self) -> bool {
        self.is_done() && lock(&self.error).is_some()
    }

    /// One read ended (with `err` if it failed); true for the batch's last.
    fn finish_one(&self, err: Option<Error>) -> bool {
        if let Some(e) = err {
            let mut first = lock(&self.error);
            if first.is_none() {
                *first = Some(match e {
                    Error::Io(e) => (e.kind(), e.to_string()),
                    other => (io::ErrorKind::Other, other.to_string()),
                });
            }
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        // A waiter between its check and its wait holds the lock: taking it
        // first means the notification cannot fall between the two.
        drop(lock(&self.error));
        self.done.notify_all();
        true
    }

    fn wait(&self) -> Result<()> {
        let mut err = lock(&self.error);
        while !self.is_done() {
            err = self.done.wait(err).unwrap_or_else(|p| p.into_inner());
        }
        match &*err {
            Some((kind, msg)) => Err(Error::Io(io::Error::new(*kind, msg.clone()))),
            None => Ok(()),
        }
    }
}

/// One slot's bookkeeping.
#[derive(Default)]
struct Slot {
    /// `(layer << 32) | expert`, or `None` when empty.
    key: Option<u64>,
    /// Leases holding it.
    pins: u32,
    /// Clock of its last use (LRU).
    last: u64,
    /// Where each slab's bytes start in its part of the slot.
    skip: [usize; MAX_PARTS],
    /// The reads filling it, until they are known to have arrived.
    filling: Option<Arc<Batch>>,
    /// Its memory (`slot_bytes`, page-aligned); `None`: the place of a
    /// slot given back, reused when the cache grows.
    mem: Option<AlignedBuf>,
    /// Given back by a shrink: takes no expert, and its memory is freed
    /// once it is evictable.
    retired: bool,
    /// An expert has been read into it (its pages are in memory).
    touched: bool,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Batch({} left)", self.left.load(Ordering::Relaxed))
    }
}

impl Slot {
    /// Its bytes are all there.
    fn ready(&self) -> bool {
        self.filling.as_ref().is_none_or(|b| b.is_done())
    }

    /// Nobody holds it and no read is writing it.
    fn evictable(&self) -> bool {
        self.pins == 0 && self.ready()
    }

    /// It has memory and has not been given back.
    fn usable(&self) -> bool {
        self.mem.is_some() && !self.retired
    }

    /// Its first byte.
    fn addr(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.as_slice().as_ptr() as usize)
    }
}

struct Inner {
    map: HashMap<u64, usize>,
    slots: Vec<Slot>,
    clock: u64,
    /// Per expert key, cached or not: how often passes used it (halved every
    /// [`AGE_TICKS`] ticks of the clock).
    uses: HashMap<u64, u32>,
}

/// Clock ticks (fetches and prefetches: about two per MoE layer per token)
/// between two halvings of the use counts: a popularity of the last few
/// hundred tokens.
const AGE_TICKS: u64 = 8192;

impl Inner {
    /// Usable slots that could take an expert now.
    fn free(&self) -> usize {
        self.slots.iter().filter(|s| s.usable() && s.evictable()).count()
    }

    /// The memory of the slots given back that nobody holds or fills any
    /// more, taken out (to be dropped, i.e. unmapped, outside the lock).
    fn reap(&mut self) -> Vec<AlignedBuf> {
        let mut freed = Vec::new();
        for s in &mut self.slots {
            if s.retired && s.evictable() {
                if let Some(m) = s.mem.take() {
                    freed.push(m);
                }
                s.retired = false;
                s.touched = false;
                s.filling = None;
            }
        }
        freed
    }

    /// Slots given back whose memory is still held.
    fn retiring(&self) -> usize {
        self.slots.iter().filter(|s| s.retired).count()
    }
}

/// One slab to read into a slot.
struct Read {
    /// Its part of the slot (`len` bytes inside the cache's memory).
    dst: usize,
    len: usize,
    span: Span,
    batch: Arc<Batch>,
}

/// Reads waiting for a thread: those a pass waits for first, then guesses.
#[derive(Default)]
struct Queue {
    urgent: VecDeque<Read>,
    ahead: VecDeque<Read>,
    closed: bool,
}

impl Queue {
    fn pop(&mut self) -> Option<Read> {
        self.urgent.pop_front().or_else(|| self.ahead.pop_front())
    }

    /// A pass now waits for `batch`: its queued reads go first.
    fn promote(&mut self, batch: &Arc<Batch>) {
        let mut i = 0;
        while i < self.ahead.len() {
            if Arc::ptr_eq(&self.ahead[i].batch, batch) {
                let r = self.ahead.remove(i).expect("in range");
                self.urgent.push_back(r);
            } else {
                i += 1;
            }
        }
    }
}

/// What the cache and its read threads share.
struct Shared {
    direct: DirectFile,
    /// The slots and their memory: read threads write into slots that are
    /// filling, so the memory lives as long as they do.
    inner: Mutex<Inner>,
    /// A lease ended or a batch arrived: slots may have become evictable.
    released: Condvar,
    queue: Mutex<Queue>,
    work: Condvar,
}

/// The expert cache of one model.
pub struct ExpertCache {
    shared: Arc<Shared>,
    /// Bytes of each slab's part of a slot (the padded size of the largest
    /// slab of that projection over all layers), and of a whole slot.
    part: [usize; MAX_PARTS],
    slot_bytes: usize,
    /// Usable slots (what [`capacity`](Self::capacity) reports; changed
    /// under the lock, read without it).
    live: AtomicUsize,
    /// One resize at a time.
    resizing: Mutex<()>,
    readers: Vec<JoinHandle<()>>,
}

// How the slots' memory is shared without a lock around it: a slot's
// memory is written only by reads of slots that are filling (no lease reads
// such a slot before the batch is done, which is an acquire of the readers'
// release) and is neither evicted nor freed while filling or pinned; leases
// read only slots they pin, which are not written again while pinned.

impl ExpertCache {
    /// Bytes one slot takes for experts shaped like `tensors` (every
    /// routed-expert tensor of the model, as its stacks per layer: `[gate,
    /// up, down]`, or `[gate_up, down]` where gate and up are one tensor).
    pub fn slot_bytes<'a, S: AsRef<[&'a Experts]>>(tensors: &[S]) -> usize {
        Self::parts(tensors).iter().sum()
    }

    fn parts<'a, S: AsRef<[&'a Experts]>>(tensors: &[S]) -> [usize; MAX_PARTS] {
        let mut part = [0usize; MAX_PARTS];
        for layer in tensors {
            let layer = layer.as_ref();
            assert!(layer.len() <= MAX_PARTS, "an expert of {} tensors", layer.len());
            for (p, x) in part.iter_mut().zip(layer) {
                *p = (*p).max(padded(x.slab_bytes()));
            }
        }
        part
    }

    /// A cache of `n_slots` slots for experts shaped like `tensors`, read through `direct`.
    pub fn new<'a, S: AsRef<[&'a Experts]>>(direct: DirectFile, tensors: &[S], n_slots: usize) -> Result<ExpertCache> {
        let part = Self::parts(tensors);
        let slot_bytes: usize = part.iter().sum();
        let slots =
            alloc_slots(n_slots, slot_bytes)?.into_iter().map(|m| Slot { mem: Some(m), ..Slot::default() }).collect();
        let shared = Arc::new(Shared {
            direct,
            inner: Mutex::new(Inner { map: HashMap::new(), slots, clock: 0, uses: HashMap::new() }),
            released: Condvar::new(),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
        });
        let mut readers = Vec::with_capacity(IO_THREADS);
        for i in 0..IO_THREADS {
            let sh = Arc::clone(&shared);
            let spawned = std::thread::Builder::new().name(format!("pocket-io-{i}")).spawn(move || reader(&sh));
            match spawned {
                Ok(h) => readers.push(h),
                // Fewer readers read more slowly, none cannot read at all.
                Err(e) if readers.is_empty() => return Err(Error::Io(e)),
                Err(e) => {
                    log::warn!("expert cache: {i} read threads ({e})");
                    break;
                }
            }
        }
        Ok(ExpertCache { shared, part, slot_bytes, live: AtomicUsize::new(n_slots), resizing: Mutex::new(()), readers })
    }

    /// Experts the cache can hold at once (it may change between two calls:
    /// see [`resize`](Self::resize)).
    pub fn capacity(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Bytes of one slot.
    pub fn slot_size(&self) -> usize {
        self.slot_bytes
    }

    /// Memory the cache holds: its slots that have held an expert (a slot
    /// never filled has touched none of its pages), those given back
    /// included until their memory is freed.
    pub fn bytes(&self) -> u64 {
        let inner = self.lock();
        let n = inner.slots.iter().filter(|s| s.mem.is_some() && s.touched).count();
        (n * self.slot_bytes) as u64
    }

    /// Hold `n_slots` experts from now on (at least 1). Growing maps the new
    /// slots' memory first (an allocation failure is
    /// [`Error::OutOfMemory`] and changes nothing) and reuses the slots given
    /// back whose memory is not freed yet. Shrinking gives back the least
    /// recently used slots, empty ones first, at once (their experts are
    /// forgotten; no fetch takes them again) and returns once their memory
    /// is freed, which waits for the passes holding them to release them (a
    /// pass holds a layer's experts while it computes that layer).
    pub fn resize(&self, n_slots: usize) -> Result<()> {
        let n_slots = n_slots.max(1);
        let _one = lock(&self.resizing);
        let live = self.capacity();
        if n_slots > live {
            let mut inner = self.lock();
            // Slots given back whose memory is still there come back first.
            let mut want = n_slots - live;
            for s in inner.slots.iter_mut().filter(|s| s.retired && s.mem.is_some()) {
                if want == 0 {
                    break;
                }
                s.retired = false;
                want -= 1;
            }
            if want > 0 {
                drop(inner);
                let mems = alloc_slots(want, self.slot_bytes)?;
                inner = self.lock();
                let mut mems = mems.into_iter();
                for s in inner.slots.iter_mut().filter(|s| s.mem.is_none()) {
                    match mems.next() {
                        Some(m) => *s = Slot { mem: Some(m), ..Slot::default() },
                        None => break,
                    }
                }
                inner.slots.extend(mems.map(|m| Slot { mem: Some(m), ..Slot::default() }));
            }
            self.live.store(n_slots, Ordering::Release);
            drop(inner);
            self.shared.released.notify_all();
            return Ok(());
        }
        if n_slots == live {
            return Ok(());
        }
        let mut inner = self.lock();
        // Empty slots first, then the evictable ones, least recently used first.
        let mut order: Vec<usize> = (0..inner.slots.len()).filter(|&s| inner.slots[s].usable()).collect();
        order.sort_by_key(|&s| {
            let sl = &inner.slots[s];
            (sl.key.is_some(), !sl.evictable(), sl.last)
        });
        for &s in order.iter().take(live - n_slots) {
            let inner = &mut *inner;
            let slot = &mut inner.slots[s];
            slot.retired = true;
            if let Some(k) = slot.key.take() {
                inner.map.remove(&k);
            }
        }
        self.live.store(n_slots, Ordering::Release);
        let mut freed = inner.reap();
        while inner.retiring() > 0 {
            inner = self.shared.released.wait(inner).unwrap_or_else(|p| p.into_inner());
            freed.extend(inner.reap());
        }
        drop(inner);
        drop(freed);
        Ok(())
    }

    /// Make the first of `experts` (distinct) of `layer` resident and pin
    /// them: as many as the cache holds now ([`Lease::len`]); `tensors` are
    /// that layer's gate, up and down stacks. Returns once the missing slabs'
    /// reads are queued (waiting first, if need be, for other passes to
    /// release slots): see [`Lease`].
    pub fn fetch(&self, layer: usize, experts: &[usize], tensors: &[&Experts]) -> Result<Lease<'_>> {
        let mut inner = self.lock();
        // Wait until the evictable slots, less those this fetch hits, can take its misses.
        let experts = loop {
            let take = experts.len().min(self.capacity());
            let experts = &experts[..take];
            let (mut misses, mut free_hits) = (0, 0);
            for &e in experts {
                match inner.map.get(&key(layer, e)) {
                    Some(&s) if inner.slots[s].evictable() => free_hits += 1,
                    Some(_) => {}
                    None => misses += 1,
                }
            }
            if misses + free_hits <= inner.free() {
                break experts;
            }
            inner = self.shared.released.wait(inner).unwrap_or_else(|p| p.into_inner());
        };
        tick(&mut inner);
        let clock = inner.clock;
        for &e in experts {
            *inner.uses.entry(key(layer, e)).or_insert(0) += 1;
        }
        let mut entries = Vec::with_capacity(experts.len());
        let mut loads: Vec<(usize, usize)> = Vec::new(); // (slot, expert)
        let mut waits: Vec<Arc<Batch>> = Vec::new();
        let mut io = ExpertIo::default();
        // Pin what is cached first, so that no miss evicts an expert this fetch uses.
        for &e in experts {
            if let Some(&s) = inner.map.get(&key(layer, e)) {
                inner.slots[s].pins += 1;
            }
        }
        for &e in experts {
            let k = key(layer, e);
            // (slot, its bytes are there, found in the cache); pinned above if found
            let (slot, ready, hit) = match inner.map.get(&k).copied() {
                Some(s) => match inner.slots[s].filling.clone() {
                    None => (s, true, true),
                    // A failed read left garbage: read it again.
                    Some(b) if b.failed() => {
                        loads.push((s, e));
                        (s, false, false)
                    }
                    Some(b) if b.is_done() => {
                        inner.slots[s].filling = None;
                        (s, true, true)
                    }
                    // Being read (a prefetch, or another pass's fetch).
                    Some(b) => {
                        if !waits.iter().any(|w| Arc::ptr_eq(w, &b)) {
                            lock(&self.shared.queue).promote(&b);
                            waits.push(b);
                        }
                        (s, false, true)
                    }
                },
                None => {
                    let victim = victim(&inner).expect("a free slot was waited for");
                    if let Some(old) = inner.slots[victim].key.take() {
                        inner.map.remove(&old);
                    }
                    inner.slots[victim].key = Some(k);
                    inner.slots[victim].pins += 1;
                    inner.map.insert(k, victim);
                    loads.push((victim, e));
                    (victim, false, false)
                }
            };
            if hit {
                io.hits += 1;
            } else {
                io.misses += 1;
            }
            inner.slots[slot].last = clock;
            entries.push(Entry { expert: e, slot, ready, addr: inner.slots[slot].addr() });
        }
        waits.extend(self.read(&mut inner, &loads, tensors, &mut io, false));
        let entries = entries.into_iter().map(|en| (en, inner.slots[en.slot].skip)).collect();
        Ok(Lease { cache: self, entries, waits, waited: AtomicBool::new(false), io })
    }

    /// Start reading those of `experts` of `layer` that the cache does not
    /// hold, into the least recently used evictable slots, and mark those it
    /// holds as just used. Never waits: with no slot to spare, or guesses
    /// already queued, it reads fewer; its reads go after every read a pass
    /// waits for. What it read is counted in the returned [`ExpertIo`]
    /// (`prefetched`, `bytes_read`).
    pub fn prefetch(&self, layer: usize, experts: &[usize], tensors: &[&Experts]) -> ExpertIo {
        let mut inner = self.lock();
        tick(&mut inner);
        let clock = inner.clock;
        let mut loads = Vec::new();
        let room = AHEAD_QUEUED.saturating_sub(lock(&self.shared.queue).ahead.len()) / 3;
        for &e in experts {
            let k = key(layer, e);
            let slot = match inner.map.get(&k).copied() {
                Some(s) => s,
                None if loads.len() == room => continue,
                None => {
                    let Some(victim) = victim(&inner) else { break };
                    if let Some(old) = inner.slots[victim].key.take() {
                        inner.map.remove(&old);
                    }
                    inner.slots[victim].key = Some(k);
                    // Claimed until its reads are queued: not this loop's next victim.
                    inner.slots[victim].pins += 1;
                    inner.map.insert(k, victim);
                    loads.push((victim, e));
                    victim
                }
            };
            inner.slots[slot].last = clock;
        }
        let mut io = ExpertIo { prefetched: loads.len() as u64, ..ExpertIo::default() };
        self.read(&mut inner, &loads, tensors, &mut io, true);
        for &(slot, _) in &loads {
            inner.slots[slot].pins -= 1;
        }
        io
    }

    /// Queue the slabs of `loads` for the read threads, the slots marked
    /// filling; one batch per expert, so that a pass waits only for the
    /// experts it uses.
    fn read(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        loads: &[(usize, usize)],
        tensors: &[&Experts],
        io: &mut ExpertIo,
        ahead: bool,
    ) -> Vec<Arc<Batch>> {
        if loads.is_empty() {
            return Vec::new();
        }
        let mut batches = Vec::with_capacity(loads.len());
        let mut queue = lock(&self.shared.queue);
        for &(slot, e) in loads {
            let batch = Batch::new(tensors.len());
            let mut dst = inner.slots[slot].addr();
            debug_assert!(dst != 0, "a read into a slot without memory");
            inner.slots[slot].touched = true;
            for (p, x) in tensors.iter().enumerate() {
                let r = x.slab_range(e);
                let span = self.shared.direct.span(r.start as u64, r.len());
                inner.slots[slot].skip[p] = span.skip;
                io.bytes_read += span.len as u64;
                let read = Read { dst, len: self.part[p], span, batch: Arc::clone(&batch) };
                if ahead {
                    queue.ahead.push_back(read);
                } else {
                    queue.urgent.push_back(read);
                }
                dst += self.part[p];
            }
            inner.slots[slot].filling = Some(Arc::clone(&batch));
            batches.push(batch);
        }
        drop(queue);
        self.shared.work.notify_all();
        batches
    }

    /// Empty the slots that `batch` (which failed) was filling.
    fn forget(&self, batch: &Arc<Batch>) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        for slot in &mut inner.slots {
            if slot.filling.as_ref().is_some_and(|b| Arc::ptr_eq(b, batch)) {
                if let Some(k) = slot.key.take() {
                    inner.map.remove(&k);
                }
                slot.filling = None;
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.shared.inner)
    }
}

/// `n` slots of `bytes` each, each its own mapping (so that a slot given
/// back returns its memory to the OS on its own).
fn alloc_slots(n: usize, bytes: usize) -> Result<Vec<AlignedBuf>> {
    (0..n)
        .map(|_| {
            AlignedBuf::new(bytes)
                .map_err(|e| Error::OutOfMemory(format!("{n} expert cache slots of {bytes} bytes: {e}")))
        })
        .collect()
}

impl Drop for ExpertCache {
    /// The read threads finish what is queued (into memory that is still
    /// ours: the slots live as long as the readers) and stop.
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.work.notify_all();
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
    }
}

fn key(layer: usize, expert: usize) -> u64 {
    ((layer as u64) << 32) | expert as u64
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Advance the clock, halving the use counts every [`AGE_TICKS`].
fn tick(inner: &mut Inner) {
    inner.clock += 1;
    if inner.clock.is_multiple_of(AGE_TICKS) {
        inner.uses.retain(|_, n| {
            *n /= 2;
            *n > 0
        });
    }
}

/// The slot to fill next, of the evictable ones: an empty one; else, of
/// those not used in the last few ticks, the one whose expert passes used
/// least often (the least recently used among equals); else the least
/// recently used. The recent ones are kept because a token's experts are
/// often the next token's too (and a guess read ahead is used within a
/// layer); the counts keep the popular experts that a plain LRU would let
/// a run of rarely used ones push out.
fn victim(inner: &Inner) -> Option<usize> {
    // The last ticks touched about a fifth of the slots (7 a tick): at
    // 6 GiB on the 35B-A3B file, the last token and a half.
    let recent = (inner.slots.len() / 32) as u64;
    (0..inner.slots.len()).filter(|&s| inner.slots[s].usable() && inner.slots[s].evictable()).min_by_key(|&s| {
        let sl = &inner.slots[s];
        let uses = sl.key.and_then(|k| inner.uses.get(&k).copied()).unwrap_or(0);
        let is_recent = sl.last + recent >= inner.clock;
        (sl.key.is_some(), is_recent, if is_recent { 0 } else { uses }, sl.last)
    })
}

/// A read thread: slabs from the queue into their slots until the cache closes.
fn reader(sh: &Shared) {
    loop {
        let read = {
            let mut q = lock(&sh.queue);
            loop {
                if let Some(r) = q.pop() {
                    break r;
                }
                if q.closed {
                    return;
                }
                q = sh.work.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        // SAFETY: a slab's own part of a filling slot, inside the cache's
        // memory (which outlives the readers: the cache joins them first);
        // nothing else touches it until the batch is done.
        let buf = unsafe { std::slice::from_raw_parts_mut(read.dst as *mut u8, read.len) };
        let res = sh.direct.read(read.span, buf);
        if read.batch.finish_one(res.err()) {
            let freed = lock(&sh.inner).reap();
            sh.released.notify_all();
            drop(freed);
        }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    expert: usize,
    slot: usize,
    /// Its bytes were there at the fetch.
    ready: bool,
    /// The slot's first byte (its memory stays while the lease pins it).
    addr: usize,
}

/// Experts of one layer pinned in the cache. Those that were cached at the
/// fetch can be used at once; the others after [`wait`](Self::wait).
pub struct Lease<'a> {
    cache: &'a ExpertCache,
    entries: Vec<(Entry, [usize; MAX_PARTS])>,
    /// The reads the experts that were not ready wait for.
    waits: Vec<Arc<Batch>>,
    waited: AtomicBool,
    /// What this fetch found and read.
    pub io: ExpertIo,
}

impl Lease<'_> {
    /// Experts it holds: the first this many of those fetched.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no expert (a fetch of none).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether expert `e`'s slabs were all there at the fetch.
    pub fn is_ready(&self, e: usize) -> bool {
        self.entry(e).0.ready
    }

    /// Wait for every read this lease's experts need; a failed read is an
    /// I/O error (and the experts it was filling are forgotten, to be read
    /// again by the next fetch).
    pub fn wait(&self) -> Result<()> {
        for b in &self.waits {
            if let Err(e) = b.wait() {
                self.cache.forget(b);
                return Err(e);
            }
        }
        self.waited.store(true, Ordering::Release);
        Ok(())
    }

    fn entry(&self, e: usize) -> &(Entry, [usize; MAX_PARTS]) {
        self.entries.iter().find(|(en, _)| en.expert == e).expect("expert not in this lease")
    }

    /// The slab of projection `p` (0 gate, 1 up, 2 down; `x` its stack) of
    /// expert `e`, as a kernel view. Panics if `e` was not ready and the
    /// lease has not been waited for.
    pub fn slab(&self, e: usize, p: usize, x: &Experts) -> QMatrix<'_> {
        let c = self.cache;
        let (en, skip) = self.entry(e);
        assert!(en.ready || self.waited.load(Ordering::Acquire), "expert {e} used before its read arrived");
        let off = c.part[..p].iter().sum::<usize>() + skip[p];
        debug_assert!(off + x.slab_bytes() <= c.slot_bytes);
        // SAFETY: the slot is pinned by this lease (its memory is not freed
        // while pinned) and its reads are done (ready at the fetch, or waited
        // for); nothing writes a pinned slot.
        let mem = unsafe { std::slice::from_raw_parts((en.addr + off) as *const u8, x.slab_bytes()) };
        QMatrix { ty: x.all.ty, data: mem, rows: x.rows, cols: x.all.cols, layout: crate::kernels::Layout::Rows }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut inner = self.cache.lock();
        for (en, _) in &self.entries {
            inner.slots[en.slot].pins -= 1;
        }
        let freed = inner.reap();
        drop(inner);
        self.cache.shared.released.notify_all();
        drop(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::{key, victim, AlignedBuf, Inner, Slot};
    use std::collections::HashMap;

    /// A cache of `n` slots holding experts `0..n` of layer 0, expert `e` last used at tick `last[e]`.
    fn cache(last: &[u64], clock: u64) -> Inner {
        let slots: Vec<Slot> = last
            .iter()
            .enumerate()
            .map(|(e, &l)| Slot {
                key: Some(key(0, e)),
                last: l,
                mem: Some(AlignedBuf::new(4096).unwrap()),
                ..Slot::default()
            })
            .collect();
        let map = (0..last.len()).map(|e| (key(0, e), e)).collect();
        Inner { map, slots, clock, uses: HashMap::new() }
    }

    #[test]
    fn the_victim_is_the_least_used_of_the_not_recent_then_the_least_recent() {
        // 64 slots: the last 2 ticks are recent. Expert 0 is the oldest but popular.
        let last: Vec<u64> = (0..64).map(|e| 10 + e as u64).collect();
        let mut c = cache(&last, 100);
        c.uses.insert(key(0, 0), 9);
        (1..64).for_each(|e| {
            c.uses.insert(key(0, e), 2);
        });
        // Plain LRU would take expert 0; the counts keep it, the oldest of the rest goes.
        assert_eq!(victim(&c), Some(1));
        // A less used one goes first, however recent (unless among the last ticks).
        c.uses.insert(key(0, 40), 1);
        assert_eq!(victim(&c), Some(40));
        c.uses.insert(key(0, 63), 0);
        c.clock = 73;
        assert_eq!(victim(&c), Some(40), "expert 63 was used in the last ticks");
        // An empty slot before any; a pinned one never.
        c.slots[50].key = None;
        assert_eq!(victim(&c), Some(50));
        c.slots[50].pins = 1;
        assert_eq!(victim(&c), Some(40));
        // Only recent slots left: the least recently used of them.
        let mut last = vec![99; 64];
        last[1] = 98;
        let mut c = cache(&last, 100);
        c.uses.insert(key(0, 1), 5);
        assert_eq!(victim(&c), Some(1));
    }

    #[test]
    fn use_counts_halve_as_the_clock_passes() {
        let mut c = cache(&[0], 0);
        c.uses.insert(key(0, 0), 5);
        c.uses.insert(key(0, 1), 1);
        for _ in 0..super::AGE_TICKS {
            super::tick(&mut c);
        }
        assert_eq!(c.uses.get(&key(0, 0)), Some(&2));
        assert_eq!(c.uses.get(&key(0, 1)), None, "a count halved to 0 is forgotten");
    }
}
