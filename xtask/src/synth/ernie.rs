//! ERNIE-4.5-MoE's shapes for `synth-model --arch ernie4_5-moe`:
//! ERNIE-4.5-21B-A3B (`full`) and a `tiny` file for the logits test against
//! llama.cpp. Keys and tensors as llama.cpp's converter writes them
//! (`Ernie4_5MoeModel`): the selection bias `[n_expert, 1]` (the checkpoint's
//! `[1, n_expert]`), the shared expert `intermediate_size / num_key_value_heads`
//! wide, the head tied to the embedding. (llama.cpp loads experts for every
//! layer after the dense ones, so its files interleave with step 1.)

use pocket_core::gguf::{GgufWriter, TensorKind, Value};
use pocket_core::quantize::mix::ModelShape;

use super::blocks::Fill;
use super::Planned;

/// The shape of an ERNIE-4.5-MoE model.
pub struct Ernie {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Dense layers first (`moe_layer_start_index`).
    pub n_dense: usize,
    /// The dense FFN's width (`intermediate_size`).
    pub n_ff: usize,
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    pub n_shared: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub rope_base: f32,
    pub eps: f32,
}

impl Ernie {
    /// ERNIE-4.5-21B-A3B (baidu/ERNIE-4.5-21B-A3B-PT's config.json).
    pub fn full() -> Ernie {
        Ernie {
            n_layer: 28,
            n_embd: 2560,
            n_head: 20,
            n_kv_head: 4,
            head_dim: 128,
            n_dense: 1,
            n_ff: 12_288,
            n_expert: 64,
            n_used: 6,
            n_ff_exp: 1536,
            n_shared: 2,
            n_vocab: 103_424,
            n_ctx: 131_072,
            rope_base: 500_000.0,
            eps: 1e-5,
        }
    }

    /// 4 layers of 256 (one dense), 6 query heads of 64 (384 wide) over 2 KV
    /// heads, 8 experts of 96 (3 per token), a 192-wide shared expert, vocab 1024.
    pub fn tiny() -> Ernie {
        Ernie {
            n_layer: 4,
            n_embd: 256,
            n_head: 6,
            n_kv_head: 2,
            head_dim: 64,
            n_dense: 1,
            n_ff: 384,
            n_expert: 8,
            n_used: 3,
            n_ff_exp: 96,
            n_shared: 2,
            n_vocab: 1024,
            n_ctx: 512,
            rope_base: 50_000.0,
            eps: 2e-5,
        }
    }

    fn n_ff_shexp(&self) -> usize {
        self.n_ff / self.n_kv_head
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            arch: "ernie4_5-moe".into(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            n_gqa: self.n_head / self.n_kv_head,
            is_70b: false,
        }
    }

    /// The architecture's keys (the tokenizer's aside).
    pub fn keys(&self, w: &mut GgufWriter) {
        let k = |s: &str| format!("ernie4_5-moe.{s}");
        let u = |v: usize| Value::U32(v as u32);
        w.kv(&k("block_count"), u(self.n_layer))
            .kv(&k("context_length"), u(self.n_ctx))
            .kv(&k("embedding_length"), u(self.n_embd))
            .kv(&k("feed_forward_length"), u(self.n_ff))
            .kv(&k("attention.head_count"), u(self.n_head))
            .kv(&k("attention.head_count_kv"), u(self.n_kv_head))
            .kv(&k("rope.freq_base"), Value::F32(self.rope_base))
            .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(self.eps))
            .kv(&k("attention.key_length"), u(self.head_dim))
            .kv(&k("attention.value_length"), u(self.head_dim))
            .kv(&k("expert_count"), u(self.n_expert))
            .kv(&k("expert_used_count"), u(self.n_used))
            .kv(&k("interleave_moe_layer_step"), u(1))
            .kv(&k("leading_dense_block_count"), u(self.n_dense))
            .kv(&k("expert_feed_forward_length"), u(self.n_ff_exp))
            .kv(&k("expert_shared_count"), u(self.n_shared))
            .kv(&k("expert_shared_feed_forward_length"), u(self.n_ff_shexp()));
    }

    /// Every tensor. Norms not 1, a decisive router with a selection bias
    /// large enough to change choices, experts and head loud enough for
    /// routing mistakes to show in the logits.
    pub fn plan(&self) -> Vec<Planned> {
        let e = self.n_embd as u64;
        let (q, kv) = ((self.n_head * self.head_dim) as u64, (self.n_kv_head * self.head_dim) as u64);
        let (ne, fe, fs, ff) = (self.n_expert as u64, self.n_ff_exp as u64, self.n_ff_shexp() as u64, self.n_ff as u64);
        let mut t = Vec::new();
        let mut add = |name: String, dims: &[u64], fill| t.push(Planned { name, dims: dims.to_vec(), fill });
        add(TensorKind::TokenEmbd.weight(0), &[e, self.n_vocab as u64], Fill::Loud(10.0));
        for il in 0..self.n_layer {
            let w = |k: TensorKind| k.weight(il);
            add(w(TensorKind::AttnNorm), &[e], Fill::Range(0.5, 1.5));
            add(w(TensorKind::AttnQ), &[e, q], Fill::Random);
            add(w(TensorKind::AttnK), &[e, kv], Fill::Random);
            add(w(TensorKind::AttnV), &[e, kv], Fill::Random);
            add(w(TensorKind::AttnOut), &[q, e], Fill::Loud(3.0));
            add(w(TensorKind::FfnNorm), &[e], Fill::Range(0.5, 1.5));
            if il < self.n_dense {
                add(w(TensorKind::FfnGate), &[e, ff], Fill::Loud(2.0));
                add(w(TensorKind::FfnUp), &[e, ff], Fill::Loud(2.0));
                add(w(TensorKind::FfnDown), &[ff, e], Fill::Loud(2.0));
                continue;
            }
            add(w(TensorKind::FfnGateInp), &[e, ne], Fill::Range(-0.3, 0.3));
            add(TensorKind::FfnExpProbsB.bias(il), &[ne, 1], Fill::Range(0.0, 0.3));
            add(w(TensorKind::FfnGateExps), &[e, fe, ne], Fill::Loud(3.0));
            add(w(TensorKind::FfnUpExps), &[e, fe, ne], Fill::Loud(3.0));
            add(w(TensorKind::FfnDownExps), &[fe, e, ne], Fill::Loud(3.0));
            add(w(TensorKind::FfnGateShexp), &[e, fs], Fill::Loud(2.0));
            add(w(TensorKind::FfnUpShexp), &[e, fs], Fill::Loud(2.0));
            add(w(TensorKind::FfnDownShexp), &[fs, e], Fill::Loud(2.0));
        }
        add(TensorKind::OutputNorm.weight(0), &[e], Fill::Range(0.5, 1.5));
        t
    }
}
