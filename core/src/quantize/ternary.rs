//! TQ1_0 and TQ2_0, as llama.cpp's `quantize_row_tq1_0_ref` and
//! `quantize_row_tq2_0_ref` make them (the importance vector is not used):
//! the block's largest magnitude is the scale, and each weight becomes the
//! trit `round(x / d) + 1` (rounding half away from zero). Meant for
//! weights that are ternary already (BitNet b1.58, TriLMs); any other
//! weights lose all but their sign and the block maximum.
//!
//! The byte layouts are [`crate::quant::tq`]'s.

use super::common::blocks_mut;
use crate::quant::{BlockTQ1_0, BlockTQ2_0, F16Bytes, QK_K};

/// The scale (the largest magnitude, as C's `MAX` keeps it) and its inverse.
fn scale(x: &[f32]) -> (f32, f32) {
    let d = x.iter().fold(0.0f32, |m, &v| if m > v.abs() { m } else { v.abs() });
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// The stored trit of `x`: `lroundf(x * id) + 1`, kept to a byte as the
/// reference's `uint8_t` arithmetic keeps it.
fn trit(x: f32, id: f32) -> u8 {
    ((x * id).round() as i32 + 1) as u8
}

/// A base-3 number of up to five digits (`q`, at most 242) as the byte
/// `ceil(256 q / 243)`.
fn fraction(q: u8) -> u8 {
    (q as u16 * 256).div_ceil(243) as u8
}

/// Digits `x[step * n]` (n = 0..count) as a base-3 number, first digit most
/// significant.
fn base3(x: &[f32], step: usize, count: usize, id: f32) -> u8 {
    (0..count).fold(0u8, |q, n| q.wrapping_mul(3).wrapping_add(trit(x[step * n], id)))
}

pub(super) fn tq1_0(row: &[f32], _imatrix: Option<&[f32]>, out: &mut [u8]) {
    for (x, b) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockTQ1_0>(out)) {
        let (d, id) = scale(x);
        b.d = F16Bytes::from_f32(d);
        // Values 32 n + m in byte m (m < 32), then 160 + 16 n + m in byte 32 + m.
        for m in 0..32 {
            b.qs[m] = fraction(base3(&x[m..], 32, 5, id));
        }
        for m in 0..16 {
            b.qs[32 + m] = fraction(base3(&x[160 + m..], 16, 5, id));
        }
        // Values 240 + 4 n + j in byte j of qh, four digits and a zero.
        for j in 0..4 {
            b.qh[j] = fraction(base3(&x[240 + j..], 4, 4, id).wrapping_mul(3));
        }
    }
}

pub(super) fn tq2_0(row: &[f32], _imatrix: Option<&[f32]>, out: &mut [u8]) {
    for (x, b) in row.chunks_exact(QK_K).zip(blocks_mut::<BlockTQ2_0>(out)) {
        let (d, id) = scale(x);
        b.d = F16Bytes::from_f32(d);
        // Values 128 h + 32 l + m at bits 2l..2l + 2 of byte 32 h + m.
        for h in 0..2 {
            for m in 0..32 {
                b.qs[32 * h + m] = (0..4).fold(0u8, |q, l| q | (trit(x[128 * h + 32 * l + m], id) & 3) << (2 * l));
            }
        }
    }
}
