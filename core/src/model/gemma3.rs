//! Gemma 3 (`gemma3`): interleaved sliding-window (local) and global
//! attention layers, QK-norm, pre- and post-norms around both blocks, GeGLU
//! FFN, embeddings scaled by sqrt(n_embd), tied output head.
//!
//! Norm weights are used as stored: the GGUF converter already folded
//! Gemma's `1 + w` convention into them.

use super::attention::{self, AttnParams, AttnWeights, Rope};
use super::cache::{KvCache, KvType, Logits};
use super::ffn::{Act, Dense};
use super::hparams::Meta;
use super::scratch::take;
use super::weights::{Loader, Matrix};
use super::{embed, norm_rows, Head, LayerState, Network, State};
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;
use crate::threads::ThreadPool;

/// Every `SWA_PATTERN`-th layer is global, the others slide (Gemma 3's 5:1).
const SWA_PATTERN: usize = 6;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    n_layer: usize,
    n_vocab: usize,
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
    fn read(m: &Meta, n_vocab: usize) -> Result<Hparams> {
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv_head = m.usize_or(Key::HeadCountKv, n_head)?;
        m.ensure(Key::HeadCountKv, n_kv_head > 0 && n_head % n_kv_head == 0, "must divide head_count")?;
        let head_dim = m.usize_or(Key::KeyLength, n_embd / n_head)?;
        let head_dim_v = m.usize_or(Key::ValueLength, head_dim)?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even and <= head dim")?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?;
        let window = m.usize_or(Key::SlidingWindow, 0)?;
        // Query scaling: 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim), as the reference does below 27B.
        let global = AttnParams {
            n_head,
            n_kv_head,
            head_dim,
            head_dim_v,
            rope: Rope { n_rot, base: m.f32_or(Key::RopeFreqBase, 10_000.0)?, scale: m.rope_freq_scale()?, neox: true },
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            eps,
        };
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
            n_embd,
            n_layer,
            n_vocab,
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
    attn_norm: Vec<f32>,      // [n_embd]
    attn: AttnWeights,        // q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd], q/k norm [hd]
    attn_post_norm: Vec<f32>, // [n_embd]
    ffn_norm: Vec<f32>,       // [n_embd]
    ffn: Dense,               // gate/up [n_ff, n_embd], down [n_embd, n_ff]
    ffn_post_norm: Vec<f32>,  // [n_embd]
}

pub struct Gemma3 {
    hp: Hparams,
    token_embd: Matrix, // [n_vocab, n_embd]
    layers: Vec<Layer>,
    head: Head,
}

impl Gemma3 {
    pub fn load(file: &GgufFile) -> Result<Gemma3> {
        let ld = Loader::new(file);
        let m = Meta::new(file, Arch::Gemma3.name());
        let embd_name = TensorKind::TokenEmbd.weight(0);
        let n_vocab = file.tensor(&embd_name).ok_or(Error::MissingTensor(embd_name))?.dims[1] as usize;
        let hp = Hparams::read(&m, n_vocab)?;
        let e = hp.n_embd;
        let token_embd = ld.matrix(TensorKind::TokenEmbd, 0, n_vocab, e)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            layers.push(Layer {
                attn_norm: ld.vector(TensorKind::AttnNorm, il, e)?,
                attn: AttnWeights::load(&ld, il, e, &hp.global, false)?,
                attn_post_norm: ld.vector(TensorKind::AttnPostNorm, il, e)?,
                ffn_norm: ld.vector(TensorKind::FfnNorm, il, e)?,
                ffn: Dense::load(&ld, il, e, hp.n_ff)?,
                ffn_post_norm: ld.vector(TensorKind::FfnPostNorm, il, e)?,
            });
        }
        let output = ld.matrix_opt(TensorKind::Output, 0, n_vocab, e)?.unwrap_or_else(|| token_embd.clone());
        let head =
            Head { norm: ld.vector(TensorKind::OutputNorm, 0, e)?, output, eps: hp.eps, softcap: hp.final_softcap };
        Ok(Gemma3 { hp, token_embd, layers, head })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Gemma3 {
    fn arch(&self) -> Arch {
        Arch::Gemma3
    }

    fn n_vocab(&self) -> usize {
        self.hp.n_vocab
    }

    fn new_layers(&self, n_ctx: usize, kv: KvType) -> Result<Vec<LayerState>> {
        let a = &self.hp.global;
        (0..self.hp.n_layer)
            .map(|_| Ok(LayerState::Attention(KvCache::new(kv, a.n_kv_head, a.head_dim, a.head_dim_v, n_ctx)?)))
            .collect()
    }

    fn forward(&self, file: &[u8], pool: &ThreadPool, state: &mut State, tokens: &[u32], want: Logits) -> Result<()> {
        let (n, e, pos0, eps) = (tokens.len(), self.hp.n_embd, state.n_past, self.hp.eps);
        let s = &mut state.scratch;
        // x = embedding rows · sqrt(n_embd)
        let x = take(&mut s.x, n * e);
        embed(file, &self.token_embd, tokens, x);
        ops::scale(x, (e as f32).sqrt());

        for (il, layer) in self.layers.iter().enumerate() {
            let LayerState::Attention(cache) = &mut state.layers[il] else { unreachable!("attention layers only") };
            let p = if self.hp.is_local[il] { &self.hp.local } else { &self.hp.global };
            // x += PostNorm(Attention(PreNorm(x)))
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.attn_norm, eps, e);
            attention::forward(file, pool, p, &layer.attn, cache, pos0, n, e, s);
            norm_inplace(&mut s.out[..n * e], &layer.attn_post_norm, eps, e);
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
            // x += PostNorm(GeGLU(PreNorm(x)))
            norm_rows(&s.x[..n * e], take(&mut s.xn, n * e), &layer.ffn_norm, eps, e);
            layer.ffn.forward(file, pool, Act::GeluTanh, n, s);
            norm_inplace(&mut s.out[..n * e], &layer.ffn_post_norm, eps, e);
            ops::add(&mut s.x[..n * e], &s.out[..n * e]);
        }
        // logits = Output · RMSNorm(x)   (tied to the embedding table)
        self.head.forward(file, pool, state, n, want);
        Ok(())
    }
}

fn norm_inplace(x: &mut [f32], w: &[f32], eps: f32, n_embd: usize) {
    for r in x.chunks_exact_mut(n_embd) {
        ops::rms_norm_inplace(r, Some(w), eps);
    }
}
