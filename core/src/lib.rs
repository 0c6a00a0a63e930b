//! pocket-core: the engine behind Pocket.
//!
//! Layers, bottom up (each depends only on those above it in this list):
//! - [`quant`]: block formats, one file per family, each with a scalar reference.
//! - [`gguf`]: the hardened GGUF reader over a memory map.
//! - [`kernels`]: matvec/matmul and f32 helpers, with SIMD paths chosen at start-up.
//! - [`model`]: one file per architecture, built from shared blocks.
//! - [`tokenizer`]: GGUF tokenizers (byte-level BPE, SentencePiece), exact with llama.cpp.
//! - [`chat`]: chat templates from the GGUF, rendered with minijinja.

pub mod chat;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod sampler;
pub mod session;
pub mod threads;
pub mod tokenizer;

pub use error::{Error, Result};
