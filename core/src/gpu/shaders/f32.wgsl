// F32: one element per "block".
const BLOCK_BYTES: u32 = 4u;
const BLOCK_ELEMS: u32 = 1u;

fn block_dot(o: u32, xi: u32) -> f32 {
    return bitcast<f32>(u32_at(o)) * x[xi];
}
