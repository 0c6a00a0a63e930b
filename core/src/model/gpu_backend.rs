//! The model layer's GPU backend: matrix products on the device
//! ([`crate::gpu`]), attention and the delta rule on the CPU for now.
//!
//! What runs where, today:
//! - every whole-matrix product over weights that lie in the model file
//!   runs on the GPU; each matrix is uploaded once, the first time a pass
//!   uses it (the first pass is the warm-up: after it no weights move and
//!   no buffers are made unless a larger batch arrives);
//! - products over chosen rows, or over weights outside the file (none
//!   today: a memory budget is refused with this backend), and any product
//!   the device fails, run on the CPU ([`Cpu`]) and are counted;
//! - the activations are the ones the CPU kernels would use (quantised to
//!   Q8_0 / Q8_1 / Q8_K for quantised weights, [`QActs::dequantize`]d to
//!   f32), so the GPU computes the CPU's products up to f32 rounding.
//!
//! [`QActs::dequantize`]: crate::kernels::QActs::dequantize

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::pass::{Attend, Backend, Cpu, DeltaRule, Pass};
use crate::gpu::{AdapterInfo, Gpu, GpuCounters, GpuMatrix};
use crate::kernels::MatJob;
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
            gpu,
            file: (file.as_ptr() as usize, file.len()),
            matrices: Mutex::default(),
            io: Mutex::default(),
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
        if job.rows.is_some() || addr < start || addr + len > start + file_len {
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

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn matmul(&self, pool: &ThreadPool, jobs: &mut [MatJob<'_>]) {
        for job in jobs.iter_mut() {
            if self.try_gpu(job) {
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
