//! ERNIE-4.5-MoE (`ernie4_5-moe`, ERNIE-4.5-21B-A3B): a pre-norm GQA
//! transformer (RoPE on adjacent pairs, heads need not span the embedding)
//! whose first `leading_dense_block_count` layers end in a dense SwiGLU and
//! whose later layers, every `interleave_moe_layer_step`th, in a MoE: a
//! softmax router choosing its top-k by the probabilities plus a per-expert
//! selection bias, weighing them by the unbiased probabilities renormalised,
//! beside an ungated shared expert.
//!
//! Layer: h = x + Attention(RMSNorm(x)); x' = h + FFN(RMSNorm(h)), FFN =
//! dense, or routed experts + shared expert. As llama.cpp runs it: softmax,
//! renormalised, never scaled, whatever the file's MoE keys say.

use super::blocks::attention::{Attention, AttnParams};
use super::blocks::ffn::{Act, Dense};
use super::blocks::moe::{Gating, Moe, MoeParams, Routing};
use super::blocks::norm::RmsNorm;
use super::hparams::Meta;
use super::network::{foreign_state, Network};
use super::pass::Pass;
use super::state::{LayerKind, LayerState, Rows, Scratch};
use super::trunk::Trunk;
use super::weights::{Experts, Loader};
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    n_layer: usize,
    attn: AttnParams,
    /// Layers `..n_dense` are dense, and after them those whose number
    /// (from 1) is not a multiple of `moe_step`.
    n_dense: usize,
    moe_step: usize,
    /// Hidden size of the dense FFNs (0 when every layer is MoE).
    n_ff: usize,
    moe: Option<MoeParams>,
    /// Hidden size of the shared expert (0: none).
    n_ff_shexp: usize,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        // llama.cpp requires the epsilon.
        let eps = match m.file.get_f32(&m.key(Key::LayerNormRmsEpsilon))? {
            Some(e) => e,
            None => return Err(Error::MissingKey(m.key(Key::LayerNormRmsEpsilon))),
        };
        m.ensure(Key::LayerNormRmsEpsilon, eps.is_finite() && eps > 0.0, "must be positive")?;

        // Attention: adjacent pairs rotated, the whole head.
        let attn = AttnParams::read(m, 10_000.0, false, eps)?;
        m.ensure(Key::ValueLength, attn.head_dim_v == attn.head_dim, "must equal key_length")?;
        m.ensure(Key::RopeDimensionCount, attn.rope.n_rot == attn.head_dim, "must equal the head size")?;

        // FFNs: leading dense layers, then a MoE every `moe_step` layers.
        let n_dense = m.usize_or(Key::LeadingDenseBlockCount, 0)?;
        m.ensure(Key::LeadingDenseBlockCount, n_dense <= n_layer, format!("exceeds the {n_layer} layers"))?;
        let moe_step = m.nonzero(Key::InterleaveMoeLayerStep)?;
        let is_moe = |il: usize| il >= n_dense && (il + 1).is_multiple_of(moe_step);
        let n_ff = if (0..n_layer).all(is_moe) { 0 } else { m.nonzero(Key::FeedForwardLength)? };
        let (moe, n_ff_shexp) = if (0..n_layer).any(is_moe) {
            let n_expert = m.nonzero(Key::ExpertCount)?;
            let n_used = m.nonzero(Key::ExpertUsedCount)?;
            // One width for every layer's experts (llama.cpp takes the first of an array).
            let n_ff_exp = m.per_layer(Key::ExpertFeedForwardLength, n_layer, None)?[0];
            m.ensure(Key::ExpertFeedForwardLength, n_ff_exp > 0, "must be positive")?;
            let mut p = MoeParams::read(m, n_expert, n_used, n_ff_exp)?;
            p.gating = Gating::Softmax;
            p.norm_weights = true;
            p.weights_scale = 1.0;
            (Some(p), m.usize_or(Key::ExpertSharedFeedForwardLength, 0)?)
        } else {
            (None, 0)
        };
        Ok(Hparams { n_embd, n_layer, attn, n_dense, moe_step, n_ff, moe, n_ff_shexp, eps })
    }

    fn is_moe(&self, il: usize) -> bool {
        il >= self.n_dense && (il + 1).is_multiple_of(self.moe_step)
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Ffn {
    /// gate/up `[n_ff, n_embd]`, down `[n_embd, n_ff]`.
    Dense(Dense),
    /// router `[n_expert, n_embd]`, selection bias `[n_expert]`; experts
    /// `[n_expert][n_ff_exp, n_embd]` / `[n_embd, n_ff_exp]`; shared expert
    /// gate/up `[n_ff_shexp, n_embd]`, down `[n_embd, n_ff_shexp]`.
    Moe(Box<Moe>),
}

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    /// q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd]
    attn: Attention,
    /// The output projection's optional bias `[n_embd]`.
    o_bias: Option<Vec<f32>>,
    ffn_norm: RmsNorm, // [n_embd]
    ffn: Ffn,
}

pub struct Ernie45Moe {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl Ernie45Moe {
    pub fn load(file: &GgufFile) -> Result<Ernie45Moe> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Ernie45Moe.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let ffn = match hp.moe {
                Some(p) if hp.is_moe(il) => {
                    if hp.n_ff_shexp > 0 && !ld.has(TensorKind::FfnUpShexp, il) {
                        return Err(Error::MissingTensor(TensorKind::FfnUpShexp.weight(il)));
                    }
                    let moe = Moe::load(&ld, il, e, p)?.with_selection_bias(&ld, il, false)?;
                    let moe = if hp.n_ff_shexp > 0 { moe.with_shared_expert(&ld, il, e, hp.n_ff_shexp)? } else { moe };
                    Ffn::Moe(Box::new(moe))
                }
                _ => Ffn::Dense(Dense::load(&ld, il, e, hp.n_ff, Act::Silu)?),
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn: Attention::load(&ld, il, e, hp.attn.clone(), false)?,
                o_bias: ld.bias_opt(TensorKind::AttnOut, il, e)?,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                ffn,
            });
        }
        // The output head is tied to the embedding unless the file has its own.
        let trunk = Trunk::load(&ld, e, eps)?;
        Ok(Ernie45Moe { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Ernie45Moe {
    fn arch(&self) -> Arch {
        Arch::Ernie45Moe
    }

    fn trunk(&self) -> &Trunk {
        &self.trunk
    }

    fn n_layer(&self) -> usize {
        self.layers.len()
    }

    fn experts(&self) -> Vec<(usize, &Experts)> {
        let moe = self.layers.iter().enumerate().filter_map(|(il, l)| match &l.ffn {
            Ffn::Moe(m) => Some((il, m)),
            Ffn::Dense(_) => None,
        });
        moe.flat_map(|(il, m)| [(il, &m.gate), (il, &m.up), (il, &m.down)]).collect()
    }

    fn experts_used(&self) -> usize {
        self.hp.moe.map_or(0, |p| p.n_used)
    }

    fn layer_kinds(&self) -> Vec<LayerKind<'_>> {
        self.layers.iter().map(|l| LayerKind::Attention(&l.attn.p)).collect()
    }

    fn layers(
        &self,
        pass: &Pass,
        states: &mut [LayerState],
        s: &mut Scratch,
        mut trace: Option<&mut Vec<Routing>>,
    ) -> Result<()> {
        if states.len() != self.layers.len() {
            return Err(foreign_state());
        }
        let Rows { x, xn, out, blocks: b } = s.rows(pass.n, self.hp.n_embd);
        for (layer, state) in self.layers.iter().zip(states) {
            let LayerState::Attention(cache) = state else { return Err(foreign_state()) };
            // x += Attention(RMSNorm(x)) (+ o's bias)
            layer.attn_norm.forward(x, xn);
            layer.attn.forward(pass, cache, &mut b.attn, xn, out);
            if let Some(bias) = &layer.o_bias {
                out.chunks_exact_mut(self.hp.n_embd).for_each(|row| ops::add(row, bias));
            }
            ops::add(x, out);
            // x += FFN(RMSNorm(x))   (dense SwiGLU, or routed experts + shared expert)
            layer.ffn_norm.forward(x, xn);
            match &layer.ffn {
                Ffn::Dense(d) => d.forward(pass, &mut b.ffn, xn, out),
                Ffn::Moe(m) => m.forward(pass, &mut b.moe, xn, out, trace.as_deref_mut())?,
            }
            ops::add(x, out);
        }
        Ok(())
    }
}
