//! The optional GPU backend: WGSL compute on wgpu (Vulkan on Android and
//! Linux, Metal on Apple).
//!
//! - [`Gpu`]: one headless device and its queue ([`Gpu::new`]); what the
//!   adapter is and can do ([`AdapterInfo`]), and which form of the kernels
//!   it runs ([`KernelVariant`]: `shader-f16` and subgroups where the
//!   adapter has them, else the portable form; [`GpuOptions::portable`], or
//!   `POCKET_GPU_KERNELS=portable` for a model, forces the latter).
//! - [`GpuCounters`]: what the device was asked to do (submissions,
//!   dispatches, buffers, bytes uploaded and read back), counted where it
//!   happens, for `pocket bench` and the tests.
//! - [`GpuMatrix`]: a weight matrix uploaded once, in its GGUF block format
//!   (the kernels read the file's bytes through `array<u32>`, nothing is
//!   repacked on the CPU), split over several bindings when it is larger than
//!   the device allows one binding to be; `matvec` and `matmul` against f32
//!   activations, accumulating in f32.
//! - [`GpuBatch`]: several matrices' products over chosen rows of shared
//!   activations (a MoE layer's routed experts over their tokens) in one
//!   submission and one readback.
//! - [`KvMirror`] and [`GpuAttention`]: an attention layer's KV cache kept
//!   on the device (written only the positions that changed) and causal
//!   attention over it (GQA, sliding windows, output gates; f16 or f32).
//! - [`Graph`]: a decoded token's whole forward pass recorded once over
//!   device buffers and replayed per token as one submission and one
//!   readback (per-row operations in `shaders/graph.wgsl`, the MoE router
//!   and the routed experts' ids on the device).
//! - [`GpuDeltaRule`] and [`GpuState`]: the gated delta rule of a Gated
//!   DeltaNet layer over a pass's tokens, on a recurrent state that stays
//!   on the device between calls (written and read back only on request).
//!
//! The CPU path is the reference: every format is tested against
//! dequantisation with [`crate::quant`] and an f32 dot product (`tests.rs`).
//!
//! Built without the cargo feature `gpu`, the same API is a stand-in whose
//! constructors answer [`Error::GpuUnavailable`](crate::Error::GpuUnavailable)
//! ("not built with the GPU backend"), so call sites carry no `cfg`.

mod counters;
mod info;

use crate::quant::GgmlType;

pub use counters::GpuCounters;
pub use info::{AdapterInfo, GpuLimits, KernelVariant};

#[cfg(feature = "gpu")]
mod attention;
#[cfg(feature = "gpu")]
mod batch;
#[cfg(feature = "gpu")]
mod context;
#[cfg(feature = "gpu")]
mod delta;
#[cfg(feature = "gpu")]
mod graph;
#[cfg(feature = "gpu")]
mod matrix;
#[cfg(feature = "gpu")]
mod shaders;
#[cfg(feature = "gpu")]
pub use attention::{GpuAttention, KvMirror};
#[cfg(feature = "gpu")]
pub use batch::{GpuBatch, RowsJob};
#[cfg(feature = "gpu")]
pub use context::Gpu;
#[cfg(feature = "gpu")]
pub use delta::{GpuDeltaRule, GpuState};
#[cfg(feature = "gpu")]
pub use graph::{norm_mode, Constant, Graph, GraphOps, Op, OpParams, Tensor};
#[cfg(feature = "gpu")]
pub use matrix::GpuMatrix;

#[cfg(not(feature = "gpu"))]
mod stand_in;
#[cfg(not(feature = "gpu"))]
pub use stand_in::{Gpu, GpuAttention, GpuBatch, GpuDeltaRule, GpuMatrix, GpuState, KvMirror, RowsJob};

#[cfg(all(test, feature = "gpu"))]
mod graph_tests;
#[cfg(all(test, feature = "gpu"))]
mod tests;

/// The formats the GPU computes with, in GGUF id order.
pub const FORMATS: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::BF16,
];

/// Whether products with `ty` weights read each activation block's sum
/// after its values (Q4_1 and Q5_1: the CPU multiplies each block's minimum
/// by Q8_1's `s`, the block's sum rounded to f16, so the device must too).
pub fn reads_block_sums(ty: GgmlType) -> bool {
    crate::kernels::ActFormat::for_weights(ty).is_some_and(|f| f.has_block_sums())
}

/// The f32 values a product with `ty` weights reads for `n` activations (a
/// whole number of blocks): `n`, or with [`reads_block_sums`] one more per
/// block of 32 ([`crate::kernels::QActs::device_values`]' layout).
pub fn act_len(ty: GgmlType, n: usize) -> usize {
    if reads_block_sums(ty) {
        n / 32 * 33
    } else {
        n
    }
}

/// `x` (rows of whole blocks) laid out as products with `ty` weights read
/// it: for Q4_1 and Q5_1, each block of 32 followed by its f32 sum (the
/// exact products of f32 activations; the model's products take the CPU's
/// rounded sums from [`crate::kernels::QActs::device_values`]).
pub fn with_block_sums(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    if !reads_block_sums(ty) {
        return x.to_vec();
    }
    x.chunks(32).flat_map(|b| b.iter().copied().chain([b.iter().sum::<f32>()])).collect()
}

/// The largest head the kernel takes (its query buffer in workgroup memory).
pub const MAX_HEAD_DIM: usize = 512;

/// One attention call: the layer's shape and the pass's positions.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    /// Values per token in the queries, and from one head's query to the
    /// next (`head_dim`, or twice that when each head carries its gate).
    pub q_rows: usize,
    pub q_stride: usize,
    /// Multiply each head's output by sigmoid of its gate.
    pub gated: bool,
    pub scale: f32,
    /// Attend only to the last `window` positions (the token's own included).
    pub window: Option<usize>,
    /// Position of the first token, and tokens.
    pub pos0: usize,
    pub n: usize,
}

/// The largest key head the delta-rule kernel takes (its q and k in
/// workgroup memory).
pub const MAX_D_K: usize = 512;

/// One delta-rule call: the layer's shape and the pass's tokens.
#[derive(Clone, Copy, Debug)]
pub struct DeltaShape {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub n: usize,
}

/// Whether this build has the GPU backend (the cargo feature `gpu`).
pub const BUILT: bool = cfg!(feature = "gpu");

/// How to open the device.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Use at most this many bytes per storage binding, below the device's
    /// own limit (tests force the split of large matrices with it); `None`:
    /// the device's limit.
    pub max_binding_bytes: Option<u64>,
    /// Use at most this many workgroups per dispatch dimension, below the
    /// device's limit (tests force the two-dimensional row grid and the
    /// token batches with it); `None`: the device's limit.
    pub max_workgroups_per_dimension: Option<u32>,
    /// Use no `shader-f16` even where the adapter offers it (the portable
    /// f16 conversions; see [`KernelVariant`]).
    pub no_f16: bool,
    /// Use no subgroup operations even where the adapter offers them (the
    /// workgroup-memory reductions; see [`KernelVariant`]).
    pub no_subgroups: bool,
    /// The cached positions one workgroup takes of a decoded token's
    /// attention before they are split over several per head (tests force
    /// the split with it); `None`: [`ATTENTION_CHUNK`].
    pub attention_chunk: Option<usize>,
}

/// Where a piece of weights goes: bytes handed over in order.
pub type PutBytes<'a> = &'a mut dyn FnMut(&[u8]);

/// `read(offset, len, put)`: a matrix's bytes `offset..offset + len`
/// handed to `put` in order ([`GpuMatrix::upload_with`]).
pub type ReadBytes<'a> = &'a mut dyn FnMut(usize, usize, PutBytes<'_>) -> crate::Result<()>;

/// The cached positions per workgroup above which a decoded token's
/// attention is split over several workgroups per head (at most
/// [`MAX_ATTENTION_CHUNKS`]), sized by the positions a layer can see.
pub const ATTENTION_CHUNK: usize = 256;

/// The most workgroups per head of a decoded token's split attention.
pub const MAX_ATTENTION_CHUNKS: usize = 64;

/// The environment variable that forces a model's GPU kernels to the
/// portable form: `POCKET_GPU_KERNELS=portable` (as `POCKET_ISA` forces a
/// lower instruction set on the CPU); any other value, or none, lets the
/// adapter decide.
pub const KERNELS_ENV: &str = "POCKET_GPU_KERNELS";

impl GpuOptions {
    /// The portable kernels whatever the adapter offers: what an adapter
    /// without `shader-f16` or subgroups runs, on this one.
    pub fn portable() -> GpuOptions {
        GpuOptions { no_f16: true, no_subgroups: true, ..Default::default() }
    }

    /// The options a model's device is opened with (and `pocket gpu-info`
    /// describes): the defaults, or [`portable`](Self::portable) when
    /// [`KERNELS_ENV`] says `portable`.
    pub fn from_env() -> GpuOptions {
        match std::env::var(KERNELS_ENV) {
            Ok(v) if v == "portable" => GpuOptions::portable(),
            _ => GpuOptions::default(),
        }
    }
}
