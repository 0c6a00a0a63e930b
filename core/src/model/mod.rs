//! Models: one file per architecture (its hyper-parameters, its tensor map
//! and its layer recipe), built from shared [`blocks`] around a shared
//! [`trunk`], over weights that stay in the memory-mapped GGUF file.
//!
//! A [`Model`] is immutable and shared by any number of sequences; each
//! sequence owns a [`State`]. This file only chooses the architecture.
//!
//! What the families of issue 49 took (lines of code, tests apart):
//! `lfm2moe.rs` 246 + a new block `shortconv.rs` 218; `granitehybrid.rs` 290 +
//! `mamba2.rs` 299; `deepseek2.rs` 248 + `mla.rs` 371 + `yarn.rs` 108;
//! `gptoss.rs` 220 and no new block: attention took sinks (the softmax's
//! extra logit per head; such layers skip the tiled prefill kernel and the
//! GPU's), an output bias and YaRN (deepseek2's `Yarn`); the MoE block took
//! a router bias, per-expert output biases, softmax over the chosen experts
//! (a `Gating`) and the activation as a parameter (the clamped SwiGLU is an
//! `Act`); the sliding-window pattern reader moved to `Meta`.
//! Shared, not copied: the one MoE block (a selection-only router bias used
//! by LFM2 and DeepSeek, group-limited routing an option of the same
//! `route`), the attention block (Granite's layers are it without RoPE), the
//! dense FFN and norms, the trunk (LFM2's final norm and Granite's logit
//! divisor are trunk options), and the recurrent `LayerState` (a short-conv
//! window and a Mamba2 conv+scan state are DeltaNet-shaped buffers, so
//! checkpoints, snapshots, prefix reuse and the memory plan needed no
//! change). Only MLA needed a new cache layout (`LayerKind::Latent`: 80
//! values per position on the fixture).
//!
//! Issue 50's MTP drafter took `mtp.rs` (the nextn layer: the attention and
//! MoE blocks as they are, its own KV cache in an `MtpState`) and one option
//! of the pass: a state may keep every token's final-normed hidden state.
//!
//! `olmoe.rs` 160: nothing new but two options, a q/k norm over the whole
//! projections (`QkNorm::Whole` of the attention block) and the MoE's
//! routing with renormalisation and scaling off. `ernie45moe.rs` 200: the
//! MoE block's selection bias and shared expert as DeepSeek uses them, its
//! layers chosen by a leading dense count and an interleave step.

pub mod blocks;
mod budget;
mod cache;
mod cpu;
mod deepseek2;
mod ernie45moe;
mod expert_cache;
mod gemma3;
mod gemma4;
mod gptoss;
mod gpu_backend;
mod granitehybrid;
mod hparams;
mod identity;
mod lfm2moe;
mod llama;
mod loaded;
mod mtp;
mod network;
mod olmoe;
mod params;
pub mod pass;
mod qwen35moe;
#[cfg(feature = "gpu")]
mod record;
mod scratch;
pub mod ssm;
mod state;
mod trunk;
mod weights;

pub use blocks::deltanet::{DeltaState, SavedDelta};
pub use blocks::local_routing::{LocalRouting, ROUTING_ENV};
pub use blocks::moe::Routing;
pub use budget::{default_context, MemoryPlan, MemoryUsage, DEFAULT_MAX_CONTEXT};
pub use cache::{KvCache, KvType, Logits};
pub use expert_cache::ExpertIo;
pub use gpu_backend::{BackendCounters, GpuBackend};
pub use identity::ModelIdentity;
pub use loaded::{BackendKind, LoadOptions, Model};
pub use mtp::MtpState;
pub use network::Network;
pub use pass::{HostBlock, Observer};
pub use state::{Checkpoint, LayerState, State};

use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile};

/// The network of the file's architecture (`general.architecture`).
fn network_for(file: &GgufFile) -> Result<Box<dyn Network>> {
    let name = file.architecture()?.ok_or_else(|| Error::MissingKey("general.architecture".into()))?;
    let arch = Arch::from_name(name).ok_or_else(|| Error::UnsupportedArchitecture(name.to_string()))?;
    Ok(match arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => Box::new(llama::Llama::load(file, arch)?),
        Arch::Gemma3 => Box::new(gemma3::Gemma3::load(file)?),
        Arch::Gemma4 => Box::new(gemma4::Gemma4::load(file)?),
        Arch::Qwen35Moe => Box::new(qwen35moe::Qwen35Moe::load(file)?),
        Arch::Deepseek2 => Box::new(deepseek2::Deepseek2::load(file)?),
        Arch::GraniteHybrid => Box::new(granitehybrid::GraniteHybrid::load(file)?),
        Arch::Lfm2Moe => Box::new(lfm2moe::Lfm2Moe::load(file)?),
        Arch::GptOss => Box::new(gptoss::GptOss::load(file)?),
        Arch::Olmoe => Box::new(olmoe::Olmoe::load(file)?),
        Arch::Ernie45Moe => Box::new(ernie45moe::Ernie45Moe::load(file)?),
    })
}
