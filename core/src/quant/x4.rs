//! Rows interleaved by four, by weight type: the layouts four-row decode
//! kernels read ([`super::q4_k_x4`], [`super::q6_k_x4`], [`super::q8_0_x4`]). A group of four
//! rows holds, block by block, the four rows' blocks of the same columns.

use super::{GgmlType, QK_K};

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
        GgmlType::Q4K => super::q4_k_x4::interleave_rows(rows, out),
        GgmlType::Q6K => super::q6_k_x4::interleave_rows(rows, out),
        GgmlType::Q8_0 => super::q8_0_x4::interleave_rows(rows, out),
        _ => panic!("{ty} rows have no interleaved layout"),
    }
}

/// A group of four interleaved rows back into four rows laid out plainly.
pub fn deinterleave_rows(ty: GgmlType, x: &[u8], rows: [&mut [u8]; 4]) {
    match ty {
        GgmlType::Q4K => super::q4_k_x4::deinterleave_rows(x, rows),
        GgmlType::Q6K => super::q6_k_x4::deinterleave_rows(x, rows),
        GgmlType::Q8_0 => super::q8_0_x4::deinterleave_rows(x, rows),
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
/// [`super::q8_0_x4::vec_dot`]).
pub fn vec_dot(ty: GgmlType, w: &[u8], a: &[super::BlockQ8K]) -> [f32; 4] {
    match ty {
        GgmlType::Q4K => super::q4_k_x4::vec_dot(w, a),
        GgmlType::Q6K => super::q6_k_x4::vec_dot(w, a),
        _ => panic!("{ty} rows have no interleaved layout"),
    }
}
