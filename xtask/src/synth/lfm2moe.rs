//! LFM2-MoE's shapes for `synth-model --arch lfm2moe`: LFM2-8B-A1B (`full`)
//! and a 4-layer `mid` cut for emulation. Keys and tensors as llama.cpp's
//! converter (conversion/lfm2.py `LFM2MoeModel`) writes them, checked
//! against the `lfm2moe-tiny` fixture: gated short-convolution layers with
//! attention layers among them (`head_count_kv` 0 marks a convolution),
//! taps stored `[l_cache, n_embd]`; the first `leading_dense_block_count`
//! layers end in a dense SwiGLU, the others in a sigmoid-routed MoE with a
//! selection bias (`exp_probs_b.bias`); the final norm is `token_embd_norm`
//! and the output head is tied to the embedding.

use pocket_core::gguf::{Array, GgufWriter, TensorKind, Value};
use pocket_core::quantize::mix::ModelShape;

use super::blocks::Fill;
use super::{Planned, EMBD_GAIN};

/// The shape of an LFM2-MoE model.
pub struct Lfm2Moe {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// KV heads of the attention layers.
    pub n_kv_head: usize,
    /// Which layers are attention (the others short convolutions); indices
    /// beyond `n_layer` are ignored, so a cut keeps the real pattern's start.
    pub attn_layers: &'static [usize],
    /// Taps of the short convolution.
    pub l_cache: usize,
    /// Layers `0..n_dense` end in a dense FFN of width `n_ff`.
    pub n_dense: usize,
    pub n_ff: usize,
    /// Routed experts, experts per token, expert width.
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub rope_base: f32,
}

impl Lfm2Moe {
    /// LFM2-8B-A1B (LiquidAI/LFM2-8B-A1B's config.json): 24 layers, 6 of
    /// them attention (`layer_types`), 32 heads / 8 KV heads of 64, conv
    /// L_cache 3, 2 dense layers (ff 7168), 32 experts top-4 (ff 1792).
    pub fn full() -> Lfm2Moe {
        Lfm2Moe {
            n_layer: 24,
            n_embd: 2048,
            n_head: 32,
            n_kv_head: 8,
            attn_layers: &[2, 6, 10, 14, 18, 21],
            l_cache: 3,
            n_dense: 2,
            n_ff: 7168,
            n_expert: 32,
            n_used: 4,
            n_ff_exp: 1792,
            n_vocab: 65_536,
            n_ctx: 128_000,
            rope_base: 1_000_000.0,
        }
    }

    /// The 8B-A1B shape cut down for emulation: its first 4 layers (two dense
    /// convolutions, a MoE attention layer, a MoE convolution), 16 experts, vocab 4096.
    pub fn mid() -> Lfm2Moe {
        Lfm2Moe { n_layer: 4, n_expert: 16, n_vocab: 4096, ..Lfm2Moe::full() }
    }

    fn is_attention(&self, il: usize) -> bool {
        self.attn_layers.contains(&il)
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            arch: "lfm2moe".into(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            // llama.cpp's quantiser reads layer 0's, a convolution's: no KV heads.
            n_gqa: if self.is_attention(0) { self.n_head / self.n_kv_head } else { 0 },
            is_70b: false,
        }
    }

    /// The architecture's keys (the tokenizer's aside).
    pub fn keys(&self, w: &mut GgufWriter) {
        let k = |s: &str| format!("lfm2moe.{s}");
        let u = |v: usize| Value::U32(v as u32);
        let kv: Vec<i32> =
            (0..self.n_layer).map(|il| if self.is_attention(il) { self.n_kv_head as i32 } else { 0 }).collect();
        w.kv(&k("block_count"), u(self.n_layer))
            .kv(&k("context_length"), u(self.n_ctx))
            .kv(&k("embedding_length"), u(self.n_embd))
            .kv(&k("feed_forward_length"), u(self.n_ff))
            .kv(&k("attention.head_count"), u(self.n_head))
            .kv(&k("attention.head_count_kv"), Value::Array(Array::I32(kv)))
            .kv(&k("rope.freq_base"), Value::F32(self.rope_base))
            .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
            .kv(&k("expert_count"), u(self.n_expert))
            .kv(&k("expert_used_count"), u(self.n_used))
            .kv(&k("expert_feed_forward_length"), u(self.n_ff_exp))
            .kv(&k("leading_dense_block_count"), u(self.n_dense))
            // 2: sigmoid
            .kv(&k("expert_gating_func"), u(2))
            .kv(&k("vocab_size"), u(self.n_vocab))
            .kv(&k("shortconv.l_cache"), u(self.l_cache));
    }

    /// Every tensor, in the converter's order.
    pub fn plan(&self) -> Vec<Planned> {
        let e = self.n_embd as u64;
        let mut t = Vec::new();
        let mut add = |name: String, dims: &[u64], fill| t.push(Planned { name, dims: dims.to_vec(), fill });
        add(TensorKind::TokenEmbd.weight(0), &[e, self.n_vocab as u64], Fill::Loud(EMBD_GAIN));
        add(TensorKind::TokenEmbdNorm.weight(0), &[e], Fill::Const(1.0));
        let hd = (self.n_embd / self.n_head) as u64;
        let kv = self.n_kv_head as u64 * hd;
        for il in 0..self.n_layer {
            let w = |k: TensorKind| k.weight(il);
            if !self.is_attention(il) {
                add(w(TensorKind::ShortConvConv), &[self.l_cache as u64, e], Fill::Range(-0.3, 0.3));
                add(w(TensorKind::ShortConvInProj), &[e, 3 * e], Fill::Random);
                add(w(TensorKind::ShortConvOutProj), &[e, e], Fill::Random);
            }
            if il < self.n_dense {
                let ff = self.n_ff as u64;
                add(w(TensorKind::FfnGate), &[e, ff], Fill::Random);
                add(w(TensorKind::FfnDown), &[ff, e], Fill::Random);
                add(w(TensorKind::FfnUp), &[e, ff], Fill::Random);
            } else {
                let (ff, ne) = (self.n_ff_exp as u64, self.n_expert as u64);
                // Small next to the sigmoid scores' spread: it nudges the choice, as a trained bias does.
                add(TensorKind::FfnExpProbsB.bias(il), &[ne], Fill::Range(-0.02, 0.02));
                add(w(TensorKind::FfnGateExps), &[e, ff, ne], Fill::Random);
                add(w(TensorKind::FfnDownExps), &[ff, e, ne], Fill::Random);
                add(w(TensorKind::FfnUpExps), &[e, ff, ne], Fill::Random);
                add(w(TensorKind::FfnGateInp), &[e, ne], Fill::Range(-0.05, 0.05));
            }
            add(w(TensorKind::FfnNorm), &[e], Fill::Const(1.0));
            add(w(TensorKind::AttnNorm), &[e], Fill::Const(1.0));
            if self.is_attention(il) {
                add(w(TensorKind::AttnKNorm), &[hd], Fill::Const(1.0));
                add(w(TensorKind::AttnK), &[e, kv], Fill::Random);
                add(w(TensorKind::AttnOut), &[e, e], Fill::Random);
                add(w(TensorKind::AttnQNorm), &[hd], Fill::Const(1.0));
                add(w(TensorKind::AttnQ), &[e, e], Fill::Random);
                add(w(TensorKind::AttnV), &[e, kv], Fill::Random);
            }
        }
        t
    }
}
