//! Q2_K: super-blocks of 256 weights in 16 groups of 16, 2 bits each.
//!
//! Each group has a 4-bit scale (low nibble of `scales[g]`) and a 4-bit min
//! (high nibble), both multiplied by the f16 super-scales `d` and `dmin`:
//! value = `d * sc * q - dmin * m`. Bits: the 256 values are 2 halves of 128;
//! in half `h`, byte `l` (0..32) of `qs[32h..]` holds, in bit pair `2j`, value
//! `128h + 32j + l`.

use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16Bytes,
    pub dmin: F16Bytes,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ2K {}

/// The 256 2-bit values of a super-block, in element order.
#[inline(always)]
fn unpack(b: &BlockQ2K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for h in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                v[128 * h + 32 * j + l] = (b.qs[32 * h + l] >> (2 * j)) & 3;
            }
        }
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ2K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        let q = unpack(b);
        for g in 0..16 {
            let dl = d * (b.scales[g] & 0xF) as f32;
            let ml = min * (b.scales[g] >> 4) as f32;
            for l in 16 * g..16 * g + 16 {
                y[l] = dl * q[l] as f32 - ml;
            }
        }
    }
}

/// Dot product of one Q2_K row with Q8_K activations: per super-block the exact
/// integer `sum_g sc_g * sum(q * a)`, minus the mins through the group sums.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let blocks = as_blocks::<BlockQ2K>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        let q = unpack(x);
        let mut isum = 0i32;
        let mut summs = 0i32;
        for g in 0..16 {
            let dot: i32 = (16 * g..16 * g + 16).map(|l| q[l] as i32 * y.qs[l] as i32).sum();
            isum += (x.scales[g] & 0xF) as i32 * dot;
            summs += (x.scales[g] >> 4) as i32 * y.bsums[g] as i32;
        }
        sum += y.d * x.d.to_f32() * isum as f32 - y.d * x.dmin.to_f32() * summs as f32;
    }
    sum
}
