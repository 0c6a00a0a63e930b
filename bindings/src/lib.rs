//! pocket-ffi: the only FFI surface of Pocket (UniFFI). A thin layer over
//! pocket-core; filled in by the SDK-surface work.

pub use pocket_core::Error;
