// The f16 value `i` of the weights (`weights_f16.wgsl`): one matrix per product.
fn half_word(i: u32) -> f16 {
    return w16[i];
}
