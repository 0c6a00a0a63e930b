//! Gemma 3 (`gemma3`): interleaved sliding-window (local) and global
//! attention layers, QK-norm, pre- and post-norms around both blocks, GeGLU
//! FFN, embeddings scaled by sqrt(n_embd), tied output head.
//!
//! Layer: h = x + PostNorm(Attention(PreNorm(x))); x' = h + PostNorm(GeGLU(PreNorm(h))).
//!
//! Norm weights are used as stored: the GGUF converter already folded
//! Gemma's `1 + w` convention into them.

use super::blocks::attention::{Attention, AttnParams};
use super::blocks::ffn::{Act, Dense};
use super::blocks::moe::Routing;
use super::blocks::norm::RmsNorm;
use super::hparams::Meta;
use super::network::{foreign_state, Network};
use super::pass::Pass;
use super::state::{LayerKind, LayerState, Rows, Scratch};
use super::trunk::Trunk;
use super::weights::Loader;
use crate::error::Result;
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;

/// Every `SWA_PATTERN`-th layer is global, the others slide (Gemma 3's 5:1).
const SWA_PATTERN: usize = 6;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    n_layer: usize,
    n_ff: usize,
    /// Attention of global layers.
    global: AttnParams,
    /// Attention of sliding-window layers (window, RoPE base differ).
    local: AttnParams,
    /// Which layers slide.
    is_local: Vec<bool>,
    eps: f32,
    final_softcap: Option<f32>,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?;
        let window = m.usize_or(Key::SlidingWindow, 0)?;
        // Query scaling: 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim), as the reference does below 27B.
        let global = AttnParams::read(m, 10_000.0, true, eps)?;
        let mut local = global.clone();
        local.rope.base = m.f32_or(Key::RopeFreqBaseSwa, 10_000.0)?;
        local.rope.scale = 1.0;
        local.window = (window > 0).then_some(window);
        // The pattern is either a per-layer bool array or a period.
        let is_local = match m.bools(Key::SlidingWindowPattern).ok().flatten() {
            Some(p) => {
                m.ensure(Key::SlidingWindowPattern, p.len() >= n_layer, "shorter than block_count")?;
                p[..n_layer].to_vec()
            }
            None => {
                let period = m.usize_or(Key::SlidingWindowPattern, SWA_PATTERN)?;
                (0..n_layer).map(|il| window > 0 && (period == 0 || il % period < period - 1)).collect()
            }
        };
        let softcap = m.f32_or(Key::FinalLogitSoftcapping, 0.0)?;
        Ok(Hparams {
            n_embd: m.nonzero(Key::EmbeddingLength)?,
            n_layer,
            n_ff: m.nonzero(Key::FeedForwardLength)?,
            global,
            local,
            is_local,
            eps,
            final_softcap: (softcap > 0.0).then_some(softcap),
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

struct Layer {
    attn_norm: RmsNorm,      // [n_embd]
    attn: Attention,         // q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd], q/k norm [hd]
    attn_post_norm: RmsNorm, // [n_embd]
    ffn_norm: RmsNorm,       // [n_embd]
    ffn: Dense,              // gate/up [n_ff, n_embd], down [n_embd, n_ff]
    ffn_post_norm: RmsNorm,  // [n_embd]
}

pub struct Gemma3 {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
}

impl Gemma3 {
    pub fn load(file: &GgufFile) -> Result<Gemma3> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Gemma3.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let p = if hp.is_local[il] { &hp.local } else { &hp.global };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn: Attention::load(&ld, il, e, p.clone(), false)?,
                attn_post_norm: RmsNorm::load(&ld, TensorKind::AttnPostNorm, il, e, eps)?,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                ffn: Dense::load(&ld, il, e, hp.n_ff, Act::GeluTanh)?,
                ffn_post_norm: RmsNorm::load(&ld, TensorKind::FfnPostNorm, il, e, eps)?,
            });
        }
        let mut trunk = Trunk::load(&ld, e, eps)?;
        trunk.embed_scale = Some((e as f32).sqrt());
        trunk.softcap = hp.final_softcap;
        Ok(Gemma3 { hp, trunk, layers })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Gemma3 {
    fn arch(&self) -> Arch {
        Arch::Gemma3
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

    #[cfg(feature = "gpu")]
    fn record(&self, r: &mut dyn super::record::Record) -> Result<()> {
        let (x, xn, out) = r.rows();
        for (il, layer) in self.layers.iter().enumerate() {
            r.norm(&layer.attn_norm, x, xn)?;
            r.attention(il, &layer.attn, xn, out)?;
            r.norm_in_place(&layer.attn_post_norm, out)?;
            r.add(x, out)?;
            r.norm(&layer.ffn_norm, x, xn)?;
            r.dense(&layer.ffn, xn, out)?;
            r.norm_in_place(&layer.ffn_post_norm, out)?;
            r.add(x, out)?;
        }
        Ok(())
    }

    fn layers(
        &self,
        pass: &Pass,
        states: &mut [LayerState],
        s: &mut Scratch,
        _: Option<&mut Vec<Routing>>,
    ) -> Result<()> {
        let Rows { x, xn, out, blocks: b } = s.rows(pass.n, self.hp.n_embd);
        for (layer, state) in self.layers.iter().zip(states) {
            let LayerState::Attention(cache) = state else { return Err(foreign_state()) };
            // x += PostNorm(Attention(PreNorm(x)))
            layer.attn_norm.forward(x, xn);
            layer.attn.forward(pass, cache, &mut b.attn, xn, out);
            layer.attn_post_norm.forward_inplace(out);
            ops::add(x, out);
            // x += PostNorm(GeGLU(PreNorm(x)))
            layer.ffn_norm.forward(x, xn);
            layer.ffn.forward(pass, &mut b.ffn, xn, out);
            layer.ffn_post_norm.forward_inplace(out);
            ops::add(x, out);
        }
        Ok(())
    }
}
