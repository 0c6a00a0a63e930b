//! Q4_0: blocks of 32 weights, 4 bits each, one f16 scale.
//!
//! Byte `j` of `qs` holds value `j` in its low nibble and value `j + 16` in its
//! high nibble; value = `d * (nibble - 8)`.

use super::{as_blocks, BlockQ8_0F, F16Bytes, FileBlock};
use std::mem::size_of;

pub const QK4_0: usize = 32;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Bytes,
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ4_0 {}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ4_0>(src);
    assert_eq!(dst.len(), blocks.len() * QK4_0);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK4_0)) {
        let d = b.d.to_f32();
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Dot product of one Q4_0 row with Q8_0 activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ4_0>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let mut sumi = 0i32;
            for (j, &q) in x.qs.iter().enumerate() {
                sumi += ((q & 0xF) as i32 - 8) * y.qs[j] as i32;
                sumi += ((q >> 4) as i32 - 8) * y.qs[j + 16] as i32;
            }
            *s += sumi as f32 * (x.d.to_f32() * y.d);
        }
    }
    sum
}
