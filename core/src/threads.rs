//! A persistent pool of worker threads for data-parallel kernels, and
//! ([`topology`]) how many threads a session uses by default.
//!
//! One decoded token runs some 500 parallel operations of ~50 us each, so a
//! dispatch must cost far less than that: `run` publishes a borrowed closure
//! with one atomic store, workers that are spinning see it within
//! nanoseconds, and sleeping ones are unparked. Nothing is allocated and no
//! lock is taken per `run` (a mutex guards only the rare panic payload).
//!
//! Thread slots are *claimed*, not assigned: `claim` packs the job's epoch
//! with the next unclaimed `ith`. A worker that wakes for the job takes a slot
//! with a compare-exchange; after running slot 0 the caller claims every slot
//! still free and runs it itself, then waits only for the workers that did
//! start. So a worker the OS has not scheduled (a busy core, a phone's little
//! core asleep) never holds the caller up, and every `f(ith, nth)` still runs
//! exactly once. A worker that wakes late sees the slots gone (or a newer
//! epoch) and never touches the old job.
//!
//! Inside a job, the work is claimed in pieces too ([`Pieces`], or the
//! matmul's tile counter): a thread takes the next piece when it is done with
//! its last, so a slow core (a phone's little core, a busy one) holds a pass
//! up by at most the piece it is running.
//!
//! `POCKET_SLOW_WORKER=us` (read when a pool is made; for benchmarks and
//! tests) makes the pool's last worker spin that many microseconds before each
//! piece it takes: a simulated slow core. Unset, a piece costs one branch on a
//! thread-local.

pub mod topology;

pub use topology::{default_threads, resolve, ThreadCount, ThreadSource};

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a waiting thread spins before it parks: long enough to bridge the
/// gap between two kernels of one token, short enough not to burn a core
/// between tokens.
const SPIN: Duration = Duration::from_micros(100);

/// Low bits of `claim`: the next free slot; high bits: the job's epoch.
const SLOT_BITS: u32 = 16;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

type Job = dyn Fn(usize, usize) + Sync;

/// The variable that slows the pool's last worker (microseconds per piece).
pub const SLOW_WORKER_ENV: &str = "POCKET_SLOW_WORKER";

thread_local! {
    /// Microseconds this thread spins before each piece of work (0: none).
    static SLOW_SPIN_US: Cell<u32> = const { Cell::new(0) };
}

/// Called by a parallel section as this thread starts a piece of its work:
/// nothing, unless this thread is the worker slowed by
/// [`SLOW_WORKER_ENV`], which then spins for its set time.
#[inline]
pub fn piece() {
    let us = SLOW_SPIN_US.with(Cell::get);
    if us != 0 {
        spin_for(Duration::from_micros(u64::from(us)));
    }
}

#[cold]
fn spin_for(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Pieces `0..n` of one parallel section's work, claimed one at a time from
/// a shared counter by whichever thread is free: a thread's share follows its
/// speed. Make one per section (before [`ThreadPool::run`]); each thread then
/// loops over [`iter`](Self::iter). What a piece computes must not depend on
/// the thread that runs it (per-thread scratch is fine, per-thread partial
/// sums are not), so results do not depend on who took what.
pub struct Pieces {
    next: AtomicUsize,
    n: usize,
}

impl Pieces {
    pub fn new(n: usize) -> Pieces {
        Pieces { next: AtomicUsize::new(0), n }
    }

    /// The next unclaimed piece (each goes to one thread, once), or `None`
    /// when all are taken.
    #[inline]
    pub fn claim(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.n).then(|| {
            piece();
            i
        })
    }

    /// The pieces this thread claims, until none is left.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::from_fn(|| self.claim())
    }
}

/// `POCKET_SLOW_WORKER` as microseconds; unset or not a number: 0.
fn slow_worker_from_env() -> u32 {
    std::env::var(SLOW_WORKER_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

struct Shared {
    n_threads: usize,
    /// `epoch << SLOT_BITS | next free slot` of the current job.
    claim: AtomicU64,
    /// Slots finished by workers in the current job.
    finished: AtomicUsize,
    shutdown: AtomicBool,
    /// The current job, with its lifetime erased; written only by the thread
    /// that holds `busy`, before it publishes the epoch.
    job: UnsafeCell<Option<*const Job>>,
    /// The thread waiting in `run`, woken by workers as they finish.
    caller: UnsafeCell<Option<Thread>>,
    /// The first panic of a worker in the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set while a `run` is in flight; a nested or concurrent `run` runs its
    /// job inline instead of waiting for the pool.
    busy: AtomicBool,
}

// SAFETY: `job` and `caller` are written only by the holder of `busy` while no
// worker holds a slot (the caller waited for every claimed slot to finish),
// and read by a worker only after it claimed a slot of the current epoch,
// which keeps the caller waiting until that worker reports back.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of threads that run one closure on all of them at a time.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Products compute each activation row as a product of one row would,
    /// tiled as for one row (see [`set_one_row`](Self::set_one_row)).
    one_row: AtomicBool,
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1): `n_threads - 1` workers plus the
    /// thread that calls [`run`](Self::run).
    pub fn new(n_threads: usize) -> ThreadPool {
        Self::with_slow_worker(n_threads, slow_worker_from_env())
    }

    /// [`new`](Self::new) whose last worker spins `spin_us` microseconds
    /// before each piece it takes (a simulated slow core; 0 = none, and a
    /// pool of one thread has no worker to slow). `new` takes it from
    /// [`SLOW_WORKER_ENV`].
    pub fn with_slow_worker(n_threads: usize, spin_us: u32) -> ThreadPool {
        let n_threads = n_threads.clamp(1, SLOT_MASK as usize);
        let shared = Arc::new(Shared {
            n_threads,
            claim: AtomicU64::new(SLOT_MASK), // epoch 0, no free slot
            finished: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            caller: UnsafeCell::new(None),
            panic: Mutex::new(None),
            busy: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("pocket-worker-{i}"))
                    .spawn(move || {
                        if i == n_threads - 1 {
                            SLOW_SPIN_US.with(|c| c.set(spin_us));
                        }
                        worker_loop(&shared)
                    })
                    .expect("spawn a worker thread")
            })
            .collect();
        ThreadPool { shared, workers, one_row: AtomicBool::new(false) }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// While on, the weight products on this pool compute every activation
    /// row as a product of one row would (the decode tiling, and the exact
    /// multi-row kernels where the weight type has them, else the decode
    /// kernels row by row), so a batch's results equal token-by-token
    /// decoding bit for bit (the prefill kernels round differently in the
    /// last bits). Speculative decoding's verify passes run so; the weights
    /// are still read once per tile for all rows.
    pub fn set_one_row(&self, on: bool) {
        self.one_row.store(on, Ordering::Relaxed);
    }

    pub fn one_row(&self) -> bool {
        self.one_row.load(Ordering::Relaxed)
    }

    /// Run `f(ith, nth)` for every `ith` in `0..nth`, each exactly once and in
    /// parallel on the pool's threads (the caller runs `ith` 0, and any slot
    /// no worker has started); returns when all have finished. A panic in any
    /// of them is re-raised here after all have stopped.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let s = &*self.shared;
        let nth = s.n_threads;
        if nth == 1 {
            return f(0, 1);
        }
        if s.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            // Called from inside a job or from a second thread at once: run the
            // slots one after another here rather than deadlock.
            for ith in 0..nth {
                f(ith, nth);
            }
            return;
        }
        // SAFETY: we hold `busy` and no worker holds a slot, so nobody reads
        // these cells now. The erased lifetime is sound because we do not
        // return before every claimed slot has finished.
        unsafe {
            let job: *const Job = std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(f);
            *s.job.get() = Some(job);
            if (*s.caller.get()).as_ref().map(Thread::id) != Some(thread::current().id()) {
                *s.caller.get() = Some(thread::current());
            }
        }
        s.finished.store(0, Ordering::Relaxed);
        let epoch = (s.claim.load(Ordering::Relaxed) >> SLOT_BITS) + 1;
        // Publish: epoch and "slot 1 is the next free one".
        s.claim.store(epoch << SLOT_BITS | 1, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }

        let mut first_panic = panic::catch_unwind(AssertUnwindSafe(|| f(0, nth))).err();
        // Run every slot no worker has claimed yet.
        let mut mine = 0;
        while let Some(ith) = try_claim(s, epoch) {
            mine += 1;
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| f(ith, nth))) {
                first_panic.get_or_insert(p);
            }
        }
        let theirs = nth - 1 - mine;
        wait_for(|| s.finished.load(Ordering::Acquire) == theirs);

        let worker_panic = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        s.busy.store(false, Ordering::Release);
        if let Some(p) = first_panic.or(worker_panic) {
            panic::resume_unwind(p);
        }
    }
}

/// Claim the next free slot of job `epoch`, if any is left.
fn try_claim(s: &Shared, epoch: u64) -> Option<usize> {
    let mut cur = s.claim.load(Ordering::Acquire);
    loop {
        let slot = (cur & SLOT_MASK) as usize;
        if cur >> SLOT_BITS != epoch || slot >= s.n_threads {
            return None;
        }
        match s.claim.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(slot),
            Err(now) => cur = now,
        }
    }
}

/// Spin for up to [`SPIN`], then park, until `done()`. Whoever makes `done()`
/// true unparks this thread afterwards, and a stale unpark only costs one more
/// check.
fn wait_for(done: impl Fn() -> bool) {
    let mut start: Option<Instant> = None;
    while !done() {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        if start.get_or_insert_with(Instant::now).elapsed() > SPIN {
            thread::park();
        }
    }
}

fn worker_loop(s: &Shared) {
    let mut seen = 0u64;
    loop {
        wait_for(|| s.claim.load(Ordering::Acquire) >> SLOT_BITS != seen || s.shutdown.load(Ordering::Acquire));
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = s.claim.load(Ordering::Acquire) >> SLOT_BITS;
        let Some(ith) = try_claim(s, seen) else { continue };
        // SAFETY: we hold a slot of the current job: the caller published the
        // job before the epoch and keeps it alive until we report back.
        let (job, caller) = unsafe { ((*s.job.get()).expect("job published"), (*s.caller.get()).clone()) };
        // SAFETY: as above.
        let result = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(ith, s.n_threads) }));
        if let Err(p) = result {
            let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(p);
        }
        s.finished.fetch_add(1, Ordering::Release);
        if let Some(t) = caller {
            t.unpark();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for w in self.workers.drain(..) {
            w.thread().unpark();
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_thread_runs_once_per_call() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..2000 {
                pool.run(&|ith, nth| {
                    assert_eq!(nth, n);
                    hits[ith].fetch_add(1, Ordering::Relaxed);
                });
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 2000);
            }
        }
    }

    #[test]
    fn results_are_visible_after_run() {
        let pool = ThreadPool::new(3);
        let mut data = vec![0u64; 3000];
        for round in 0..200u64 {
            let ptr = AtomicU64::new(data.as_mut_ptr() as u64);
            pool.run(&|ith, nth| {
                let p = ptr.load(Ordering::Relaxed) as *mut u64;
                for i in (ith..3000).step_by(nth) {
                    // SAFETY: each index is written by exactly one thread.
                    unsafe { *p.add(i) += round + i as u64 };
                }
            });
        }
        for (i, v) in data.iter().enumerate() {
            assert_eq!(*v, (0..200).sum::<u64>() + 200 * i as u64);
        }
    }

    #[test]
    fn panics_propagate_and_the_pool_survives() {
        let pool = ThreadPool::new(3);
        for culprit in [0, 1, 2] {
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|ith, _| {
                    if ith == culprit {
                        panic!("boom in {ith}");
                    }
                })
            }));
            let msg = r.expect_err("panic propagates");
            let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert_eq!(text, format!("boom in {culprit}"));
            let count = AtomicUsize::new(0);
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 3);
        }
    }

    #[test]
    fn nested_and_concurrent_runs_do_not_deadlock() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
        let count = AtomicUsize::new(0);
        thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..300 {
                        pool.run(&|_, _| {
                            count.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), 3 * 300 * 2);
    }

    #[test]
    fn only_the_last_worker_is_slowed() {
        let pool = ThreadPool::with_slow_worker(3, 7);
        let seen = Mutex::new(Vec::new());
        // Slots that last a while, so that workers get some (the caller takes
        // every slot nobody has claimed yet).
        for _ in 0..2000 {
            pool.run(&|_, _| {
                let name = thread::current().name().unwrap_or_default().to_string();
                seen.lock().unwrap().push((name, SLOW_SPIN_US.with(Cell::get)));
                spin_for(Duration::from_micros(50));
            });
            if seen.lock().unwrap().iter().any(|(name, _)| name == "pocket-worker-2") {
                break;
            }
        }
        let seen = seen.into_inner().unwrap();
        assert!(seen.iter().any(|(name, _)| name == "pocket-worker-2"), "the last worker never ran a slot");
        for (name, us) in &seen {
            assert_eq!(*us, if name == "pocket-worker-2" { 7 } else { 0 }, "{name}");
        }
        // Nothing slowed without the setting, nor in a pool without workers.
        for pool in [ThreadPool::with_slow_worker(3, 0), ThreadPool::with_slow_worker(1, 7)] {
            pool.run(&|_, _| assert_eq!(SLOW_SPIN_US.with(Cell::get), 0));
        }
    }

    #[test]
    fn every_piece_is_claimed_exactly_once_even_with_a_slow_worker() {
        for (n_threads, spin_us) in [(1, 0), (2, 0), (3, 0), (3, 200)] {
            let pool = ThreadPool::with_slow_worker(n_threads, spin_us);
            for n in [0, 1, 2, 7, 500] {
                let pieces = Pieces::new(n);
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                let by_slot: Vec<AtomicUsize> = (0..n_threads).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|ith, _| {
                    for i in pieces.iter() {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        by_slot[ith].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{n_threads} threads, {n} pieces");
                let total: usize = by_slot.iter().map(|c| c.load(Ordering::Relaxed)).sum();
                assert_eq!(total, n);
                assert_eq!(pieces.claim(), None);
            }
        }
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(2);
        for _ in 0..5 {
            thread::sleep(std::time::Duration::from_millis(20));
            let count = AtomicUsize::new(0);
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 2);
        }
    }
}
