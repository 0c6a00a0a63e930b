//! `cargo xtask synth-model`: a GGUF with the exact geometry of a real MoE
//! model, filled with random but valid blocks ([`blocks`]) in llama.cpp's
//! type mix for the chosen preset (pocket quantize's, which is the same),
//! written tensor by tensor (never the whole file in memory). For speed
//! measurements on models nobody has to download.

mod blocks;
mod ernie;
mod gemma4;
mod gptoss;
mod granitehybrid;
mod lfm2moe;
mod olmoe;

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use blocks::{fill_tensor, Fill, Rng};
use pocket_core::gguf::{Array, GgufWriter, StringArray, TensorKind, Value};
use pocket_core::quant::GgmlType;
use pocket_core::quantize::mix::{tensor_order, FileType, Mixer, ModelShape};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arch {
    Qwen35Moe,
    Qwen3Moe,
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

    /// Qwen3.5 at test size: 256 wide, 4 layers (one of full attention),
    /// 8 experts, vocab 1024 (what `core/tests` checks against llama.cpp).
    fn qwen35moe_tiny() -> Self {
        Geometry {
            n_embd: 256,
            n_head: 4,
            n_kv_head: 2,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 64,
            n_ff_shexp: 128,
            n_vocab: 1024,
            n_ctx: 4096,
            ssm_k_heads: 2,
            ssm_v_heads: 4,
            ssm_head_dim: 32,
            ..Self::qwen35moe_mid()
        }
    }

    fn qwen3moe_mid() -> Self {
        Geometry { n_layer: 4, n_expert: 64, n_vocab: 4096, ..Self::qwen3moe_full() }
    }

    fn is_recurrent(&self, il: usize) -> bool {
        self.arch == Arch::Qwen35Moe && !(il + 1).is_multiple_of(self.full_attention_interval)
    }

    fn shape(&self) -> ModelShape {
        ModelShape {
            arch: self.arch_name().into(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            n_gqa: self.n_head / self.n_kv_head,
            is_70b: false,
        }
    }

    fn arch_name(&self) -> &'static str {
        match self.arch {
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }
}

/// A tensor to write: name, shape (innermost first), what F32 values it holds.
struct Planned {
    name: String,
    dims: Vec<u64>,
    fill: Fill,
}

/// The token embeddings' gain over the other weights. Random layers pull
/// the tokens' hidden states together with depth (near-uniform attention
/// averages them; similar states pick the same experts, whose outputs are
/// then similar too): with embeddings as quiet as the other weights, a
/// 48-layer cut of the Qwen3-30B geometry (64 experts) sent a 128-token
/// prompt, in its deep layers, to 14-19 of the 64, several of them meeting
/// every token (the full file: 30-111 of 128 per layer). A trained model's
/// router spreads a prompt's tokens over its experts. With embeddings this
/// much louder than what the layers add, every layer routes a token by its
/// own identity: a prompt of distinct tokens spreads as a trained router's
/// does (128 tokens over 64 experts: groups of 6 to 30 at every depth), and
/// the prefill benchmarks meet the many small expert groups real prompts do.
const EMBD_GAIN: f32 = 1000.0;

fn plan(g: &Geometry) -> Vec<Planned> {
    let e = g.n_embd as u64;
    let mut t = Vec::new();
    let mut add = |name: String, dims: &[u64], fill| t.push(Planned { name, dims: dims.to_vec(), fill });
    add(TensorKind::TokenEmbd.weight(0), &[e, g.n_vocab as u64], Fill::Loud(EMBD_GAIN));
    let (hd, nh, nkv) = (g.head_dim as u64, g.n_head as u64, g.n_kv_head as u64);
    let (key_dim, value_dim) = ((g.ssm_k_heads * g.ssm_head_dim) as u64, (g.ssm_v_heads * g.ssm_head_dim) as u64);
    for il in 0..g.n_layer {
        let w = |k: TensorKind| k.weight(il);
        add(w(TensorKind::AttnNorm), &[e], Fill::Const(1.0));
        if g.is_recurrent(il) {
            let conv = 2 * key_dim + value_dim;
            let hv = g.ssm_v_heads as u64;
            add(w(TensorKind::AttnQkv), &[e, conv], Fill::Random);
            add(w(TensorKind::AttnGate), &[e, value_dim], Fill::Random);
            add(w(TensorKind::SsmConv1d), &[4, conv], Fill::Range(-0.3, 0.3));
            add(TensorKind::SsmDt.bias(il), &[hv], Fill::Range(-0.5, 0.5));
            add(w(TensorKind::SsmA), &[hv], Fill::Range(-2.0, -0.2));
            add(w(TensorKind::SsmBeta), &[e, hv], Fill::Random);
            add(w(TensorKind::SsmAlpha), &[e, hv], Fill::Random);
            add(w(TensorKind::SsmNorm), &[g.ssm_head_dim as u64], Fill::Const(1.0));
            add(w(TensorKind::SsmOut), &[value_dim, e], Fill::Random);
        } else {
            let gated = if g.arch == Arch::Qwen35Moe { 2 } else { 1 };
            add(w(TensorKind::AttnQ), &[e, gated * nh * hd], Fill::Random);
            add(w(TensorKind::AttnK), &[e, nkv * hd], Fill::Random);
            add(w(TensorKind::AttnV), &[e, nkv * hd], Fill::Random);
            add(w(TensorKind::AttnOut), &[nh * hd, e], Fill::Random);
            add(w(TensorKind::AttnQNorm), &[hd], Fill::Const(1.0));
            add(w(TensorKind::AttnKNorm), &[hd], Fill::Const(1.0));
        }
        let post = if g.arch == Arch::Qwen35Moe { TensorKind::AttnPostNorm } else { TensorKind::FfnNorm };
        add(w(post), &[e], Fill::Const(1.0));
        let (ff, ne) = (g.n_ff_exp as u64, g.n_expert as u64);
        add(w(TensorKind::FfnGateInp), &[e, ne], Fill::Range(-0.05, 0.05));
        add(w(TensorKind::FfnGateExps), &[e, ff, ne], Fill::Random);
        add(w(TensorKind::FfnUpExps), &[e, ff, ne], Fill::Random);
        add(w(TensorKind::FfnDownExps), &[ff, e, ne], Fill::Random);
        if g.n_ff_shexp > 0 {
            let fs = g.n_ff_shexp as u64;
            add(w(TensorKind::FfnGateInpShexp), &[e], Fill::Range(-0.05, 0.05));
            add(w(TensorKind::FfnGateShexp), &[e, fs], Fill::Random);
            add(w(TensorKind::FfnUpShexp), &[e, fs], Fill::Random);
            add(w(TensorKind::FfnDownShexp), &[fs, e], Fill::Random);
        }
    }
    add(TensorKind::OutputNorm.weight(0), &[e], Fill::Const(1.0));
    add(TensorKind::Output.weight(0), &[e, g.n_vocab as u64], Fill::Random);
    t
}

/// The tensors of qwen35moe's multi-token-prediction layer `blk.{n_layer}`,
/// as llama.cpp's converter writes Qwen3.5's `mtp.*` (`load_block_mtp`): a
/// full-attention block with the MoE FFN and its gated shared expert, plus
/// `nextn.eh_proj` `[2*n_embd -> n_embd]` over the normed embedding and
/// hidden state (`enorm`, `hnorm`) and the head norm `shared_head_norm`
/// (the real files have no `embed_tokens` or `shared_head_head`: the trunk's
/// embedding and output head are shared). Its norms are not all ones (the
/// head norm's gain is ~10).
///
/// The trunk's loud embeddings make a random model's next token mostly a
/// function of the current one; `eh_proj` passes the normed embedding
/// through (an identity block, F32) so that the layer predicts much of that
/// function too, and drafts are accepted often enough to test (not always:
/// the hidden state, the norms and the layer's own attention and MoE move it).
fn plan_mtp(g: &Geometry) -> Vec<Planned> {
    let (il, e) = (g.n_layer, g.n_embd as u64);
    let (hd, nh, nkv) = (g.head_dim as u64, g.n_head as u64, g.n_kv_head as u64);
    let (ff, ne, fs) = (g.n_ff_exp as u64, g.n_expert as u64, g.n_ff_shexp as u64);
    let norm = Fill::Range(0.8, 1.2);
    let mut t = Vec::new();
    let mut add = |k: TensorKind, dims: &[u64], fill| t.push(Planned { name: k.weight(il), dims: dims.to_vec(), fill });
    add(TensorKind::AttnNorm, &[e], norm);
    add(TensorKind::AttnQ, &[e, 2 * nh * hd], Fill::Random);
    add(TensorKind::AttnK, &[e, nkv * hd], Fill::Random);
    add(TensorKind::AttnV, &[e, nkv * hd], Fill::Random);
    add(TensorKind::AttnOut, &[nh * hd, e], Fill::Random);
    add(TensorKind::AttnQNorm, &[hd], norm);
    add(TensorKind::AttnKNorm, &[hd], norm);
    add(TensorKind::AttnPostNorm, &[e], norm);
    add(TensorKind::FfnGateInp, &[e, ne], Fill::Range(-0.05, 0.05));
    add(TensorKind::FfnGateExps, &[e, ff, ne], Fill::Random);
    add(TensorKind::FfnUpExps, &[e, ff, ne], Fill::Random);
    add(TensorKind::FfnDownExps, &[ff, e, ne], Fill::Random);
    add(TensorKind::FfnGateInpShexp, &[e], Fill::Range(-0.05, 0.05));
    add(TensorKind::FfnGateShexp, &[e, fs], Fill::Random);
    add(TensorKind::FfnUpShexp, &[e, fs], Fill::Random);
    add(TensorKind::FfnDownShexp, &[fs, e], Fill::Random);
    add(TensorKind::NextnEhProj, &[2 * e, e], Fill::Eye(2 * g.n_embd, 1.0));
    add(TensorKind::NextnEnorm, &[e], norm);
    add(TensorKind::NextnHnorm, &[e], norm);
    // Loud: the shared head's logits of a random model are flat (top-1 near
    // 0.1 of the top 10), where a rounding difference would flip drafts.
    add(TensorKind::NextnSharedHeadNorm, &[e], Fill::Range(8.0, 12.0));
    t
}

/// Each planned tensor's type in preset `ftype`: pocket quantize's mix
/// (llama-quantize's, with an importance matrix, as the IQ files people use
/// are made), the tensors visited in llama.cpp's order. What it leaves
/// unquantised (norms, routers, convolutions, vectors) stays F32.
fn types(shape: ModelShape, ftype: FileType, planned: &[Planned]) -> Vec<GgmlType> {
    let mut order: Vec<usize> = (0..planned.len()).collect();
    order.sort_by(|&a, &b| tensor_order(&planned[a].name, &planned[b].name));
    let mut mixer = Mixer::new(ftype, shape, true, order.iter().map(|&i| planned[i].name.as_str()));
    let mut types = vec![GgmlType::F32; planned.len()];
    for i in order {
        types[i] = mixer.choose(&planned[i].name, &planned[i].dims, GgmlType::F32);
        if matches!(planned[i].fill, Fill::Eye(..)) {
            types[i] = GgmlType::F32;
        }
    }
    types
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
    let mut mtp = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--mtp" {
            mtp = true;
            continue;
        }
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
    let usage = "usage: cargo xtask synth-model \
                 --arch qwen35moe|qwen3moe|gemma4|lfm2moe|granitehybrid|gpt-oss|olmoe|ernie4_5-moe \
                 --geometry full|mid|e2b|tiny (e2b: gemma4; tiny: gpt-oss, qwen35moe, olmoe, ernie4_5-moe) \
                 --quant PRESET (q2_k, q4_k_m, iq2_xxs, iq4_xs, mxfp4_moe, ...: any of pocket quantize's) --out FILE \
                 [--mtp: qwen35moe with its multi-token-prediction layer]";
    let ftype = quant.as_deref().and_then(FileType::from_name).ok_or(usage)?;
    let out = out.ok_or(usage)?;
    if arch.as_deref() == Some("gemma4") {
        let g = match geometry.as_str() {
            "full" => gemma4::Gemma4::full(),
            "mid" => gemma4::Gemma4::mid(),
            "e2b" => gemma4::Gemma4::e2b(),
            _ => return Err(usage.into()),
        };
        let spec =
            Spec { arch: "gemma4", geometry: &geometry, n_vocab: g.n_vocab, shape: g.shape(), planned: g.plan() };
        return write_file(&spec, |w| g.keys(w), ftype, &out, seed);
    }
    if arch.as_deref() == Some("lfm2moe") {
        let g = match geometry.as_str() {
            "full" => lfm2moe::Lfm2Moe::full(),
            "mid" => lfm2moe::Lfm2Moe::mid(),
            _ => return Err(usage.into()),
        };
        let spec =
            Spec { arch: "lfm2moe", geometry: &geometry, n_vocab: g.n_vocab, shape: g.shape(), planned: g.plan() };
        return write_file(&spec, |w| g.keys(w), ftype, &out, seed);
    }
    if arch.as_deref() == Some("granitehybrid") {
        let g = match geometry.as_str() {
            "full" => granitehybrid::GraniteHybrid::full(),
            "mid" => granitehybrid::GraniteHybrid::mid(),
            _ => return Err(usage.into()),
        };
        let spec = Spec {
            arch: "granitehybrid",
            geometry: &geometry,
            n_vocab: g.n_vocab,
            shape: g.shape(),
            planned: g.plan(),
        };
        return write_file(&spec, |w| g.keys(w), ftype, &out, seed);
    }
    if arch.as_deref() == Some("gpt-oss") {
        let g = match geometry.as_str() {
            "full" => gptoss::GptOss::full(),
            "mid" => gptoss::GptOss::mid(),
            "tiny" => gptoss::GptOss::tiny(),
            _ => return Err(usage.into()),
        };
        let spec =
            Spec { arch: "gpt-oss", geometry: &geometry, n_vocab: g.n_vocab, shape: g.shape(), planned: g.plan() };
        return write_file(&spec, |w| g.keys(w), ftype, &out, seed);
    }
    if arch.as_deref() == Some("olmoe") {
        let g = match geometry.as_str() {
            "full" => olmoe::Olmoe::full(),
            "tiny" => olmoe::Olmoe::tiny(),
            _ => return Err(usage.into()),
        };
        let spec = Spec { arch: "olmoe", geometry: &geometry, n_vocab: g.n_vocab, shape: g.shape(), planned: g.plan() };
        return write_file(&spec, |w| g.keys(w), ftype, &out, seed);
    }
    if arch.as_deref() == Some("ernie4_5-moe") {
        let g = match geometry.as_str() {
            "full" => ernie::Ernie::full(),
            "tiny" => ernie::Ernie::tiny(),
            _ => return Err(usage.into()),
        };
        let spec =
            Spec { arch: "ernie4_5-moe", geometry: &geometry, n_vocab: g.n_vocab, shape: g.shape(), planned: g.plan() };
        return write_file(&spec, |w| g.keys(w), ftype, &out, seed);
    }
    let g = match (arch.as_deref(), geometry.as_str()) {
        (Some("qwen35moe"), "full") => Geometry::qwen35moe_full(),
        (Some("qwen35moe"), "mid") => Geometry::qwen35moe_mid(),
        (Some("qwen35moe"), "tiny") => Geometry::qwen35moe_tiny(),
        (Some("qwen3moe"), "full") => Geometry::qwen3moe_full(),
        (Some("qwen3moe"), "mid") => Geometry::qwen3moe_mid(),
        _ => return Err(usage.into()),
    };
    if mtp {
        if g.arch != Arch::Qwen35Moe {
            return Err("--mtp: only qwen35moe has a multi-token-prediction layer here".into());
        }
        return write_model_mtp(&g, &geometry, ftype, &out, seed);
    }
    write_model(&g, &geometry, ftype, &out, seed)
}

/// What a file of one architecture and geometry holds.
struct Spec<'a> {
    arch: &'a str,
    geometry: &'a str,
    n_vocab: usize,
    shape: ModelShape,
    planned: Vec<Planned>,
}

/// Write the model of geometry `g` (called `geometry` in its name) as preset `ftype`.
fn write_model(g: &Geometry, geometry: &str, ftype: FileType, out: &Path, seed: u64) -> Result<(), String> {
    let spec = Spec { arch: g.arch_name(), geometry, n_vocab: g.n_vocab, shape: g.shape(), planned: plan(g) };
    write_file(&spec, |w| qwen_keys(g, w), ftype, out, seed)
}

/// [`write_model`] with qwen35moe's multi-token-prediction layer after the
/// trunk: `block_count` counts it, `nextn_predict_layers` = 1, and the
/// recurrent-layer flags mark it full attention (as the converter writes them).
fn write_model_mtp(g: &Geometry, geometry: &str, ftype: FileType, out: &Path, seed: u64) -> Result<(), String> {
    let mut planned = plan(g);
    planned.extend(plan_mtp(g));
    let shape = ModelShape { n_layer: g.n_layer + 1, ..g.shape() };
    let spec = Spec { arch: g.arch_name(), geometry, n_vocab: g.n_vocab, shape, planned };
    write_file(&spec, |w| qwen_keys_nextn(g, 1, w), ftype, out, seed)
}

/// The keys of a Qwen MoE geometry (the tokenizer's aside).
fn qwen_keys(g: &Geometry, w: &mut GgufWriter) {
    qwen_keys_nextn(g, 0, w)
}

/// [`qwen_keys`] of a file with `n_nextn` multi-token-prediction layers after the trunk.
fn qwen_keys_nextn(g: &Geometry, n_nextn: usize, w: &mut GgufWriter) {
    let a = g.arch_name();
    let k = |s: &str| format!("{a}.{s}");
    if n_nextn > 0 {
        w.kv(&k("nextn_predict_layers"), Value::U32(n_nextn as u32));
    }
    w.kv(&k("block_count"), Value::U32((g.n_layer + n_nextn) as u32))
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
        let recurrent: Vec<bool> = (0..g.n_layer + n_nextn).map(|il| il < g.n_layer && g.is_recurrent(il)).collect();
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
}

/// Write `spec` as preset `ftype`: its keys (`keys`), a SentencePiece-style
/// vocabulary, and every planned tensor filled at random in the preset's mix.
fn write_file(
    spec: &Spec,
    keys: impl FnOnce(&mut GgufWriter),
    ftype: FileType,
    out: &Path,
    seed: u64,
) -> Result<(), String> {
    let a = spec.arch;
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String(a.into()))
        .kv("general.name", Value::String(format!("pocket synthetic {a} {}", spec.geometry)))
        .kv("general.file_type", Value::U32(ftype.id()))
        .kv("general.quantization_version", Value::U32(2));
    keys(&mut w);
    let (tokens, scores, token_types) = vocab(spec.n_vocab);
    w.kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv("tokenizer.ggml.pre", Value::String("default".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(token_types)))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Value::U32(0))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
        .kv("tokenizer.ggml.add_space_prefix", Value::Bool(true));

    let planned = &spec.planned;
    let types = types(spec.shape.clone(), ftype, planned);
    for (p, &ty) in planned.iter().zip(&types) {
        w.tensor(&p.name, ty, &p.dims);
    }
    let total: u64 = w.tensors().iter().map(|t| t.bytes()).sum();
    eprintln!("writing {} ({} tensors, {:.2} GB of weights)", out.display(), planned.len(), total as f64 / 1e9);
    let file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let t0 = std::time::Instant::now();
    w.write(BufWriter::with_capacity(8 << 20, file), |i, buf| fill_tensor(types[i], planned[i].fill, buf, &mut rng))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pocket_core::gguf::layer_of;
    use pocket_core::model::{KvType, Logits, Model};
    use pocket_core::threads::ThreadPool;

    fn geometries() -> [Geometry; 4] {
        [Geometry::qwen35moe_full(), Geometry::qwen35moe_mid(), Geometry::qwen3moe_full(), Geometry::qwen3moe_mid()]
    }

    /// The mix this module wrote by hand for its two presets before it used
    /// pocket-core's (models with other than 8 experts, as ours have).
    fn hand_written(q2k: bool, g: &Geometry, name: &str, dims: &[u64], v_seen: usize, n_v: usize) -> GgmlType {
        use GgmlType as T;
        let more_bits =
            |i: usize, n: usize| i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize).rem_euclid(3) == 2;
        let has = |s| name.contains(s);
        if dims.len() == 1 || has("norm") || has("ffn_gate_inp") || has("ssm_conv1d") {
            T::F32
        } else if name == "output.weight" {
            T::Q6K
        } else if has("attn_v") || has("attn_qkv") {
            match (q2k, g.n_head / g.n_kv_head >= 4, more_bits(v_seen, n_v)) {
                (true, true, _) => T::Q4K,
                (true, false, _) => T::Q3K,
                (false, _, true) => T::Q6K,
                (false, _, false) => T::Q4K,
            }
        } else if has("ffn_down") {
            match (q2k, more_bits(layer_of(name).unwrap_or(0), g.n_layer)) {
                (true, _) => T::Q3K,
                (false, true) => T::Q6K,
                (false, false) => T::Q4K,
            }
        } else if q2k && has("attn_output") {
            T::Q3K
        } else if q2k {
            T::Q2K
        } else {
            T::Q4K
        }
    }

    #[test]
    fn q2_k_and_q4_k_m_keep_the_types_they_had() {
        for g in geometries() {
            let planned = plan(&g);
            let is_v = |p: &Planned| p.name.contains("attn_v") || p.name.contains("attn_qkv");
            let n_v = planned.iter().filter(|p| is_v(p)).count();
            for (q2k, name) in [(true, "q2_k"), (false, "q4_k_m")] {
                let types = types(g.shape(), FileType::from_name(name).unwrap(), &planned);
                let mut v_seen = 0;
                for (p, &ty) in planned.iter().zip(&types) {
                    let want = hand_written(q2k, &g, &p.name, &p.dims, v_seen, n_v);
                    assert_eq!(ty, want, "{} {name}: {}", g.arch_name(), p.name);
                    v_seen += is_v(p) as usize;
                }
            }
        }
    }

    #[test]
    fn every_preset_has_blocks_and_keeps_small_tensors_f32() {
        let g = Geometry::qwen35moe_mid();
        let planned = plan(&g);
        for ftype in FileType::all() {
            let types = types(g.shape(), ftype, &planned);
            for (p, ty) in planned.iter().zip(types) {
                if p.dims.len() == 1 || p.name.contains("ffn_gate_inp") || p.name.contains("ssm_conv1d") {
                    assert_eq!(ty, GgmlType::F32, "{}: {}", ftype.name(), p.name);
                }
                // A recipe for every type (panics otherwise), on one row.
                let row = ty.row_bytes(p.dims[0]).unwrap() as usize;
                fill_tensor(ty, p.fill, &mut vec![0; row], &mut Rng(1));
            }
        }
    }

    /// qwen35moe cut down further than `mid` for a test: 512 wide, 16 experts, vocab 1024.
    fn qwen35moe_small() -> Geometry {
        Geometry { n_embd: 512, n_expert: 16, n_vocab: 1024, ..Geometry::qwen35moe_mid() }
    }

    /// Synthesise `g` as `preset`, load it and decode a few tokens.
    fn synthesise_and_decode(g: &Geometry, preset: &str) {
        decode_written(preset, |path, ftype| write_model(g, "test", ftype, path, 3));
    }

    /// Write a file with `write` as `preset`, load it and decode a few tokens.
    fn decode_written(preset: &str, write: impl FnOnce(&Path, FileType) -> Result<(), String>) {
        // One directory per call: tests run in parallel threads of one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pocket-synth-{}-{call}-{preset}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.gguf");
        write(&path, FileType::from_name(preset).unwrap()).unwrap();
        let result = std::panic::catch_unwind(|| {
            let m = Model::load(&path).unwrap();
            let pool = ThreadPool::new(2);
            let mut st = m.new_state(16, KvType::F32).unwrap();
            let mut previous = Vec::new();
            for t in [1, 300, 301, 302, 303] {
                m.forward(&pool, &mut st, &[t], Logits::Last).unwrap();
                let logits = st.logits();
                assert!(logits.iter().all(|v| v.is_finite()), "{preset}: logits not finite after token {t}");
                assert_ne!(logits, &previous[..], "{preset}: the same logits twice");
                previous = logits.to_vec();
            }
        });
        std::fs::remove_dir_all(&dir).unwrap();
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    /// A few presets (with `POCKET_SYNTH_ALL_PRESETS` set: every one, ~1 min).
    #[test]
    fn small_files_load_and_decode() {
        let all: Vec<String> = match std::env::var("POCKET_SYNTH_ALL_PRESETS") {
            Ok(_) => FileType::all().map(|f| f.name().to_string()).collect(),
            Err(_) => ["iq2_xxs", "iq4_xs", "iq1_m", "mxfp4_moe"].map(String::from).to_vec(),
        };
        for preset in &all {
            synthesise_and_decode(&qwen35moe_small(), preset);
        }
    }

    /// Gemma 4's two shapes cut down (both kinds of layer, 704-wide experts,
    /// K = V, shared KV, per-layer inputs): the files load and decode.
    #[test]
    fn small_gemma4_files_load_and_decode() {
        use gemma4::Gemma4;
        let moe = Gemma4 {
            n_embd: 256,
            n_head: 4,
            n_kv_swa: 2,
            hd_swa: 64,
            hd_full: 128,
            n_ff: 512,
            n_expert: 8,
            n_used: 2,
            n_vocab: 1024,
            ..Gemma4::mid()
        };
        let e = Gemma4 {
            n_layer: 10,
            n_embd: 256,
            n_head: 4,
            hd_swa: 64,
            hd_full: 128,
            n_ff: 512,
            shared_kv: 4,
            n_ple: 64,
            n_vocab: 1024,
            ..Gemma4::e2b()
        };
        for (g, preset) in [(&moe, "q2_k"), (&moe, "q4_k_m"), (&e, "q4_k_m")] {
            let spec =
                Spec { arch: "gemma4", geometry: "test", n_vocab: g.n_vocab, shape: g.shape(), planned: g.plan() };
            decode_written(preset, |path, ftype| write_file(&spec, |w| g.keys(w), ftype, path, 3));
        }
    }

    /// LFM2-8B-A1B cut down (dense and MoE short-conv layers, a MoE attention
    /// layer, 8 experts with a selection bias) and Granite-4.0-H-Tiny cut down
    /// (five Mamba2 layers, an attention layer, 8 experts + shared expert):
    /// the files load and decode.
    #[test]
    fn small_lfm2moe_and_granitehybrid_files_load_and_decode() {
        use granitehybrid::GraniteHybrid;
        use lfm2moe::Lfm2Moe;
        let lfm2 = Lfm2Moe {
            n_embd: 256,
            n_head: 4,
            n_kv_head: 2,
            n_ff: 512,
            n_expert: 8,
            n_ff_exp: 256,
            n_vocab: 1024,
            ..Lfm2Moe::mid()
        };
        let granite = GraniteHybrid {
            n_embd: 256,
            n_head: 4,
            n_kv_head: 2,
            ssm_heads: 8,
            ssm_state: 64,
            n_expert: 8,
            n_ff_exp: 256,
            n_ff_shexp: 512,
            n_vocab: 1024,
            ..GraniteHybrid::mid()
        };
        for preset in ["q2_k", "q4_k_m"] {
            let spec = Spec {
                arch: "lfm2moe",
                geometry: "test",
                n_vocab: lfm2.n_vocab,
                shape: lfm2.shape(),
                planned: lfm2.plan(),
            };
            decode_written(preset, |path, ftype| write_file(&spec, |w| lfm2.keys(w), ftype, path, 3));
            let spec = Spec {
                arch: "granitehybrid",
                geometry: "test",
                n_vocab: granite.n_vocab,
                shape: granite.shape(),
                planned: granite.plan(),
            };
            decode_written(preset, |path, ftype| write_file(&spec, |w| granite.keys(w), ftype, path, 3));
        }
    }

    /// gpt-oss as MXFP4_MOE: experts MXFP4, every other matrix Q8_0 (the
    /// output head and embedding too), vectors and biases F32, as
    /// llama-quantize makes it.
    #[test]
    fn gptoss_mxfp4_moe_mix_is_llama_quantizes() {
        for g in [gptoss::GptOss::full(), gptoss::GptOss::tiny()] {
            let planned = g.plan();
            let types = types(g.shape(), FileType::from_name("mxfp4_moe").unwrap(), &planned);
            for (p, ty) in planned.iter().zip(types) {
                let kept = p.name.contains("norm") || p.name.contains("ffn_gate_inp");
                let want = if !p.name.ends_with(".weight") || p.dims.len() == 1 || kept {
                    GgmlType::F32
                } else if p.dims.len() == 3 {
                    GgmlType::MXFP4
                } else {
                    GgmlType::Q8_0
                };
                assert_eq!(ty, want, "{}", p.name);
            }
        }
    }

    /// The tiny qwen35moe with its MTP layer loads and drafts; the same
    /// keys without the layer's tensors still load (generation does not
    /// need it) and say why the layer cannot draft.
    #[test]
    fn the_mtp_layer_loads_and_a_broken_one_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("pocket-synth-mtp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (good, broken) = (dir.join("mtp.gguf"), dir.join("broken.gguf"));
        let g = Geometry::qwen35moe_tiny();
        let ftype = FileType::from_name("q8_0").unwrap();
        write_model_mtp(&g, "test", ftype, &good, 3).unwrap();
        let spec =
            Spec { arch: g.arch_name(), geometry: "test", n_vocab: g.n_vocab, shape: g.shape(), planned: plan(&g) };
        write_file(&spec, |w| qwen_keys_nextn(&g, 1, w), ftype, &broken, 3).unwrap();
        let result = std::panic::catch_unwind(|| {
            let m = Model::load(&good).unwrap();
            assert!(m.has_mtp().unwrap());
            let pool = ThreadPool::new(2);
            let mut st = m.new_mtp_state(8, KvType::F32).unwrap();
            let h = vec![0.5; 2 * m.n_embd()];
            m.mtp_forward(&pool, &mut st, &[300, 301], &h, true).unwrap();
            assert_eq!(st.n_past(), 2);
            assert!(st.logits().iter().all(|v| v.is_finite()) && st.logits().len() == g.n_vocab);
            // A hidden state of the wrong width, a token outside the vocabulary.
            assert!(m.mtp_forward(&pool, &mut st, &[300], &h, true).is_err());
            assert!(m.mtp_forward(&pool, &mut st, &[5000], &h[..m.n_embd()], true).is_err());
            let b = Model::load(&broken).unwrap();
            let e = b.has_mtp().expect_err("no MTP tensors").to_string();
            assert!(e.contains("nextn"), "{e}");
            let mut st = b.new_state(8, KvType::F32).unwrap();
            b.forward(&pool, &mut st, &[1, 300], Logits::Last).unwrap();
        });
        std::fs::remove_dir_all(&dir).unwrap();
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    /// The tiny OLMoE and ERNIE-4.5-MoE files load and decode in two more
    /// presets than the Q8_0 their logits tests read (presets no other test
    /// here writes: the files of one preset share a directory).
    #[test]
    fn tiny_olmoe_and_ernie_files_load_and_decode() {
        let (o, e) = (olmoe::Olmoe::tiny(), ernie::Ernie::tiny());
        for preset in ["q5_k_m", "q3_k_m"] {
            let spec =
                Spec { arch: "olmoe", geometry: "test", n_vocab: o.n_vocab, shape: o.shape(), planned: o.plan() };
            decode_written(preset, |path, ftype| write_file(&spec, |w| o.keys(w), ftype, path, 3));
            let spec = Spec {
                arch: "ernie4_5-moe",
                geometry: "test",
                n_vocab: e.n_vocab,
                shape: e.shape(),
                planned: e.plan(),
            };
            decode_written(preset, |path, ftype| write_file(&spec, |w| e.keys(w), ftype, path, 3));
        }
    }

    #[test]
    #[ignore = "writes and reads 0.3 and 0.5 GB files: run by hand (cargo test -p xtask -- --ignored mid_iq)"]
    fn mid_iq_files_load_and_decode() {
        for preset in ["iq2_xxs", "iq4_xs"] {
            synthesise_and_decode(&Geometry::qwen35moe_mid(), preset);
        }
    }
}
