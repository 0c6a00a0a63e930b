//! MXFP4 (OCP microscaling FP4): blocks of 32 E2M1 values with one shared
//! power-of-two scale, an E8M0 exponent byte.
//!
//! The E2M1 values are held doubled as int8 ([`KVALUES_MXFP4`]: 0, 0.5, 1,
//! 1.5, 2, 3, 4, 6 and their negatives, times 2), so the scale is taken at
//! half, `2^(e - 128)` ([`e8m0_to_f32_half`]): value = `half(e) * KVALUES[q]`.
//! Nibbles as in Q4_0: byte `j` holds value `j` (low) and `j + 16` (high).
//! Dotted with Q8_0 activations, as llama.cpp's CPU backend does.

use super::{as_blocks, BlockQ8_0F, FileBlock};
use std::mem::size_of;

/// E2M1 values, doubled (`kvalues_mxfp4`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

pub const QK_MXFP4: usize = 32;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockMXFP4 {
    /// E8M0 exponent: the scale is `2^(e - 127)`.
    pub e: u8,
    pub qs: [u8; QK_MXFP4 / 2],
}
const _: () = assert!(size_of::<BlockMXFP4>() == 17);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockMXFP4 {}

/// `2^(e - 128)`, half the E8M0 scale, as llama.cpp's
/// `ggml_e8m0_to_fp32_half`: f32 subnormals for `e < 2`, and no NaN (0xFF
/// is read as the finite `2^127`, as llama.cpp reads it).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e - 1) as u32) << 23)
    }
}

/// 16 bytes of nibbles -> the 32 doubled values: low nibbles, then high ones.
#[inline(always)]
fn values(qs: &[u8; 16]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for (j, &q) in qs.iter().enumerate() {
        v[j] = KVALUES_MXFP4[(q & 0xF) as usize];
        v[j + 16] = KVALUES_MXFP4[(q >> 4) as usize];
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockMXFP4>(src);
    assert_eq!(dst.len(), blocks.len() * QK_MXFP4);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_f32_half(b.e);
        for (o, &v) in y.iter_mut().zip(&values(&b.qs)) {
            *o = v as f32 * d;
        }
    }
}

/// Dot product of one MXFP4 row with Q8_0 activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    let blocks = as_blocks::<BlockMXFP4>(w);
    assert_eq!(blocks.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in blocks.iter().zip(a) {
        let sumi: i32 = values(&x.qs).iter().zip(&y.qs).map(|(&v, &q)| v as i32 * q as i32).sum();
        sum += (y.d * e8m0_to_f32_half(x.e)) * sumi as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_scale_is_half_the_e8m0_scale_and_never_nan() {
        for e in 0..=255u8 {
            let h = e8m0_to_f32_half(e) as f64;
            assert!(h.is_finite() && h > 0.0, "e {e}");
            assert_eq!(h, 2f64.powi(e as i32 - 128), "e {e}");
        }
    }
}
