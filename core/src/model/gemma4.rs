//! Gemma 4 (`gemma4`): sliding-window and global attention layers of
//! different head sizes and KV-head counts, QK-norm plus a weightless V
//! norm, attention scale 1, proportional RoPE on global layers, GeGLU MLPs,
//! final logit soft-capping, embeddings scaled by sqrt(n_embd), tied head.
//! Two families share the recipe:
//!
//! - MoE (26B-A4B): a dense MLP runs beside routed experts in every layer,
//!   and global layers may take V from the K projection (`attention_k_eq_v`).
//! - E models (E2B, E4B): per-layer input embeddings (a large table read one
//!   row per token from the mapped file), MLP width per layer, and the last
//!   `shared_kv_layers` layers attend over an earlier layer's KV cache.
//!
//! Layer (llama.cpp `src/models/gemma4.cpp`, transformers `modeling_gemma4.py`):
//!   h  = x + PostAttnNorm(Attention(AttnNorm(x)))
//!   f  = MLP(FfnNorm(h))                                      (dense layers)
//!   f  = PostNorm1(MLP(FfnNorm(h))) + PostNorm2(Experts(PreNorm2(h); router on h))   (MoE)
//!   x' = h + PostFfwNorm(f)
//!   x' = x' + PostNorm(Proj(gelu(InpGate · x') * ple_l))    (E models)
//!   x' = x' * layer_output_scale
//!
//! Norm weights are used as stored (Gemma 4 norms carry no `1 +` offset).

use std::ops::Range;

use super::blocks::attention::{AttnParams, Rope};
use super::blocks::ffn::{Act, Dense};
use super::blocks::gemma4::{kv_mismatch, Kv, KvAttention, PerLayerInput, RoutedExperts};
use super::blocks::moe::Routing;
use super::blocks::norm::RmsNorm;
use super::hparams::Meta;
use super::network::{foreign_state, Network};
use super::pass::Pass;
use super::scratch::take;
use super::state::{LayerKind, LayerState, Scratch};
use super::trunk::Trunk;
use super::weights::{Experts, Loader, Matrix};
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Key, TensorKind};
use crate::kernels::ops;

// ---- hyper-parameters ------------------------------------------------------------

struct Hparams {
    n_embd: usize,
    n_layer: usize,
    /// MLP width per layer (double in the KV-shared layers of E2B).
    n_ff: Vec<usize>,
    /// Attention of each layer (head size, KV heads, RoPE and window differ by kind).
    attn: Vec<AttnParams>,
    is_swa: Vec<bool>,
    /// For each layer: `None` when it keeps its own KV cache, else the layer it reads.
    kv_source: Vec<Option<usize>>,
    /// `(n_expert, n_used, n_ff_exp)` when the layers carry routed experts.
    experts: Option<(usize, usize, usize)>,
    /// Per-layer input width (0: none).
    n_ple: usize,
    eps: f32,
    final_softcap: Option<f32>,
}

impl Hparams {
    fn read(m: &Meta) -> Result<Hparams> {
        let n_layer = m.nonzero(Key::BlockCount)?;
        let n_embd = m.nonzero(Key::EmbeddingLength)?;
        let eps = m.f32_or(Key::LayerNormRmsEpsilon, 1e-6)?;
        let is_swa = match m.bools(Key::SlidingWindowPattern)? {
            Some(p) => {
                let len = p.len();
                m.ensure(Key::SlidingWindowPattern, len == n_layer, format!("has {len} values for {n_layer} layers"))?;
                p
            }
            None => return Err(Error::MissingKey(m.key(Key::SlidingWindowPattern))),
        };
        let window = m.nonzero(Key::SlidingWindow)?;
        let n_head = m.per_layer(Key::HeadCount, n_layer, None)?;
        let n_kv = m.per_layer(Key::HeadCountKv, n_layer, None)?;
        let hd_full = m.nonzero(Key::KeyLength)?;
        let hd_swa = m.usize_or(Key::KeyLengthSwa, hd_full)?;
        m.ensure(Key::ValueLength, m.usize_or(Key::ValueLength, hd_full)? == hd_full, "must equal key_length")?;
        let v_swa = m.usize_or(Key::ValueLengthSwa, hd_swa)?;
        m.ensure(Key::ValueLengthSwa, v_swa == hd_swa, "must equal key_length_swa")?;
        m.ensure(Key::KeyLengthSwa, hd_swa > 0, "must be positive")?;
        let rot_full = m.usize_or(Key::RopeDimensionCount, hd_full)?;
        let rot_swa = m.usize_or(Key::RopeDimensionCountSwa, hd_swa)?;
        m.ensure(Key::RopeDimensionCount, rot_full <= hd_full && rot_full % 2 == 0, "must be even, <= head dim")?;
        m.ensure(Key::RopeDimensionCountSwa, rot_swa <= hd_swa && rot_swa % 2 == 0, "must be even, <= head dim")?;
        let base_full = m.f32_or(Key::RopeFreqBase, 1_000_000.0)?;
        let base_swa = m.f32_or(Key::RopeFreqBaseSwa, 10_000.0)?;
        let scale = m.rope_freq_scale()?;
        let mut attn = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let (h, kv) = (n_head[il], n_kv[il]);
            m.ensure(Key::HeadCount, h > 0, format!("layer {il}: no heads"))?;
            m.ensure(Key::HeadCountKv, kv > 0 && h % kv == 0, format!("layer {il}: {kv} must divide {h}"))?;
            let (hd, n_rot, base) =
                if is_swa[il] { (hd_swa, rot_swa, base_swa) } else { (hd_full, rot_full, base_full) };
            attn.push(AttnParams {
                n_head: h,
                n_kv_head: kv,
                head_dim: hd,
                head_dim_v: hd,
                rope: Rope { n_rot, base, scale: if is_swa[il] { 1.0 } else { scale }, neox: true },
                scale: 1.0,
                window: is_swa[il].then_some(window),
                eps,
            });
        }
        // The last `shared` layers read the cache of the last earlier layer of their kind.
        let shared = m.usize_or(Key::SharedKvLayers, 0)?;
        m.ensure(Key::SharedKvLayers, shared < n_layer, "leaves no layer with a KV cache")?;
        let first_shared = n_layer - shared;
        let mut kv_source = vec![None; n_layer];
        for il in first_shared..n_layer {
            let src = (0..first_shared).rev().find(|&j| is_swa[j] == is_swa[il]).ok_or_else(|| {
                m.bad(Key::SharedKvLayers, format!("layer {il} has no earlier layer of its kind to share"))
            })?;
            let (a, b) = (&attn[il], &attn[src]);
            if a.n_kv_head != b.n_kv_head || a.head_dim != b.head_dim {
                return Err(kv_mismatch(il, src));
            }
            kv_source[il] = Some(src);
        }
        let n_expert = m.usize_or(Key::ExpertCount, 0)?;
        let experts = if n_expert > 0 {
            let n_used = m.nonzero(Key::ExpertUsedCount)?;
            m.ensure(Key::ExpertUsedCount, n_used <= n_expert, format!("{n_used} of {n_expert} experts"))?;
            Some((n_expert, n_used, m.nonzero(Key::ExpertFeedForwardLength)?))
        } else {
            None
        };
        let softcap = m.f32_or(Key::FinalLogitSoftcapping, 0.0)?;
        Ok(Hparams {
            n_embd,
            n_layer,
            n_ff: m.per_layer(Key::FeedForwardLength, n_layer, None)?,
            attn,
            is_swa,
            kv_source,
            experts,
            n_ple: m.usize_or(Key::EmbeddingLengthPerLayer, 0)?,
            eps,
            final_softcap: (softcap > 0.0).then_some(softcap),
        })
    }
}

// ---- tensors -----------------------------------------------------------------------

/// The MoE half of a layer's FFN.
struct MoeHalf {
    post_norm_1: RmsNorm, // [n_embd], after the dense MLP
    pre_norm_2: RmsNorm,  // [n_embd], before the experts
    post_norm_2: RmsNorm, // [n_embd], after the experts
    experts: RoutedExperts,
}

struct Layer {
    attn_norm: RmsNorm,      // [n_embd]
    attn: KvAttention,       // q [n_head*hd, n_embd], k/v [n_kv*hd, n_embd], o [n_embd, n_head*hd]
    attn_post_norm: RmsNorm, // [n_embd]
    ffn_norm: RmsNorm,       // [n_embd]
    mlp: Dense,              // gate/up [n_ff, n_embd], down [n_embd, n_ff]
    moe: Option<MoeHalf>,
    ffn_post_norm: RmsNorm, // [n_embd]
    ple: Option<PerLayerInput>,
    out_scale: Option<f32>, // [1]
}

/// The model-level per-layer embedding tensors of an E model.
struct PerLayerEmbd {
    /// `[n_vocab, n_layer*n_ple]`: one row per token, read from the mapped file.
    token_embd: Matrix,
    /// `[n_layer*n_ple, n_embd]`.
    model_proj: Matrix,
    /// `[n_ple]`.
    proj_norm: RmsNorm,
}

pub struct Gemma4 {
    hp: Hparams,
    trunk: Trunk,
    layers: Vec<Layer>,
    ple: Option<PerLayerEmbd>,
}

impl Gemma4 {
    pub fn load(file: &GgufFile) -> Result<Gemma4> {
        let ld = Loader::new(file);
        let hp = Hparams::read(&Meta::new(file, Arch::Gemma4.name()))?;
        let (e, eps) = (hp.n_embd, hp.eps);
        let mut trunk = Trunk::load(&ld, e, eps)?;
        trunk.embed_scale = Some((e as f32).sqrt());
        trunk.softcap = hp.final_softcap;

        // Proportional RoPE of the global layers: one factor per rotated pair.
        let global_rot = hp.attn.iter().zip(&hp.is_swa).find(|(_, &s)| !s).map(|(a, _)| a.rope.n_rot);
        let rope_factors = match global_rot {
            Some(n_rot) if ld.has(TensorKind::RopeFreqs, 0) => {
                let f = ld.vector(TensorKind::RopeFreqs, 0, n_rot / 2)?;
                if !f.iter().all(|&v| v.is_finite() && v > 0.0) {
                    return Err(Error::InvalidHyperparameter {
                        key: TensorKind::RopeFreqs.weight(0),
                        reason: "frequency factors must be positive and finite".into(),
                    });
                }
                Some(f)
            }
            _ => None,
        };

        let ple = if hp.n_ple > 0 {
            let width = hp.n_layer * hp.n_ple;
            let t = TensorKind::PerLayerTokenEmbd.weight(0);
            let t = file.tensor(&t).ok_or(Error::MissingTensor(t))?;
            Some(PerLayerEmbd {
                token_embd: ld.matrix(TensorKind::PerLayerTokenEmbd, 0, t.dims[1] as usize, width)?,
                model_proj: ld.matrix(TensorKind::PerLayerModelProj, 0, width, e)?,
                proj_norm: RmsNorm::load(&ld, TensorKind::PerLayerProjNorm, 0, hp.n_ple, eps)?,
            })
        } else {
            None
        };
        if let Some(p) = &ple {
            if p.token_embd.rows != trunk.n_vocab {
                return Err(Error::TensorShape {
                    tensor: p.token_embd.name.to_string(),
                    expected: vec![(hp.n_layer * hp.n_ple) as u64, trunk.n_vocab as u64],
                    found: vec![p.token_embd.cols as u64, p.token_embd.rows as u64],
                });
            }
        }

        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let p = hp.attn[il].clone();
            let factors = if hp.is_swa[il] { None } else { rope_factors.clone() };
            let moe = match hp.experts {
                Some(x) => Some(MoeHalf {
                    post_norm_1: RmsNorm::load(&ld, TensorKind::FfnPostNorm1, il, e, eps)?,
                    pre_norm_2: RmsNorm::load(&ld, TensorKind::FfnPreNorm2, il, e, eps)?,
                    post_norm_2: RmsNorm::load(&ld, TensorKind::FfnPostNorm2, il, e, eps)?,
                    experts: match il + 1 < hp.n_layer {
                        true => RoutedExperts::load(&ld, il, e, x, eps)?.with_ahead(RoutedExperts::load(
                            &ld,
                            il + 1,
                            e,
                            x,
                            eps,
                        )?),
                        false => RoutedExperts::load(&ld, il, e, x, eps)?,
                    },
                }),
                None => None,
            };
            let out_scale = match ld.has(TensorKind::LayerOutScale, il) {
                true => Some(ld.vector(TensorKind::LayerOutScale, il, 1)?[0]),
                false => None,
            };
            layers.push(Layer {
                attn_norm: RmsNorm::load(&ld, TensorKind::AttnNorm, il, e, eps)?,
                attn: KvAttention::load(&ld, il, e, p, hp.kv_source[il].is_none(), factors)?,
                attn_post_norm: RmsNorm::load(&ld, TensorKind::AttnPostNorm, il, e, eps)?,
                ffn_norm: RmsNorm::load(&ld, TensorKind::FfnNorm, il, e, eps)?,
                mlp: Dense::load(&ld, il, e, hp.n_ff[il], Act::GeluTanh)?,
                moe,
                ffn_post_norm: RmsNorm::load(&ld, TensorKind::FfnPostNorm, il, e, eps)?,
                ple: match hp.n_ple {
                    0 => None,
                    n => Some(PerLayerInput::load(&ld, il, e, n, eps)?),
                },
                out_scale,
            });
        }
        Ok(Gemma4 { hp, trunk, layers, ple })
    }
}

// ---- forward -----------------------------------------------------------------------

impl Network for Gemma4 {
    fn arch(&self) -> Arch {
        Arch::Gemma4
    }

    fn trunk(&self) -> &Trunk {
        &self.trunk
    }

    fn n_layer(&self) -> usize {
        self.layers.len()
    }

    fn layer_kinds(&self) -> Vec<LayerKind<'_>> {
        self.layers
            .iter()
            .zip(&self.hp.kv_source)
            .map(|(l, src)| match src {
                Some(source) => LayerKind::Shared { source: *source },
                None => LayerKind::Attention(&l.attn.p),
            })
            .collect()
    }

    fn experts(&self) -> Vec<(usize, &Experts)> {
        let moe = self.layers.iter().enumerate().filter_map(|(il, l)| Some((il, &l.moe.as_ref()?.experts)));
        moe.flat_map(|(il, x)| [(il, &x.gate_up), (il, &x.down)]).collect()
    }

    fn experts_used(&self) -> usize {
        self.hp.experts.map_or(0, |(_, k, _)| k)
    }

    fn streamed(&self) -> Vec<Range<usize>> {
        self.ple.iter().map(|p| p.token_embd.range()).collect()
    }

    /// The scaled token embeddings and, in an E model, every layer's
    /// per-layer input: `(rms_norm(W_p · x / sqrt(n_embd)) * w + E_ple[token]
    /// * sqrt(n_ple)) / sqrt(2)`, `[n][n_layer][n_ple]`.
    fn embed(&self, pass: &Pass, mapped: &[u8], tokens: &[u32], s: &mut Scratch) {
        let (n, e) = (tokens.len(), self.hp.n_embd);
        self.trunk.embed(pass, tokens, take(&mut s.x, n * e));
        let Some(p) = &self.ple else { return };
        let (n_ple, width) = (self.hp.n_ple, self.hp.n_layer * self.hp.n_ple);
        let g = &mut s.blocks.gemma4;
        let ple = take(&mut g.ple, n * width);
        pass.project(&p.model_proj, &mut s.head, &s.x, ple);
        let (proj_scale, tok_scale) = (1.0 / (e as f32).sqrt(), (n_ple as f32).sqrt());
        let row = take(&mut g.ple_gate, width);
        for (&tok, pt) in tokens.iter().zip(ple.chunks_exact_mut(width)) {
            ops::scale(pt, proj_scale);
            p.proj_norm.forward_inplace(pt);
            // One row of the table, from the mapped file (never copied resident).
            p.token_embd.row_f32(mapped, tok as usize, row);
            for (v, &t) in pt.iter_mut().zip(row.iter()) {
                *v = (*v + t * tok_scale) * std::f32::consts::FRAC_1_SQRT_2;
            }
        }
    }

    fn layers(
        &self,
        pass: &Pass,
        states: &mut [LayerState],
        s: &mut Scratch,
        mut trace: Option<&mut Vec<Routing>>,
    ) -> Result<()> {
        let (n, e) = (pass.n, self.hp.n_embd);
        if states.len() != self.layers.len() {
            return Err(foreign_state());
        }
        let x = take(&mut s.x, n * e);
        let xn = take(&mut s.xn, n * e);
        let out = take(&mut s.out, n * e);
        let b = &mut s.blocks;
        let g = &mut b.gemma4;
        let width = self.hp.n_layer * self.hp.n_ple;
        for (il, layer) in self.layers.iter().enumerate() {
            // x += PostAttnNorm(Attention(AttnNorm(x))), over its own or a shared cache
            layer.attn_norm.forward(x, xn);
            let (before, rest) = states.split_at_mut(il);
            let kv = match (&rest[0], self.hp.kv_source[il]) {
                (LayerState::Shared { source }, Some(src)) if *source == src => match &before[src] {
                    LayerState::Attention(c) => Kv::Shared(c),
                    _ => return Err(foreign_state()),
                },
                (LayerState::Attention(_), None) => match &mut rest[0] {
                    LayerState::Attention(c) => Kv::Own(c),
                    _ => return Err(foreign_state()),
                },
                _ => return Err(foreign_state()),
            };
            layer.attn.forward(pass, kv, g, xn, out);
            layer.attn_post_norm.forward_inplace(out);
            ops::add(x, out);

            // f = MLP(FfnNorm(x)) [+ the routed experts' half]
            layer.ffn_norm.forward(x, xn);
            layer.mlp.forward(pass, &mut b.ffn, xn, out);
            if let Some(m) = &layer.moe {
                m.post_norm_1.forward_inplace(out);
                m.pre_norm_2.forward(x, xn);
                let mut buf = std::mem::take(&mut g.half);
                let half = take(&mut buf, n * e);
                m.experts.forward(pass, g, x, xn, half)?;
                if let Some(tr) = trace.as_deref_mut() {
                    tr.push(Routing { experts: g.chosen().to_vec() });
                }
                m.post_norm_2.forward_inplace(half);
                ops::add(out, half);
                g.half = buf;
            }
            // x += PostFfwNorm(f)
            layer.ffn_post_norm.forward_inplace(out);
            ops::add(x, out);

            // x += PostNorm(Proj(gelu(InpGate · x) * ple_l))
            if let Some(pl) = &layer.ple {
                pl.forward(pass, &mut s.head, &mut g.ple_gate, &g.ple, (il * self.hp.n_ple, width), x, out);
            }
            if let Some(sc) = layer.out_scale {
                ops::scale(x, sc);
            }
        }
        Ok(())
    }
}
