//! Q6_K: super-blocks of 256 weights in 16 groups of 16, 6 bits each.
//!
//! Each group has a signed 8-bit scale times the f16 super-scale `d`:
//! value = `d * sc * (q - 32)`. Bits: two halves of 128; in half `h`, byte `l`
//! (0..32) of `qh[32h..]` holds bit pairs 4-5 of values `128h + l + 32t` for
//! `t` = 0..4 (pair `2t`); `ql[64h + l]` holds the low nibbles of `128h + l`
//! (low) and `128h + 64 + l` (high), `ql[64h + 32 + l]` those of `128h + 32 + l`
//! and `128h + 96 + l`.

use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16Bytes,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ6K {}

/// The 256 signed 6-bit values (-32..32) of a super-block, in element order.
#[inline(always)]
fn unpack(b: &BlockQ6K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b.ql[64 * h..64 * h + 64], &b.qh[32 * h..32 * h + 32]);
        let y = &mut v[128 * h..128 * h + 128];
        for l in 0..32 {
            y[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ6K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let q = unpack(b);
        for g in 0..16 {
            let dl = d * b.scales[g] as f32;
            for l in 16 * g..16 * g + 16 {
                y[l] = dl * q[l] as f32;
            }
        }
    }
}

/// Dot product of one Q6_K row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ6K>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        let q = unpack(x);
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let mut isum = 0i32;
            for g in 0..16 {
                let dot: i32 = (16 * g..16 * g + 16).map(|l| q[l] as i32 * y.qs[l] as i32).sum();
                isum += x.scales[g] as i32 * dot;
            }
            *s += x.d.to_f32() * y.d * isum as f32;
        }
    }
    sum
}
