//! One forward pass's context, and the seam to the device that computes it.
//!
//! Every block is called the same way: `block.forward(&pass, state, scratch,
//! input, output)`, where `pass` says what is being evaluated (the mapped
//! file, the worker pool, the backend, the positions) and the block's own
//! weights are `self`. Blocks do their cheap per-row arithmetic (norms, RoPE,
//! activations) in place and hand every heavy operation — matrix products,
//! attention over the KV cache, the delta rule — to the [`Backend`].

use super::cache::KvCache;
use super::expert_cache::ExpertCache;
use super::params::{AttnParams, DeltaParams};
use super::ssm::Ssm;
use super::weights::{ExpertCopies, Experts, Matrix};
use crate::gguf::Source;
use crate::kernels::{MatJob, QActs, QMatrix};
use crate::threads::ThreadPool;
use crate::Result;

/// What one forward pass evaluates, and with what.
pub struct Pass<'a> {
    /// The mapped model file: weights are views into it.
    pub file: &'a [u8],
    pub pool: &'a ThreadPool,
    pub backend: &'a dyn Backend,
    /// The expert cache of a model under a memory budget; `None`: experts are
    /// read from the mapped file.
    pub experts: Option<&'a ExpertCache>,
    /// The mapping, when the weights are mapped (to advise the OS of the
    /// routed experts a layer is about to read).
    pub map: Option<&'a Source>,
    /// The routed experts' stacks interleaved in owned memory, when the
    /// model runs from its mapped file and made them.
    pub copies: Option<&'a ExpertCopies>,
    /// Position of the first token of the pass.
    pub pos0: usize,
    /// Tokens in the pass.
    pub n: usize,
    /// Sees every weight product's f32 input (the importance-matrix
    /// collector of `pocket imatrix`); `None` in normal use.
    pub observer: Option<&'a dyn Observer>,
}

impl<'a> Pass<'a> {
    /// Expert `e`'s slab of stack `x` in the interleaved copy, where the
    /// pass reads it there for `n` activation rows ([`from_copy`](Self::from_copy)).
    pub fn copied_slab(&self, x: &Experts, e: usize, n: usize) -> Option<QMatrix<'a>> {
        self.copies.filter(|_| self.takes_copy(x, n))?.slab(x, e)
    }
}

/// Watches what the weights of a pass are multiplied with: the f32 input
/// rows of every product, by the weight's GGUF tensor name. The importance
/// matrix of the quantiser is the per-column mean square of these.
pub trait Observer: Sync {
    /// `x` (`[..][cols]`) met matrix `mat` of the `n_mat` in tensor `name`
    /// (a stack of experts has one per expert; a plain matrix is `0` of `1`);
    /// with `rows`, only those rows of `x` did.
    fn input(&self, name: &str, mat: usize, n_mat: usize, cols: usize, x: &[f32], rows: Option<&[usize]>);
}

impl Pass<'_> {
    /// Whether a product of `n` activation rows over an expert of stack `x`
    /// reads its interleaved copy rather than the file: where the copy
    /// exists, for decoding, verify passes (one-row mode), rows that the
    /// file's layout would not put through the panels, and up to
    /// [`expert_x4_acts`](crate::kernels::expert_x4_acts) rows; more rows
    /// read the mapped file (the panels would lay the copy out again).
    pub fn from_copy(&self, x: &Experts, n: usize) -> bool {
        self.copies.is_some_and(|c| c.holds(x)) && self.takes_copy(x, n)
    }

    /// [`from_copy`](Self::from_copy)'s rule, whether or not the copy exists.
    fn takes_copy(&self, x: &Experts, n: usize) -> bool {
        self.pool.one_row()
            || n <= crate::kernels::expert_x4_acts(x.all.ty)
            || !crate::kernels::Kernels::selected().takes_panels(x.all.ty, x.rows, n)
    }

    /// `job.out = job.w · job.x` for every job, on the backend.
    pub fn matmul(&self, jobs: &mut [MatJob<'_>]) {
        self.backend.matmul(self.pool, jobs)
    }

    /// Tell the observer (if any) that the matrices `ws` meet the rows `x`.
    #[inline]
    pub fn observe(&self, ws: &[&Matrix], x: &[f32]) {
        if let Some(o) = self.observer {
            for w in ws {
                o.input(&w.name, 0, 1, w.cols, x, None);
            }
        }
    }

    /// Tell the observer (if any) that expert `e` of the stacks `ws` meets
    /// the rows `rows` of `x`.
    #[inline]
    pub fn observe_expert(&self, ws: &[&Experts], e: usize, x: &[f32], rows: &[usize]) {
        if let Some(o) = self.observer {
            for w in ws {
                o.input(&w.all.name, e, w.n_expert, w.all.cols, x, Some(rows));
            }
        }
    }

    /// `out = w · x` for the rows of `x` (`[rows][w.cols]`), quantised into `acts` first.
    pub fn project(&self, w: &Matrix, acts: &mut QActs, x: &[f32], out: &mut [f32]) {
        self.observe(&[w], x);
        acts.quantize(w.ty, x, x.len() / w.cols, w.cols);
        self.matmul(&mut [MatJob { w: w.view(self.file), x: acts, rows: None, out }]);
    }
}

/// Causal attention of a pass's queries over a KV cache whose keys and
/// values for positions `..pos0 + n` are stored.
pub struct Attend<'a> {
    pub p: &'a AttnParams,
    pub cache: &'a KvCache,
    /// `[n][q_rows]`: per head its query of `head_dim` (followed by its
    /// output gate of `head_dim` when `gated`).
    pub q: &'a [f32],
    pub q_rows: usize,
    /// Multiply each head's output by sigmoid of its gate.
    pub gated: bool,
    /// `[n_head]`: an extra logit per head in the softmax's denominator.
    pub sinks: Option<&'a [f32]>,
}

/// The gated delta rule of one DeltaNet layer over a pass's tokens.
pub struct DeltaRule<'a> {
    pub p: &'a DeltaParams,
    /// `[n][conv_dim]`: q | k | v after the conv, q and k L2-normalised.
    pub qkv: &'a [f32],
    /// `[n][n_v_heads]` log decays and update strengths.
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

/// A block with no device path: it runs on the host whatever the backend
/// (its matrix products aside), and a device backend counts its calls, so
/// that a report can say what fell back (`pocket bench --json`'s
/// `gpu_fallback`, `pocket gpu-info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostBlock {
    /// LFM2's gated short convolution.
    ShortConv,
    /// Mamba2's causal conv, selective scan and gated norm.
    Mamba2,
    /// Multi-head Latent Attention's scores and weighted latents.
    LatentAttention,
}

impl HostBlock {
    pub const ALL: [HostBlock; 3] = [HostBlock::ShortConv, HostBlock::Mamba2, HostBlock::LatentAttention];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            HostBlock::ShortConv => "short_conv",
            HostBlock::Mamba2 => "mamba2_scan",
            HostBlock::LatentAttention => "mla_attention",
        }
    }
}

// A block's counter is `ALL[block as usize]`'s.
const _: () = {
    let mut i = 0;
    while i < HostBlock::ALL.len() {
        assert!(HostBlock::ALL[i] as usize == i);
        i += 1;
    }
};

/// The operations a device implements for the blocks. The CPU kernels
/// ([`super::cpu::Cpu`]) are the reference; a second backend (the GPU) implements the
/// same operations and is tested against them, operation by operation.
pub trait Backend: Send + Sync {
    /// A short name for reports (`cpu`, `gpu`).
    fn name(&self) -> &'static str;

    /// `job.out = job.w · job.x` for every job; jobs share one split of the
    /// work over the pool.
    fn matmul(&self, pool: &ThreadPool, jobs: &mut [MatJob<'_>]);

    /// `out[t][h] = softmax(scale · q_th · K) · V` (`[n][n_head][head_dim_v]`),
    /// each token seeing positions up to its own (and its window); `scratch`
    /// is reused between calls.
    fn attend(&self, pass: &Pass, a: &Attend<'_>, out: &mut [f32], scratch: &mut Vec<f32>);

    /// Advance `state` (`[n_v_heads][d_k][d_v]`) over the pass's tokens,
    /// writing each token's output (`[n][value_dim]`) into `out`. A backend
    /// may leave the advanced state on its device ([`Ssm::advanced_on`]);
    /// one that needs the host's copy reads it back first, which is the
    /// only way this fails.
    fn delta_rule(
        &self,
        pass: &Pass,
        d: &DeltaRule<'_>,
        state: &mut Ssm,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<()>;

    /// `block` runs on the host in this pass (it has no device path): a
    /// device backend counts it, the CPU has nothing to note.
    fn on_host(&self, _block: HostBlock) {}
}
