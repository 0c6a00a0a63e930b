// Word `i` of the weights: one matrix per product.
fn word(i: u32) -> u32 {
    return w[i];
}
