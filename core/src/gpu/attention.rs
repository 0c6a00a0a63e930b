//! Attention over a KV cache kept on the device (`shaders/attention.wgsl`).
//!
//! [`KvMirror`] is the device's copy of one attention layer's cache, in the
//! cache's own layout and precision (`[kv_head][capacity][dim]`, f16 or
//! f32); the caller writes it the positions that changed (a decoded token
//! adds one), never the whole cache per call. [`GpuAttention::attend`] runs
//! one pass's queries over a mirror: one workgroup per (head, token), one
//! submission (several for a long prompt over a long context, whose scores
//! would not fit one buffer), one readback of the heads' outputs.

use std::ops::Range;
use std::sync::Mutex;

use super::matrix::f32_bytes;
use super::{AttnShape, Gpu, MAX_HEAD_DIM};
use crate::{Error, Result};

/// The device's copy of one layer's KV cache.
pub struct KvMirror {
    pub(super) gpu: Gpu,
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
    pub(super) f16: bool,
    pub(super) n_kv_head: usize,
    pub(super) capacity: usize,
    pub(super) head_dim: usize,
    pub(super) head_dim_v: usize,
}

impl KvMirror {
    /// Device buffers for a cache of `n_kv_head` heads of `capacity`
    /// positions, keys of `head_dim` and values of `head_dim_v` elements of
    /// f16 (`f16`) or f32. Their content is undefined until written.
    pub fn new(
        gpu: &Gpu,
        f16: bool,
        n_kv_head: usize,
        head_dim: usize,
        head_dim_v: usize,
        capacity: usize,
    ) -> Result<KvMirror> {
        let size = |d: usize| {
            n_kv_head
                .checked_mul(capacity)
                .and_then(|x| x.checked_mul(d))
                .and_then(|x| x.checked_mul(if f16 { 2 } else { 4 }))
                .map(|b| (b as u64).next_multiple_of(4).max(4))
                .filter(|&b| b <= gpu.max_binding_bytes())
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "a KV cache of {capacity} positions x {n_kv_head} heads x {d} exceeds the GPU's binding"
                    ))
                })
        };
        let (kb, vb) = (size(head_dim)?, size(head_dim_v)?);
        use wgpu::BufferUsages as U;
        let buffer = |label, size| gpu.buffer(label, size, U::STORAGE | U::COPY_DST | U::COPY_SRC);
        let (k, v) = gpu.scoped("allocating a KV cache", || (buffer("kv keys", kb), buffer("kv values", vb)))?;
        gpu.tally().created(2);
        Ok(KvMirror { gpu: gpu.clone(), k, v, f16, n_kv_head, capacity, head_dim, head_dim_v })
    }

    /// Bytes of one element.
    fn elem(&self) -> usize {
        if self.f16 {
            2
        } else {
            4
        }
    }

    /// Copy positions `pos` of every head from the host cache, whose keys
    /// and values are `k` and `v`: the whole cache's bytes in the same
    /// layout and precision.
    pub fn write(&self, k: &[u8], v: &[u8], pos: Range<usize>) -> Result<()> {
        if pos.is_empty() {
            return Ok(());
        }
        let e = self.elem();
        for (src, d) in [(k, self.head_dim), (v, self.head_dim_v)] {
            if src.len() != self.n_kv_head * self.capacity * d * e || pos.end > self.capacity {
                return Err(Error::InvalidArgument(format!(
                    "{} bytes of a KV cache, positions {pos:?} of {}",
                    src.len(),
                    self.capacity
                )));
            }
        }
        let queue = self.gpu.queue();
        let mut padded = Vec::new();
        let mut bytes = 0;
        self.gpu.scoped("writing a KV cache", || {
            for (src, dst, d) in [(k, &self.k, self.head_dim), (v, &self.v, self.head_dim_v)] {
                for h in 0..self.n_kv_head {
                    // Whole words around the span: the bytes around it are
                    // the same on both sides (already written, or not yet
                    // used).
                    let a = ((h * self.capacity + pos.start) * d * e) & !3;
                    let b = ((h * self.capacity + pos.end) * d * e).next_multiple_of(4).min(src.len());
                    let mut span = &src[a..b];
                    if span.len() % 4 != 0 {
                        padded.clear();
                        padded.extend_from_slice(span);
                        padded.resize(span.len().next_multiple_of(4), 0);
                        span = &padded;
                    }
                    queue.write_buffer(dst, a as u64, span);
                    bytes += span.len() as u64;
                }
            }
        })?;
        self.gpu.tally().cache(bytes);
        Ok(())
    }
}

/// The kernel's `Params` (64 bytes); `chunks`: workgroups per head of a
/// decoded token's split attention (`attention_split.wgsl`; 1 for `main`).
pub(super) fn params(
    s: &AttnShape,
    capacity: usize,
    f16: bool,
    sc_stride: usize,
    t0: usize,
    chunks: usize,
) -> [u8; 64] {
    let words = [
        s.n_head as u32,
        s.n_kv_head as u32,
        s.head_dim as u32,
        s.head_dim_v as u32,
        s.q_rows as u32,
        s.q_stride as u32,
        s.gated as u32,
        capacity as u32,
        s.pos0 as u32,
        s.window.unwrap_or(0) as u32,
        f16 as u32,
        sc_stride as u32,
        s.scale.to_bits(),
        t0 as u32,
        chunks as u32,
        0,
    ];
    let mut b = [0u8; 64];
    for (o, w) in b.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// The scores buffer's size, unless one token alone needs more: a longer
/// prompt goes in several dispatches.
const SCORES_BYTES: usize = 64 << 20;

/// Queries, outputs, scores, readback and parameters of the largest call so far.
struct Io {
    q: wgpu::Buffer,
    out: wgpu::Buffer,
    sc: wgpu::Buffer,
    readback: wgpu::Buffer,
    params: wgpu::Buffer,
}

/// The attention kernel on one device.
pub struct GpuAttention {
    pub(super) gpu: Gpu,
    pub(super) layout: wgpu::BindGroupLayout,
    pub(super) pipeline: wgpu::ComputePipeline,
    /// The decoded token's attention split over positions: the layout adds
    /// the partial results (8); `split_scores`, `split_exp`,
    /// `split_values`, `split_sum`.
    pub(super) split_layout: wgpu::BindGroupLayout,
    pub(super) split: Vec<wgpu::ComputePipeline>,
    io: Mutex<Option<Io>>,
}

impl GpuAttention {
    /// Compile the kernel.
    pub fn new(gpu: &Gpu) -> Result<GpuAttention> {
        use super::context::{storage_entry, uniform_entry};
        let mut entries = vec![
            storage_entry(0, true),
            storage_entry(1, true),
            storage_entry(2, true),
            storage_entry(3, false),
            storage_entry(4, false),
            uniform_entry(5),
        ];
        if gpu.kernels().f16 {
            // Keys and values again, as f16 values (`shaders/kv_f16.wgsl`).
            entries.extend([storage_entry(6, true), storage_entry(7, true)]);
        }
        let (layout, pipeline) = gpu.scoped("compiling the attention kernel", || {
            gpu.compute_pipeline("attention", &entries, super::shaders::attention(gpu.kernels()))
        })?;
        entries.push(storage_entry(8, false));
        let names = ["split_scores", "split_exp", "split_values", "split_sum"];
        let (split_layout, split) = gpu.scoped("compiling the split attention kernels", || {
            gpu.compute_pipelines("split attention", &entries, super::shaders::attention(gpu.kernels()), &names)
        })?;
        Ok(GpuAttention { gpu: gpu.clone(), layout, pipeline, split_layout, split, io: Mutex::default() })
    }

    /// `out` (`[n][n_head][head_dim_v]`) = attention of the queries `q`
    /// (`[n][q_rows]`) over positions `..pos0 + n` of `kv`, which must hold
    /// them. A shape the kernel or the device cannot take is
    /// [`Error::InvalidArgument`] (nothing runs).
    pub fn attend(&self, kv: &KvMirror, s: &AttnShape, q: &[f32], out: &mut Vec<f32>) -> Result<()> {
        let gpu = &self.gpu;
        let end = s.pos0 + s.n;
        let fits = s.n > 0
            && s.n_kv_head == kv.n_kv_head
            && s.head_dim == kv.head_dim
            && s.head_dim_v == kv.head_dim_v
            && (1..=MAX_HEAD_DIM).contains(&s.head_dim)
            && s.head_dim_v > 0
            && s.n_kv_head > 0
            && s.n_head.is_multiple_of(s.n_kv_head)
            && s.q_stride >= s.head_dim
            && s.q_rows >= s.n_head * s.q_stride
            && (!s.gated || s.head_dim_v == s.head_dim && s.q_stride >= 2 * s.head_dim)
            && q.len() == s.n * s.q_rows
            && end <= kv.capacity
            && s.window != Some(0)
            && s.n_head <= gpu.max_groups()
            && kv.gpu.same_device(gpu);
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "attention of {s:?} over a cache of {} positions",
                kv.capacity
            )));
        }
        let sc_stride = s.window.map_or(end, |w| w.min(end));
        let limit = gpu.max_binding_bytes() as usize;
        let (q_bytes, out_bytes) = (4 * q.len(), 4 * s.n * s.n_head * s.head_dim_v);
        // Tokens per dispatch: their scores within one binding, and within
        // SCORES_BYTES unless one token alone needs more; within the grid.
        let row_bytes = 4 * s.n_head * sc_stride;
        let chunk = (SCORES_BYTES.min(limit) / row_bytes).clamp(1, s.n).min(gpu.max_groups());
        if q_bytes.max(out_bytes).max(chunk * row_bytes) > limit {
            return Err(Error::InvalidArgument(format!("attention of {s:?} exceeds the GPU's {limit}-byte binding")));
        }

        let mut io = self.io.lock().map_err(|_| Error::Gpu("attention buffers poisoned".into()))?;
        // Scores for one token over the whole cache at least, so that decoding
        // never grows the buffer as the context grows.
        let one_token = 4 * s.n_head * s.window.map_or(kv.capacity, |w| w.min(kv.capacity));
        let sizes = [q_bytes as u64, out_bytes as u64, (chunk * row_bytes).max(one_token.min(limit)) as u64];
        let have = |io: &Io| [io.q.size(), io.out.size(), io.sc.size()];
        if !io.as_ref().is_some_and(|io| have(io).iter().zip(&sizes).all(|(h, s)| h >= s)) {
            let old = io.as_ref().map_or([0; 3], have);
            let want: Vec<u64> = sizes.iter().zip(old).map(|(&s, o)| s.max(o).max(16).next_multiple_of(16)).collect();
            *io = Some(gpu.scoped("allocating attention buffers", || self.make_io(&want))?);
        }
        let Some(io) = io.as_ref() else { unreachable!("made above") };

        let (device, queue, tally) = (gpu.device(), gpu.queue(), gpu.tally());
        gpu.scoped("running attention", || {
            queue.write_buffer(&io.q, 0, f32_bytes(q));
            tally.activations(q_bytes as u64);
            let mut entries = vec![
                wgpu::BindGroupEntry { binding: 0, resource: kv.k.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: kv.v.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: io.q.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: io.out.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 4, resource: io.sc.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 5, resource: io.params.as_entire_binding() },
            ];
            if gpu.kernels().f16 {
                entries.extend([
                    wgpu::BindGroupEntry { binding: 6, resource: kv.k.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 7, resource: kv.v.as_entire_binding() },
                ]);
            }
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("attention"),
                layout: &self.layout,
                entries: &entries,
            });
            // One submission per dispatch: each writes its own parameters
            // first (a queue write lands before the commands submitted after it).
            for t0 in (0..s.n).step_by(chunk) {
                let nt = chunk.min(s.n - t0);
                queue.write_buffer(&io.params, 0, &params(s, kv.capacity, kv.f16, sc_stride, t0, 1));
                tally.activations(64);
                let mut enc =
                    device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("attention") });
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    pass.set_pipeline(&self.pipeline);
                    pass.set_bind_group(0, &group, &[]);
                    pass.dispatch_workgroups(s.n_head as u32, nt as u32, 1);
                }
                if t0 + nt == s.n {
                    enc.copy_buffer_to_buffer(&io.out, 0, &io.readback, 0, out_bytes as u64);
                }
                queue.submit([enc.finish()]);
                tally.submitted(1);
            }
        })?;
        gpu.read_f32(&io.readback, out_bytes as u64, out)
    }

    /// Buffers of `[q, out, scores]` bytes (the readback as large as out).
    fn make_io(&self, sizes: &[u64]) -> Io {
        let buffer = |label, size: u64, usage| self.gpu.buffer(label, size, usage);
        use wgpu::BufferUsages as U;
        self.gpu.tally().created(5);
        Io {
            q: buffer("attention q", sizes[0], U::STORAGE | U::COPY_DST),
            out: buffer("attention out", sizes[1], U::STORAGE | U::COPY_SRC),
            sc: buffer("attention scores", sizes[2], U::STORAGE),
            readback: buffer("attention readback", sizes[1], U::MAP_READ | U::COPY_DST),
            params: buffer("attention params", 64, U::UNIFORM | U::COPY_DST),
        }
    }
}
