//! A decoded token on the GPU as one submission: the network's layers
//! recorded once into a [`Graph`] ([`Network::record`] with a [`Recorder`]),
//! replayed per token with one readback (the logits, and the token's keys
//! and values for the host's KV cache).
//!
//! The graph is made per sequence state (its KV caches and recurrent states
//! are bound into it) at the first token decoded with that state, and kept
//! while the state lives: after it no buffer is made and no weight moves.
//! Before each token the device copies are brought up to date as the
//! per-operation path does (the KV positions the host rewrote since, a
//! recurrent state the host wrote); after it the host's KV cache gets the
//! token's keys and values (so checkpoints, snapshots and prompts on the
//! other path see them) and the recurrent states stay on the device
//! ([`Ssm::advanced_on`]).
//!
//! What records: the Llama family (dense and MoE), Gemma 3 and Qwen3.5-MoE
//! over an f16 or f32 KV cache. A network or a state the graph does not take
//! (a q8_0 cache, a head larger than the kernels take, a matrix the device
//! refuses) decodes through the per-operation path, as prompts always do.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::super::blocks::attention::{Attention, QkNorm};
use super::super::blocks::deltanet::DeltaNet;
use super::super::blocks::ffn::{Act, Dense};
use super::super::blocks::moe::{Gating, Moe};
use super::super::blocks::norm::RmsNorm;
use super::super::cache::{KvType, Logits};
use super::super::network::Network;
use super::super::record::Record;
use super::super::state::{LayerState, State};
use super::super::weights::Matrix;
use super::{DeviceState, GpuBackend};
use crate::gpu::{
    norm_mode, AttnShape, Constant, DeltaShape, GpuMatrix, Graph, GraphOps, KvMirror, Op, OpParams, Tensor,
};
use crate::kernels::ActFormat;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// A recorded decode, bound to one state's caches at a time.
pub(super) struct DecodeGraph {
    graph: Graph,
    /// The id of the state it is bound to (its first layer's).
    bound: u64,
    x: Tensor,
    /// Per attention layer: its index, the token's keys and values (read
    /// back), and the device copy of the cache the graph binds.
    kv: Vec<(usize, Tensor, Tensor, Arc<KvMirror>)>,
    /// Per recurrent layer: its index and the device copies of its conv
    /// window and delta-rule state.
    recurrent: Vec<(usize, Arc<DeviceState>, Arc<DeviceState>)>,
    n_vocab: usize,
}

/// The shape of a state a graph can be bound to: its context and KV type.
pub(super) type Shape = (usize, &'static str);

/// The id of a state (its first layer's cache or state).
fn state_id(state: &State) -> Option<u64> {
    match state.layers.first()? {
        LayerState::Attention(c) => Some(c.identity().0),
        LayerState::Recurrent(r) => Some(r.ssm.identity().0),
        LayerState::Shared { .. } | LayerState::Latent(_) => None,
    }
}

fn shape(state: &State) -> Shape {
    let kv = state.layers.iter().find_map(|l| match l {
        LayerState::Attention(c) => Some(c.ty.name()),
        LayerState::Recurrent(_) | LayerState::Shared { .. } | LayerState::Latent(_) => None,
    });
    (state.n_ctx, kv.unwrap_or(""))
}

/// What an architecture's [`Network::record`] records its layers with.
pub(super) struct Recorder<'a> {
    be: &'a GpuBackend,
    file: &'a [u8],
    states: &'a [LayerState],
    g: Graph,
    /// The residual stream, the current block's normalised input and its output.
    x: Tensor,
    xn: Tensor,
    out: Tensor,
    /// Working tensors by role and length, shared by the layers (they run in turn).
    temps: HashMap<(&'static str, usize), Tensor>,
    kv: Vec<(usize, Tensor, Tensor, Arc<KvMirror>)>,
    recurrent: Vec<(usize, Arc<DeviceState>, Arc<DeviceState>)>,
    /// The last activations quantised (input, format, output), valid until
    /// the next operation that is not a product.
    quantised: Option<(Tensor, ActFormat, Tensor)>,
}

/// The error for what the graph does not take (the token decodes the other way).
fn unsupported(what: impl Into<String>) -> Error {
    Error::InvalidArgument(what.into())
}

impl Recorder<'_> {
    fn temp(&mut self, role: &'static str, len: usize) -> Result<Tensor> {
        if let Some(&t) = self.temps.get(&(role, len)) {
            return Ok(t);
        }
        let t = self.g.tensor(len)?;
        self.temps.insert((role, len), t);
        Ok(t)
    }

    /// The host's weights `values` (kept by the network) as a tensor: uploaded
    /// once per model, bound by every graph.
    fn constant(&mut self, values: &[f32]) -> Result<Tensor> {
        self.constant_of((values.as_ptr() as usize, values.len(), 0), || values.to_vec())
    }

    /// The constant known by `key`, made from `values` the first time.
    fn constant_of(&mut self, key: (usize, usize, u8), values: impl FnOnce() -> Vec<f32>) -> Result<Tensor> {
        let mut map = self.be.constants.lock().map_err(|_| Error::Gpu("graph constants poisoned".into()))?;
        let c = match map.get(&key) {
            Some(c) => c.clone(),
            None => {
                let c = Constant::upload(&self.be.gpu, &values())?;
                map.insert(key, c.clone());
                c
            }
        };
        Ok(self.g.bind_constant(&c))
    }

    /// A per-row operation (it may write what a product reads).
    fn op(
        &mut self,
        op: Op,
        p: OpParams,
        a: Tensor,
        b: Option<Tensor>,
        c: Option<Tensor>,
        d: Option<Tensor>,
    ) -> Result<()> {
        self.quantised = None;
        self.g.op(op, p, a, b, c, d)
    }

    /// `x` as the CPU's kernels for weights of type `ty` see it: quantised
    /// to their activation format and back (once for several products of
    /// the same input; Q8_1 with its block sums), or `x` itself for float weights.
    fn acts(&mut self, x: Tensor, ty: GgmlType) -> Result<Tensor> {
        let Some(fmt) = ActFormat::for_weights(ty) else { return Err(unsupported(format!("no kernels for {ty}"))) };
        let (mode, label) = match fmt {
            ActFormat::F32 => return Ok(x),
            ActFormat::Q8_0 => (0, "acts q8_0"),
            ActFormat::Q8_1 => (1, "acts q8_1"),
            ActFormat::Q8K => (2, "acts q8_k"),
        };
        if let Some((from, f, q)) = self.quantised {
            if from == x && f == fmt {
                return Ok(q);
            }
        }
        // Q8_1: each block's sum after its values (`gpu::act_len`).
        let q = self.temp(label, crate::gpu::act_len(ty, x.len()))?;
        self.op(Op::Quant, OpParams { n: x.len() as u32, mode, ..Default::default() }, q, Some(x), None, None)?;
        self.quantised = Some((x, fmt, q));
        Ok(q)
    }

    /// The device copy of `m` (uploaded at load).
    fn weights(&self, m: &Matrix) -> Result<Arc<GpuMatrix>> {
        self.be.upload(&m.view(self.file)).ok_or_else(|| unsupported(format!("{} stays on the CPU", m.name)))
    }

    /// `y` is about to be written: a quantised input held in it is gone.
    fn overwrites(&mut self, y: Tensor) {
        if self.quantised.is_some_and(|(from, _, q)| y == from || y == q) {
            self.quantised = None;
        }
    }

    fn matvec(&mut self, m: &Matrix, x: Tensor, y: Tensor) -> Result<()> {
        let w = self.weights(m)?;
        let xq = self.acts(x, m.ty)?;
        self.overwrites(y);
        self.g.matvec(&w, xq, y)
    }

    /// `out = RMSNorm(x)` (one row).
    fn norm(&mut self, n: &RmsNorm, x: Tensor, out: Tensor) -> Result<()> {
        let w = self.constant(&n.w)?;
        let width = n.w.len() as u32;
        let p =
            OpParams { n: 1, width, sa: width, sb: width, mode: norm_mode::WEIGHT, eps: n.eps, ..Default::default() };
        self.op(Op::Norm, p, out, Some(x), Some(w), None)
    }

    /// `x = RMSNorm(x)` (one row: Gemma's post-norms).
    fn norm_in_place(&mut self, n: &RmsNorm, x: Tensor) -> Result<()> {
        let w = self.constant(&n.w)?;
        let width = n.w.len() as u32;
        let mode = norm_mode::WEIGHT | norm_mode::IN_PLACE;
        let p = OpParams { n: 1, width, sa: width, mode, eps: n.eps, ..Default::default() };
        self.op(Op::Norm, p, x, None, Some(w), None)
    }

    /// `x += y`.
    fn add(&mut self, x: Tensor, y: Tensor) -> Result<()> {
        let n = x.len() as u32;
        self.op(Op::Add, OpParams { n, k: n, ..Default::default() }, x, Some(y), None, None)
    }

    fn bias(&mut self, x: Tensor, b: &Option<Vec<f32>>) -> Result<()> {
        if let Some(b) = b {
            let b = self.constant(b)?;
            let n = x.len() as u32;
            self.op(Op::Add, OpParams { n, k: b.len() as u32, ..Default::default() }, x, Some(b), None, None)?;
        }
        Ok(())
    }

    /// `out = Attention(x)` of layer `il` (`Attention::forward`).
    fn attention(&mut self, il: usize, a: &Attention, x: Tensor, out: Tensor) -> Result<()> {
        let p = &a.p;
        let (hd, hdv) = (p.head_dim, p.head_dim_v);
        if a.sinks.is_some() || a.yarn.is_some() {
            return Err(unsupported("attention with sinks or YaRN is not recorded"));
        }
        let Some(LayerState::Attention(cache)) = self.states.get(il) else {
            return Err(unsupported(format!("layer {il} has no KV cache")));
        };
        if !matches!(cache.ty, KvType::F16 | KvType::F32) {
            return Err(unsupported(format!("a {} KV cache", cache.ty.name())));
        }
        let q = self.temp("q", a.q.rows)?;
        let k = self.g.tensor(p.n_kv_head * hd)?;
        let v = self.g.tensor(p.n_kv_head * hdv)?;
        self.matvec(&a.q, x, q)?;
        self.matvec(&a.k, x, k)?;
        self.matvec(&a.v, x, v)?;
        self.bias(q, &a.q_bias)?;
        self.bias(k, &a.k_bias)?;
        self.bias(v, &a.v_bias)?;
        if a.qk_norm != QkNorm::PerHead {
            return Err(unsupported("q/k norms over the whole projections"));
        }
        let q_stride = if a.gated { 2 * hd } else { hd };
        for (t, heads, stride, norm) in [(q, p.n_head, q_stride, &a.q_norm), (k, p.n_kv_head, hd, &a.k_norm)] {
            if let Some(nw) = norm {
                let w = self.constant(nw)?;
                let mode = norm_mode::WEIGHT | norm_mode::IN_PLACE;
                let np = OpParams {
                    n: heads as u32,
                    width: hd as u32,
                    sa: stride as u32,
                    mode,
                    eps: p.eps,
                    ..Default::default()
                };
                self.op(Op::Norm, np, t, None, Some(w), None)?;
            }
            let rope = OpParams {
                n: heads as u32,
                k: (p.rope.n_rot / 2) as u32,
                sa: stride as u32,
                mode: p.rope.neox as u32,
                f0: p.rope.base.powf(-2.0 / p.rope.n_rot as f32),
                f1: p.rope.scale,
                ..Default::default()
            };
            if p.rope.n_rot > 0 {
                self.op(Op::Rope, rope, t, None, None, None)?;
            }
        }
        let mirror = self.be.kv_mirror(cache)?.ok_or_else(|| unsupported("a KV cache the GPU refused"))?;
        self.quantised = None;
        self.g.kv_store(&mirror, k, v)?;
        let shape = AttnShape {
            n_head: p.n_head,
            n_kv_head: p.n_kv_head,
            head_dim: hd,
            head_dim_v: hdv,
            q_rows: a.q.rows,
            q_stride,
            gated: a.gated,
            scale: p.scale,
            window: p.window,
            pos0: 0,
            n: 1,
        };
        let att = self.temp("att", p.n_head * hdv)?;
        let sc = self.temp("scores", p.n_head * p.window.map_or(cache.capacity, |w| w.min(cache.capacity)))?;
        let kernel = self.be.attention_kernel().ok_or_else(|| unsupported("no attention kernel"))?;
        self.quantised = None;
        self.g.attention(kernel, &mirror, shape, q, att, sc)?;
        self.matvec(&a.o, att, out)?;
        self.bias(out, &a.o_bias)?;
        self.kv.push((il, k, v, mirror));
        Ok(())
    }

    /// `out = FFN(x)` (`Dense::forward`): the gate and up products and the
    /// activation in one fused product where the two matrices are alike.
    fn dense(&mut self, d: &Dense, x: Tensor, out: Tensor) -> Result<()> {
        let n_ff = d.gate.rows;
        let act = match d.act {
            Act::Silu => 0,
            Act::GeluTanh => 1,
            Act::SwigluOai => return Err(unsupported("the clamped SwiGLU is not recorded")),
        };
        let hidden = self.temp("ffn gate", n_ff)?;
        let (gate_w, up_w) = (self.weights(&d.gate)?, self.weights(&d.up)?);
        if gate_w.split_like(&up_w) {
            let xq = self.acts(x, d.gate.ty)?;
            self.overwrites(hidden);
            self.g.matvec_glu(&gate_w, &up_w, act, xq, hidden)?;
        } else {
            let up = self.temp("ffn up", n_ff)?;
            self.matvec(&d.gate, x, hidden)?;
            self.matvec(&d.up, x, up)?;
            self.op(
                Op::Glu,
                OpParams { n: n_ff as u32, mode: act, ..Default::default() },
                hidden,
                Some(up),
                None,
                None,
            )?;
        }
        self.matvec(&d.down, hidden, out)
    }

    /// `out = MoE(x)` (`Moe::forward`): the router and its top-k on the
    /// device, the chosen experts' gate, up and down read by their ids there.
    fn moe(&mut self, m: &Moe, x: Tensor, out: Tensor) -> Result<()> {
        let (n_expert, k, n_ff, n_embd) = (m.p.n_expert, m.p.n_used, m.p.n_ff, m.router.cols);
        if m.selection_bias.is_some() || m.router_bias.is_some() || m.expert_bias.is_some() {
            return Err(unsupported("a router with a bias, or experts with biases, are not recorded"));
        }
        if m.p.act != Act::Silu {
            return Err(unsupported("experts other than SwiGLU are not recorded"));
        }
        let logits = self.temp("router", n_expert)?;
        self.matvec(&m.router, x, logits)?;
        let route = self.temp("route", 2 * k + 1 + n_expert)?;
        let gating = match m.p.gating {
            Gating::Softmax => 0,
            Gating::Sigmoid => 1,
            Gating::SqrtSoftplus => 2,
            Gating::SoftmaxWeight => return Err(unsupported("softmax over the chosen experts is not recorded")),
        };
        let mode = gating | if m.p.norm_weights { 4 } else { 0 };
        let rp = OpParams { k: k as u32, m: n_expert as u32, mode, f0: m.p.weights_scale, ..Default::default() };
        self.op(Op::Route, rp, route, Some(logits), None, None)?;
        let stack = |r: &Self, e: &Matrix| {
            r.be.upload(&e.view(r.file)).ok_or_else(|| unsupported(format!("{} stays on the CPU", e.name)))
        };
        let (gate_w, up_w, down_w) = (stack(self, &m.gate.all)?, stack(self, &m.up.all)?, stack(self, &m.down.all)?);
        let gate = self.temp("experts gate", k * n_ff)?;
        let down = self.temp("experts down", k * n_embd)?;
        let xq = self.acts(x, m.gate.all.ty)?;
        if gate_w.split_like(&up_w) {
            self.g.experts_glu(&gate_w, &up_w, 0, n_ff, route, k, xq, gate)?;
        } else {
            let up = self.temp("experts up", k * n_ff)?;
            self.g.experts(&gate_w, n_ff, route, k, xq, 0, gate)?;
            let xq = self.acts(x, m.up.all.ty)?;
            self.g.experts(&up_w, n_ff, route, k, xq, 0, up)?;
            let glu = OpParams { n: (k * n_ff) as u32, ..Default::default() };
            self.op(Op::Glu, glu, gate, Some(up), None, None)?;
        }
        let hidden = self.acts(gate, m.down.all.ty)?;
        self.g.experts(&down_w, n_embd, route, k, hidden, n_ff, down)?;
        self.quantised = None;
        let mut mode = 0;
        let mut shared_out = None;
        if let Some(sh) = &m.shared {
            let s_out = self.temp("shared out", n_embd)?;
            self.dense(&sh.ffn, x, s_out)?;
            mode = 2;
            if let Some((gi, _)) = &sh.gate_inp {
                let gi = self.constant(gi)?;
                let sp = OpParams { n: n_embd as u32, a0: (2 * k) as u32, ..Default::default() };
                self.op(Op::SharedGate, sp, route, Some(x), Some(gi), None)?;
                mode = 1;
            }
            shared_out = Some(s_out);
        }
        let cp = OpParams { n: n_embd as u32, k: k as u32, mode, ..Default::default() };
        self.op(Op::Combine, cp, out, Some(down), Some(route), shared_out)
    }

    /// `out = DeltaNet(x)` of layer `il` (`DeltaNet::forward`).
    fn deltanet(&mut self, il: usize, d: &DeltaNet, x: Tensor, out: Tensor) -> Result<()> {
        let p = &d.p;
        let (cd, vd, hv, hist) = (p.conv_dim(), p.value_dim(), p.n_v_heads, p.d_conv - 1);
        let Some(LayerState::Recurrent(st)) = self.states.get(il) else {
            return Err(unsupported(format!("layer {il} has no recurrent state")));
        };
        let qkv = self.temp("dn qkv", cd)?;
        let z = self.temp("dn z", vd)?;
        let beta = self.temp("dn beta", hv)?;
        let alpha = self.temp("dn alpha", hv)?;
        self.matvec(&d.qkv, x, qkv)?;
        self.matvec(&d.gate, x, z)?;
        self.matvec(&d.beta, x, beta)?;
        self.matvec(&d.alpha, x, alpha)?;
        let gb = self.temp("dn gb", 2 * hv)?;
        let dt_a = self.constant_of((d.dt_bias.as_ptr() as usize, 2 * hv, 1), || {
            d.dt_bias.iter().chain(&d.a).copied().collect()
        })?;
        self.op(Op::Decay, OpParams { n: hv as u32, ..Default::default() }, gb, Some(alpha), Some(dt_a), Some(beta))?;
        let conv = self.be.state_copy(&st.conv)?.ok_or_else(|| unsupported("a conv window the GPU refused"))?;
        let ssm = self.be.state_copy(&st.ssm)?.ok_or_else(|| unsupported("a recurrent state the GPU refused"))?;
        let taps = self.constant(&d.conv)?;
        self.quantised = None;
        self.g.conv(OpParams { n: cd as u32, k: hist as u32, ..Default::default() }, qkv, taps, &conv.gpu)?;
        let l2 = OpParams {
            n: (2 * p.n_k_heads) as u32,
            width: p.d_k as u32,
            sa: p.d_k as u32,
            mode: norm_mode::IN_PLACE | norm_mode::L2,
            eps: p.eps,
            ..Default::default()
        };
        self.op(Op::Norm, l2, qkv, None, None, None)?;
        let o = self.temp("dn o", vd)?;
        let kernel = self.be.delta_kernel().ok_or_else(|| unsupported("no delta-rule kernel"))?;
        let shape = DeltaShape { n_k_heads: p.n_k_heads, n_v_heads: hv, d_k: p.d_k, d_v: p.d_v, n: 1 };
        self.quantised = None;
        self.g.delta(kernel, &ssm.gpu, shape, qkv, gb, o)?;
        let w = self.constant(&d.norm)?;
        let gated = OpParams {
            n: hv as u32,
            width: p.d_v as u32,
            sa: p.d_v as u32,
            mode: norm_mode::IN_PLACE | norm_mode::WEIGHT | norm_mode::SILU_GATE,
            eps: p.eps,
            ..Default::default()
        };
        self.op(Op::Norm, gated, o, None, Some(w), Some(z))?;
        self.matvec(&d.out, o, out)?;
        self.recurrent.push((il, conv, ssm));
        Ok(())
    }
}

impl Record for Recorder<'_> {
    fn rows(&self) -> (Tensor, Tensor, Tensor) {
        (self.x, self.xn, self.out)
    }
    fn norm(&mut self, n: &RmsNorm, x: Tensor, out: Tensor) -> Result<()> {
        Recorder::norm(self, n, x, out)
    }
    fn norm_in_place(&mut self, n: &RmsNorm, x: Tensor) -> Result<()> {
        Recorder::norm_in_place(self, n, x)
    }
    fn add(&mut self, x: Tensor, y: Tensor) -> Result<()> {
        Recorder::add(self, x, y)
    }
    fn attention(&mut self, il: usize, a: &Attention, x: Tensor, out: Tensor) -> Result<()> {
        Recorder::attention(self, il, a, x, out)
    }
    fn dense(&mut self, d: &Dense, x: Tensor, out: Tensor) -> Result<()> {
        Recorder::dense(self, d, x, out)
    }
    fn moe(&mut self, m: &Moe, x: Tensor, out: Tensor) -> Result<()> {
        Recorder::moe(self, m, x, out)
    }
    fn deltanet(&mut self, il: usize, d: &DeltaNet, x: Tensor, out: Tensor) -> Result<()> {
        Recorder::deltanet(self, il, d, x, out)
    }
}

impl GpuBackend {
    /// Decode `token` at the state's next position as one submission, when
    /// the network and the state record into a graph: `Ok(true)` when it
    /// ran (the state advanced, its logits written), `Ok(false)` when the
    /// caller must run the pass the per-operation way, an error when the
    /// device failed (the state is then as before the token, except for
    /// recurrent states the device lost, which read back as errors).
    pub(in crate::model) fn decode(
        &self,
        net: &dyn Network,
        file: &[u8],
        state: &mut State,
        token: u32,
        want: Logits,
    ) -> Result<bool> {
        let Some(id) = state_id(state) else { return Ok(false) };
        let key = shape(state);
        let mut graphs = self.graphs.lock().map_err(|_| Error::Gpu("decode graphs poisoned".into()))?;
        let graph = graphs.entry(key).or_insert_with(|| {
            self.record(net, file, state)
                .map_err(|e| log::info!("gpu: this model decodes per operation, not as one submission: {e}"))
                .ok()
        });
        let Some(g) = graph.as_mut() else { return Ok(false) };
        if g.bound != id {
            if let Err(e) = self.rebind(g, state, id) {
                log::warn!("gpu: a token decodes per operation (its state does not bind): {e}");
                graphs.remove(&key);
                return Ok(false);
            }
        }
        let Some(Some(g)) = graphs.get(&key) else { unreachable!("bound above") };
        let pos = state.n_past;
        let result = self.sync(g, state, pos).and_then(|()| {
            let trunk = net.trunk();
            let mut x = vec![0.0; trunk.n_embd];
            trunk.embed_row(file, token, &mut x);
            let mut out = Vec::new();
            g.graph.run(pos, &[(g.x, &x)], &mut out)?;
            Ok(out)
        });
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                self.forget(g, state);
                graphs.remove(&key);
                return Err(e);
            }
        };
        // The token's keys and values into the host's caches, which the device's copies now equal.
        let mut at = g.n_vocab;
        for &(il, k, v, _) in &g.kv {
            let Some(LayerState::Attention(cache)) = state.layers.get_mut(il) else { unreachable!("recorded") };
            let (kh, vh) = (cache.head_dim_k, cache.head_dim_v);
            let (ks, vs) = (&out[at..at + k.len()], &out[at + k.len()..at + k.len() + v.len()]);
            for h in 0..cache.n_kv_head {
                cache.store(h, pos, &ks[h * kh..(h + 1) * kh], &vs[h * vh..(h + 1) * vh]);
            }
            at += k.len() + v.len();
            self.synced(cache, pos + 1);
        }
        for (il, conv, ssm) in &g.recurrent {
            let Some(LayerState::Recurrent(st)) = state.layers.get_mut(*il) else { unreachable!("recorded") };
            st.conv.advanced_on(conv.clone());
            st.ssm.advanced_on(ssm.clone());
        }
        state.logits.clear();
        state.logit_rows = match want {
            Logits::None => 0,
            Logits::All | Logits::Last => {
                state.logits.extend_from_slice(&out[..g.n_vocab]);
                1
            }
        };
        self.graph_tokens.fetch_add(1, Relaxed);
        Ok(true)
    }

    /// Record `net`'s decode over `state` (a throwaway) and drop it: every
    /// matrix a decoded token reads goes up, every kernel compiles (at load).
    pub(in crate::model) fn warm_up(&self, net: &dyn Network, file: &[u8], state: &State) {
        if let Err(e) = self.record(net, file, state) {
            log::info!("gpu: no recorded decode to warm up: {e}");
        }
    }

    /// Record `net`'s decode over `state`'s layers.
    fn record(&self, net: &dyn Network, file: &[u8], state: &State) -> Result<DecodeGraph> {
        let ops = self
            .graph_ops
            .get_or_init(|| {
                GraphOps::new(&self.gpu).map(Arc::new).map_err(|e| log::warn!("gpu: no graph kernels: {e}")).ok()
            })
            .clone()
            .ok_or_else(|| unsupported("no graph kernels"))?;
        let trunk = net.trunk();
        let mut g = Graph::new(&self.gpu, ops)?;
        let (x, xn, out) = (g.tensor(trunk.n_embd)?, g.tensor(trunk.n_embd)?, g.tensor(trunk.n_embd)?);
        let mut r = Recorder {
            be: self,
            file,
            states: &state.layers,
            g,
            x,
            xn,
            out,
            temps: HashMap::new(),
            kv: Vec::new(),
            recurrent: Vec::new(),
            quantised: None,
        };
        net.record(&mut r)?;
        r.norm(&trunk.norm, x, xn)?;
        let logits = r.g.tensor(trunk.n_vocab)?;
        r.matvec(&trunk.output, xn, logits)?;
        if let Some(cap) = trunk.softcap {
            r.g.op(
                Op::Softcap,
                OpParams { n: trunk.n_vocab as u32, f0: cap, ..Default::default() },
                logits,
                None,
                None,
                None,
            )?;
        }
        let mut reads = vec![logits];
        reads.extend(r.kv.iter().flat_map(|&(_, k, v, _)| [k, v]));
        r.g.read_back(&reads)?;
        log::info!("gpu: a decoded token is {} dispatches in one submission", r.g.dispatches());
        let bound = state_id(state).ok_or_else(|| unsupported("a state without layers"))?;
        Ok(DecodeGraph { graph: r.g, bound, x, kv: r.kv, recurrent: r.recurrent, n_vocab: trunk.n_vocab })
    }

    /// Bind `g` to `state` (id `id`) in place of the state it was bound to:
    /// the device copies of its caches and states, made if new.
    fn rebind(&self, g: &mut DecodeGraph, state: &State, id: u64) -> Result<()> {
        for (il, _, _, mirror) in &mut g.kv {
            let Some(LayerState::Attention(cache)) = state.layers.get(*il) else {
                return Err(unsupported("layers differ"));
            };
            let new = self.kv_mirror(cache)?.ok_or_else(|| unsupported("a KV cache the GPU refused"))?;
            if !Arc::ptr_eq(mirror, &new) {
                g.graph.rebind_kv(mirror, &new)?;
                *mirror = new;
            }
        }
        for (il, conv, ssm) in &mut g.recurrent {
            let Some(LayerState::Recurrent(st)) = state.layers.get(*il) else {
                return Err(unsupported("layers differ"));
            };
            for (copy, s) in [(conv, &st.conv), (ssm, &st.ssm)] {
                let new = self.state_copy(s)?.ok_or_else(|| unsupported("a recurrent state the GPU refused"))?;
                if !Arc::ptr_eq(copy, &new) {
                    g.graph.rebind_state(&copy.gpu, &new.gpu)?;
                    *copy = new;
                }
            }
        }
        g.bound = id;
        Ok(())
    }

    /// Bring the device's copies of `state` up to date for a token at `pos`.
    fn sync(&self, g: &DecodeGraph, state: &mut State, pos: usize) -> Result<()> {
        for &(il, _, _, _) in &g.kv {
            let Some(LayerState::Attention(cache)) = state.layers.get(il) else {
                return Err(super::super::network::foreign_state());
            };
            if pos >= cache.capacity {
                return Err(Error::ContextFull { n_ctx: cache.capacity });
            }
            let mirror = self.kv_mirror(cache)?.ok_or_else(|| Error::Gpu("a KV cache's device copy is gone".into()))?;
            self.write_mirror(cache, &mirror, pos)?;
        }
        for (il, conv, ssm) in &g.recurrent {
            let Some(LayerState::Recurrent(st)) = state.layers.get_mut(*il) else {
                return Err(super::super::network::foreign_state());
            };
            self.make_current(&mut st.conv, conv)?;
            self.make_current(&mut st.ssm, ssm)?;
        }
        Ok(())
    }

    /// After a failed token: the device's copies may have moved halfway.
    fn forget(&self, g: &DecodeGraph, state: &State) {
        for &(il, _, _, _) in &g.kv {
            if let Some(LayerState::Attention(c)) = state.layers.get(il) {
                self.forget_mirror(c);
            }
        }
        for (_, conv, ssm) in &g.recurrent {
            conv.lost.store(true, Relaxed);
            ssm.lost.store(true, Relaxed);
        }
    }
}
