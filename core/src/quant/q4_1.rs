//! Q4_1: blocks of 32 weights, 4 bits each, an f16 scale and an f16 minimum.
//!
//! Nibble layout as Q4_0; value = `d * nibble + m`. Dotted with Q8_1
//! activations, whose `s = d_a * sum(q_a)` folds the minimum in per block.

use super::{as_blocks, BlockQ8_1F, F16Bytes, FileBlock};
use std::mem::size_of;

pub const QK4_1: usize = 32;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Bytes,
    pub m: F16Bytes,
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ4_1 {}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ4_1>(src);
    assert_eq!(dst.len(), blocks.len() * QK4_1);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK4_1)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = (q & 0xF) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

/// Dot product of one Q4_1 row with Q8_1 activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_1F]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ4_1>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let mut sumi = 0i32;
            for (j, &q) in x.qs.iter().enumerate() {
                sumi += (q & 0xF) as i32 * y.qs[j] as i32;
                sumi += (q >> 4) as i32 * y.qs[j + 16] as i32;
            }
            *s += (x.d.to_f32() * y.d) * sumi as f32 + x.m.to_f32() * y.s;
        }
    }
    sum
}
