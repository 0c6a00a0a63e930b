//! Q8_K: the activation format of the K-quants.
//!
//! 256 signed bytes with an f32 scale and the sums of each group of 16, which
//! let a K-quant fold its per-sub-block minimum (or offset) in without a second
//! pass over the activations. Never stored in files, so it keeps natural
//! alignment.

use super::QK_K;
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] }
    }
}

/// Quantise `x` (a multiple of 256 long) into `y`, bit-identical to llama.cpp's
/// `quantize_row_q8_K_ref`: the scale maps the value of largest magnitude to
/// -127, values round half to even, and `d = 1 / iscale`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(x.len(), y.len() * QK_K, "Q8_K: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        // The first value of largest magnitude, with its sign.
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (super::round_even(iscale * v) as i32).min(127) as i8;
        }
        for (s, g) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

pub fn dequantize_row(x: &[BlockQ8K], dst: &mut [f32]) {
    assert_eq!(dst.len(), x.len() * QK_K);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}
