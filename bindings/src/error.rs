//! The one error type apps see, and the one place core errors are folded into it.
//!
//! pocket-core has a variant per way a file can be wrong; an app can only act
//! on a few categories (pick another file, free memory, start a new
//! conversation, fix its own call). Each variant carries `reason`, the core
//! error's message. (Never a field called `message`: Kotlin exceptions own
//! that name.)
//!
//! Every exported call runs inside [`guard`], so a panic becomes
//! [`PocketError::Internal`] instead of unwinding into foreign code.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pocket_core::{Error as CoreError, ShardProblem};

/// What went wrong, in categories a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum PocketError {
    /// The file is not a usable GGUF model (corrupt, truncated, missing tensors or keys).
    #[error("invalid model: {reason}")]
    InvalidModel { reason: String },
    /// A valid file this engine cannot run (architecture, tensor type, tokenizer, GGUF version).
    #[error("unsupported model: {reason}")]
    UnsupportedModel { reason: String },
    /// Memory (or address space) ran out.
    #[error("out of memory: {reason}")]
    OutOfMemory { reason: String },
    /// The conversation no longer fits the context: reset the session or enable the sliding window.
    #[error("context full: {reason}")]
    ContextFull { reason: String },
    /// The operation was cancelled.
    #[error("cancelled: {reason}")]
    Cancelled { reason: String },
    /// Reading the file failed (missing, unreadable, bad descriptor).
    #[error("I/O error: {reason}")]
    Io { reason: String },
    /// The caller passed something unusable (a bad option, role, range or template input).
    #[error("invalid argument: {reason}")]
    InvalidArgument { reason: String },
    /// A bug: a panic inside the engine, or a failing listener.
    #[error("internal error: {reason}")]
    Internal { reason: String },
    /// A download could not fetch its file: unreachable, refused (4xx), still
    /// failing after the retries, or redirected from https to http. The
    /// partial file stays: the same request resumes it.
    #[error("network error: {reason}")]
    Network { reason: String },
    /// A downloaded file is not the expected one (its SHA-256 or size
    /// differs); the partial file was deleted.
    #[error("integrity error: {reason}")]
    Integrity { reason: String },
    /// A download's destination cannot hold it (not enough free space, a full
    /// disk, a failed write or rename); the partial file stays for a resume.
    #[error("storage error: {reason}")]
    Storage { reason: String },
}

impl PocketError {
    pub(crate) fn invalid_argument(reason: impl Into<String>) -> Self {
        PocketError::InvalidArgument { reason: reason.into() }
    }

    pub(crate) fn internal(reason: impl Into<String>) -> Self {
        PocketError::Internal { reason: reason.into() }
    }

    /// The same category with another reason.
    fn with_reason(self, reason: String) -> Self {
        match self {
            PocketError::InvalidModel { .. } => PocketError::InvalidModel { reason },
            PocketError::UnsupportedModel { .. } => PocketError::UnsupportedModel { reason },
            PocketError::OutOfMemory { .. } => PocketError::OutOfMemory { reason },
            PocketError::ContextFull { .. } => PocketError::ContextFull { reason },
            PocketError::Cancelled { .. } => PocketError::Cancelled { reason },
            PocketError::Io { .. } => PocketError::Io { reason },
            PocketError::InvalidArgument { .. } => PocketError::InvalidArgument { reason },
            PocketError::Internal { .. } => PocketError::Internal { reason },
            PocketError::Network { .. } => PocketError::Network { reason },
            PocketError::Integrity { .. } => PocketError::Integrity { reason },
            PocketError::Storage { .. } => PocketError::Storage { reason },
        }
    }
}

impl From<CoreError> for PocketError {
    fn from(e: CoreError) -> Self {
        let reason = e.to_string();
        match e {
            // A shard's own error falls in that error's category, its reason naming the shard.
            CoreError::Split { problem: ShardProblem::Invalid(inner), .. } => PocketError::from(*inner).with_reason(reason),
            // A shard that is not there could not be read.
            CoreError::Split { problem: ShardProblem::Missing { .. }, .. } => PocketError::Io { reason },
            // A wrong set of files (extra, duplicated, mismatched shards) is not a usable model.
            CoreError::Split { .. } => PocketError::InvalidModel { reason },
            CoreError::Io(io) if is_out_of_memory(&io) => PocketError::OutOfMemory { reason },
            CoreError::Io(_) => PocketError::Io { reason },
            // The caller's offset/length does not fit its descriptor.
            CoreError::RangeOutsideFile { .. } => PocketError::InvalidArgument { reason },

            CoreError::UnsupportedVersion(_)
            | CoreError::UnknownTensorType { .. }
            | CoreError::UnsupportedArchitecture(_)
            | CoreError::UnsupportedTensorType { .. }
            | CoreError::UnknownTokenizer(_)
            | CoreError::UnknownPreTokenizer(_)
            // The file's chat template does not compile with our engine.
            | CoreError::Template { .. } => PocketError::UnsupportedModel { reason },

            CoreError::BadMagic(_)
            | CoreError::Truncated { .. }
            | CoreError::TooManyTensors { .. }
            | CoreError::TooManyKeys { .. }
            | CoreError::StringTooLong { .. }
            | CoreError::ArrayTooLong { .. }
            | CoreError::NestingTooDeep { .. }
            | CoreError::InvalidUtf8 { .. }
            | CoreError::UnknownValueType { .. }
            | CoreError::DuplicateKey(_)
            | CoreError::BadAlignment(_)
            | CoreError::BadDimCount { .. }
            | CoreError::ZeroDim { .. }
            | CoreError::ShapeOverflow { .. }
            | CoreError::PartialBlock { .. }
            | CoreError::MisalignedTensor { .. }
            | CoreError::TensorOutOfBounds { .. }
            | CoreError::TensorOverlap { .. }
            | CoreError::DuplicateTensor(_)
            | CoreError::WrongValueType { .. }
            | CoreError::MissingKey(_)
            | CoreError::MissingTensor(_)
            | CoreError::TensorShape { .. }
            | CoreError::InvalidHyperparameter { .. }
            | CoreError::Tokenizer(_) => PocketError::InvalidModel { reason },

            // A template raises on messages it does not accept (e.g. roles out of order).
            CoreError::TemplateRaised(_) | CoreError::InvalidArgument(_) => PocketError::InvalidArgument { reason },
            CoreError::OutOfMemory(_) => PocketError::OutOfMemory { reason },
            CoreError::ContextFull { .. } => PocketError::ContextFull { reason },
            CoreError::Cancelled => PocketError::Cancelled { reason },
            // No GPU (or a driver that refuses one) is the model's setting an app can change.
            CoreError::GpuUnavailable(_) => PocketError::UnsupportedModel { reason },
            CoreError::Gpu(_) => PocketError::Internal { reason },
            // `Error` is non-exhaustive: a variant added later is a bug until it is mapped here.
            _ => PocketError::Internal { reason },
        }
    }
}

/// mmap and allocation failures arrive as I/O errors (ENOMEM).
fn is_out_of_memory(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::OutOfMemory || e.raw_os_error() == Some(12)
}

/// A foreign listener threw something that is not a `PocketError`.
impl From<uniffi::UnexpectedUniFFICallbackError> for PocketError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        PocketError::Internal { reason: format!("listener failed: {}", e.reason) }
    }
}

/// Run `f`, turning a panic into [`PocketError::Internal`].
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, PocketError>) -> Result<T, PocketError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let what = panic_text(payload.as_ref());
        log::error!("panic caught at the FFI boundary: {what}");
        Err(PocketError::internal(format!("panic: {what}")))
    })
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "unknown panic"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_errors_fold_into_categories() {
        let cat = |e: CoreError| std::mem::discriminant(&PocketError::from(e));
        let d = |e: PocketError| std::mem::discriminant(&e);
        let r = String::new;
        assert_eq!(cat(CoreError::BadMagic(*b"nope")), d(PocketError::InvalidModel { reason: r() }));
        assert_eq!(
            cat(CoreError::UnsupportedArchitecture("x".into())),
            d(PocketError::UnsupportedModel { reason: r() })
        );
        assert_eq!(cat(CoreError::ContextFull { n_ctx: 8 }), d(PocketError::ContextFull { reason: r() }));
        assert_eq!(cat(CoreError::Cancelled), d(PocketError::Cancelled { reason: r() }));
        assert_eq!(cat(CoreError::OutOfMemory("kv".into())), d(PocketError::OutOfMemory { reason: r() }));
        assert_eq!(cat(CoreError::InvalidArgument("x".into())), d(PocketError::InvalidArgument { reason: r() }));
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(cat(CoreError::Io(missing)), d(PocketError::Io { reason: r() }));
        let enomem = std::io::Error::from_raw_os_error(12);
        assert_eq!(cat(CoreError::Io(enomem)), d(PocketError::OutOfMemory { reason: r() }));
        // No GPU is a setting the app can change; a GPU failing while it runs is ours.
        assert_eq!(
            cat(CoreError::GpuUnavailable("no adapter".into())),
            d(PocketError::UnsupportedModel { reason: r() })
        );
        assert_eq!(cat(CoreError::Gpu("device lost".into())), d(PocketError::Internal { reason: r() }));
        // A split model's shard: its own error's category, or the set's.
        let shard = |problem| CoreError::Split { shard: "m-00002-of-00003.gguf".into(), problem };
        let unreadable = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = PocketError::from(shard(ShardProblem::Invalid(Box::new(CoreError::Io(unreadable)))));
        assert!(matches!(&e, PocketError::Io { reason } if reason.contains("m-00002-of-00003.gguf")), "{e}");
        assert_eq!(cat(shard(ShardProblem::Missing { no: 1, count: 3 })), d(PocketError::Io { reason: r() }));
        assert_eq!(cat(shard(ShardProblem::Extra { no: 3, count: 3 })), d(PocketError::InvalidModel { reason: r() }));
        assert_eq!(
            cat(shard(ShardProblem::Invalid(Box::new(CoreError::BadMagic(*b"nope"))))),
            d(PocketError::InvalidModel { reason: r() })
        );
    }

    #[test]
    fn reason_is_the_core_message() {
        let e = PocketError::from(CoreError::MissingTensor("output_norm.weight".into()));
        assert_eq!(e, PocketError::InvalidModel { reason: "tensor 'output_norm.weight' is missing".into() });
    }

    #[test]
    fn panics_become_internal_errors() {
        let r: Result<(), _> = guard(|| panic!("boom {}", 7));
        assert_eq!(r, Err(PocketError::Internal { reason: "panic: boom 7".into() }));
        let r: Result<(), _> = guard(|| std::panic::panic_any(3u8));
        assert!(matches!(r, Err(PocketError::Internal { .. })));
    }
}
