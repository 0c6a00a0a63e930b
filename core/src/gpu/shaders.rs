//! The WGSL sources: one matrix-vector kernel (`shaders/matvec.wgsl`; with
//! `shaders/matvec_glu.wgsl` the fused gate and up products, reading two
//! matrices) and, per block format, the file that teaches it to read one
//! block; the decoded token's per-row operations (`shaders/graph.wgsl`); attention
//! over a KV cache (`shaders/attention.wgsl`); the Gated DeltaNet delta rule
//! (`shaders/delta.wgsl`).
//!
//! The pieces that depend on the device's [`KernelVariant`] come in two
//! forms with the same functions: reading f16 values (`weights_half.wgsl`
//! and `kv_half.wgsl`, or under `enable f16;` `weights_f16.wgsl` and
//! `kv_f16.wgsl`, which read a second binding of the same buffer as
//! `array<f16>`) and workgroup reductions (`reduce.wgsl`, or
//! `reduce_subgroups.wgsl`). A module is its pieces
//! joined (WGSL declarations may come in any order), after the `enable`
//! directive when there is one.

use super::KernelVariant;
use crate::quant::GgmlType;

const MATVEC: &str = include_str!("shaders/matvec.wgsl");
const MATVEC_GLU: &str = include_str!("shaders/matvec_glu.wgsl");
const WEIGHTS_ONE: &str = include_str!("shaders/weights_one.wgsl");
const WEIGHTS_ONE_F16: &str = include_str!("shaders/weights_one_f16.wgsl");
const WEIGHTS_PAIR: &str = include_str!("shaders/weights_pair.wgsl");
const WEIGHTS_PAIR_F16: &str = include_str!("shaders/weights_pair_f16.wgsl");
const ACT: &str = include_str!("shaders/act.wgsl");
const K4_SCALES: &str = include_str!("shaders/k4_scales.wgsl");
const HALF: &str = include_str!("shaders/half.wgsl");
const WEIGHTS_HALF: &str = include_str!("shaders/weights_half.wgsl");
const WEIGHTS_F16: &str = include_str!("shaders/weights_f16.wgsl");
const KV_HALF: &str = include_str!("shaders/kv_half.wgsl");
const KV_F16: &str = include_str!("shaders/kv_f16.wgsl");
const ROUND_HALF: &str = include_str!("shaders/round_half.wgsl");
const REDUCE: &str = include_str!("shaders/reduce.wgsl");
const REDUCE_SUBGROUPS: &str = include_str!("shaders/reduce_subgroups.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const ATTENTION_SPLIT: &str = include_str!("shaders/attention_split.wgsl");
const DELTA: &str = include_str!("shaders/delta.wgsl");
const GRAPH: &str = include_str!("shaders/graph.wgsl");
const KV_STORE: &str = include_str!("shaders/kv_store.wgsl");

/// The format's block reader, or `None` for a format without a kernel.
fn block(ty: GgmlType) -> Option<&'static str> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => include_str!("shaders/f32.wgsl"),
        T::F16 => include_str!("shaders/f16.wgsl"),
        T::BF16 => include_str!("shaders/bf16.wgsl"),
        T::Q4_0 => include_str!("shaders/q4_0.wgsl"),
        T::Q4_1 => include_str!("shaders/q4_1.wgsl"),
        T::Q5_0 => include_str!("shaders/q5_0.wgsl"),
        T::Q5_1 => include_str!("shaders/q5_1.wgsl"),
        T::Q8_0 => include_str!("shaders/q8_0.wgsl"),
        T::Q2K => include_str!("shaders/q2_k.wgsl"),
        T::Q3K => include_str!("shaders/q3_k.wgsl"),
        T::Q4K => include_str!("shaders/q4_k.wgsl"),
        T::Q5K => include_str!("shaders/q5_k.wgsl"),
        T::Q6K => include_str!("shaders/q6_k.wgsl"),
        _ => return None,
    })
}

/// The pieces every module of variant `v` starts with: the `enable`
/// directive, the exact f16 widening and the reductions.
fn common(v: KernelVariant) -> String {
    let enable = if v.f16 { "enable f16;\n" } else { "" };
    let reduce = if v.subgroups { REDUCE_SUBGROUPS } else { REDUCE };
    format!("{enable}{HALF}\n{reduce}")
}

/// The whole matrix-vector module for weights of type `ty`. With `f16`
/// it reads the weights' f16 values through a second binding (6) of them.
pub fn matvec(ty: GgmlType, v: KernelVariant) -> Option<String> {
    let words = if v.f16 { format!("{WEIGHTS_ONE}\n{WEIGHTS_ONE_F16}") } else { WEIGHTS_ONE.to_string() };
    matvec_with(ty, v, &words)
}

/// The fused gate and up products (`shaders/matvec_glu.wgsl`) for weights
/// of type `ty`: the matrix-vector module reading two matrices, the up's
/// at binding 7 (and 8 as f16 values).
pub fn matvec_glu(ty: GgmlType, v: KernelVariant) -> Option<String> {
    let words = if v.f16 { format!("{WEIGHTS_PAIR}\n{WEIGHTS_PAIR_F16}") } else { WEIGHTS_PAIR.to_string() };
    let body = matvec_with(ty, v, &words)?;
    Some(format!("{body}\n{MATVEC_GLU}\n{ACT}\n{ROUND_HALF}"))
}

fn matvec_with(ty: GgmlType, v: KernelVariant, words: &str) -> Option<String> {
    let body = block(ty)?;
    let k4 = if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) { K4_SCALES } else { "" };
    let f16_at = if v.f16 { WEIGHTS_F16 } else { WEIGHTS_HALF };
    // Values of x per block: each block's sum follows its values where the
    // format reads it (`super::act_len`).
    let extra = if super::reads_block_sums(ty) { 1 } else { 0 };
    let act = format!("const ACT_BLOCK: u32 = BLOCK_ELEMS + {extra}u;");
    Some(format!("{}\n{MATVEC}\n{words}\n{f16_at}\n{k4}\n{body}\n{act}", common(v)))
}

/// The delta-rule module (`shaders/delta.wgsl`: one invocation per column
/// of the state, no reductions; the same in every variant).
pub fn delta(_v: KernelVariant) -> String {
    DELTA.to_string()
}

/// The attention module (`shaders/attention.wgsl`, and the decoded
/// token's attention split over positions, `shaders/attention_split.wgsl`,
/// whose partial results are binding 8). With `f16` it reads an f16
/// cache's keys and values through second bindings (6, 7) of them.
pub fn attention(v: KernelVariant) -> String {
    let kv = if v.f16 { KV_F16 } else { KV_HALF };
    format!("{}\n{ATTENTION}\n{ATTENTION_SPLIT}\n{kv}\n{ROUND_HALF}", common(v))
}

/// The decoded token's per-row operations (`shaders/graph.wgsl`: norms,
/// RoPE, adds, activations, the router, the DeltaNet decays and conv).
pub fn graph(v: KernelVariant) -> String {
    // No f16 values: only the reductions differ between forms.
    format!("{}\n{GRAPH}\n{ACT}\n{ROUND_HALF}", common(KernelVariant { f16: false, ..v }))
}

/// A token's keys or values into a KV cache (`shaders/kv_store.wgsl`; no
/// reductions, the same in every variant).
pub fn kv_store(_v: KernelVariant) -> String {
    format!("{KV_STORE}\n{ROUND_HALF}")
}

/// Every module of variant `v`, named (for the translation tests).
#[cfg(test)]
pub fn all(v: KernelVariant) -> Vec<(String, String)> {
    let mut modules: Vec<(String, String)> =
        super::FORMATS.iter().filter_map(|&ty| Some((ty.to_string(), matvec(ty, v)?))).collect();
    modules.extend(super::FORMATS.iter().filter_map(|&ty| Some((format!("{ty} gate and up"), matvec_glu(ty, v)?))));
    modules.push(("attention".into(), attention(v)));
    modules.push(("delta rule".into(), delta(v)));
    modules.push(("graph".into(), graph(v)));
    modules.push(("kv store".into(), kv_store(v)));
    modules
}
