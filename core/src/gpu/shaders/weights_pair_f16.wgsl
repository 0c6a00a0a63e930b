// The up matrix's f16 values (binding 8), beside the gate's (binding 6).
@group(0) @binding(8) var<storage, read> w2_16: array<f16>;

fn half_word(i: u32) -> f16 {
    if (second) {
        return w2_16[i];
    }
    return w16[i];
}
