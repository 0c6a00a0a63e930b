//! The WGSL sources: one matrix-vector kernel (`shaders/matvec.wgsl`) and,
//! per block format, the file that teaches it to read one block; attention
//! over a KV cache (`shaders/attention.wgsl`); the f16 conversions both use
//! (`shaders/half.wgsl`); the Gated DeltaNet delta rule (`shaders/delta.wgsl`).

use crate::quant::GgmlType;

const MATVEC: &str = include_str!("shaders/matvec.wgsl");
const K4_SCALES: &str = include_str!("shaders/k4_scales.wgsl");
const HALF: &str = include_str!("shaders/half.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const DELTA: &str = include_str!("shaders/delta.wgsl");

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

/// The whole matrix-vector module for weights of type `ty` (WGSL declarations
/// may come in any order, so the pieces are simply joined).
pub fn matvec(ty: GgmlType) -> Option<String> {
    let body = block(ty)?;
    let k4 = if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) { K4_SCALES } else { "" };
    Some(format!("{MATVEC}\n{HALF}\n{k4}\n{body}"))
}

/// The delta-rule module (`shaders/delta.wgsl`).
pub fn delta() -> String {
    DELTA.to_string()
}

/// The attention module (`shaders/attention.wgsl`).
pub fn attention() -> String {
    format!("{ATTENTION}\n{HALF}")
}
