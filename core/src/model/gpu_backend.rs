//! The model layer's GPU backend: a decoded token as one submission, and a
//! prompt's matrix products, attention and delta rule on the device.
//!
//! What runs where, today:
//! - a decoded token (one token, no observer, no routing trace) is one
//!   submission and one readback when the architecture records its layers
//!   ([`decode`]: [`Network::record`](super::network::Network::record)):
//!   the whole pass runs on the device, the per-row arithmetic included,
//!   over the same device copies of the KV caches and recurrent states as
//!   below; the readback carries the logits and the token's keys and
//!   values, which join the host's cache; the conv windows and delta-rule
//!   states stay on the device. The graph is recorded at the first such
//!   token of a shape of state (context length, KV type) and bound to each
//!   sequence in turn; a state it does not take (a q8_0 cache, a shape the
//!   kernels refuse) decodes per operation, as below;
//! - a prompt runs per operation: every matrix product over weights that lie in the model file runs on
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
//!   rewritten: the cache counts its writes per position). A q8_0 cache, a
//!   cache larger than one binding, a head larger than [`MAX_HEAD_DIM`], or
//!   a call the device fails runs on the CPU, counted;
//! - the delta rule (Gated DeltaNet) runs on the GPU over a device copy of
//!   each layer's recurrent state ([`GpuState`], keyed by the state's id
//!   and dropped with it) that stays there between calls: the state holds
//!   it as its newest values ([`Ssm::advanced_on`]) and reads it back only
//!   when the CPU needs them (a checkpoint, a snapshot, a pass on the CPU);
//!   it is uploaded only when the host's copy was written since (a new
//!   sequence, a restored checkpoint, a loaded snapshot: the state counts
//!   its writes). A key head larger than [`MAX_D_K`], a state larger than
//!   one binding, or a call the device fails runs on the CPU, counted;
//! - in a prompt the per-row arithmetic (norms, RoPE, the DeltaNet conv,
//!   routing, activations) runs on the CPU;
//! - the activations are the ones the CPU kernels would use (quantised to
//!   Q8_0 / Q8_1 / Q8_K for quantised weights, [`QActs::device_values`]:
//!   back to f32, Q8_1 with its f16 block sums, which Q4_1's and Q5_1's
//!   minimums multiply; in a decoded token quantised so on the device), so
//!   the GPU computes the CPU's products up to f32 rounding.
//!
//! Weights go up at load ([`GpuBackend::upload_weights`]): each MoE expert
//! stack whole (a prompt's expert products use their rows of it, as the
//! decoded token's do: one copy), and every matrix a decoded token reads,
//! by recording a decode over a throwaway state. A weight outside those (an
//! architecture that does not record) goes up at its first use.
//!
//! Not yet: the weights are copies (no Metal no-copy buffer over the
//! mapping, no `VK_EXT_external_memory_host`).
//!
//! [`QActs::device_values`]: crate::kernels::QActs::device_values

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::cache::{KvCache, KvType};
use super::cpu::Cpu;
use super::pass::{Attend, Backend, DeltaRule, HostBlock, Pass};
use super::ssm::{DeviceCopy, Ssm};
use crate::gguf::direct::{AlignedBuf, DirectFile, ALIGN};
use crate::gpu::{
    AdapterInfo, AttnShape, DeltaShape, Gpu, GpuAttention, GpuBatch, GpuCounters, GpuDeltaRule, GpuMatrix, GpuState,
    KvMirror, RowsJob, MAX_D_K, MAX_HEAD_DIM,
};
use crate::kernels::{MatJob, QActs, QMatrix};
use crate::threads::ThreadPool;
use crate::{Error, Result};

/// Uploaded matrices by the address and length of their bytes; `None` for
/// one the device refused (it stays on the CPU).
type Uploads = HashMap<(usize, usize), Option<Arc<GpuMatrix>>>;

/// Matrix products on a [`Gpu`], the rest on the CPU.
pub struct GpuBackend {
    gpu: Gpu,
    /// The model file's bytes (address range): only weights inside it are
    /// uploaded, since only they never change under the same address.
    file: (usize, usize),
    /// The file itself, where the model came from one: weights go up by
    /// positional reads straight into the device buffers (around the page
    /// cache where the file system allows), never through the mapping.
    reads: Option<DirectFile>,
    matrices: Mutex<Uploads>,
    /// The MoE expert stacks, uploaded whole at load (their address range
    /// and matrix): an expert's products use its rows of the stack, so a
    /// prompt and a decoded token share one copy.
    stacks: OnceLock<Vec<(std::ops::Range<usize>, Arc<GpuMatrix>)>>,
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
    /// The device copies of the recurrent states (and conv windows), by id.
    states: Mutex<HashMap<u64, StateMirror>>,
    /// The host's f32 weights (norms, biases, conv taps) on the device, by
    /// the address and length of their values (and a tag for a derived one).
    #[cfg(feature = "gpu")]
    constants: Mutex<HashMap<(usize, usize, u8), crate::gpu::Constant>>,
    /// The graph kernels, compiled on first use (`None`: they failed to).
    #[cfg(feature = "gpu")]
    graph_ops: OnceLock<Option<Arc<crate::gpu::GraphOps>>>,
    /// The recorded decode per shape of state (`None`: it does not record),
    /// bound to the last state of that shape that decoded.
    #[cfg(feature = "gpu")]
    graphs: Mutex<HashMap<decode::Shape, Option<decode::DecodeGraph>>>,
    graph_tokens: AtomicU64,
    on_gpu: AtomicU64,
    on_cpu: AtomicU64,
    attn_gpu: AtomicU64,
    attn_cpu: AtomicU64,
    delta_gpu: AtomicU64,
    delta_cpu: AtomicU64,
    /// Calls of each [`HostBlock`] (blocks without a device path), by its index in `HostBlock::ALL`.
    host_blocks: [AtomicU64; HostBlock::ALL.len()],
}

/// A KV cache's device copy and how much of it is true.
struct Mirror {
    /// `None`: the device refused a copy of this cache (too large); its
    /// attention stays on the CPU.
    kv: Option<Arc<KvMirror>>,
    /// Dies with the cache.
    life: Weak<()>,
    /// Positions `..valid` were copied when the cache had seen `writes` writes.
    valid: usize,
    writes: u64,
}

/// A recurrent state's device copy.
struct StateMirror {
    /// `None`: the device refused a copy of this state (too large); its
    /// delta rule stays on the CPU.
    copy: Option<Arc<DeviceState>>,
    /// Dies with the state.
    life: Weak<()>,
    /// The copy equals the host's when the state had seen `writes` writes
    /// (`u64::MAX`: never).
    writes: u64,
}

/// A [`GpuState`] as a state's newer copy. `lost`: a failed call may have
/// advanced it halfway, so it can no longer be read back.
struct DeviceState {
    gpu: GpuState,
    lost: std::sync::atomic::AtomicBool,
}

impl DeviceCopy for DeviceState {
    fn read_back(&self, out: &mut [f32]) -> Result<()> {
        if self.lost.load(Relaxed) {
            return Err(crate::Error::Gpu("a recurrent state on the GPU was lost to a failed call".into()));
        }
        self.gpu.read(out)
    }
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
    /// Tokens decoded as one submission (a recorded graph); their products,
    /// attention and delta rules are not among the counts above.
    pub graph_tokens: u64,
    /// Calls of the blocks without a device path, on the host (one per
    /// layer and pass), in the order of [`HostBlock::ALL`].
    pub host_blocks: [u64; HostBlock::ALL.len()],
    /// Submissions, dispatches, buffers and bytes moved (see [`GpuCounters`]).
    pub device: GpuCounters,
}

impl BackendCounters {
    /// What ran on the host that a device would run: the blocks without a
    /// device path that ran ([`HostBlock::name`]), then `matrix_products`,
    /// `attention` and `delta_rule` when calls of theirs fell back.
    pub fn on_host(&self) -> Vec<&'static str> {
        let blocks = HostBlock::ALL.into_iter().filter(|&b| self.host_blocks[b as usize] > 0).map(HostBlock::name);
        let fell_back =
            [(self.cpu_products, "matrix_products"), (self.cpu_attention, "attention"), (self.cpu_delta, "delta_rule")];
        blocks.chain(fell_back.into_iter().filter(|&(n, _)| n > 0).map(|(_, name)| name)).collect()
    }
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
            graph_tokens: self.graph_tokens.saturating_sub(o.graph_tokens),
            host_blocks: std::array::from_fn(|i| self.host_blocks[i].saturating_sub(o.host_blocks[i])),
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
            graph_tokens: self.graph_tokens.saturating_add(o.graph_tokens),
            host_blocks: std::array::from_fn(|i| self.host_blocks[i].saturating_add(o.host_blocks[i])),
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
            reads: None,
            matrices: Mutex::default(),
            stacks: OnceLock::new(),
            io: Mutex::default(),
            inputs: Mutex::default(),
            attention: OnceLock::new(),
            delta: OnceLock::new(),
            mirrors: Mutex::default(),
            states: Mutex::default(),
            #[cfg(feature = "gpu")]
            constants: Mutex::default(),
            #[cfg(feature = "gpu")]
            graph_ops: OnceLock::new(),
            #[cfg(feature = "gpu")]
            graphs: Mutex::default(),
            graph_tokens: AtomicU64::new(0),
            on_gpu: AtomicU64::new(0),
            on_cpu: AtomicU64::new(0),
            attn_gpu: AtomicU64::new(0),
            attn_cpu: AtomicU64::new(0),
            delta_gpu: AtomicU64::new(0),
            delta_cpu: AtomicU64::new(0),
            host_blocks: Default::default(),
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
            graph_tokens: self.graph_tokens.load(Relaxed),
            host_blocks: std::array::from_fn(|i| self.host_blocks[i].load(Relaxed)),
            device: self.gpu.counters(),
        }
    }

    /// Read the weights it uploads from `file` (the model file's bytes, the
    /// same as the mapping's) rather than copy them from the mapping: no
    /// page of the mapping is touched, so the weights are in memory once,
    /// in the device's buffers (on a phone's unified memory, that is all of it).
    pub fn reading_from(mut self, file: DirectFile) -> GpuBackend {
        self.reads = Some(file);
        self
    }

    /// Upload the model's weights now: each MoE expert stack whole (`stacks`:
    /// the stacks' views into the file), then what `record` uploads (where
    /// the architecture records its decode: every matrix a decoded token
    /// reads). What the device refuses stays for later (and the CPU), logged.
    pub fn upload_weights(&self, stacks: &[QMatrix<'_>], record: impl FnOnce(&GpuBackend)) {
        let mut up = Vec::new();
        for w in stacks {
            if let Some(m) = self.upload(w) {
                let a = w.data.as_ptr() as usize;
                up.push((a..a + w.data.len(), m));
            }
        }
        let _ = self.stacks.set(up);
        record(self);
    }

    /// The stack uploaded whole that holds the weights `w` (one expert's
    /// slab), and `w`'s rows of it.
    fn stack_rows(&self, w: &QMatrix<'_>) -> Option<(Arc<GpuMatrix>, std::ops::Range<usize>)> {
        let a = w.data.as_ptr() as usize;
        let (range, m) = self.stacks.get()?.iter().find(|(r, _)| r.start <= a && a + w.data.len() <= r.end)?;
        let row_bytes = range.len() / m.rows();
        let off = a - range.start;
        if m.ty() != w.ty || m.cols() != w.cols || row_bytes == 0 || !off.is_multiple_of(row_bytes) {
            return None;
        }
        let w0 = off / row_bytes;
        Some((m.clone(), w0..w0 + w.rows))
    }

    /// The device's copy of `job`'s weights, uploading them on first use;
    /// `None` when they stay on the CPU.
    fn matrix(&self, job: &MatJob<'_>) -> Option<Arc<GpuMatrix>> {
        self.upload(&job.w)
    }

    /// The device's copy of the weights `w`, uploaded on first use; `None`
    /// when they stay on the CPU (outside the file, or refused).
    fn upload(&self, w: &QMatrix<'_>) -> Option<Arc<GpuMatrix>> {
        let (addr, len) = (w.data.as_ptr() as usize, w.data.len());
        let (start, file_len) = self.file;
        if addr < start || addr + len > start + file_len {
            return None;
        }
        let mut map = self.matrices.lock().ok()?;
        map.entry((addr, len))
            .or_insert_with(|| match self.upload_matrix(w, addr - start) {
                Ok(m) => Some(Arc::new(m)),
                Err(e) => {
                    log::warn!("gpu: a {}x{} {} matrix stays on the CPU: {e}", w.rows, w.cols, w.ty);
                    None
                }
            })
            .clone()
    }

    /// Upload `w`, which lies at byte `offset` of the file: read from the
    /// file where there is one, else copied from the bytes in memory.
    fn upload_matrix(&self, w: &QMatrix<'_>, offset: usize) -> Result<GpuMatrix> {
        let Some(file) = &self.reads else { return GpuMatrix::upload(&self.gpu, w.ty, w.rows, w.cols, w.data) };
        // An aligned bounce buffer for the reads (direct I/O), freed after.
        let mut bounce = AlignedBuf::new((w.data.len().next_multiple_of(ALIGN) + 2 * ALIGN).min(8 << 20))?;
        GpuMatrix::upload_with(&self.gpu, w.ty, w.rows, w.cols, w.data.len(), &mut |off, len, put| {
            file.read_each((offset + off) as u64, len, bounce.as_mut_slice(), put)
        })
    }

    /// `job` on the device; `false` when it must run on the CPU instead.
    fn try_gpu(&self, job: &mut MatJob<'_>) -> bool {
        let Some(m) = self.matrix(job) else { return false };
        let Ok(mut io) = self.io.lock() else { return false };
        let (x, y) = &mut *io;
        job.x.device_values(x);
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
            // An expert of a stack uploaded whole: its rows of the stack.
            let Some((m, w_rows)) = self.stack_rows(&job.w).or_else(|| {
                let m = self.matrix(job)?;
                let all = 0..m.rows();
                Some((m, all))
            }) else {
                continue;
            };
            if job.out.len() < rows.len() * w_rows.len() {
                continue;
            }
            let x: &QActs = job.x;
            let input = acts.iter().position(|&a| std::ptr::eq(a, x)).unwrap_or_else(|| {
                acts.push(x);
                acts.len() - 1
            });
            picked.push((i, m, w_rows, input, rows));
        }
        if picked.is_empty() {
            return done;
        }
        if inputs.len() < acts.len() {
            inputs.resize_with(acts.len(), Vec::new);
        }
        for (x, f) in acts.iter().zip(inputs.iter_mut()) {
            x.device_values(f);
        }
        let views: Vec<(&[f32], usize)> =
            acts.iter().zip(inputs.iter()).map(|(x, f)| (f.as_slice(), x.device_row_len())).collect();
        let batch: Vec<RowsJob<'_>> = picked
            .iter()
            .map(|(_, m, w_rows, input, rows)| RowsJob { matrix: m, input: *input, rows, w_rows: w_rows.clone() })
            .collect();
        let mut out = Vec::new();
        if let Err(e) = self.batch.run(&views, &batch, &mut out) {
            log::warn!("gpu: {} products over chosen rows fell back to the CPU: {e}", batch.len());
            return done;
        }
        if out.len() != picked.iter().map(|(_, _, w, _, rows)| rows.len() * w.len()).sum::<usize>() {
            log::warn!("gpu: {} outputs of a batch of products over chosen rows; it runs on the CPU", out.len());
            return done;
        }
        let mut at = 0;
        for (i, _, w, _, rows) in &picked {
            let len = rows.len() * w.len();
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
        // The device kernel has no sinks: the CPU takes those layers.
        if cache.raw().is_none() || a.sinks.is_some() {
            return Ok(false);
        }
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
        let Some(attention) = self.attention_kernel() else { return Ok(false) };
        let Some(kv) = self.kv_mirror(cache)? else { return Ok(false) };
        self.write_mirror(cache, &kv, end)?;
        let mut got = Vec::new();
        let result = attention.attend(&kv, &shape, a.q, &mut got).and_then(|()| {
            let back = out.len();
            let got = got.get(..back).ok_or_else(|| crate::Error::Gpu(format!("{} of {back} outputs", got.len())))?;
            out.copy_from_slice(got);
            Ok(true)
        });
        if result.is_err() {
            // Whatever the device holds now, copy it all again next time.
            self.forget_mirror(cache);
        }
        result
    }
}

impl GpuBackend {
    /// The attention kernel, compiled on first use.
    fn attention_kernel(&self) -> Option<&GpuAttention> {
        let kernel = self.attention.get_or_init(|| {
            GpuAttention::new(&self.gpu).map_err(|e| log::warn!("gpu: attention stays on the CPU: {e}")).ok()
        });
        kernel.as_ref()
    }

    /// The delta-rule kernel, compiled on first use.
    fn delta_kernel(&self) -> Option<&GpuDeltaRule> {
        let kernel = self.delta.get_or_init(|| {
            GpuDeltaRule::new(&self.gpu).map_err(|e| log::warn!("gpu: the delta rule stays on the CPU: {e}")).ok()
        });
        kernel.as_ref()
    }

    /// The delta rule on the device, over its copy of `state`: `Ok(false)`
    /// when it does not take this shape or state (the CPU does, quietly),
    /// an error when it failed.
    fn try_delta(&self, pass: &Pass, d: &DeltaRule<'_>, state: &mut Ssm, out: &mut [f32]) -> Result<bool> {
        let p = d.p;
        let shape = DeltaShape { n_k_heads: p.n_k_heads, n_v_heads: p.n_v_heads, d_k: p.d_k, d_v: p.d_v, n: pass.n };
        if p.d_k > MAX_D_K {
            return Ok(false);
        }
        let Some(kernel) = self.delta_kernel() else { return Ok(false) };
        let Some(copy) = self.state_copy(state)? else { return Ok(false) };
        self.make_current(state, &copy)?;
        match kernel.run(&shape, &copy.gpu, d.qkv, d.g, d.beta, out) {
            Ok(()) => {
                state.advanced_on(copy);
                Ok(true)
            }
            // Nothing ran: the copy is as it was.
            Err(e @ crate::Error::InvalidArgument(_)) => Err(e),
            Err(e) => {
                // It may have advanced halfway: never read it, never use it again.
                copy.lost.store(true, Relaxed);
                if let Ok(mut states) = self.states.lock() {
                    states.remove(&state.identity().0);
                }
                Err(e)
            }
        }
    }
}

/// The device copies of caches and recurrent states, shared by prompts and
/// decoded tokens.
impl GpuBackend {
    /// The device copy of `cache`, made on first use; `None` when the
    /// device refused one.
    fn kv_mirror(&self, cache: &KvCache) -> Result<Option<Arc<KvMirror>>> {
        let mut mirrors = self.mirrors.lock().map_err(|_| Error::Gpu("KV mirrors poisoned".into()))?;
        mirrors.retain(|_, m| m.life.strong_count() > 0);
        let (id, life) = cache.identity();
        let f16 = cache.ty == KvType::F16;
        let m = mirrors.entry(id).or_insert_with(|| {
            let kv = KvMirror::new(&self.gpu, f16, cache.n_kv_head, cache.head_dim_k, cache.head_dim_v, cache.capacity)
                .map_err(|err| log::warn!("gpu: a KV cache stays on the CPU: {err}"))
                .ok()
                .map(Arc::new);
            Mirror { kv, life, valid: 0, writes: 0 }
        });
        Ok(m.kv.clone())
    }

    /// Copy to `mirror` the positions below `end` that `cache` rewrote
    /// since the last copy, or never copied.
    fn write_mirror(&self, cache: &KvCache, mirror: &KvMirror, end: usize) -> Result<()> {
        let Some((k, v)) = cache.raw() else {
            return Err(crate::Error::InvalidArgument("a q8_0 KV cache has no device copy".into()));
        };
        let mut mirrors = self.mirrors.lock().map_err(|_| Error::Gpu("KV mirrors poisoned".into()))?;
        let (id, _) = cache.identity();
        let Some(m) = mirrors.get_mut(&id) else { return Err(Error::Gpu("a KV cache's device copy is gone".into())) };
        let from = cache.changed_since(m.writes, m.valid.min(end));
        if let Err(e) = mirror.write(k, v, from..end) {
            mirrors.remove(&id);
            return Err(e);
        }
        (m.valid, m.writes) = (end, cache.writes());
        Ok(())
    }

    /// The device copy of `cache` holds positions `..end`, as the host does now.
    #[cfg(feature = "gpu")]
    fn synced(&self, cache: &KvCache, end: usize) {
        if let Ok(mut mirrors) = self.mirrors.lock() {
            if let Some(m) = mirrors.get_mut(&cache.identity().0) {
                (m.valid, m.writes) = (end, cache.writes());
            }
        }
    }

    /// The device copy of a state's values, made on first use; `None` when
    /// the device refused one.
    fn state_copy(&self, s: &Ssm) -> Result<Option<Arc<DeviceState>>> {
        let mut states = self.states.lock().map_err(|_| Error::Gpu("state mirrors poisoned".into()))?;
        states.retain(|_, m| m.life.strong_count() > 0);
        let (id, life) = s.identity();
        let m = states.entry(id).or_insert_with(|| {
            let copy = GpuState::new(&self.gpu, s.len())
                .map_err(|e| log::warn!("gpu: a recurrent state stays on the CPU: {e}"))
                .ok()
                .map(|gpu| Arc::new(DeviceState { gpu, lost: false.into() }));
            StateMirror { copy, life, writes: u64::MAX }
        });
        Ok(m.copy.clone())
    }

    /// Make `copy` hold `s`'s newest values: read back from another device
    /// copy, or write the host's when it changed since.
    fn make_current(&self, s: &mut Ssm, copy: &Arc<DeviceState>) -> Result<()> {
        let mine = s.ahead().is_some_and(|a| std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(copy)));
        if mine {
            return Ok(());
        }
        if s.ahead().is_some() {
            s.host_mut()?;
        }
        let mut states = self.states.lock().map_err(|_| Error::Gpu("state mirrors poisoned".into()))?;
        let Some(m) = states.get_mut(&s.identity().0) else {
            return Err(Error::Gpu("a state's device copy is gone".into()));
        };
        if m.writes != s.writes() || copy.lost.load(Relaxed) {
            copy.gpu.write(s.host())?;
            copy.lost.store(false, Relaxed);
            m.writes = s.writes();
        }
        Ok(())
    }

    /// Drop the device copy of `cache` (after a failure: whatever the
    /// device holds is copied again next time).
    fn forget_mirror(&self, cache: &KvCache) {
        if let Ok(mut mirrors) = self.mirrors.lock() {
            mirrors.remove(&cache.identity().0);
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

    fn delta_rule(
        &self,
        pass: &Pass,
        d: &DeltaRule<'_>,
        state: &mut Ssm,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        match self.try_delta(pass, d, state, out) {
            Ok(true) => {
                self.delta_gpu.fetch_add(1, Relaxed);
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => log::warn!("gpu: the delta rule fell back to the CPU: {e}"),
        }
        self.delta_cpu.fetch_add(1, Relaxed);
        // Reads the state back first when the device holds it.
        Cpu.delta_rule(pass, d, state, out, scratch)
    }

    fn on_host(&self, block: HostBlock) {
        self.host_blocks[block as usize].fetch_add(1, Relaxed);
    }
}

#[cfg(feature = "gpu")]
mod decode;

/// Without the GPU backend no [`GpuBackend`] exists; this is never called.
#[cfg(not(feature = "gpu"))]
impl GpuBackend {
    pub(in crate::model) fn decode(
        &self,
        _net: &dyn super::network::Network,
        _file: &[u8],
        _state: &mut super::state::State,
        _token: u32,
        _want: super::cache::Logits,
    ) -> Result<bool> {
        Ok(false)
    }

    pub(in crate::model) fn warm_up(
        &self,
        _net: &dyn super::network::Network,
        _file: &[u8],
        _state: &super::state::State,
    ) {
    }
}

#[cfg(all(test, feature = "gpu"))]
mod tests;
