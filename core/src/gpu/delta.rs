//! The gated delta rule of a Gated DeltaNet layer on the device
//! (`shaders/delta.wgsl`): one workgroup per value head, the pass's tokens
//! in order.
//!
//! The recurrent state is the caller's (the CPU's copy is what checkpoints
//! and snapshots save): each call uploads it with the pass's inputs and
//! reads it back with the outputs, one submission and one readback.

use std::sync::Mutex;

use super::matrix::f32_bytes;
use super::{DeltaShape, Gpu, MAX_D_K};
use crate::{Error, Result};

/// State, inputs, outputs and readback of the largest call so far.
struct Io {
    state: wgpu::Buffer,
    qkv: wgpu::Buffer,
    gb: wgpu::Buffer,
    out: wgpu::Buffer,
    readback: wgpu::Buffer,
    params: wgpu::Buffer,
}

/// The delta-rule kernel on one device.
pub struct GpuDeltaRule {
    gpu: Gpu,
    layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
    io: Mutex<Option<Io>>,
}

impl GpuDeltaRule {
    /// Compile the kernel.
    pub fn new(gpu: &Gpu) -> Result<GpuDeltaRule> {
        use super::context::{storage_entry, uniform_entry};
        let (layout, pipeline) = gpu.scoped("compiling the delta-rule kernel", || {
            gpu.compute_pipeline(
                "delta rule",
                &[
                    storage_entry(0, false),
                    storage_entry(1, true),
                    storage_entry(2, true),
                    storage_entry(3, false),
                    uniform_entry(4),
                ],
                super::shaders::delta(gpu.kernels()),
            )
        })?;
        Ok(GpuDeltaRule { gpu: gpu.clone(), layout, pipeline, io: Mutex::default() })
    }

    /// Advance `state` (`[n_v_heads][d_k][d_v]`) over `s.n` tokens of `qkv`
    /// (`[n][conv_dim]`: q | k | v, q and k normalised), log decays `g` and
    /// update strengths `beta` (`[n][n_v_heads]` each), writing each token's
    /// output (`[n][n_v_heads * d_v]`) into `out`. A shape the kernel or the
    /// device cannot take is [`Error::InvalidArgument`] (nothing runs, the
    /// state is untouched).
    pub fn run(
        &self,
        s: &DeltaShape,
        state: &mut [f32],
        qkv: &[f32],
        g: &[f32],
        beta: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let gpu = &self.gpu;
        let (kd, vd) = (s.n_k_heads * s.d_k, s.n_v_heads * s.d_v);
        let conv_dim = 2 * kd + vd;
        let fits = s.n > 0
            && s.n_k_heads > 0
            && (1..=MAX_D_K).contains(&s.d_k)
            && s.d_v > 0
            && s.n_v_heads > 0
            && s.n_v_heads <= gpu.max_groups()
            && state.len() == s.n_v_heads * s.d_k * s.d_v
            && qkv.len() == s.n * conv_dim
            && g.len() == s.n * s.n_v_heads
            && beta.len() == g.len()
            && out.len() == s.n * vd;
        if !fits {
            return Err(Error::InvalidArgument(format!("the delta rule of {s:?} over {} state values", state.len())));
        }
        let sizes = [4 * state.len(), 4 * qkv.len(), 8 * g.len(), 4 * out.len()].map(|b| b as u64);
        let limit = gpu.max_binding_bytes();
        if sizes.iter().any(|&b| b > limit) {
            return Err(Error::InvalidArgument(format!(
                "the delta rule of {s:?} exceeds the GPU's {limit}-byte binding"
            )));
        }

        let mut io = self.io.lock().map_err(|_| Error::Gpu("delta-rule buffers poisoned".into()))?;
        let have = |io: &Io| [io.state.size(), io.qkv.size(), io.gb.size(), io.out.size()];
        if !io.as_ref().is_some_and(|io| have(io).iter().zip(&sizes).all(|(h, s)| h >= s)) {
            let old = io.as_ref().map_or([0; 4], have);
            let want: Vec<u64> = sizes.iter().zip(old).map(|(&s, o)| s.max(o).max(16).next_multiple_of(16)).collect();
            *io = Some(gpu.scoped("allocating delta-rule buffers", || self.make_io(&want))?);
        }
        let Some(io) = io.as_ref() else { unreachable!("made above") };

        let words = [
            s.n as u32,
            s.n_v_heads as u32,
            s.n_k_heads as u32,
            s.d_k as u32,
            s.d_v as u32,
            conv_dim as u32,
            kd as u32,
            (1.0 / (s.d_k as f32).sqrt()).to_bits(),
        ];
        let params: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (device, queue, tally) = (gpu.device(), gpu.queue(), gpu.tally());
        let (state_bytes, out_bytes) = (sizes[0], sizes[3]);
        gpu.scoped("running the delta rule", || {
            queue.write_buffer(&io.state, 0, f32_bytes(state));
            queue.write_buffer(&io.qkv, 0, f32_bytes(qkv));
            // exp as the CPU takes it (a driver's exp may differ in the last bits).
            let decays: Vec<f32> = g.iter().map(|g| g.exp()).collect();
            queue.write_buffer(&io.gb, 0, f32_bytes(&decays));
            queue.write_buffer(&io.gb, 4 * g.len() as u64, f32_bytes(beta));
            queue.write_buffer(&io.params, 0, &params);
            tally.activations(sizes[0] + sizes[1] + sizes[2] + params.len() as u64);
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("delta rule"),
                layout: &self.layout,
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: io.state.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: io.qkv.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 2, resource: io.gb.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 3, resource: io.out.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 4, resource: io.params.as_entire_binding() },
                ],
            });
            let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("delta rule") });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&self.pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(s.n_v_heads as u32, 1, 1);
            }
            // The outputs, then the advanced state.
            enc.copy_buffer_to_buffer(&io.out, 0, &io.readback, 0, out_bytes);
            enc.copy_buffer_to_buffer(&io.state, 0, &io.readback, out_bytes, state_bytes);
            queue.submit([enc.finish()]);
            tally.submitted(1);
        })?;
        let mut back = Vec::new();
        gpu.read_f32(&io.readback, out_bytes + state_bytes, &mut back)?;
        let (o, st) = back.split_at(out.len());
        out.copy_from_slice(o);
        state.copy_from_slice(st);
        Ok(())
    }

    /// Buffers of `[state, qkv, g and beta, out]` bytes (the readback holds
    /// out and state).
    fn make_io(&self, sizes: &[u64]) -> Io {
        let buffer = |label, size: u64, usage| self.gpu.buffer(label, size, usage);
        use wgpu::BufferUsages as U;
        self.gpu.tally().created(6);
        Io {
            state: buffer("delta state", sizes[0], U::STORAGE | U::COPY_DST | U::COPY_SRC),
            qkv: buffer("delta qkv", sizes[1], U::STORAGE | U::COPY_DST),
            gb: buffer("delta g beta", sizes[2], U::STORAGE | U::COPY_DST),
            out: buffer("delta out", sizes[3], U::STORAGE | U::COPY_SRC),
            readback: buffer("delta readback", sizes[3] + sizes[0], U::MAP_READ | U::COPY_DST),
            params: buffer("delta params", 32, U::UNIFORM | U::COPY_DST),
        }
    }
}
