//! Looking up a model's tensors by kind and layer, checking shape and type,
//! and turning them into kernel views over the mapped file.
//!
//! Large matrices stay in the mapping and are described by byte ranges;
//! small vectors (norms, biases, scalars) are copied to f32 at load.

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo, TensorKind};
use crate::kernels::{self, QMatrix};
use crate::quant::GgmlType;

/// A 2-D weight matrix in the mapped file: `rows` outputs of `cols` inputs.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: Box<str>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Absolute byte offset in the file.
    offset: usize,
    len: usize,
    /// The rows interleaved by four in memory the model owns, where the
    /// loader laid them out so (then the file's bytes are not read again).
    interleaved: Option<Interleaved>,
}

/// A matrix's rows interleaved by four ([`kernels::Layout::X4`]) (one
/// pointer: a `Matrix` stays as small as before).
#[derive(Clone)]
pub struct Interleaved(std::sync::Arc<Vec<u8>>);

impl std::fmt::Debug for Interleaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Interleaved({} bytes)", self.0.len())
    }
}

impl Matrix {
    /// The kernel view over the file's bytes (or the matrix's interleaved
    /// copy, whatever bytes `file` holds).
    #[inline]
    pub fn view<'a>(&'a self, file: &'a [u8]) -> QMatrix<'a> {
        if let Some(x) = &self.interleaved {
            return QMatrix { ty: self.ty, data: &x.0, rows: self.rows, cols: self.cols, layout: kernels::Layout::X4 };
        }
        self.file_view(file)
    }

    /// The view over the file's bytes, as the file lays the rows out.
    fn file_view<'a>(&self, file: &'a [u8]) -> QMatrix<'a> {
        let data = &file[self.offset..self.offset + self.len];
        QMatrix { ty: self.ty, data, rows: self.rows, cols: self.cols, layout: kernels::Layout::Rows }
    }

    /// Whether the rows are interleaved in memory the model owns.
    pub fn is_interleaved(&self) -> bool {
        self.interleaved.is_some()
    }

    pub fn bytes(&self) -> usize {
        self.len
    }

    /// Its byte range in the file.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }

    /// One row (e.g. a token's embedding) dequantised into `out`.
    pub fn row_f32(&self, file: &[u8], row: usize, out: &mut [f32]) {
        if let Some(x) = &self.interleaved {
            // The row's blocks out of its group, laid out plainly again.
            let gb = crate::quant::x4::group_bytes(self.ty, self.cols);
            let mut plain = vec![0u8; self.len / self.rows];
            crate::quant::x4::row_of_group(self.ty, &x.0[row / 4 * gb..(row / 4 + 1) * gb], row % 4, &mut plain);
            kernels::dequantize_row(self.ty, &plain, &mut out[..self.cols]);
            return;
        }
        let rb = self.len / self.rows;
        let start = self.offset + row * rb;
        kernels::dequantize_row(self.ty, &file[start..start + rb], &mut out[..self.cols]);
    }
}

/// A stack of expert matrices (`ffn_*_exps`: one `rows x cols` slab per expert).
#[derive(Clone, Debug)]
pub struct Experts {
    pub all: Matrix,
    pub n_expert: usize,
    /// Rows of one expert's slab.
    pub rows: usize,
}

impl Experts {
    /// Expert `e`'s slab. Only routed experts are ever sliced, so only their
    /// bytes are read.
    #[inline]
    pub fn slab<'a>(&self, file: &'a [u8], e: usize) -> QMatrix<'a> {
        // (Stacks of experts are never interleaved: the loader lays out
        // matrices only.)
        self.all.file_view(file).rows_slice(e * self.rows, self.rows)
    }

    /// Byte range of expert `e` in the file.
    pub fn slab_range(&self, e: usize) -> std::ops::Range<usize> {
        let per = self.slab_bytes();
        self.all.offset + e * per..self.all.offset + (e + 1) * per
    }

    /// Bytes of one expert's slab.
    pub fn slab_bytes(&self) -> usize {
        self.all.len / self.n_expert
    }

    /// Byte range of the whole stack in the file.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.all.offset..self.all.offset + self.all.len
    }
}

/// `rows` rows of `cols` columns of type `ty` (`data`, the file's layout)
/// interleaved by four ([`crate::quant::x4`]; `rows` a multiple of four).
fn interleaved(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let (rb, gb) = (data.len() / rows, crate::quant::x4::group_bytes(ty, cols));
    let mut x = vec![0u8; rows / 4 * gb];
    for (g, out) in x.chunks_exact_mut(gb).enumerate() {
        let row = |i: usize| &data[(4 * g + i) * rb..(4 * g + i + 1) * rb];
        crate::quant::x4::interleave_rows(ty, [row(0), row(1), row(2), row(3)], out);
    }
    x
}

/// The routed experts' stacks interleaved by four ([`kernels::Layout::X4`])
/// in memory the model owns, for a model that runs from its mapped file:
/// made at load where the path decodes the layout and the copies fit
/// ([`crate::model::Model`] decides), dropped when the model moves under a
/// memory budget (the expert cache then reads the file's layout), so that
/// memory pressure can still shrink the model. A stack whose type has no
/// layout, or whose slabs are not whole groups of four rows, is not copied:
/// its slabs come from the file.
#[derive(Default)]
pub struct ExpertCopies {
    /// By the stack's offset in the file (sorted): the interleaved bytes.
    stacks: Vec<(usize, Vec<u8>)>,
}

impl ExpertCopies {
    /// Copies of the stacks of `experts` that `file` (its bytes) holds in a
    /// type the selected path decodes interleaved.
    pub fn build<'a>(file: &[u8], experts: impl IntoIterator<Item = &'a Experts>) -> ExpertCopies {
        let mut stacks: Vec<(usize, Vec<u8>)> = experts
            .into_iter()
            .filter(|x| kernels::interleaves(x.all.ty) && x.rows.is_multiple_of(4) && x.rows > 0)
            .map(|x| {
                let rows = x.n_expert * x.rows;
                (x.all.offset, interleaved(x.all.ty, &file[x.range()], rows, x.all.cols))
            })
            .collect();
        stacks.sort_by_key(|s| s.0);
        stacks.dedup_by_key(|s| s.0);
        ExpertCopies { stacks }
    }

    /// Expert `e` of stack `x` in the interleaved copy, where there is one.
    #[inline]
    pub fn slab(&self, x: &Experts, e: usize) -> Option<QMatrix<'_>> {
        let i = self.stacks.binary_search_by_key(&x.all.offset, |s| s.0).ok()?;
        let all = QMatrix {
            ty: x.all.ty,
            data: &self.stacks[i].1,
            rows: x.n_expert * x.rows,
            cols: x.all.cols,
            layout: kernels::Layout::X4,
        };
        Some(all.rows_slice(e * x.rows, x.rows))
    }

    /// Whether stack `x` is copied (its slabs are not read from the file).
    pub fn holds(&self, x: &Experts) -> bool {
        self.stacks.binary_search_by_key(&x.all.offset, |s| s.0).is_ok()
    }

    /// Bytes of the copies.
    pub fn bytes(&self) -> u64 {
        self.stacks.iter().map(|s| s.1.len() as u64).sum()
    }
}

/// Tensor lookup with typed errors naming the tensor.
pub struct Loader<'a> {
    pub file: &'a GgufFile,
}

impl<'a> Loader<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        Loader { file }
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.file.tensor(name).ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    pub fn has(&self, kind: TensorKind, layer: usize) -> bool {
        self.file.tensor(&kind.weight(layer)).is_some()
    }

    fn check_shape(t: &TensorInfo, expected: &[u64]) -> Result<()> {
        if t.shape() != expected {
            return Err(Error::TensorShape {
                tensor: t.name.clone(),
                expected: expected.to_vec(),
                found: t.shape().to_vec(),
            });
        }
        Ok(())
    }

    fn computable(t: &TensorInfo) -> Result<()> {
        if !kernels::supports(t.ty) {
            return Err(Error::UnsupportedTensorType { tensor: t.name.clone(), ty: t.ty.name().to_string() });
        }
        Ok(())
    }

    fn matrix_of(&self, t: &TensorInfo, rows: usize, cols: usize) -> Matrix {
        Matrix {
            name: t.name.as_str().into(),
            ty: t.ty,
            rows,
            cols,
            offset: self.file.tensor_start(t) as usize,
            len: t.size as usize,
            interleaved: None,
        }
    }

    /// A `rows x cols` matrix (stored as ggml shape `[cols, rows]`). Where
    /// the file asks for it ([`GgufFile::interleave`]), a Q4_K, Q6_K or Q8_0
    /// matrix of a layer or the output head (not an embedding table, read by
    /// rows, nor the MTP layer's) whose rows come in whole groups of four is
    /// laid out interleaved ([`crate::quant::x4`]), in memory the model owns.
    pub fn matrix(&self, kind: TensorKind, layer: usize, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self.info(&kind.weight(layer))?;
        Self::check_shape(t, &[cols as u64, rows as u64])?;
        Self::computable(t)?;
        let mut m = self.matrix_of(t, rows, cols);
        let layer_or_head = (t.name.starts_with("blk.") && !t.name.contains("nextn")) || kind == TensorKind::Output;
        if self.file.interleave()
            && crate::kernels::interleaves(t.ty)
            && rows.is_multiple_of(4)
            && layer_or_head
            && !matches!(kind, TensorKind::TokenEmbd | TensorKind::PerLayerTokenEmbd)
        {
            let x = interleaved(t.ty, self.file.tensor_data(t), rows, cols);
            self.file.record_interleaved(m.range(), x.len());
            m.interleaved = Some(Interleaved(std::sync::Arc::new(x)));
        }
        Ok(m)
    }

    /// Like [`matrix`](Self::matrix) but absent is `None`.
    pub fn matrix_opt(&self, kind: TensorKind, layer: usize, rows: usize, cols: usize) -> Result<Option<Matrix>> {
        if self.has(kind, layer) {
            self.matrix(kind, layer, rows, cols).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Stacked experts, ggml shape `[cols, rows, n_expert]`.
    pub fn experts(
        &self,
        kind: TensorKind,
        layer: usize,
        n_expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Experts> {
        let t = self.info(&kind.weight(layer))?;
        Self::check_shape(t, &[cols as u64, rows as u64, n_expert as u64])?;
        Self::computable(t)?;
        Ok(Experts { all: self.matrix_of(t, rows * n_expert, cols), n_expert, rows })
    }

    /// A small tensor of `n` elements (any shape with that many elements whose
    /// first dims match `shape`), copied to f32.
    pub fn vector_shaped(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        Self::check_shape(t, shape)?;
        Self::computable(t)?;
        let n = t.n_elements() as usize;
        let mut out = vec![0f32; n];
        let data = self.file.tensor_data(t);
        let rb = t.row_bytes();
        let row = t.dims[0] as usize;
        for (i, chunk) in out.chunks_mut(row).enumerate() {
            kernels::dequantize_row(t.ty, &data[i * rb..(i + 1) * rb], chunk);
        }
        Ok(out)
    }

    /// A 1-D weight vector of length `n`.
    pub fn vector(&self, kind: TensorKind, layer: usize, n: usize) -> Result<Vec<f32>> {
        self.vector_shaped(&kind.weight(layer), &[n as u64])
    }

    pub fn vector_opt(&self, kind: TensorKind, layer: usize, n: usize) -> Result<Option<Vec<f32>>> {
        if self.has(kind, layer) {
            self.vector(kind, layer, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A 1-D bias vector of length `n`, if present.
    pub fn bias_opt(&self, kind: TensorKind, layer: usize, n: usize) -> Result<Option<Vec<f32>>> {
        let name = kind.bias(layer);
        if self.file.tensor(&name).is_some() {
            self.vector_shaped(&name, &[n as u64]).map(Some)
        } else {
            Ok(None)
        }
    }
}
