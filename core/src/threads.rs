//! A persistent pool of worker threads for data-parallel kernels.
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

use std::any::Any;
use std::cell::UnsafeCell;
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
    /// Products run one activation row at a time, tiled as for one row (see
    /// [`set_one_row`](Self::set_one_row)).
    one_row: AtomicBool,
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1): `n_threads - 1` workers plus the
    /// thread that calls [`run`](Self::run).
    pub fn new(n_threads: usize) -> ThreadPool {
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
                    .spawn(move || worker_loop(&shared))
                    .expect("spawn a worker thread")
            })
            .collect();
        ThreadPool { shared, workers, one_row: AtomicBool::new(false) }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// While on, the weight products on this pool compute every activation
    /// row as a product of one row would (the decode kernels and tiling), so
    /// a batch's results equal token-by-token decoding bit for bit (the
    /// multi-row kernels round differently in the last bits). Speculative
    /// decoding's verify passes run so; the weights are still read once per
    /// tile for all rows.
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
