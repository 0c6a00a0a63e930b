//! `cargo xtask synth-model`: a GGUF with the exact geometry of a real MoE
//! model, filled with random but valid blocks in llama.cpp's type mix for the
//! chosen quantisation, written tensor by tensor (never the whole file in
//! memory). For speed measurements on models nobody has to download.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use pocket_core::gguf::{Array, GgufWriter, StringArray, TensorKind, Value};
use pocket_core::quant::GgmlType;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arch {
    Qwen35Moe,
    Qwen3Moe,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Quant {
    Q2K,
    Q4KM,
}

/// The shape of a model.
struct Geometry {
    arch: Arch,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    n_expert: usize,
    n_expert_used: usize,
    n_ff_exp: usize,
    /// Shared expert FFN size (0: none).
    n_ff_shexp: usize,
    n_vocab: usize,
    n_ctx: usize,
    rope_base: f32,
    // Gated DeltaNet (qwen35moe)
    ssm_k_heads: usize,
    ssm_v_heads: usize,
    ssm_head_dim: usize,
    full_attention_interval: usize,
}

impl Geometry {
    /// Qwen3.5-35B-A3B.
    fn qwen35moe_full() -> Self {
        Geometry {
            arch: Arch::Qwen35Moe,
            n_layer: 40,
            n_embd: 2048,
            n_head: 16,
            n_kv_head: 2,
            head_dim: 256,
            n_expert: 256,
            n_expert_used: 8,
            n_ff_exp: 512,
            n_ff_shexp: 512,
            n_vocab: 248_320,
            n_ctx: 262_144,
            rope_base: 10_000_000.0,
            ssm_k_heads: 16,
            ssm_v_heads: 32,
            ssm_head_dim: 128,
            full_attention_interval: 4,
        }
    }

    /// The Qwen3.5 shape cut down for emulation: 4 layers, 64 experts, vocab 4096.
    fn qwen35moe_mid() -> Self {
        Geometry { n_layer: 4, n_expert: 64, n_vocab: 4096, ..Self::qwen35moe_full() }
    }

    /// Qwen3-30B-A3B.
    fn qwen3moe_full() -> Self {
        Geometry {
            arch: Arch::Qwen3Moe,
            n_layer: 48,
            n_embd: 2048,
            n_head: 32,
            n_kv_head: 4,
            head_dim: 128,
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
            n_ff_shexp: 0,
            n_vocab: 151_936,
            n_ctx: 40_960,
            rope_base: 1_000_000.0,
            ssm_k_heads: 0,
            ssm_v_heads: 0,
            ssm_head_dim: 0,
            full_attention_interval: 1,
        }
    }

    fn qwen3moe_mid() -> Self {
        Geometry { n_layer: 4, n_expert: 64, n_vocab: 4096, ..Self::qwen3moe_full() }
    }

    fn is_recurrent(&self, il: usize) -> bool {
        self.arch == Arch::Qwen35Moe && !(il + 1).is_multiple_of(self.full_attention_interval)
    }

    fn arch_name(&self) -> &'static str {
        match self.arch {
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }
}

/// What a tensor is, for llama.cpp's per-category type choices.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cat {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    /// attn_v and the linear-attention attn_qkv ("attn_v-like").
    AttnV,
    AttnOut,
    FfnDown,
    /// Other quantised weights (gate/up, ssm projections, attn_gate).
    Weight,
    /// Kept in F32 (norms, routers, conv, small vectors).
    Float,
}

/// llama.cpp's `use_more_bits`: the first and last eighth and every third layer between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize).rem_euclid(3) == 2
}

/// The type llama-quantize gives a tensor of `cat` in layer `il` (for
/// models with other than 8 experts, as both of ours have).
fn type_for(q: Quant, g: &Geometry, cat: Cat, il: usize, attn_v_index: usize, n_attn_v: usize) -> GgmlType {
    let gqa = g.n_head / g.n_kv_head;
    match (q, cat) {
        (_, Cat::Float) => GgmlType::F32,
        (_, Cat::Output) => GgmlType::Q6K,
        (Quant::Q2K, Cat::TokenEmbd) => GgmlType::Q2K,
        (Quant::Q4KM, Cat::TokenEmbd) => GgmlType::Q4K,
        (Quant::Q2K, Cat::AttnV) => {
            if gqa >= 4 {
                GgmlType::Q4K
            } else {
                GgmlType::Q3K
            }
        }
        (Quant::Q4KM, Cat::AttnV) => {
            if use_more_bits(attn_v_index, n_attn_v) {
                GgmlType::Q6K
            } else {
                GgmlType::Q4K
            }
        }
        (Quant::Q2K, Cat::FfnDown) => GgmlType::Q3K,
        (Quant::Q4KM, Cat::FfnDown) => {
            if use_more_bits(il, g.n_layer) {
                GgmlType::Q6K
            } else {
                GgmlType::Q4K
            }
        }
        (Quant::Q2K, Cat::AttnOut) => GgmlType::Q3K,
        (Quant::Q2K, _) => GgmlType::Q2K,
        (Quant::Q4KM, _) => GgmlType::Q4K,
    }
}

/// A tensor to write: name, category, shape (innermost first), layer.
struct Planned {
    name: String,
    cat: Cat,
    dims: Vec<u64>,
    layer: usize,
    /// Fill value for F32 vectors (None: random weights).
    fill: Fill,
}

#[derive(Clone, Copy)]
enum Fill {
    Random,
    Const(f32),
    /// Uniform in [lo, hi).
    Range(f32, f32),
}

fn plan(g: &Geometry) -> Vec<Planned> {
    let e = g.n_embd as u64;
    let mut t = Vec::new();
    let mut add =
        |name: String, cat, dims: &[u64], layer, fill| t.push(Planned { name, cat, dims: dims.to_vec(), layer, fill });
    add(TensorKind::TokenEmbd.weight(0), Cat::TokenEmbd, &[e, g.n_vocab as u64], 0, Fill::Random);
    let (hd, nh, nkv) = (g.head_dim as u64, g.n_head as u64, g.n_kv_head as u64);
    let (key_dim, value_dim) = ((g.ssm_k_heads * g.ssm_head_dim) as u64, (g.ssm_v_heads * g.ssm_head_dim) as u64);
    for il in 0..g.n_layer {
        let w = |k: TensorKind| k.weight(il);
        add(w(TensorKind::AttnNorm), Cat::Float, &[e], il, Fill::Const(1.0));
        if g.is_recurrent(il) {
            let conv = 2 * key_dim + value_dim;
            let hv = g.ssm_v_heads as u64;
            add(w(TensorKind::AttnQkv), Cat::AttnV, &[e, conv], il, Fill::Random);
            add(w(TensorKind::AttnGate), Cat::Weight, &[e, value_dim], il, Fill::Random);
            add(w(TensorKind::SsmConv1d), Cat::Float, &[4, conv], il, Fill::Range(-0.3, 0.3));
            add(TensorKind::SsmDt.bias(il), Cat::Float, &[hv], il, Fill::Range(-0.5, 0.5));
            add(w(TensorKind::SsmA), Cat::Float, &[hv], il, Fill::Range(-2.0, -0.2));
            add(w(TensorKind::SsmBeta), Cat::Weight, &[e, hv], il, Fill::Random);
            add(w(TensorKind::SsmAlpha), Cat::Weight, &[e, hv], il, Fill::Random);
            add(w(TensorKind::SsmNorm), Cat::Float, &[g.ssm_head_dim as u64], il, Fill::Const(1.0));
            add(w(TensorKind::SsmOut), Cat::Weight, &[value_dim, e], il, Fill::Random);
        } else {
            let gated = if g.arch == Arch::Qwen35Moe { 2 } else { 1 };
            add(w(TensorKind::AttnQ), Cat::AttnQ, &[e, gated * nh * hd], il, Fill::Random);
            add(w(TensorKind::AttnK), Cat::AttnK, &[e, nkv * hd], il, Fill::Random);
            add(w(TensorKind::AttnV), Cat::AttnV, &[e, nkv * hd], il, Fill::Random);
            add(w(TensorKind::AttnOut), Cat::AttnOut, &[nh * hd, e], il, Fill::Random);
            add(w(TensorKind::AttnQNorm), Cat::Float, &[hd], il, Fill::Const(1.0));
            add(w(TensorKind::AttnKNorm), Cat::Float, &[hd], il, Fill::Const(1.0));
        }
        let post = if g.arch == Arch::Qwen35Moe { TensorKind::AttnPostNorm } else { TensorKind::FfnNorm };
        add(w(post), Cat::Float, &[e], il, Fill::Const(1.0));
        let (ff, ne) = (g.n_ff_exp as u64, g.n_expert as u64);
        add(w(TensorKind::FfnGateInp), Cat::Float, &[e, ne], il, Fill::Range(-0.05, 0.05));
        add(w(TensorKind::FfnGateExps), Cat::Weight, &[e, ff, ne], il, Fill::Random);
        add(w(TensorKind::FfnUpExps), Cat::Weight, &[e, ff, ne], il, Fill::Random);
        add(w(TensorKind::FfnDownExps), Cat::FfnDown, &[ff, e, ne], il, Fill::Random);
        if g.n_ff_shexp > 0 {
            let fs = g.n_ff_shexp as u64;
            add(w(TensorKind::FfnGateInpShexp), Cat::Float, &[e], il, Fill::Range(-0.05, 0.05));
            add(w(TensorKind::FfnGateShexp), Cat::Weight, &[e, fs], il, Fill::Random);
            add(w(TensorKind::FfnUpShexp), Cat::Weight, &[e, fs], il, Fill::Random);
            add(w(TensorKind::FfnDownShexp), Cat::FfnDown, &[fs, e], il, Fill::Random);
        }
    }
    add(TensorKind::OutputNorm.weight(0), Cat::Float, &[e], 0, Fill::Const(1.0));
    add(TensorKind::Output.weight(0), Cat::Output, &[e, g.n_vocab as u64], 0, Fill::Random);
    t
}

/// xorshift64*: fast, good enough for filler bits.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// Where a block keeps its f16 scales, and the scale that makes weights
/// about 0.02 in magnitude: (offset of d, offset of dmin and the mean of the
/// unsigned values if any, d).
///
/// Formats with a minimum (`d * sc * q - dmin * m`) get `dmin = d * mean(q)`:
/// with random sub-scales and mins (the same width, so the same mean) the
/// weights then average zero, as a quantised checkpoint's do. A smaller dmin
/// leaves every row of every matrix a common positive offset, which turns the
/// hidden states of all tokens towards one direction: every token of a
/// prompt then picks the same experts (measured on the earlier files: all 128
/// tokens of a prompt in the same 8 experts of 256, in every layer).
fn scale_layout(ty: GgmlType) -> (usize, Option<(usize, f32)>, f32) {
    match ty {
        GgmlType::Q2K => (80, Some((82, 1.5)), 4e-4),
        GgmlType::Q3K => (108, None, 1.5e-4),
        GgmlType::Q4K => (0, Some((2, 7.5)), 2e-5),
        GgmlType::Q5K => (0, Some((2, 15.5)), 1e-5),
        GgmlType::Q6K => (208, None, 5e-6),
        GgmlType::Q8_0 => (0, None, 1.5e-4),
        other => panic!("synth-model has no block recipe for {other}"),
    }
}

fn fill_tensor(ty: GgmlType, fill: Fill, buf: &mut [u8], rng: &mut Rng) {
    if ty == GgmlType::F32 {
        for c in buf.chunks_exact_mut(4) {
            let v = match fill {
                Fill::Const(v) => v,
                Fill::Range(lo, hi) => lo + (hi - lo) * rng.unit(),
                Fill::Random => (rng.unit() - 0.5) * 0.04,
            };
            c.copy_from_slice(&v.to_le_bytes());
        }
        return;
    }
    // Random quants and sub-scales are always valid; only the f16 super-block
    // scales are set, to realistic magnitudes (finite, positive).
    rng.fill(buf);
    let (d_at, dmin_at, d) = scale_layout(ty);
    let f16 = |v: f32| half_bits(v).to_le_bytes();
    for b in buf.chunks_exact_mut(ty.type_size()) {
        let jitter = 0.5 + rng.unit();
        b[d_at..d_at + 2].copy_from_slice(&f16(d * jitter));
        if let Some((m, mean_q)) = dmin_at {
            b[m..m + 2].copy_from_slice(&f16(d * mean_q * jitter));
        }
    }
}

/// f32 -> f16 bits for normal, positive values in f16's range.
fn half_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        // Subnormal f16: value / 2^-24.
        return (v / 5.960_464_5e-8).round() as u16;
    }
    let mant = (bits >> 13) & 0x3ff;
    ((exp as u32) << 10 | mant) as u16
}

fn vocab(n: usize) -> (StringArray, Vec<f32>, Vec<i32>) {
    let mut tokens = StringArray::default();
    let mut scores = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for (s, ty) in [("<unk>", 2), ("<s>", 3), ("</s>", 3)] {
        tokens.push(s);
        scores.push(0.0);
        types.push(ty);
    }
    for b in 0..256 {
        tokens.push(&format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    for i in tokens.len()..n {
        tokens.push(&format!("\u{2581}t{i}"));
        scores.push(-(i as f32));
        types.push(1);
    }
    (tokens, scores, types)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut arch = None;
    let mut geometry = "full".to_string();
    let mut quant = None;
    let mut out = None;
    let mut seed = 1u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--arch" => arch = Some(val()?),
            "--geometry" => geometry = val()?,
            "--quant" => quant = Some(val()?),
            "--out" => out = Some(PathBuf::from(val()?)),
            "--seed" => seed = val()?.parse().map_err(|_| "bad --seed")?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    let usage =
        "usage: cargo xtask synth-model --arch qwen35moe|qwen3moe --geometry full|mid --quant q2_k|q4_k_m --out FILE";
    let g = match (arch.as_deref(), geometry.as_str()) {
        (Some("qwen35moe"), "full") => Geometry::qwen35moe_full(),
        (Some("qwen35moe"), "mid") => Geometry::qwen35moe_mid(),
        (Some("qwen3moe"), "full") => Geometry::qwen3moe_full(),
        (Some("qwen3moe"), "mid") => Geometry::qwen3moe_mid(),
        _ => return Err(usage.into()),
    };
    let q = match quant.as_deref() {
        Some("q2_k") => Quant::Q2K,
        Some("q4_k_m") => Quant::Q4KM,
        _ => return Err(usage.into()),
    };
    let out = out.ok_or(usage)?;

    let a = g.arch_name();
    let k = |s: &str| format!("{a}.{s}");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String(a.into()))
        .kv("general.name", Value::String(format!("pocket synthetic {a} {geometry}")))
        .kv("general.file_type", Value::U32(if q == Quant::Q2K { 10 } else { 15 }))
        .kv("general.quantization_version", Value::U32(2))
        .kv(&k("block_count"), Value::U32(g.n_layer as u32))
        .kv(&k("context_length"), Value::U32(g.n_ctx as u32))
        .kv(&k("embedding_length"), Value::U32(g.n_embd as u32))
        .kv(&k("feed_forward_length"), Value::U32((g.n_ff_exp * g.n_expert_used) as u32))
        .kv(&k("attention.head_count"), Value::U32(g.n_head as u32))
        .kv(&k("attention.head_count_kv"), Value::U32(g.n_kv_head as u32))
        .kv(&k("attention.key_length"), Value::U32(g.head_dim as u32))
        .kv(&k("attention.value_length"), Value::U32(g.head_dim as u32))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv(&k("rope.freq_base"), Value::F32(g.rope_base))
        .kv(&k("expert_count"), Value::U32(g.n_expert as u32))
        .kv(&k("expert_used_count"), Value::U32(g.n_expert_used as u32))
        .kv(&k("expert_feed_forward_length"), Value::U32(g.n_ff_exp as u32));
    if g.arch == Arch::Qwen35Moe {
        let recurrent: Vec<bool> = (0..g.n_layer).map(|il| g.is_recurrent(il)).collect();
        w.kv(&k("expert_shared_feed_forward_length"), Value::U32(g.n_ff_shexp as u32))
            .kv(&k("rope.dimension_count"), Value::U32((g.head_dim / 4) as u32))
            .kv(&k("rope.dimension_sections"), Value::Array(Array::I32(vec![11, 11, 10, 0])))
            .kv(&k("ssm.conv_kernel"), Value::U32(4))
            .kv(&k("ssm.state_size"), Value::U32(g.ssm_head_dim as u32))
            .kv(&k("ssm.group_count"), Value::U32(g.ssm_k_heads as u32))
            .kv(&k("ssm.time_step_rank"), Value::U32(g.ssm_v_heads as u32))
            .kv(&k("ssm.inner_size"), Value::U32((g.ssm_v_heads * g.ssm_head_dim) as u32))
            .kv(&k("attention.recurrent_layers"), Value::Array(Array::Bool(recurrent)))
            .kv(&k("full_attention_interval"), Value::U32(g.full_attention_interval as u32));
    }
    let (tokens, scores, types) = vocab(g.n_vocab);
    w.kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv("tokenizer.ggml.pre", Value::String("default".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Value::U32(0))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
        .kv("tokenizer.ggml.add_space_prefix", Value::Bool(true));

    let planned = plan(&g);
    let n_attn_v = planned.iter().filter(|p| p.cat == Cat::AttnV).count();
    let mut v_index = 0;
    let mut fills = Vec::new();
    for p in &planned {
        let ty = type_for(q, &g, p.cat, p.layer, v_index, n_attn_v);
        if p.cat == Cat::AttnV {
            v_index += 1;
        }
        w.tensor(&p.name, ty, &p.dims);
        fills.push((ty, p.fill));
    }
    let total: u64 = w.tensors().iter().map(|t| t.bytes()).sum();
    eprintln!("writing {} ({} tensors, {:.2} GB of weights)", out.display(), planned.len(), total as f64 / 1e9);
    let file = File::create(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let t0 = std::time::Instant::now();
    w.write(BufWriter::with_capacity(8 << 20, file), |i, buf| fill_tensor(fills[i].0, fills[i].1, buf, &mut rng))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
