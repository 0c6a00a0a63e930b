//! Q5_0: blocks of 32 weights, 5 bits each, one f16 scale.
//!
//! Low nibbles as Q4_0; bit `j` of the little-endian `qh` word is the fifth bit
//! of value `j`. Value = `d * (q - 16)`.

use super::{as_blocks, BlockQ8_0F, F16Bytes, FileBlock};
use std::mem::size_of;

pub const QK5_0: usize = 32;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Bytes,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ5_0 {}

/// The 32 unsigned 5-bit values (0..32) of a block with nibbles `qs` and high bits `qh`.
#[inline(always)]
pub(crate) fn unpack5(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let h = u32::from_le_bytes(qh);
    let mut v = [0u8; 32];
    for j in 0..16 {
        v[j] = (qs[j] & 0xF) | ((((h >> j) & 1) as u8) << 4);
        v[j + 16] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ5_0>(src);
    assert_eq!(dst.len(), blocks.len() * QK5_0);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK5_0)) {
        let d = b.d.to_f32();
        for (o, q) in y.iter_mut().zip(unpack5(&b.qs, b.qh)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Dot product of one Q5_0 row with Q8_0 activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ5_0>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        let q = unpack5(&x.qs, x.qh);
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let sumi: i32 = q.iter().zip(&y.qs).map(|(&q, &p)| (q as i32 - 16) * p as i32).sum();
            *s += sumi as f32 * (x.d.to_f32() * y.d);
        }
    }
    sum
}
