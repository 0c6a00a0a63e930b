//! The Mixture-of-Experts block: a router picks `n_used` of `n_expert`
//! experts per token, the tokens are grouped by expert so each routed expert
//! runs once over all its tokens (unrouted experts are never touched), and
//! the experts' outputs are summed with the router's weights; a shared expert
//! may run beside them for every token.
//!
//! [`Moe::forward`] is four steps in order: [`Moe::route`],
//! [`Groups::build`], [`Moe::run_experts`] and [`Moe::combine`].

use std::ops::Range;

use super::super::expert_cache::{ExpertCache, ExpertIo, Lease};
use super::super::hparams::Meta;
use super::super::pass::Pass;
use super::super::scratch::{take, ActCache};
use super::super::weights::{Experts, Loader, Matrix};
use super::ffn::{Act, Dense};
use super::local_routing::{row_hash, LocalRouter, LocalRouting};
use crate::error::{Error, Result};
use crate::gguf::{Key, TensorKind};
use crate::kernels::{ops, MatJob, QActs, QMatrix};

/// How router logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
    /// sqrt(softplus(x)).
    SqrtSoftplus,
    /// The experts are chosen by the raw logits and weighted by a softmax
    /// over the chosen ones only (gpt-oss).
    SoftmaxWeight,
}

impl Gating {
    /// `{arch}.expert_gating_func` (1 softmax, 2 sigmoid, 3 softmax over the
    /// chosen, 4 sqrt-softplus), or
    /// `default` when the file does not say.
    pub fn from_meta(m: &Meta, default: Gating) -> Result<Gating> {
        match m.usize_or(Key::ExpertGatingFunc, 0)? {
            0 => Ok(default),
            1 => Ok(Gating::Softmax),
            2 => Ok(Gating::Sigmoid),
            3 => Ok(Gating::SoftmaxWeight),
            4 => Ok(Gating::SqrtSoftplus),
            other => Err(Error::InvalidHyperparameter {
                key: m.key(Key::ExpertGatingFunc),
                reason: format!("unknown gating function {other}"),
            }),
        }
    }

    /// Router logits to probabilities, in place.
    fn apply(self, p: &mut [f32]) {
        match self {
            Gating::Softmax => ops::softmax(p),
            Gating::Sigmoid => p.iter_mut().for_each(|v| *v = ops::sigmoid(*v)),
            Gating::SqrtSoftplus => p.iter_mut().for_each(|v| *v = softplus(*v).sqrt()),
            // Chosen by the logits; the weights are made in `route`.
            Gating::SoftmaxWeight => {}
        }
    }
}

/// How a MoE layer routes, from the file's metadata.
#[derive(Clone, Copy, Debug)]
pub struct MoeParams {
    pub n_expert: usize,
    /// Experts per token.
    pub n_used: usize,
    /// Rows of one expert's gate and up (its hidden size).
    pub n_ff: usize,
    pub gating: Gating,
    /// Renormalise the selected experts' weights to sum to 1.
    pub norm_weights: bool,
    /// Multiply the weights by this (1 = off).
    pub weights_scale: f32,
    /// Group-limited routing (DeepSeek-V3): the experts form `n_group` equal
    /// groups, each scored by the sum of its two best selection scores, and
    /// a token's experts come from the best `n_group_used` groups (1 = off).
    pub n_group: usize,
    pub n_group_used: usize,
    /// The routed experts' activation (SwiGLU unless the architecture says).
    pub act: Act,
}

impl MoeParams {
    /// The routing keys of `m` (expert counts given by the caller, who knows
    /// which keys its architecture uses for them).
    pub fn read(m: &Meta, n_expert: usize, n_used: usize, n_ff: usize) -> Result<MoeParams> {
        if n_used == 0 || n_used > n_expert {
            return Err(Error::InvalidHyperparameter {
                key: m.key(Key::ExpertUsedCount),
                reason: format!("{n_used} of {n_expert} experts"),
            });
        }
        let n_group = m.usize_or(Key::ExpertGroupCount, 1)?.max(1);
        let n_group_used = m.usize_or(Key::ExpertGroupUsedCount, n_group)?;
        if n_group > 1 {
            let per = n_expert / n_group;
            m.ensure(
                Key::ExpertGroupCount,
                n_expert.is_multiple_of(n_group) && per >= 2,
                format!("{n_group} groups of {n_expert} experts (each needs at least 2)"),
            )?;
            m.ensure(
                Key::ExpertGroupUsedCount,
                n_group_used >= 1 && n_group_used <= n_group && n_used <= n_group_used * per,
                format!("{n_group_used} of {n_group} groups of {per} for {n_used} experts"),
            )?;
        }
        Ok(MoeParams {
            n_expert,
            n_used,
            n_ff,
            gating: Gating::from_meta(m, Gating::Softmax)?,
            norm_weights: m.bool_or(Key::ExpertWeightsNorm, true)?,
            weights_scale: m.f32_or(Key::ExpertWeightsScale, 1.0)?,
            n_group,
            n_group_used: if n_group > 1 { n_group_used } else { 1 },
            act: Act::Silu,
        })
    }
}

/// A shared expert that every token passes through, optionally scaled by
/// sigmoid(gate_inp · x).
pub struct SharedExpert {
    pub ffn: Dense,
    /// `[n_embd]`, and its tensor's name.
    pub gate_inp: Option<(Vec<f32>, String)>,
}

/// Where the routed experts' slabs come from: the mapped file, or the
/// expert cache's lease for a group of them.
pub enum Slabs<'a> {
    /// The mapped file (the pass's bytes), or the stacks copied interleaved
    /// where the pass takes them ([`Pass::from_copy`]).
    File(&'a Pass<'a>),
    Cache(&'a Lease<'a>),
}

impl Slabs<'_> {
    /// Expert `e` of stack `x`, projection `p` (its place in the stack the
    /// lease was fetched with: 0 gate, 1 up, 2 down; or 0 gate_up, 1 down),
    /// for a product of `n` activation rows.
    pub fn get<'b>(&'b self, x: &Experts, p: usize, e: usize, n: usize) -> QMatrix<'b> {
        match self {
            Slabs::File(pass) => pass.copied_slab(x, e, n).unwrap_or_else(|| x.slab(pass.file, e)),
            Slabs::Cache(lease) => lease.slab(e, p, x),
        }
    }
}

/// A Mixture-of-Experts FFN. Router `[n_expert, n_embd]`; experts stacked
/// `[n_expert][n_ff, n_embd]` (gate, up) and `[n_expert][n_embd, n_ff]` (down).
pub struct Moe {
    pub p: MoeParams,
    /// The layer it belongs to (the expert cache's key).
    pub layer: usize,
    pub router: Matrix,
    pub gate: Experts,
    pub up: Experts,
    pub down: Experts,
    pub shared: Option<SharedExpert>,
    /// `[n_expert]`, added to the probabilities to choose the experts but
    /// not to their weights (DeepSeek-V3's `e_score_correction_bias`).
    pub selection_bias: Option<Vec<f32>>,
    /// `[n_expert]`, added to the router's logits (gpt-oss's `ffn_gate_inp.bias`).
    pub router_bias: Option<Vec<f32>>,
    /// Per-expert biases of the gate, up and down outputs (gpt-oss).
    pub expert_bias: Option<ExpertBias>,
    /// The next layer's router and experts, when it is a MoE layer too: under
    /// a memory budget its likely experts are read while this layer computes.
    pub ahead: Option<Box<Ahead>>,
}

/// The routed experts' output biases: gate and up `[n_expert][n_ff]`, down
/// `[n_expert][n_embd]`.
pub struct ExpertBias {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// A later MoE layer as seen from an earlier one: enough to guess its
/// experts from the earlier layer's input and start reading them.
pub struct Ahead {
    pub layer: usize,
    pub router: Matrix,
    pub gate: Experts,
    pub up: Experts,
    pub down: Experts,
}

/// What one forward pass of the MoE block routed where (for tests and stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing {
    /// `[n_tokens][n_used]` expert ids.
    pub experts: Vec<u32>,
}

/// What the MoE block reuses from pass to pass.
#[derive(Default)]
pub struct MoeScratch {
    /// The input quantised once for the router, the experts and the shared expert.
    input: ActCache,
    /// Router probabilities `[n][n_expert]`.
    probs: Vec<f32>,
    /// One token's selection scores (biased, groups masked) and its groups' scores.
    select: Vec<f32>,
    group_scores: Vec<f32>,
    top_groups: Vec<u32>,
    /// Chosen experts and their weights, `[n][n_used]`.
    chosen: Vec<u32>,
    weights: Vec<f32>,
    groups: Groups,
    /// Gate and up outputs: the routed rows, then the shared expert's `[n]` rows.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The down projections' inputs quantised: routed rows, shared rows.
    hidden: QActs,
    shared_hidden: QActs,
    /// Down outputs of the routed rows, and their weighted sum per token.
    down: Vec<f32>,
    sum: Vec<f32>,
    /// The next layer's likely experts, and one token's guesses.
    ahead: Vec<usize>,
    top: Vec<u32>,
    /// What the expert cache served this sequence so far.
    pub io: ExpertIo,
    /// The routing hook's state (`POCKET_ROUTING`; unused when unset).
    local: LocalRouter,
    /// How well the read-ahead guesses: see [`GuessRecord`].
    guesses: GuessRecord,
}

/// How often each rank of the read-ahead's guesses (its predictor's top k for
/// the next MoE layer, best first) turned out to be routed to, per layer:
/// a running mean over one-token passes. A rank is read ahead only while it
/// is right often enough ([`READ_AHEAD_MIN`]); the guesses are still made
/// and scored when none is read, so a rank that becomes right again is read
/// again.
#[derive(Default)]
struct GuessRecord {
    /// The last one-token pass's guesses for layer `layer`, best first.
    layer: Option<usize>,
    guessed: Vec<u32>,
    /// Per layer, per rank: the share of guesses routed to.
    right: Vec<Vec<f32>>,
}

/// A guess is worth its read when it is right at least this often: a wrong
/// one spends storage bandwidth a demand read needs. (On the synthetic
/// 35B-A3B file the router's guesses are right 89 % of the time for ranks
/// 1-4 and 57 % for ranks 7-8; reading 6 of 8 measured better than 8, 4 or
/// 5 — BENCHMARKS.md, "the budget with reads overlapped and read ahead".)
const READ_AHEAD_MIN: f32 = 0.6;

/// Weight of the newest one-token pass in a rank's running mean.
const GUESS_RATE: f32 = 1.0 / 8.0;

impl GuessRecord {
    /// Rank `r`'s share right at `layer` of `k` ranks: until measured, the
    /// first three quarters are assumed right often enough, the rest not.
    fn right(&mut self, layer: usize, k: usize) -> &mut [f32] {
        if self.right.len() <= layer {
            self.right.resize_with(layer + 1, Vec::new);
        }
        let r = &mut self.right[layer];
        if r.len() != k {
            *r = (0..k).map(|i| if i < (k - k / 4).max(1) { 0.75 } else { 0.5 }).collect();
        }
        r
    }

    /// Score the guesses made for `layer` against what it routed to (`chosen`, one token's).
    fn score(&mut self, layer: usize, chosen: &[u32]) {
        if self.layer != Some(layer) {
            return;
        }
        self.layer = None;
        let guessed = std::mem::take(&mut self.guessed);
        let right = self.right(layer, chosen.len());
        for (share, g) in right.iter_mut().zip(&guessed) {
            let hit = if chosen.contains(g) { 1.0 } else { 0.0 };
            *share += GUESS_RATE * (hit - *share);
        }
        self.guessed = guessed;
    }
}

/// The routed tokens grouped by expert: expert `active[i]`'s tokens take
/// rows `seg[i]..seg[i + 1]` of the stacked expert inputs and outputs.
#[derive(Default)]
pub struct Groups {
    /// Per expert, its `(token, weight)` pairs in token order.
    members: Vec<Vec<(usize, f32)>>,
    /// Experts with at least one token, ascending (until
    /// [`ready_first`](Self::ready_first) reorders a range of them).
    active: Vec<usize>,
    /// `active` as built, ascending: the order outputs are summed in.
    sorted: Vec<usize>,
    /// Each active expert's index in `active`.
    pos: Vec<usize>,
    /// [`ready_first`](Self::ready_first)'s new order of a group.
    order: Vec<usize>,
    seg: Vec<usize>,
    /// The token of each row.
    rows: Vec<usize>,
    /// 0, 1, 2, ...: row lists of contiguous segments.
    iota: Vec<usize>,
}

impl MoeScratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        let groups = self.groups.heap_bytes();
        self.input.heap_bytes()
            + heap(&self.probs)
            + heap(&self.select)
            + heap(&self.group_scores)
            + heap(&self.top_groups)
            + heap(&self.chosen)
            + heap(&self.weights)
            + groups
            + heap(&self.gate)
            + heap(&self.up)
            + self.hidden.heap_bytes()
            + self.shared_hidden.heap_bytes()
            + heap(&self.down)
            + heap(&self.sum)
            + heap(&self.ahead)
            + heap(&self.top)
            + heap(&self.guesses.guessed)
            + self.guesses.right.iter().map(heap).sum::<usize>()
    }
}

impl Groups {
    /// Group `n` tokens' choices (`chosen`/`weights`: `[n][k]`) by expert.
    pub fn build(&mut self, chosen: &[u32], weights: &[f32], n: usize, n_expert: usize) {
        let k = chosen.len() / n;
        self.members.resize_with(n_expert, Vec::new);
        self.members.iter_mut().for_each(Vec::clear);
        for t in 0..n {
            for j in 0..k {
                self.members[chosen[t * k + j] as usize].push((t, weights[t * k + j]));
            }
        }
        self.active.clear();
        self.active.extend((0..n_expert).filter(|&e| !self.members[e].is_empty()));
        self.seg.clear();
        self.seg.push(0);
        self.rows.clear();
        self.pos.resize(n_expert, 0);
        for (i, &e) in self.active.iter().enumerate() {
            self.rows.extend(self.members[e].iter().map(|&(t, _)| t));
            self.seg.push(self.rows.len());
            self.pos[e] = i;
        }
        self.sorted.clone_from(&self.active);
        if self.iota.len() < self.rows.len().max(n) {
            self.iota = (0..self.rows.len().max(n)).collect();
        }
    }

    /// Reorder the active experts `group` (indices into the list) so that
    /// those for which `ready` holds come first, keeping their rows within
    /// the group's; returns where the others start. The sum of the outputs
    /// keeps the ascending order, so results do not change.
    pub fn ready_first(&mut self, group: Range<usize>, ready: impl Fn(usize) -> bool) -> usize {
        let order = &mut self.order;
        order.clear();
        order.extend(self.active[group.clone()].iter().filter(|&&e| ready(e)));
        let split = group.start + order.len();
        order.extend(self.active[group.clone()].iter().filter(|&&e| !ready(e)));
        let mut row = self.seg[group.start];
        for (i, &e) in (group.start..).zip(order.iter()) {
            self.active[i] = e;
            self.pos[e] = i;
            let tokens = &self.members[e];
            for (r, &(t, _)) in self.rows[row..row + tokens.len()].iter_mut().zip(tokens) {
                *r = t;
            }
            row += tokens.len();
            self.seg[i + 1] = row;
        }
        split
    }

    /// Rows in all (tokens times experts per token).
    pub fn total(&self) -> usize {
        self.rows.len()
    }

    /// `(expert, rows of its segment)` of each active expert, in ascending expert order.
    pub fn segments(&self) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
        self.sorted.iter().map(|&e| (e, self.seg[self.pos[e]]..self.seg[self.pos[e] + 1]))
    }

    /// The routed experts, in the order their rows are stacked.
    pub fn active(&self) -> &[usize] {
        &self.active
    }

    /// The `i`th active expert and its stacked rows.
    pub fn segment(&self, i: usize) -> (usize, std::ops::Range<usize>) {
        (self.active[i], self.seg[i]..self.seg[i + 1])
    }

    /// The stacked rows of the active experts `group`.
    pub fn rows_of(&self, group: std::ops::Range<usize>) -> std::ops::Range<usize> {
        self.seg[group.start]..self.seg[group.end]
    }

    /// The tokens of `rows` (a segment's input rows).
    pub fn tokens(&self, rows: std::ops::Range<usize>) -> &[usize] {
        &self.rows[rows]
    }

    /// `rows` as a row list: a segment of the stacked rows themselves.
    pub fn stacked(&self, rows: std::ops::Range<usize>) -> &[usize] {
        &self.iota[rows]
    }

    /// Expert `e`'s `(token, weight)` pairs, in token order.
    pub fn members(&self, e: usize) -> &[(usize, f32)] {
        &self.members[e]
    }

    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        heap(&self.members)
            + self.members.iter().map(heap).sum::<usize>()
            + heap(&self.active)
            + heap(&self.sorted)
            + heap(&self.pos)
            + heap(&self.order)
            + heap(&self.seg)
            + heap(&self.rows)
            + heap(&self.iota)
    }
}

impl Moe {
    /// Layer `il`'s router and stacked experts.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, p: MoeParams) -> Result<Moe> {
        let next = il + 1;
        let ahead = if ld.has(TensorKind::FfnGateInp, next) && ld.has(TensorKind::FfnGateExps, next) {
            Some(Box::new(Ahead {
                layer: next,
                router: ld.matrix(TensorKind::FfnGateInp, next, p.n_expert, n_embd)?,
                gate: ld.experts(TensorKind::FfnGateExps, next, p.n_expert, p.n_ff, n_embd)?,
                up: ld.experts(TensorKind::FfnUpExps, next, p.n_expert, p.n_ff, n_embd)?,
                down: ld.experts(TensorKind::FfnDownExps, next, p.n_expert, n_embd, p.n_ff)?,
            }))
        } else {
            None
        };
        Ok(Moe {
            ahead,
            router: ld.matrix(TensorKind::FfnGateInp, il, p.n_expert, n_embd)?,
            gate: ld.experts(TensorKind::FfnGateExps, il, p.n_expert, p.n_ff, n_embd)?,
            up: ld.experts(TensorKind::FfnUpExps, il, p.n_expert, p.n_ff, n_embd)?,
            down: ld.experts(TensorKind::FfnDownExps, il, p.n_expert, n_embd, p.n_ff)?,
            p,
            layer: il,
            shared: None,
            selection_bias: None,
            router_bias: None,
            expert_bias: None,
        })
    }

    /// Add layer `il`'s selection bias (`exp_probs_b.bias`, `[n_expert]`,
    /// or `[n_expert, 1]` as ERNIE-4.5's files keep it) when the file has
    /// one; a `required` one missing is an error.
    pub fn with_selection_bias(mut self, ld: &Loader, il: usize, required: bool) -> Result<Moe> {
        let name = TensorKind::FfnExpProbsB.bias(il);
        let n = self.p.n_expert as u64;
        let b = match ld.file.tensor(&name).map(|t| t.n_dims) {
            None if !required => return Ok(self),
            Some(2) => ld.vector_shaped(&name, &[n, 1])?,
            _ => ld.vector_shaped(&name, &[n])?,
        };
        if !b.iter().all(|v| v.is_finite()) {
            return Err(Error::InvalidHyperparameter { key: name, reason: "selection bias is not finite".into() });
        }
        self.selection_bias = Some(b);
        Ok(self)
    }

    /// Add layer `il`'s router bias (`ffn_gate_inp.bias`, `[n_expert]`) and
    /// the experts' biases (`ffn_{gate,up,down}_exps.bias`, `[n_ff or
    /// n_embd, n_expert]`), all required.
    pub fn with_biases(mut self, ld: &Loader, il: usize, n_embd: usize) -> Result<Moe> {
        let (ne, nf) = (self.p.n_expert as u64, self.p.n_ff as u64);
        let finite = |name: String, shape: &[u64]| -> Result<Vec<f32>> {
            let v = ld.vector_shaped(&name, shape)?;
            match v.iter().all(|x| x.is_finite()) {
                true => Ok(v),
                false => Err(Error::InvalidHyperparameter { key: name, reason: "a bias is not finite".into() }),
            }
        };
        self.router_bias = Some(finite(TensorKind::FfnGateInp.bias(il), &[ne])?);
        self.expert_bias = Some(ExpertBias {
            gate: finite(TensorKind::FfnGateExps.bias(il), &[nf, ne])?,
            up: finite(TensorKind::FfnUpExps.bias(il), &[nf, ne])?,
            down: finite(TensorKind::FfnDownExps.bias(il), &[n_embd as u64, ne])?,
        });
        Ok(self)
    }

    /// Add layer `il`'s shared expert (`*_shexp`, hidden size `n_ff`) and its
    /// optional input gate, when the file has them.
    pub fn with_shared_expert(mut self, ld: &Loader, il: usize, n_embd: usize, n_ff: usize) -> Result<Moe> {
        if !ld.has(TensorKind::FfnUpShexp, il) {
            return Ok(self);
        }
        let gate_name = TensorKind::FfnGateInpShexp.weight(il);
        // Stored as [n_embd] or [n_embd, 1].
        let gate_inp = match ld.file.tensor(&gate_name).map(|t| t.n_dims) {
            Some(1) => Some(ld.vector_shaped(&gate_name, &[n_embd as u64])?),
            Some(_) => Some(ld.vector_shaped(&gate_name, &[n_embd as u64, 1])?),
            None => None,
        };
        let kinds = [TensorKind::FfnGateShexp, TensorKind::FfnUpShexp, TensorKind::FfnDownShexp];
        let ffn = Dense::load_kinds(ld, il, kinds, n_embd, n_ff, Act::Silu)?;
        let gate_inp = gate_inp.map(|g| (g, gate_name));
        self.shared = Some(SharedExpert { ffn, gate_inp });
        Ok(self)
    }

    /// `out = MoE(x)` for the pass's tokens; appends the routing to `trace`
    /// when given. Under a memory budget the routed experts come from the
    /// pass's expert cache, as many at a time as it holds (a long prompt's
    /// layer may route to more experts than that); an expert that cannot be
    /// read is an I/O error.
    pub fn forward(
        &self,
        pass: &Pass,
        s: &mut MoeScratch,
        x: &[f32],
        out: &mut [f32],
        trace: Option<&mut Vec<Routing>>,
    ) -> Result<()> {
        let n = pass.n;
        // One quantisation of the input for the router, the experts and the shared expert.
        let (shared_gate, shared_up) =
            self.shared.as_ref().map_or((self.gate.all.ty, self.up.all.ty), |sh| (sh.ffn.gate.ty, sh.ffn.up.ty));
        let ahead_router = self.ahead.as_ref().map_or(self.router.ty, |a| a.router.ty);
        let tys = [self.router.ty, self.gate.all.ty, self.up.all.ty, shared_gate, shared_up, ahead_router];
        s.input.prepare(x, n, self.router.cols, &tys);

        self.route(pass, s, x);
        if n == 1 {
            s.guesses.score(self.layer, &s.chosen);
        }
        if let Some(tr) = trace {
            tr.push(Routing { experts: s.chosen.clone() });
        }
        s.groups.build(&s.chosen, &s.weights, n, self.p.n_expert);
        let n_active = s.groups.active.len();
        if pass.observer.is_some() {
            pass.observe(&[&self.router], x);
            for (i, &e) in s.groups.active.iter().enumerate() {
                let rows = &s.groups.rows[s.groups.seg[i]..s.groups.seg[i + 1]];
                pass.observe_expert(&[&self.gate, &self.up], e, x, rows);
            }
            if let Some(sh) = &self.shared {
                pass.observe(&[&sh.ffn.gate, &sh.ffn.up], x);
                if let (Some((_, name)), Some(o)) = (&sh.gate_inp, pass.observer) {
                    o.input(name, 0, 1, self.router.cols, x, None);
                }
            }
        }
        match pass.experts {
            None => {
                if let Some(map) = pass.map {
                    // Mapped: tell the OS which slabs come next, so a cold
                    // expert is read in a few large requests rather than
                    // fault by fault.
                    for (i, &e) in s.groups.active.iter().enumerate() {
                        let n = s.groups.seg[i + 1] - s.groups.seg[i];
                        for x in [&self.gate, &self.up, &self.down].into_iter().filter(|x| !pass.from_copy(x, n)) {
                            let r = x.slab_range(e);
                            map.will_need(r.start, r.len());
                        }
                    }
                }
                self.run_experts(pass, s, out, 0..n_active, true, &Slabs::File(pass))
            }
            Some(cache) => {
                // Per group of experts that fits the cache (as many as it
                // holds at each fetch: its size may change while the pass
                // runs): those already cached (and the shared expert) are
                // computed while the others are read, then the others.
                let tensors = &[&self.gate, &self.up, &self.down];
                let mut first = 0;
                while first < n_active {
                    let lease = cache.fetch(self.layer, &s.groups.active[first..], tensors)?;
                    if lease.is_empty() {
                        return Err(Error::OutOfMemory("the expert cache holds no expert".into()));
                    }
                    let group = first..first + lease.len();
                    s.io += lease.io;
                    if group == (0..n_active) {
                        self.read_ahead(pass, s, cache);
                    }
                    let split = s.groups.ready_first(group.clone(), |e| lease.is_ready(e));
                    let slabs = Slabs::Cache(&lease);
                    self.run_experts(pass, s, out, group.start..split, first == 0, &slabs)?;
                    lease.wait()?;
                    self.run_experts(pass, s, out, split..group.end, false, &slabs)?;
                    first = group.end;
                }
                Ok(())
            }
        }?;
        self.combine(s, x, out);
        Ok(())
    }

    /// Router: logits -> probabilities -> top-k -> weights, into `s.chosen`
    /// and `s.weights` (`x`: the pass's input rows). The benchmark hook
    /// [`LocalRouting`] replaces the top-k when set.
    pub fn route(&self, pass: &Pass, s: &mut MoeScratch, x: &[f32]) {
        let local = LocalRouting::from_env().ok().flatten();
        let n_embd = self.router.cols;
        let (n, n_expert, k) = (pass.n, self.p.n_expert, self.p.n_used);
        let probs = take(&mut s.probs, n * n_expert);
        pass.matmul(&mut [MatJob {
            w: self.router.view(pass.file),
            x: s.input.get(self.router.ty),
            rows: None,
            out: probs,
        }]);
        s.chosen.resize(n * k, 0);
        s.weights.resize(n * k, 0.0);
        let plain = self.selection_bias.is_none() && self.p.n_group <= 1;
        for t in 0..n {
            let p = &mut probs[t * n_expert..(t + 1) * n_expert];
            if let Some(b) = &self.router_bias {
                ops::add(p, b);
            }
            self.p.gating.apply(p);
            let chosen = &mut s.chosen[t * k..(t + 1) * k];
            if plain {
                top_k(p, chosen);
            } else {
                let groups = (self.p.n_group, self.p.n_group_used);
                let scratch = (&mut s.select, &mut s.group_scores, &mut s.top_groups);
                select_experts(p, self.selection_bias.as_deref(), groups, scratch, chosen);
            }
            if let Some(cfg) = &local {
                let row = row_hash(&x[t * n_embd..(t + 1) * n_embd]);
                s.local.choose(cfg, self.layer, pass.pos0 + t, row, n_expert, chosen);
            }
            let w = &mut s.weights[t * k..(t + 1) * k];
            for (wi, &e) in w.iter_mut().zip(chosen.iter()) {
                *wi = p[e as usize];
            }
            if self.p.gating == Gating::SoftmaxWeight {
                ops::softmax(w);
            }
            if self.p.norm_weights {
                let sum: f32 = w.iter().sum::<f32>().max(6.103_515_6e-5);
                w.iter_mut().for_each(|x| *x /= sum);
            }
            if self.p.weights_scale != 1.0 && self.p.weights_scale != 0.0 {
                w.iter_mut().for_each(|x| *x *= self.p.weights_scale);
            }
        }
    }

    /// Guess the next MoE layer's experts (its router applied to this
    /// layer's input: the residual stream changes little from one layer to
    /// the next) and start reading those the cache lacks, into at most half
    /// the slots this layer leaves: the guesses of the ranks that have been
    /// right often enough ([`GuessRecord`]).
    fn read_ahead(&self, pass: &Pass, s: &mut MoeScratch, cache: &ExpertCache) {
        s.guesses.layer = None;
        let Some(a) = &self.ahead else { return };
        let (n, n_expert, k) = (pass.n, self.p.n_expert, self.p.n_used);
        let room = cache.capacity().saturating_sub(s.groups.active.len()) / 2;
        if room < k {
            return;
        }
        let logits = take(&mut s.probs, n * n_expert);
        pass.matmul(&mut [MatJob {
            w: a.router.view(pass.file),
            x: s.input.get(a.router.ty),
            rows: None,
            out: logits,
        }]);
        // The gating functions are monotonic: the top k of the logits are the
        // top k of the weights.
        s.top.resize(k, 0);
        s.ahead.clear();
        let right = s.guesses.right(a.layer, k);
        for p in logits.chunks_exact(n_expert) {
            top_k(p, &mut s.top);
            for (&e, &share) in s.top.iter().zip(right.iter()) {
                if share >= READ_AHEAD_MIN && !s.ahead.contains(&(e as usize)) && s.ahead.len() < room {
                    s.ahead.push(e as usize);
                }
            }
        }
        if n == 1 {
            s.guesses.layer = Some(a.layer);
            s.guesses.guessed.clone_from(&s.top);
        }
        if !s.ahead.is_empty() {
            s.io += cache.prefetch(a.layer, &s.ahead, &[&a.gate, &a.up, &a.down]);
        }
    }

    /// The active experts `group` (indices into the groups' list) over their
    /// tokens, and with `with_shared` the shared expert over all of them:
    /// gate and up of all in one batch of products, the activation, then
    /// every down projection in a second batch. The routed rows' outputs land
    /// in `s.down` (at their rows), the shared expert's in `shared_out`.
    pub fn run_experts(
        &self,
        pass: &Pass,
        s: &mut MoeScratch,
        shared_out: &mut [f32],
        group: Range<usize>,
        with_shared: bool,
        slabs: &Slabs<'_>,
    ) -> Result<()> {
        let (n, n_ff, n_embd) = (pass.n, self.p.n_ff, self.router.cols);
        let shared = self.shared.as_ref().filter(|_| with_shared);
        if group.is_empty() && shared.is_none() {
            return Ok(());
        }
        let g = &s.groups;
        let total = g.total();
        let rows = g.seg[group.start]..g.seg[group.end];
        let n_ffs = self.shared.as_ref().map_or(0, |sh| sh.ffn.gate.rows);

        // gate and up of the group's experts (and of the shared expert) in one pass.
        let g_all = take(&mut s.gate, total * n_ff + n * n_ffs);
        let u_all = take(&mut s.up, total * n_ff + n * n_ffs);
        {
            let (g_routed, g_shared) = g_all.split_at_mut(total * n_ff);
            let (u_routed, u_shared) = u_all.split_at_mut(total * n_ff);
            let mut jobs = Vec::with_capacity(2 * group.len() + 2);
            let mut g_rest = &mut g_routed[rows.start * n_ff..rows.end * n_ff];
            let mut u_rest = &mut u_routed[rows.start * n_ff..rows.end * n_ff];
            for i in group.clone() {
                let (e, seg) = (g.active[i], g.seg[i]..g.seg[i + 1]);
                let m = seg.len();
                let (gout, gr) = std::mem::take(&mut g_rest).split_at_mut(m * n_ff);
                let (uout, ur) = std::mem::take(&mut u_rest).split_at_mut(m * n_ff);
                (g_rest, u_rest) = (gr, ur);
                let r = Some(&g.rows[seg]);
                let (gw, uw) = (slabs.get(&self.gate, 0, e, m), slabs.get(&self.up, 1, e, m));
                jobs.push(MatJob { w: gw, x: s.input.get(self.gate.all.ty), rows: r, out: gout });
                jobs.push(MatJob { w: uw, x: s.input.get(self.up.all.ty), rows: r, out: uout });
            }
            if let Some(sh) = shared {
                let (gw, uw) = (&sh.ffn.gate, &sh.ffn.up);
                jobs.push(MatJob { w: gw.view(pass.file), x: s.input.get(gw.ty), rows: None, out: g_shared });
                jobs.push(MatJob { w: uw.view(pass.file), x: s.input.get(uw.ty), rows: None, out: u_shared });
            }
            pass.matmul(&mut jobs);
        }
        if let Some(b) = &self.expert_bias {
            for i in group.clone() {
                let (e, seg) = (g.active[i], g.seg[i]..g.seg[i + 1]);
                for row in seg {
                    ops::add(&mut g_all[row * n_ff..(row + 1) * n_ff], &b.gate[e * n_ff..(e + 1) * n_ff]);
                    ops::add(&mut u_all[row * n_ff..(row + 1) * n_ff], &b.up[e * n_ff..(e + 1) * n_ff]);
                }
            }
        }
        let r = rows.start * n_ff..rows.end * n_ff;
        self.p.act.apply(&mut g_all[r.clone()], &u_all[r]);
        if shared.is_some() {
            let r = total * n_ff..total * n_ff + n * n_ffs;
            Act::Silu.apply(&mut g_all[r.clone()], &u_all[r]);
        }

        // down: one quantisation of the group's expert inputs, then every expert in one pass.
        if pass.observer.is_some() {
            let hidden = &g_all[..total * n_ff];
            for i in group.clone() {
                pass.observe_expert(&[&self.down], g.active[i], hidden, &g.iota[g.seg[i]..g.seg[i + 1]]);
            }
            if let Some(sh) = shared {
                pass.observe(&[&sh.ffn.down], &g_all[total * n_ff..total * n_ff + n * n_ffs]);
            }
        }
        let d_all = take(&mut s.down, total * n_embd);
        s.hidden.quantize(self.down.all.ty, &g_all[rows.start * n_ff..rows.end * n_ff], rows.len(), n_ff);
        if let Some(sh) = shared {
            s.shared_hidden.quantize(sh.ffn.down.ty, &g_all[total * n_ff..total * n_ff + n * n_ffs], n, n_ffs);
        }
        let mut jobs = Vec::with_capacity(group.len() + 1);
        let mut d_rest = &mut d_all[rows.start * n_embd..rows.end * n_embd];
        for i in group.clone() {
            let (e, seg) = (g.active[i], g.seg[i]..g.seg[i + 1]);
            let (d, dr) = std::mem::take(&mut d_rest).split_at_mut(seg.len() * n_embd);
            d_rest = dr;
            let local = &g.iota[seg.start - rows.start..seg.end - rows.start];
            jobs.push(MatJob { w: slabs.get(&self.down, 2, e, local.len()), x: &s.hidden, rows: Some(local), out: d });
        }
        if let Some(sh) = shared {
            jobs.push(MatJob { w: sh.ffn.down.view(pass.file), x: &s.shared_hidden, rows: None, out: shared_out });
        }
        pass.matmul(&mut jobs);
        if let Some(b) = &self.expert_bias {
            for i in group {
                let (e, seg) = (g.active[i], g.seg[i]..g.seg[i + 1]);
                for row in seg {
                    ops::add(&mut d_all[row * n_embd..(row + 1) * n_embd], &b.down[e * n_embd..(e + 1) * n_embd]);
                }
            }
        }
        Ok(())
    }

    /// `out = Σ weight · expert output` per token, plus the shared expert's
    /// output (in `out` on entry) scaled by its gate `sigmoid(gate_inp · x)`.
    pub fn combine(&self, s: &mut MoeScratch, x: &[f32], out: &mut [f32]) {
        let n_embd = self.router.cols;
        let sum = take(&mut s.sum, out.len());
        sum.fill(0.0);
        for (e, seg) in s.groups.segments() {
            for (row, &(t, wgt)) in seg.zip(&s.groups.members[e]) {
                ops::axpy_f32(&mut sum[t * n_embd..(t + 1) * n_embd], wgt, &s.down[row * n_embd..(row + 1) * n_embd]);
            }
        }
        let Some(sh) = &self.shared else {
            out.copy_from_slice(sum);
            return;
        };
        if let Some((gi, _)) = &sh.gate_inp {
            for (o, xt) in out.chunks_exact_mut(n_embd).zip(x.chunks_exact(n_embd)) {
                ops::scale(o, ops::sigmoid(ops::dot_f32(xt, gi)));
            }
        }
        ops::add(out, sum);
    }
}

/// Choose a token's experts (`chosen.len()` of them) by their probabilities
/// `p` plus the selection `bias`, among the experts of the best `used` of
/// `n_group` groups only; a group scores the sum of its two best. Scratch:
/// the selection scores, the groups' scores, the best groups.
fn select_experts(
    p: &[f32],
    bias: Option<&[f32]>,
    (n_group, used): (usize, usize),
    (sel, group_scores, top_groups): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<u32>),
    chosen: &mut [u32],
) {
    sel.clear();
    sel.extend_from_slice(p);
    if let Some(b) = bias {
        ops::add(sel, b);
    }
    if n_group > 1 {
        let per = sel.len() / n_group;
        let mut best = [0u32; 2];
        group_scores.clear();
        for g in sel.chunks_exact(per) {
            top_k(g, &mut best);
            group_scores.push(g[best[0] as usize] + g[best[1] as usize]);
        }
        top_groups.resize(used, 0);
        top_k(group_scores, top_groups);
        // The other groups' experts cannot be chosen.
        for (gi, g) in sel.chunks_exact_mut(per).enumerate() {
            if !top_groups.contains(&(gi as u32)) {
                g.fill(f32::NEG_INFINITY);
            }
        }
    }
    top_k(sel, chosen);
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// Indices of the `out.len()` largest values, largest first (ties: lower index first).
pub fn top_k(values: &[f32], out: &mut [u32]) {
    let k = out.len();
    let mut filled = 0usize;
    for (i, &v) in values.iter().enumerate() {
        // Insertion into a small sorted list: k is 2..8.
        let mut pos = filled;
        while pos > 0 && values[out[pos - 1] as usize] < v {
            pos -= 1;
        }
        if pos < k {
            let end = filled.min(k - 1);
            out.copy_within(pos..end, pos + 1);
            out[pos] = i as u32;
            filled = (filled + 1).min(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{select_experts, top_k, Groups, GuessRecord, READ_AHEAD_MIN};

    #[test]
    fn a_guess_rank_is_read_while_it_is_right_often_enough() {
        let mut g = GuessRecord::default();
        // Unmeasured: 6 of 8 ranks read, as before the record.
        let read = |g: &mut GuessRecord| g.right(5, 8).iter().filter(|&&r| r >= READ_AHEAD_MIN).count();
        assert_eq!(read(&mut g), 6);
        // Ranks 0-3 always routed to, 4-7 never: after a few tokens only 0-3 are read.
        for _ in 0..20 {
            g.layer = Some(5);
            g.guessed = (0..8).collect();
            g.score(5, &[0, 1, 2, 3, 10, 11, 12, 13]);
        }
        assert_eq!(read(&mut g), 4);
        assert!(g.right(5, 8)[..4].iter().all(|&r| r > 0.9));
        // Guesses for another layer, or none, are not scored; nor scored twice.
        g.layer = Some(6);
        g.guessed = (0..8).collect();
        g.score(5, &[20, 21, 22, 23, 24, 25, 26, 27]);
        assert_eq!(read(&mut g), 4);
        g.score(6, &[20, 21, 22, 23, 24, 25, 26, 27]);
        g.score(6, &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(g.right(6, 8).iter().all(|&r| r < 0.75));
        // When the guesses become right again, they are read again.
        for _ in 0..20 {
            g.layer = Some(5);
            g.guessed = (0..8).collect();
            g.score(5, &[0, 1, 2, 3, 4, 5, 6, 7]);
        }
        assert_eq!(read(&mut g), 8);
    }

    #[test]
    fn selection_bias_and_groups_choose_the_experts() {
        // 6 experts in 3 groups of 2.
        let p = [0.9, 0.1, 0.5, 0.45, 0.6, 0.0];
        let mut scratch = (Vec::new(), Vec::new(), Vec::new());
        let mut chosen = [0u32; 2];
        let mut pick = |bias: Option<&[f32]>, groups| {
            select_experts(&p, bias, groups, (&mut scratch.0, &mut scratch.1, &mut scratch.2), &mut chosen);
            chosen
        };
        // Plain top-2; then within the best group by the sum of its top 2 (group 0: 1.0, 1: 0.95, 2: 0.6).
        assert_eq!(pick(None, (1, 1)), [0, 4]);
        assert_eq!(pick(None, (3, 1)), [0, 1]);
        // Groups 0 (1.0) and 1 (0.95) beat group 2 (0.6): expert 4 is out.
        assert_eq!(pick(None, (3, 2)), [0, 2]);
        // A bias lifts expert 5 and its group (0.6 + 0.8 = 1.4) over the others.
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.8];
        assert_eq!(pick(Some(&bias), (3, 1)), [5, 4]);
        assert_eq!(pick(Some(&bias), (1, 1)), [0, 5]);
    }

    #[test]
    fn softmax_weight_gating_keeps_the_logits_for_the_choice() {
        use super::Gating;
        // The logits choose; only the chosen are softmaxed (in `route`).
        let mut p = [0.5f32, -1.0, 2.0];
        Gating::SoftmaxWeight.apply(&mut p);
        assert_eq!(p, [0.5, -1.0, 2.0]);
        let mut chosen = [0u32; 2];
        top_k(&p, &mut chosen);
        assert_eq!(chosen, [2, 0]);
    }

    #[test]
    fn top_k_picks_largest_in_order() {
        let v = [0.1, 0.5, 0.3, 0.9, 0.5, -1.0];
        let mut out = [0u32; 3];
        top_k(&v, &mut out);
        assert_eq!(out, [3, 1, 4]);
        let mut one = [0u32; 1];
        top_k(&v, &mut one);
        assert_eq!(one, [3]);
        let mut all = [0u32; 6];
        top_k(&v, &mut all);
        assert_eq!(all, [3, 1, 4, 2, 0, 5]);
    }

    #[test]
    fn groups_list_each_expert_s_tokens_in_order() {
        // 3 tokens, 2 experts each, of 4.
        let chosen = [2, 0, 2, 3, 0, 2];
        let weights = [0.6, 0.4, 0.7, 0.3, 0.5, 0.5];
        let mut g = Groups::default();
        g.build(&chosen, &weights, 3, 4);
        assert_eq!(g.active, [0, 2, 3]);
        assert_eq!(g.seg, [0, 2, 5, 6]);
        assert_eq!(g.rows, [0, 2, 0, 1, 2, 1]);
        assert_eq!(g.members[2], [(0, 0.6), (1, 0.7), (2, 0.5)]);
        let segs: Vec<_> = g.segments().collect();
        assert_eq!(segs, [(0, 0..2), (2, 2..5), (3, 5..6)]);
    }

    #[test]
    fn ready_first_moves_rows_with_their_experts_and_keeps_the_sum_order() {
        // 3 tokens, 2 experts each, of 4: experts 0, 2, 3 active.
        let chosen = [2, 0, 2, 3, 0, 2];
        let weights = [0.6, 0.4, 0.7, 0.3, 0.5, 0.5];
        let mut g = Groups::default();
        g.build(&chosen, &weights, 3, 4);
        // Expert 3 is ready, 0 and 2 are not.
        let split = g.ready_first(0..3, |e| e == 3);
        assert_eq!(split, 1);
        assert_eq!(g.active, [3, 0, 2]);
        assert_eq!(g.seg, [0, 1, 3, 6]);
        assert_eq!(g.rows, [1, 0, 2, 0, 1, 2]);
        // Summed in ascending expert order, each over its own rows.
        let segs: Vec<_> = g.segments().collect();
        assert_eq!(segs, [(0, 1..3), (2, 3..6), (3, 0..1)]);
        // A sub-range leaves the rest alone.
        let split = g.ready_first(1..3, |e| e == 2);
        assert_eq!((split, &g.active[..]), (2, &[3, 2, 0][..]));
        assert_eq!(g.seg, [0, 1, 4, 6]);
        assert_eq!(g.rows, [1, 0, 1, 2, 0, 2]);
    }
}
