//! Q8_0 and Q8_1: blocks of 32 signed bytes with one f16 scale.
//!
//! Q8_0 is a weight format (and a KV cache format). The legacy weight formats
//! (Q4_0, Q5_0, Q8_0) are dotted with the same quantisation of the
//! activations, held as [`BlockQ8_0F`]: the same quants and the same
//! f16-rounded scale, stored widened to f32 so that no kernel converts it
//! again for every weight row (the value, and so every product, is unchanged).
//! Q8_1 adds `s = d * sum(qs)`, so that formats with a per-block minimum
//! (Q4_1, Q5_1) can fold the minimum in without touching the activations
//! again; its activations are held as [`BlockQ8_1F`] (both values widened
//! once, as for Q8_0). Value `i` of a block is `d * qs[i]`.

use super::{as_blocks, F16Bytes, FileBlock};
use std::mem::size_of;

pub const QK8_0: usize = 32;

#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Bytes,
    pub qs: [i8; QK8_0],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ8_0 {}

/// A Q8_0 block of activations: the scale is the f16-rounded `d` of
/// [`BlockQ8_0`], widened to f32 once when the activations are quantised.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BlockQ8_0F {
    pub d: f32,
    pub qs: [i8; QK8_0],
    /// `sum(qs)`, for kernels whose weights carry an offset (set by
    /// [`quantize_row_q8_0f`]; meaningless in decoded weight rows).
    pub s: i32,
}
const _: () = assert!(size_of::<BlockQ8_0F>() == 40);

#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: F16Bytes,
    /// `d * sum(qs)`, rounded to f16 (with `d` before its own rounding).
    pub s: F16Bytes,
    pub qs: [i8; QK8_0],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
// SAFETY: as for BlockQ8_0.
unsafe impl FileBlock for BlockQ8_1 {}

/// A Q8_1 block of activations: `d` and `s` are [`BlockQ8_1`]'s f16-rounded
/// values, widened to f32 once when the activations are quantised (as
/// [`BlockQ8_0F`] widens `d`), so no kernel converts them again for every
/// weight row.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BlockQ8_1F {
    pub d: f32,
    /// `d * sum(qs)`, rounded to f16 (with `d` before its own rounding), widened.
    pub s: f32,
    pub qs: [i8; QK8_0],
}
const _: () = assert!(size_of::<BlockQ8_1F>() == 40);

/// The scale of a block of 32 values, `amax / 127`, and the multiplier
/// `127 / amax` (0 for an all-zero block), as llama.cpp's x86 runtime
/// quantiser computes them (its `_ref` variant uses `1 / d`, which differs in
/// the last bit for some blocks).
#[inline]
fn block_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    (d, if amax != 0.0 { 127.0 / amax } else { 0.0 })
}

/// Quantise one block of 32 values into `qs`; returns the f16-rounded scale.
#[inline]
fn quantize_block(xb: &[f32], qs: &mut [i8; QK8_0]) -> F16Bytes {
    let (d, id) = block_scale(xb);
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = super::round_even(v * id) as i8;
    }
    F16Bytes::from_f32(d)
}

/// Quantise `x` (a multiple of 32 long) into `y`, bit-identical to the
/// activation quantiser llama.cpp runs on x86 (`quantize_row_q8_0`: multiplier
/// `127 / amax`, round half to even). One definition on every ISA, so results
/// do not depend on the machine.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0, "Q8_0: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        yb.d = quantize_block(xb, &mut yb.qs);
    }
}

/// [`quantize_row_q8_0`] into activation blocks (the scale widened to f32).
pub fn quantize_row_q8_0f(x: &[f32], y: &mut [BlockQ8_0F]) {
    assert_eq!(x.len(), y.len() * QK8_0, "Q8_0: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        yb.d = quantize_block(xb, &mut yb.qs).to_f32();
        yb.s = yb.qs.iter().map(|&q| q as i32).sum();
    }
}

/// One Q8_1 block into `qs`: the f16-rounded scale and `d * sum(qs)`.
#[inline]
fn quantize_block_q8_1(xb: &[f32], qs: &mut [i8; QK8_0]) -> (F16Bytes, F16Bytes) {
    let (d, id) = block_scale(xb);
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = super::round_even(v * id) as i8;
        sum += *q as i32;
    }
    (F16Bytes::from_f32(d), F16Bytes::from_f32(sum as f32 * d))
}

/// Quantise `x` into Q8_1 blocks, as [`quantize_row_q8_0`] plus `d * sum(qs)`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK8_0, "Q8_1: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        (yb.d, yb.s) = quantize_block_q8_1(xb, &mut yb.qs);
    }
}

/// [`quantize_row_q8_1`] into activation blocks (`d` and `s` widened to f32).
pub fn quantize_row_q8_1f(x: &[f32], y: &mut [BlockQ8_1F]) {
    assert_eq!(x.len(), y.len() * QK8_0, "Q8_1: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let (d, s) = quantize_block_q8_1(xb, &mut yb.qs);
        (yb.d, yb.s) = (d.to_f32(), s.to_f32());
    }
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ8_0>(src);
    assert_eq!(dst.len(), blocks.len() * QK8_0);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let d = b.d.to_f32();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Dot product of one Q8_0 row with Q8_0 activations: per block, an exact
/// integer sum scaled by both block scales.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0F]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ8_0>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
            *s += sumi as f32 * (x.d.to_f32() * y.d);
        }
    }
    sum
}
