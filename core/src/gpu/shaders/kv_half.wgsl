// Element `e` of an f16 KV cache's keys or values, exactly as f32 (the
// portable kernels; `kv_f16.wgsl` is the form for adapters with
// `shader-f16`): two per word, low half first.
fn k_half(e: u32) -> f32 {
    return half_to_f32((k[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
}

fn v_half(e: u32) -> f32 {
    return half_to_f32((v[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
}
