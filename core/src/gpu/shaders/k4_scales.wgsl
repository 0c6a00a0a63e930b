// The 6-bit scale and min of group j (0..8) of a Q4_K/Q5_K super-block,
// packed in the 12 bytes at `o`: for j < 4 the low 6 bits of bytes j and
// j + 4; above, the nibbles of byte j + 4 with the top 2 bits of bytes
// j - 4 and j.
fn k4_scale_min(o: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_at(o + j) & 63u), f32(byte_at(o + j + 4u) & 63u));
    }
    let b = byte_at(o + j + 4u);
    let sc = (b & 15u) | ((byte_at(o + j - 4u) >> 6u) << 4u);
    let m = (b >> 4u) | ((byte_at(o + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
