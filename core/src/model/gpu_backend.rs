//! The model layer's GPU backend: matrix products, attention and the delta
//! rule on the device ([`crate::gpu`]).
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
//! - attention over an f16 or f32 KV cache runs on the GPU, over a device
//!   copy of each layer's cache ([`KvMirror`], keyed by the cache's id and
//!   dropped with it) that is written only the positions that changed since
//!   it was last synced (a decoded token: one position per layer; after a
//!   truncation, a restored checkpoint or a loaded snapshot, what was
//!   rewritten: the cache counts its writes per position). A q8_0 cache,
//!   a head larger than [`MAX_HEAD_DIM`], or a call the device fails runs
//!   on the CPU, counted;
//! - the delta rule (Gated DeltaNet) runs on the GPU, the recurrent state
//!   uploaded and read back with each call (the CPU's copy stays the one
//!   checkpoints and snapshots save); a key head larger than [`MAX_D_K`] or
//!   a call the device fails runs on the CPU, counted;
//! - the activations are the ones the CPU kernels would use (quantised to
//!   Q8_0 / Q8_1 / Q8_K for quantised weights, [`QActs::dequantize`]d to
//!   f32), so the GPU computes the CPU's products up to f32 rounding.
//!
//! [`QActs::dequantize`]: crate::kernels::QActs::dequantize

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::pass::{Attend, Backend, Cpu, DeltaRule, Pass};
use crate::gpu::{
    AdapterInfo, AttnShape, DeltaShape, Gpu, GpuAttention, GpuBatch, GpuCounters, GpuDeltaRule, GpuMatrix, KvMirror,
    RowsJob, MAX_D_K, MAX_HEAD_DIM,
};
use crate::kernels::{MatJob, QActs};
use crate::threads::ThreadPool;
use crate::Result;

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
    /// The attention kernel, compiled on first use (`None`: it failed to).
    attention: OnceLock<Option<GpuAttention>>,
    /// The delta-rule kernel, compiled on first use (`None`: it failed to).
    delta: OnceLock<Option<GpuDeltaRule>>,
    /// The device copies of the KV caches, by cache id.
    mirrors: Mutex<HashMap<u64, Mirror>>,
    on_gpu: AtomicU64,
    on_cpu: AtomicU64,
    attn_gpu: AtomicU64,
    attn_cpu: AtomicU64,
    delta_gpu: AtomicU64,
    delta_cpu: AtomicU64,
}

/// A KV cache's device copy and how much of it is true.
struct Mirror {
    kv: KvMirror,
    /// Dies with the cache.
    life: Weak<()>,
    /// Positions `..valid` were copied when the cache had seen `writes` writes.
    valid: usize,
    writes: u64,
}

/// How many matrix products ran where since load, and what the device was
/// asked to do for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    pub gpu_products: u64,
    pub cpu_products: u64,
    /// Attention calls (one per attention layer and pass) on each side.
    pub gpu_attention: u64,
    pub cpu_attention: u64,
    /// Delta-rule calls (one per DeltaNet layer and pass) on each side.
    pub gpu_delta: u64,
    pub cpu_delta: u64,
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
            gpu_attention: self.gpu_attention.saturating_sub(o.gpu_attention),
            cpu_attention: self.cpu_attention.saturating_sub(o.cpu_attention),
            gpu_delta: self.gpu_delta.saturating_sub(o.gpu_delta),
            cpu_delta: self.cpu_delta.saturating_sub(o.cpu_delta),
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
            gpu_attention: self.gpu_attention.saturating_add(o.gpu_attention),
            cpu_attention: self.cpu_attention.saturating_add(o.cpu_attention),
            gpu_delta: self.gpu_delta.saturating_add(o.gpu_delta),
            cpu_delta: self.cpu_delta.saturating_add(o.cpu_delta),
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
            attention: OnceLock::new(),
            delta: OnceLock::new(),
            mirrors: Mutex::default(),
            on_gpu: AtomicU64::new(0),
            on_cpu: AtomicU64::new(0),
            attn_gpu: AtomicU64::new(0),
            attn_cpu: AtomicU64::new(0),
            delta_gpu: AtomicU64::new(0),
            delta_cpu: AtomicU64::new(0),
        }
    }

    pub fn adapter(&self) -> &AdapterInfo {
        self.gpu.info()
    }

    pub fn counters(&self) -> BackendCounters {
        BackendCounters {
            gpu_products: self.on_gpu.load(Relaxed),
            cpu_products: self.on_cpu.load(Relaxed),
            gpu_attention: self.attn_gpu.load(Relaxed),
            cpu_attention: self.attn_cpu.load(Relaxed),
            gpu_delta: self.delta_gpu.load(Relaxed),
            cpu_delta: self.delta_cpu.load(Relaxed),
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

    /// Attention on the device: `Ok(false)` when it does not take this
    /// cache or shape (the CPU does, quietly), an error when it failed.
    fn try_attend(&self, pass: &Pass, a: &Attend<'_>, out: &mut [f32]) -> Result<bool> {
        let (p, cache) = (a.p, a.cache);
        let Some((k, v)) = cache.raw() else { return Ok(false) };
        let end = pass.pos0 + pass.n;
        let shape = AttnShape {
            n_head: p.n_head,
            n_kv_head: p.n_kv_head,
            head_dim: p.head_dim,
            head_dim_v: p.head_dim_v,
            q_rows: a.q_rows,
            q_stride: if a.gated { 2 * p.head_dim } else { p.head_dim },
            gated: a.gated,
            scale: p.scale,
            window: p.window,
            pos0: pass.pos0,
            n: pass.n,
        };
        if p.head_dim > MAX_HEAD_DIM || end > cache.capacity || out.len() != pass.n * p.n_head * p.head_dim_v {
            return Ok(false);
        }
        let attention = self.attention.get_or_init(|| {
            GpuAttention::new(&self.gpu).map_err(|e| log::warn!("gpu: attention stays on the CPU: {e}")).ok()
        });
        let Some(attention) = attention else { return Ok(false) };
        let mut mirrors = self.mirrors.lock().map_err(|_| crate::Error::Gpu("KV mirrors poisoned".into()))?;
        // Copies of caches that are gone free their device memory.
        mirrors.retain(|_, m| m.life.strong_count() > 0);
        let (id, life) = cache.identity();
        let f16 = cache.ty == super::KvType::F16;
        let m = match mirrors.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let kv =
                    KvMirror::new(&self.gpu, f16, cache.n_kv_head, cache.head_dim_k, cache.head_dim_v, cache.capacity)?;
                e.insert(Mirror { kv, life, valid: 0, writes: 0 })
            }
        };
        // Positions rewritten since the last copy, and those never copied.
        let from = cache.changed_since(m.writes, m.valid.min(end));
        let result = m.kv.write(k, v, from..end).and_then(|()| {
            let mut got = Vec::new();
            attention.attend(&m.kv, &shape, a.q, &mut got)?;
            out.copy_from_slice(&got);
            Ok(())
        });
        match result {
            Ok(()) => {
                (m.valid, m.writes) = (end, cache.writes());
                Ok(true)
            }
            Err(e) => {
                // Whatever the device holds now, copy it all again next time.
                mirrors.remove(&id);
                Err(e)
            }
        }
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
        match self.try_attend(pass, a, out) {
            Ok(true) => {
                self.attn_gpu.fetch_add(1, Relaxed);
                return;
            }
            Ok(false) => {}
            Err(e) => log::warn!("gpu: attention fell back to the CPU: {e}"),
        }
        self.attn_cpu.fetch_add(1, Relaxed);
        Cpu.attend(pass, a, out, scratch)
    }

    fn delta_rule(&self, pass: &Pass, d: &DeltaRule<'_>, state: &mut [f32], out: &mut [f32], scratch: &mut Vec<f32>) {
        let p = d.p;
        let shape = DeltaShape { n_k_heads: p.n_k_heads, n_v_heads: p.n_v_heads, d_k: p.d_k, d_v: p.d_v, n: pass.n };
        let kernel = (p.d_k <= MAX_D_K)
            .then(|| {
                self.delta.get_or_init(|| {
                    GpuDeltaRule::new(&self.gpu)
                        .map_err(|e| log::warn!("gpu: the delta rule stays on the CPU: {e}"))
                        .ok()
                })
            })
            .and_then(Option::as_ref);
        if let Some(kernel) = kernel {
            match kernel.run(&shape, state, d.qkv, d.g, d.beta, out) {
                Ok(()) => {
                    self.delta_gpu.fetch_add(1, Relaxed);
                    return;
                }
                Err(e) => log::warn!("gpu: the delta rule fell back to the CPU: {e}"),
            }
        }
        self.delta_cpu.fetch_add(1, Relaxed);
        Cpu.delta_rule(pass, d, state, out, scratch)
    }
}

#[cfg(all(test, feature = "gpu"))]
mod tests {
    use super::super::blocks::attention::{AttnParams, Rope};
    use super::super::blocks::deltanet::DeltaParams;
    use super::super::cache::{KvCache, KvType};
    use super::super::pass::{Attend, DeltaRule, Pass};
    use super::{Backend, Cpu, GpuBackend};
    use crate::gpu::{Gpu, GpuOptions, FORMATS};
    use crate::kernels::testing::{random_weights, Rng};
    use crate::kernels::{MatJob, QActs, QMatrix};
    use crate::threads::ThreadPool;

    pub(super) fn device() -> Option<Gpu> {
        device_with(&GpuOptions::default())
    }

    fn device_with(opts: &GpuOptions) -> Option<Gpu> {
        match Gpu::new(opts) {
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

    /// An attention layer's shape for the tests.
    fn layer(n_head: usize, n_kv_head: usize, hd: usize, hdv: usize, window: Option<usize>) -> AttnParams {
        AttnParams {
            n_head,
            n_kv_head,
            head_dim: hd,
            head_dim_v: hdv,
            rope: Rope { n_rot: hd & !1, base: 10000.0, scale: 1.0, neox: false },
            scale: 1.0 / (hd as f32).sqrt(),
            window,
            eps: 1e-6,
        }
    }

    /// Random keys and values at `positions` of every KV head.
    fn fill(cache: &mut KvCache, positions: std::ops::Range<usize>, rng: &mut Rng) {
        for pos in positions {
            for h in 0..cache.n_kv_head {
                let (k, v) = (rng.vec(cache.head_dim_k, 1.0), rng.vec(cache.head_dim_v, 1.0));
                cache.store(h, pos, &k, &v);
            }
        }
    }

    /// `backend`'s attention of `n` random queries at `pos0` against the
    /// CPU's, within f32 rounding (f32 cache) or one f16 rounding of the
    /// weights (f16 cache), relative to the largest value.
    #[allow(clippy::too_many_arguments)]
    fn check(
        backend: &GpuBackend,
        cache: &KvCache,
        p: &AttnParams,
        pos0: usize,
        n: usize,
        gated: bool,
        rng: &mut Rng,
        what: &str,
    ) {
        let pool = ThreadPool::new(2);
        let q_rows = p.n_head * p.head_dim * if gated { 2 } else { 1 };
        let q = rng.vec(n * q_rows, 3.0);
        let a = Attend { p, cache, q: &q, q_rows, gated };
        let run = |b: &dyn Backend| {
            let pass = Pass { file: &[], pool: &pool, backend: b, experts: None, map: None, pos0, n, observer: None };
            let mut out = vec![f32::NAN; n * p.n_head * p.head_dim_v];
            b.attend(&pass, &a, &mut out, &mut Vec::new());
            out
        };
        let (want, got) = (run(&Cpu), run(backend));
        let (_, v) = cache.raw().unwrap();
        let range = match cache.ty {
            KvType::F16 => {
                v.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32().abs()).fold(0f32, f32::max)
            }
            _ => v.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).abs()).fold(0f32, f32::max),
        };
        let tol = if cache.ty == KvType::F16 { 1e-3 } else { 2e-5 } * range.max(1.0);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert!((a - b).abs() <= tol, "{what}: output {i}: cpu {a} vs gpu {b} (tolerance {tol:e})");
        }
    }

    /// Heads, KV heads, head dim, value head dim, window, gated, cache type,
    /// prefill tokens, decoded tokens.
    type Case = (usize, usize, usize, usize, Option<usize>, bool, KvType, usize, usize);

    /// Attention on the device against the CPU's: odd head sizes, GQA ratios
    /// 1, 3 and 4, windows shorter and longer than the context, output
    /// gates, one token and many, f16 and f32 caches, heads larger than the
    /// workgroup and contexts longer than it.
    #[test]
    fn attention_matches_the_cpu() {
        let Some(gpu) = device() else { return };
        let backend = GpuBackend::new(gpu, &[]);
        let mut rng = Rng::new(41);
        let cases: [Case; 6] = [
            (4, 1, 19, 19, None, false, KvType::F16, 1, 4),
            (6, 2, 40, 40, Some(5), false, KvType::F16, 9, 3),
            (8, 2, 64, 48, None, false, KvType::F32, 7, 2),
            (4, 2, 32, 32, Some(3), true, KvType::F16, 6, 2),
            (3, 3, 130, 130, Some(100), false, KvType::F16, 70, 2),
            (5, 5, 33, 33, Some(80), true, KvType::F32, 75, 1),
        ];
        for (n_head, n_kv, hd, hdv, window, gated, ty, prefill, decode) in cases {
            let p = layer(n_head, n_kv, hd, hdv, window);
            let mut cache = KvCache::new(ty, n_kv, hd, hdv, 96).unwrap();
            let what = format!("{n_head}/{n_kv} heads of {hd}/{hdv}, window {window:?}, gated {gated}, {ty:?}");
            fill(&mut cache, 0..prefill, &mut rng);
            check(&backend, &cache, &p, 0, prefill, gated, &mut rng, &format!("{what}: prefill {prefill}"));
            for pos in prefill..prefill + decode {
                fill(&mut cache, pos..pos + 1, &mut rng);
                let before = backend.counters().device;
                check(&backend, &cache, &p, pos, 1, gated, &mut rng, &format!("{what}: decode at {pos}"));
                // Only the new position went up: each head's key and value,
                // widened to whole words.
                let d = backend.counters().device - before;
                let (up, elem) = (d.cache_bytes_uploaded, if ty == KvType::F16 { 2 } else { 4 });
                assert!(
                    up > 0 && up <= (n_kv * (elem * (hd + hdv) + 12)) as u64,
                    "{what}: {up} bytes for one position"
                );
                // Decoding makes no buffers (past a case's first token, whose
                // shape may be larger than the last case's).
                if pos > prefill {
                    assert_eq!(d.buffers_created, 0, "{what}: decode at {pos}");
                }
            }
        }
        let c = backend.counters();
        assert_eq!((c.gpu_attention, c.cpu_attention), (6 + 14, 0));
    }

    /// A prompt whose scores do not fit one binding, or whose tokens exceed
    /// the dispatch grid, goes in several dispatches with the same result.
    #[test]
    fn long_prompts_go_in_several_dispatches() {
        let p = layer(4, 2, 8, 8, None);
        // 20 tokens: 320 bytes of scores each for the last, 12 per 4 KiB
        // binding; at most 7 workgroups per dimension.
        for (opts, dispatches) in [
            (GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }, 2),
            (GpuOptions { max_workgroups_per_dimension: Some(7), ..Default::default() }, 3),
        ] {
            let Some(gpu) = device_with(&opts) else { return };
            let backend = GpuBackend::new(gpu, &[]);
            let mut rng = Rng::new(44);
            let mut cache = KvCache::new(KvType::F16, 2, 8, 8, 32).unwrap();
            fill(&mut cache, 0..20, &mut rng);
            let before = backend.counters();
            check(&backend, &cache, &p, 0, 20, false, &mut rng, &format!("{opts:?}"));
            let c = backend.counters() - before;
            assert_eq!((c.gpu_attention, c.device.submissions, c.device.readbacks), (1, dispatches, 1), "{opts:?}");
        }
    }

    /// The device's copy of a cache follows what the session does to it:
    /// positions rewritten after a truncation, a snapshot loaded over it, a
    /// new cache in place of a dropped one; a q8_0 cache stays on the CPU.
    #[test]
    fn the_device_copy_of_the_cache_follows_rewrites() {
        let Some(gpu) = device() else { return };
        let backend = GpuBackend::new(gpu, &[]);
        let mut rng = Rng::new(42);
        let p = layer(4, 2, 24, 24, None);
        let mut cache = KvCache::new(KvType::F16, 2, 24, 24, 32).unwrap();
        fill(&mut cache, 0..10, &mut rng);
        check(&backend, &cache, &p, 0, 10, false, &mut rng, "prefill");
        // Truncated to 4 and re-evaluated: positions 4..7 are new.
        fill(&mut cache, 4..7, &mut rng);
        check(&backend, &cache, &p, 4, 3, false, &mut rng, "after a truncation");
        // A snapshot of another sequence loaded over positions 0..8, then a token.
        let mut other = KvCache::new(KvType::F16, 2, 24, 24, 32).unwrap();
        fill(&mut other, 0..8, &mut rng);
        let mut bytes = Vec::new();
        other.save_positions(8, &mut bytes);
        cache.load_positions(8, &bytes).unwrap();
        fill(&mut cache, 8..9, &mut rng);
        check(&backend, &cache, &p, 8, 1, false, &mut rng, "after loading a snapshot");
        // A checkpoint's prefix restored (positions untouched): only new ones go up.
        fill(&mut cache, 5..6, &mut rng);
        check(&backend, &cache, &p, 5, 1, false, &mut rng, "after a restore");
        assert_eq!(backend.mirrors.lock().unwrap().len(), 1);
        // A new cache (a new session) gets its own copy; the dropped one's goes.
        drop(cache);
        let mut fresh = KvCache::new(KvType::F16, 2, 24, 24, 32).unwrap();
        fill(&mut fresh, 0..3, &mut rng);
        check(&backend, &fresh, &p, 0, 3, false, &mut rng, "a new cache");
        assert_eq!(backend.mirrors.lock().unwrap().len(), 1);
        let c = backend.counters();
        assert_eq!((c.gpu_attention, c.cpu_attention), (5, 0));
        // q8_0: the CPU's, counted.
        let mut q8 = KvCache::new(KvType::Q8_0, 2, 32, 32, 8).unwrap();
        fill(&mut q8, 0..2, &mut rng);
        let pool = ThreadPool::new(1);
        let p8 = layer(4, 2, 32, 32, None);
        let q = rng.vec(2 * 4 * 32, 1.0);
        let a = Attend { p: &p8, cache: &q8, q: &q, q_rows: 4 * 32, gated: false };
        let pass =
            Pass { file: &[], pool: &pool, backend: &backend, experts: None, map: None, pos0: 0, n: 2, observer: None };
        backend.attend(&pass, &a, &mut vec![0.0; 2 * 4 * 32], &mut Vec::new());
        let c = backend.counters();
        assert_eq!((c.gpu_attention, c.cpu_attention), (5, 1));
    }

    /// The delta rule on the device against the CPU's: odd head sizes, value
    /// heads sharing key heads, heads wider than the workgroup, one token
    /// and many (from 32 tokens the CPU takes its chunked form), over a
    /// state carried from call to call; outputs and the advanced state.
    #[test]
    fn the_delta_rule_matches_the_cpu() {
        let Some(gpu) = device() else { return };
        let backend = GpuBackend::new(gpu, &[]);
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(43);
        // (key heads, value heads, key head, value head, tokens per call)
        let cases = [(1, 1, 19, 23, [1, 1, 5]), (2, 4, 32, 24, [7, 1, 40]), (1, 3, 130, 70, [3, 1, 1])];
        for (n_k_heads, n_v_heads, d_k, d_v, calls) in cases {
            let p = DeltaParams { n_k_heads, n_v_heads, d_k, d_v, d_conv: 4, eps: 1e-6 };
            let what = format!("{n_k_heads}/{n_v_heads} heads of {d_k}/{d_v}");
            let mut want_state = rng.vec(n_v_heads * d_k * d_v, 0.3);
            let mut got_state = want_state.clone();
            let mut pos0 = 0;
            for n in calls {
                // q and k L2-normalised per head, as the layer hands them over.
                let mut qkv = rng.vec(n * p.conv_dim(), 1.0);
                for row in qkv.chunks_exact_mut(p.conv_dim()) {
                    for h in row[..2 * p.key_dim()].chunks_exact_mut(d_k) {
                        let norm = h.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                        h.iter_mut().for_each(|x| *x /= norm);
                    }
                }
                let g: Vec<f32> = (0..n * n_v_heads).map(|_| -rng.f32() * 0.7).collect();
                let beta: Vec<f32> = (0..n * n_v_heads).map(|_| rng.f32()).collect();
                let rule = DeltaRule { p: &p, qkv: &qkv, g: &g, beta: &beta };
                let run = |b: &dyn Backend, state: &mut Vec<f32>| {
                    let pass =
                        Pass { file: &[], pool: &pool, backend: b, experts: None, map: None, pos0, n, observer: None };
                    let mut out = vec![f32::NAN; n * p.value_dim()];
                    b.delta_rule(&pass, &rule, state, &mut out, &mut Vec::new());
                    out
                };
                let want = run(&Cpu, &mut want_state);
                let got = run(&backend, &mut got_state);
                let tol = if n >= 32 { 2e-4 } else { 2e-5 };
                for (name, w, g) in [("output", &want, &got), ("state", &want_state, &got_state)] {
                    let range = w.iter().fold(1f32, |m, v| m.max(v.abs()));
                    for (i, (a, b)) in w.iter().zip(g.iter()).enumerate() {
                        assert!(
                            (a - b).abs() <= tol * range,
                            "{what}, {n} tokens at {pos0}: {name} {i}: cpu {a} vs gpu {b}"
                        );
                    }
                }
                pos0 += n;
            }
        }
        let c = backend.counters();
        assert_eq!((c.gpu_delta, c.cpu_delta), (9, 0));
    }
}
