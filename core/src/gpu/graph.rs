//! A decoded token as one submission: the dispatches of a whole forward
//! pass recorded once over device buffers, replayed per token.
//!
//! A [`Graph`] owns its activations ([`Tensor`]s: f32 buffers made when the
//! graph is built, never after), binds the host's f32 weights shared by
//! every graph ([`Constant`]), and holds a list of dispatches whose bind
//! groups are made once too (again only when it is bound to another
//! sequence's caches and states): matrix products over [`GpuMatrix`] weights, the MoE
//! experts chosen by a router on the device (`main_experts`), the per-row
//! operations of `shaders/graph.wgsl`, keys and values into a [`KvMirror`],
//! attention over it, and the delta rule over a [`GpuState`]. [`Graph::run`]
//! writes the token's position and input, records every dispatch into one
//! compute pass, copies the tensors the host wants into one readback buffer,
//! and submits once: one submission and one readback per token.
//!
//! What depends on the position is read from a small buffer on the device
//! (`step`) or, for attention, rewritten into that layer's parameters
//! before the submission; the dispatch grid never depends on it.

use std::num::NonZeroU64;
use std::sync::Arc;

use super::attention::{params as attention_params, GpuAttention, KvMirror};
use super::context::{storage_entry, uniform_entry, MatvecEntry};
use super::delta::{GpuDeltaRule, GpuState};
use super::matrix::{f32_bytes, GpuMatrix};
use super::{AttnShape, DeltaShape, Gpu, MAX_D_K, MAX_HEAD_DIM};
use crate::{Error, Result};

/// An f32 buffer of a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    id: usize,
    len: usize,
}

impl Tensor {
    /// Values it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The compiled operations of `shaders/graph.wgsl` and `kv_store.wgsl` on
/// one device (compile once, share between graphs).
pub struct GraphOps {
    layout: wgpu::BindGroupLayout,
    ops: Vec<(&'static str, Arc<wgpu::ComputePipeline>)>,
    kv_layout: wgpu::BindGroupLayout,
    kv: Arc<wgpu::ComputePipeline>,
}

/// The entry points of `shaders/graph.wgsl`.
const ENTRY_POINTS: [&str; 11] =
    ["norm", "rope", "add", "glu", "softcap", "decay", "conv", "route", "shared_gate", "combine", "quant"];

impl GraphOps {
    pub fn new(gpu: &Gpu) -> Result<GraphOps> {
        let device = gpu.device();
        gpu.scoped("compiling the graph kernels", || {
            let entries = [
                storage_entry(0, false),
                storage_entry(1, true),
                storage_entry(2, true),
                storage_entry(3, false),
                uniform_entry(4),
                storage_entry(5, true),
            ];
            let layout = device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some("graph"), entries: &entries });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("graph"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("graph"),
                source: wgpu::ShaderSource::Wgsl(super::shaders::graph(gpu.kernels()).into()),
            });
            let ops = ENTRY_POINTS
                .iter()
                .map(|&name| {
                    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(name),
                        layout: Some(&pipeline_layout),
                        module: &module,
                        entry_point: Some(name),
                        compilation_options: Default::default(),
                        cache: None,
                    });
                    (name, Arc::new(pipeline))
                })
                .collect();
            let kv_entries =
                [storage_entry(0, false), storage_entry(1, true), uniform_entry(2), storage_entry(3, true)];
            let (kv_layout, kv) =
                gpu.compute_pipeline("kv store", &kv_entries, super::shaders::kv_store(gpu.kernels()));
            GraphOps { layout, ops, kv_layout, kv: Arc::new(kv) }
        })
    }

    fn op(&self, name: &str) -> Arc<wgpu::ComputePipeline> {
        let found = self.ops.iter().find(|(n, _)| *n == name);
        found.map(|(_, p)| p.clone()).unwrap_or_else(|| unreachable!("no graph entry point {name}"))
    }
}

/// Weights the host keeps as f32 (norms, biases, conv taps) on the device,
/// uploaded once and bound by any number of graphs.
#[derive(Clone)]
pub struct Constant {
    buffer: wgpu::Buffer,
    len: usize,
}

impl Constant {
    pub fn upload(gpu: &Gpu, values: &[f32]) -> Result<Constant> {
        let bytes = (4 * values.len().max(1)).next_multiple_of(16) as u64;
        if bytes > gpu.max_binding_bytes() {
            return Err(Error::InvalidArgument(format!("{} values exceed the GPU's binding", values.len())));
        }
        use wgpu::BufferUsages as U;
        let buffer = gpu.scoped("uploading weights", || {
            let b = gpu.buffer("graph constant", bytes, U::STORAGE | U::COPY_DST);
            if !values.is_empty() {
                gpu.queue().write_buffer(&b, 0, f32_bytes(values));
            }
            b
        })?;
        gpu.tally().created(1);
        gpu.tally().weights(4 * values.len() as u64);
        Ok(Constant { buffer, len: values.len() })
    }
}

/// One per-row operation's parameters (`Params` in `shaders/graph.wgsl`).
#[derive(Clone, Copy, Debug, Default)]
pub struct OpParams {
    pub n: u32,
    pub width: u32,
    pub a0: u32,
    pub sa: u32,
    pub b0: u32,
    pub sb: u32,
    pub mode: u32,
    pub k: u32,
    pub m: u32,
    pub eps: f32,
    pub f0: f32,
    pub f1: f32,
}

/// `norm`'s modes (`shaders/graph.wgsl`).
pub mod norm_mode {
    pub const WEIGHT: u32 = 1;
    pub const IN_PLACE: u32 = 2;
    pub const L2: u32 = 4;
    pub const SILU_GATE: u32 = 8;
}

/// The operations of `shaders/graph.wgsl`, by entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Rows of `a` (or `b`) normalised: see `norm_mode`.
    Norm,
    Rope,
    /// a[a0 + i] += b[b0 + i % k].
    Add,
    /// a = act(a) * b: mode 0 SiLU, 1 GELU.
    Glu,
    Softcap,
    Decay,
    Conv,
    Route,
    SharedGate,
    Combine,
    /// `a` = `b` quantised to int8 blocks and back (mode 0: Q8_0, 1: Q8_1,
    /// each block's `s` after its values, as `act_len` lays them out; 2: Q8_K).
    Quant,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Norm => "norm",
            Op::Rope => "rope",
            Op::Add => "add",
            Op::Glu => "glu",
            Op::Softcap => "softcap",
            Op::Decay => "decay",
            Op::Conv => "conv",
            Op::Route => "route",
            Op::SharedGate => "shared_gate",
            Op::Combine => "combine",
            Op::Quant => "quant",
        }
    }
}

/// A recorded dispatch, and what its bind group binds (to bind another
/// sequence's caches and states in place of the ones it was recorded with).
struct Dispatch {
    pipeline: Arc<wgpu::ComputePipeline>,
    group: wgpu::BindGroup,
    grid: [u32; 3],
    layout: wgpu::BindGroupLayout,
    /// Binding, buffer, and the bound size when not the whole buffer.
    entries: Vec<(u32, wgpu::Buffer, Option<u64>)>,
}

/// A bind group entry as a [`Dispatch`] keeps it.
type Entry = (u32, wgpu::Buffer, Option<u64>);

/// An attention layer's parameters, rewritten per token (its position).
struct AttnParams {
    buffer: wgpu::Buffer,
    shape: AttnShape,
    capacity: usize,
    f16: bool,
    sc_stride: usize,
    /// Workgroups per head (1: `main`; more: `attention_split.wgsl`).
    chunks: usize,
}

/// A forward pass of one token, recorded.
pub struct Graph {
    gpu: Gpu,
    ops: Arc<GraphOps>,
    buffers: Vec<wgpu::Buffer>,
    /// Word 0: the token's position.
    step: wgpu::Buffer,
    /// Bound where an operation leaves a binding unused: a read-only one,
    /// and the written `d` (one buffer may not be both in a dispatch).
    dummy: Tensor,
    dummy_rw: Tensor,
    dispatches: Vec<Dispatch>,
    attention: Vec<AttnParams>,
    /// The tensors [`run`](Self::run) reads back, one after the other.
    reads: Vec<Tensor>,
    readback: Option<wgpu::Buffer>,
}

/// Workgroups of 64 for `n` invocations, along x then y (`p.e` in the shader).
fn grid_1d(gpu: &Gpu, n: usize) -> ([u32; 3], u32) {
    let groups = n.div_ceil(64).max(1);
    let max = gpu.max_groups();
    let gx = groups.min(max);
    ([gx as u32, groups.div_ceil(gx) as u32, 1], gx as u32)
}

impl Graph {
    /// An empty graph on `gpu`.
    pub fn new(gpu: &Gpu, ops: Arc<GraphOps>) -> Result<Graph> {
        use wgpu::BufferUsages as U;
        let step = gpu.scoped("allocating a graph", || gpu.buffer("graph step", 16, U::STORAGE | U::COPY_DST))?;
        gpu.tally().created(1);
        let mut g = Graph {
            gpu: gpu.clone(),
            ops,
            buffers: Vec::new(),
            step,
            dummy: Tensor { id: 0, len: 0 },
            dummy_rw: Tensor { id: 0, len: 0 },
            dispatches: Vec::new(),
            attention: Vec::new(),
            reads: Vec::new(),
            readback: None,
        };
        g.dummy = g.tensor(4)?;
        g.dummy_rw = g.tensor(4)?;
        Ok(g)
    }

    /// A tensor of `len` f32 values (content undefined until written).
    pub fn tensor(&mut self, len: usize) -> Result<Tensor> {
        let bytes = (4 * len.max(1)).next_multiple_of(16) as u64;
        if bytes > self.gpu.max_binding_bytes() {
            return Err(Error::InvalidArgument(format!("a tensor of {len} values exceeds the GPU's binding")));
        }
        use wgpu::BufferUsages as U;
        let buffer = self.gpu.scoped("allocating a tensor", || {
            self.gpu.buffer("graph tensor", bytes, U::STORAGE | U::COPY_DST | U::COPY_SRC)
        })?;
        self.gpu.tally().created(1);
        self.buffers.push(buffer);
        Ok(Tensor { id: self.buffers.len() - 1, len })
    }

    /// A tensor holding `values` (weights the host keeps as f32: norms,
    /// biases, conv taps), written once.
    pub fn constant(&mut self, values: &[f32]) -> Result<Tensor> {
        let t = self.tensor(values.len())?;
        if !values.is_empty() {
            self.gpu.queue().write_buffer(&self.buffers[t.id], 0, f32_bytes(values));
        }
        self.gpu.tally().weights(4 * values.len() as u64);
        Ok(t)
    }

    /// `c` as a tensor of this graph (the same buffer, not a copy).
    pub fn bind_constant(&mut self, c: &Constant) -> Tensor {
        self.buffers.push(c.buffer.clone());
        Tensor { id: self.buffers.len() - 1, len: c.len }
    }

    fn buf(&self, t: Tensor) -> &wgpu::Buffer {
        &self.buffers[t.id]
    }

    fn uniform(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        use wgpu::BufferUsages as U;
        let b = self.gpu.scoped("allocating parameters", || {
            self.gpu.buffer(label, bytes.len().next_multiple_of(16) as u64, U::UNIFORM | U::COPY_DST)
        })?;
        self.gpu.queue().write_buffer(&b, 0, bytes);
        self.gpu.tally().created(1);
        Ok(b)
    }

    /// Record a dispatch of `pipeline` over a bind group of `entries` in `layout`.
    fn push(
        &mut self,
        label: &str,
        pipeline: Arc<wgpu::ComputePipeline>,
        layout: &wgpu::BindGroupLayout,
        entries: Vec<Entry>,
        grid: [u32; 3],
    ) -> Result<()> {
        let group = self.bind(label, layout, &entries)?;
        self.dispatches.push(Dispatch { pipeline, group, grid, layout: layout.clone(), entries });
        Ok(())
    }

    fn bind(&self, label: &str, layout: &wgpu::BindGroupLayout, entries: &[Entry]) -> Result<wgpu::BindGroup> {
        let entries: Vec<wgpu::BindGroupEntry> = entries
            .iter()
            .map(|(binding, buffer, size)| wgpu::BindGroupEntry {
                binding: *binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: 0,
                    size: size.and_then(NonZeroU64::new),
                }),
            })
            .collect();
        let device = self.gpu.device();
        self.gpu.scoped("binding a graph operation", || {
            device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout, entries: &entries })
        })
    }

    /// Bind `new` wherever the graph binds `old` (another sequence's cache
    /// or state of the same shape): new bind groups, no new buffer.
    fn rebind(&mut self, swaps: &[(&wgpu::Buffer, &wgpu::Buffer)]) -> Result<()> {
        for i in 0..self.dispatches.len() {
            let d = &self.dispatches[i];
            if !d.entries.iter().any(|(_, b, _)| swaps.iter().any(|(old, _)| *old == b)) {
                continue;
            }
            let entries: Vec<Entry> = d
                .entries
                .iter()
                .map(|(n, b, size)| {
                    let b = swaps.iter().find(|(old, _)| *old == b).map_or(b, |(_, new)| *new);
                    (*n, b.clone(), *size)
                })
                .collect();
            let group = self.bind("rebound", &d.layout, &entries)?;
            let d = &mut self.dispatches[i];
            (d.group, d.entries) = (group, entries);
        }
        Ok(())
    }

    /// Bind the KV cache copy `new` where `old` is bound (same shape).
    pub fn rebind_kv(&mut self, old: &KvMirror, new: &KvMirror) -> Result<()> {
        let same = (old.f16, old.n_kv_head, old.capacity, old.head_dim, old.head_dim_v)
            == (new.f16, new.n_kv_head, new.capacity, new.head_dim, new.head_dim_v);
        if !same || !new.gpu.same_device(&self.gpu) {
            return Err(Error::InvalidArgument("rebinding a KV cache of another shape".into()));
        }
        self.rebind(&[(&old.k, &new.k), (&old.v, &new.v)])
    }

    /// Bind the state copy `new` where `old` is bound (same length).
    pub fn rebind_state(&mut self, old: &GpuState, new: &GpuState) -> Result<()> {
        if old.len != new.len || !new.gpu.same_device(&self.gpu) {
            return Err(Error::InvalidArgument("rebinding a state of another length".into()));
        }
        self.rebind(&[(&old.values, &new.values)])
    }

    /// A per-row operation over `a` (written), `b`, `c`, `d` (`None`: unused)
    /// on a grid of `invocations` (one-dimensional ops) or of `rows`
    /// workgroups (`Norm`), or one workgroup (`Route`, `SharedGate`).
    pub fn op(
        &mut self,
        op: Op,
        p: OpParams,
        a: Tensor,
        b: Option<Tensor>,
        c: Option<Tensor>,
        d: Option<Tensor>,
    ) -> Result<()> {
        let (grid, gx) = match op {
            Op::Norm => ([p.n, 1, 1], 1),
            Op::Quant => {
                let blocks = (p.n as usize).div_ceil(if p.mode == 2 { 256 } else { 32 });
                let max = self.gpu.max_groups();
                let gx = blocks.clamp(1, max);
                ([gx as u32, blocks.div_ceil(gx).max(1) as u32, 1], gx as u32)
            }
            Op::Route | Op::SharedGate => ([1, 1, 1], 1),
            Op::Rope => grid_1d(&self.gpu, (p.n * p.k) as usize),
            Op::Decay | Op::Conv | Op::Add | Op::Glu | Op::Softcap | Op::Combine => grid_1d(&self.gpu, p.n as usize),
        };
        if grid[0] as usize > self.gpu.max_groups() {
            return Err(Error::InvalidArgument(format!("{} rows exceed the GPU's dispatch grid", grid[0])));
        }
        let words: [u32; 16] = [
            p.n,
            p.width,
            p.a0,
            p.sa,
            p.b0,
            p.sb,
            p.mode,
            p.k,
            p.m,
            gx,
            p.eps.to_bits(),
            p.f0.to_bits(),
            p.f1.to_bits(),
            0,
            0,
            0,
        ];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let params = self.uniform(op.name(), &bytes)?;
        let (b, c, d) = (b.unwrap_or(self.dummy), c.unwrap_or(self.dummy), d.unwrap_or(self.dummy_rw));
        let entries = vec![
            (0, self.buf(a).clone(), None),
            (1, self.buf(b).clone(), None),
            (2, self.buf(c).clone(), None),
            (3, self.buf(d).clone(), None),
            (4, params, None),
            (5, self.step.clone(), None),
        ];
        let layout = self.ops.layout.clone();
        self.push(op.name(), self.ops.op(op.name()), &layout, entries, grid)
    }

    /// `y[..rows] = W · x` (one token; `x` laid out as [`super::act_len`] says).
    pub fn matvec(&mut self, m: &GpuMatrix, x: Tensor, y: Tensor) -> Result<()> {
        if !m.is_on(&self.gpu) || x.len != m.act_cols() || y.len < m.rows() {
            return Err(Error::InvalidArgument(format!(
                "a {}x{} product from {} into {} values",
                m.rows(),
                m.cols(),
                x.len,
                y.len
            )));
        }
        let pipeline = self.gpu.matvec_pipeline(m.ty(), MatvecEntry::All)?;
        let layout = self.gpu.layout().clone();
        for (weights, params, (gx, gy)) in m.chunks() {
            let entries = self.matvec_entries(weights, x, y, params);
            self.push("graph matvec", pipeline.clone(), &layout, entries, [gx, gy, 1])?;
        }
        Ok(())
    }

    /// A product's bindings: weights, x, y, params (and the weights again
    /// as f16 values for the f16 kernels).
    fn matvec_entries(&self, weights: &wgpu::Buffer, x: Tensor, y: Tensor, params: &wgpu::Buffer) -> Vec<Entry> {
        let mut entries = vec![
            (0, weights.clone(), None),
            (1, self.buf(x).clone(), None),
            (2, self.buf(y).clone(), None),
            (3, params.clone(), None),
        ];
        if self.gpu.kernels().f16 {
            entries.push((6, weights.clone(), None));
        }
        entries
    }

    /// `y[j][..per] = W_{ids[j]} · x[j * x_stride ..]` for the `k` experts a
    /// router chose (`ids`: the router's output, ids as u32 bits first) of a
    /// stack `m` of experts of `per` rows each.
    #[allow(clippy::too_many_arguments)]
    pub fn experts(
        &mut self,
        m: &GpuMatrix,
        per: usize,
        ids: Tensor,
        k: usize,
        x: Tensor,
        x_stride: usize,
        y: Tensor,
    ) -> Result<()> {
        // `x_stride` counts activations; `x` holds them as `act_len` lays them out.
        let x_need = if x_stride == 0 { m.cols() } else { k.saturating_sub(1) * x_stride + m.cols() };
        let x_need = super::act_len(m.ty(), x_need);
        // Whole blocks apart (the kernel finds each expert's input in `x` by its block).
        let strided = (x_stride == 0 || x_stride >= m.cols()) && x_stride.is_multiple_of(m.ty().block_size());
        let (gx, gy) = self.expert_grid(m, per, ids, k, x, x_need, y, strided)?;
        let pipeline = self.gpu.matvec_pipeline(m.ty(), MatvecEntry::Experts)?;
        let job = self.job("graph experts job", [x_stride as u32, 0, 0, k as u32, 0, per as u32, gx as u32, 0])?;
        let layout = self.gpu.rows_layout().clone();
        for (weights, params, _) in m.chunks() {
            let mut entries = self.matvec_entries(weights, x, y, params);
            entries.extend([(4, job.clone(), Some(super::batch::JOB_BYTES)), (5, self.buf(ids).clone(), None)]);
            self.push("graph experts", pipeline.clone(), &layout, entries, [gx as u32, gy as u32, k as u32])?;
        }
        Ok(())
    }

    /// `y[..rows] = act(G · x) * (U · x)` (one token; `act`: 0 SiLU, 1
    /// GELU): a GLU's gate and up products and its activation in one
    /// dispatch per binding (`main_glu`). `g` and `u` must be split alike
    /// ([`GpuMatrix::split_like`]).
    pub fn matvec_glu(&mut self, g: &GpuMatrix, u: &GpuMatrix, act: u32, x: Tensor, y: Tensor) -> Result<()> {
        if !g.is_on(&self.gpu) || !g.split_like(u) || act > 1 || x.len != g.act_cols() || y.len < g.rows() {
            return Err(Error::InvalidArgument(format!(
                "a fused {}x{} gate and {}x{} up product from {} into {} values",
                g.rows(),
                g.cols(),
                u.rows(),
                u.cols(),
                x.len,
                y.len
            )));
        }
        let job = self.job("graph gate and up job", [0, 0, 0, 0, 0, 0, 0, act])?;
        let pipeline = self.gpu.matvec_pipeline(g.ty(), MatvecEntry::Glu)?;
        let layout = self.gpu.glu_layout().clone();
        for ((gw, params, (gx, gy)), (uw, _, _)) in g.chunks().zip(u.chunks()) {
            let entries = self.glu_entries(gw, uw, x, y, params, &job, self.dummy);
            self.push("graph gate and up", pipeline.clone(), &layout, entries, [gx, gy, 1])?;
        }
        Ok(())
    }

    /// `y[j][..per] = act(G_{ids[j]} · x) * (U_{ids[j]} · x)` for the `k`
    /// experts a router chose (as [`Graph::experts`] with one input for
    /// all): the routed experts' gate and up products and activation in one
    /// dispatch per binding (`main_experts_glu`).
    #[allow(clippy::too_many_arguments)]
    pub fn experts_glu(
        &mut self,
        g: &GpuMatrix,
        u: &GpuMatrix,
        act: u32,
        per: usize,
        ids: Tensor,
        k: usize,
        x: Tensor,
        y: Tensor,
    ) -> Result<()> {
        let (gx, gy) = self.expert_grid(g, per, ids, k, x, g.act_cols(), y, g.split_like(u) && act <= 1)?;
        let job = self.job("graph gate and up job", [0, 0, 0, k as u32, 0, per as u32, gx as u32, act])?;
        let pipeline = self.gpu.matvec_pipeline(g.ty(), MatvecEntry::ExpertsGlu)?;
        let layout = self.gpu.glu_layout().clone();
        for ((gw, params, _), (uw, _, _)) in g.chunks().zip(u.chunks()) {
            let entries = self.glu_entries(gw, uw, x, y, params, &job, ids);
            self.push(
                "graph experts gate and up",
                pipeline.clone(),
                &layout,
                entries,
                [gx as u32, gy as u32, k as u32],
            )?;
        }
        Ok(())
    }

    /// What every product over the `k` experts a router chose (`ids`) of a
    /// stack `m` of `per` rows each needs (`x` of at least `x_need`
    /// values, `y` of `k * per`; `more`: the caller's own conditions), and
    /// its grid: rows along x, then y.
    #[allow(clippy::too_many_arguments)]
    fn expert_grid(
        &self,
        m: &GpuMatrix,
        per: usize,
        ids: Tensor,
        k: usize,
        x: Tensor,
        x_need: usize,
        y: Tensor,
        more: bool,
    ) -> Result<(usize, usize)> {
        let fits = more
            && m.is_on(&self.gpu)
            && per > 0
            && m.rows().is_multiple_of(per)
            && k > 0
            && ids.len >= k
            && x.len >= x_need
            && y.len >= k * per
            && k <= self.gpu.max_groups();
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "{k} experts of {per} rows of a {}x{} stack from {} into {} values",
                m.rows(),
                m.cols(),
                x.len,
                y.len
            )));
        }
        let max = self.gpu.max_groups();
        let gx = per.min(max);
        let gy = per.div_ceil(gx);
        if gy > max {
            return Err(Error::InvalidArgument(format!("{per} rows exceed the GPU's dispatch grid")));
        }
        Ok((gx, gy))
    }

    /// A product's job (`Job` of `shaders/matvec.wgsl`) as a uniform buffer.
    fn job(&self, label: &str, words: [u32; 8]) -> Result<wgpu::Buffer> {
        let job: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.uniform(label, &job)
    }

    /// A fused product's bindings: a product's, its job and row list, and the up matrix.
    #[allow(clippy::too_many_arguments)]
    fn glu_entries(
        &self,
        gate: &wgpu::Buffer,
        up: &wgpu::Buffer,
        x: Tensor,
        y: Tensor,
        params: &wgpu::Buffer,
        job: &wgpu::Buffer,
        ids: Tensor,
    ) -> Vec<Entry> {
        let mut entries = self.matvec_entries(gate, x, y, params);
        entries.extend([
            (4, job.clone(), Some(super::batch::JOB_BYTES)),
            (5, self.buf(ids).clone(), None),
            (7, up.clone(), None),
        ]);
        if self.gpu.kernels().f16 {
            entries.push((8, up.clone(), None));
        }
        entries
    }

    /// The token's keys `k` and values `v` (`[n_kv_head][dim]`) into `kv`
    /// at the token's position.
    pub fn kv_store(&mut self, kv: &KvMirror, k: Tensor, v: Tensor) -> Result<()> {
        if !kv.gpu.same_device(&self.gpu)
            || k.len != kv.n_kv_head * kv.head_dim
            || v.len != kv.n_kv_head * kv.head_dim_v
        {
            return Err(Error::InvalidArgument(format!("keys of {} and values of {} for a KV cache", k.len, v.len)));
        }
        for (dst, src, dim) in [(&kv.k, k, kv.head_dim), (&kv.v, v, kv.head_dim_v)] {
            let words = [kv.n_kv_head as u32, dim as u32, kv.capacity as u32, kv.f16 as u32];
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let params = self.uniform("kv store", &bytes)?;
            let entries = vec![
                (0, dst.clone(), None),
                (1, self.buf(src).clone(), None),
                (2, params, None),
                (3, self.step.clone(), None),
            ];
            let groups = kv.n_kv_head.div_ceil(64) as u32;
            let layout = self.ops.kv_layout.clone();
            self.push("kv store", self.ops.kv.clone(), &layout, entries, [groups, 1, 1])?;
        }
        Ok(())
    }

    /// Attention of the token's queries `q` over `kv` (positions up to the
    /// token's) into `out`; `shape`'s `pos0` is set per token, its `n` is 1.
    /// `scores` holds one row of scores per head over the whole cache (or window).
    pub fn attention(
        &mut self,
        kernel: &GpuAttention,
        kv: &KvMirror,
        shape: AttnShape,
        q: Tensor,
        out: Tensor,
        scores: Tensor,
    ) -> Result<()> {
        let s = AttnShape { n: 1, ..shape };
        let sc_stride = s.window.map_or(kv.capacity, |w| w.min(kv.capacity));
        let fits = kv.gpu.same_device(&self.gpu)
            && kernel.gpu.same_device(&self.gpu)
            && s.n_kv_head == kv.n_kv_head
            && s.head_dim == kv.head_dim
            && s.head_dim_v == kv.head_dim_v
            && (1..=MAX_HEAD_DIM).contains(&s.head_dim)
            && s.n_kv_head > 0
            && s.n_head.is_multiple_of(s.n_kv_head)
            && s.q_stride >= s.head_dim
            && s.q_rows >= s.n_head * s.q_stride
            && (!s.gated || s.head_dim_v == s.head_dim && s.q_stride >= 2 * s.head_dim)
            && q.len >= s.q_rows
            && out.len >= s.n_head * s.head_dim_v
            && scores.len >= s.n_head * sc_stride
            && s.window != Some(0)
            && s.n_head <= self.gpu.max_groups();
        if !fits {
            return Err(Error::InvalidArgument(format!("graph attention of {s:?} over {} positions", kv.capacity)));
        }
        // A long context's positions go to several workgroups per head.
        let chunks = self.gpu.attention_chunks(sc_stride);
        let params = attention_params(&s, kv.capacity, kv.f16, sc_stride, 0, chunks);
        let buffer = self.uniform("graph attention", &params)?;
        let mut entries = vec![
            (0, kv.k.clone(), None),
            (1, kv.v.clone(), None),
            (2, self.buf(q).clone(), None),
            (3, self.buf(out).clone(), None),
            (4, self.buf(scores).clone(), None),
            (5, buffer.clone(), None),
        ];
        if self.gpu.kernels().f16 {
            entries.extend([(6, kv.k.clone(), None), (7, kv.v.clone(), None)]);
        }
        if chunks == 1 {
            let pipeline = Arc::new(kernel.pipeline.clone());
            self.push("graph attention", pipeline, &kernel.layout, entries, [s.n_head as u32, 1, 1])?;
        } else {
            let parts = self.tensor(s.n_head * chunks * (2 + s.head_dim_v))?;
            entries.push((8, self.buf(parts).clone(), None));
            let (heads, c) = (s.n_head as u32, chunks as u32);
            for (pipeline, grid) in
                kernel.split.iter().zip([[c, heads, 1], [c, heads, 1], [c, heads, 1], [heads, 1, 1]])
            {
                let pipeline = Arc::new(pipeline.clone());
                self.push("graph split attention", pipeline, &kernel.split_layout, entries.clone(), grid)?;
            }
        }
        self.attention.push(AttnParams { buffer, shape: s, capacity: kv.capacity, f16: kv.f16, sc_stride, chunks });
        Ok(())
    }

    /// The delta rule of one token over `state`: `qkv` (`[conv_dim]`, q and
    /// k normalised), `gb` (`[exp(g) | beta]` per value head) into `out`.
    pub fn delta(
        &mut self,
        kernel: &GpuDeltaRule,
        state: &GpuState,
        shape: DeltaShape,
        qkv: Tensor,
        gb: Tensor,
        out: Tensor,
    ) -> Result<()> {
        let s = DeltaShape { n: 1, ..shape };
        let (kd, vd) = (s.n_k_heads * s.d_k, s.n_v_heads * s.d_v);
        let fits = kernel.gpu.same_device(&self.gpu)
            && state.gpu.same_device(&self.gpu)
            && s.n_k_heads > 0
            && (1..=MAX_D_K).contains(&s.d_k)
            && s.d_v > 0
            && s.n_v_heads > 0
            && s.n_v_heads <= self.gpu.max_groups()
            && state.len == s.n_v_heads * s.d_k * s.d_v
            && qkv.len >= 2 * kd + vd
            && gb.len >= 2 * s.n_v_heads
            && out.len >= vd;
        if !fits {
            return Err(Error::InvalidArgument(format!("the graph's delta rule of {s:?}")));
        }
        let words = [
            1u32,
            s.n_v_heads as u32,
            s.n_k_heads as u32,
            s.d_k as u32,
            s.d_v as u32,
            (2 * kd + vd) as u32,
            kd as u32,
            (1.0 / (s.d_k as f32).sqrt()).to_bits(),
        ];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let params = self.uniform("graph delta rule", &bytes)?;
        let entries = vec![
            (0, state.values.clone(), None),
            (1, self.buf(qkv).clone(), None),
            (2, self.buf(gb).clone(), None),
            (3, self.buf(out).clone(), None),
            (4, params, None),
        ];
        let pipeline = Arc::new(kernel.pipeline.clone());
        self.push("graph delta rule", pipeline, &kernel.layout, entries, [s.n_v_heads as u32, 1, 1])
    }

    /// An op over a raw f32 buffer of the device (a recurrent state's conv
    /// window) as its `d` binding: see [`op`](Self::op).
    pub fn conv(&mut self, p: OpParams, x: Tensor, taps: Tensor, window: &GpuState) -> Result<()> {
        let hist = p.k as usize;
        let n = p.n as usize;
        if !window.gpu.same_device(&self.gpu) || window.len != hist * n || x.len < n || taps.len < (hist + 1) * n {
            return Err(Error::InvalidArgument(format!("a conv of {hist} + 1 taps over {n} channels")));
        }
        let (grid, gx) = grid_1d(&self.gpu, n);
        let words: [u32; 16] = [p.n, 0, 0, 0, 0, 0, 0, p.k, 0, gx, 0, 0, 0, 0, 0, 0];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let params = self.uniform("conv", &bytes)?;
        let entries = vec![
            (0, self.buf(x).clone(), None),
            (1, self.buf(taps).clone(), None),
            (2, self.buf(self.dummy).clone(), None),
            (3, window.values.clone(), None),
            (4, params, None),
            (5, self.step.clone(), None),
        ];
        let layout = self.ops.layout.clone();
        self.push("conv", self.ops.op("conv"), &layout, entries, grid)
    }

    /// The tensors [`run`](Self::run) reads back, in this order.
    pub fn read_back(&mut self, tensors: &[Tensor]) -> Result<()> {
        let bytes = (4 * tensors.iter().map(|t| t.len).sum::<usize>()).max(4) as u64;
        use wgpu::BufferUsages as U;
        let buffer = self
            .gpu
            .scoped("allocating a readback", || self.gpu.buffer("graph readback", bytes, U::MAP_READ | U::COPY_DST))?;
        self.gpu.tally().created(1);
        self.reads = tensors.to_vec();
        self.readback = Some(buffer);
        Ok(())
    }

    /// The words of a device buffer (tests).
    #[cfg(test)]
    pub(super) fn read_words(gpu: &Gpu, buffer: &wgpu::Buffer) -> Vec<u32> {
        use wgpu::BufferUsages as U;
        let back = gpu.buffer("test readback", buffer.size(), U::MAP_READ | U::COPY_DST);
        let mut enc = gpu.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(buffer, 0, &back, 0, buffer.size());
        gpu.queue().submit([enc.finish()]);
        let mut out = Vec::new();
        gpu.read_f32(&back, buffer.size(), &mut out).unwrap();
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// Dispatches per token.
    pub fn dispatches(&self) -> usize {
        self.dispatches.len()
    }

    /// Run the graph for the token at `pos`, its inputs written first
    /// (`inputs`: tensor and values); `out` = the read-back tensors, one
    /// after the other. One submission, one readback.
    pub fn run(&self, pos: usize, inputs: &[(Tensor, &[f32])], out: &mut Vec<f32>) -> Result<()> {
        let Some(readback) = &self.readback else {
            return Err(Error::InvalidArgument("a graph without its readback".into()));
        };
        let (device, queue, tally) = (self.gpu.device(), self.gpu.queue(), self.gpu.tally());
        let bytes: u64 = 4 * self.reads.iter().map(|t| t.len as u64).sum::<u64>();
        self.gpu.scoped("running a decoded token", || {
            let mut up = 16u64;
            queue.write_buffer(&self.step, 0, &[pos as u32, 0, 0, 0].map(u32::to_le_bytes).concat());
            for &(t, values) in inputs {
                queue.write_buffer(self.buf(t), 0, f32_bytes(&values[..values.len().min(t.len)]));
                up += 4 * values.len().min(t.len) as u64;
            }
            for a in &self.attention {
                let s = AttnShape { pos0: pos, ..a.shape };
                queue.write_buffer(&a.buffer, 0, &attention_params(&s, a.capacity, a.f16, a.sc_stride, 0, a.chunks));
                up += 64;
            }
            tally.activations(up);
            let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("token") });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                for d in &self.dispatches {
                    pass.set_pipeline(&d.pipeline);
                    pass.set_bind_group(0, &d.group, &[]);
                    pass.dispatch_workgroups(d.grid[0], d.grid[1], d.grid[2]);
                }
            }
            let mut at = 0u64;
            for &t in &self.reads {
                let n = 4 * t.len as u64;
                if n > 0 {
                    enc.copy_buffer_to_buffer(self.buf(t), 0, readback, at, n);
                }
                at += n;
            }
            queue.submit([enc.finish()]);
            tally.submitted(self.dispatches.len() as u64);
        })?;
        if bytes == 0 {
            out.clear();
            return Ok(());
        }
        self.gpu.read_f32(readback, bytes, out)
    }
}
