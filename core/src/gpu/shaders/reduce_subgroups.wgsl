// Sums and maxima over a workgroup of WG invocations with subgroup
// operations (the kernels for adapters that have them; `reduce.wgsl` is the
// portable form): each subgroup reduces in registers, then every invocation
// combines the subgroups' results from workgroup memory. Any subgroup size
// works (1 to WG and more: a subgroup larger than the workgroup is one
// partial subgroup). Every invocation must call them (they hold barriers),
// and every invocation gets the result.

// What an invocation knows of its place (an entry point's argument).
struct Lane {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
}

var<workgroup> red: array<f32, WG>;

// The sum of every invocation's `x`.
fn sum_all(x: f32, lane: Lane) -> f32 {
    let s = subgroupAdd(x);
    if (lane.sg_lane == 0u) {
        red[lane.sg_id] = s;
    }
    workgroupBarrier();
    var r = 0.0;
    for (var i = 0u; i < lane.n_sg; i++) {
        r += red[i];
    }
    // Nobody writes `red` again before everybody has read it.
    workgroupBarrier();
    return r;
}

// The largest of every invocation's `x`.
fn max_all(x: f32, lane: Lane) -> f32 {
    let m = subgroupMax(x);
    if (lane.sg_lane == 0u) {
        red[lane.sg_id] = m;
    }
    workgroupBarrier();
    var r = red[0];
    for (var i = 1u; i < lane.n_sg; i++) {
        r = max(r, red[i]);
    }
    workgroupBarrier();
    return r;
}
