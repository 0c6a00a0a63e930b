//! Several matrix products over chosen rows of shared activations, in one
//! submission: the routed experts of a MoE layer, each over the tokens sent
//! to it. The activations go up once per batch, however many products read
//! them, and the row lists with them; each product is one dispatch per
//! binding of its matrix (`main_rows` in `shaders/matvec.wgsl`), and all
//! outputs come back in one readback.

use std::num::NonZeroU64;
use std::sync::Mutex;

use super::matrix::{f32_bytes, GpuMatrix};
use super::Gpu;
use crate::{Error, Result};

/// One product of a batch: `matrix` times the rows `rows` of input `input`.
pub struct RowsJob<'a> {
    pub matrix: &'a GpuMatrix,
    pub input: usize,
    pub rows: &'a [usize],
    /// The rows of the matrix it computes (one expert of a stack uploaded
    /// whole), or all of them.
    pub w_rows: std::ops::Range<usize>,
}

/// The kernel's `Job` (16 bytes, at a multiple of the uniform alignment).
pub(super) const JOB_BYTES: u64 = 32;

/// The buffers of the largest batch so far: grown, never shrunk.
struct Io {
    x: wgpu::Buffer,
    idx: wgpu::Buffer,
    jobs: wgpu::Buffer,
    y: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// Batches of products over chosen rows on one device.
pub struct GpuBatch {
    gpu: Gpu,
    io: Mutex<Option<Io>>,
}

impl GpuBatch {
    pub fn new(gpu: &Gpu) -> GpuBatch {
        GpuBatch { gpu: gpu.clone(), io: Mutex::default() }
    }

    /// `out` = each job's `[rows.len()][matrix.rows()]` outputs, one job
    /// after the other; `inputs[i]` is `(x, cols)`, activations of `[n][cols]`
    /// as the products read them (`cols` is [`GpuMatrix::act_cols`] of the
    /// matrices that read it: for Q4_1 and Q5_1, each block's sum follows it).
    /// Buffers are made when a batch is larger than any before; later batches
    /// make none. A job that does not fit its input or the device is
    /// [`Error::InvalidArgument`] (nothing runs).
    pub fn run(&self, inputs: &[(&[f32], usize)], jobs: &[RowsJob<'_>], out: &mut Vec<f32>) -> Result<()> {
        let gpu = &self.gpu;
        let bad = |what: String| Err(Error::InvalidArgument(what));
        let mut x_base = Vec::with_capacity(inputs.len());
        let mut x_len = 0usize;
        for &(x, cols) in inputs {
            if cols == 0 || !x.len().is_multiple_of(cols) {
                return bad(format!("{} activations in rows of {cols}", x.len()));
            }
            x_base.push(x_len);
            x_len += x.len();
        }
        let mut idx = Vec::new();
        let mut y_len = 0usize;
        for job in jobs {
            let m = job.matrix;
            let Some(&(x, cols)) = inputs.get(job.input) else {
                return bad(format!("input {} of {}", job.input, inputs.len()));
            };
            if m.act_cols() != cols || !m.is_on(gpu) {
                return bad(format!(
                    "a {}x{} matrix (of this device: {}) times rows of {cols}",
                    m.rows(),
                    m.cols(),
                    m.is_on(gpu)
                ));
            }
            if job.rows.len() > gpu.max_groups() {
                return bad(format!("{} rows exceed the GPU's dispatch grid", job.rows.len()));
            }
            let w = &job.w_rows;
            if w.is_empty() || w.end > m.rows() || w.len().div_ceil(w.len().min(gpu.max_groups())) > gpu.max_groups() {
                return bad(format!("rows {w:?} of a {}-row matrix", m.rows()));
            }
            let n = x.len() / cols;
            if let Some(&r) = job.rows.iter().find(|&&r| r >= n) {
                return bad(format!("row {r} of {n}"));
            }
            idx.extend(job.rows.iter().map(|&r| r as u32));
            y_len += job.rows.len() * job.w_rows.len();
        }
        out.clear();
        if y_len == 0 {
            return Ok(());
        }
        let limit = gpu.max_binding_bytes() as usize;
        if 4 * x_len.max(idx.len()).max(y_len) > limit {
            return bad(format!(
                "a batch of {x_len} activations and {y_len} outputs exceeds the GPU's {limit}-byte binding"
            ));
        }
        let stride = gpu.uniform_align();
        let sizes = [4 * x_len as u64, 4 * idx.len() as u64, jobs.len() as u64 * stride, 4 * y_len as u64];

        let mut io = self.io.lock().map_err(|_| Error::Gpu("batch buffers poisoned".into()))?;
        let fits = |io: &Io| {
            let have = [io.x.size(), io.idx.size(), io.jobs.size(), io.y.size()];
            have.iter().zip(&sizes).all(|(h, s)| h >= s)
        };
        if !io.as_ref().is_some_and(fits) {
            let old = io.as_ref().map_or([0; 4], |io| [io.x.size(), io.idx.size(), io.jobs.size(), io.y.size()]);
            let want: Vec<u64> = sizes.iter().zip(old).map(|(&s, o)| s.max(o).max(16).next_multiple_of(16)).collect();
            *io = Some(gpu.scoped("allocating a batch", || self.make_io(&want))?);
        }
        let Some(io) = io.as_ref() else { unreachable!("made above") };

        let mut job_bytes = vec![0u8; (jobs.len() as u64 * stride) as usize];
        let (mut idx_base, mut y_base) = (0usize, 0usize);
        for (job, b) in jobs.iter().zip(job_bytes.chunks_exact_mut(stride as usize)) {
            let (w0, wn) = (job.w_rows.start, job.w_rows.len());
            let words = [x_base[job.input], idx_base, y_base, job.rows.len(), w0, wn, wn.min(gpu.max_groups()), 0];
            for (o, w) in b.chunks_exact_mut(4).zip(words) {
                o.copy_from_slice(&(w as u32).to_le_bytes());
            }
            idx_base += job.rows.len();
            y_base += job.rows.len() * wn;
        }
        let pipelines = jobs
            .iter()
            .map(|j| gpu.matvec_pipeline(j.matrix.ty(), super::context::MatvecEntry::Rows))
            .collect::<Result<Vec<_>>>()?;

        let (device, queue, tally) = (gpu.device(), gpu.queue(), gpu.tally());
        gpu.scoped("running a batch of products over chosen rows", || {
            for (&(x, _), &base) in inputs.iter().zip(&x_base) {
                if !x.is_empty() {
                    queue.write_buffer(&io.x, 4 * base as u64, f32_bytes(x));
                }
            }
            let idx_bytes: Vec<u8> = idx.iter().flat_map(|r| r.to_le_bytes()).collect();
            queue.write_buffer(&io.idx, 0, &idx_bytes);
            queue.write_buffer(&io.jobs, 0, &job_bytes);
            tally.activations(sizes[0] + sizes[1] + sizes[2]);

            let mut groups = Vec::new();
            for (j, job) in jobs.iter().enumerate().filter(|(_, job)| !job.rows.is_empty()) {
                let at = wgpu::BufferBinding {
                    buffer: &io.jobs,
                    offset: j as u64 * stride,
                    size: NonZeroU64::new(JOB_BYTES),
                };
                let wn = job.w_rows.len();
                let gx = wn.min(gpu.max_groups());
                let grid = (gx as u32, wn.div_ceil(gx) as u32);
                for (weights, params) in job.matrix.chunks_of(job.w_rows.clone()) {
                    let mut entries = gpu.matvec_entries(weights, &io.x, &io.y, params);
                    entries.extend([
                        wgpu::BindGroupEntry { binding: 4, resource: wgpu::BindingResource::Buffer(at.clone()) },
                        wgpu::BindGroupEntry { binding: 5, resource: io.idx.as_entire_binding() },
                    ]);
                    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("matvec rows"),
                        layout: gpu.rows_layout(),
                        entries: &entries,
                    });
                    groups.push((j, group, grid, job.rows.len() as u32));
                }
            }
            let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("matmul rows") });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                for (j, group, (gx, gy), tokens) in &groups {
                    pass.set_pipeline(&pipelines[*j]);
                    pass.set_bind_group(0, group, &[]);
                    pass.dispatch_workgroups(*gx, *gy, *tokens);
                }
            }
            enc.copy_buffer_to_buffer(&io.y, 0, &io.readback, 0, sizes[3]);
            queue.submit([enc.finish()]);
            tally.submitted(groups.len() as u64);
        })?;
        gpu.read_f32(&io.readback, sizes[3], out)
    }

    /// Buffers of `[x, idx, jobs, y]` bytes (the readback as large as y).
    fn make_io(&self, sizes: &[u64]) -> Io {
        let buffer = |label, size: u64, usage| self.gpu.buffer(label, size, usage);
        use wgpu::BufferUsages as U;
        self.gpu.tally().created(5);
        Io {
            x: buffer("batch x", sizes[0], U::STORAGE | U::COPY_DST),
            idx: buffer("batch rows", sizes[1], U::STORAGE | U::COPY_DST),
            jobs: buffer("batch jobs", sizes[2], U::UNIFORM | U::COPY_DST),
            y: buffer("batch y", sizes[3], U::STORAGE | U::COPY_SRC),
            readback: buffer("batch readback", sizes[3], U::MAP_READ | U::COPY_DST),
        }
    }
}
