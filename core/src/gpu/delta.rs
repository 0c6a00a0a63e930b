//! The gated delta rule of a Gated DeltaNet layer on the device
//! (`shaders/delta.wgsl`): one workgroup per value head, the pass's tokens
//! in order.
//!
//! The recurrent state stays on the device between calls ([`GpuState`]):
//! a call uploads the pass's inputs and reads back its outputs, one
//! submission and one readback; the state goes up only when the caller
//! writes it ([`GpuState::write`]: a new sequence, a restored checkpoint)
//! and comes back only when asked ([`GpuState::read`]).

use std::sync::Mutex;

use super::matrix::f32_bytes;
use super::{DeltaShape, Gpu, MAX_D_K};
use crate::{Error, Result};

/// One layer's recurrent state (`[n_v_heads][d_k][d_v]` f32) on the device.
pub struct GpuState {
    pub(super) gpu: Gpu,
    pub(super) values: wgpu::Buffer,
    pub(super) len: usize,
    /// Made on the first read.
    readback: Mutex<Option<wgpu::Buffer>>,
}

impl GpuState {
    /// A device buffer of `len` values, undefined until written.
    pub fn new(gpu: &Gpu, len: usize) -> Result<GpuState> {
        let bytes = (len as u64).checked_mul(4).filter(|&b| b > 0 && b <= gpu.max_binding_bytes());
        let Some(bytes) = bytes else {
            return Err(Error::InvalidArgument(format!("a delta-rule state of {len} values for the GPU")));
        };
        use wgpu::BufferUsages as U;
        let values = gpu.scoped("allocating a delta-rule state", || {
            gpu.buffer("delta state", bytes, U::STORAGE | U::COPY_DST | U::COPY_SRC)
        })?;
        gpu.tally().created(1);
        Ok(GpuState { gpu: gpu.clone(), values, len, readback: Mutex::default() })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Replace the device's values with `values` (counted as a state upload).
    pub fn write(&self, values: &[f32]) -> Result<()> {
        if values.len() != self.len {
            return Err(Error::InvalidArgument(format!("{} values for a state of {}", values.len(), self.len)));
        }
        let bytes = f32_bytes(values);
        self.gpu.scoped("writing a delta-rule state", || self.gpu.queue().write_buffer(&self.values, 0, bytes))?;
        self.gpu.tally().state_up(bytes.len() as u64);
        Ok(())
    }

    /// The device's values, after every submitted pass (one submission and
    /// one readback, counted as a state readback).
    pub fn read(&self, out: &mut [f32]) -> Result<()> {
        if out.len() != self.len {
            return Err(Error::InvalidArgument(format!("{} values for a state of {}", out.len(), self.len)));
        }
        let gpu = &self.gpu;
        let mut readback = self.readback.lock().map_err(|_| Error::Gpu("state readback poisoned".into()))?;
        let bytes = self.values.size();
        if readback.is_none() {
            use wgpu::BufferUsages as U;
            let made = gpu.scoped("allocating a state readback", || {
                gpu.buffer("delta state readback", bytes, U::MAP_READ | U::COPY_DST)
            })?;
            gpu.tally().created(1);
            *readback = Some(made);
        }
        let Some(readback) = readback.as_ref() else { unreachable!("made above") };
        gpu.scoped("reading a delta-rule state", || {
            let mut enc =
                gpu.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("state readback") });
            enc.copy_buffer_to_buffer(&self.values, 0, readback, 0, bytes);
            gpu.queue().submit([enc.finish()]);
            gpu.tally().submitted(0);
        })?;
        let mut got = Vec::new();
        gpu.read_f32(readback, bytes, &mut got)?;
        gpu.tally().state_read();
        out.copy_from_slice(&got);
        Ok(())
    }
}

/// Inputs, outputs and readback of the largest call so far.
struct Io {
    qkv: wgpu::Buffer,
    gb: wgpu::Buffer,
    out: wgpu::Buffer,
    readback: wgpu::Buffer,
    params: wgpu::Buffer,
}

/// The delta-rule kernel on one device.
pub struct GpuDeltaRule {
    pub(super) gpu: Gpu,
    pub(super) layout: wgpu::BindGroupLayout,
    pub(super) pipeline: wgpu::ComputePipeline,
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

    /// Advance `state` (`[n_v_heads][d_k][d_v]`, on this device) over
    /// `s.n` tokens of `qkv` (`[n][conv_dim]`: q | k | v, q and k
    /// normalised), log decays `g` and update strengths `beta`
    /// (`[n][n_v_heads]` each), writing each token's output
    /// (`[n][n_v_heads * d_v]`) into `out`. A shape the kernel or the device
    /// cannot take is [`Error::InvalidArgument`] (nothing runs, the state is
    /// untouched); after any other error the state may have advanced.
    pub fn run(
        &self,
        s: &DeltaShape,
        state: &GpuState,
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
            && state.len == s.n_v_heads * s.d_k * s.d_v
            && state.gpu.same_device(gpu)
            && qkv.len() == s.n * conv_dim
            && g.len() == s.n * s.n_v_heads
            && beta.len() == g.len()
            && out.len() == s.n * vd;
        if !fits {
            return Err(Error::InvalidArgument(format!("the delta rule of {s:?} over {} state values", state.len)));
        }
        let sizes = [4 * qkv.len(), 8 * g.len(), 4 * out.len()].map(|b| b as u64);
        let limit = gpu.max_binding_bytes();
        if sizes.iter().any(|&b| b > limit) {
            return Err(Error::InvalidArgument(format!(
                "the delta rule of {s:?} exceeds the GPU's {limit}-byte binding"
            )));
        }

        let mut io = self.io.lock().map_err(|_| Error::Gpu("delta-rule buffers poisoned".into()))?;
        let have = |io: &Io| [io.qkv.size(), io.gb.size(), io.out.size()];
        if !io.as_ref().is_some_and(|io| have(io).iter().zip(&sizes).all(|(h, s)| h >= s)) {
            let old = io.as_ref().map_or([0; 3], have);
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
        let out_bytes = sizes[2];
        gpu.scoped("running the delta rule", || {
            queue.write_buffer(&io.qkv, 0, f32_bytes(qkv));
            // exp as the CPU takes it (a driver's exp may differ in the last bits).
            let decays: Vec<f32> = g.iter().map(|g| g.exp()).collect();
            queue.write_buffer(&io.gb, 0, f32_bytes(&decays));
            queue.write_buffer(&io.gb, 4 * g.len() as u64, f32_bytes(beta));
            queue.write_buffer(&io.params, 0, &params);
            tally.activations(sizes[0] + sizes[1] + params.len() as u64);
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("delta rule"),
                layout: &self.layout,
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: state.values.as_entire_binding() },
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
            // The outputs only: the advanced state stays.
            enc.copy_buffer_to_buffer(&io.out, 0, &io.readback, 0, out_bytes);
            queue.submit([enc.finish()]);
            tally.submitted(1);
        })?;
        let mut back = Vec::new();
        gpu.read_f32(&io.readback, out_bytes, &mut back)?;
        let got =
            back.get(..out.len()).ok_or_else(|| Error::Gpu(format!("{} of {} outputs", back.len(), out.len())))?;
        out.copy_from_slice(got);
        Ok(())
    }

    /// Buffers of `[qkv, g and beta, out]` bytes (the readback as large as out).
    fn make_io(&self, sizes: &[u64]) -> Io {
        let buffer = |label, size: u64, usage| self.gpu.buffer(label, size, usage);
        use wgpu::BufferUsages as U;
        self.gpu.tally().created(5);
        Io {
            qkv: buffer("delta qkv", sizes[0], U::STORAGE | U::COPY_DST),
            gb: buffer("delta g beta", sizes[1], U::STORAGE | U::COPY_DST),
            out: buffer("delta out", sizes[2], U::STORAGE | U::COPY_SRC),
            readback: buffer("delta readback", sizes[2], U::MAP_READ | U::COPY_DST),
            params: buffer("delta params", 32, U::UNIFORM | U::COPY_DST),
        }
    }
}
