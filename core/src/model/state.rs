//! What one sequence carries between forward passes: per-layer state (KV
//! cache or recurrent state), the position, the last logits, checkpoints of
//! the recurrent layers, and the scratch its forward passes reuse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::blocks::attention::{AttnParams, AttnScratch};
use super::blocks::deltanet::{DeltaParams, DeltaScratch, DeltaState, SavedDelta};
use super::blocks::ffn::FfnScratch;
use super::blocks::gemma4::Gemma4Scratch;
use super::blocks::mamba2::{Mamba2Params, Mamba2Scratch};
use super::blocks::mla::{LatentCache, MlaParams, MlaScratch};
use super::blocks::moe::{MoeScratch, Routing};
use super::blocks::shortconv::{ShortConvParams, ShortConvScratch};
use super::cache::{KvCache, KvType};
use super::expert_cache::ExpertIo;
use super::scratch::take;
use crate::error::{Error, Result};
use crate::kernels::QActs;

/// What kind of state a layer keeps (an architecture lists its layers'
/// kinds; states are made from them in one place).
#[derive(Clone, Copy, Debug)]
pub enum LayerKind<'a> {
    Attention(&'a AttnParams),
    Recurrent(&'a DeltaParams),
    /// A Mamba2 layer: its conv window and scan state are a
    /// [`LayerState::Recurrent`] state's two buffers.
    Mamba2(&'a Mamba2Params),
    /// A short convolution (LFM2): a recurrent state of its window only.
    ShortConv(&'a ShortConvParams),
    /// An attention layer that reads the KV cache of the earlier layer
    /// `source` and keeps no state of its own (Gemma 4's shared KV).
    Shared {
        source: usize,
    },
    /// Multi-head Latent Attention: one compressed latent and one rotary
    /// key per position, shared by every head.
    Latent(&'a MlaParams),
}

impl LayerKind<'_> {
    /// A fresh state for `n_ctx` positions.
    pub fn new_state(self, n_ctx: usize, kv: KvType) -> Result<LayerState> {
        Ok(match self {
            LayerKind::Attention(p) => LayerState::Attention(p.new_cache(kv, n_ctx)?),
            LayerKind::Recurrent(p) => LayerState::Recurrent(DeltaState::new(p)),
            LayerKind::Mamba2(p) => LayerState::Recurrent(p.new_state()),
            LayerKind::ShortConv(p) => LayerState::Recurrent(p.new_state()),
            LayerKind::Shared { source } => LayerState::Shared { source },
            LayerKind::Latent(p) => LayerState::Latent(p.new_cache(kv, n_ctx)?),
        })
    }

    /// Bytes that state takes.
    pub fn state_bytes(self, n_ctx: usize, kv: KvType) -> usize {
        match self {
            LayerKind::Attention(p) => n_ctx * p.n_kv_head * (kv.bytes_for(p.head_dim) + kv.bytes_for(p.head_dim_v)),
            LayerKind::Recurrent(p) => p.state_floats() * 4,
            LayerKind::Mamba2(p) => {
                let (conv, ssm) = p.state_floats();
                (conv + ssm) * 4
            }
            LayerKind::ShortConv(p) => p.state_floats() * 4,
            LayerKind::Shared { .. } => 0,
            LayerKind::Latent(p) => n_ctx * p.width() * LatentCache::value_bytes(kv),
        }
    }
}

/// Per-layer sequence state.
pub enum LayerState {
    /// Keys and values of an attention layer.
    Attention(KvCache),
    /// Conv window and delta-rule state of a linear-attention layer (or
    /// conv window and scan state of a Mamba2 layer).
    /// Conv window and delta-rule state of a linear-attention layer (a
    /// short convolution's window, with an empty delta-rule state).
    Recurrent(DeltaState),
    /// Nothing: the layer attends over layer `source`'s cache.
    Shared { source: usize },
    /// The latents and rotary keys of an MLA layer.
    Latent(LatentCache),
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
    pub(crate) clock: u64,
    pub(crate) stamps: Vec<u64>,
    /// Its share of its model's [`Meters`] (states made by the model's
    /// `new_state`).
    pub(crate) meter: Option<Metered>,
    /// When set, every pass leaves here the final-normed hidden state of
    /// each of its tokens (`[n][n_embd]`): what a multi-token-prediction
    /// layer drafts from ([`State::keep_hidden`]).
    pub(crate) hidden: Option<Vec<f32>>,
}

/// The memory a model's states hold, summed over the live ones.
#[derive(Debug, Default)]
pub(crate) struct Meters {
    kv: AtomicU64,
    scratch: AtomicU64,
}

impl Meters {
    /// Bytes of KV caches and recurrent state, and of scratch (a forward
    /// pass's buffers and the last logits).
    pub fn read(&self) -> (u64, u64) {
        (self.kv.load(Ordering::Relaxed), self.scratch.load(Ordering::Relaxed))
    }
}

/// What one state has added to its model's meters.
#[derive(Debug)]
pub(crate) struct Metered {
    meters: Arc<Meters>,
    kv: u64,
    scratch: u64,
}

impl Metered {
    pub fn new(meters: Arc<Meters>) -> Metered {
        Metered { meters, kv: 0, scratch: 0 }
    }

    fn set(&mut self, kv: u64, scratch: u64) {
        let m = &self.meters;
        m.kv.fetch_add(kv.wrapping_sub(self.kv), Ordering::Relaxed);
        m.scratch.fetch_add(scratch.wrapping_sub(self.scratch), Ordering::Relaxed);
        (self.kv, self.scratch) = (kv, scratch);
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.set(0, 0);
    }
}

/// Buffers a forward pass reuses from token to token (no allocation per
/// token once they have grown to the batch size): the residual stream and
/// the trunk's two working rows, and each kind of block's own scratch.
#[derive(Default)]
pub struct Scratch {
    /// Residual stream `[n_tokens][n_embd]`.
    pub x: Vec<f32>,
    /// The normalised input of the current block.
    pub xn: Vec<f32>,
    /// The output of the current block before it joins the residual.
    pub out: Vec<f32>,
    /// The final rows quantised for the output head.
    pub head: QActs,
    pub blocks: BlockScratch,
}

/// Each kind of block's own scratch (one of each: layers run one at a time).
#[derive(Default)]
pub struct BlockScratch {
    pub attn: AttnScratch,
    pub delta: DeltaScratch,
    pub ffn: FfnScratch,
    pub moe: MoeScratch,
    pub gemma4: Gemma4Scratch,
    pub mla: MlaScratch,
    pub mamba2: Mamba2Scratch,
    pub shortconv: ShortConvScratch,
}

/// The trunk's rows for one pass: the residual stream, a block's input and
/// its output (`[n][n_embd]` each), and the blocks' scratch.
pub struct Rows<'a> {
    pub x: &'a mut [f32],
    pub xn: &'a mut [f32],
    pub out: &'a mut [f32],
    pub blocks: &'a mut BlockScratch,
}

impl Scratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::scratch::heap;
        let b = &self.blocks;
        heap(&self.x)
            + heap(&self.xn)
            + heap(&self.out)
            + self.head.heap_bytes()
            + b.attn.heap_bytes()
            + b.delta.heap_bytes()
            + b.ffn.heap_bytes()
            + b.moe.heap_bytes()
            + b.gemma4.heap_bytes()
            + b.mla.heap_bytes()
            + b.mamba2.heap_bytes()
            + b.shortconv.heap_bytes()
    }

    /// The rows for `n` tokens of `n_embd`.
    pub fn rows(&mut self, n: usize, n_embd: usize) -> Rows<'_> {
        Rows {
            x: take(&mut self.x, n * n_embd),
            xn: take(&mut self.xn, n * n_embd),
            out: take(&mut self.out, n * n_embd),
            blocks: &mut self.blocks,
        }
    }
}

/// A saved sequence position: the recurrent layers' state copied, the
/// attention layers' cache prefix referenced (it is append-only, so it stays
/// valid until a position before the checkpoint is rewritten).
#[derive(Clone, Debug)]
pub struct Checkpoint {
    n_past: usize,
    clock: u64,
    recurrent: Vec<(usize, SavedDelta)>,
}

impl Checkpoint {
    /// Tokens in the state when the checkpoint was taken.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Memory the checkpoint holds (recurrent state copies; the KV prefix is shared).
    pub fn bytes(&self) -> usize {
        self.recurrent.iter().map(|(_, s)| (s.conv.len() + s.ssm.len()) * 4).sum()
    }

    /// The state's clock when the checkpoint was taken.
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// The copied recurrent layers: (layer index, state), in layer order.
    pub(crate) fn recurrent(&self) -> &[(usize, SavedDelta)] {
        &self.recurrent
    }

    /// A checkpoint read back from a snapshot (the reader checked it against the state).
    pub(crate) fn from_parts(n_past: usize, clock: u64, recurrent: Vec<(usize, SavedDelta)>) -> Checkpoint {
        Checkpoint { n_past, clock, recurrent }
    }
}

impl State {
    /// A fresh state of `layers` for up to `n_ctx` positions.
    pub(crate) fn new(layers: Vec<LayerState>, n_ctx: usize) -> State {
        State {
            layers,
            n_past: 0,
            n_ctx,
            scratch: Scratch::default(),
            logits: Vec::new(),
            logit_rows: 0,
            trace: None,
            clock: 0,
            stamps: vec![0; n_ctx],
            meter: None,
            hidden: None,
        }
    }

    /// Keep the final-normed hidden state of every token of the next passes
    /// (or stop keeping it): [`hidden`](Self::hidden).
    pub fn keep_hidden(&mut self, on: bool) {
        if on != self.hidden.is_some() {
            self.hidden = on.then(Vec::new);
        }
    }

    /// The final-normed hidden state of each token of the last pass,
    /// `[n][n_embd]` (empty unless [`keep_hidden`](Self::keep_hidden)).
    pub fn hidden(&self) -> &[f32] {
        self.hidden.as_deref().unwrap_or(&[])
    }

    /// Bring its share of its model's meters up to date (after a pass: the
    /// KV cache and the scratch grow with what the passes need).
    pub(crate) fn measure(&mut self) {
        if self.meter.is_none() {
            return;
        }
        let kv = self.cache_bytes() as u64;
        let scratch = (self.scratch.heap_bytes()
            + self.logits.capacity() * std::mem::size_of::<f32>()
            + self.stamps.capacity() * std::mem::size_of::<u64>()) as u64;
        if let Some(m) = &mut self.meter {
            m.set(kv, scratch);
        }
    }

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

    /// Save the current position (see [`Checkpoint`]). Fails only when a
    /// recurrent state the GPU holds cannot be read back.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let recurrent = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| match l {
                LayerState::Recurrent(r) => Some(r.save().map(|s| (il, s))),
                LayerState::Attention(_) | LayerState::Shared { .. } | LayerState::Latent(_) => None,
            })
            .collect::<Result<_>>()?;
        Ok(Checkpoint { n_past: self.n_past, clock: self.clock, recurrent })
    }

    /// [`checkpoint`](Self::checkpoint) into `cp`, reusing the memory of
    /// its copies where it was taken of this state's layers: a checkpoint
    /// before every verify pass (speculative decoding) would otherwise
    /// allocate, and fault in, every recurrent state each time.
    pub fn checkpoint_into(&self, cp: &mut Checkpoint) -> Result<()> {
        let mut recurrent = self.layers.iter().enumerate().filter(|(_, l)| matches!(l, LayerState::Recurrent(_)));
        let same_layers = cp.recurrent.len() == recurrent.clone().count()
            && cp.recurrent.iter().all(|(il, _)| recurrent.any(|(j, _)| j == *il));
        if !same_layers {
            *cp = self.checkpoint()?;
            return Ok(());
        }
        for (il, saved) in &mut cp.recurrent {
            if let LayerState::Recurrent(r) = &self.layers[*il] {
                r.save_into(saved)?;
            }
        }
        cp.n_past = self.n_past;
        cp.clock = self.clock;
        Ok(())
    }

    /// Return to a checkpoint of this state. Fails when a position before it
    /// has been rewritten since (the cache prefix it refers to is gone).
    pub fn restore(&mut self, cp: &Checkpoint) -> Result<()> {
        if !self.holds(cp) {
            return Err(Error::InvalidArgument("checkpoint no longer matches this state".into()));
        }
        for (il, saved) in &cp.recurrent {
            if let LayerState::Recurrent(r) = &mut self.layers[*il] {
                r.load(saved)?;
            }
        }
        self.n_past = cp.n_past;
        self.logit_rows = 0;
        Ok(())
    }

    /// What the expert cache has served this sequence so far.
    pub fn expert_io(&self) -> ExpertIo {
        let b = &self.scratch.blocks;
        let mut io = b.moe.io;
        io += b.gemma4.io;
        io
    }

    /// Whether [`restore`](Self::restore) would accept `cp`: its layers are
    /// this state's recurrent layers and no position before it has been
    /// rewritten since it was taken.
    pub fn holds(&self, cp: &Checkpoint) -> bool {
        let stale = self.stamps.len() < cp.n_past || self.stamps[..cp.n_past].iter().any(|&s| s > cp.clock);
        let layers_match = cp.recurrent.iter().all(|(il, saved)| {
            matches!(self.layers.get(*il), Some(LayerState::Recurrent(r))
                if r.conv.len() == saved.conv.len() && r.ssm.len() == saved.ssm.len())
        });
        !stale && layers_match
    }

    /// Bytes held by caches.
    pub fn cache_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(c) => c.allocated_bytes(),
                LayerState::Recurrent(r) => r.bytes(),
                LayerState::Shared { .. } => 0,
                LayerState::Latent(c) => c.allocated_bytes(),
            })
            .sum()
    }
}
