//! Compute kernels: quantised matrix-vector and matrix-matrix products, and the
//! f32 helpers the models need.
//!
//! Weights stay in their file format ([`QMatrix`] borrows the mapped bytes);
//! activations are quantised once per operation into the int8 format the
//! weight type's dot product needs ([`QActs`]), exactly as llama.cpp does, and
//! every product then runs on int8 dot products. The instruction-set path is
//! chosen once at start-up ([`isa`]; `POCKET_ISA` forces one): [`table`] holds
//! the table's types and the scalar reference, `simd/` fills the table per
//! instruction set, `dispatch` picks one.

pub mod bench;
mod dispatch;
mod matmul;
pub use matmul::expert_x4_acts;
pub mod ops;
mod scalar;
mod simd;
mod table;
pub mod testing;

pub use dispatch::{available_isas, isa};
pub use table::{Isa, Kernels};

use crate::quant::{self, BlockQ8K, BlockQ8_0F, BlockQ8_1F, GgmlType, QK_K};
use crate::threads::ThreadPool;
use crate::{Error, Result};

/// A 2-D view of quantised weights: `rows` rows of `cols` elements, rows
/// contiguous ([`Layout::Rows`], as a file holds them) or interleaved.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    pub layout: Layout,
}

/// How a [`QMatrix`]'s rows are laid out in its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Row after row, each in the type's blocks (the file's layout).
    #[default]
    Rows,
    /// Rows four by four, block by block, in the type's interleaved layout
    /// ([`crate::quant::x4`]: Q4_K, Q6_K, Q8_0): made at load for the paths whose
    /// decode kernel reads it ([`interleaves`]); `rows` is a multiple of four.
    X4,
}

/// Whether the selected path decodes `ty` from rows interleaved by four
/// ([`Layout::X4`]): the loader then interleaves the matrices of that type
/// it can.
pub fn interleaves(ty: GgmlType) -> bool {
    Kernels::selected().has_x4(ty)
}

impl<'a> QMatrix<'a> {
    /// Checks that the type is supported, `cols` is a whole number of blocks and
    /// `data` holds exactly `rows` rows.
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<QMatrix<'a>> {
        if !supports(ty) {
            return Err(Error::UnsupportedTensorType { tensor: format!("{rows}x{cols} matrix"), ty: ty.to_string() });
        }
        let row_bytes = ty
            .row_bytes(cols as u64)
            .ok_or_else(|| Error::InvalidArgument(format!("{cols} columns is not a whole number of {ty} blocks")))?;
        let expected = (row_bytes as usize).checked_mul(rows);
        if expected != Some(data.len()) {
            return Err(Error::InvalidArgument(format!(
                "{rows}x{cols} {ty} matrix needs {row_bytes} bytes per row, got {} bytes in all",
                data.len()
            )));
        }
        Ok(QMatrix { ty, data, rows, cols, layout: Layout::Rows })
    }

    /// Weights of type `ty` interleaved by four ([`Layout::X4`]): checks
    /// that the type has the layout, `rows` is a multiple of four and `data`
    /// holds them.
    pub fn x4(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<QMatrix<'a>> {
        if !quant::x4::has_layout(ty) || !rows.is_multiple_of(4) || !cols.is_multiple_of(ty.block_size()) {
            return Err(Error::InvalidArgument(format!("{rows}x{cols}: not whole groups of four {ty} rows")));
        }
        if data.len() != rows / 4 * quant::x4::group_bytes(ty, cols) {
            return Err(Error::InvalidArgument(format!("{rows}x{cols} interleaved {ty}: {} bytes", data.len())));
        }
        Ok(QMatrix { ty, data, rows, cols, layout: Layout::X4 })
    }

    /// Bytes of one row in the type's blocks (as the file holds it).
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// Bytes of a group of four interleaved rows ([`Layout::X4`]).
    pub(crate) fn group_bytes(&self) -> usize {
        quant::x4::group_bytes(self.ty, self.cols)
    }

    /// Bytes holding rows `r0..r1` (for interleaved rows: whole groups).
    pub fn rows_bytes(&self, r0: usize, r1: usize) -> &'a [u8] {
        match self.layout {
            Layout::Rows => &self.data[r0 * self.row_bytes()..r1 * self.row_bytes()],
            Layout::X4 => {
                debug_assert!(r0.is_multiple_of(4) && (r1.is_multiple_of(4) || r1 == self.rows));
                let gb = self.group_bytes();
                &self.data[r0 / 4 * gb..r1.div_ceil(4) * gb]
            }
        }
    }

    /// Row `r` as bytes (rows laid out as the file holds them).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert_eq!(self.layout, Layout::Rows, "QMatrix::row of interleaved rows");
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Rows `start..start + n` (e.g. one expert's slab of a stacked tensor;
    /// of interleaved rows, whole groups).
    pub fn rows_slice(&self, start: usize, n: usize) -> QMatrix<'a> {
        assert!(start + n <= self.rows, "rows {start}..{} of a {}-row matrix", start + n, self.rows);
        if self.layout == Layout::X4 {
            assert!(start.is_multiple_of(4) && n.is_multiple_of(4), "rows {start}..+{n} of interleaved rows");
        }
        QMatrix { data: self.rows_bytes(start, start + n), rows: n, ..*self }
    }
}

/// Can the kernels compute with weights of this type?
pub fn supports(ty: GgmlType) -> bool {
    Kernels::SCALAR.row_dot(ty).is_some()
}

/// The activation format a weight type is dotted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActFormat {
    Q8_0,
    Q8_1,
    Q8K,
    F32,
}

impl ActFormat {
    pub(crate) fn for_weights(ty: GgmlType) -> Option<ActFormat> {
        use GgmlType as T;
        match ty {
            T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4NL | T::MXFP4 => Some(ActFormat::Q8_0),
            T::Q4_1 | T::Q5_1 => Some(ActFormat::Q8_1),
            T::Q2K | T::Q3K | T::Q4K | T::Q5K | T::Q6K => Some(ActFormat::Q8K),
            T::IQ2XXS | T::IQ2XS | T::IQ2S | T::IQ1S | T::IQ1M => Some(ActFormat::Q8K),
            T::IQ4XS | T::IQ3XXS | T::IQ3S => Some(ActFormat::Q8K),
            T::TQ1_0 | T::TQ2_0 => Some(ActFormat::Q8K),
            T::F32 | T::F16 | T::BF16 => Some(ActFormat::F32),
            _ => None,
        }
    }

    /// Whether its blocks carry their sum (Q8_1's `s`, which the products
    /// with a per-block minimum, Q4_1 and Q5_1, multiply the minimum by).
    pub(crate) fn has_block_sums(self) -> bool {
        self == ActFormat::Q8_1
    }

    pub(crate) fn block(self) -> usize {
        match self {
            ActFormat::Q8_0 | ActFormat::Q8_1 => 32,
            ActFormat::Q8K => QK_K,
            ActFormat::F32 => 1,
        }
    }
}

/// Activations quantised once into the format a weight type's dot product
/// needs; a reusable buffer (quantising again reuses its memory).
#[derive(Clone, Debug, Default)]
pub struct QActs {
    fmt: Option<ActFormat>,
    n: usize,
    k: usize,
    q8_0: Vec<BlockQ8_0F>,
    q8_1: Vec<BlockQ8_1F>,
    q8k: Vec<BlockQ8K>,
    f32: Vec<f32>,
}

impl QActs {
    pub fn new() -> QActs {
        QActs::default()
    }

    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        fn cap<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        cap(&self.q8_0) + cap(&self.q8_1) + cap(&self.q8k) + cap(&self.f32)
    }

    /// Quantise `n` rows of `k` f32 (`x.len() == n * k`) for weights of type
    /// `wty`: Q8_0 (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4), Q8_1 (Q4_1, Q5_1), Q8_K
    /// (K-quants, IQ4_XS, IQ3_XXS, IQ3_S) or a
    /// plain f32 copy (F32, F16, BF16).
    ///
    /// Panics on caller bugs: an unsupported type, `k` not a whole number of
    /// blocks, or a wrong length.
    pub fn quantize(&mut self, wty: GgmlType, x: &[f32], n: usize, k: usize) {
        let fmt = ActFormat::for_weights(wty).unwrap_or_else(|| panic!("no kernels for {wty} weights"));
        assert_eq!(x.len(), n * k, "QActs::quantize: {} values for {n} rows of {k}", x.len());
        assert!(k.is_multiple_of(fmt.block()), "QActs::quantize: {k} is not a whole number of {wty} activation blocks");
        (self.fmt, self.n, self.k) = (Some(fmt), n, k);
        let nb = n * k / fmt.block();
        match fmt {
            ActFormat::Q8_0 => {
                self.q8_0.resize(nb, BlockQ8_0F::default());
                quant::q8_0::quantize_row_q8_0f(x, &mut self.q8_0);
            }
            ActFormat::Q8_1 => {
                self.q8_1.resize(nb, BlockQ8_1F::default());
                quant::q8_0::quantize_row_q8_1f(x, &mut self.q8_1);
            }
            ActFormat::Q8K => {
                self.q8k.resize(nb, BlockQ8K::default());
                // SAFETY: the selected table holds only kernels this CPU
                // has; `x` holds `nb` blocks of values.
                unsafe { (Kernels::selected().quantize_q8k)(x, &mut self.q8k) };
            }
            ActFormat::F32 => {
                self.f32.clear();
                self.f32.extend_from_slice(x);
            }
        }
    }

    /// The activations as the dot products see them, as f32 (`[n][k]`): the
    /// quantised values times their block scales, or the f32 copy. A second
    /// backend fed these computes what the CPU computes, up to rounding.
    pub fn dequantize(&self, out: &mut Vec<f32>) {
        out.clear();
        match self.fmt {
            Some(ActFormat::Q8_0) => {
                out.extend(self.q8_0.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32)));
            }
            Some(ActFormat::Q8_1) => {
                out.extend(self.q8_1.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32)));
            }
            Some(ActFormat::Q8K) => {
                out.extend(self.q8k.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32)));
            }
            Some(ActFormat::F32) => out.extend_from_slice(&self.f32),
            None => {}
        }
    }

    /// The activations as a device's kernels read them (`gpu::act_len`
    /// values per row): [`dequantize`](Self::dequantize)'s values, and for
    /// Q8_1 each block's `s` after its 32 values, as the CPU rounded it (to
    /// f16, from the unrounded scale): the CPU's products with Q4_1 and Q5_1
    /// weights multiply each block's minimum by it, not by the sum of the
    /// dequantised values, which differs from it in the last bits.
    pub fn device_values(&self, out: &mut Vec<f32>) {
        if self.fmt != Some(ActFormat::Q8_1) {
            return self.dequantize(out);
        }
        out.clear();
        out.reserve(self.q8_1.len() * 33);
        for b in &self.q8_1 {
            out.extend(b.qs.iter().map(|&q| b.d * q as f32));
            out.push(b.s);
        }
    }

    /// Values per row of [`device_values`](Self::device_values).
    pub fn device_row_len(&self) -> usize {
        match self.fmt {
            Some(f) if f.has_block_sums() => self.k / f.block() * (f.block() + 1),
            _ => self.k,
        }
    }

    /// Number of activation rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Elements per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Every quantised activation back as f32 (`d * q`), for tests.
    #[cfg(test)]
    pub(crate) fn dequantized(&self) -> Vec<f32> {
        match self.fmt {
            Some(ActFormat::Q8_0) => self.q8_0.iter().flat_map(|b| b.qs.map(|q| b.d * q as f32)).collect(),
            Some(ActFormat::Q8_1) => self.q8_1.iter().flat_map(|b| b.qs.map(|q| b.d * q as f32)).collect(),
            Some(ActFormat::Q8K) => self.q8k.iter().flat_map(|b| b.qs.map(|q| b.d * q as f32)).collect(),
            Some(ActFormat::F32) => self.f32.clone(),
            None => Vec::new(),
        }
    }
}

/// `out[i*w.rows + r] = dot(w.row(r), x.row(i))` for all `n` activation rows;
/// splits the work over the pool.
///
/// Panics only on caller bugs (mismatched `k`, short `out`, activations
/// quantised for an incompatible type).
pub fn matmul(pool: &ThreadPool, w: &QMatrix, x: &QActs, out: &mut [f32]) {
    Kernels::selected().matmul(pool, w, x, out)
}

/// Same for a subset of activation rows (MoE prefill: the tokens routed to one
/// expert): `out[j*w.rows + r] = dot(w.row(r), x.row(rows[j]))`.
pub fn matmul_rows(pool: &ThreadPool, w: &QMatrix, x: &QActs, rows: &[usize], out: &mut [f32]) {
    Kernels::selected().matmul_rows(pool, w, x, rows, out)
}

/// One product of a [`matmul_batch`]: `out = w x` over all activation rows,
/// or over `rows` of them.
pub struct MatJob<'a> {
    pub w: QMatrix<'a>,
    pub x: &'a QActs,
    pub rows: Option<&'a [usize]>,
    pub out: &'a mut [f32],
}

/// Several products at once: the threads share their tiles and meet once,
/// not once per product.
pub fn matmul_batch(pool: &ThreadPool, jobs: &mut [MatJob<'_>]) {
    Kernels::selected().matmul_batch(pool, jobs)
}

/// Convenience: quantise `n` rows of `x` into a scratch buffer, then [`matmul`].
pub fn matmul_f32(pool: &ThreadPool, w: &QMatrix, x: &[f32], n: usize, out: &mut [f32]) {
    let mut acts = QActs::new();
    acts.quantize(w.ty, x, n, w.cols);
    matmul(pool, w, &acts, out)
}

/// Dequantise one row of any supported type into f32 (embedding lookup).
/// `src` holds exactly `dst.len()` elements.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match row_dequantizer(ty) {
        Some(f) => f(src, dst),
        None => panic!("dequantize_row: no kernels for {ty}"),
    }
}

/// A row dequantiser: a row's blocks into its f32 values.
pub type DequantizeRow = fn(&[u8], &mut [f32]);

/// The row dequantiser of `ty`, if there is one.
pub fn row_dequantizer(ty: GgmlType) -> Option<DequantizeRow> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => quant::float::dequantize_row_f32,
        T::F16 => quant::float::dequantize_row_f16,
        T::BF16 => quant::float::dequantize_row_bf16,
        T::Q4_0 => quant::q4_0::dequantize_row,
        T::Q4_1 => quant::q4_1::dequantize_row,
        T::Q5_0 => quant::q5_0::dequantize_row,
        T::Q5_1 => quant::q5_1::dequantize_row,
        T::Q8_0 => quant::q8_0::dequantize_row,
        T::Q2K => quant::q2_k::dequantize_row,
        T::Q3K => quant::q3_k::dequantize_row,
        T::Q4K => quant::q4_k::dequantize_row,
        T::Q5K => quant::q5_k::dequantize_row,
        T::Q6K => quant::q6_k::dequantize_row,
        T::IQ2XXS => quant::iq2_xxs::dequantize_row,
        T::IQ2XS => quant::iq2_xs::dequantize_row,
        T::IQ2S => quant::iq2_s::dequantize_row,
        T::IQ1S => quant::iq1_s::dequantize_row,
        T::IQ1M => quant::iq1_m::dequantize_row,
        T::IQ4NL => quant::iq4::dequantize_row_nl,
        T::IQ4XS => quant::iq4::dequantize_row_xs,
        T::MXFP4 => quant::mxfp4::dequantize_row,
        T::IQ3XXS => quant::iq3_xxs::dequantize_row,
        T::IQ3S => quant::iq3_s::dequantize_row,
        T::TQ1_0 => quant::tq::dequantize_row_tq1_0,
        T::TQ2_0 => quant::tq::dequantize_row_tq2_0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
