//! The Llama family: `llama` (and Mixtral), `qwen2`, `qwen3`, `qwen3moe`.
//! A pre-norm transformer with GQA and RoPE whose FFN is dense SwiGLU or,
//! where the layer has stacked experts, a routed MoE (softmax top-k). Qwen2
//! adds q/k/v biases and Qwen3 QK-norm (both found by their tensors); the
//! Qwen family rotates NeoX halves, Llama adjacent pairs.
//!
//! Layer: h = x + Attention(RMSNorm(x)); x' = h + FFN(RMSNorm(h)).

use super::blocks::attention::{Attention, AttnParams};
use super::blocks::ffn::{Act, Dense};
use super::blocks::moe::{Moe, MoeParams, Routing};
use super::blocks::norm::RmsNorm;
use super::hparams::Meta;
use super::network::{foreign_state, Network};
use super::pass::Pass;
use super::state::{LayerKind, LayerState, Rows, Scratch};
use super::trunk::Trunk;
use super::weights::{Experts, Loader};
use crate::error::Result;
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    arch: Arch,
    n_embd: usize,
    n_layer: usize,
    /// Hidden size of a dense FFN (0 in an all-MoE model).
    n_ff: usize,
    /// Routing of MoE layers, when the model has experts.
    moe: Option<MoeParams>,
    attn: AttnParams,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta, arch: Arch) -> Result<Hparams> {
        // qwen3moe files rely on a smaller default epsilon than Llama's.
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, if arch == Arch::Qwen3Moe { 1e-6 } else { 1e-5 })?;
        let n_ff = m.usize_or(Key::FeedForwardLength, 0)?;
        let n_expert =
            if arch == Arch::Qwen3Moe { m.nonzero(Key::ExpertCount)? } else { m.usize_or(Key::ExpertCount, 0)? };
        let moe = match n_expert {
            0 => None,
            _ => {
                let n_used = m.nonzero(Key::ExpertUsedCount)?;
                // Mixtral gives the experts' size as feed_forward_length; Qwen3-MoE its own key.
                let n_ff_exp = m.usize_or(Key::ExpertFeedForwardLength, n_ff)?;
                Some(MoeParams::read(m, n_expert, n_used, n_ff_exp)?)
            }
        };
        Ok(Hparams {
            arch,
            n_embd: m.nonzero(Key::EmbeddingLength)?,
            n_layer: m.nonzero(Key::BlockCount)?,
            n_ff,
            moe,
            // Llama rotates adjacent pairs; the Qwen family NeoX halves.
            attn: AttnParams::read(m, 10_000.0, arch != Arch::Llama, eps)?,
            eps,
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Ffn {
    Dense(Dense),  // gate/up [n_ff, n_embd], down [n_embd, n_ff]
    Moe(Box<Moe>), // router [n_expert, n_embd]; experts [n_expert][n_ff, n_embd] / [n_embd, n_ff]
}

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    attn: Attention,    // q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd]
    ffn_norm: RmsNorm,  // [n_embd]
    ffn: Ffn,
}

pub struct Llama {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl Llama {
    pub fn load(file: &GgufFile, arch: Arch) -> Result<Llama> {
        let ld = Loader::new(file);
        let m = Meta::new(file, arch.name());
        let hp = Hparams::read(&m, arch)?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let ffn = match hp.moe {
                Some(p) if ld.has(TensorKind::FfnGateExps, il) => Ffn::Moe(Box::new(Moe::load(&ld, il, e, p)?)),
                None if ld.has(TensorKind::FfnGateExps, il) => {
                    return Err(m.bad(Key::ExpertCount, "stacked experts need expert_count"));
                }
                _ => {
                    m.ensure(Key::FeedForwardLength, hp.n_ff > 0, "must be positive")?;
                    Ffn::Dense(Dense::load(&ld, il, e, hp.n_ff, Act::Silu)?)
                }
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn: Attention::load(&ld, il, e, hp.attn.clone(), false)?,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                ffn,
            });
        }
        Ok(Llama { trunk: Trunk::load(&ld, e, eps)?, hp, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Llama {
    fn arch(&self) -> Arch {
        self.hp.arch
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

    #[cfg(feature = "gpu")]
    fn record(&self, r: &mut dyn super::record::Record) -> Result<()> {
        let (x, xn, out) = r.rows();
        for (il, layer) in self.layers.iter().enumerate() {
            r.norm(&layer.attn_norm, x, xn)?;
            r.attention(il, &layer.attn, xn, out)?;
            r.add(x, out)?;
            r.norm(&layer.ffn_norm, x, xn)?;
            match &layer.ffn {
                Ffn::Dense(d) => r.dense(d, xn, out)?,
                Ffn::Moe(moe) => r.moe(moe, xn, out)?,
            }
            r.add(x, out)?;
        }
        Ok(())
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
            let LayerState::Attention(cache) = state else { return Err(foreign_state()) };
            // x += Attention(RMSNorm(x))
            layer.attn_norm.forward(x, xn);
            layer.attn.forward(pass, cache, &mut b.attn, xn, out);
            ops::add(x, out);
            // x += FFN(RMSNorm(x)), dense SwiGLU or routed experts
            layer.ffn_norm.forward(x, xn);
            match &layer.ffn {
                Ffn::Dense(d) => d.forward(pass, &mut b.ffn, xn, out),
                Ffn::Moe(moe) => moe.forward(pass, &mut b.moe, xn, out, trace.as_deref_mut())?,
            }
            ops::add(x, out);
        }
        Ok(())
    }
}
