//! The Llama family (`llama`, `qwen2`, `qwen3`): pre-norm transformer with
//! GQA and RoPE, a dense SwiGLU FFN or — when the layer has stacked experts —
//! a Mixtral-style routed MoE. Qwen2 adds q/k/v biases; Qwen3 adds QK-norm.

use super::attention::{self, AttnParams, AttnWeights, Rope};
use super::cache::{KvCache, KvType, Logits};
use super::ffn::{Act, Dense, Gating, Moe};
use super::hparams::Meta;
use super::scratch::take;
use super::weights::{Loader, Matrix};
use super::{embed, norm_rows, Head, LayerState, Network, State};
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;
use crate::threads::ThreadPool;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    arch: Arch,
    n_embd: usize,
    n_layer: usize,
    n_vocab: usize,
    n_ff: usize,
    n_expert: usize,
    n_expert_used: usize,
    attn: AttnParams,
    eps: f32,
}

impl Hparams {
    fn read(m: &Meta, arch: Arch, n_vocab: usize) -> Result<Hparams> {
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv_head = m.usize_or(Key::HeadCountKv, n_head)?;
        m.ensure(Key::HeadCountKv, n_kv_head > 0 && n_head % n_kv_head == 0, "must divide head_count")?;
        let head_dim = m.usize_or(Key::KeyLength, n_embd / n_head)?;
        let head_dim_v = m.usize_or(Key::ValueLength, head_dim)?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even and <= head dim")?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-5)?;
        Ok(Hparams {
            arch,
            n_embd,
            n_layer: m.nonzero(Key::BlockCount)?,
            n_vocab,
            n_ff: m.usize_or(Key::FeedForwardLength, 0)?,
            n_expert: m.usize_or(Key::ExpertCount, 0)?,
            n_expert_used: m.usize_or(Key::ExpertUsedCount, 0)?,
            attn: AttnParams {
                n_head,
                n_kv_head,
                head_dim,
                head_dim_v,
                rope: Rope {
                    n_rot,
                    base: m.f32_or(Key::RopeFreqBase, 10_000.0)?,
                    scale: m.rope_freq_scale()?,
                    // Llama rotates adjacent pairs; the Qwen family NeoX halves.
                    neox: arch != Arch::Llama,
                },
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: None,
                eps,
            },
            eps,
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Ffn {
    Dense(Dense), // gate/up [n_ff, n_embd], down [n_embd, n_ff]
    Moe(Moe),     // router [n_expert, n_embd]; experts [n_expert][n_ff, n_embd] / [n_embd, n_ff]
}

struct Layer {
    attn_norm: Vec<f32>, // [n_embd]
    attn: AttnWeights,   // q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd]
    ffn_norm: Vec<f32>,  // [n_embd]
    ffn: Ffn,
}

pub struct Llama {
    hp: Hparams,
    token_embd: Matrix, // [n_vocab, n_embd]
    layers: Vec<Layer>,
    head: Head,
}

impl Llama {
    pub fn load(file: &GgufFile, arch: Arch) -> Result<Llama> {
        let ld = Loader::new(file);
        let m = Meta::new(file, arch.name());
        let embd_name = TensorKind::TokenEmbd.weight(0);
        let n_vocab = file.tensor(&embd_name).ok_or(Error::MissingTensor(embd_name))?.dims[1] as usize;
        let hp = Hparams::read(&m, arch, n_vocab)?;
        let e = hp.n_embd;
        let token_embd = ld.matrix(TensorKind::TokenEmbd, 0, n_vocab, e)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let ffn = if ld.has(TensorKind::FfnGateExps, il) {
                m.ensure(Key::ExpertCount, hp.n_expert > 0, "stacked experts need expert_count")?;
                Ffn::Moe(Moe::load(
                    &ld,
                    il,
                    e,
                    hp.n_ff,
                    hp.n_expert,
                    hp.n_expert_used,
                    Gating::from_meta(&m, Gating::Softmax)?,
                    m.bool_or(Key::ExpertWeightsNorm, true)?,
                    m.f32_or(Key::ExpertWeightsScale, 1.0)?,
                )?)
            } else {
                m.ensure(Key::FeedForwardLength, hp.n_ff > 0, "must be positive")?;
                Ffn::Dense(Dense::load(&ld, il, e, hp.n_ff)?)
            };
            layers.push(Layer {
                attn_norm: ld.vector(TensorKind::AttnNorm, il, e)?,
                attn: AttnWeights::load(&ld, il, e, &hp.attn, false)?,
                ffn_norm: ld.vector(TensorKind::FfnNorm, il, e)?,
                ffn,
            });
        }
        let output = ld.matrix_opt(TensorKind::Output, 0, n_vocab, e)?.unwrap_or_else(|| token_embd.clone());
        let head = Head { norm: ld.vector(TensorKind::OutputNorm, 0, e)?, output, eps: hp.eps, softcap: None };
        Ok(Llama { hp, token_embd, layers, head })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Llama {
    fn arch(&self) -> Arch {
        self.hp.arch
    }

    fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    fn new_layers(&self, n_ctx: usize, kv: KvType) -> Result<Vec<LayerState>> {
        let a = &self.hp.attn;
        (0..self.hp.n_layer)
            .map(|_| Ok(LayerState::Attention(KvCache::new(kv, a.n_kv_head, a.head_dim, a.head_dim_v, n_ctx)?)))
            .collect()
    }

    fn forward(&self, file: &[u8], pool: &ThreadPool, state: &mut State, tokens: &[u32], want: Logits) -> Result<()> {
        let (n, e, pos0) = (tokens.len(), self.hp.n_embd, state.n_past);
        let s = &mut state.scratch;
        // x = embedding rows of the tokens
        embed(file, &self.token_embd, tokens, take(&mut s.x, n * e));

        for (il, layer) in self.layers.iter().enumerate() {
            let LayerState::Attention(cache) = &mut state.layers[il] else { unreachable!("attention layers only") };
            // x += Attention(RMSNorm(x))
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.attn_norm, self.hp.eps, e);
            attention::forward(file, pool, &self.hp.attn, &layer.attn, cache, pos0, n, e, s);
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
            // x += FFN(RMSNorm(x)), dense SwiGLU or routed experts
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.ffn_norm, self.hp.eps, e);
            match &layer.ffn {
                Ffn::Dense(d) => d.forward(file, pool, Act::Silu, n, s),
                Ffn::Moe(moe) => {
                    moe.forward(file, pool, n, s, state.trace.as_mut());
                }
            }
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
        }
        // logits = Output · RMSNorm(x)
        self.head.forward(file, pool, state, n, want);
        Ok(())
    }
}
