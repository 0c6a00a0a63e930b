// Q8_0: d (f16), qs[32] (i8); value = d * q.
const BLOCK_BYTES: u32 = 34u;
const BLOCK_ELEMS: u32 = 32u;

fn block_dot(o: u32, xi: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 32u; j++) {
        s += i8_of(byte_at(o + 2u + j)) * x[xi + j];
    }
    return f16_at(o) * s;
}
