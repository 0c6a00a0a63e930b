// A GLU feed-forward's gate and up products and the activation between
// them in one pass: y[r] = act(G[r] . x) * (U[r] . x), as `ffn::Dense` and
// the routed experts compute it (the two products, then `Act::apply`).
// Each workgroup computes its row of the gate, then the same row of the
// up matrix (`second`, `weights_pair.wgsl`), over the same activations:
// the same sums as two `main` or `main_experts` products and the `glu`
// operation of `graph.wgsl`, with one dispatch and no intermediate buffers.
// `job.pad` is the activation: 0 SiLU, 1 GELU (`act.wgsl`).

fn act_times(g: f32, u: f32) -> f32 {
    return select(silu(g), gelu(g), job.pad == 1u) * u;
}

// Both products of row `row` of this binding over x[x0 ..].
fn glu_dot(row: u32, x0: u32, lane: Lane) -> f32 {
    second = false;
    let g = row_dot(row, x0, lane);
    second = true;
    let u = row_dot(row, x0, lane);
    return act_times(g, u);
}

// One token, every row (as `main`; `job` carries only the activation).
@compute @workgroup_size(64)
fn main_glu(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let row = wid.y * p.groups_x + wid.x;
    let y_row = glu_dot(row, 0u, lane);
    if (lane.lid == 0u && row < p.rows) {
        y[p.row0 + row] = y_row;
    }
}

// The experts a router chose (as `main_experts`).
@compute @workgroup_size(64)
fn main_experts_glu(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let e = expert_row(wid);
    let y_row = glu_dot(e.row, e.x0, lane);
    if (lane.lid == 0u && e.ok) {
        y[e.y] = y_row;
    }
}
