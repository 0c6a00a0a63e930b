//! OLMoE's shapes for `synth-model --arch olmoe`: OLMoE-1B-7B (`full`) and
//! a `tiny` file for the logits test against llama.cpp. Keys and tensors
//! as llama.cpp's converter writes them (`OlmoeModel`): the experts' width
//! is `feed_forward_length`, q/k norms span the whole projections
//! (`[n_embd]`; llama.cpp loads k's as `[n_embd]` too, so KV heads = heads).

use pocket_core::gguf::{GgufWriter, TensorKind, Value};
use pocket_core::quantize::mix::ModelShape;

use super::blocks::Fill;
use super::Planned;

/// The shape of an OLMoE model.
pub struct Olmoe {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_expert: usize,
    pub n_used: usize,
    /// Each expert's hidden size (`feed_forward_length`).
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub rope_base: f32,
    pub eps: f32,
}

impl Olmoe {
    /// OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924's config.json).
    pub fn full() -> Olmoe {
        Olmoe {
            n_layer: 16,
            n_embd: 2048,
            n_head: 16,
            n_expert: 64,
            n_used: 8,
            n_ff: 1024,
            n_vocab: 50_304,
            n_ctx: 4096,
            rope_base: 10_000.0,
            eps: 1e-5,
        }
    }

    /// 3 layers of 256, 4 heads of 64, 8 experts of 128 (3 per token),
    /// vocab 1024: every mechanism, small enough to commit its logits.
    pub fn tiny() -> Olmoe {
        Olmoe {
            n_layer: 3,
            n_embd: 256,
            n_head: 4,
            n_expert: 8,
            n_used: 3,
            n_ff: 128,
            n_vocab: 1024,
            n_ctx: 512,
            rope_base: 50_000.0,
            eps: 2e-5,
        }
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape { arch: "olmoe".into(), n_layer: self.n_layer, n_expert: self.n_expert, n_gqa: 1, is_70b: false }
    }

    /// The architecture's keys (the tokenizer's aside).
    pub fn keys(&self, w: &mut GgufWriter) {
        let k = |s: &str| format!("olmoe.{s}");
        let u = |v: usize| Value::U32(v as u32);
        w.kv(&k("block_count"), u(self.n_layer))
            .kv(&k("context_length"), u(self.n_ctx))
            .kv(&k("embedding_length"), u(self.n_embd))
            .kv(&k("feed_forward_length"), u(self.n_ff))
            .kv(&k("attention.head_count"), u(self.n_head))
            .kv(&k("attention.head_count_kv"), u(self.n_head))
            .kv(&k("rope.freq_base"), Value::F32(self.rope_base))
            .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(self.eps))
            .kv(&k("expert_count"), u(self.n_expert))
            .kv(&k("expert_used_count"), u(self.n_used));
    }

    /// Every tensor. The norms are not 1 (a whole-projection q/k norm must
    /// not be confused with a per-head one), the router is decisive and the
    /// experts and head loud enough for routing mistakes to show in the logits.
    pub fn plan(&self) -> Vec<Planned> {
        let (e, ne, ff) = (self.n_embd as u64, self.n_expert as u64, self.n_ff as u64);
        let mut t = Vec::new();
        let mut add = |name: String, dims: &[u64], fill| t.push(Planned { name, dims: dims.to_vec(), fill });
        add(TensorKind::TokenEmbd.weight(0), &[e, self.n_vocab as u64], Fill::Loud(4.0));
        for il in 0..self.n_layer {
            let w = |k: TensorKind| k.weight(il);
            add(w(TensorKind::AttnNorm), &[e], Fill::Range(0.5, 1.5));
            add(w(TensorKind::AttnQ), &[e, e], Fill::Random);
            add(w(TensorKind::AttnK), &[e, e], Fill::Random);
            add(w(TensorKind::AttnV), &[e, e], Fill::Random);
            add(w(TensorKind::AttnOut), &[e, e], Fill::Loud(3.0));
            add(w(TensorKind::AttnQNorm), &[e], Fill::Range(0.2, 2.0));
            add(w(TensorKind::AttnKNorm), &[e], Fill::Range(0.2, 2.0));
            add(w(TensorKind::FfnNorm), &[e], Fill::Range(0.5, 1.5));
            add(w(TensorKind::FfnGateInp), &[e, ne], Fill::Range(-0.3, 0.3));
            add(w(TensorKind::FfnGateExps), &[e, ff, ne], Fill::Loud(3.0));
            add(w(TensorKind::FfnUpExps), &[e, ff, ne], Fill::Loud(3.0));
            add(w(TensorKind::FfnDownExps), &[ff, e, ne], Fill::Loud(3.0));
        }
        add(TensorKind::OutputNorm.weight(0), &[e], Fill::Range(0.5, 1.5));
        add(TensorKind::Output.weight(0), &[e, self.n_vocab as u64], Fill::Loud(10.0));
        t
    }
}
