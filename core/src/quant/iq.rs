//! What the IQ1 / IQ2 formats share: weights that are 8-wide rows of a fixed
//! grid (looked up by index, see [`super::iq_grids`]), signs, and an odd
//! scale `2s + 1` per group of 16 or 32.
//!
//! Each format's file unpacks a block into [`Unpacked`]: its 256 weights as
//! signed integers and one scale nibble per group of 16. For IQ2 a weight is
//! `grid * sign` (|v| <= 43) and its value `d * (0.5 + s) / 4 * v`; for IQ1
//! it is `8 * grid + delta` (|v| <= 9, the delta +-1/8 scaled by 8) and its
//! value `d * (2s + 1) * v / 8`. Either way the dot product with Q8_K
//! activations is `d * d_y * sum_g (2 s_g + 1) * sum(v * y) / 8`, exactly in
//! integers up to the last step, which is what llama.cpp computes.

use super::{BlockQ8K, QK_K};

/// One block's weights (in element order) and its group scales.
pub struct Unpacked {
    pub v: [i8; QK_K],
    /// The 4-bit (IQ2) or 3-bit (IQ1) scale of each group of 16 weights.
    pub s: [u8; QK_K / 16],
}

impl Unpacked {
    pub(crate) fn new() -> Unpacked {
        Unpacked { v: [0; QK_K], s: [0; QK_K / 16] }
    }
}

/// Grid row `i` of `table` as its 8 bytes.
#[inline(always)]
pub(crate) fn grid(table: &[u64], i: usize) -> [u8; 8] {
    table[i].to_le_bytes()
}

/// An IQ2 grid row with its signs applied (bit `j` of `signs` negates weight `j`).
#[inline(always)]
pub(crate) fn signed(g: [u8; 8], signs: u8) -> [i8; 8] {
    std::array::from_fn(|j| if signs >> j & 1 != 0 { -(g[j] as i8) } else { g[j] as i8 })
}

/// `sum_g (2 s_g + 1) * sum(v * y)` over the 16 groups of one block.
#[inline(always)]
pub(crate) fn scaled_sum(u: &Unpacked, y: &BlockQ8K) -> i32 {
    let mut sum = 0i32;
    for g in 0..QK_K / 16 {
        let dot: i32 = (16 * g..16 * g + 16).map(|l| u.v[l] as i32 * y.qs[l] as i32).sum();
        sum += (2 * u.s[g] as i32 + 1) * dot;
    }
    sum
}

/// The dot product of blocks (weight scale `d`, unpacked by `unpack`) with
/// Q8_K activations, as llama.cpp sums it: per block `d * d_y * isum`, the
/// total times 1/8.
#[inline(always)]
pub(crate) fn vec_dot<B>(
    blocks: &[B],
    a: &[BlockQ8K],
    d: impl Fn(&B) -> f32,
    unpack: impl Fn(&B, &mut Unpacked),
) -> f32 {
    assert_eq!(blocks.len(), a.len());
    let mut u = Unpacked::new();
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        unpack(x, &mut u);
        sum += d(x) * y.d * scaled_sum(&u, y) as f32;
    }
    0.125 * sum
}

/// IQ2 dequantisation: `d * (0.5 + s) * 0.25 * v`, in gguf-py's order.
#[inline(always)]
pub(crate) fn dequantize_iq2(u: &Unpacked, d: f32, y: &mut [f32]) {
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let db = d * (0.5 + u.s[g] as f32) * 0.25;
        for (o, &v) in y.iter_mut().zip(&u.v[16 * g..16 * g + 16]) {
            *o = db * v as f32;
        }
    }
}

/// IQ1 dequantisation: `d * (2s + 1) * (grid + delta)`, with `grid + delta`
/// recovered exactly as `v / 8`.
#[inline(always)]
pub(crate) fn dequantize_iq1(u: &Unpacked, d: f32, y: &mut [f32]) {
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * (2 * u.s[g] as i32 + 1) as f32;
        for (o, &v) in y.iter_mut().zip(&u.v[16 * g..16 * g + 16]) {
            *o = dl * (v as f32 * 0.125);
        }
    }
}

/// Sign pattern `s` as 8 bytes for a SIMD sign instruction: byte `j` is -1
/// (0xFF) where bit `j` is set, +1 where it is clear.
const fn sign_bytes(s: u8) -> u64 {
    let mut v = 0u64;
    let mut j = 0;
    while j < 8 {
        v |= (if s >> j & 1 != 0 { 0xFF } else { 0x01 }) << (8 * j);
        j += 1;
    }
    v
}

/// [`sign_bytes`] of every sign byte (IQ2_S stores whole sign bytes).
pub static SIGN_BYTES: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = sign_bytes(i as u8);
        i += 1;
    }
    t
};

/// [`sign_bytes`] of `KSIGNS_IQ2XS[i]`: the 7 stored bits and, as bit 7, their
/// parity (the rule that table follows, checked by a test).
pub static KSIGN_BYTES: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = sign_bytes(ksign(i as u8));
        i += 1;
    }
    t
};

/// The 8-bit sign pattern of 7 stored bits: an even number of minus signs.
pub(crate) const fn ksign(i: u8) -> u8 {
    i | ((i.count_ones() as u8 & 1) << 7)
}
