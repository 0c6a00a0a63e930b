//! The shapes the backend interface speaks of: one attention layer's and
//! one DeltaNet layer's parameters, read from a file's keys. The blocks
//! ([`super::blocks`]) build on them; the operations of [`super::pass`] take
//! them.

use super::cache::{KvCache, KvType};
use super::hparams::Meta;
use crate::error::Result;
use crate::gguf::Key;

/// How positions rotate queries and keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Dimensions rotated at the start of each head (partial rotary when < head_dim).
    pub n_rot: usize,
    pub base: f32,
    /// 1 / linear scaling factor.
    pub scale: f32,
    /// NeoX pairs (i, i + n_rot/2) rather than adjacent pairs (2i, 2i+1).
    pub neox: bool,
}

/// Shape and behaviour of one attention layer.
#[derive(Clone, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub rope: Rope,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// Attend only to the last `window` positions (including the current one).
    pub window: Option<usize>,
    /// Epsilon of the per-head QK RMSNorm.
    pub eps: f32,
}

impl AttnParams {
    /// The attention keys of `m`: heads, head sizes, RoPE (with `rope_base`
    /// when the file gives none; NeoX or adjacent pairs as the architecture
    /// rotates), and the QK-norm epsilon.
    pub fn read(m: &Meta, rope_base: f32, neox: bool, eps: f32) -> Result<AttnParams> {
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let n_head = m.nonzero(Key::HeadCount)?;
        let n_kv_head = m.usize_or(Key::HeadCountKv, n_head)?;
        m.ensure(Key::HeadCountKv, n_kv_head > 0 && n_head % n_kv_head == 0, "must divide head_count")?;
        let head_dim = m.usize_or(Key::KeyLength, n_embd / n_head)?;
        let head_dim_v = m.usize_or(Key::ValueLength, head_dim)?;
        let n_rot = m.usize_or(Key::RopeDimensionCount, head_dim)?;
        m.ensure(Key::RopeDimensionCount, n_rot <= head_dim && n_rot % 2 == 0, "must be even and <= head dim")?;
        Ok(AttnParams {
            n_head,
            n_kv_head,
            head_dim,
            head_dim_v,
            rope: Rope { n_rot, base: m.f32_or(Key::RopeFreqBase, rope_base)?, scale: m.rope_freq_scale()?, neox },
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            eps,
        })
    }

    /// The KV cache of one such layer for `n_ctx` positions.
    pub fn new_cache(&self, kv: KvType, n_ctx: usize) -> Result<KvCache> {
        KvCache::new(kv, self.n_kv_head, self.head_dim, self.head_dim_v, n_ctx)
    }
}

/// Shape of a DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub struct DeltaParams {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Key (and query) head size.
    pub d_k: usize,
    /// Value head size.
    pub d_v: usize,
    /// Conv kernel width (4).
    pub d_conv: usize,
    pub eps: f32,
}

impl DeltaParams {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.d_k
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }
    /// Channels of q|k|v that pass through the conv.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Floats of recurrent state per layer (conv window + delta states).
    pub fn state_floats(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim() + self.n_v_heads * self.d_k * self.d_v
    }
}
