// f16 -> f32 by integer arithmetic, exact on every adapter:
// `unpack2x16float` needs a capability some adapters lack, and f32
// subnormals (where a rescaling trick would pass) may be flushed to zero.
// The portable kernels read every f16 with it; the `shader-f16` kernels
// (`weights_f16.wgsl`, `kv_f16.wgsl`) only the zeros and subnormals.

// The f16 with bits `h` (low 16 bits), exactly as f32.
fn half_to_f32(h: u32) -> f32 {
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    var mag: f32;
    if (e == 0u) {
        // Zero or subnormal: m * 2^-24, a normal f32.
        mag = f32(m) * bitcast<f32>(0x33800000u);
    } else if (e == 31u) {
        mag = bitcast<f32>(0x7f800000u | (m << 13u));
    } else {
        // Rebias the exponent (15 -> 127), widen the mantissa.
        mag = bitcast<f32>(((e + 112u) << 23u) | (m << 13u));
    }
    return select(mag, -mag, (h & 0x8000u) != 0u);
}
