//! What a network records its layers with for a device's decode graph: the
//! interface of [`super::network::Network::record`], apart from the GPU
//! backend that implements it (`gpu_backend`'s recorder).

use super::blocks::attention::Attention;
use super::blocks::deltanet::DeltaNet;
use super::blocks::ffn::Dense;
use super::blocks::moe::Moe;
use super::blocks::norm::RmsNorm;
use crate::gpu::Tensor;
use crate::Result;

/// Records one decoded token's layers, block by block, into a graph. Each
/// call fails with [`crate::Error::InvalidArgument`] where the device does
/// not take the block (the token then decodes per operation).
pub trait Record {
    /// The residual stream, the current block's normalised input and its output.
    fn rows(&self) -> (Tensor, Tensor, Tensor);
    /// `out = norm(x)`.
    fn norm(&mut self, n: &RmsNorm, x: Tensor, out: Tensor) -> Result<()>;
    /// `x = norm(x)`.
    fn norm_in_place(&mut self, n: &RmsNorm, x: Tensor) -> Result<()>;
    /// `x += y`.
    fn add(&mut self, x: Tensor, y: Tensor) -> Result<()>;
    /// `out = attention(x)` of layer `il` over its KV cache.
    fn attention(&mut self, il: usize, a: &Attention, x: Tensor, out: Tensor) -> Result<()>;
    /// `out = ffn(x)`.
    fn dense(&mut self, d: &Dense, x: Tensor, out: Tensor) -> Result<()>;
    /// `out = moe(x)`: the router, the chosen experts, the shared expert.
    fn moe(&mut self, m: &Moe, x: Tensor, out: Tensor) -> Result<()>;
    /// `out = deltanet(x)` of layer `il`, advancing its recurrent state.
    fn deltanet(&mut self, il: usize, d: &DeltaNet, x: Tensor, out: Tensor) -> Result<()>;
}
