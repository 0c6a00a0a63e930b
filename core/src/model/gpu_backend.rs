//! The model layer's GPU backend: matrix products on the device
//! ([`crate::gpu`]), attention and the delta rule on the CPU for now.
//!
//! What runs where, today:
//! - every matrix product over weights that lie in the model file runs on
//!   the GPU; each matrix is uploaded once, the first time a pass uses it
//!   (the first pass is the warm-up: after it no weights move and no
//!   buffers are made unless a larger batch arrives). A whole-matrix
//!   product is one submission; the products over chosen rows of a call
//!   (a MoE layer's routed experts, each over its tokens) are one
//!   submission together ([`GpuBatch`]), their activations uploaded once;
//! - products over weights outside the file (none today: a memory budget
//!   is refused with this backend), and any product the device fails, run
//!   on the CPU ([`Cpu`]) and are counted;
//! - the activations are the ones the CPU kernels would use (quantised to
//!   Q8_0 / Q8_1 / Q8_K for quantised weights, [`QActs::dequantize`]d to
//!   f32), so the GPU computes the CPU's products up to f32 rounding.
//!
//! [`QActs::dequantize`]: crate::kernels::QActs::dequantize

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::pass::{Attend, Backend, Cpu, DeltaRule, Pass};
use crate::gpu::{AdapterInfo, Gpu, GpuBatch, GpuCounters, GpuMatrix, RowsJob};
use crate::kernels::{MatJob, QActs};
use crate::threads::ThreadPool;

/// Uploaded matrices by the address and length of their bytes; `None` for
/// one the device refused (it stays on the CPU).
type Uploads = HashMap<(usize, usize), Option<Arc<GpuMatrix>>>;

/// Matrix products on a [`Gpu`], the rest on the CPU.
pub struct GpuBackend {
    gpu: Gpu,
    /// The model file's bytes (address range): only weights inside it are
    /// uploaded, since only they never change under the same address.
    file: (usize, usize),
    matrices: Mutex<Uploads>,
    /// Reused buffers: activations as f32, and the device's output.
    io: Mutex<(Vec<f32>, Vec<f32>)>,
    /// Products over chosen rows, and their inputs as f32 (one per distinct
    /// activations of a call).
    batch: GpuBatch,
    inputs: Mutex<Vec<Vec<f32>>>,
    on_gpu: AtomicU64,
    on_cpu: AtomicU64,
}

/// How many matrix products ran where since load, and what the device was
/// asked to do for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    pub gpu_products: u64,
    pub cpu_products: u64,
    /// Submissions, dispatches, buffers and bytes moved (see [`GpuCounters`]).
    pub device: GpuCounters,
}

/// The work between two readings.
impl std::ops::Sub for BackendCounters {
    type Output = BackendCounters;

    fn sub(self, o: BackendCounters) -> BackendCounters {
        BackendCounters {
            gpu_products: self.gpu_products.saturating_sub(o.gpu_products),
            cpu_products: self.cpu_products.saturating_sub(o.cpu_products),
            device: self.device - o.device,
        }
    }
}

/// The work of two spans together.
impl std::ops::Add for BackendCounters {
    type Output = BackendCounters;

    fn add(self, o: BackendCounters) -> BackendCounters {
        BackendCounters {
            gpu_products: self.gpu_products.saturating_add(o.gpu_products),
            cpu_products: self.cpu_products.saturating_add(o.cpu_products),
            device: self.device + o.device,
        }
    }
}

impl GpuBackend {
    /// A backend on `gpu` for the model whose file bytes are `file`.
    pub fn new(gpu: Gpu, file: &[u8]) -> GpuBackend {
        GpuBackend {
            batch: GpuBatch::new(&gpu),
            gpu,
            file: (file.as_ptr() as usize, file.len()),
            matrices: Mutex::default(),
            io: Mutex::default(),
            inputs: Mutex::default(),
            on_gpu: AtomicU64::new(0),
            on_cpu: AtomicU64::new(0),
        }
    }

    pub fn adapter(&self) -> &AdapterInfo {
        self.gpu.info()
    }

    pub fn counters(&self) -> BackendCounters {
        BackendCounters {
            gpu_products: self.on_gpu.load(Relaxed),
            cpu_products: self.on_cpu.load(Relaxed),
            device: self.gpu.counters(),
        }
    }

    /// The device's copy of `job`'s weights, uploading them on first use;
    /// `None` when they stay on the CPU.
    fn matrix(&self, job: &MatJob<'_>) -> Option<Arc<GpuMatrix>> {
        let (addr, len) = (job.w.data.as_ptr() as usize, job.w.data.len());
        let (start, file_len) = self.file;
        if addr < start || addr + len > start + file_len {
            return None;
        }
        let mut map = self.matrices.lock().ok()?;
        map.entry((addr, len))
            .or_insert_with(|| {
                let w = &job.w;
                match GpuMatrix::upload(&self.gpu, w.ty, w.rows, w.cols, w.data) {
                    Ok(m) => Some(Arc::new(m)),
                    Err(e) => {
                        log::warn!("gpu: a {}x{} {} matrix stays on the CPU: {e}", w.rows, w.cols, w.ty);
                        None
                    }
                }
            })
            .clone()
    }

    /// `job` on the device; `false` when it must run on the CPU instead.
    fn try_gpu(&self, job: &mut MatJob<'_>) -> bool {
        let Some(m) = self.matrix(job) else { return false };
        let Ok(mut io) = self.io.lock() else { return false };
        let (x, y) = &mut *io;
        job.x.dequantize(x);
        let n = job.x.n();
        match m.matmul(x, n, y) {
            Ok(()) if y.len() <= job.out.len() => {
                job.out[..y.len()].copy_from_slice(y);
                true
            }
            Ok(()) => false,
            Err(e) => {
                log::warn!("gpu: a {}x{} {} product fell back to the CPU: {e}", m.rows(), m.cols(), m.ty());
                false
            }
        }
    }
}

impl GpuBackend {
    /// The jobs over chosen rows on the device, in one batch; per job
    /// whether it ran there (none did when the batch failed: they all run
    /// on the CPU).
    fn try_rows(&self, jobs: &mut [MatJob<'_>]) -> Vec<bool> {
        let mut done = vec![false; jobs.len()];
        if jobs.iter().all(|j| j.rows.is_none()) {
            return done;
        }
        let Ok(mut inputs) = self.inputs.lock() else { return done };
        // Each distinct activation buffer once.
        let mut acts: Vec<&QActs> = Vec::new();
        let mut picked = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let Some(rows) = job.rows else { continue };
            let Some(m) = self.matrix(job) else { continue };
            if job.out.len() < rows.len() * m.rows() {
                continue;
            }
            let x: &QActs = job.x;
            let input = acts.iter().position(|&a| std::ptr::eq(a, x)).unwrap_or_else(|| {
                acts.push(x);
                acts.len() - 1
            });
            picked.push((i, m, input, rows));
        }
        if picked.is_empty() {
            return done;
        }
        if inputs.len() < acts.len() {
            inputs.resize_with(acts.len(), Vec::new);
        }
        for (x, f) in acts.iter().zip(inputs.iter_mut()) {
            x.dequantize(f);
        }
        let views: Vec<(&[f32], usize)> = acts.iter().zip(inputs.iter()).map(|(x, f)| (f.as_slice(), x.k())).collect();
        let batch: Vec<RowsJob<'_>> =
            picked.iter().map(|(_, m, input, rows)| RowsJob { matrix: m, input: *input, rows }).collect();
        let mut out = Vec::new();
        if let Err(e) = self.batch.run(&views, &batch, &mut out) {
            log::warn!("gpu: {} products over chosen rows fell back to the CPU: {e}", batch.len());
            return done;
        }
        let mut at = 0;
        for (i, m, _, rows) in &picked {
            let len = rows.len() * m.rows();
            jobs[*i].out[..len].copy_from_slice(&out[at..at + len]);
            at += len;
            done[*i] = true;
        }
        done
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn matmul(&self, pool: &ThreadPool, jobs: &mut [MatJob<'_>]) {
        let on_device = self.try_rows(jobs);
        for (i, job) in jobs.iter_mut().enumerate() {
            let done = match job.rows {
                Some(_) => on_device.get(i).copied().unwrap_or(false),
                None => self.try_gpu(job),
            };
            if done {
                self.on_gpu.fetch_add(1, Relaxed);
            } else {
                self.on_cpu.fetch_add(1, Relaxed);
                Cpu.matmul(pool, std::slice::from_mut(job));
            }
        }
    }

    fn attend(&self, pass: &Pass, a: &Attend<'_>, out: &mut [f32], scratch: &mut Vec<f32>) {
        Cpu.attend(pass, a, out, scratch)
    }

    fn delta_rule(&self, pass: &Pass, d: &DeltaRule<'_>, state: &mut [f32], out: &mut [f32], scratch: &mut Vec<f32>) {
        Cpu.delta_rule(pass, d, state, out, scratch)
    }
}

#[cfg(all(test, feature = "gpu"))]
mod tests {
    use super::{Backend, Cpu, GpuBackend};
    use crate::gpu::{Gpu, GpuOptions, FORMATS};
    use crate::kernels::testing::{random_weights, Rng};
    use crate::kernels::{MatJob, QActs, QMatrix};
    use crate::threads::ThreadPool;

    pub(super) fn device() -> Option<Gpu> {
        match Gpu::new(&GpuOptions::default()) {
            Ok(gpu) => Some(gpu),
            Err(e) if std::env::var("POCKET_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
                panic!("POCKET_REQUIRE_GPU=1 but {e}")
            }
            Err(e) => {
                eprintln!("skipping the GPU test: {e}");
                None
            }
        }
    }

    /// A MoE layer's shape of call: three experts of one stacked tensor in
    /// the "file", each over its chosen rows of shared activations (rows
    /// repeated and out of order), beside a whole-matrix product, for every
    /// format the GPU computes with: the same outputs as the CPU's kernels
    /// on the same quantised activations, none on the CPU.
    #[test]
    fn products_over_chosen_rows_match_the_cpu() {
        let Some(gpu) = device() else { return };
        let pool = ThreadPool::new(1);
        let mut rng = Rng::new(31);
        for ty in FORMATS {
            let cols = match ty.block_size() {
                1 => 67,
                32 => 7 * 32,
                b => 2 * b,
            };
            let (rows, n) = (19, 6);
            let file: Vec<u8> = (0..3).flat_map(|_| random_weights(ty, rows, cols, &mut rng)).collect();
            let slab = file.len() / 3;
            let expert = |e: usize| QMatrix::new(ty, &file[e * slab..(e + 1) * slab], rows, cols).unwrap();
            let backend = GpuBackend::new(gpu.clone(), &file);
            let mut acts = QActs::new();
            acts.quantize(ty, &rng.vec(n * cols, 1.0), n, cols);
            let picks: [Option<&[usize]>; 4] = [Some(&[0, 3, 5]), Some(&[1]), Some(&[2, 4, 0, 5, 5]), None];
            let run = |b: &dyn Backend| {
                let mut outs: Vec<Vec<f32>> =
                    picks.iter().map(|p| vec![0.0; p.map_or(n, |r| r.len()) * rows]).collect();
                let mut jobs: Vec<MatJob> = outs
                    .iter_mut()
                    .zip(picks)
                    .enumerate()
                    .map(|(e, (out, rows))| MatJob { w: expert(e % 3), x: &acts, rows, out })
                    .collect();
                b.matmul(&pool, &mut jobs);
                outs
            };
            let before = backend.counters();
            let (want, got) = (run(&Cpu), run(&backend));
            let c = backend.counters() - before;
            assert_eq!((c.gpu_products, c.cpu_products), (4, 0), "{ty}");
            // The three over chosen rows in one submission, the whole product in another.
            assert_eq!((c.device.submissions, c.device.readbacks), (2, 2), "{ty}");
            for (j, (w, g)) in want.iter().zip(&got).enumerate() {
                let range = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (a, b)) in w.iter().zip(g).enumerate() {
                    assert!((a - b).abs() <= 1e-4 * range + 1e-5, "{ty} job {j} output {i}: cpu {a} vs gpu {b}");
                }
            }
        }
    }
}
