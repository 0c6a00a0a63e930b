//! Gemma 4's shapes for `synth-model --arch gemma4`: the 26B-A4B MoE
//! (`full`, and a 4-layer `mid` cut for emulation) and the E2B phone model
//! (`e2b`: per-layer input embeddings, KV-shared layers with a double-wide
//! MLP). Keys and tensors as llama.cpp's converter writes them (checked
//! against the `gemma4-*-tiny` fixtures): sliding layers every five of six
//! (four of five on E2B), global layers with the larger head, fewer KV
//! heads, a quarter of it rotated (`rope_freqs` 1e30 beyond), and K = V on
//! the MoE model's global layers (no `attn_v`).

use pocket_core::gguf::{Array, GgufWriter, Value};
use pocket_core::quantize::mix::ModelShape;

use super::blocks::Fill;
use super::{Planned, EMBD_GAIN};

/// The shape of a Gemma 4 model.
pub struct Gemma4 {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// KV heads of the sliding and of the global layers.
    pub n_kv_swa: usize,
    pub n_kv_full: usize,
    /// Head sizes of the sliding and of the global layers.
    pub hd_swa: usize,
    pub hd_full: usize,
    /// One layer in `period` is global (the last of each run).
    pub period: usize,
    pub window: usize,
    /// Dense MLP width (doubled in the KV-shared layers when `double_wide`).
    pub n_ff: usize,
    pub double_wide: bool,
    /// Routed experts, experts per token, expert width (0 experts: dense).
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    /// Global layers have no V projection (V = normed K).
    pub k_eq_v: bool,
    /// The last layers that read an earlier layer's KV cache.
    pub shared_kv: usize,
    /// Per-layer input width (0: none).
    pub n_ple: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
}

impl Gemma4 {
    /// Gemma 4 26B-A4B (google/gemma-4-26B-A4B-it's text config).
    pub fn full() -> Gemma4 {
        Gemma4 {
            n_layer: 30,
            n_embd: 2816,
            n_head: 16,
            n_kv_swa: 8,
            n_kv_full: 2,
            hd_swa: 256,
            hd_full: 512,
            period: 6,
            window: 1024,
            n_ff: 2112,
            double_wide: false,
            n_expert: 128,
            n_used: 8,
            n_ff_exp: 704,
            k_eq_v: true,
            shared_kv: 0,
            n_ple: 0,
            n_vocab: 262_144,
            n_ctx: 262_144,
        }
    }

    /// The 26B-A4B shape cut down for emulation: 6 layers (one global), 32 experts, vocab 4096.
    pub fn mid() -> Gemma4 {
        Gemma4 { n_layer: 6, n_expert: 32, n_vocab: 4096, ..Gemma4::full() }
    }

    /// Gemma 4 E2B (google/gemma-4-E2B-it's text config).
    pub fn e2b() -> Gemma4 {
        Gemma4 {
            n_layer: 35,
            n_embd: 1536,
            n_head: 8,
            n_kv_swa: 1,
            n_kv_full: 1,
            hd_swa: 256,
            hd_full: 512,
            period: 5,
            window: 512,
            n_ff: 6144,
            double_wide: true,
            n_expert: 0,
            n_used: 0,
            n_ff_exp: 0,
            k_eq_v: false,
            shared_kv: 20,
            n_ple: 256,
            n_vocab: 262_144,
            n_ctx: 131_072,
        }
    }

    fn is_swa(&self, il: usize) -> bool {
        !(il + 1).is_multiple_of(self.period)
    }

    /// Whether layer `il` reads an earlier layer's KV cache (no K or V of its own).
    fn is_shared(&self, il: usize) -> bool {
        il >= self.n_layer - self.shared_kv
    }

    fn n_ff_of(&self, il: usize) -> usize {
        if self.double_wide && self.is_shared(il) {
            2 * self.n_ff
        } else {
            self.n_ff
        }
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            arch: "gemma4".into(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            n_gqa: self.n_head / self.n_kv_swa,
            is_70b: false,
        }
    }

    /// The architecture's keys (the tokenizer's aside).
    pub fn keys(&self, w: &mut GgufWriter) {
        let k = |s: &str| format!("gemma4.{s}");
        let u = |v: usize| Value::U32(v as u32);
        let per_layer =
            |f: &dyn Fn(usize) -> usize| Value::Array(Array::I32((0..self.n_layer).map(|il| f(il) as i32).collect()));
        let kv = |il: usize| if self.is_swa(il) { self.n_kv_swa } else { self.n_kv_full };
        let swa: Vec<bool> = (0..self.n_layer).map(|il| self.is_swa(il)).collect();
        w.kv(&k("block_count"), u(self.n_layer))
            .kv(&k("context_length"), u(self.n_ctx))
            .kv(&k("embedding_length"), u(self.n_embd))
            .kv(&k("attention.head_count"), u(self.n_head))
            .kv(&k("attention.head_count_kv"), per_layer(&kv))
            .kv(&k("rope.freq_base"), Value::F32(1_000_000.0))
            .kv(&k("rope.freq_base_swa"), Value::F32(10_000.0))
            .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
            .kv(&k("attention.key_length"), u(self.hd_full))
            .kv(&k("attention.value_length"), u(self.hd_full))
            .kv(&k("attention.key_length_swa"), u(self.hd_swa))
            .kv(&k("attention.value_length_swa"), u(self.hd_swa))
            .kv(&k("rope.dimension_count"), u(self.hd_full))
            .kv(&k("rope.dimension_count_swa"), u(self.hd_swa))
            .kv(&k("final_logit_softcapping"), Value::F32(30.0))
            .kv(&k("attention.sliding_window"), u(self.window))
            .kv(&k("attention.sliding_window_pattern"), Value::Array(Array::Bool(swa)))
            .kv(&k("attention.shared_kv_layers"), u(self.shared_kv))
            .kv(&k("embedding_length_per_layer_input"), u(self.n_ple));
        if self.double_wide {
            w.kv(&k("feed_forward_length"), per_layer(&|il| self.n_ff_of(il)));
        } else {
            w.kv(&k("feed_forward_length"), u(self.n_ff));
        }
        if self.n_expert > 0 {
            w.kv(&k("expert_count"), u(self.n_expert))
                .kv(&k("expert_used_count"), u(self.n_used))
                .kv(&k("expert_feed_forward_length"), u(self.n_ff_exp));
        }
    }

    /// Every tensor, in the converter's order.
    pub fn plan(&self) -> Vec<Planned> {
        let e = self.n_embd as u64;
        let mut t = Vec::new();
        let mut add = |name: String, dims: &[u64], fill| t.push(Planned { name, dims: dims.to_vec(), fill });
        // A quarter of the global head rotated ("proportional" RoPE): factors 1 there, 1e30 beyond.
        let rotated = self.hd_full / 8;
        add("rope_freqs.weight".into(), &[self.hd_full as u64 / 2], Fill::Split(rotated, 1.0, 1e30));
        add("token_embd.weight".into(), &[e, self.n_vocab as u64], Fill::Loud(EMBD_GAIN));
        let all_ple = (self.n_ple * self.n_layer) as u64;
        if self.n_ple > 0 {
            add("per_layer_token_embd.weight".into(), &[all_ple, self.n_vocab as u64], Fill::Random);
        }
        for il in 0..self.n_layer {
            let w = |s: &str| format!("blk.{il}.{s}.weight");
            let (hd, nkv) = if self.is_swa(il) { (self.hd_swa, self.n_kv_swa) } else { (self.hd_full, self.n_kv_full) };
            let (q, kv) = ((self.n_head * hd) as u64, (nkv * hd) as u64);
            let ff = self.n_ff_of(il) as u64;
            add(w("attn_norm"), &[e], Fill::Const(1.0));
            add(w("layer_output_scale"), &[1], Fill::Const(1.0));
            if self.n_expert > 0 {
                let (fe, ne) = (self.n_ff_exp as u64, self.n_expert as u64);
                add(w("ffn_down_exps"), &[fe, e, ne], Fill::Random);
                add(w("ffn_gate_up_exps"), &[e, 2 * fe, ne], Fill::Random);
            }
            add(w("ffn_down"), &[ff, e], Fill::Random);
            add(w("ffn_gate"), &[e, ff], Fill::Random);
            add(w("ffn_up"), &[e, ff], Fill::Random);
            if self.n_ple > 0 {
                add(w("inp_gate"), &[e, self.n_ple as u64], Fill::Random);
                add(w("proj"), &[self.n_ple as u64, e], Fill::Random);
            }
            add(w("post_attention_norm"), &[e], Fill::Const(1.0));
            add(w("post_ffw_norm"), &[e], Fill::Const(1.0));
            if self.n_expert > 0 {
                add(w("post_ffw_norm_1"), &[e], Fill::Const(1.0));
                add(w("post_ffw_norm_2"), &[e], Fill::Const(1.0));
            }
            if self.n_ple > 0 {
                add(w("post_norm"), &[e], Fill::Const(1.0));
            }
            add(w("ffn_norm"), &[e], Fill::Const(1.0));
            if self.n_expert > 0 {
                let ne = self.n_expert as u64;
                add(w("pre_ffw_norm_2"), &[e], Fill::Const(1.0));
                add(format!("blk.{il}.ffn_down_exps.scale"), &[ne], Fill::Const(1.0));
                add(w("ffn_gate_inp"), &[e, ne], Fill::Range(-0.05, 0.05));
                add(format!("blk.{il}.ffn_gate_inp.scale"), &[e], Fill::Const(1.0));
            }
            if !self.is_shared(il) {
                add(w("attn_k_norm"), &[hd as u64], Fill::Const(1.0));
                add(w("attn_k"), &[e, kv], Fill::Random);
            }
            add(w("attn_output"), &[q, e], Fill::Random);
            add(w("attn_q_norm"), &[hd as u64], Fill::Const(1.0));
            add(w("attn_q"), &[e, q], Fill::Random);
            // V of its own: not a KV-shared layer, and not a global layer of a K = V model.
            let k_is_v = self.k_eq_v && !self.is_swa(il);
            if !self.is_shared(il) && !k_is_v {
                add(w("attn_v"), &[e, kv], Fill::Random);
            }
        }
        add("output_norm.weight".into(), &[e], Fill::Const(1.0));
        if self.n_ple > 0 {
            add("per_layer_model_proj.weight".into(), &[e, all_ple], Fill::Random);
            add("per_layer_proj_norm.weight".into(), &[self.n_ple as u64], Fill::Const(1.0));
        }
        t
    }
}
