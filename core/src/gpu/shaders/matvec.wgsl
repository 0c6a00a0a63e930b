// y[t][row0 + r] = W[r] . x[t] for the rows r of one binding of a weight
// matrix in a GGUF block format, and the tokens t of a batch (`main`); or
// y[y_base + t][r] = W[w0 + r] . x[x_base + idx[idx_base + t]] for the rows
// r < wn of a range of the matrix (one expert of a stack) and chosen rows of
// activations shared by several products (`main_rows`: a MoE expert over the
// tokens routed to it); or the experts a router chose (`main_experts`).
//
// The weights are the file's bytes as they lie (`array<u32>`, read by
// `word` (`weights_one.wgsl`, or `weights_pair.wgsl` for the fused gate
// and up products of `matvec_glu.wgsl`) through the byte helpers below; `f16_at` from `weights_half.wgsl` or
// `weights_f16.wgsl`, which may bind them a second time as f16 values); each format's file supplies BLOCK_BYTES, BLOCK_ELEMS
// and `block_dot(offset, xi)`: the dot product of the block at byte `offset`
// with x[xi .. xi + BLOCK_ELEMS], accumulated in f32. `shaders.rs` adds
// ACT_BLOCK: x holds ACT_BLOCK values per block, the block's
// values and, for the formats with a per-block minimum (Q4_1, Q5_1), the
// activations' block sum as the CPU computed it (x[xi + BLOCK_ELEMS]).
// Offsets into x given in activations (`t * p.cols`, `job.x_base` of
// `main_experts`) go through `act_at`; `job.x_base` of `main_rows` is
// already a position in x.
//
// One workgroup per (row, token): its invocations stride over the row's
// blocks, then sum their partial dots (`sum_all`: `reduce.wgsl`, or
// `reduce_subgroups.wgsl` where the adapter has subgroups).

struct Params {
    // Rows in this binding, row length in elements and in bytes.
    rows: u32,
    cols: u32,
    row_bytes: u32,
    // First row of this binding in the whole matrix; row stride of y.
    row0: u32,
    out_stride: u32,
    // Workgroups along x (rows past 65535 continue along y).
    groups_x: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// One product over chosen rows (`main_rows`, `main_experts`): where its
// activations, its row list and its output start (in elements), how many
// tokens it takes, the matrix rows it computes (`w0 ..`, `wn` of them) and
// the workgroups along x of its grid (rows past them continue along y).
// `main_experts` reads `x_base` as the stride from one expert's input to
// the next and `wn` as the rows of one expert.
struct Job {
    x_base: u32,
    idx_base: u32,
    y_base: u32,
    tokens: u32,
    w0: u32,
    wn: u32,
    groups_x: u32,
    pad: u32,
}

@group(0) @binding(4) var<uniform> job: Job;
@group(0) @binding(5) var<storage, read> idx: array<u32>;

const WG: u32 = 64u;

// Byte `off` of the weights.
fn byte_at(off: u32) -> u32 {
    return (word(off >> 2u) >> ((off & 3u) * 8u)) & 0xffu;
}

// Little-endian u16 at any byte offset.
fn u16_at(off: u32) -> u32 {
    return byte_at(off) | (byte_at(off + 1u) << 8u);
}

// Little-endian u32 at any byte offset (blocks are not word-aligned: Q8_0
// is 34 bytes, Q3_K 110, Q6_K 210).
fn u32_at(off: u32) -> u32 {
    let s = (off & 3u) * 8u;
    let lo = word(off >> 2u);
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (word((off >> 2u) + 1u) << (32u - s));
}

// A byte as a signed 8-bit value.
fn i8_of(b: u32) -> f32 {
    return f32(bitcast<i32>(b << 24u) >> 24u);
}

// Where activation `i` (at a block boundary) of a row lies in x.
fn act_at(i: u32) -> u32 {
    return i / BLOCK_ELEMS * ACT_BLOCK;
}

// W[row] . x[x0 ..][..cols], summed over the workgroup (every invocation
// gets the sum). Rows past the last (the y grid is rounded up) give 0 but
// still meet at the barriers.
fn row_dot(row: u32, x0: u32, lane: Lane) -> f32 {
    let nb = select(0u, p.cols / BLOCK_ELEMS, row < p.rows);
    var acc = 0.0;
    for (var b = lane.lid; b < nb; b += WG) {
        acc += block_dot(row * p.row_bytes + b * BLOCK_BYTES, x0 + b * ACT_BLOCK);
    }
    return sum_all(acc, lane);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let row = wid.y * p.groups_x + wid.x;
    let t = wid.z;
    let sum = row_dot(row, act_at(t * p.cols), lane);
    if (lane.lid == 0u && row < p.rows) {
        y[t * p.out_stride + p.row0 + row] = sum;
    }
}

@compute @workgroup_size(64)
fn main_rows(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let r = wid.y * job.groups_x + wid.x;
    let t = wid.z;
    // The row of the whole matrix, and whether this binding holds it.
    let global = job.w0 + r;
    let ok = r < job.wn && global >= p.row0 && global - p.row0 < p.rows;
    let x0 = job.x_base + act_at(idx[job.idx_base + t] * p.cols);
    let sum = row_dot(select(p.rows, global - p.row0, ok), x0, lane);
    if (lane.lid == 0u && ok) {
        y[job.y_base + t * job.wn + r] = sum;
    }
}

// y[j * R + r] = W[idx[j] * R + r] . x[j * x_stride ..] for the rows r < R
// (`job.wn`) of expert idx[j] that lie in this binding (`main_experts`: a
// MoE layer's routed experts for one token, their ids read on the device
// from the router's output; `x_stride` (`job.x_base`) 0 when every expert
// takes the same input).
@compute @workgroup_size(64)
fn main_experts(@builtin(workgroup_id) wid: vec3<u32>, lane: Lane) {
    let e = expert_row(wid);
    let sum = row_dot(e.row, e.x0, lane);
    if (lane.lid == 0u && e.ok) {
        y[e.y] = sum;
    }
}

// Workgroup `wid`'s row of an expert product (`main_experts`,
// `main_experts_glu`): row r (x, then y) of chosen expert j = wid.z.
struct ExpertRow {
    // The row in this binding (`p.rows`, which reads no weights, when the
    // binding does not hold it), and whether it does.
    row: u32,
    ok: bool,
    // Where the expert's input starts, and the output's index.
    x0: u32,
    y: u32,
}

fn expert_row(wid: vec3<u32>) -> ExpertRow {
    let r = wid.y * job.groups_x + wid.x;
    let j = wid.z;
    let per = job.wn;
    let global = idx[j] * per + r;
    let ok = r < per && global >= p.row0 && global - p.row0 < p.rows;
    return ExpertRow(select(p.rows, global - p.row0, ok), ok, act_at(j * job.x_base), j * per + r);
}
