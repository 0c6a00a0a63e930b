// Element `e` of an f16 KV cache's keys or values, exactly as f32, for
// adapters with `shader-f16` (`kv_half.wgsl` is the portable form): the
// host binds the cache a second time as f16 values and the hardware widens
// them; zeros (perhaps flushed subnormals) are decoded again from the bits.

@group(0) @binding(6) var<storage, read> k16: array<f16>;
@group(0) @binding(7) var<storage, read> v16: array<f16>;

fn k_half(e: u32) -> f32 {
    let x = f32(k16[e]);
    if (x == 0.0) {
        return half_to_f32((k[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
    }
    return x;
}

fn v_half(e: u32) -> f32 {
    let x = f32(v16[e]);
    if (x == 0.0) {
        return half_to_f32((v[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
    }
    return x;
}
