//! Granite 4.0-H's shapes for `synth-model --arch granitehybrid`:
//! Granite-4.0-H-Tiny (`full`) and a 6-layer `mid` cut for emulation. Keys
//! and tensors as llama.cpp's converter (conversion/granite.py
//! `GraniteHybridModel`) writes them, checked against the
//! `granitehybrid-tiny` fixture: Mamba2 layers with a few NoPE attention
//! layers among them (`head_count_kv` 0 marks Mamba2; `rope.scaling.finetuned`
//! false, context 2^20), `ssm_a`/`ssm_d` as `[1, n_head]`, the gated norm as
//! `[d_inner / n_group, n_group]`; every layer ends in a softmax-routed MoE
//! plus an ungated shared expert; Granite's four multipliers; the output
//! head tied to the embedding.

use pocket_core::gguf::{Array, GgufWriter, TensorKind, Value};
use pocket_core::quantize::mix::ModelShape;

use super::blocks::Fill;
use super::{Planned, EMBD_GAIN};

/// The shape of a Granite 4.0-H MoE model.
pub struct GraniteHybrid {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// KV heads of the attention layers.
    pub n_kv_head: usize,
    /// Which layers are attention (the others Mamba2); indices beyond
    /// `n_layer` are ignored.
    pub attn_layers: &'static [usize],
    /// Mamba2: heads, head size (d_inner = heads * head size), B/C groups,
    /// state size, conv taps.
    pub ssm_heads: usize,
    pub ssm_head_dim: usize,
    pub ssm_groups: usize,
    pub ssm_state: usize,
    pub ssm_conv: usize,
    /// Routed experts, experts per token, expert width, shared expert width.
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub n_vocab: usize,
    /// Granite's multipliers.
    pub embedding_scale: f32,
    pub residual_scale: f32,
    pub attention_scale: f32,
    pub logit_scale: f32,
}

impl GraniteHybrid {
    /// Granite-4.0-H-Tiny (ibm-granite/granite-4.0-h-tiny's config.json): 40
    /// layers, attention at 5, 15, 25, 35 (`layer_types`), 12 heads / 4 KV
    /// heads of 128; Mamba2 48 heads of 64 (d_inner 3072), 1 group, state
    /// 128, conv 4; 64 experts top-6 (ff 512) + shared expert (ff 1024).
    pub fn full() -> GraniteHybrid {
        GraniteHybrid {
            n_layer: 40,
            n_embd: 1536,
            n_head: 12,
            n_kv_head: 4,
            attn_layers: &[5, 15, 25, 35],
            ssm_heads: 48,
            ssm_head_dim: 64,
            ssm_groups: 1,
            ssm_state: 128,
            ssm_conv: 4,
            n_expert: 64,
            n_used: 6,
            n_ff_exp: 512,
            n_ff_shexp: 1024,
            n_vocab: 100_352,
            embedding_scale: 12.0,
            residual_scale: 0.22,
            attention_scale: 0.0078125,
            logit_scale: 6.0,
        }
    }

    /// The H-Tiny shape cut down for emulation: its first 6 layers (five
    /// Mamba2, one attention), 16 experts, vocab 4096.
    pub fn mid() -> GraniteHybrid {
        GraniteHybrid { n_layer: 6, n_expert: 16, n_vocab: 4096, ..GraniteHybrid::full() }
    }

    fn is_attention(&self, il: usize) -> bool {
        self.attn_layers.contains(&il)
    }

    fn d_inner(&self) -> usize {
        self.ssm_heads * self.ssm_head_dim
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            arch: "granitehybrid".into(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            // llama.cpp's quantiser reads layer 0's, a Mamba2 layer's: no KV heads.
            n_gqa: if self.is_attention(0) { self.n_head / self.n_kv_head } else { 0 },
            is_70b: false,
        }
    }

    /// The architecture's keys (the tokenizer's aside).
    pub fn keys(&self, w: &mut GgufWriter) {
        let k = |s: &str| format!("granitehybrid.{s}");
        let u = |v: usize| Value::U32(v as u32);
        let kv: Vec<i32> =
            (0..self.n_layer).map(|il| if self.is_attention(il) { self.n_kv_head as i32 } else { 0 }).collect();
        w.kv(&k("block_count"), u(self.n_layer))
            // NoPE: the converter writes 2^20.
            .kv(&k("context_length"), u(1 << 20))
            .kv(&k("embedding_length"), u(self.n_embd))
            .kv(&k("feed_forward_length"), u(self.n_ff_exp))
            .kv(&k("attention.head_count"), u(self.n_head))
            .kv(&k("attention.head_count_kv"), Value::Array(Array::I32(kv)))
            .kv(&k("rope.freq_base"), Value::F32(10_000.0))
            .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
            .kv(&k("expert_count"), u(self.n_expert))
            .kv(&k("expert_used_count"), u(self.n_used))
            .kv(&k("vocab_size"), u(self.n_vocab))
            .kv(&k("rope.dimension_count"), u(self.n_embd / self.n_head))
            .kv(&k("attention.scale"), Value::F32(self.attention_scale))
            .kv(&k("embedding_scale"), Value::F32(self.embedding_scale))
            .kv(&k("residual_scale"), Value::F32(self.residual_scale))
            .kv(&k("logit_scale"), Value::F32(self.logit_scale))
            .kv(&k("expert_shared_feed_forward_length"), u(self.n_ff_shexp))
            .kv(&k("ssm.conv_kernel"), u(self.ssm_conv))
            .kv(&k("ssm.state_size"), u(self.ssm_state))
            .kv(&k("ssm.group_count"), u(self.ssm_groups))
            .kv(&k("ssm.inner_size"), u(self.d_inner()))
            .kv(&k("ssm.time_step_rank"), u(self.ssm_heads))
            .kv(&k("rope.scaling.finetuned"), Value::Bool(false));
    }

    /// Every tensor, in the converter's order.
    pub fn plan(&self) -> Vec<Planned> {
        let e = self.n_embd as u64;
        let mut t = Vec::new();
        let mut add = |name: String, dims: &[u64], fill| t.push(Planned { name, dims: dims.to_vec(), fill });
        add(TensorKind::TokenEmbd.weight(0), &[e, self.n_vocab as u64], Fill::Loud(EMBD_GAIN));
        let (ff, ne, fs) = (self.n_ff_exp as u64, self.n_expert as u64, self.n_ff_shexp as u64);
        let (di, nh, ng) = (self.d_inner() as u64, self.ssm_heads as u64, self.ssm_groups as u64);
        let conv = di + 2 * ng * self.ssm_state as u64;
        let hd = (self.n_embd / self.n_head) as u64;
        for il in 0..self.n_layer {
            let w = |k: TensorKind| k.weight(il);
            add(w(TensorKind::FfnGateExps), &[e, ff, ne], Fill::Random);
            add(w(TensorKind::FfnUpExps), &[e, ff, ne], Fill::Random);
            add(w(TensorKind::FfnDownExps), &[ff, e, ne], Fill::Random);
            add(w(TensorKind::FfnGateInp), &[e, ne], Fill::Range(-0.05, 0.05));
            add(w(TensorKind::AttnNorm), &[e], Fill::Const(1.0));
            if self.is_attention(il) {
                add(w(TensorKind::FfnNorm), &[e], Fill::Const(1.0));
                add(w(TensorKind::AttnK), &[e, self.n_kv_head as u64 * hd], Fill::Random);
                add(w(TensorKind::AttnOut), &[self.n_head as u64 * hd, e], Fill::Random);
                add(w(TensorKind::AttnQ), &[e, self.n_head as u64 * hd], Fill::Random);
                add(w(TensorKind::AttnV), &[e, self.n_kv_head as u64 * hd], Fill::Random);
            } else {
                // A = -exp(A_log) < 0; softplus(dt + dt_bias) between about 0.01 and 0.1.
                add(w(TensorKind::SsmA), &[1, nh], Fill::Range(-4.0, -0.5));
                add(w(TensorKind::SsmD), &[1, nh], Fill::Const(1.0));
                add(TensorKind::SsmConv1d.bias(il), &[conv], Fill::Range(-0.1, 0.1));
                add(w(TensorKind::SsmConv1d), &[self.ssm_conv as u64, conv], Fill::Range(-0.3, 0.3));
                add(TensorKind::SsmDt.bias(il), &[nh], Fill::Range(-4.6, -2.3));
                add(w(TensorKind::SsmIn), &[e, di + conv + nh], Fill::Random);
                add(w(TensorKind::SsmNorm), &[di / ng, ng], Fill::Const(1.0));
                add(w(TensorKind::SsmOut), &[di, e], Fill::Random);
                add(w(TensorKind::FfnNorm), &[e], Fill::Const(1.0));
            }
            add(w(TensorKind::FfnGateShexp), &[e, fs], Fill::Random);
            add(w(TensorKind::FfnUpShexp), &[e, fs], Fill::Random);
            add(w(TensorKind::FfnDownShexp), &[fs, e], Fill::Random);
        }
        add(TensorKind::OutputNorm.weight(0), &[e], Fill::Const(1.0));
        t
    }
}
