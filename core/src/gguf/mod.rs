//! The GGUF file format (versions 2 and 3) over a memory map.
//!
//! Opening a file reads only its header, metadata and tensor index; weights
//! stay in the page cache (or on flash) until a kernel touches them. Every
//! count, length, offset and shape is validated before it is used, so a hostile
//! file yields an [`Error`] naming the key or tensor at fault, never a panic or
//! an out-of-bounds read.
//!
//! A model split by `llama-gguf-split` into shards (`PREFIX-00001-of-00003.gguf`
//! and so on) opens as one [`GgufFile`]: from its first shard's path (the
//! others are found beside it, see [`GgufFile::open`]), or from a list of
//! paths or descriptor ranges. The shards are mapped one after another into
//! one range of addresses ([`Source::join`]), so every tensor is a byte range
//! of [`Source::bytes`] as in a single file; the metadata is the first
//! shard's; a wrong set of files is [`crate::Error::Split`] naming the shard.

pub mod direct;
mod keys;
mod parse;
mod source;
pub mod split;
mod split_write;
mod summary;
mod value;
mod write;

use std::collections::HashMap;
use std::path::Path;

pub use keys::{layer_of, Arch, Key, TensorKind, TensorName};
pub use parse::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NESTING};
pub use source::Source;
pub use split::{shard_path, shard_prefix};
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
    /// Offset from the start of the data section of its file (its shard's,
    /// in a split model; see [`GgufFile::tensor_start`]).
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// The shard that holds it (its index in [`GgufFile::shards`]; 0 in a single file).
    pub shard: usize,
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

/// One file of a model: the whole model, or one shard of a split model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    /// The file's path, or its descriptor range, or "memory".
    pub name: String,
    /// Where the file's bytes start in [`Source::bytes`].
    pub start: u64,
    /// Bytes of the file (or of the descriptor range).
    pub bytes: u64,
    /// Offset of its data section from the start of the file.
    pub data_offset: u64,
    pub alignment: u64,
    pub version: u32,
    pub tensor_count: usize,
}

/// An open GGUF file (or split model): parsed index plus the mapped bytes.
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
    shards: Vec<Shard>,
    /// Whether the model built from this file lays its Q4_K matrices out
    /// interleaved (see [`crate::model::weights::Loader::matrix`]).
    interleave: bool,
    /// The tensors laid out interleaved, each as its byte range in
    /// [`Source::bytes`] and the bytes of its copy.
    interleaved: std::sync::Mutex<Vec<(std::ops::Range<usize>, usize)>>,
}

impl GgufFile {
    /// Open and validate a file by path. When it is the first shard of a
    /// split model (`split.count` above 1), the other shards are opened from
    /// beside it (`PREFIX-0000k-of-0000N.gguf`, as `llama-gguf-split` names
    /// them) and the whole model is returned; a later shard's path is
    /// [`crate::Error::Split`] (a split model opens from its first shard).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        split::open(path.as_ref())
    }

    /// Open and validate this one file, even when it is one shard of a split model.
    pub fn open_single(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        Self::from_source_named(Source::open(path)?, path.display().to_string())
    }

    /// Open a split model from its shards' paths, in any order (one path
    /// of a file that is not split opens that file).
    pub fn open_parts<P: AsRef<Path>>(paths: &[P]) -> Result<GgufFile> {
        split::open_parts(paths)
    }

    /// Open `len` bytes of an open descriptor starting at `offset` (e.g. an
    /// uncompressed asset inside an APK). The descriptor is not taken over.
    #[cfg(unix)]
    pub fn open_fd(fd: std::os::fd::RawFd, offset: u64, len: u64) -> Result<GgufFile> {
        Self::from_source_named(Source::open_fd(fd, offset, len)?, split::fd_name(fd, offset, len))
    }

    /// Open a split model from its shards' descriptor ranges `(fd, offset,
    /// len)` (e.g. assets of several asset packs), in any order. The
    /// descriptors are not taken over.
    #[cfg(unix)]
    pub fn open_fd_parts(parts: &[(std::os::fd::RawFd, u64, u64)]) -> Result<GgufFile> {
        split::open_fd_parts(parts)
    }

    /// A split model from its shards' bytes, each named (for errors and
    /// [`Shard::name`]), in any order; one source of a file that is not
    /// split is that file.
    pub fn from_sources(sources: Vec<(String, Source)>) -> Result<GgufFile> {
        split::from_sources(sources)
    }

    /// Parse a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_source(Source::from_vec(bytes))
    }

    pub fn from_source(source: Source) -> Result<GgufFile> {
        Self::from_source_named(source, "memory".into())
    }

    /// One file, whose errors and [`Shard`] carry `name`.
    pub fn from_source_named(source: Source, name: String) -> Result<GgufFile> {
        let p = parse::parse(source.bytes())?;
        let len = source.bytes().len() as u64;
        Ok(Self::assemble(source, vec![(name, 0, len, p)]))
    }

    /// The model of parsed files (`(name, where its bytes start in
    /// `source`, its length, what was parsed)`, the first one's metadata
    /// the model's) whose tensor names were checked to be unique.
    fn assemble(source: Source, files: Vec<(String, u64, u64, parse::Parsed)>) -> GgufFile {
        let mut shards = Vec::with_capacity(files.len());
        let mut tensors = Vec::new();
        let mut first = None;
        for (i, (name, start, bytes, p)) in files.into_iter().enumerate() {
            shards.push(Shard {
                name,
                start,
                bytes,
                data_offset: p.data_offset,
                alignment: p.alignment,
                version: p.version,
                tensor_count: p.tensors.len(),
            });
            tensors.extend(p.tensors.into_iter().map(|t| TensorInfo { shard: i, ..t }));
            if first.is_none() {
                first = Some((p.version, p.metadata, p.alignment, p.data_offset + start, p.data_len));
            }
        }
        let (version, metadata, alignment, data_offset, data_len) = first.expect("at least one file");
        let key_index = metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        GgufFile {
            source,
            version,
            metadata,
            key_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
            data_len,
            shards,
            interleave: false,
            interleaved: std::sync::Mutex::default(),
        }
    }

    /// Have the model built from this file lay out its Q4_K and Q6_K
    /// matrices interleaved by four ([`crate::kernels::Layout::X4`]), where the
    /// selected kernels decode that layout.
    pub fn set_interleave(&mut self, on: bool) {
        self.interleave = on;
    }

    pub fn interleave(&self) -> bool {
        self.interleave
    }

    /// Note a tensor laid out interleaved: its range in the file and the
    /// bytes of its copy.
    pub fn record_interleaved(&self, range: std::ops::Range<usize>, bytes: usize) {
        self.interleaved.lock().unwrap_or_else(|e| e.into_inner()).push((range, bytes));
    }

    /// The byte ranges of the tensors laid out interleaved (read from the
    /// file once, at load).
    pub fn interleaved_ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.interleaved.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(r, _)| r.clone()).collect()
    }

    /// Bytes of the interleaved copies (memory the model owns).
    pub fn interleaved_bytes(&self) -> u64 {
        self.interleaved.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, b)| *b as u64).sum()
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Total bytes of the file (or of the descriptor range; of every shard
    /// of a split model).
    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    /// The model's files: one, or a split model's shards in order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Whether the model is split into several files.
    pub fn is_split(&self) -> bool {
        self.shards.len() > 1
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the data section from the start of the file (of the first
    /// shard of a split model: where a tensor starts is [`tensor_start`](Self::tensor_start)).
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

    /// Where a tensor of this file starts in [`Source::bytes`].
    pub fn tensor_start(&self, t: &TensorInfo) -> u64 {
        let s = &self.shards[t.shard];
        s.start + s.data_offset + t.offset
    }

    /// The byte range of a tensor of this file in [`Source::bytes`].
    pub fn tensor_range(&self, t: &TensorInfo) -> std::ops::Range<usize> {
        let start = self.tensor_start(t) as usize;
        start..start + t.size as usize
    }

    /// The bytes of a tensor of this file (validated at open to lie inside it).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.source.bytes()[self.tensor_range(t)]
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("bytes", &self.file_bytes())
            .field("shards", &self.shards.len())
            .finish()
    }
}
