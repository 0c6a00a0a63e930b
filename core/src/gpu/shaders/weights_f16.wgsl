// The f16 at byte `off` of the weights, exactly as f32, for adapters with
// `shader-f16` (`weights_half.wgsl` is the portable form). The host binds
// the weights a second time as f16 values (every f16 of a GGUF block lies
// at an even byte offset, and bindings start at whole rows): the hardware
// widens it. A zero may be a subnormal the device flushed, so zeros are
// decoded again from the bits (`half.wgsl`), which keeps every value exact.

@group(0) @binding(6) var<storage, read> w16: array<f16>;

fn f16_at(off: u32) -> f32 {
    let x = f32(half_word(off >> 1u));
    if (x == 0.0) {
        return half_to_f32(u16_at(off));
    }
    return x;
}
