//! NEON activation quantiser: Q8_K (the K-quants' activations), equal to the
//! bit to [`crate::quant::q8_k::quantize_row_q8_k`].

use crate::quant::q8_k::{inverse_scale, BlockQ8K};
use crate::quant::QK_K;
use std::arch::aarch64::*;

/// [`crate::quant::q8_k::quantize_row_q8_k`], 16 values per step: the
/// minimum and maximum with `fminnm` / `fmaxnm` (which ignore NaNs, as the
/// scalar `min` / `max` do), products rounded half to even by `fcvtns` (the
/// scalar rounding for these magnitudes), narrowed with saturation (the
/// scalar clamp at 127; no value reaches -128) and each group of 16 summed
/// with `saddlv`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let p = xb.as_ptr();
        let (mut lo, mut hi) = ([vdupq_n_f32(0.0); 2], [vdupq_n_f32(0.0); 2]);
        for i in (0..QK_K).step_by(8) {
            let (a, b) = (vld1q_f32(p.add(i)), vld1q_f32(p.add(i + 4)));
            lo = [vminnmq_f32(lo[0], a), vminnmq_f32(lo[1], b)];
            hi = [vmaxnmq_f32(hi[0], a), vmaxnmq_f32(hi[1], b)];
        }
        let (lo, hi) = (vminnmvq_f32(vminnmq_f32(lo[0], lo[1])), vmaxnmvq_f32(vmaxnmq_f32(hi[0], hi[1])));
        let Some(iscale) = inverse_scale(xb, lo, hi) else {
            *yb = BlockQ8K::default();
            continue;
        };
        let s = vdupq_n_f32(iscale);
        for g in 0..QK_K / 16 {
            let i = |k: usize| vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p.add(16 * g + 4 * k)), s));
            let h0 = vqmovn_high_s32(vqmovn_s32(i(0)), i(1));
            let h1 = vqmovn_high_s32(vqmovn_s32(i(2)), i(3));
            let q = vqmovn_high_s16(vqmovn_s16(h0), h1);
            vst1q_s8(yb.qs.as_mut_ptr().add(16 * g), q);
            yb.bsums[g] = vaddlvq_s8(q);
        }
        yb.d = 1.0 / iscale;
    }
}
