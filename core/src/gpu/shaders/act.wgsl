// The feed-forward activations, shared by the per-row operations
// (`graph.wgsl`) and the fused gate and up products (`matvec_glu.wgsl`).

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// `ops::gelu_tanh`: ggml's f16 table, i.e. the formula at the input
// rounded to f16, rounded to f16 (`round_half.wgsl`).
fn gelu(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let h = round_to_half(x);
    let t = tanh(0.7978846 * h * (1.0 + 0.044715 * h * h));
    return round_to_half(0.5 * h * (1.0 + t));
}
