// The gated delta rule of one Gated DeltaNet layer over a pass's tokens,
// token after token, for every value head h (key head h mod n_k_heads) with
// state S (d_k x d_v, rows by key dimension):
//
//   u = S^T k;  o = S^T (q / sqrt(d_k))
//   d = (v - exp(g) u) * beta
//   o <- exp(g) o + (q . k) d
//   S <- exp(g) S + k d^T
//
// (the state decayed by exp(g) and updated by the delta, reordered so that
// S is read and written once per token, as on the CPU).
//
// One workgroup per value head. Column j of S, u, d and o belong to one
// invocation only, so the columns need no synchronisation; the token's q
// and k are shared through workgroup memory.

struct Params {
    // Tokens, value heads, key heads, key and value head sizes.
    n: u32,
    n_v_heads: u32,
    n_k_heads: u32,
    d_k: u32,
    d_v: u32,
    // Values per token in qkv (q | k | v), and the start of k in it.
    conv_dim: u32,
    key_dim: u32,
    q_scale: f32,
}

@group(0) @binding(0) var<storage, read_write> state: array<f32>;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
// The decays exp(g) (taken on the host, as the CPU takes them) then beta:
// `[2][n][n_v_heads]`.
@group(0) @binding(2) var<storage, read> gb: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

const WG: u32 = 64u;
// The largest key head the kernel takes (the host checks).
const MAX_D_K: u32 = 512u;
var<workgroup> qs: array<f32, MAX_D_K>;
var<workgroup> ks: array<f32, MAX_D_K>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let kh = h % p.n_k_heads;
    let dk = p.d_k;
    let dv = p.d_v;
    let sb = h * dk * dv;
    let vd = p.n_v_heads * dv;
    for (var t = 0u; t < p.n; t++) {
        let row = t * p.conv_dim;
        // Everybody is done with the last token's q and k.
        workgroupBarrier();
        for (var i = lid; i < dk; i += WG) {
            qs[i] = qkv[row + kh * dk + i] * p.q_scale;
            ks[i] = qkv[row + p.key_dim + kh * dk + i];
        }
        workgroupBarrier();
        let decay = gb[t * p.n_v_heads + h];
        let beta = gb[(p.n + t) * p.n_v_heads + h];
        var qk = 0.0;
        for (var i = 0u; i < dk; i++) {
            qk += qs[i] * ks[i];
        }
        for (var j = lid; j < dv; j += WG) {
            var u = 0.0;
            var o = 0.0;
            for (var i = 0u; i < dk; i++) {
                let s = state[sb + i * dv + j];
                u += ks[i] * s;
                o += qs[i] * s;
            }
            let d = (qkv[row + 2u * p.key_dim + h * dv + j] - decay * u) * beta;
            out[t * vd + h * dv + j] = decay * o + qk * d;
            for (var i = 0u; i < dk; i++) {
                let at = sb + i * dv + j;
                state[at] = decay * state[at] + ks[i] * d;
            }
        }
    }
}
