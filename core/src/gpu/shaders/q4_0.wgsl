// Q4_0: d (f16), qs[16]; element j is the low nibble of qs[j], element
// j + 16 its high nibble; value = d * (q - 8).
const BLOCK_BYTES: u32 = 18u;
const BLOCK_ELEMS: u32 = 32u;

fn block_dot(o: u32, xi: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(o + 2u + j);
        s += (f32(q & 15u) - 8.0) * x[xi + j] + (f32(q >> 4u) - 8.0) * x[xi + j + 16u];
    }
    return f16_at(o) * s;
}
