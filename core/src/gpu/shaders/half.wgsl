// f16 <-> f32 by integer arithmetic, shared by the modules that need it:
// `unpack2x16float` needs a capability some adapters lack, and f32
// subnormals (where a rescaling trick would pass) may be flushed to zero.

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
