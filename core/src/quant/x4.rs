//! Rows interleaved by four, by weight type: the layouts four-row decode
//! kernels read ([`super::q4_k_x4`], [`super::q6_k_x4`], [`super::q8_0_x4`]). A group of four
//! rows holds, block by block, the four rows' blocks of the same columns.

use super::{as_blocks, block_bytes, FileBlock, GgmlType, QK_K};
use std::mem::size_of;

/// A block of four rows interleaved, made from the four rows' blocks of the
/// same columns and back to exactly them.
pub trait X4Block: FileBlock + Sized {
    /// The type's block, as a file holds it.
    type Plain: FileBlock;
    fn interleave(rows: [&Self::Plain; 4]) -> Self;
    fn deinterleave(&self) -> [Self::Plain; 4];
}

/// Four rows (`rows`, each the same number of whole blocks) into `out`
/// (four rows' bytes), block by block.
pub fn interleave_rows_of<X: X4Block>(rows: [&[u8]; 4], out: &mut [u8]) {
    let x = rows.map(as_blocks::<X::Plain>);
    let n = x[0].len();
    assert!(x.iter().all(|r| r.len() == n) && out.len() == n * size_of::<X>(), "interleave_rows: mismatched lengths");
    for (b, o) in out.chunks_exact_mut(size_of::<X>()).enumerate() {
        o.copy_from_slice(block_bytes(&X::interleave(x.map(|r| &r[b]))));
    }
}

/// Four interleaved rows (`x`) back into four rows laid out plainly (`rows`).
pub fn deinterleave_rows_of<X: X4Block>(x: &[u8], mut rows: [&mut [u8]; 4]) {
    let size = size_of::<X::Plain>();
    for (b, xb) in as_blocks::<X>(x).iter().enumerate() {
        for (row, blk) in rows.iter_mut().zip(xb.deinterleave()) {
            row[b * size..(b + 1) * size].copy_from_slice(block_bytes(&blk));
        }
    }
}

/// The products of four interleaved rows (`w`: their blocks) with one row of
/// activations `a` (a block of them per block), each row's by `dot` on its
/// blocks laid out plainly: the scalar twin of the interleaved kernels.
pub fn vec_dot_of<X: X4Block, A>(w: &[u8], a: &[A], dot: fn(&[u8], &[A]) -> f32) -> [f32; 4] {
    let x = as_blocks::<X>(w);
    assert_eq!(x.len(), a.len(), "vec_dot: activations of another length");
    let mut sum = [0.0f32; 4];
    for (xb, y) in x.iter().zip(a) {
        for (s, b) in sum.iter_mut().zip(xb.deinterleave()) {
            *s += dot(block_bytes(&b), std::slice::from_ref(y));
        }
    }
    sum
}

/// Whether `ty` has an interleaved layout.
pub fn has_layout(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q6K | GgmlType::Q8_0)
}

/// Bytes of a group of four interleaved rows of `cols` columns.
pub fn group_bytes(ty: GgmlType, cols: usize) -> usize {
    match ty {
        GgmlType::Q4K => super::q4_k_x4::bytes_for(cols / QK_K),
        GgmlType::Q6K => super::q6_k_x4::bytes_for(cols / QK_K),
        GgmlType::Q8_0 => super::q8_0_x4::bytes_for(cols / 32),
        _ => panic!("{ty} rows have no interleaved layout"),
    }
}

/// Four rows laid out plainly (each in the type's blocks) into `out`
/// ([`group_bytes`]).
pub fn interleave_rows(ty: GgmlType, rows: [&[u8]; 4], out: &mut [u8]) {
    match ty {
        GgmlType::Q4K => interleave_rows_of::<super::q4_k_x4::BlockQ4Kx4>(rows, out),
        GgmlType::Q6K => interleave_rows_of::<super::q6_k_x4::BlockQ6Kx4>(rows, out),
        GgmlType::Q8_0 => interleave_rows_of::<super::q8_0_x4::BlockQ8_0x4>(rows, out),
        _ => panic!("{ty} rows have no interleaved layout"),
    }
}

/// A group of four interleaved rows back into four rows laid out plainly.
pub fn deinterleave_rows(ty: GgmlType, x: &[u8], rows: [&mut [u8]; 4]) {
    match ty {
        GgmlType::Q4K => deinterleave_rows_of::<super::q4_k_x4::BlockQ4Kx4>(x, rows),
        GgmlType::Q6K => deinterleave_rows_of::<super::q6_k_x4::BlockQ6Kx4>(x, rows),
        GgmlType::Q8_0 => deinterleave_rows_of::<super::q8_0_x4::BlockQ8_0x4>(x, rows),
        _ => panic!("{ty} rows have no interleaved layout"),
    }
}

/// Row `r` (0..4) of a group of interleaved rows, laid out plainly into `out`
/// (one row's bytes).
pub fn row_of_group(ty: GgmlType, x: &[u8], r: usize, out: &mut [u8]) {
    let n = out.len();
    let mut four = vec![0u8; 4 * n];
    let mut rows = four.chunks_exact_mut(n);
    deinterleave_rows(ty, x, [(); 4].map(|_| rows.next().expect("four rows")));
    out.copy_from_slice(&four[r * n..(r + 1) * n]);
}

/// The scalar twin of the K-quants' interleaved kernels: the products of a
/// group of four interleaved rows with one row of Q8_K activations (Q8_0's:
/// [`vec_dot_of`] with [`super::q8_0::vec_dot`]).
pub fn vec_dot(ty: GgmlType, w: &[u8], a: &[super::BlockQ8K]) -> [f32; 4] {
    match ty {
        GgmlType::Q4K => vec_dot_of::<super::q4_k_x4::BlockQ4Kx4, _>(w, a, super::q4_k::vec_dot),
        GgmlType::Q6K => vec_dot_of::<super::q6_k_x4::BlockQ6Kx4, _>(w, a, super::q6_k::vec_dot),
        _ => panic!("{ty} rows have no interleaved layout"),
    }
}
