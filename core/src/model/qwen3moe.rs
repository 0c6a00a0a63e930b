//! Qwen3-MoE (`qwen3moe`): pre-norm transformer with QK-norm, NeoX RoPE and
//! a routed-expert FFN (softmax top-k, renormalised) in every layer.

use super::attention::{self, AttnParams, AttnWeights, Rope};
use super::cache::{KvCache, KvType, Logits};
use super::ffn::{Gating, Moe};
use super::hparams::Meta;
use super::scratch::take;
use super::weights::{Loader, Matrix};
use super::{embed, norm_rows, Head, LayerState, Network, State};
use crate::error::Result;
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;
use crate::threads::ThreadPool;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    n_layer: usize,
    n_vocab: usize,
    n_expert: usize,
    n_expert_used: usize,
    n_ff_exp: usize,
    attn: AttnParams,
    eps: f32,
    norm_weights: bool,
    weights_scale: f32,
}

impl Hparams {
    fn read(m: &Meta, n_vocab: usize) -> Result<Hparams> {
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv_head = m.usize_or(Key::HeadCountKv, n_head)?;
        m.ensure(Key::HeadCountKv, n_kv_head > 0 && n_head % n_kv_head == 0, "must divide head_count")?;
        let head_dim = m.usize_or(Key::KeyLength, n_embd / n_head)?;
        let head_dim_v = m.usize_or(Key::ValueLength, head_dim)?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even and <= head dim")?;
        let n_expert = m.nonzero(Key::ExpertCount)?;
        let n_expert_used = m.nonzero(Key::ExpertUsedCount)?;
        let ff = m.usize_or(Key::FeedForwardLength, 0)?;
        let n_ff_exp = m.usize_or(Key::ExpertFeedForwardLength, ff / n_expert_used)?;
        Ok(Hparams {
            n_embd,
            n_layer: m.nonzero(Key::BlockCount)?,
            n_vocab,
            n_expert,
            n_expert_used,
            n_ff_exp,
            attn: AttnParams {
                n_head,
                n_kv_head,
                head_dim,
                head_dim_v,
                rope: Rope {
                    n_rot,
                    base: m.f32_or(Key::RopeFreqBase, 10_000.0)?,
                    scale: m.rope_freq_scale()?,
                    neox: true,
                },
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: None,
                eps: m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?,
            },
            eps: m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?,
            norm_weights: m.bool_or(Key::ExpertWeightsNorm, true)?,
            weights_scale: m.f32_or(Key::ExpertWeightsScale, 1.0)?,
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

struct Layer {
    attn_norm: Vec<f32>, // [n_embd]
    attn: AttnWeights,   // q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd]
    ffn_norm: Vec<f32>,  // [n_embd]
    moe: Moe,            // router [n_expert, n_embd]; experts [n_expert][n_ff_exp, n_embd] / [n_embd, n_ff_exp]
}

pub struct Qwen3Moe {
    hp: Hparams,
    token_embd: Matrix, // [n_vocab, n_embd]
    layers: Vec<Layer>,
    head: Head,
}

impl Qwen3Moe {
    pub fn load(file: &GgufFile) -> Result<Qwen3Moe> {
        let ld = Loader::new(file);
        let m = Meta::new(file, Arch::Qwen3Moe.name());
        let token_embd_info = file
            .tensor(&TensorKind::TokenEmbd.weight(0))
            .ok_or_else(|| crate::Error::MissingTensor(TensorKind::TokenEmbd.weight(0)))?;
        let n_vocab = token_embd_info.dims[1] as usize;
        let hp = Hparams::read(&m, n_vocab)?;
        let e = hp.n_embd;
        let token_embd = ld.matrix(TensorKind::TokenEmbd, 0, n_vocab, e)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            layers.push(Layer {
                attn_norm: ld.vector(TensorKind::AttnNorm, il, e)?,
                attn: AttnWeights::load(&ld, il, e, &hp.attn, false)?,
                ffn_norm: ld.vector(TensorKind::FfnNorm, il, e)?,
                moe: Moe::load(
                    &ld,
                    il,
                    e,
                    hp.n_ff_exp,
                    hp.n_expert,
                    hp.n_expert_used,
                    Gating::from_meta(&m, Gating::Softmax)?,
                    hp.norm_weights,
                    hp.weights_scale,
                )?,
            });
        }
        let output = match ld.matrix_opt(TensorKind::Output, 0, n_vocab, e)? {
            Some(o) => o,
            None => token_embd.clone(), // tied embeddings
        };
        let head = Head { norm: ld.vector(TensorKind::OutputNorm, 0, e)?, output, eps: hp.eps, softcap: None };
        Ok(Qwen3Moe { hp, token_embd, layers, head })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Qwen3Moe {
    fn arch(&self) -> Arch {
        Arch::Qwen3Moe
    }

    fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    fn experts(&self) -> Vec<(usize, &super::weights::Experts)> {
        let moe = self.layers.iter().enumerate().map(|(il, l)| (il, &l.moe));
        moe.flat_map(|(il, m)| [(il, &m.gate), (il, &m.up), (il, &m.down)]).collect()
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
            // x += MoE(RMSNorm(x))
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.ffn_norm, self.hp.eps, e);
            layer.moe.forward(file, pool, n, s, state.trace.as_mut());
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
        }
        // logits = Output · RMSNorm(x)
        self.head.forward(file, pool, state, n, want);
        Ok(())
    }
}
