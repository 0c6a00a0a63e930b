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
        let (lo, hi) = min_max(xb);
        let Some(iscale) = inverse_scale(xb, lo, hi) else {
            *yb = BlockQ8K::default();
            continue;
        };
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (super::round_even(iscale * v) as i32).min(127) as i8;
        }
        for (s, g) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

/// `-127 / max` for the first value `max` of largest magnitude in `xb`, with
/// its sign, from the block's `lo = min(0, x)` and `hi = max(0, x)` (NaNs
/// ignored); `None` for a block of zeros. Shared with the SIMD quantisers,
/// which find `lo` and `hi` their own way.
#[inline]
pub(crate) fn inverse_scale(xb: &[f32], lo: f32, hi: f32) -> Option<f32> {
    let amax = hi.max(-lo);
    let max = if hi > -lo {
        hi
    } else if -lo > hi {
        lo
    } else {
        // Both signs reach the largest magnitude: the first one wins.
        xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0)
    };
    (amax != 0.0).then(|| -127.0 / max)
}

/// `(min(0, x), max(0, x))` over a block, ignoring NaNs: eight independent
/// lanes, so the compiler keeps it in vector registers.
#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([0.0f32; 8], [0.0f32; 8]);
    for c in x.chunks_exact(8) {
        for i in 0..8 {
            lo[i] = lo[i].min(c[i]);
            hi[i] = hi[i].max(c[i]);
        }
    }
    (lo.iter().fold(0.0f32, |a, &v| a.min(v)), hi.iter().fold(0.0f32, |a, &v| a.max(v)))
}

pub fn dequantize_row(x: &[BlockQ8K], dst: &mut [f32]) {
    assert_eq!(dst.len(), x.len() * QK_K);
    for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}
