//! What an architecture implements: [`Network`], its trunk, its layer
//! recipe and the state each layer keeps. It knows the blocks and the pass
//! it runs in, not which backend computes the pass or which memory policy
//! holds its weights (that is [`super::loaded::Model`]'s business).

use super::blocks::moe::Routing;
use super::mtp::Mtp;
use super::pass::Pass;
#[cfg(feature = "gpu")]
use super::record::Record;
use super::scratch::take;
use super::state::{LayerKind, LayerState, Scratch};
use super::trunk::Trunk;
use super::weights::Experts;
use crate::error::{Error, Result};
use crate::gguf::Arch;

/// An architecture: its trunk (embedding and head), its per-layer state,
/// and its layer recipe.
pub trait Network: Send + Sync {
    fn arch(&self) -> Arch;

    fn trunk(&self) -> &Trunk;

    /// Layers run per token.
    fn n_layer(&self) -> usize;

    /// The kind of state each layer keeps.
    fn layer_kinds(&self) -> Vec<LayerKind<'_>>;

    /// Run every layer over the residual stream `s.x` (`[n][n_embd]`: the
    /// embedded tokens on entry, the last layer's output on exit), appending
    /// the tokens to the layers' state and, when asked, the MoE routing to `trace`.
    fn layers(
        &self,
        pass: &Pass,
        states: &mut [LayerState],
        s: &mut Scratch,
        trace: Option<&mut Vec<Routing>>,
    ) -> Result<()>;

    /// Embed the pass's tokens into the residual stream `s.x` (`[n][n_embd]`)
    /// and prepare whatever else the layers read per token; `mapped` is the
    /// model file's mapping (what [`streamed`](Self::streamed) names is read
    /// from it even under a memory budget).
    fn embed(&self, pass: &Pass, mapped: &[u8], tokens: &[u32], s: &mut Scratch) {
        let _ = mapped;
        let t = self.trunk();
        t.embed(pass, tokens, take(&mut s.x, tokens.len() * t.n_embd));
    }

    /// File byte ranges read a row at a time from the mapping and never
    /// copied into memory under a budget (Gemma 4's per-layer embeddings).
    fn streamed(&self) -> Vec<std::ops::Range<usize>> {
        Vec::new()
    }

    /// The routed-expert tensors, with their layer: gate, up and down of
    /// each MoE layer in that order (or gate_up and down where one tensor
    /// holds gate and up); an expert's rows of these are one cache slot.
    fn experts(&self) -> Vec<(usize, &Experts)> {
        Vec::new()
    }

    /// The multi-token-prediction layer the file carries after its trunk
    /// (`Ok(None)`: none; an error: one that could not be loaded, and why).
    fn mtp(&self) -> Result<Option<&Mtp>> {
        Ok(None)
    }

    /// Experts each token is routed to in a MoE layer (0 without experts).
    fn experts_used(&self) -> usize {
        0
    }

    /// Record the layers of one decoded token for a device's graph, over
    /// `r.rows()`'s residual stream as [`layers`](Self::layers) runs them on
    /// the host; an architecture that does not record decodes per operation.
    #[cfg(feature = "gpu")]
    fn record(&self, _r: &mut dyn Record) -> Result<()> {
        Err(Error::InvalidArgument(format!("{} does not record its layers for the GPU", self.arch().name())))
    }
}

/// The error for a state made by another model (its layers do not match).
pub(super) fn foreign_state() -> Error {
    Error::InvalidArgument("state does not belong to this model".into())
}
