// f32 -> f16 -> f32 rounding by integer arithmetic, in every kernel form:
// WGSL leaves the rounding of a conversion to f16 to the implementation,
// and an f16 KV cache must round as the CPU does.

// `x` rounded to the nearest f16 value (ties to even), as f32: what a
// conversion to f16 and back gives on the CPU.
fn round_to_half(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    let sign = b & 0x80000000u;
    if (a >= 0x7f800000u) {
        // Infinities and NaN stay.
        return x;
    }
    if (a >= 0x477ff000u) {
        // From 65520 (halfway past the largest f16, 65504): infinity.
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if (a < 0x38800000u) {
        // Below 2^-14, the f16 subnormals: whole steps of 2^-24 (the scaling
        // is exact; `round` takes ties to even).
        let k = round(bitcast<f32>(a) * 16777216.0);
        return bitcast<f32>(sign | bitcast<u32>(k * bitcast<f32>(0x33800000u)));
    }
    // Normal: drop 13 mantissa bits, ties to even (a carry moves the exponent).
    let r = a + 0xfffu + ((a >> 13u) & 1u);
    return bitcast<f32>(sign | (r & 0xffffe000u));
}
