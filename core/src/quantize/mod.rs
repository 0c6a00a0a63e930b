//! Making GGUF blocks from f32 weights: the row quantisers behind
//! `pocket quantize`.
//!
//! Each format's quantiser is the search llama.cpp's `ggml_quantize_chunk`
//! runs at the pinned commit (0c1e570), written here from the formats and
//! checked byte for byte against its output on golden data
//! (`testdata/`, made by `scripts/quantize-golden.sh`). With an importance
//! vector (one weight per input column: the mean squared activation the
//! column meets, from `pocket imatrix`) the searches minimise the weighted
//! error, as llama.cpp's do; without one they fall back to llama.cpp's
//! unweighted reference paths.
//!
//! One call quantises whole rows, so a caller splits a tensor over threads
//! by rows.

use crate::error::{Error, Result};
use crate::quant::GgmlType;

mod common;
pub mod file;
pub mod imatrix;
mod iq;
mod iq1;
mod iq2;
mod iq3;
mod iq4;
mod iq_lattice;
mod kquants;
mod legacy;
pub mod mix;
mod mxfp4;
mod ternary;

#[cfg(test)]
mod iq_tests;
#[cfg(test)]
mod tests;

/// Whether llama.cpp refuses to make `ty` without an importance vector (the
/// 1.5-2 bit grids are too coarse to place without one).
pub fn requires_imatrix(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ1S)
}

/// Whether this module can make `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    row_quantizer(ty).is_some()
}

/// A row quantiser: one row of f32 (a whole number of blocks), the row's
/// importance vector if any, the row's output bytes.
type RowFn = fn(&[f32], Option<&[f32]>, &mut [u8]);

fn row_quantizer(ty: GgmlType) -> Option<RowFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => legacy::f32,
        F16 => legacy::f16,
        BF16 => legacy::bf16,
        Q4_0 => legacy::q4_0,
        Q4_1 => legacy::q4_1,
        Q5_0 => legacy::q5_0,
        Q5_1 => legacy::q5_1,
        Q8_0 => legacy::q8_0,
        Q2K => kquants::q2_k,
        Q3K => kquants::q3_k,
        Q4K => kquants::q4_k,
        Q5K => kquants::q5_k,
        Q6K => kquants::q6_k,
        IQ1S => iq1::iq1_s,
        IQ1M => iq1::iq1_m,
        IQ2XXS => iq2::iq2_xxs,
        IQ2XS => iq2::iq2_xs,
        IQ2S => iq2::iq2_s,
        IQ3XXS => iq3::iq3_xxs,
        IQ3S => iq3::iq3_s,
        IQ4NL => iq4::iq4_nl,
        IQ4XS => iq4::iq4_xs,
        MXFP4 => mxfp4::mxfp4,
        TQ1_0 => ternary::tq1_0,
        TQ2_0 => ternary::tq2_0,
        _ => return None,
    })
}

/// Quantise `src` (rows of `n_per_row` values) into `dst` (the same rows in
/// `ty`), each column's error weighted by `imatrix[column]` where given.
///
/// Errors (never a panic): a type this module cannot make, a row that is not
/// a whole number of blocks, buffers of the wrong size, a missing importance
/// vector where [`requires_imatrix`], an importance vector of the wrong
/// length or with a negative or non-finite entry.
pub fn quantize_rows(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<()> {
    let bad = |why: String| Err(Error::InvalidArgument(why));
    let Some(quantize) = row_quantizer(ty) else {
        return bad(format!("cannot quantise to {ty}"));
    };
    let Some(row_bytes) = ty.row_bytes(n_per_row as u64).filter(|_| n_per_row > 0) else {
        return bad(format!("a row of {n_per_row} values is not a whole number of {ty} blocks ({})", ty.block_size()));
    };
    let row_bytes = row_bytes as usize;
    if !src.len().is_multiple_of(n_per_row) || dst.len() != src.len() / n_per_row * row_bytes {
        return bad(format!("{} values in rows of {n_per_row} do not fill {} bytes of {ty}", src.len(), dst.len()));
    }
    match imatrix {
        None if requires_imatrix(ty) => return bad(format!("{ty} needs an importance matrix (pocket imatrix)")),
        Some(w) if w.len() != n_per_row => {
            return bad(format!("importance vector of {} values for rows of {n_per_row}", w.len()))
        }
        Some(w) if w.iter().any(|v| !(v.is_finite() && *v >= 0.0)) => {
            return bad("importance vector with a negative or non-finite value".into())
        }
        _ => {}
    }
    for (x, y) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        quantize(x, imatrix, y);
    }
    Ok(())
}
