//! Granite 4.0-H (`granitehybrid`): a hybrid of Mamba2 layers and attention
//! layers without positional encoding, every layer followed by a MoE FFN
//! (softmax over the chosen experts) plus an ungated shared expert, or by
//! a dense FFN in the dense variants.
//!
//! Layer: h = x + r * Mixer(RMSNorm(x)); x' = h + r * FFN(RMSNorm(h)), with
//! Granite's multipliers: the residual scale r, embeddings times
//! `embedding_scale`, attention scores times `attention.scale`, and logits
//! divided by `logit_scale`. A layer is Mamba2 exactly where
//! `attention.head_count_kv` is 0 (as llama.cpp decides).

use super::blocks::attention::{Attention, AttnParams, Rope};
use super::blocks::ffn::{Act, Dense};
use super::blocks::mamba2::{Mamba2, Mamba2Params};
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

/// The FFN every layer has.
#[derive(Clone, Copy, Debug)]
enum FfnShape {
    /// Routed experts, and a shared expert of hidden size `n_ff_shexp` when not 0.
    Moe {
        moe: MoeParams,
        n_ff_shexp: usize,
    },
    Dense {
        n_ff: usize,
    },
}

struct Hparams {
    n_embd: usize,
    eps: f32,
    /// Per layer: its attention's shape, or `None` for a Mamba2 layer.
    attn: Vec<Option<AttnParams>>,
    /// The Mamba2 layers' shape (when there are some).
    mamba: Option<Mamba2Params>,
    ffn: FfnShape,
    /// Multiplies the embeddings (`None`: 1).
    embedding_scale: Option<f32>,
    /// Multiplies each block's output before it joins the residual.
    residual_scale: f32,
    /// Multiplies the logits: 1 / `logit_scale` (`None`: 1).
    logit_mul: Option<f32>,
}

/// A Granite multiplier: absent or 0 means off (llama.cpp's convention).
fn multiplier(m: &Meta, k: Key) -> Result<Option<f32>> {
    Ok(Some(m.f32_or(k, 0.0)?).filter(|&v| v != 0.0))
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-5)?;
        let n_head = m.per_layer(Key::HeadCount, n_layer, None)?;
        let n_kv = match m.per_layer(Key::HeadCountKv, n_layer, None) {
            Err(Error::MissingKey(_)) => n_head.clone(),
            other => other?,
        };
        // Attention without positions unless rope.scaling.finetuned says otherwise (default: RoPE on).
        let rope_on = m.bool_or(Key::RopeScalingFinetuned, true)?;
        let attn_scale = m.f32_or(Key::AttentionScale, 0.0)?;
        let mut attn = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let (h, kv) = (n_head[il], n_kv[il]);
            if kv == 0 {
                attn.push(None);
                continue;
            }
            m.ensure(Key::HeadCount, h > 0 && h % kv == 0, format!("layer {il}: {kv} KV heads for {h} heads"))?;
            let head_dim = m.usize_or(Key::KeyLength, n_embd / h)?;
            m.ensure(Key::KeyLength, head_dim > 0, "must be positive")?;
            m.ensure(Key::ValueLength, m.usize_or(Key::ValueLength, head_dim)? == head_dim, "must equal key_length")?;
            let rope = if rope_on {
                let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
                m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even, <= head dim")?;
                Rope { n_rot, base: m.f32_or(Key::RopeFreqBase, 10_000.0)?, scale: m.rope_freq_scale()?, neox: false }
            } else {
                Rope { n_rot: 0, base: 10_000.0, scale: 1.0, neox: false }
            };
            attn.push(Some(AttnParams {
                n_head: h,
                n_kv_head: kv,
                head_dim,
                head_dim_v: head_dim,
                rope,
                scale: if attn_scale == 0.0 { 1.0 / (head_dim as f32).sqrt() } else { attn_scale },
                window: None,
                eps,
            }));
        }
        let mamba = if attn.iter().any(Option::is_none) { Some(Mamba2Params::read(m, eps)?) } else { None };
        let n_expert = m.usize_or(Key::ExpertCount, 0)?;
        let ffn = if n_expert > 0 {
            let n_used = m.nonzero(Key::ExpertUsedCount)?;
            // The experts' hidden size is feed_forward_length (as llama.cpp reads it).
            let n_ff = match m.usize_or(Key::ExpertFeedForwardLength, 0)? {
                0 => m.nonzero(Key::FeedForwardLength)?,
                n => n,
            };
            let mut moe = MoeParams::read(m, n_expert, n_used, n_ff)?;
            // Softmax over all experts, the chosen ones' weights renormalised:
            // a softmax over the chosen logits (llama.cpp fixes both for Granite).
            (moe.gating, moe.norm_weights) = (Gating::Softmax, true);
            FfnShape::Moe { moe, n_ff_shexp: m.usize_or(Key::ExpertSharedFeedForwardLength, 0)? }
        } else {
            FfnShape::Dense { n_ff: m.nonzero(Key::FeedForwardLength)? }
        };
        let logit_mul = match multiplier(m, Key::LogitScale)? {
            Some(s) => {
                m.ensure(Key::LogitScale, (1.0 / s).is_finite(), "its inverse is not finite")?;
                Some(1.0 / s)
            }
            None => None,
        };
        Ok(Hparams {
            n_embd,
            eps,
            attn,
            mamba,
            ffn,
            embedding_scale: multiplier(m, Key::EmbeddingScale)?,
            residual_scale: multiplier(m, Key::ResidualScale)?.unwrap_or(1.0),
            logit_mul,
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Mixer {
    /// in [2*d_inner + 2*n_group*d_state + n_head, n_embd], conv [d_conv][conv_dim] + bias,
    /// dt_bias/A/D [n_head], norm [d_inner], out [n_embd, d_inner]
    Mamba(Mamba2),
    /// q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd]; no RoPE (NoPE)
    Attention(Attention),
}

enum Ffn {
    /// router [n_expert, n_embd]; experts [n_expert][n_ff, n_embd] / [n_embd, n_ff]; shared expert
    Moe(Box<Moe>),
    /// gate/up [n_ff, n_embd], down [n_embd, n_ff]
    Dense(Dense),
}

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    mixer: Mixer,
    ffn_norm: RmsNorm, // [n_embd]
    ffn: Ffn,
}

pub struct GraniteHybrid {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl GraniteHybrid {
    pub fn load(file: &GgufFile) -> Result<GraniteHybrid> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::GraniteHybrid.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.attn.len());
        for (il, attn) in hp.attn.iter().enumerate() {
            let mixer = match (attn, hp.mamba) {
                (Some(p), _) => Mixer::Attention(Attention::load(&ld, il, e, p.clone(), false)?),
                (None, Some(p)) => Mixer::Mamba(Mamba2::load(&ld, il, e, p)?),
                (None, None) => return Err(Error::MissingKey(Key::SsmInnerSize.for_arch(Arch::GraniteHybrid.name()))),
            };
            let ffn = match hp.ffn {
                FfnShape::Moe { moe, n_ff_shexp } => {
                    let mut block = Moe::load(&ld, il, e, moe)?;
                    if n_ff_shexp > 0 {
                        let up = TensorKind::FfnUpShexp.weight(il);
                        if !ld.has(TensorKind::FfnUpShexp, il) {
                            return Err(Error::MissingTensor(up));
                        }
                        block = block.with_shared_expert(&ld, il, e, n_ff_shexp)?;
                    }
                    Ffn::Moe(Box::new(block))
                }
                FfnShape::Dense { n_ff } => Ffn::Dense(Dense::load(&ld, il, e, n_ff, Act::Silu)?),
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                mixer,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                ffn,
            });
        }
        let mut trunk = Trunk::load(&ld, e, eps)?;
        trunk.embed_scale = hp.embedding_scale;
        trunk.logit_mul = hp.logit_mul;
        Ok(GraniteHybrid { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for GraniteHybrid {
    fn arch(&self) -> Arch {
        Arch::GraniteHybrid
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
        match self.hp.ffn {
            FfnShape::Moe { moe, .. } => moe.n_used,
            FfnShape::Dense { .. } => 0,
        }
    }

    fn layer_kinds(&self) -> Vec<LayerKind<'_>> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Mamba(m) => LayerKind::Mamba2(&m.p),
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
        let r = self.hp.residual_scale;
        let Rows { x, xn, out, blocks: b } = s.rows(pass.n, self.hp.n_embd);
        for (layer, state) in self.layers.iter().zip(states) {
            // x += r * Mixer(RMSNorm(x))   (Mamba2 or attention without positions)
            layer.attn_norm.forward(x, xn);
            match (&layer.mixer, state) {
                (Mixer::Mamba(m), LayerState::Recurrent(st)) if m.p.fits(st) => {
                    m.forward(pass, st, &mut b.mamba2, xn, out)?
                }
                (Mixer::Attention(a), LayerState::Attention(cache)) => a.forward(pass, cache, &mut b.attn, xn, out),
                _ => return Err(foreign_state()),
            }
            residual_add(x, out, r);
            // x += r * FFN(RMSNorm(x))   (routed experts plus the shared expert, or dense)
            layer.ffn_norm.forward(x, xn);
            match &layer.ffn {
                Ffn::Moe(m) => m.forward(pass, &mut b.moe, xn, out, trace.as_deref_mut())?,
                Ffn::Dense(d) => d.forward(pass, &mut b.ffn, xn, out),
            }
            residual_add(x, out, r);
        }
        Ok(())
    }
}

/// `x += r * out`.
fn residual_add(x: &mut [f32], out: &mut [f32], r: f32) {
    if r != 1.0 {
        ops::scale(out, r);
    }
    ops::add(x, out);
}
