//! A weight matrix on the GPU, in its GGUF block format, and its products
//! with f32 activations.
//!
//! The file's bytes are copied once into device buffers, untouched: the
//! kernels decode the blocks themselves. A matrix larger than one storage
//! binding may hold is split by whole rows over several buffers, one
//! dispatch each, all writing into the same output.

use std::sync::{Arc, Mutex};

use super::Gpu;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// The kernel's `Params` (`shaders/matvec.wgsl`), one per binding.
#[derive(Clone, Copy)]
struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    row0: u32,
    out_stride: u32,
    groups_x: u32,
}

impl Params {
    fn bytes(&self) -> [u8; 32] {
        let words = [self.rows, self.cols, self.row_bytes, self.row0, self.out_stride, self.groups_x, 0, 0];
        let mut b = [0u8; 32];
        for (o, w) in b.chunks_exact_mut(4).zip(words) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        b
    }
}

/// Consecutive whole rows of the matrix, in a buffer of their own.
struct Chunk {
    weights: wgpu::Buffer,
    params: wgpu::Buffer,
    /// The rows of the whole matrix it holds.
    rows: std::ops::Range<usize>,
    /// The dispatch grid: rows along x, then y (x is capped by the device).
    groups: (u32, u32),
}

/// The activation, output and readback buffers of the last batch size, with
/// the bind groups over them; rebuilt only when a larger batch arrives.
struct Io {
    /// Tokens per dispatch the buffers hold.
    tokens: usize,
    x: wgpu::Buffer,
    y: wgpu::Buffer,
    /// Rows of output the readback holds (`tokens` or more).
    readback_tokens: usize,
    readback: wgpu::Buffer,
    groups: Vec<wgpu::BindGroup>,
}

/// A weight matrix of `rows` rows of `cols` elements on the GPU.
pub struct GpuMatrix {
    gpu: Gpu,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    pipeline: Arc<wgpu::ComputePipeline>,
    chunks: Vec<Chunk>,
    io: Mutex<Option<Io>>,
}

impl GpuMatrix {
    /// Copy a matrix's file bytes (`rows` rows of `cols` elements of type
    /// `ty`, as a GGUF tensor stores them) to the device, once.
    pub fn upload(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<GpuMatrix> {
        Self::upload_with(gpu, ty, rows, cols, bytes.len(), &mut |off, len, put| {
            put(&bytes[off..off + len]);
            Ok(())
        })
    }

    /// As [`upload`](Self::upload), the matrix's `len` bytes (which must be
    /// its size) as `read(offset, n, put)` hands them to `put` in order
    /// (bytes `offset..offset + n`, in pieces), written straight into the
    /// device buffers' mapped memory: positional reads of the file need no
    /// other copy of the weights in memory (no mapped pages).
    pub fn upload_with(
        gpu: &Gpu,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        len: usize,
        read: super::ReadBytes<'_>,
    ) -> Result<GpuMatrix> {
        let pipeline = gpu.matvec_pipeline(ty, super::context::MatvecEntry::All)?;
        let row_bytes = ty
            .row_bytes(cols as u64)
            .filter(|_| rows > 0 && cols > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("a {rows}x{cols} matrix is not whole {ty} blocks")))?;
        if (len as u64) != (rows as u64).saturating_mul(row_bytes) {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes for a {rows}x{cols} {ty} matrix of {row_bytes}-byte rows"
            )));
        }
        let row_bytes = row_bytes as usize;
        let per_chunk = rows_per_binding(row_bytes, gpu.max_binding_bytes()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a {ty} row of {row_bytes} bytes exceeds the GPU's {}-byte binding",
                gpu.max_binding_bytes()
            ))
        })?;
        let max_groups = gpu.max_groups();
        let device = gpu.device();
        let mut chunks = Vec::new();
        for row0 in (0..rows).step_by(per_chunk) {
            let n = per_chunk.min(rows - row0);
            let (at, len) = (row0 * row_bytes, n * row_bytes);
            let gx = n.min(max_groups);
            let gy = n.div_ceil(gx);
            if gy > max_groups {
                return Err(Error::InvalidArgument(format!("{n} rows exceed the GPU's dispatch grid")));
            }
            let params = Params {
                rows: n as u32,
                cols: cols as u32,
                row_bytes: row_bytes as u32,
                row0: row0 as u32,
                out_stride: rows as u32,
                groups_x: gx as u32,
            };
            let (weights, params) = gpu.scoped("uploading weights", || -> Result<_> {
                let weights =
                    fill_buffer(device, "weights", wgpu::BufferUsages::STORAGE, len, &mut |put| read(at, len, put))?;
                Ok((weights, init_buffer(device, "params", wgpu::BufferUsages::UNIFORM, &params.bytes())?))
            })??;
            gpu.tally().created(2);
            gpu.tally().weights(weights.size() + params.size());
            chunks.push(Chunk { weights, params, rows: row0..row0 + n, groups: (gx as u32, gy as u32) });
        }
        Ok(GpuMatrix { gpu: gpu.clone(), ty, rows, cols, pipeline, chunks, io: Mutex::new(None) })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Values of x per token the kernels read ([`super::act_len`] of `cols`).
    pub fn act_cols(&self) -> usize {
        super::act_len(self.ty, self.cols)
    }

    /// Each binding's weights and parameters, and its dispatch grid (rows
    /// along x, then y), for products that record their own dispatches.
    pub(super) fn chunks(&self) -> impl Iterator<Item = (&wgpu::Buffer, &wgpu::Buffer, (u32, u32))> {
        self.chunks.iter().map(|c| (&c.weights, &c.params, c.groups))
    }

    /// The bindings that hold any of the matrix rows `rows`: weights and parameters.
    pub(super) fn chunks_of(
        &self,
        rows: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (&wgpu::Buffer, &wgpu::Buffer)> + '_ {
        let hit = move |c: &&Chunk| c.rows.start < rows.end && rows.start < c.rows.end;
        self.chunks.iter().filter(hit).map(|c| (&c.weights, &c.params))
    }

    /// Whether `other` has this matrix's format and shape, on the same
    /// device, split over bindings at the same rows: the gate and up
    /// matrices a fused product reads binding by binding.
    pub fn split_like(&self, other: &GpuMatrix) -> bool {
        self.gpu.same_device(&other.gpu)
            && (self.ty, self.rows, self.cols) == (other.ty, other.rows, other.cols)
            && self.chunks.iter().map(|c| &c.rows).eq(other.chunks.iter().map(|c| &c.rows))
    }

    /// Whether the matrix lives on `gpu`.
    pub(super) fn is_on(&self, gpu: &Gpu) -> bool {
        self.gpu.same_device(gpu)
    }

    /// How many storage bindings the matrix is split over.
    pub fn bindings(&self) -> usize {
        self.chunks.len()
    }

    /// `W · x` for one vector of `cols` values: `rows` values.
    pub fn matvec(&self, x: &[f32]) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.matmul(x, 1, &mut out)?;
        Ok(out)
    }

    /// `out[t] = W · x[t]` for `n` tokens (`x`: `[n][act_len(cols)]`, each
    /// token's values as [`super::act_len`] lays them out: for Q4_1 and Q5_1
    /// with each block's sum; `out`: `[n][rows]`).
    /// Buffers are made on the first call of a batch size larger than any
    /// before; later calls make none.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut Vec<f32>) -> Result<()> {
        let cols = self.act_cols();
        if n == 0 || x.len() != n * cols {
            return Err(Error::InvalidArgument(format!("{} activations for {n} tokens of {cols} values", x.len())));
        }
        let mut io = self.io.lock().map_err(|_| Error::Gpu("matrix buffers poisoned".into()))?;
        // Tokens per dispatch: x and y must each fit one binding, and the
        // token index is the grid's z.
        let limit = self.gpu.max_binding_bytes() as usize;
        let z_max = self.gpu.max_groups();
        let batch = n.min(limit / (4 * cols)).min(limit / (4 * self.rows)).min(z_max);
        if batch == 0 {
            return Err(Error::InvalidArgument(format!(
                "a {}x{} product does not fit the GPU's {limit}-byte binding",
                self.rows, self.cols
            )));
        }
        if io.as_ref().is_none_or(|io| io.tokens < batch || io.readback_tokens < n) {
            let tokens = batch.max(io.as_ref().map_or(0, |io| io.tokens));
            let readback_tokens = n.max(io.as_ref().map_or(0, |io| io.readback_tokens));
            *io = Some(self.gpu.scoped("allocating activations", || self.make_io(tokens, readback_tokens))?);
        }
        let Some(io) = io.as_ref() else { unreachable!("made above") };

        let (queue, device) = (self.gpu.queue(), self.gpu.device());
        let out_bytes = (self.rows * 4) as u64;
        let tally = self.gpu.tally();
        self.gpu.scoped("running a matrix product", || {
            for t0 in (0..n).step_by(batch) {
                let nt = batch.min(n - t0);
                // Ordered: a write lands before the next submission's commands.
                let input = f32_bytes(&x[t0 * cols..(t0 + nt) * cols]);
                queue.write_buffer(&io.x, 0, input);
                tally.activations(input.len() as u64);
                let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("matmul") });
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    pass.set_pipeline(&self.pipeline);
                    for (chunk, group) in self.chunks.iter().zip(&io.groups) {
                        pass.set_bind_group(0, group, &[]);
                        pass.dispatch_workgroups(chunk.groups.0, chunk.groups.1, nt as u32);
                    }
                }
                enc.copy_buffer_to_buffer(&io.y, 0, &io.readback, t0 as u64 * out_bytes, nt as u64 * out_bytes);
                queue.submit([enc.finish()]);
                tally.submitted(self.chunks.len() as u64);
            }
        })?;
        self.gpu.read_f32(&io.readback, n as u64 * out_bytes, out)
    }

    fn make_io(&self, tokens: usize, readback_tokens: usize) -> Io {
        let device = self.gpu.device();
        let buffer = |label, size: usize, usage| self.gpu.buffer(label, size as u64, usage);
        use wgpu::BufferUsages as U;
        let x = buffer("x", tokens * self.act_cols() * 4, U::STORAGE | U::COPY_DST);
        let y = buffer("y", tokens * self.rows * 4, U::STORAGE | U::COPY_SRC);
        let readback = buffer("readback", readback_tokens * self.rows * 4, U::MAP_READ | U::COPY_DST);
        self.gpu.tally().created(3);
        let groups = self
            .chunks
            .iter()
            .map(|c| {
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("matvec"),
                    layout: self.gpu.layout(),
                    entries: &self.gpu.matvec_entries(&c.weights, &x, &y, &c.params),
                })
            })
            .collect();
        Io { tokens, x, y, readback_tokens, readback, groups }
    }
}

/// Whole rows of `row_bytes` that fit one binding of `limit` bytes once
/// padded to a whole word; `None` when not even one does.
fn rows_per_binding(row_bytes: usize, limit: u64) -> Option<usize> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut rows = limit / row_bytes;
    while rows > 0 && (rows * row_bytes).next_multiple_of(4) > limit {
        rows -= 1;
    }
    (rows > 0).then_some(rows)
}

/// A buffer holding `data`, padded with zeros to a whole number of words.
fn init_buffer(device: &wgpu::Device, label: &str, usage: wgpu::BufferUsages, data: &[u8]) -> Result<wgpu::Buffer> {
    fill_buffer(device, label, usage, data.len(), &mut |put| {
        put(data);
        Ok(())
    })
}

/// A buffer of `len` bytes (padded to whole words with zeros) whose bytes
/// `fill` hands, in order, to the `put` it is given, which writes them
/// into the buffer's memory mapped at creation (write-only memory: it may
/// be write-combined). Fewer or more than `len` bytes are an error.
fn fill_buffer(
    device: &wgpu::Device,
    label: &str,
    usage: wgpu::BufferUsages,
    len: usize,
    fill: &mut dyn FnMut(super::PutBytes<'_>) -> Result<()>,
) -> Result<wgpu::Buffer> {
    let size = len.next_multiple_of(4).max(4);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size as u64,
        usage,
        mapped_at_creation: true,
    });
    let mut view = buffer
        .slice(..)
        .get_mapped_range_mut()
        .map_err(|e| Error::Gpu(format!("mapping a new {label} buffer: {e}")))?;
    let mut at = 0usize;
    let filled = fill(&mut |bytes| {
        let end = at + bytes.len();
        if end <= len {
            view.slice(at..end).copy_from_slice(bytes);
        }
        at = end;
    });
    view.slice(len..).copy_from_slice(&[0u8; 4][..size - len]);
    drop(view);
    buffer.unmap();
    filled?;
    if at != len {
        return Err(Error::InvalidArgument(format!("{at} bytes for a {len}-byte {label} buffer")));
    }
    Ok(buffer)
}

/// f32 values as their bytes (every target Pocket ships is little-endian).
pub(super) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte of it is initialised; u8 has
    // alignment 1; the length covers exactly the same memory.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

#[cfg(test)]
mod tests {
    use super::rows_per_binding;

    #[test]
    fn rows_per_binding_keeps_padded_chunks_inside_the_limit() {
        assert_eq!(rows_per_binding(144, 1 << 20), Some((1 << 20) / 144));
        // 7 rows of 134 bytes = 938, padded 940 > 939 (limit is kept whole-word by the device).
        assert_eq!(rows_per_binding(134, 940), Some(7));
        assert_eq!(rows_per_binding(134, 938), Some(6));
        assert_eq!(rows_per_binding(300, 256), None);
    }
}
