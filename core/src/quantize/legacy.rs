//! F32/F16/BF16 and the 32-weight formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Without an importance vector each block is rounded from its extremes
//! alone (llama.cpp's reference quantisers). With one, Q4_0 and Q5_0 search
//! a symmetric scale and Q4_1 and Q5_1 a scale and offset, each value's
//! error weighted by importance · sqrt(σ² + x²), σ² the row's mean square.
//! Q8_0 has no weighted search: llama.cpp ignores the importance vector.

use super::common::{
    c_float_to_int, each_block, importance, make_qkx_quants, make_qx_quants, signed_max, sum_squares, ScaleMinSearch,
};
use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, F16Bytes};

const QK: usize = 32;

/// The scale-and-offset search of the weighted Q4_1/Q5_1.
const WEIGHTED_SEARCH: ScaleMinSearch = ScaleMinSearch { rmin: -0.9, rdelta: 0.05, steps: 36, mad: false };

pub(super) fn f32(row: &[f32], _: Option<&[f32]>, out: &mut [u8]) {
    for (v, o) in row.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

pub(super) fn f16(row: &[f32], _: Option<&[f32]>, out: &mut [u8]) {
    for (&v, o) in row.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&F16Bytes::from_f32(v).0);
    }
}

pub(super) fn bf16(row: &[f32], _: Option<&[f32]>, out: &mut [u8]) {
    for (&v, o) in row.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&bf16_bits(v).to_le_bytes());
    }
}

/// f32 -> bf16, rounding to nearest even; NaNs stay NaN, made quiet.
fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) as u16
}

/// The mean square of a row: σ² of the weighted searches.
fn mean_square(row: &[f32]) -> f32 {
    sum_squares(row) / row.len() as f32
}

pub(super) fn q4_0(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let sigma2 = imatrix.map_or(0.0, |_| mean_square(row));
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ4_0| {
        let mut l = [0u8; QK];
        let d = match qw {
            None => symmetric_levels(x, 8, &mut l),
            Some(qw) => make_qx_quants(8, x, Some(&importance(x, qw, sigma2)), &mut l),
        };
        b.d = F16Bytes::from_f32(d);
        b.qs = nibbles(&l);
    });
}

pub(super) fn q5_0(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let sigma2 = imatrix.map_or(0.0, |_| mean_square(row));
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ5_0| {
        let mut l = [0u8; QK];
        let d = match qw {
            None => symmetric_levels(x, 16, &mut l),
            Some(qw) => make_qx_quants(16, x, Some(&importance(x, qw, sigma2)), &mut l),
        };
        b.d = F16Bytes::from_f32(d);
        (b.qh, b.qs) = five_bits(&l);
    });
}

pub(super) fn q4_1(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let sigma2 = imatrix.map_or(0.0, |_| mean_square(row));
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ4_1| {
        let mut l = [0u8; QK];
        let (d, m) = match qw {
            None => range_levels(x, 15, &mut l),
            Some(qw) => weighted_range_levels(x, &importance(x, qw, sigma2), 15, &mut l),
        };
        (b.d, b.m) = (F16Bytes::from_f32(d), F16Bytes::from_f32(m));
        b.qs = nibbles(&l);
    });
}

pub(super) fn q5_1(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    let sigma2 = imatrix.map_or(0.0, |_| mean_square(row));
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ5_1| {
        let mut l = [0u8; QK];
        let (d, m) = match qw {
            None => range_levels(x, 31, &mut l),
            Some(qw) => weighted_range_levels(x, &importance(x, qw, sigma2), 31, &mut l),
        };
        (b.d, b.m) = (F16Bytes::from_f32(d), F16Bytes::from_f32(m));
        (b.qh, b.qs) = five_bits(&l);
    });
}

pub(super) fn q8_0(row: &[f32], _: Option<&[f32]>, out: &mut [u8]) {
    each_block(row, None, out, |x: &[f32; QK], _, b: &mut BlockQ8_0| {
        let amax = x.iter().fold(0.0f32, |m, &v| if m > v.abs() { m } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16Bytes::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = c_float_to_int((v * id).round()) as i8;
        }
    });
}

/// Unweighted Q4_0/Q5_0: the value of largest magnitude maps to level 0
/// (value -half·d), the rest round half up on the grid 0..2·half-1.
/// Returns d. (As in all the unweighted legacy formats, the float -> int
/// conversion is C's on x86: see [`c_float_to_int`].)
fn symmetric_levels(x: &[f32; QK], half: i32, l: &mut [u8; QK]) -> f32 {
    let (max, _) = signed_max(x);
    let d = max / -(half as f32);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let bias = half as f32 + 0.5;
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (c_float_to_int(v * id + bias) as i8 as i32).min(2 * half - 1) as u8;
    }
    d
}

/// Unweighted Q4_1/Q5_1: the block's range [min, max] split into `nmax`
/// steps, values rounded half up. Returns (d, min).
fn range_levels(x: &[f32; QK], nmax: i32, l: &mut [u8; QK]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / nmax as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (c_float_to_int((v - min) * id + 0.5) as u8).min(nmax as u8);
    }
    (d, min)
}

/// Weighted Q4_1/Q5_1: the scale-and-offset search. Returns (d, min) with
/// the offset as the block stores it (value = d·l + min).
fn weighted_range_levels(x: &[f32; QK], w: &[f32; QK], nmax: i32, l: &mut [u8; QK]) -> (f32, f32) {
    let (d, neg_min) = make_qkx_quants(nmax, x, w, l, WEIGHTED_SEARCH);
    (d, -neg_min)
}

/// Levels 0..16 packed two to a byte: value j low, value j + 16 high.
fn nibbles(l: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| l[j] | (l[j + 16] << 4))
}

/// Levels 0..32 as Q5 stores them: the low nibbles as [`nibbles`], the
/// fifth bits gathered in a little-endian u32 (bit j for value j).
fn five_bits(l: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let qh = l.iter().enumerate().fold(0u32, |h, (j, &q)| h | (((q as u32 & 0x10) >> 4) << j));
    (qh.to_le_bytes(), std::array::from_fn(|j| (l[j] & 0xF) | ((l[j + 16] & 0xF) << 4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 is halfway between two bf16 values: ties to even (down).
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(bf16_bits(-f32::INFINITY), 0xFF80);
        assert_eq!(bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
    }

    #[test]
    fn a_block_of_subnormals_stores_level_zero_as_llama_cpp_does() {
        // 1/d overflows to infinity; llama.cpp on x86 stores level 0 (the
        // low byte of the integer indefinite) and d = 0, m = -0 where there
        // is one: bytes from libggml-base on this input.
        let x: Vec<f32> = (0..QK).map(|i| (i as f32 - 15.5) * 1e-40).collect();
        let cases: [(super::super::RowFn, usize, &[u8]); 5] = [
            (q4_0, 18, &[]),
            (q5_0, 22, &[]),
            (q8_0, 34, &[]),
            (q4_1, 20, &[0, 0, 0, 0x80]),
            (q5_1, 24, &[0, 0, 0, 0x80]),
        ];
        for (quantize, size, head) in cases {
            let mut out = vec![0xAA; size];
            quantize(&x, None, &mut out);
            let mut want = vec![0u8; size];
            want[..head.len()].copy_from_slice(head);
            assert_eq!(out, want);
        }
    }

    #[test]
    fn q5_packing_splits_the_fifth_bit() {
        let l: [u8; QK] = std::array::from_fn(|j| j as u8);
        let (qh, qs) = five_bits(&l);
        assert_eq!(u32::from_le_bytes(qh), 0xFFFF_0000);
        assert_eq!(qs[1], 0x01 | (0x01 << 4));
        assert_eq!(nibbles(&std::array::from_fn(|j| (j % 16) as u8))[3], 0x33);
    }
}
