//! How a memory budget divides between the weights every token reads, one
//! session, and a cache of routed experts (see [`super::expert_cache`]).
//!
//! Under a budget, everything but the routed experts (attention, DeltaNet,
//! routers, shared experts, norms, embedding and head) is read once at load
//! into memory the model owns, and the routed experts are served from a
//! cache of fixed slots sized to what remains after one session. Owned
//! memory rather than the mapping: the page cache may drop mapped weights
//! under pressure (and a phone counts the page cache against the app), and a
//! file truncated under a mapping faults the process instead of returning an
//! error.

use std::ops::Range;

use super::cache::KvType;
use super::expert_cache::ExpertCache;
use super::network::Network;
use super::weights::Experts;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// The context a session gets when it asks for 0: the model's training
/// context, at most this many tokens (a phone's memory, not the model's
/// limit, bounds it by default).
pub const DEFAULT_MAX_CONTEXT: usize = 4096;

/// Scratch one session's forward passes may grow to (a 512-token prefill
/// batch of the full-geometry qwen35moe model needs about 100 MiB; measured
/// as cgroup peaks in BENCHMARKS.md).
pub const SESSION_SCRATCH_BYTES: u64 = 160 << 20;

/// The default context for a model trained on `trained` tokens (if the file says).
pub fn default_context(trained: Option<u64>) -> usize {
    trained.map_or(DEFAULT_MAX_CONTEXT, |c| (c as usize).clamp(1, DEFAULT_MAX_CONTEXT))
}

/// How a budget divides for one model (all in bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The model file.
    pub file_bytes: u64,
    /// Kept in memory under a budget: every tensor but the routed experts, and the header.
    pub resident_bytes: u64,
    /// The routed experts in the file.
    pub expert_bytes: u64,
    /// One session at the default context (KV cache, recurrent state, scratch).
    pub session_bytes: u64,
    /// Resident weights, one token's experts (every MoE layer's routed
    /// experts in cache slots) and the session: less than this is refused.
    pub minimum_budget_bytes: u64,
    /// What the budget leaves for the expert cache, in whole slots (0
    /// without a budget or below the minimum).
    pub cache_bytes: u64,
    /// Experts the cache holds.
    pub cache_slots: u64,
    /// Bytes of one slot (one expert of one layer, gate + up + down).
    pub slot_bytes: u64,
}

/// The routed-expert tensors a budget reads through its cache: the trunk's
/// ([`Network::experts`]) and those of the multi-token-prediction layer, if
/// the file has one (it drafts under the budget as the trunk decodes: its
/// experts cached, not resident in full).
pub(super) fn budgeted_experts(net: &dyn Network) -> Vec<(usize, &Experts)> {
    let mut all = net.experts();
    if let Ok(Some(mtp)) = net.mtp() {
        all.extend(mtp.experts());
    }
    all
}

/// The routed-expert stacks of a network, per MoE layer: `[gate, up, down]`
/// (or `[gate_up, down]`), as [`budgeted_experts`] lists them.
pub(super) fn expert_stacks(net: &dyn Network) -> Vec<Vec<&Experts>> {
    let mut stacks: Vec<(usize, Vec<&Experts>)> = Vec::new();
    for (layer, x) in budgeted_experts(net) {
        match stacks.last_mut() {
            Some((l, stack)) if *l == layer => stack.push(x),
            _ => stacks.push((layer, vec![x])),
        }
    }
    stacks.into_iter().map(|(_, s)| s).collect()
}

/// The file's byte ranges a budgeted model keeps resident: the header (of
/// each shard of a split model) and every tensor that is not a routed-expert
/// stack or read row by row from the mapping ([`Network::streamed`]).
pub(super) fn resident_ranges(file: &GgufFile, net: &dyn Network) -> Vec<Range<usize>> {
    let mut experts: Vec<Range<usize>> = budgeted_experts(net).iter().map(|(_, x)| x.range()).collect();
    experts.extend(net.streamed());
    // Matrices laid out interleaved live in their own copies.
    experts.extend(file.interleaved_ranges());
    let headers = file.shards().iter().map(|s| s.start as usize..(s.start + s.data_offset.min(s.bytes)) as usize);
    let tensors = file.tensors().iter().map(|t| file.tensor_range(t));
    headers.chain(tensors.filter(|r| !experts.contains(r))).collect()
}

impl MemoryPlan {
    /// The plan for `budget` bytes (0 = none) with one session of the
    /// default context and an f16 KV cache.
    pub(super) fn new(file: &GgufFile, net: &dyn Network, budget: u64, trained: Option<u64>) -> MemoryPlan {
        let n_ctx = default_context(trained);
        let state: usize = net.layer_kinds().into_iter().map(|k| k.state_bytes(n_ctx, KvType::F16)).sum();
        let session_bytes = state as u64 + SESSION_SCRATCH_BYTES;
        let resident_bytes: u64 =
            resident_ranges(file, net).iter().map(|r| r.len() as u64).sum::<u64>() + file.interleaved_bytes();
        let stacks = expert_stacks(net);
        let expert_bytes: u64 = budgeted_experts(net).iter().map(|(_, x)| x.range().len() as u64).sum();
        let slot_bytes = ExpertCache::slot_bytes(&stacks) as u64;
        let per_token = (stacks.len() * net.experts_used()) as u64 * slot_bytes;
        let minimum_budget_bytes = resident_bytes + per_token + session_bytes;
        let (cache_slots, cache_bytes) = match budget {
            b if b >= minimum_budget_bytes && slot_bytes > 0 => {
                let slots = (b - resident_bytes - session_bytes) / slot_bytes;
                // More slots than experts buy nothing.
                let slots = slots.min(stacks.iter().map(|s| s[0].n_expert as u64).sum());
                (slots, slots * slot_bytes)
            }
            _ => (0, 0),
        };
        MemoryPlan {
            file_bytes: file.file_bytes(),
            resident_bytes,
            expert_bytes,
            session_bytes,
            minimum_budget_bytes,
            cache_bytes,
            cache_slots,
            slot_bytes,
        }
    }

    /// The refusal of a budget below the minimum at load.
    pub fn refuse(&self, budget: u64) -> Error {
        Error::OutOfMemory(self.below_minimum(budget))
    }

    /// Why `budget` is refused: it is below the minimum, stated with its parts.
    pub fn below_minimum(&self, budget: u64) -> String {
        format!(
            "a memory budget of {budget} bytes is below this model's minimum of {} bytes \
             ({} resident weights, {} for one token's experts, {} for one session)",
            self.minimum_budget_bytes,
            self.resident_bytes,
            self.minimum_budget_bytes - self.resident_bytes - self.session_bytes,
            self.session_bytes
        )
    }
}

/// The memory a model holds now (all in bytes); see `Model::memory_usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Weights in memory: under a budget, every weight but the routed
    /// experts (read into memory the model owns); without one, the pages of
    /// the mapped file that are in memory (the page cache's, which the OS
    /// may drop), or the whole file read into memory.
    pub resident_weights_bytes: u64,
    /// The expert cache's slots that hold or have held an expert (0 without
    /// a budget: the experts are in the mapping).
    pub expert_cache_bytes: u64,
    /// The KV caches and recurrent state of the model's live sessions.
    pub kv_cache_bytes: u64,
    /// Their forward passes' buffers and last logits.
    pub scratch_bytes: u64,
}

impl MemoryUsage {
    /// Everything counted.
    pub fn total(&self) -> u64 {
        self.resident_weights_bytes + self.expert_cache_bytes + self.kv_cache_bytes + self.scratch_bytes
    }
}

/// Whether `budget` can hold a session of `state_bytes` of state next to the
/// model's resident weights and expert cache; the error states the minimum.
pub(super) fn check_session(plan: &MemoryPlan, budget: u64, state_bytes: u64) -> Result<()> {
    let need = plan.resident_bytes + plan.cache_bytes + state_bytes + SESSION_SCRATCH_BYTES;
    if need > budget {
        let minimum = plan.minimum_budget_bytes - plan.session_bytes + state_bytes + SESSION_SCRATCH_BYTES;
        return Err(Error::OutOfMemory(format!(
            "a session of {} bytes does not fit the memory budget of {budget} bytes next to the model \
             ({} resident, {} expert cache): a smaller context fits, or a budget of at least {minimum} bytes",
            state_bytes + SESSION_SCRATCH_BYTES,
            plan.resident_bytes,
            plan.cache_bytes
        )));
    }
    Ok(())
}
