//! gpt-oss (`gpt-oss`; gpt-oss-20b and -120b): GQA attention with biases
//! on q/k/v/o and a learned sink logit per head, sliding-window layers
//! alternating with full ones, YaRN RoPE on both; every layer ends in a MoE
//! whose biased router chooses the top-k experts by their logits and weighs
//! them by a softmax over the chosen, with biased experts and a clamped
//! SwiGLU (`(up + 1)`), as llama.cpp's `openai-moe` graph runs it.
//!
//! Layer: h = x + Attention(RMSNorm(x)); x' = h + MoE(RMSNorm(h)), the
//! second norm being `post_attention_norm`.

use super::blocks::attention::{Attention, AttnParams, Rope};
use super::blocks::ffn::Act;
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

/// Every other layer slides, starting with the first (llama.cpp's default).
const SWA_PERIOD: usize = 2;
/// YaRN's ramp bounds in turns over the original context: llama.cpp's
/// defaults, which it does not read from this architecture's files.
const YARN_BETA: [f32; 2] = [32.0, 1.0];

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    /// Per layer: its attention (KV heads, window).
    attn: Vec<AttnParams>,
    /// The rotation of the full and of the sliding layers (their bases may differ).
    yarn_full: Yarn,
    yarn_swa: Yarn,
    moe: MoeParams,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-5)?;
        m.ensure(Key::LayerNormRmsEpsilon, eps > 0.0, "must be positive")?;

        // Heads: 64 x 64 on 2880 channels, so the head size is given, not derived.
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv = m.per_layer(Key::HeadCountKv, n_layer, Some(n_head))?;
        for (il, &kv) in n_kv.iter().enumerate() {
            m.ensure(Key::HeadCountKv, kv > 0 && n_head % kv == 0, format!("layer {il}: {kv} must divide {n_head}"))?;
        }
        let head_dim = m.usize_or(Key::KeyLength, n_embd / n_head)?;
        m.ensure(Key::KeyLength, head_dim > 0 && head_dim % 2 == 0, "must be even and positive")?;
        m.ensure(Key::ValueLength, m.usize_or(Key::ValueLength, head_dim)? == head_dim, "must equal key_length")?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot == head_dim, format!("{n_rot} must be the head size {head_dim}"))?;

        // Sliding layers (every other one unless the file says) see the last `window` positions.
        let window = m.nonzero(Key::SlidingWindow)?;
        let is_swa = m.swa_layers(n_layer, SWA_PERIOD)?;
        let base = m.f32_or(Key::RopeFreqBase, 10_000.0)?;
        let base_swa = m.f32_or(Key::RopeFreqBaseSwa, base)?;
        m.ensure(Key::RopeFreqBase, base > 1.0, "must exceed 1")?;
        m.ensure(Key::RopeFreqBaseSwa, base_swa > 1.0, "must exceed 1")?;
        let yarn_full = rope_scaling(m, n_rot, base)?;
        let yarn_swa = rope_scaling(m, n_rot, base_swa)?;
        let attn = (0..n_layer)
            .map(|il| AttnParams {
                n_head,
                n_kv_head: n_kv[il],
                head_dim,
                head_dim_v: head_dim,
                rope: Rope { n_rot, base, scale: yarn_full.freq_scale, neox: true },
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: is_swa[il].then_some(window),
                eps,
            })
            .collect();

        // Experts: one width in every layer (a per-layer array must agree).
        let n_expert = m.nonzero(Key::ExpertCount)?;
        let n_ff = m.per_layer(Key::ExpertFeedForwardLength, n_layer, None)?;
        let n_ff_exp = n_ff[0];
        m.ensure(Key::ExpertFeedForwardLength, n_ff_exp > 0, "must be positive")?;
        m.ensure(Key::ExpertFeedForwardLength, n_ff.iter().all(|&f| f == n_ff_exp), "differs between layers")?;
        let mut moe = MoeParams::read(m, n_expert, m.nonzero(Key::ExpertUsedCount)?, n_ff_exp)?;
        // What llama.cpp's graph fixes whatever the file says: softmax over
        // the chosen logits, no renormalisation or scale, the clamped SwiGLU.
        moe.gating = Gating::SoftmaxWeight;
        moe.norm_weights = false;
        moe.weights_scale = 1.0;
        moe.act = Act::SwigluOai;
        Ok(Hparams { n_embd, attn, yarn_full, yarn_swa, moe, eps })
    }
}

/// The rotation at base `base`: YaRN when the file says (over its original
/// context; cos and sin scaled by `attn_factor · (1 + 0.1 ln factor)`, what
/// llama.cpp's context and ggml's rope make together), else linear RoPE.
fn rope_scaling(m: &Meta, n_rot: usize, base: f32) -> Result<Yarn> {
    let kind = m.file.get_str(&m.key(Key::RopeScalingType))?.unwrap_or("linear").to_string();
    let factor = m.f32_or(Key::RopeScalingFactor, m.f32_or(Key::RopeScaleLinear, 0.0)?)?;
    m.ensure(Key::RopeScalingFactor, factor >= 0.0, format!("{factor} is negative"))?;
    let freq_scale = if kind == "none" || factor == 0.0 { 1.0 } else { 1.0 / factor };
    let attn_factor = m.f32_or(Key::RopeScalingAttnFactor, 1.0)?;
    match kind.as_str() {
        "none" | "linear" => Ok(Yarn { mscale: attn_factor, ..Yarn::linear(n_rot, base, freq_scale) }),
        "yarn" => {
            let orig = match m.usize_or(Key::RopeScalingOrigCtxLen, 0)? {
                0 => m.nonzero(Key::ContextLength)?,
                n => n,
            };
            let mscale = attn_factor * yarn_mscale(1.0 / freq_scale, 1.0);
            Ok(Yarn::extended(n_rot, base, freq_scale, orig, YARN_BETA, mscale))
        }
        other => Err(Error::InvalidHyperparameter {
            key: m.key(Key::RopeScalingType),
            reason: format!("RoPE scaling '{other}' is not supported"),
        }),
    }
}

// ---- tensors -----------------------------------------------------------------------

struct Layer {
    attn_norm: RmsNorm, // [n_embd]
    /// q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd],
    /// their biases, sinks [n_head]
    attn: Attention,
    post_attn_norm: RmsNorm, // [n_embd]
    /// router [n_expert, n_embd] + bias [n_expert]; experts gate/up
    /// [n_expert][n_ff, n_embd] + bias [n_expert][n_ff], down [n_expert][n_embd, n_ff] + bias
    moe: Moe,
}

pub struct GptOss {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl GptOss {
    pub fn load(file: &GgufFile) -> Result<GptOss> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::GptOss.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.attn.len());
        for (il, p) in hp.attn.iter().enumerate() {
            let yarn = if p.window.is_some() { hp.yarn_swa } else { hp.yarn_full };
            let attn = Attention::load(&ld, il, e, p.clone(), false)?.with_sinks(&ld, il)?.with_yarn(yarn);
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn,
                post_attn_norm: RmsNorm::load(&ld, TensorKind::AttnPostNorm, il, e, eps)?,
                moe: Moe::load(&ld, il, e, hp.moe)?.with_biases(&ld, il, e)?,
            });
        }
        let trunk = Trunk::load(&ld, e, eps)?;
        Ok(GptOss { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for GptOss {
    fn arch(&self) -> Arch {
        Arch::GptOss
    }

    fn trunk(&self) -> &Trunk {
        &self.trunk
    }

    fn n_layer(&self) -> usize {
        self.layers.len()
    }

    fn layer_kinds(&self) -> Vec<LayerKind<'_>> {
        self.layers.iter().map(|l| LayerKind::Attention(&l.attn.p)).collect()
    }

    fn experts(&self) -> Vec<(usize, &Experts)> {
        let moe = self.layers.iter().enumerate().map(|(il, l)| (il, &l.moe));
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
            let LayerState::Attention(cache) = state else { return Err(foreign_state()) };
            // x += Attention(RMSNorm(x))   (sliding or full; biases, sinks, YaRN)
            layer.attn_norm.forward(x, xn);
            layer.attn.forward(pass, cache, &mut b.attn, xn, out);
            ops::add(x, out);
            // x += MoE(RMSNorm(x))   (post_attention_norm; biased router and experts)
            layer.post_attn_norm.forward(x, xn);
            layer.moe.forward(pass, &mut b.moe, xn, out, trace.as_deref_mut())?;
            ops::add(x, out);
        }
        Ok(())
    }
}
