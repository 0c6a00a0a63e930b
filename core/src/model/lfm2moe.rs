//! LFM2-MoE (`lfm2moe`, LFM2-8B-A1B): a hybrid of gated short-convolution
//! layers and GQA attention layers with per-head q/k norms; the first
//! `leading_dense_block_count` layers end in a dense SwiGLU, the others in
//! a MoE whose sigmoid router chooses experts with a per-expert bias and
//! weighs them by the unbiased scores, renormalised.
//!
//! Layer: h = x + Mixer(RMSNorm(x)); x' = h + FFN(RMSNorm(h)), where Mixer
//! is a short conv (`head_count_kv` 0) or attention. The final norm is
//! `token_embd_norm`; the output head is tied to the embedding unless the
//! file has `output.weight`.

use super::blocks::attention::{Attention, AttnParams, Rope};
use super::blocks::ffn::{Act, Dense};
use super::blocks::moe::{Gating, Moe, MoeParams, Routing};
use super::blocks::norm::RmsNorm;
use super::blocks::shortconv::{ShortConv, ShortConvParams};
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
    /// KV heads per layer; 0 marks a short-conv layer.
    n_kv: Vec<usize>,
    /// The attention layers' shape (their KV heads come from `n_kv`).
    attn: AttnParams,
    conv: ShortConvParams,
    /// Hidden size of the leading dense layers' FFN.
    n_ff: usize,
    /// Layers `0..n_dense` end in a dense FFN, the others in the MoE.
    n_dense: usize,
    moe: Option<MoeParams>,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-5)?;
        m.ensure(Key::LayerNormRmsEpsilon, eps > 0.0, "must be positive")?;

        // Attention layers: every one has the same heads; KV heads per layer, 0 = short conv.
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv = m.per_layer(Key::HeadCountKv, n_layer, None)?;
        for (il, &kv) in n_kv.iter().enumerate() {
            m.ensure(Key::HeadCountKv, kv == 0 || n_head % kv == 0, format!("layer {il}: {kv} must divide {n_head}"))?;
        }
        m.ensure(Key::HeadCount, n_embd % n_head == 0, "must divide embedding_length")?;
        let head_dim = m.usize_or(Key::KeyLength, n_embd / n_head)?;
        m.ensure(Key::KeyLength, head_dim > 0 && head_dim * n_head == n_embd, "heads must span embedding_length")?;
        m.ensure(Key::ValueLength, m.usize_or(Key::ValueLength, head_dim)? == head_dim, "must equal key_length")?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even and <= head dim")?;
        let rope =
            Rope { n_rot, base: m.f32_or(Key::RopeFreqBase, 1_000_000.0)?, scale: m.rope_freq_scale()?, neox: true };
        let attn = AttnParams {
            n_head,
            n_kv_head: 0,
            head_dim,
            head_dim_v: head_dim,
            rope,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            eps,
        };

        // Short convs: l_cache taps, so a window of l_cache - 1 inputs.
        let l_cache = m.nonzero(Key::ShortConvLCache)?;
        m.ensure(Key::ShortConvLCache, (2..=16).contains(&l_cache), "must be 2..16")?;

        // Dense layers first, then MoE layers.
        let n_dense = m.usize_or(Key::LeadingDenseBlockCount, 0)?;
        m.ensure(Key::LeadingDenseBlockCount, n_dense <= n_layer, format!("exceeds the {n_layer} layers"))?;
        let n_ff = if n_dense > 0 { m.nonzero(Key::FeedForwardLength)? } else { 0 };
        let moe = if n_dense < n_layer {
            let n_expert = m.nonzero(Key::ExpertCount)?;
            let n_used = m.nonzero(Key::ExpertUsedCount)?;
            let n_ff_exp = m.nonzero(Key::ExpertFeedForwardLength)?;
            let mut p = MoeParams::read(m, n_expert, n_used, n_ff_exp)?;
            // The router is a sigmoid unless the file says otherwise.
            p.gating = Gating::from_meta(m, Gating::Sigmoid)?;
            Some(p)
        } else {
            None
        };
        Ok(Hparams { n_embd, n_layer, n_kv, attn, conv: ShortConvParams { n_embd, l_cache }, n_ff, n_dense, moe, eps })
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Mixer {
    /// in_proj [3*n_embd, n_embd], conv [l_cache][n_embd], out_proj [n_embd, n_embd]
    Conv(ShortConv),
    /// q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd], q/k norm [hd]
    Attention(Box<Attention>),
}

enum Ffn {
    /// gate/up [n_ff, n_embd], down [n_embd, n_ff]
    Dense(Dense),
    /// router [n_expert, n_embd], selection bias [n_expert]; experts [n_expert][n_ff_exp, n_embd] / [n_embd, n_ff_exp]
    Moe(Box<Moe>),
}

struct Layer {
    attn_norm: RmsNorm, // [n_embd] (the operator norm, before either mixer)
    mixer: Mixer,
    ffn_norm: RmsNorm, // [n_embd]
    ffn: Ffn,
}

pub struct Lfm2Moe {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl Lfm2Moe {
    pub fn load(file: &GgufFile) -> Result<Lfm2Moe> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Lfm2Moe.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let mixer = match hp.n_kv[il] {
                0 => Mixer::Conv(ShortConv::load(&ld, il, hp.conv)?),
                n_kv_head => {
                    let a = Attention::load(&ld, il, e, AttnParams { n_kv_head, ..hp.attn.clone() }, false)?;
                    // The per-head q/k norms are part of the architecture.
                    for (norm, kind) in [(&a.q_norm, TensorKind::AttnQNorm), (&a.k_norm, TensorKind::AttnKNorm)] {
                        if norm.is_none() {
                            return Err(Error::MissingTensor(kind.weight(il)));
                        }
                    }
                    Mixer::Attention(Box::new(a))
                }
            };
            let ffn = match hp.moe {
                Some(p) if il >= hp.n_dense => {
                    Ffn::Moe(Box::new(Moe::load(&ld, il, e, p)?.with_selection_bias(&ld, il, true)?))
                }
                _ => Ffn::Dense(Dense::load(&ld, il, e, hp.n_ff, Act::Silu)?),
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                mixer,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                ffn,
            });
        }
        let trunk = Trunk::load_with_norm(&ld, e, eps, TensorKind::TokenEmbdNorm)?;
        Ok(Lfm2Moe { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Lfm2Moe {
    fn arch(&self) -> Arch {
        Arch::Lfm2Moe
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
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Conv(c) => LayerKind::ShortConv(&c.p),
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
        if states.len() != self.layers.len() {
            return Err(foreign_state());
        }
        let Rows { x, xn, out, blocks: b } = s.rows(pass.n, self.hp.n_embd);
        for (layer, state) in self.layers.iter().zip(states) {
            // x += Mixer(RMSNorm(x))   (short conv or attention)
            layer.attn_norm.forward(x, xn);
            match (&layer.mixer, state) {
                (Mixer::Conv(c), LayerState::Recurrent(st)) => c.forward(pass, st, &mut b.shortconv, xn, out)?,
                (Mixer::Attention(a), LayerState::Attention(cache)) => a.forward(pass, cache, &mut b.attn, xn, out),
                _ => return Err(foreign_state()),
            }
            ops::add(x, out);
            // x += FFN(RMSNorm(x))   (dense SwiGLU or the MoE)
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
