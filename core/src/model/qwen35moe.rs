//! Qwen3.5-MoE (`qwen35moe`): a hybrid of Gated DeltaNet (linear attention)
//! layers and gated full-attention layers (3:1), every layer followed by a
//! MoE FFN with softmax top-k routing plus a sigmoid-gated shared expert.
//!
//! Layer: h = x + Mixer(RMSNorm(x)); x' = h + MoE(RMSNorm(h)), where Mixer is
//! a DeltaNet or an attention layer whose query carries a per-head sigmoid
//! output gate, with QK-norm and partial rotary (a quarter of the head).

use super::attention::{self, AttnParams, AttnWeights, Rope};
use super::cache::{KvCache, KvType, Logits};
use super::deltanet::{self, DeltaParams, DeltaState, DeltaWeights};
use super::ffn::{Dense, Gating, Moe, SharedExpert};
use super::hparams::Meta;
use super::scratch::take;
use super::weights::{Experts, Loader, Matrix};
use super::{embed, norm_rows, Head, LayerState, Network, State};
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;
use crate::threads::ThreadPool;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    /// Trunk layers (block_count minus any multi-token-prediction layers).
    n_layer: usize,
    n_vocab: usize,
    n_expert: usize,
    n_expert_used: usize,
    n_ff_exp: usize,
    n_ff_shexp: usize,
    attn: AttnParams,
    delta: DeltaParams,
    /// Which layers are DeltaNet (the others are full attention).
    recurrent: Vec<bool>,
    eps: f32,
    norm_weights: bool,
    weights_scale: f32,
}

impl Hparams {
    fn read(m: &Meta, n_vocab: usize) -> Result<Hparams> {
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let n_blocks = m.nonzero(Key::BlockCount)?;
        // Multi-token-prediction blocks follow the trunk; generation does not run them.
        let n_nextn = m.usize_or(Key::NextnPredictLayers, 0)?;
        m.ensure(Key::NextnPredictLayers, n_nextn < n_blocks, "leaves no trunk layers")?;
        let n_layer = n_blocks - n_nextn;
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv_head = m.usize_or(Key::HeadCountKv, n_head)?;
        m.ensure(Key::HeadCountKv, n_kv_head > 0 && n_head % n_kv_head == 0, "must divide head_count")?;
        let head_dim = m.nonzero(Key::KeyLength)?;
        m.ensure(Key::ValueLength, m.usize_or(Key::ValueLength, head_dim)? == head_dim, "must equal key_length")?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even and <= head dim")?;
        // Multimodal RoPE sections: for text every section sees the same
        // position, which makes the rotation an ordinary NeoX one over n_rot dims.
        if let Some(sections) = m.ints(Key::RopeDimensionSections)? {
            let total: i64 = sections.iter().sum();
            m.ensure(
                Key::RopeDimensionSections,
                sections.iter().all(|&s| s >= 0) && total as usize <= n_rot / 2,
                "sections exceed the rotary dims",
            )?;
        }
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?;
        let n_expert = m.nonzero(Key::ExpertCount)?;
        let n_expert_used = m.nonzero(Key::ExpertUsedCount)?;
        let n_ff_exp = m.nonzero(Key::ExpertFeedForwardLength)?;
        let n_ff_shexp = m.usize_or(Key::ExpertSharedFeedForwardLength, n_ff_exp)?;
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
            n_embd,
            n_layer,
            n_vocab,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
            attn: AttnParams {
                n_head,
                n_kv_head,
                head_dim,
                head_dim_v: head_dim,
                rope: Rope {
                    n_rot,
                    base: m.f32_or(Key::RopeFreqBase, 10_000_000.0)?,
                    scale: m.rope_freq_scale()?,
                    neox: true,
                },
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: None,
                eps,
            },
            delta: DeltaParams { n_k_heads, n_v_heads, d_k, d_v: d_inner / n_v_heads, d_conv, eps },
            recurrent,
            eps,
            norm_weights: m.bool_or(Key::ExpertWeightsNorm, true)?,
            weights_scale: m.f32_or(Key::ExpertWeightsScale, 1.0)?,
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

enum Mixer {
    /// q|k|v [2*d_k*Hk + d_v*Hv, n_embd], z [d_v*Hv, n_embd], beta/alpha [Hv, n_embd], out [n_embd, d_v*Hv]
    Delta(DeltaWeights),
    /// q+gate [2*n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd], q/k norm [hd]
    Attention(AttnWeights),
}

struct Layer {
    attn_norm: Vec<f32>, // [n_embd]
    mixer: Mixer,
    post_norm: Vec<f32>, // [n_embd] (the pre-FFN norm)
    moe: Moe,            // router [n_expert, n_embd]; experts [n_expert][n_ff, n_embd] / [n_embd, n_ff]; shared expert
}

pub struct Qwen35Moe {
    hp: Hparams,
    token_embd: Matrix, // [n_vocab, n_embd]
    layers: Vec<Layer>,
    head: Head,
}

impl Qwen35Moe {
    pub fn load(file: &GgufFile) -> Result<Qwen35Moe> {
        let ld = Loader::new(file);
        let m = Meta::new(file, Arch::Qwen35Moe.name());
        let embd_name = TensorKind::TokenEmbd.weight(0);
        let n_vocab = file.tensor(&embd_name).ok_or(Error::MissingTensor(embd_name))?.dims[1] as usize;
        let hp = Hparams::read(&m, n_vocab)?;
        let e = hp.n_embd;
        let token_embd = ld.matrix(TensorKind::TokenEmbd, 0, n_vocab, e)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let mixer = if hp.recurrent[il] {
                Mixer::Delta(DeltaWeights::load(&ld, il, e, &hp.delta)?)
            } else {
                Mixer::Attention(AttnWeights::load(&ld, il, e, &hp.attn, true)?)
            };
            let mut moe = Moe::load(
                &ld,
                il,
                e,
                hp.n_ff_exp,
                hp.n_expert,
                hp.n_expert_used,
                Gating::from_meta(&m, Gating::Softmax)?,
                hp.norm_weights,
                hp.weights_scale,
            )?;
            if ld.has(TensorKind::FfnUpShexp, il) {
                let gate_name = TensorKind::FfnGateInpShexp.weight(il);
                // Stored as [n_embd] or [n_embd, 1].
                let gate_inp = match file.tensor(&gate_name).map(|t| t.n_dims) {
                    Some(1) => Some(ld.vector_shaped(&gate_name, &[e as u64])?),
                    Some(_) => Some(ld.vector_shaped(&gate_name, &[e as u64, 1])?),
                    None => None,
                };
                moe.shared = Some(SharedExpert {
                    ffn: Dense {
                        gate: ld.matrix(TensorKind::FfnGateShexp, il, hp.n_ff_shexp, e)?,
                        up: ld.matrix(TensorKind::FfnUpShexp, il, hp.n_ff_shexp, e)?,
                        down: ld.matrix(TensorKind::FfnDownShexp, il, e, hp.n_ff_shexp)?,
                    },
                    gate_inp,
                });
            }
            layers.push(Layer {
                attn_norm: ld.vector(TensorKind::AttnNorm, il, e)?,
                mixer,
                post_norm: ld.vector(TensorKind::AttnPostNorm, il, e)?,
                moe,
            });
        }
        let output = ld.matrix_opt(TensorKind::Output, 0, n_vocab, e)?.unwrap_or_else(|| token_embd.clone());
        let head = Head { norm: ld.vector(TensorKind::OutputNorm, 0, e)?, output, eps: hp.eps, softcap: None };
        Ok(Qwen35Moe { hp, token_embd, layers, head })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Qwen35Moe {
    fn arch(&self) -> Arch {
        Arch::Qwen35Moe
    }

    fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    fn experts(&self) -> Vec<(usize, &Experts)> {
        let moe = self.layers.iter().enumerate().map(|(il, l)| (il, &l.moe));
        moe.flat_map(|(il, m)| [(il, &m.gate), (il, &m.up), (il, &m.down)]).collect()
    }

    fn new_layers(&self, n_ctx: usize, kv: KvType) -> Result<Vec<LayerState>> {
        let a = &self.hp.attn;
        self.hp
            .recurrent
            .iter()
            .map(|&rec| {
                Ok(if rec {
                    LayerState::Recurrent(DeltaState::new(&self.hp.delta))
                } else {
                    LayerState::Attention(KvCache::new(kv, a.n_kv_head, a.head_dim, a.head_dim_v, n_ctx)?)
                })
            })
            .collect()
    }

    fn forward(&self, file: &[u8], pool: &ThreadPool, state: &mut State, tokens: &[u32], want: Logits) -> Result<()> {
        let (n, e, pos0, eps) = (tokens.len(), self.hp.n_embd, state.n_past, self.hp.eps);
        let s = &mut state.scratch;
        // x = embedding rows of the tokens
        embed(file, &self.token_embd, tokens, take(&mut s.x, n * e));

        for (il, layer) in self.layers.iter().enumerate() {
            // x += Mixer(RMSNorm(x))   (DeltaNet or gated attention)
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.attn_norm, eps, e);
            match (&layer.mixer, &mut state.layers[il]) {
                (Mixer::Delta(w), LayerState::Recurrent(st)) => {
                    deltanet::forward(file, pool, &self.hp.delta, w, st, n, e, s)
                }
                (Mixer::Attention(w), LayerState::Attention(cache)) => {
                    attention::forward(file, pool, &self.hp.attn, w, cache, pos0, n, e, s)
                }
                _ => return Err(Error::InvalidArgument("state does not belong to this model".into())),
            }
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
            // x += MoE(RMSNorm(x)) with the gated shared expert
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.post_norm, eps, e);
            layer.moe.forward(file, pool, n, s, state.trace.as_mut());
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
        }
        // logits = Output · RMSNorm(x)
        self.head.forward(file, pool, state, n, want);
        Ok(())
    }
}
