//! Models: one file per architecture, built from shared blocks
//! (`attention`, `ffn` with the MoE block), over weights that stay in the
//! memory-mapped GGUF file.
//!
//! A [`Model`] is immutable and shared by any number of sequences; each
//! sequence owns a [`State`] (KV cache, recurrent state, scratch buffers).

mod attention;
mod cache;
mod deltanet;
mod ffn;
mod gemma3;
mod hparams;
mod llama;
mod qwen35moe;
mod qwen3moe;
mod scratch;
mod weights;

use std::path::Path;
use std::sync::Arc;

pub use cache::{KvCache, KvType, Logits};
pub use deltanet::DeltaState;
pub use ffn::Routing;

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Summary};
use crate::threads::ThreadPool;
use crate::tokenizer::Tokenizer;
use scratch::Scratch;

/// Per-layer sequence state.
pub enum LayerState {
    /// Keys and values of an attention layer.
    Attention(KvCache),
    /// Conv window and delta-rule state of a linear-attention layer.
    Recurrent(DeltaState),
}

/// Everything one sequence carries between forward passes.
pub struct State {
    pub(crate) layers: Vec<LayerState>,
    /// Tokens already in the state.
    pub(crate) n_past: usize,
    /// Positions the state can hold.
    pub(crate) n_ctx: usize,
    pub(crate) scratch: Scratch,
    /// `[rows][n_vocab]` logits of the last forward pass.
    pub(crate) logits: Vec<f32>,
    pub(crate) logit_rows: usize,
    /// When set, MoE routing decisions are recorded here.
    pub trace: Option<Vec<Routing>>,
    /// Forward passes so far; `stamps[pos]` is the pass that wrote `pos`.
    clock: u64,
    stamps: Vec<u64>,
}

/// A saved sequence position: the recurrent layers' state copied, the
/// attention layers' cache prefix referenced (it is append-only, so it stays
/// valid until a position before the checkpoint is rewritten).
#[derive(Clone, Debug)]
pub struct Checkpoint {
    n_past: usize,
    clock: u64,
    recurrent: Vec<(usize, DeltaState)>,
}

impl Checkpoint {
    /// Tokens in the state when the checkpoint was taken.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Memory the checkpoint holds (recurrent state copies; the KV prefix is shared).
    pub fn bytes(&self) -> usize {
        self.recurrent.iter().map(|(_, s)| s.bytes()).sum()
    }
}

impl State {
    /// Tokens evaluated so far.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Logits of the last forward pass: one row per requested position.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    pub fn logit_rows(&self) -> usize {
        self.logit_rows
    }

    /// Forget every token (the buffers are kept).
    pub fn clear(&mut self) {
        self.n_past = 0;
        self.logit_rows = 0;
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                r.clear();
            }
        }
    }

    /// Whether some layer carries recurrent state (which cannot be rewound
    /// without a checkpoint).
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Recurrent(_)))
    }

    /// Drop the tokens from position `n` on. O(1) for attention layers; a
    /// recurrent state can only be rewound through [`restore`](Self::restore).
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n >= self.n_past {
            return Ok(());
        }
        if n == 0 {
            self.clear();
            return Ok(());
        }
        if self.is_recurrent() {
            return Err(Error::InvalidArgument(
                "a recurrent state cannot be rewound; restore a checkpoint instead".into(),
            ));
        }
        self.n_past = n;
        Ok(())
    }

    /// Save the current position (see [`Checkpoint`]).
    pub fn checkpoint(&self) -> Checkpoint {
        let recurrent = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| match l {
                LayerState::Recurrent(r) => Some((il, r.clone())),
                LayerState::Attention(_) => None,
            })
            .collect();
        Checkpoint { n_past: self.n_past, clock: self.clock, recurrent }
    }

    /// Return to a checkpoint of this state. Fails when a position before it
    /// has been rewritten since (the cache prefix it refers to is gone).
    pub fn restore(&mut self, cp: &Checkpoint) -> Result<()> {
        let stale = self.stamps.len() < cp.n_past || self.stamps[..cp.n_past].iter().any(|&s| s > cp.clock);
        let layers_match =
            cp.recurrent.iter().all(|(il, _)| matches!(self.layers.get(*il), Some(LayerState::Recurrent(_))));
        if stale || !layers_match {
            return Err(Error::InvalidArgument("checkpoint no longer matches this state".into()));
        }
        for (il, saved) in &cp.recurrent {
            if let LayerState::Recurrent(r) = &mut self.layers[*il] {
                r.clone_from(saved);
            }
        }
        self.n_past = cp.n_past;
        self.logit_rows = 0;
        Ok(())
    }

    /// Bytes held by caches.
    pub fn cache_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(c) => c.allocated_bytes(),
                LayerState::Recurrent(r) => r.bytes(),
            })
            .sum()
    }
}

/// What an architecture implements.
pub trait Network: Send + Sync {
    fn arch(&self) -> Arch;
    fn n_vocab(&self) -> usize;
    /// Per-layer state for `n_ctx` positions.
    fn new_layers(&self, n_ctx: usize, kv: KvType) -> Result<Vec<LayerState>>;
    /// Evaluate `tokens` at positions `state.n_past..`, append them to the
    /// state and leave the requested logits in `state.logits`.
    fn forward(&self, file: &[u8], pool: &ThreadPool, state: &mut State, tokens: &[u32], want: Logits) -> Result<()>;
    /// The routed-expert tensors, with their layer.
    fn experts(&self) -> Vec<(usize, &weights::Experts)> {
        Vec::new()
    }
}

/// A loaded model: the mapped file, its network, tokenizer and chat template.
pub struct Model {
    file: Arc<GgufFile>,
    net: Box<dyn Network>,
    summary: Summary,
    tokenizer: Tokenizer,
    /// The file's template (ChatML when it has none), or why it does not compile.
    template: std::result::Result<ChatTemplate, String>,
}

impl Model {
    /// Map and validate a GGUF file and build its network (no weights are copied).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    pub fn from_gguf(file: GgufFile) -> Result<Model> {
        let summary = Summary::of(&file)?;
        let arch_name = file.architecture()?.ok_or_else(|| Error::MissingKey("general.architecture".into()))?;
        let arch = Arch::from_name(arch_name).ok_or_else(|| Error::UnsupportedArchitecture(arch_name.to_string()))?;
        let net: Box<dyn Network> = match arch {
            Arch::Gemma3 => Box::new(gemma3::Gemma3::load(&file)?),
            Arch::Qwen3Moe => Box::new(qwen3moe::Qwen3Moe::load(&file)?),
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => Box::new(llama::Llama::load(&file, arch)?),
            Arch::Qwen35Moe => Box::new(qwen35moe::Qwen35Moe::load(&file)?),
        };
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::for_model(&file, &tokenizer).map_err(|e| e.to_string());
        Ok(Model { file: Arc::new(file), net, summary, tokenizer, template })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template; an error when the file's template does not compile.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().map_err(|e| Error::Template { reason: e.clone() })
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    pub fn arch(&self) -> Arch {
        self.net.arch()
    }

    pub fn n_vocab(&self) -> usize {
        self.net.n_vocab()
    }

    /// For each routed-expert tensor: its layer and the file byte range of
    /// each expert's slab.
    pub fn expert_slabs(&self) -> Vec<(usize, Vec<std::ops::Range<usize>>)> {
        self.net.experts().into_iter().map(|(il, x)| (il, (0..x.n_expert).map(|e| x.slab_range(e)).collect())).collect()
    }

    /// A fresh state holding up to `n_ctx` positions.
    pub fn new_state(&self, n_ctx: usize, kv: KvType) -> Result<State> {
        if n_ctx == 0 {
            return Err(Error::InvalidArgument("context length must be positive".into()));
        }
        Ok(State {
            layers: self.net.new_layers(n_ctx, kv)?,
            n_past: 0,
            n_ctx,
            scratch: Scratch::default(),
            logits: Vec::new(),
            logit_rows: 0,
            trace: None,
            clock: 0,
            stamps: vec![0; n_ctx],
        })
    }

    /// Evaluate `tokens` after the state's current contents.
    pub fn forward(&self, pool: &ThreadPool, state: &mut State, tokens: &[u32], want: Logits) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        if state.n_past + tokens.len() > state.n_ctx {
            return Err(Error::ContextFull { n_ctx: state.n_ctx });
        }
        let n_vocab = self.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::InvalidArgument(format!("token id {bad} is outside the vocabulary of {n_vocab}")));
        }
        state.clock += 1;
        let (start, end) = (state.n_past, state.n_past + tokens.len());
        state.stamps[start..end].fill(state.clock);
        self.net.forward(self.file.source().bytes(), pool, state, tokens, want)?;
        state.n_past = end;
        Ok(())
    }
}

/// Shared tail of every network: final norm, LM head, optional soft-capping.
pub(crate) struct Head {
    pub norm: Vec<f32>,
    pub output: weights::Matrix,
    pub eps: f32,
    pub softcap: Option<f32>,
}

impl Head {
    /// Fill `state.logits` from the residual stream `s.x` (`[n][n_embd]`).
    pub fn forward(&self, file: &[u8], pool: &ThreadPool, state: &mut State, n: usize, want: Logits) {
        let n_embd = self.output.cols;
        let n_vocab = self.output.rows;
        let first = match want {
            Logits::All => 0,
            Logits::Last => n - 1,
            Logits::None => {
                state.logit_rows = 0;
                return;
            }
        };
        let rows = n - first;
        let s = &mut state.scratch;
        let xn = scratch::take(&mut s.xn, rows * n_embd);
        for (r, t) in (first..n).enumerate() {
            crate::kernels::ops::rms_norm(
                &mut xn[r * n_embd..(r + 1) * n_embd],
                &s.x[t * n_embd..(t + 1) * n_embd],
                Some(&self.norm),
                self.eps,
            );
        }
        let logits = scratch::take(&mut state.logits, rows * n_vocab);
        attention::project(pool, file, &self.output, &mut s.acts, &s.xn[..rows * n_embd], rows, logits);
        if let Some(cap) = self.softcap {
            logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        state.logit_rows = rows;
    }
}

/// Look up a token's embedding row for each token into `x`.
pub(crate) fn embed(file: &[u8], table: &weights::Matrix, tokens: &[u32], x: &mut [f32]) {
    let n_embd = table.cols;
    for (t, &tok) in tokens.iter().enumerate() {
        table.row_f32(file, tok as usize, &mut x[t * n_embd..(t + 1) * n_embd]);
    }
}

/// RMSNorm every `n_embd` row of `x` into `out`.
pub(crate) fn norm_rows(x: &[f32], out: &mut [f32], w: &[f32], eps: f32, n_embd: usize) {
    for (o, r) in out.chunks_exact_mut(n_embd).zip(x.chunks_exact(n_embd)) {
        crate::kernels::ops::rms_norm(o, r, Some(w), eps);
    }
}
