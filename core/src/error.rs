//! The one error type of pocket-core.
//!
//! Model files are untrusted input: every way a file can be wrong has its own
//! variant, and its message names the key or tensor at fault. The FFI layer
//! folds these into the few categories an app can act on.

use std::io;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- I/O -------------------------------------------------------------
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("byte range {offset}+{len} lies outside the {file_len}-byte file")]
    RangeOutsideFile { offset: u64, len: u64, file_len: u64 },

    // ---- GGUF container --------------------------------------------------
    #[error("not a GGUF file (magic bytes {0:02x?})")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated in the {section} at byte {offset} ({context})")]
    Truncated { section: &'static str, offset: u64, context: String },
    #[error("tensor count {count} is impossible for a {file_len}-byte file")]
    TooManyTensors { count: u64, file_len: u64 },
    #[error("metadata key count {count} is impossible for a {file_len}-byte file")]
    TooManyKeys { count: u64, file_len: u64 },
    #[error("string of {len} bytes at byte {offset} runs past the end of the file ({context})")]
    StringTooLong { context: String, offset: u64, len: u64 },
    #[error("array of {len} elements in key '{key}' cannot fit in the file")]
    ArrayTooLong { key: String, len: u64 },
    #[error("arrays nested deeper than {limit} in key '{key}'")]
    NestingTooDeep { key: String, limit: usize },
    #[error("invalid UTF-8 in {context}")]
    InvalidUtf8 { context: String },
    #[error("key '{key}' has unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("general.alignment {0} is not a power of two between 1 and 2^30")]
    BadAlignment(u64),
    #[error("tensor '{tensor}' has unknown type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor '{tensor}' has {n_dims} dimensions (1 to 4 allowed)")]
    BadDimCount { tensor: String, n_dims: u32 },
    #[error("tensor '{tensor}' has a zero dimension")]
    ZeroDim { tensor: String },
    #[error("tensor '{tensor}' is too large: its element count or byte size overflows")]
    ShapeOverflow { tensor: String },
    #[error("tensor '{tensor}': row length {row} is not a multiple of the {ty} block size {block}")]
    PartialBlock { tensor: String, ty: String, row: u64, block: u64 },
    #[error("tensor '{tensor}' offset {offset} is not aligned to {alignment}")]
    MisalignedTensor { tensor: String, offset: u64, alignment: u64 },
    #[error(
        "tensor '{tensor}' (bytes {start}..{end} of the data section) lies outside the {data_len}-byte data section"
    )]
    TensorOutOfBounds { tensor: String, start: u64, end: u64, data_len: u64 },
    #[error("tensors '{first}' and '{second}' overlap")]
    TensorOverlap { first: String, second: String },
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongValueType { key: String, expected: &'static str, found: &'static str },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    /// A split model (`llama-gguf-split` shards) whose set of files is wrong,
    /// or one of whose files is: `shard` names the file at fault (its path,
    /// its descriptor range, or its place in the set when it is missing).
    #[error("shard {shard}: {problem}")]
    Split { shard: String, problem: ShardProblem },

    // ---- Models ----------------------------------------------------------
    #[error("unsupported architecture '{0}'")]
    UnsupportedArchitecture(String),
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
    #[error("tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    TensorShape { tensor: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor '{tensor}' has type {ty}, which this engine cannot compute with")]
    UnsupportedTensorType { tensor: String, ty: String },
    #[error("invalid hyper-parameter '{key}': {reason}")]
    InvalidHyperparameter { key: String, reason: String },

    // ---- Tokenizer and chat template ---------------------------------------
    #[error("unknown tokenizer model '{0}' (supported: gpt2, gemma4, llama)")]
    UnknownTokenizer(String),
    #[error("unknown pre-tokenizer '{0}'")]
    UnknownPreTokenizer(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {reason}")]
    Template { reason: String },
    #[error("chat template raised an exception: {0}")]
    TemplateRaised(String),

    // ---- Caller mistakes and run-time conditions -------------------------
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An importance-matrix file that cannot be read, or that does not fit
    /// the model being quantised.
    #[error("importance matrix: {0}")]
    Imatrix(String),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("context full: {n_ctx} tokens")]
    ContextFull { n_ctx: usize },
    #[error("cancelled")]
    Cancelled,

    // ---- The GPU backend -------------------------------------------------
    /// No usable GPU: not built with the `gpu` feature, no adapter, or the
    /// driver refused a device. The message is the driver's or wgpu's.
    #[error("GPU unavailable: {0}")]
    GpuUnavailable(String),
    /// The GPU failed while running: a shader or pipeline the driver rejected,
    /// a lost device, a failed readback.
    #[error("GPU error: {0}")]
    Gpu(String),
}

/// What is wrong with one shard of a split model (see [`Error::Split`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardProblem {
    /// The shard is not a valid GGUF file, or one of its tensors runs past
    /// its end (the file's own error).
    #[error("{0}")]
    Invalid(Box<Error>),
    /// No file of the set holds shard `no` (0-based `split.no`) of `count`.
    #[error("missing: the model is split into {count} files and shard {} of them is not there", no + 1)]
    Missing { no: u64, count: u64 },
    /// A shard whose `split.no` lies past the set's `count` files.
    #[error("extra: its split.no {no} lies past the {count} files of the set")]
    Extra { no: u64, count: u64 },
    /// Two files claim the same `split.no`.
    #[error("duplicated: split.no {no} is also {other}")]
    Duplicate { no: u64, other: String },
    /// The shard's `split.count` disagrees with the rest of the set.
    #[error("mismatched: its split.count is {found}, the set's is {expected} (a shard of another split)")]
    CountMismatch { found: u64, expected: u64 },
    /// The shard's `split.tensors.count` disagrees with the first shard's.
    #[error(
        "mismatched: its split.tensors.count is {found}, the first shard's is {expected} (a shard of another model)"
    )]
    TensorCountMismatch { found: u64, expected: u64 },
    /// The shards hold another number of tensors than `split.tensors.count` says.
    #[error("the shards hold {found} tensors, split.tensors.count says {expected}")]
    TensorTotal { found: u64, expected: u64 },
    /// The file found at shard `expected`'s name says it is shard `found`.
    #[error("wrong split.no {found}: the file says it is shard {}, its name says shard {}", found + 1, expected + 1)]
    WrongIndex { found: u64, expected: u64 },
    /// Opened by a later shard's path: a split model opens from its first shard.
    #[error("it is shard {} of {count}: a split model is opened from its first shard (split.no 0)", no + 1)]
    NotFirst { no: u64, count: u64 },
    /// The first shard's name does not end as `llama-gguf-split` names it,
    /// so the other files cannot be found beside it.
    #[error("its name does not end in '{expected}', so the other shards cannot be found beside it")]
    BadName { expected: String },
    /// One of several files given as a split model has no `split.no`/`split.count`.
    #[error("not a shard of a split model (no split.no and split.count)")]
    NotAShard,
}
