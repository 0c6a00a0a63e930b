//! DeepSeek-V2/V3 (`deepseek2`; also Moonlight, GLM-4.7-Flash, Kanana-2):
//! Multi-head Latent Attention over a compressed KV cache, with YaRN RoPE on
//! its rotary dims; the first layers have a dense SwiGLU FFN, the others a
//! MoE (softmax or sigmoid router, DeepSeek-V3's selection bias and
//! group-limited routing, weights normalised and scaled) beside shared experts.
//!
//! Layer: h = x + MLA(RMSNorm(x)); x' = h + FFN(RMSNorm(h)), FFN = dense
//! or routed experts + shared experts.

use super::blocks::ffn::{Act, Dense};
use super::blocks::mla::{Mla, MlaParams};
use super::blocks::moe::{Gating, Moe, MoeParams, Routing};
use super::blocks::norm::RmsNorm;
use super::blocks::yarn::{yarn_mscale, Yarn};
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
    /// Trunk layers (block_count minus any multi-token-prediction layers).
    n_layer: usize,
    /// Layers `..n_dense` have a dense FFN of `n_ff`.
    n_dense: usize,
    n_ff: usize,
    moe: MoeParams,
    /// Hidden size of the shared experts together (0: none).
    n_ff_shexp: usize,
    mla: MlaParams,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_blocks = m.nonzero(Key::BlockCount)?;
        let n_nextn = m.usize_or(Key::NextnPredictLayers, 0)?;
        m.ensure(Key::NextnPredictLayers, n_nextn < n_blocks, "leaves no trunk layers")?;
        let n_layer = n_blocks - n_nextn;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?;
        m.ensure(Key::LayerNormRmsEpsilon, eps > 0.0, "must be positive")?;

        // MLA shape: the decompressed heads' key (nope + rope) and value sizes.
        let n_head = m.nonzero(Key::HeadCount)?;
        let kv_lora = m.nonzero(Key::KvLoraRank)?;
        let q_lora = m.usize_or(Key::QLoraRank, 0)?;
        let k_mla = match m.usize_or(Key::KeyLengthMla, 0)? {
            0 => m.nonzero(Key::KeyLength)?,
            k => k,
        };
        let v_dim = match m.usize_or(Key::ValueLengthMla, 0)? {
            0 => m.nonzero(Key::ValueLength)?,
            v => v,
        };
        let rope = m.nonzero(Key::RopeDimensionCount)?;
        m.ensure(Key::RopeDimensionCount, rope % 2 == 0 && rope < k_mla, format!("{rope} of a {k_mla} head"))?;
        let (yarn, kq_scale) = rope_scaling(m, rope, k_mla)?;
        let mla = MlaParams { n_head, q_lora, kv_lora, nope: k_mla - rope, rope, v_dim, kq_scale, yarn, eps };

        // FFNs: leading dense layers, then experts.
        let n_dense = m.usize_or(Key::LeadingDenseBlockCount, 0)?;
        m.ensure(Key::LeadingDenseBlockCount, n_dense <= n_layer, format!("{n_dense} of {n_layer} layers"))?;
        let n_ff = if n_dense > 0 { m.nonzero(Key::FeedForwardLength)? } else { 0 };
        let n_expert = m.nonzero(Key::ExpertCount)?;
        let n_ff_exp = m.nonzero(Key::ExpertFeedForwardLength)?;
        let mut moe = MoeParams::read(m, n_expert, m.nonzero(Key::ExpertUsedCount)?, n_ff_exp)?;
        // Files of DeepSeek-V2 carry no gating function (softmax), nor a
        // weight normalisation (off); GLM-4.7-Flash's carry none either (sigmoid).
        let vocab = m.usize_or(Key::VocabSize, 0)?;
        let glm_flash = matches!(n_layer, 47 | 48) && vocab == 154_880;
        moe.gating = Gating::from_meta(m, if glm_flash { Gating::Sigmoid } else { Gating::Softmax })?;
        moe.norm_weights = m.bool_or(Key::ExpertWeightsNorm, false)?;
        let n_shared = m.usize_or(Key::ExpertSharedCount, 0)?;
        let n_ff_shexp = n_shared
            .checked_mul(n_ff_exp)
            .filter(|&v| v <= 1 << 24)
            .ok_or_else(|| m.bad(Key::ExpertSharedCount, format!("{n_shared} shared experts of {n_ff_exp}")))?;
        Ok(Hparams { n_embd, n_layer, n_dense, n_ff, moe, n_ff_shexp, mla, eps })
    }
}

/// The rotation of the rotary dims and the softmax scale of the scores, as
/// llama.cpp derives them for this architecture. With YaRN, cos and sin keep
/// magnitude 1 when the file gives `yarn_log_multiplier` (DeepSeek's
/// `mscale_all_dim`, times 0.1), `1 + 0.1 ln(factor)` otherwise; the scores
/// are scaled by `mscale² / sqrt(k_mla)` with `mscale = (1 + 0.1 ln(factor))
/// · (1 + 0.1 · mscale_all_dim · ln(factor))` in the first case.
fn rope_scaling(m: &Meta, n_rot: usize, k_mla: usize) -> Result<(Yarn, f32)> {
    let base = m.f32_or(Key::RopeFreqBase, 10_000.0)?;
    m.ensure(Key::RopeFreqBase, base > 1.0, "must exceed 1")?;
    let kind = m.file.get_str(&m.key(Key::RopeScalingType))?.unwrap_or("linear").to_string();
    let factor = m.f32_or(Key::RopeScalingFactor, m.f32_or(Key::RopeScaleLinear, 0.0)?)?;
    m.ensure(Key::RopeScalingFactor, factor >= 0.0, format!("{factor} is negative"))?;
    let freq_scale = match (kind.as_str(), factor) {
        ("none", _) | (_, 0.0) => 1.0,
        (_, f) => 1.0 / f,
    };
    // ln(1 / freq_scale) = ln(factor).
    let ln_f = (1.0 / freq_scale).ln();
    let log_mul = m.f32_or(Key::RopeScalingYarnLogMultiplier, 0.0)? / 0.1;
    let attn_factor = m.f32_or(Key::RopeScalingAttnFactor, 1.0)?;
    let (yarn, attn_factor) = match kind.as_str() {
        "none" | "linear" => (Yarn { mscale: attn_factor, ..Yarn::linear(n_rot, base, freq_scale) }, attn_factor),
        "yarn" => {
            let orig = match m.usize_or(Key::RopeScalingOrigCtxLen, 0)? {
                0 => m.nonzero(Key::ContextLength)?,
                n => n,
            };
            let beta = [m.f32_or(Key::RopeScalingYarnBetaFast, 32.0)?, m.f32_or(Key::RopeScalingYarnBetaSlow, 1.0)?];
            m.ensure(Key::RopeScalingYarnBetaFast, beta[0] > 0.0 && beta[1] > 0.0, "must be positive")?;
            // The magnitude llama.cpp asks of the rotation, before ggml's own
            // YaRN factor (1 + 0.1 ln(factor)) that it cancels.
            let f = 1.0 / freq_scale;
            let asked = if log_mul != 0.0 { 1.0 } else { yarn_mscale(f, 1.0) };
            let af = asked / (1.0 + 0.1 * ln_f) * attn_factor;
            (Yarn::extended(n_rot, base, freq_scale, orig, beta, af * (1.0 + 0.1 * ln_f)), af)
        }
        other => {
            return Err(Error::InvalidHyperparameter {
                key: m.key(Key::RopeScalingType),
                reason: format!("RoPE scaling '{other}' is not supported"),
            })
        }
    };
    let mscale = attn_factor * (1.0 + 0.1 * ln_f) * (1.0 + 0.1 * log_mul * ln_f);
    Ok((yarn, mscale * mscale / (k_mla as f32).sqrt()))
}

// ---- tensors -----------------------------------------------------------------------

enum Ffn {
    /// gate/up `[n_ff, n_embd]`, down `[n_embd, n_ff]`.
    Dense(Dense),
    /// Router `[n_expert, n_embd]`, experts `[n_expert][n_ff_exp, n_embd]`,
    /// shared experts `[n_ff_shexp, n_embd]`.
    Moe(Box<Moe>),
}

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    attn: Mla,
    ffn_norm: RmsNorm, // [n_embd]
    ffn: Ffn,
}

pub struct Deepseek2 {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl Deepseek2 {
    pub fn load(file: &GgufFile) -> Result<Deepseek2> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Deepseek2.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let trunk = Trunk::load(&ld, e, eps)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let ffn = if il < hp.n_dense {
                Ffn::Dense(Dense::load(&ld, il, e, hp.n_ff, Act::Silu)?)
            } else {
                let moe = Moe::load(&ld, il, e, hp.moe)?
                    .with_shared_expert(&ld, il, e, hp.n_ff_shexp)?
                    .with_selection_bias(&ld, il, false)?;
                if hp.n_ff_shexp > 0 && moe.shared.is_none() {
                    return Err(Error::MissingTensor(TensorKind::FfnUpShexp.weight(il)));
                }
                Ffn::Moe(Box::new(moe))
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn: Mla::load(&ld, il, e, hp.mla)?,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                ffn,
            });
        }
        Ok(Deepseek2 { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Deepseek2 {
    fn arch(&self) -> Arch {
        Arch::Deepseek2
    }

    fn trunk(&self) -> &Trunk {
        &self.trunk
    }

    fn n_layer(&self) -> usize {
        self.layers.len()
    }

    fn layer_kinds(&self) -> Vec<LayerKind<'_>> {
        self.layers.iter().map(|l| LayerKind::Latent(&l.attn.p)).collect()
    }

    fn experts(&self) -> Vec<(usize, &Experts)> {
        let moe = self.layers.iter().enumerate().filter_map(|(il, l)| match &l.ffn {
            Ffn::Moe(m) => Some((il, m)),
            Ffn::Dense(_) => None,
        });
        moe.flat_map(|(il, m)| [(il, &m.gate), (il, &m.up), (il, &m.down)]).collect()
    }

    fn experts_used(&self) -> usize {
        self.hp.moe.n_used
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
            // x += MLA(RMSNorm(x)), over the layer's latent cache
            let LayerState::Latent(cache) = state else { return Err(foreign_state()) };
            layer.attn_norm.forward(x, xn);
            layer.attn.forward(pass, cache, &mut b.mla, xn, out);
            ops::add(x, out);
            // x += FFN(RMSNorm(x)): dense, or routed + shared experts
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
