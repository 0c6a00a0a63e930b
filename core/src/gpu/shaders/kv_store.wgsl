// A decoded token's keys (or values) into a KV cache on the device
// (`gpu/graph.rs`): row `h` of `src` (`[heads][dim]` f32) to position
// `step[0]` of head h of the cache (`[heads][capacity][dim]`), as f32 or as
// f16 rounded to nearest, ties to even (`round_half.wgsl`), two to a word,
// low half first: the bytes the host's `KvCache::store` writes. One
// invocation per head; with an odd `dim` two heads' rows may share a word,
// so then one invocation writes them all.

struct Params {
    heads: u32,
    dim: u32,
    capacity: u32,
    f16: u32,
}

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> step: array<u32>;

// The f16 bits of `x`, a value an f16 holds exactly (rounded before).
fn half_bits(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    let sign = (bits >> 16u) & 0x8000u;
    let a = bits & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return sign | 0x7c00u | select(0u, 0x200u, a > 0x7f800000u);
    }
    if (a >= 0x38800000u) {
        return sign | ((a - 0x38000000u) >> 13u);
    }
    // Subnormal (or zero): whole steps of 2^-24.
    return sign | u32(bitcast<f32>(a) * 16777216.0);
}

fn write_head(h: u32, pos: u32) {
    let e0 = (h * p.capacity + pos) * p.dim;
    if (p.f16 == 0u) {
        for (var i = 0u; i < p.dim; i++) {
            dst[e0 + i] = bitcast<u32>(src[h * p.dim + i]);
        }
        return;
    }
    let end = e0 + p.dim;
    for (var w = e0 / 2u; 2u * w < end; w++) {
        var word = dst[w];
        for (var half = 0u; half < 2u; half++) {
            let el = 2u * w + half;
            if (el >= e0 && el < end) {
                let bits = half_bits(round_to_half(src[h * p.dim + el - e0]));
                let shift = 16u * half;
                word = (word & ~(0xffffu << shift)) | (bits << shift);
            }
        }
        dst[w] = word;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let pos = step[0];
    if (p.dim % 2u == 1u && p.f16 != 0u) {
        if (gid.x == 0u) {
            for (var h = 0u; h < p.heads; h++) {
                write_head(h, pos);
            }
        }
        return;
    }
    if (gid.x < p.heads) {
        write_head(gid.x, pos);
    }
}
