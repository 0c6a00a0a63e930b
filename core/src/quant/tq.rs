//! TQ1_0 and TQ2_0: ternary super-blocks of 256 (BitNet b1.58, TriLMs), each
//! value `d * t` with `t` in {-1, 0, 1} stored as the trit `t + 1`, one f16
//! scale per block. Dotted with Q8_K activations.
//!
//! TQ2_0: two bits per value; byte `m` of each 32-byte half of `qs` holds
//! values `128 h + 32 l + m` at bits `2l..2l + 2` (l = 0..4). A stored 3
//! (which no quantiser writes) reads as `t = 2`, as llama.cpp reads it.
//!
//! TQ1_0: five trits per byte as a fixed-point fraction of 3^5: a byte `q`
//! holds `ceil(256 * n / 243)` for the base-3 number `n` whose most
//! significant digit is the first value, and digit `k` is recovered as
//! `((q * 3^k mod 256) * 3) >> 8`. `qs` has 48 such bytes: bytes 0..32
//! carry values `32 k + m` (k = 0..5), bytes 32..48 values `160 + 16 k + m`;
//! `qh` has four bytes of four trits (the fifth digit is 0), values
//! `240 + 4 k + j`.

use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockTQ1_0 {
    /// Five trits per byte.
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    /// Four trits per byte.
    pub qh: [u8; QK_K / 64],
    pub d: F16Bytes,
}
const _: () = assert!(size_of::<BlockTQ1_0>() == 54);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockTQ1_0 {}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockTQ2_0 {
    /// Four 2-bit trits per byte.
    pub qs: [u8; QK_K / 4],
    pub d: F16Bytes,
}
const _: () = assert!(size_of::<BlockTQ2_0>() == 66);
// SAFETY: as above.
unsafe impl FileBlock for BlockTQ2_0 {}

/// 3^k for the digits of a TQ1_0 byte.
pub const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Digit `k` (0 = most significant) of a TQ1_0 byte: the stored trit, 0..=2.
#[inline(always)]
pub fn trit(q: u8, k: usize) -> u8 {
    let shifted = q.wrapping_mul(POW3[k]);
    ((shifted as u16 * 3) >> 8) as u8
}

/// The 256 stored trits (0..=2) of a TQ1_0 block, in value order.
#[inline(always)]
pub fn trits_tq1(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut t = [0u8; QK_K];
    for k in 0..5 {
        for m in 0..32 {
            t[32 * k + m] = trit(b.qs[m], k);
        }
        for m in 0..16 {
            t[160 + 16 * k + m] = trit(b.qs[32 + m], k);
        }
    }
    for k in 0..4 {
        for j in 0..4 {
            t[240 + 4 * k + j] = trit(b.qh[j], k);
        }
    }
    t
}

/// The 256 stored 2-bit values (0..=3) of a TQ2_0 block, in value order.
#[inline(always)]
pub fn trits_tq2(b: &BlockTQ2_0) -> [u8; QK_K] {
    let mut t = [0u8; QK_K];
    for h in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                t[128 * h + 32 * l + m] = (b.qs[32 * h + m] >> (2 * l)) & 3;
            }
        }
    }
    t
}

fn dequantize(trits: &[u8; QK_K], d: f32, y: &mut [f32]) {
    for (o, &t) in y.iter_mut().zip(trits) {
        *o = (t as i32 - 1) as f32 * d;
    }
}

/// `sum (t - 1) * y` over one block's stored trits and a Q8_K block.
#[inline(always)]
fn dot_trits(trits: &[u8; QK_K], y: &BlockQ8K) -> i32 {
    trits.iter().zip(&y.qs).map(|(&t, &q)| (t as i32 - 1) * q as i32).sum()
}

pub fn dequantize_row_tq1_0(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockTQ1_0>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        dequantize(&trits_tq1(b), b.d.to_f32(), y);
    }
}

pub fn dequantize_row_tq2_0(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockTQ2_0>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        dequantize(&trits_tq2(b), b.d.to_f32(), y);
    }
}

/// Dot product of one TQ1_0 row with Q8_K activations.
pub fn vec_dot_tq1_0(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let blocks = as_blocks::<BlockTQ1_0>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        sum += dot_trits(&trits_tq1(x), y) as f32 * (x.d.to_f32() * y.d);
    }
    sum
}

/// Dot product of one TQ2_0 row with Q8_K activations.
pub fn vec_dot_tq2_0(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let blocks = as_blocks::<BlockTQ2_0>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        sum += dot_trits(&trits_tq2(x), y) as f32 * (y.d * x.d.to_f32());
    }
    sum
}
