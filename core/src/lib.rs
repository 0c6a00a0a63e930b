//! pocket-core: the engine behind Pocket.
//!
//! Modules, bottom up (each uses only those above it in this list; see
//! ARCHITECTURE.md for what each owns):
//! - [`quant`]: block formats, one file per family, each with a scalar reference.
//! - [`quantize`]: f32 to GGUF blocks (the quantiser), equal to llama.cpp's.
//! - [`gguf`]: the hardened GGUF reader over a memory map.
//! - [`kernels`]: matmul and f32 helpers, with SIMD paths chosen at start-up.
//! - [`threads`]: the persistent worker pool.
//! - [`gpu`]: the optional GPU backend on wgpu (cargo feature `gpu`; without
//!   it a stand-in with the same API answers "not built with the GPU backend").
//! - [`model`]: one file per architecture, built from shared blocks around a
//!   shared trunk; the `Backend` seam the blocks compute through.
//! - [`tokenizer`]: GGUF tokenizers (byte-level BPE, SentencePiece), exact with llama.cpp.
//! - [`chat`]: chat templates from the GGUF, rendered with minijinja.
//! - [`structured`]: constraints (JSON Schema, Lark, regex, choices) as token masks by llguidance; tool calls per family; thinking formats.
//! - [`sampler`]: the sampling chain and the valid range of its settings.
//! - [`session`]: a conversation: prefix reuse, generation, cancellation, defaults.

pub mod chat;
pub mod error;
pub mod gguf;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod quantize;
pub mod sampler;
pub mod session;
pub mod structured;
pub mod threads;
pub mod tokenizer;

pub use error::{Error, Result, ShardProblem};
