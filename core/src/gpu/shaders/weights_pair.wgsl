// The fused gate and up products (`matvec_glu.wgsl`) read two matrices of
// one format and shape, split over bindings alike: the gate's (binding 0)
// while `second` is false, the up's (binding 7) while it is true. Every
// invocation of a workgroup sets it alike, so the branch is uniform.
@group(0) @binding(7) var<storage, read> w2: array<u32>;

var<private> second: bool;

fn word(i: u32) -> u32 {
    if (second) {
        return w2[i];
    }
    return w[i];
}
