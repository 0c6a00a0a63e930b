//! Matvec throughput benchmark: GB/s of weight bytes per format, path, shape
//! and thread count, next to the machine's read bandwidth measured in the
//! same run.
//!
//! Decode is memory-bound, so the figure that matters is how close a matvec
//! gets to the bandwidth a plain multi-threaded sum achieves. Both stream a
//! working set several times larger than the last-level cache: expert-sized
//! matrices are cycled over enough distinct copies, and the head-sized matrix
//! is larger than any cache by itself.

use super::testing::Rng;
use super::{Isa, Kernels, QActs, QMatrix};
use crate::quant::GgmlType;
use crate::threads::{Pieces, ThreadPool};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// "All threads": the pool size of the multi-threaded runs.
    pub threads: usize,
    pub formats: Vec<GgmlType>,
    /// Paths to measure; those the CPU lacks are skipped.
    pub isas: Vec<Isa>,
    /// Minimum time per measurement.
    pub min_time: Duration,
    /// Bytes streamed per measurement cycle; `None`: three times the last-level
    /// cache, at least 512 MiB.
    pub working_set: Option<usize>,
    /// Rows of the head-sized matrix (columns: 2048).
    pub head_rows: usize,
    /// Activation rows per product: 1 is decode (a matvec, bound by memory);
    /// more is a prompt's tokens meeting each matrix (prefill, bound by the
    /// kernels' arithmetic).
    pub tokens: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            formats: vec![
                GgmlType::Q4K,
                GgmlType::Q2K,
                GgmlType::Q3K,
                GgmlType::Q5K,
                GgmlType::Q6K,
                GgmlType::Q8_0,
                GgmlType::Q4_0,
                GgmlType::F16,
            ],
            isas: super::available_isas(),
            min_time: Duration::from_millis(300),
            working_set: None,
            head_rows: 102_400,
            tokens: 1,
        }
    }
}

/// A matrix shape of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub name: &'static str,
    pub rows: usize,
    pub cols: usize,
}

/// Expert projections of a Qwen3.5-35B-A3B-class MoE (gate/up, down), and an
/// output head.
pub fn shapes(head_rows: usize) -> [Shape; 3] {
    [
        Shape { name: "expert 512x2048", rows: 512, cols: 2048 },
        Shape { name: "expert 2048x512", rows: 2048, cols: 512 },
        Shape { name: "head", rows: head_rows, cols: 2048 },
    ]
}

/// One measurement.
#[derive(Clone, Debug)]
pub struct Case {
    pub format: GgmlType,
    pub isa: Isa,
    pub shape: Shape,
    pub threads: usize,
    /// Weight bytes streamed per second, in GB/s (1e9).
    pub gbps: f64,
    /// Microseconds per product.
    pub us_per_call: f64,
    /// Multiply-adds per second (weights x tokens), in billions.
    pub gmacs: f64,
}

/// The whole run.
#[derive(Clone, Debug)]
pub struct Report {
    pub threads: usize,
    pub working_set: usize,
    pub last_level_cache: Option<usize>,
    /// Read bandwidth (multi-threaded sum), GB/s: one thread, all threads.
    pub read_gbps_1: f64,
    pub read_gbps_all: f64,
    /// Activation rows per product ([`Options::tokens`]).
    pub tokens: usize,
    pub cases: Vec<Case>,
}

/// Size of the last-level cache, where the OS says (Linux sysfs).
pub fn last_level_cache() -> Option<usize> {
    (0..8)
        .rev()
        .filter_map(|i| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size")).ok())
        .find_map(|s| {
            let s = s.trim();
            let (num, mul) = match s.strip_suffix('K') {
                Some(n) => (n, 1 << 10),
                None => match s.strip_suffix('M') {
                    Some(n) => (n, 1 << 20),
                    None => (s, 1),
                },
            };
            num.parse::<usize>().ok().map(|n| n * mul)
        })
}

/// A buffer of random words, viewable as bytes.
struct Pool(Vec<u64>);

impl Pool {
    fn new(bytes: usize, rng: &mut Rng) -> Pool {
        Pool((0..bytes.div_ceil(8)).map(|_| rng.next_u64()).collect())
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: any u64 is 8 valid bytes; the length is in bounds.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * 8) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and any byte pattern is a valid u64.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.0.len() * 8) }
    }
}

/// 64-bit words per piece of a bandwidth pass (1 MiB).
const READ_PIECE: usize = 1 << 17;

/// Read bandwidth of `data` with the pool's threads: each sums the 1 MiB
/// pieces it claims; best of a few passes, GB/s.
pub fn read_bandwidth(pool: &ThreadPool, data: &[u64], min_time: Duration) -> f64 {
    let pass = || {
        let t = Instant::now();
        let pieces = Pieces::new(data.len().div_ceil(READ_PIECE));
        pool.run(&|_, _| {
            for i in pieces.iter() {
                let part = &data[i * READ_PIECE..((i + 1) * READ_PIECE).min(data.len())];
                black_box(part.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
            }
        });
        t.elapsed().as_secs_f64()
    };
    pass(); // fault in and warm up
    let (mut best, start) = (f64::MAX, Instant::now());
    while start.elapsed() < min_time * 2 || best == f64::MAX {
        best = best.min(pass());
    }
    (data.len() * 8) as f64 / best / 1e9
}

/// Run the benchmark; `progress` sees each case as it completes.
pub fn run(opts: &Options, mut progress: impl FnMut(&Case)) -> Report {
    let mut rng = Rng::new(1);
    let llc = last_level_cache();
    let working_set = opts.working_set.unwrap_or_else(|| (3 * llc.unwrap_or(64 << 20)).max(512 << 20));
    // Room for at least one of the largest matrix (a working set smaller than
    // a matrix still measures it, from the caches).
    let largest = opts
        .formats
        .iter()
        .flat_map(|t| shapes(opts.head_rows).map(|s| t.row_bytes(s.cols as u64).map_or(0, |rb| rb as usize * s.rows)))
        .max()
        .unwrap_or(0);
    let mut buf = Pool::new(working_set.max(largest), &mut rng);
    let threads = opts.threads.max(1);
    let (one, all) = (ThreadPool::new(1), ThreadPool::new(threads));

    let read_gbps_1 = read_bandwidth(&one, &buf.0, opts.min_time);
    let read_gbps_all = read_bandwidth(&all, &buf.0, opts.min_time);

    let mut cases = Vec::new();
    for &ty in &opts.formats {
        super::testing::make_valid(ty, buf.bytes_mut(), &mut rng);
        for shape in shapes(opts.head_rows) {
            let Some(rb) = ty.row_bytes(shape.cols as u64) else { continue };
            let mat_bytes = rb as usize * shape.rows;
            // Distinct matrices to cycle through: enough to exceed the caches.
            let count = (working_set / mat_bytes).max(1).min(buf.bytes().len() / mat_bytes);
            let mats: Vec<QMatrix> = (0..count)
                .map(|i| QMatrix::new(ty, &buf.bytes()[i * mat_bytes..(i + 1) * mat_bytes], shape.rows, shape.cols))
                .collect::<crate::Result<_>>()
                .expect("bench matrices are well-formed");
            let n = opts.tokens.max(1);
            let x = rng.vec(n * shape.cols, 1.0);
            let mut acts = QActs::new();
            acts.quantize(ty, &x, n, shape.cols);
            let mut out = vec![0.0f32; n * shape.rows];
            for &isa in &opts.isas {
                let Some(k) = Kernels::for_isa(isa) else { continue };
                let pools: &[&ThreadPool] = if threads > 1 { &[&one, &all] } else { &[&one] };
                for &pool in pools {
                    k.matmul(pool, &mats[0], &acts, &mut out); // warm up the pool and the code
                    let (mut calls, start) = (0usize, Instant::now());
                    while start.elapsed() < opts.min_time || calls < 2 {
                        k.matmul(pool, &mats[calls % count], &acts, &mut out);
                        calls += 1;
                    }
                    let secs = start.elapsed().as_secs_f64();
                    black_box(&out);
                    let case = Case {
                        format: ty,
                        isa,
                        shape,
                        threads: pool.n_threads(),
                        gbps: (calls * mat_bytes) as f64 / secs / 1e9,
                        us_per_call: secs * 1e6 / calls as f64,
                        gmacs: (calls * n * shape.rows * shape.cols) as f64 / secs / 1e9,
                    };
                    progress(&case);
                    cases.push(case);
                }
            }
        }
    }
    Report {
        threads,
        working_set,
        last_level_cache: llc,
        read_gbps_1,
        read_gbps_all,
        tokens: opts.tokens.max(1),
        cases,
    }
}
