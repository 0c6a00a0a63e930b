//! The GGUF file format (versions 2 and 3) over a memory map.
//!
//! Opening a file reads only its header, metadata and tensor index; weights
//! stay in the page cache (or on flash) until a kernel touches them. Every
//! count, length, offset and shape is validated before it is used, so a hostile
//! file yields an [`Error`] naming the key or tensor at fault, never a panic or
//! an out-of-bounds read.

pub mod direct;
mod keys;
mod parse;
mod source;
mod summary;
mod value;
mod write;

use std::collections::HashMap;
use std::path::Path;

pub use keys::{layer_of, Arch, Key, TensorKind, TensorName};
pub use parse::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NESTING};
pub use source::Source;
pub use summary::{Summary, TypeTotals};
pub use value::{Array, StringArray, Value, ValueType};
pub use write::{GgufWriter, TensorSpec};

use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// One entry of the tensor index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Number of dimensions in use (1 to 4).
    pub n_dims: usize,
    /// Shape, innermost (row length) first as in ggml; unused dims are 1.
    pub dims: [u64; 4],
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// The dimensions in use, innermost first.
    pub fn shape(&self) -> &[u64] {
        &self.dims[..self.n_dims]
    }

    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes in one row (`dims[0]` elements).
    pub fn row_bytes(&self) -> usize {
        (self.dims[0] as usize / self.ty.block_size()) * self.ty.type_size()
    }
}

/// An open GGUF file: parsed index plus the mapped bytes.
pub struct GgufFile {
    source: Source,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    data_len: u64,
}

impl GgufFile {
    /// Open and validate a file by path.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::from_source(Source::open(path.as_ref())?)
    }

    /// Open `len` bytes of an open descriptor starting at `offset` (e.g. an
    /// uncompressed asset inside an APK). The descriptor is not taken over.
    #[cfg(unix)]
    pub fn open_fd(fd: std::os::fd::RawFd, offset: u64, len: u64) -> Result<GgufFile> {
        Self::from_source(Source::open_fd(fd, offset, len)?)
    }

    /// Parse a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_source(Source::from_vec(bytes))
    }

    pub fn from_source(source: Source) -> Result<GgufFile> {
        let p = parse::parse(source.bytes())?;
        let key_index = p.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = p.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            source,
            version: p.version,
            metadata: p.metadata,
            key_index,
            tensors: p.tensors,
            tensor_index,
            alignment: p.alignment,
            data_offset: p.data_offset,
            data_len: p.data_len,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Total bytes of the file (or of the descriptor range).
    pub fn file_bytes(&self) -> u64 {
        self.source.bytes().len() as u64
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the data section from the start of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Keep only the byte ranges `keep` resident, in owned memory (see
    /// [`Source::into_resident`]).
    pub fn make_resident(&mut self, keep: &[std::ops::Range<usize>]) -> Result<()> {
        let source = std::mem::replace(&mut self.source, Source::from_vec(Vec::new()));
        self.source = source.into_resident(keep)?;
        Ok(())
    }

    // ---- metadata ----------------------------------------------------------

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| Error::WrongValueType {
                key: key.to_string(),
                expected,
                found: v.value_type().name(),
            }),
        }
    }

    /// An unsigned integer of any width; `Ok(None)` when absent, an error when
    /// present with another type or a negative value.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "unsigned integer", Value::as_u64)
    }

    /// Like [`get_u64`](Self::get_u64) but the value must fit in u32.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.typed(key, "u32", |v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
    }

    pub fn get_i64(&self, key: &str) -> Result<Option<i64>> {
        self.typed(key, "integer", Value::as_i64)
    }

    /// A float (f32 or f64; integers are accepted and converted).
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "float", |v| v.as_f64().map(|x| x as f32))
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "string", Value::as_str)
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        self.typed(key, "array", Value::as_array)
    }

    /// A required value: [`Error::MissingKey`] when absent.
    pub fn require<T>(&self, key: &str, got: Result<Option<T>>) -> Result<T> {
        got?.ok_or_else(|| Error::MissingKey(key.to_string()))
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Result<Option<&str>> {
        self.get_str(Key::GeneralArchitecture.name())
    }

    // ---- tensors -------------------------------------------------------------

    /// The tensor index in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file (validated at open to lie inside it).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.source.bytes()[start..start + t.size as usize]
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("bytes", &self.file_bytes())
            .finish()
    }
}
