//! A persistent pool of worker threads for data-parallel kernels.
//!
//! One decoded token runs some 500 parallel operations of ~50 us each, so a
//! dispatch must cost far less than that: `run` publishes a borrowed closure by
//! bumping an epoch counter, workers that are spinning see it within
//! nanoseconds, and sleeping ones are unparked. Nothing is allocated and no
//! lock is taken per `run` (a mutex guards only the rare panic payload).
//!
//! Protocol: the caller writes the job, then increments `epoch` (release);
//! each worker waits for a new epoch (acquire), runs the job, then decrements
//! `pending` (release); the last one wakes the caller, which waits for
//! `pending == 0` (acquire) before returning, so the borrowed closure outlives
//! every use.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a waiting thread spins before it parks: long enough to bridge the
/// gap between two kernels of one token, short enough not to burn a core
/// between tokens.
const SPIN: Duration = Duration::from_micros(100);

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    n_threads: usize,
    /// Incremented once per `run` (and once at shutdown).
    epoch: AtomicUsize,
    /// Workers still running the current job.
    pending: AtomicUsize,
    shutdown: AtomicBool,
    /// The current job, with its lifetime erased; written only by the thread
    /// that holds `busy`, before it publishes the epoch.
    job: UnsafeCell<Option<*const Job>>,
    /// The thread waiting in `run`, woken by the last worker to finish.
    caller: UnsafeCell<Option<Thread>>,
    /// The first panic of a worker in the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set while a `run` is in flight; a nested or concurrent `run` runs its
    /// job inline instead of waiting for the pool.
    busy: AtomicBool,
}

// SAFETY: `job` and `caller` are written only by the holder of `busy` while no
// worker reads them (all have finished the previous job), and read by workers
// only between the epoch publication and their `pending` decrement. The job
// itself is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of threads that run one closure on all of them at a time.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1): `n_threads - 1` workers plus the
    /// thread that calls [`run`](Self::run).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            epoch: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            caller: UnsafeCell::new(None),
            panic: Mutex::new(None),
            busy: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|ith| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("pocket-worker-{ith}"))
                    .spawn(move || worker_loop(&shared, ith))
                    .expect("spawn a worker thread")
            })
            .collect();
        ThreadPool { shared, workers }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f(ith, nth)` on every thread (the caller is `ith` 0); returns when
    /// all have finished. A panic in any of them is re-raised here after all
    /// have stopped.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let s = &*self.shared;
        let nth = s.n_threads;
        if nth == 1 {
            return f(0, 1);
        }
        if s.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            // Called from inside a job or from a second thread at once: run the
            // parts one after another here rather than deadlock.
            for ith in 0..nth {
                f(ith, nth);
            }
            return;
        }
        // SAFETY: we hold `busy` and every worker finished the previous job, so
        // nobody reads these cells now. The erased lifetime is sound because we
        // do not return before `pending` is back to 0.
        unsafe {
            let job: *const Job = std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(f);
            *s.job.get() = Some(job);
            if (*s.caller.get()).as_ref().map(Thread::id) != Some(thread::current().id()) {
                *s.caller.get() = Some(thread::current());
            }
        }
        s.pending.store(nth - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }

        let mine = panic::catch_unwind(AssertUnwindSafe(|| f(0, nth)));

        wait_for(|| s.pending.load(Ordering::Acquire) == 0);
        let theirs = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        s.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            panic::resume_unwind(p);
        }
        if let Some(p) = theirs {
            panic::resume_unwind(p);
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

fn worker_loop(s: &Shared, ith: usize) {
    let mut seen = 0usize;
    loop {
        wait_for(|| s.epoch.load(Ordering::Acquire) != seen);
        seen = s.epoch.load(Ordering::Acquire);
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: published before the epoch we acquired; valid until we
        // decrement `pending` below.
        let (job, caller) = unsafe { ((*s.job.get()).expect("job published"), (*s.caller.get()).clone()) };
        // SAFETY: the caller keeps the closure alive until `pending` reaches 0.
        let result = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(ith, s.n_threads) }));
        if let Err(p) = result {
            let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(p);
        }
        if s.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(t) = caller {
                t.unpark();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.epoch.fetch_add(1, Ordering::Release);
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
