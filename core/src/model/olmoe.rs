//! OLMoE (`olmoe`, OLMoE-1B-7B): a pre-norm transformer whose q and k are
//! RMS-normalised over the whole projection (one norm of `n_head*hd`
//! values per token, not one per head) before NeoX RoPE, and whose every
//! FFN is a MoE: a softmax router's top-k experts weighed by their
//! probabilities as they are (not renormalised), SwiGLU experts, no shared
//! expert.
//!
//! Layer: h = x + Attention(RMSNorm(x)); x' = h + MoE(RMSNorm(h)).
//! As llama.cpp runs it: the experts' width is `feed_forward_length`, the
//! router is a softmax and the weights are neither renormalised nor scaled
//! whatever the file's MoE keys say (its graph fixes them).

use super::blocks::attention::{Attention, AttnParams, QkNorm};
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
    moe: MoeParams,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        // llama.cpp requires the epsilon (the converter writes 1e-5).
        let eps = match m.file.get_f32(&m.key(Key::LayerNormRmsEpsilon))? {
            Some(e) => e,
            None => return Err(Error::MissingKey(m.key(Key::LayerNormRmsEpsilon))),
        };
        m.ensure(Key::LayerNormRmsEpsilon, eps.is_finite() && eps > 0.0, "must be positive")?;

        // Attention: q and o are n_embd wide, every head rotated whole (NeoX halves).
        let attn = AttnParams::read(m, 10_000.0, true, eps)?;
        let hd = attn.head_dim;
        m.ensure(Key::HeadCount, attn.n_head * hd == n_embd, format!("{} heads of {hd} for {n_embd}", attn.n_head))?;
        m.ensure(Key::ValueLength, attn.head_dim_v == hd, "must equal key_length")?;
        m.ensure(Key::RopeDimensionCount, attn.rope.n_rot == hd, "must equal the head size")?;

        // Every layer a MoE of feed_forward_length-wide experts.
        let n_expert = m.nonzero(Key::ExpertCount)?;
        let n_used = m.nonzero(Key::ExpertUsedCount)?;
        let n_ff = m.nonzero(Key::FeedForwardLength)?;
        let mut moe = MoeParams::read(m, n_expert, n_used, n_ff)?;
        moe.gating = Gating::Softmax;
        moe.norm_weights = false;
        moe.weights_scale = 1.0;
        Ok(Hparams { n_embd, n_layer, attn, moe, eps })
    }
}

// ---- tensors -----------------------------------------------------------------------

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    /// q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd],
    /// q norm [n_head*hd], k norm [n_kv*hd]
    attn: Attention,
    ffn_norm: RmsNorm, // [n_embd]
    /// router [n_expert, n_embd]; experts [n_expert][n_ff, n_embd] / [n_embd, n_ff]
    moe: Moe,
}

pub struct Olmoe {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl Olmoe {
    pub fn load(file: &GgufFile) -> Result<Olmoe> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Olmoe.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let attn = Attention::load_with(&ld, il, e, hp.attn.clone(), false, QkNorm::Whole)?;
            // The q/k norms are part of the architecture.
            for (norm, kind) in [(&attn.q_norm, TensorKind::AttnQNorm), (&attn.k_norm, TensorKind::AttnKNorm)] {
                if norm.is_none() {
                    return Err(Error::MissingTensor(kind.weight(il)));
                }
            }
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                moe: Moe::load(&ld, il, e, hp.moe)?,
            });
        }
        // The output head is its own tensor (llama.cpp requires it).
        if !ld.has(TensorKind::Output, 0) {
            return Err(Error::MissingTensor(TensorKind::Output.weight(0)));
        }
        let trunk = Trunk::load(&ld, e, eps)?;
        Ok(Olmoe { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Olmoe {
    fn arch(&self) -> Arch {
        Arch::Olmoe
    }

    fn trunk(&self) -> &Trunk {
        &self.trunk
    }

    fn n_layer(&self) -> usize {
        self.layers.len()
    }

    fn experts(&self) -> Vec<(usize, &Experts)> {
        let moe = self.layers.iter().enumerate().map(|(il, l)| (il, &l.moe));
        moe.flat_map(|(il, m)| [(il, &m.gate), (il, &m.up), (il, &m.down)]).collect()
    }

    fn experts_used(&self) -> usize {
        self.hp.moe.n_used
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
            // x += Attention(RMSNorm(x))   (q, k normed whole, then RoPE)
            layer.attn_norm.forward(x, xn);
            layer.attn.forward(pass, cache, &mut b.attn, xn, out);
            ops::add(x, out);
            // x += MoE(RMSNorm(x))   (softmax top-k, weights as they are)
            layer.ffn_norm.forward(x, xn);
            layer.moe.forward(pass, &mut b.moe, xn, out, trace.as_deref_mut())?;
            ops::add(x, out);
        }
        Ok(())
    }
}
