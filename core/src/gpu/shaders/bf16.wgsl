// BF16: the top half of an f32.
const BLOCK_BYTES: u32 = 2u;
const BLOCK_ELEMS: u32 = 1u;

fn block_dot(o: u32, xi: u32) -> f32 {
    return bitcast<f32>(u16_at(o) << 16u) * x[xi];
}
