//! Qwen3.5-MoE (`qwen35moe`): a hybrid of Gated DeltaNet (linear attention)
//! layers and gated full-attention layers (3:1), every layer followed by a
//! MoE FFN with softmax top-k routing plus a sigmoid-gated shared expert.
//!
//! Layer: h = x + Mixer(RMSNorm(x)); x' = h + MoE(RMSNorm(h)), where Mixer is
//! a DeltaNet or an attention layer whose query carries a per-head sigmoid
//! output gate, with QK-norm and partial rotary (a quarter of the head).

use super::blocks::attention::{Attention, AttnParams};
use super::blocks::deltanet::{DeltaNet, DeltaParams};
use super::blocks::moe::{Moe, MoeParams, Routing};
use super::blocks::norm::RmsNorm;
use super::hparams::Meta;
use super::mtp::{Mtp, MtpShape};
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
    /// Trunk layers (block_count minus any multi-token-prediction layers).
    n_layer: usize,
    /// Multi-token-prediction layers after the trunk (drafting uses the first).
    n_nextn: usize,
    n_ff_shexp: usize,
    moe: MoeParams,
    attn: AttnParams,
    delta: DeltaParams,
    /// Which layers are DeltaNet (the others are full attention).
    recurrent: Vec<bool>,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_blocks = m.nonzero(Key::BlockCount)?;
        // Multi-token-prediction blocks follow the trunk; generation does not run them.
        let n_nextn = m.usize_or(Key::NextnPredictLayers, 0)?;
        m.ensure(Key::NextnPredictLayers, n_nextn < n_blocks, "leaves no trunk layers")?;
        let n_layer = n_blocks - n_nextn;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?;
        // Full attention: head sizes are given, keys and values alike.
        let head_dim = m.nonzero(Key::KeyLength)?;
        m.ensure(Key::ValueLength, m.usize_or(Key::ValueLength, head_dim)? == head_dim, "must equal key_length")?;
        let attn = AttnParams::read(m, 10_000_000.0, true, eps)?;
        // Multimodal RoPE sections: for text every section sees the same
        // position, which makes the rotation an ordinary NeoX one over n_rot dims.
        if let Some(sections) = m.ints(Key::RopeDimensionSections)? {
            let total: i64 = sections.iter().sum();
            m.ensure(
                Key::RopeDimensionSections,
                sections.iter().all(|&s| s >= 0) && total as usize <= attn.rope.n_rot / 2,
                "sections exceed the rotary dims",
            )?;
        }
        let n_expert = m.nonzero(Key::ExpertCount)?;
        let n_used = m.nonzero(Key::ExpertUsedCount)?;
        let n_ff_exp = m.nonzero(Key::ExpertFeedForwardLength)?;
        // Linear attention: ssm.group_count key heads, ssm.time_step_rank value heads,
        // ssm.state_size per key head, ssm.inner_size = all value dims.
        let n_k_heads = m.nonzero(Key::SsmGroupCount)?;
        let n_v_heads = m.nonzero(Key::SsmTimeStepRank)?;
        let d_k = m.nonzero(Key::SsmStateSize)?;
        let d_inner = m.nonzero(Key::SsmInnerSize)?;
        m.ensure(Key::SsmTimeStepRank, n_v_heads % n_k_heads == 0, "value heads must be a multiple of key heads")?;
        m.ensure(Key::SsmInnerSize, d_inner % n_v_heads == 0, "must split evenly over value heads")?;
        let d_conv = m.nonzero(Key::SsmConvKernel)?;
        m.ensure(Key::SsmConvKernel, (2..=16).contains(&d_conv), "must be 2..16")?;
        let recurrent = match m.bools(Key::RecurrentLayers)? {
            Some(r) => {
                m.ensure(Key::RecurrentLayers, r.len() >= n_layer, "shorter than the trunk")?;
                r[..n_layer].to_vec()
            }
            None => {
                let every = m.nonzero(Key::FullAttentionInterval).unwrap_or(4);
                (0..n_layer).map(|il| (il + 1) % every != 0).collect()
            }
        };
        Ok(Hparams {
            n_embd: m.nonzero(Key::EmbeddingLength)?,
            n_layer,
            n_nextn,
            n_ff_shexp: m.usize_or(Key::ExpertSharedFeedForwardLength, n_ff_exp)?,
            moe: MoeParams::read(m, n_expert, n_used, n_ff_exp)?,
            attn,
            delta: DeltaParams { n_k_heads, n_v_heads, d_k, d_v: d_inner / n_v_heads, d_conv, eps },
            recurrent,
            eps,
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Mixer {
    /// q|k|v [2*d_k*Hk + d_v*Hv, n_embd], z [d_v*Hv, n_embd], beta/alpha [Hv, n_embd], out [n_embd, d_v*Hv]
    Delta(DeltaNet),
    /// q+gate [2*n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd], q/k norm [hd]
    Attention(Attention),
}

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    mixer: Mixer,
    post_norm: RmsNorm, // [n_embd] (the pre-FFN norm)
    moe: Moe,           // router [n_expert, n_embd]; experts [n_expert][n_ff, n_embd] / [n_embd, n_ff]; shared expert
}

pub struct Qwen35Moe {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
    /// The first multi-token-prediction layer, or why it could not be loaded
    /// (generation runs without it; only MTP drafting needs it).
    mtp: std::result::Result<Option<Mtp>, String>,
}

impl Qwen35Moe {
    pub fn load(file: &GgufFile) -> Result<Qwen35Moe> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Qwen35Moe.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let mixer = if hp.recurrent[il] {
                Mixer::Delta(DeltaNet::load(&ld, il, e, hp.delta)?)
            } else {
                Mixer::Attention(Attention::load(&ld, il, e, hp.attn.clone(), true)?)
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                mixer,
                post_norm: RmsNorm::load(&ld, TensorKind::AttnPostNorm, il, e, eps)?,
                moe: Moe::load(&ld, il, e, hp.moe)?.with_shared_expert(&ld, il, e, hp.n_ff_shexp)?,
            });
        }
        let trunk = Trunk::load(&ld, e, eps)?;
        let mtp = match hp.n_nextn {
            0 => Ok(None),
            _ => {
                let shape = MtpShape {
                    n_embd: e,
                    n_vocab: trunk.n_vocab,
                    attn: hp.attn.clone(),
                    moe: hp.moe,
                    n_ff_shexp: hp.n_ff_shexp,
                    eps,
                };
                Mtp::load(&ld, hp.n_layer, shape).map(Some).map_err(|err| {
                    log::warn!("qwen35moe: the multi-token-prediction layer is not usable: {err}");
                    err.to_string()
                })
            }
        };
        Ok(Qwen35Moe { trunk, hp, layers, mtp })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Qwen35Moe {
    fn arch(&self) -> Arch {
        Arch::Qwen35Moe
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

    fn mtp(&self) -> Result<Option<&Mtp>> {
        match &self.mtp {
            Ok(m) => Ok(m.as_ref()),
            Err(why) => Err(Error::InvalidArgument(format!("the multi-token-prediction layer: {why}"))),
        }
    }

    #[cfg(feature = "gpu")]
    fn record(&self, r: &mut dyn super::record::Record) -> Result<()> {
        let (x, xn, out) = r.rows();
        for (il, layer) in self.layers.iter().enumerate() {
            r.norm(&layer.attn_norm, x, xn)?;
            match &layer.mixer {
                Mixer::Delta(d) => r.deltanet(il, d, xn, out)?,
                Mixer::Attention(a) => r.attention(il, a, xn, out)?,
            }
            r.add(x, out)?;
            r.norm(&layer.post_norm, x, xn)?;
            r.moe(&layer.moe, xn, out)?;
            r.add(x, out)?;
        }
        Ok(())
    }

    fn layer_kinds(&self) -> Vec<LayerKind<'_>> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Delta(d) => LayerKind::Recurrent(&d.p),
                Mixer::Attention(a) => LayerKind::Attention(&a.p),
            })
            .collect()
    }

    fn layers(
        &self,
        pass: &Pass,
        states: &mut [LayerState],
        s: &mut Scratch,
        mut trace: Option<&mut Vec<Routing>>,
    ) -> Result<()> {
        let Rows { x, xn, out, blocks: b } = s.rows(pass.n, self.hp.n_embd);
        for (layer, state) in self.layers.iter().zip(states) {
            // x += Mixer(RMSNorm(x))   (DeltaNet or gated attention)
            layer.attn_norm.forward(x, xn);
            match (&layer.mixer, state) {
                (Mixer::Delta(d), LayerState::Recurrent(st)) => d.forward(pass, st, &mut b.delta, xn, out)?,
                (Mixer::Attention(a), LayerState::Attention(cache)) => a.forward(pass, cache, &mut b.attn, xn, out),
                _ => return Err(foreign_state()),
            }
            ops::add(x, out);
            // x += MoE(RMSNorm(x)) with the gated shared expert
            layer.post_norm.forward(x, xn);
            layer.moe.forward(pass, &mut b.moe, xn, out, trace.as_deref_mut())?;
            ops::add(x, out);
        }
        Ok(())
    }
}
