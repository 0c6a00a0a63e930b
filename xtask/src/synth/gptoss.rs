//! gpt-oss's shapes for `synth-model --arch gpt-oss`: gpt-oss-20b (`full`),
//! a 4-layer `mid` cut for emulation, and the `tiny` test model. Keys and
//! tensors as llama.cpp's converter (conversion/gpt_oss.py) writes them:
//! biases on q/k/v/o, `attn_sinks`, `post_attention_norm` before the MoE,
//! a router bias, gate/up/down experts split from the checkpoint's fused
//! gate_up and each with a bias, YaRN keys (type, factor, original context,
//! beta fast/slow), the sliding window (every other layer by llama.cpp's
//! default pattern: the file carries no pattern key).

use pocket_core::gguf::{GgufWriter, Value};
use pocket_core::quantize::mix::ModelShape;

use super::blocks::Fill;
use super::{Planned, EMBD_GAIN};

/// The shape of a gpt-oss model.
pub struct GptOss {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    pub window: usize,
    pub rope_base: f32,
    /// YaRN: factor over the original context.
    pub yarn_factor: f32,
    pub n_ctx_orig: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    /// A test model: random norms, biases and sinks of real magnitude and
    /// an output head loud enough to make the logits peaked (the speed
    /// geometries keep checkpoint-like weights and unit norms).
    pub test: bool,
}

impl GptOss {
    /// gpt-oss-20b (openai/gpt-oss-20b's config.json).
    pub fn full() -> GptOss {
        GptOss {
            n_layer: 24,
            n_embd: 2880,
            n_head: 64,
            n_kv_head: 8,
            head_dim: 64,
            n_expert: 32,
            n_used: 4,
            n_ff_exp: 2880,
            window: 128,
            rope_base: 150_000.0,
            yarn_factor: 32.0,
            n_ctx_orig: 4096,
            n_vocab: 201_088,
            n_ctx: 131_072,
            test: false,
        }
    }

    /// The 20b shape cut down for emulation: 4 layers (2 sliding, 2 full), 16 experts, vocab 4096.
    pub fn mid() -> GptOss {
        GptOss { n_layer: 4, n_expert: 16, n_vocab: 4096, ..GptOss::full() }
    }

    /// The test model: 4 layers, 8 heads of 64 on 256 channels (heads wider
    /// than the model, as 20b's 64 x 64 on 2880), 2 KV heads, window 5,
    /// 8 experts top-3 of width 64, YaRN x4 over an original context of 32.
    pub fn tiny() -> GptOss {
        GptOss {
            n_layer: 4,
            n_embd: 256,
            n_head: 8,
            n_kv_head: 2,
            head_dim: 64,
            n_expert: 8,
            n_used: 3,
            n_ff_exp: 64,
            window: 5,
            rope_base: 10_000.0,
            yarn_factor: 4.0,
            n_ctx_orig: 32,
            n_vocab: 1024,
            n_ctx: 4096,
            test: true,
        }
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            arch: "gpt-oss".into(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            n_gqa: self.n_head / self.n_kv_head,
            is_70b: false,
        }
    }

    /// The architecture's keys (the tokenizer's aside).
    pub fn keys(&self, w: &mut GgufWriter) {
        let k = |s: &str| format!("gpt-oss.{s}");
        let u = |v: usize| Value::U32(v as u32);
        w.kv(&k("block_count"), u(self.n_layer))
            .kv(&k("context_length"), u(self.n_ctx))
            .kv(&k("embedding_length"), u(self.n_embd))
            .kv(&k("feed_forward_length"), u(self.n_ff_exp))
            .kv(&k("attention.head_count"), u(self.n_head))
            .kv(&k("attention.head_count_kv"), u(self.n_kv_head))
            .kv(&k("rope.freq_base"), Value::F32(self.rope_base))
            .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
            .kv(&k("expert_count"), u(self.n_expert))
            .kv(&k("expert_used_count"), u(self.n_used))
            .kv(&k("attention.key_length"), u(self.head_dim))
            .kv(&k("attention.value_length"), u(self.head_dim))
            .kv(&k("rope.scaling.type"), Value::String("yarn".into()))
            .kv(&k("rope.scaling.factor"), Value::F32(self.yarn_factor))
            .kv(&k("rope.scaling.original_context_length"), u(self.n_ctx_orig))
            .kv(&k("rope.scaling.yarn_beta_fast"), Value::F32(32.0))
            .kv(&k("rope.scaling.yarn_beta_slow"), Value::F32(1.0))
            .kv(&k("attention.sliding_window"), u(self.window))
            .kv(&k("expert_feed_forward_length"), u(self.n_ff_exp));
    }

    /// Every tensor, layer by layer.
    pub fn plan(&self) -> Vec<Planned> {
        let e = self.n_embd as u64;
        let (q, kv) = ((self.n_head * self.head_dim) as u64, (self.n_kv_head * self.head_dim) as u64);
        let (ff, ne) = (self.n_ff_exp as u64, self.n_expert as u64);
        // Test weights: norms and biases of visible size, the experts' gate
        // and up loud enough that the clamp at 7 bites, their down quiet.
        let t = self.test;
        let norm = if t { Fill::Range(0.6, 1.4) } else { Fill::Const(1.0) };
        let bias = |r: f32| if t { Fill::Range(-r, r) } else { Fill::Range(-0.02, 0.02) };
        let (gate_up, down) = if t { (Fill::Loud(40.0), Fill::Loud(0.1)) } else { (Fill::Random, Fill::Random) };
        let mut p = Vec::new();
        let mut add = |name: String, dims: &[u64], fill| p.push(Planned { name, dims: dims.to_vec(), fill });
        let embd = if t { Fill::Random } else { Fill::Loud(EMBD_GAIN) };
        add("token_embd.weight".into(), &[e, self.n_vocab as u64], embd);
        for il in 0..self.n_layer {
            let w = |s: &str| format!("blk.{il}.{s}.weight");
            let b = |s: &str| format!("blk.{il}.{s}.bias");
            add(w("attn_norm"), &[e], norm);
            add(w("attn_q"), &[e, q], Fill::Random);
            add(b("attn_q"), &[q], bias(0.5));
            add(w("attn_k"), &[e, kv], Fill::Random);
            add(b("attn_k"), &[kv], bias(0.5));
            add(w("attn_v"), &[e, kv], Fill::Random);
            add(b("attn_v"), &[kv], bias(0.5));
            add(w("attn_output"), &[q, e], Fill::Random);
            add(b("attn_output"), &[e], bias(0.02));
            add(w("attn_sinks"), &[self.n_head as u64], if t { Fill::Range(-1.0, 2.0) } else { Fill::Const(0.0) });
            add(w("post_attention_norm"), &[e], norm);
            add(w("ffn_gate_inp"), &[e, ne], Fill::Range(-0.05, 0.05));
            add(b("ffn_gate_inp"), &[ne], bias(0.5));
            add(w("ffn_gate_exps"), &[e, ff, ne], gate_up);
            add(b("ffn_gate_exps"), &[ff, ne], bias(2.0));
            add(w("ffn_up_exps"), &[e, ff, ne], gate_up);
            add(b("ffn_up_exps"), &[ff, ne], bias(2.0));
            add(w("ffn_down_exps"), &[ff, e, ne], down);
            add(b("ffn_down_exps"), &[e, ne], bias(0.02));
        }
        add("output_norm.weight".into(), &[e], norm);
        add("output.weight".into(), &[e, self.n_vocab as u64], if t { Fill::Loud(10.0) } else { Fill::Random });
        p
    }
}
