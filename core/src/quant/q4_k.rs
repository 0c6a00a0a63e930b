//! Q4_K: super-blocks of 256 weights in 8 groups of 32, 4 bits each.
//!
//! Each group has a 6-bit scale and a 6-bit min (see [`scale_min_k4`]) times
//! the f16 super-scales: value = `d * sc * q - dmin * m`. Bits: byte `l` of
//! `qs[32c..]` (chunk `c` of 4) holds value `64c + l` in its low nibble and
//! `64c + 32 + l` in its high nibble.

use super::{as_blocks, scales_mins_k4, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Bytes,
    pub dmin: F16Bytes,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ4K {}

/// The 256 unsigned 4-bit values of a super-block, in element order.
#[inline(always)]
fn unpack(b: &BlockQ4K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            v[64 * c + l] = b.qs[32 * c + l] & 0xF;
            v[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
        }
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ4K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        let (sc, m) = scales_mins_k4(&b.scales);
        let q = unpack(b);
        for g in 0..8 {
            let (dl, ml) = (d * sc[g] as f32, min * m[g] as f32);
            for l in 32 * g..32 * g + 32 {
                y[l] = dl * q[l] as f32 - ml;
            }
        }
    }
}

/// Dot product of one Q4_K row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ4K>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        let (sc, m) = scales_mins_k4(&x.scales);
        let q = unpack(x);
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let mut isum = 0i32;
            let mut summs = 0i32;
            for g in 0..8 {
                let dot: i32 = (32 * g..32 * g + 32).map(|l| q[l] as i32 * y.qs[l] as i32).sum();
                isum += sc[g] as i32 * dot;
                summs += m[g] as i32 * (y.bsums[2 * g] as i32 + y.bsums[2 * g + 1] as i32);
            }
            *s += x.d.to_f32() * y.d * isum as f32 - x.dmin.to_f32() * y.d * summs as f32;
        }
    }
    sum
}
