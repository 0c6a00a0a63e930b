// Sums and maxima over a workgroup of WG invocations in workgroup memory
// (the portable kernels; `reduce_subgroups.wgsl` is the form for adapters
// with subgroup operations). Every invocation must call them (they hold
// barriers), and every invocation gets the result.

// What an invocation knows of its place (an entry point's argument).
struct Lane {
    @builtin(local_invocation_index) lid: u32,
}

var<workgroup> red: array<f32, WG>;

// The sum of every invocation's `x`.
fn sum_all(x: f32, lane: Lane) -> f32 {
    let lid = lane.lid;
    red[lid] = x;
    workgroupBarrier();
    // Tree sum.
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    // Nobody writes `red` again before everybody has read it.
    workgroupBarrier();
    return r;
}

// The largest of every invocation's `x`.
fn max_all(x: f32, lane: Lane) -> f32 {
    let lid = lane.lid;
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
