//! pocket-ffi: the only FFI surface of Pocket, exported through UniFFI
//! proc-macros (namespace `pocket`) to Swift, Kotlin and Python.
//!
//! A thin layer over pocket-core:
//! - [`model`]: `PocketModel` (load from a path or a file descriptor, or a split model from its shards'
//!   paths or descriptors, `info()`), `LoadOptions`, `Backend`, `FilePart`.
//! - [`session`]: `PocketSession` (generate, chat, their event forms, cancel, reset, save, restore), the
//!   option, message and stats records, the foreign `TokenListener`.
//! - [`structured`]: structured output: `ToolSpec`, `ToolCall`, `ToolChoice`, `Reasoning`,
//!   `GenerationEvent` and the foreign `EventListener`.
//! - [`download`]: `downloadModel` (resumable, verified model downloads through pocket-download),
//!   `DownloadRequest`, the foreign `DownloadListener`, `DownloadHandle`.
//! - [`error`]: `PocketError`, the one place core errors are folded into what an app can act on,
//!   and the panic guard every exported call runs in.
//! - `logging`: `log` records to os_log (iOS), logcat (Android, with `JNI_OnLoad`), or stderr on
//!   request (`POCKET_LOG=debug`).

pub mod download;
pub mod error;
mod logging;
pub mod model;
pub mod session;
pub mod structured;

pub use download::{download_model, DownloadHandle, DownloadListener, DownloadRequest};
pub use error::PocketError;
pub use model::{
    plan_memory, Backend, FilePart, GpuAdapter, LoadOptions, LoadProgressListener, MemoryPlan, ModelInfo, PocketModel,
};
pub use session::{
    ChatMessage, GenerateOptions, GenerationStats, KvCacheType, PocketSession, SessionOptions, Speculation, StopReason,
    TokenListener,
};
pub use structured::{EventListener, GenerationEvent, Reasoning, ToolCall, ToolCallValue, ToolChoice, ToolSpec};

uniffi::setup_scaffolding!("pocket");
