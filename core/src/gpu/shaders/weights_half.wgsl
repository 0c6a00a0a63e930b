// The f16 at byte `off` of the weights, exactly as f32 (the portable
// kernels; `weights_f16.wgsl` is the form for adapters with `shader-f16`).
fn f16_at(off: u32) -> f32 {
    return half_to_f32(u16_at(off));
}
