// F16: one element per "block"; rows of an odd length start mid-word.
const BLOCK_BYTES: u32 = 2u;
const BLOCK_ELEMS: u32 = 1u;

fn block_dot(o: u32, xi: u32) -> f32 {
    return f16_at(o) * x[xi];
}
