//! Q5_1: blocks of 32 weights, 5 bits each, an f16 scale and an f16 minimum.
//!
//! Bits as Q5_0; value = `d * q + m`. Dotted with Q8_1 activations.

use super::q5_0::unpack5;
use super::{as_blocks, BlockQ8_1F, F16Bytes, FileBlock};
use std::mem::size_of;

pub const QK5_1: usize = 32;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Bytes,
    pub m: F16Bytes,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ5_1 {}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ5_1>(src);
    assert_eq!(dst.len(), blocks.len() * QK5_1);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK5_1)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (o, q) in y.iter_mut().zip(unpack5(&b.qs, b.qh)) {
            *o = q as f32 * d + m;
        }
    }
}

/// Dot product of one Q5_1 row with Q8_1 activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_1F]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ5_1>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        let q = unpack5(&x.qs, x.qh);
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let sumi: i32 = q.iter().zip(&y.qs).map(|(&q, &p)| q as i32 * p as i32).sum();
            *s += (x.d.to_f32() * y.d) * sumi as f32 + x.m.to_f32() * y.s;
        }
    }
    sum
}
