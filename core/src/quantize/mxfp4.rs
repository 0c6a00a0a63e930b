//! MXFP4: blocks of 32 E2M1 values under one power-of-two scale, as
//! llama.cpp's `quantize_row_mxfp4_ref` makes them (the importance vector
//! is not used).
//!
//! The scale exponent puts the block's largest magnitude in the top binade
//! of the format (`floor(log2(amax)) - 2`); each weight then takes the
//! nearest of the 16 values (first of equals, in table order).

use super::iq::blocks_mut;
use crate::quant::mxfp4::{e8m0_to_f32_half, BlockMXFP4, KVALUES_MXFP4, QK_MXFP4};

/// The index of the value nearest `x` at half-scale `d`.
fn nearest_index(x: f32, d: f32) -> u8 {
    let err = |i: usize| (KVALUES_MXFP4[i] as f32 * d - x).abs();
    (1..16).fold(0, |best, i| if err(i) < err(best) { i } else { best }) as u8
}

pub(super) fn mxfp4(row: &[f32], _imatrix: Option<&[f32]>, out: &mut [u8]) {
    for (x, b) in row.chunks_exact(QK_MXFP4).zip(blocks_mut::<BlockMXFP4>(out)) {
        let amax = x.iter().fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
        // The E8M0 exponent (C's float -> uint8 conversion goes through a
        // 32-bit integer, so an out-of-range exponent wraps as it does there).
        b.e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as i32 as u8 } else { 0 };
        let d = e8m0_to_f32_half(b.e);
        for (j, q) in b.qs.iter_mut().enumerate() {
            *q = nearest_index(x[j], d) | nearest_index(x[j + QK_MXFP4 / 2], d) << 4;
        }
    }
}
