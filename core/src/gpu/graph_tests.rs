//! The decode graph's operations (`shaders/graph.wgsl`, `kv_store.wgsl`,
//! `main_experts`) against the CPU functions they mirror, on random data of
//! odd sizes, in every form of the kernels the adapter runs.

use std::sync::Arc;

use super::graph::{norm_mode, Graph, GraphOps, Op, OpParams, Tensor};
use super::tests::{assert_close, reference, variants};
use super::{AttnShape, Gpu, GpuAttention, GpuMatrix, GpuOptions, KvMirror};
use crate::kernels::testing::{random_weights, Rng};
use crate::kernels::{ops, QActs};
use crate::model::blocks::moe::top_k;
use crate::model::{KvCache, KvType};
use crate::quant::GgmlType;

/// One operation over `a` (its initial values given) and inputs `b`, `c`,
/// `d`, at position `pos`: `a` after it.
fn run_op(gpu: &Gpu, op: Op, p: OpParams, pos: usize, a: &[f32], inputs: [Option<&[f32]>; 3]) -> Vec<f32> {
    let mut g = Graph::new(gpu, Arc::new(GraphOps::new(gpu).unwrap())).unwrap();
    let ta = g.tensor(a.len()).unwrap();
    let t: Vec<Option<Tensor>> = inputs.iter().map(|x| x.map(|x| g.constant(x).unwrap())).collect();
    g.op(op, p, ta, t[0], t[1], t[2]).unwrap();
    g.read_back(&[ta]).unwrap();
    let mut out = Vec::new();
    g.run(pos, &[(ta, a)], &mut out).unwrap();
    out
}

fn assert_near(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: {i}: gpu {g} vs cpu {w}");
    }
}

#[test]
fn norms_rope_and_activations_match_the_cpu() {
    for gpu in variants(&GpuOptions::default()) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(5);
        let (rows, width) = (3usize, 67usize);
        let x = rng.vec(rows * width, 2.0);
        let w = rng.vec(width, 1.0);
        let z = rng.vec(rows * width, 3.0);
        let (n, wd) = (rows as u32, width as u32);
        // RMSNorm with a weight, from b into a.
        let p = OpParams { n, width: wd, sa: wd, sb: wd, mode: norm_mode::WEIGHT, eps: 1e-6, ..Default::default() };
        let got = run_op(&gpu, Op::Norm, p, 0, &vec![0.0; x.len()], [Some(&x), Some(&w), None]);
        let mut want = vec![0.0; x.len()];
        for (o, r) in want.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            ops::rms_norm(o, r, Some(&w), 1e-6);
        }
        assert_near(&format!("rms norm ({v})"), &got, &want, 1e-5);
        // In place, L2 (the DeltaNet's q and k).
        let mode = norm_mode::IN_PLACE | norm_mode::L2;
        let p = OpParams { n, width: wd, sa: wd, mode, eps: 1e-6, ..Default::default() };
        let got = run_op(&gpu, Op::Norm, p, 0, &x, [None, None, None]);
        let mut want = x.clone();
        for r in want.chunks_exact_mut(width) {
            ops::rms_norm_inplace(r, None, 1e-6 / width as f32);
            ops::scale(r, 1.0 / (width as f32).sqrt());
        }
        assert_near(&format!("l2 norm ({v})"), &got, &want, 1e-5);
        // In place with a weight and a SiLU gate (the DeltaNet's output norm).
        let mode = norm_mode::IN_PLACE | norm_mode::WEIGHT | norm_mode::SILU_GATE;
        let p = OpParams { n, width: wd, sa: wd, mode, eps: 1e-6, ..Default::default() };
        let got = run_op(&gpu, Op::Norm, p, 0, &x, [None, Some(&w), Some(&z)]);
        let mut want = x.clone();
        let mut sz = z.clone();
        ops::silu(&mut sz);
        for (r, g) in want.chunks_exact_mut(width).zip(sz.chunks_exact(width)) {
            ops::rms_norm_inplace(r, Some(&w), 1e-6);
            ops::mul(r, g);
        }
        assert_near(&format!("gated norm ({v})"), &got, &want, 1e-5);

        // RoPE of 3 heads of 10 (6 rotated), both pairings, at position 29,
        // heads 12 apart (a gated query's stride).
        for neox in [false, true] {
            let (heads, hd, stride, n_rot, pos) = (3usize, 10usize, 12usize, 6usize, 29usize);
            let q = rng.vec(heads * stride, 1.0);
            let (base, scale) = (10_000.0f32, 0.5f32);
            let p = OpParams {
                n: heads as u32,
                k: (n_rot / 2) as u32,
                sa: stride as u32,
                mode: neox as u32,
                f0: base.powf(-2.0 / n_rot as f32),
                f1: scale,
                ..Default::default()
            };
            let got = run_op(&gpu, Op::Rope, p, pos, &q, [None, None, None]);
            let mut want = q.clone();
            ops::with_rope_angles(n_rot, pos, base, scale, |cs| {
                for h in 0..heads {
                    ops::rope_apply(&mut want[h * stride..][..hd], hd, cs, neox);
                }
            });
            assert_near(&format!("rope neox={neox} ({v})"), &got, &want, 1e-5);
        }

        // GELU and SiLU gates.
        let up = rng.vec(x.len(), 1.0);
        for (mode, act) in [(0, crate::model::blocks::ffn::Act::Silu), (1, crate::model::blocks::ffn::Act::GeluTanh)] {
            let p = OpParams { n: x.len() as u32, mode, ..Default::default() };
            let got = run_op(&gpu, Op::Glu, p, 0, &x, [Some(&up), None, None]);
            let mut want = x.clone();
            act.apply(&mut want, &up);
            assert_near(&format!("glu {mode} ({v})"), &got, &want, 1e-5);
        }
    }
}

#[test]
fn activations_are_quantised_as_the_cpu_quantises_them() {
    for gpu in variants(&GpuOptions::default()) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(9);
        let mut x = rng.vec(3 * 256, 4.0);
        // A block whose largest magnitude comes with both signs (the first
        // wins), and a block of zeros.
        x[256 + 3] = -9.0;
        x[256 + 100] = 9.0;
        x[512..768].fill(0.0);
        for (ty, mode) in [(GgmlType::Q4_0, 0), (GgmlType::Q4_1, 1), (GgmlType::Q4K, 2)] {
            let p = OpParams { n: x.len() as u32, mode, ..Default::default() };
            let len = super::act_len(ty, x.len());
            let got = run_op(&gpu, Op::Quant, p, 0, &vec![0.0; len], [Some(&x), None, None]);
            let mut acts = QActs::default();
            acts.quantize(ty, &x, 1, x.len());
            // Q4_1's (Q8_1): each block's sum `s` after its values, as the CPU rounded it.
            let mut want = Vec::new();
            acts.device_values(&mut want);
            assert_eq!((got.len(), want.len()), (len, len), "{ty}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{ty} activation {i}: gpu {g} vs cpu {w} ({v})");
            }
        }
    }
}

#[test]
fn the_router_picks_the_cpu_s_experts() {
    for gpu in variants(&GpuOptions::default()) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(13);
        let (n_expert, k) = (37usize, 5usize);
        let mut logits = rng.vec(n_expert, 3.0);
        logits[7] = logits[30]; // a tie: the lower id first
        for (gating, norm, scale) in [(0u32, true, 1.0f32), (1, false, 2.5), (2, true, 1.0)] {
            let p = OpParams {
                k: k as u32,
                m: n_expert as u32,
                mode: gating | (norm as u32) << 2,
                f0: scale,
                ..Default::default()
            };
            let got = run_op(&gpu, Op::Route, p, 0, &vec![0.0; 2 * k + 1 + n_expert], [Some(&logits), None, None]);
            let mut probs = logits.clone();
            match gating {
                0 => ops::softmax(&mut probs),
                1 => probs.iter_mut().for_each(|x| *x = ops::sigmoid(*x)),
                _ => probs.iter_mut().for_each(|x| *x = (1.0 + x.exp()).ln().sqrt()),
            }
            let mut ids = vec![0u32; k];
            top_k(&probs, &mut ids);
            let mut w: Vec<f32> = ids.iter().map(|&e| probs[e as usize]).collect();
            if norm {
                let sum: f32 = w.iter().sum::<f32>().max(6.103_515_6e-5);
                w.iter_mut().for_each(|x| *x /= sum);
            }
            w.iter_mut().for_each(|x| *x *= scale);
            let got_ids: Vec<u32> = got[..k].iter().map(|f| f.to_bits()).collect();
            assert_eq!(got_ids, ids, "gating {gating} ({v})");
            assert_near(&format!("gating {gating} weights ({v})"), &got[k..2 * k], &w, 1e-5);
        }
    }
}

/// The experts a router chose, read by id on the device, against each
/// expert's product on the CPU: a stack split over bindings in the middle
/// of experts, the input shared or one row per expert.
#[test]
fn experts_chosen_on_the_device_match_their_products() {
    let opts = GpuOptions { max_binding_bytes: Some(4096), ..Default::default() };
    for gpu in variants(&opts) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(17);
        let (ty, n_expert, per, cols, k) = (GgmlType::Q4K, 6usize, 7usize, 256usize, 3usize);
        let w = random_weights(ty, n_expert * per, cols, &mut rng);
        let m = GpuMatrix::upload(&gpu, ty, n_expert * per, cols, &w).unwrap();
        assert!(m.bindings() > 1, "{v}: the stack is not split");
        let ids = [4u32, 0, 5];
        for x_stride in [0, cols] {
            let x = rng.vec(if x_stride == 0 { cols } else { k * cols }, 1.0);
            let mut g = Graph::new(&gpu, Arc::new(GraphOps::new(&gpu).unwrap())).unwrap();
            let idt = g.constant(&ids.map(f32::from_bits)).unwrap();
            let xt = g.constant(&x).unwrap();
            let y = g.tensor(k * per).unwrap();
            g.experts(&m, per, idt, k, xt, x_stride, y).unwrap();
            g.read_back(&[y]).unwrap();
            let mut got = Vec::new();
            g.run(0, &[], &mut got).unwrap();
            let row_bytes = w.len() / (n_expert * per);
            for (j, &e) in ids.iter().enumerate() {
                let slab = &w[e as usize * per * row_bytes..(e as usize + 1) * per * row_bytes];
                let xj = &x[j * x_stride..j * x_stride + cols];
                let (want, scale) = reference(ty, per, cols, slab, xj, 1);
                assert_close(
                    &format!("expert {e}, stride {x_stride} ({v})"),
                    &got[j * per..(j + 1) * per],
                    &want,
                    &scale,
                );
            }
        }
    }
}

/// The fused gate and up products (`matvec_glu.wgsl`) give exactly what the
/// two products and the `glu` operation give (the same sums in the same
/// order, the same activation), for one token and for routed experts, with
/// the matrices split over bindings mid-expert, in formats whose blocks are
/// and are not whole words, and with SiLU and GELU.
#[test]
fn fused_gate_and_up_products_equal_the_two_products_and_the_activation() {
    let opts = GpuOptions { max_binding_bytes: Some(4096), ..Default::default() };
    for gpu in variants(&opts) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(23);
        for ty in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::F16] {
            let (n_expert, per, cols, k) = (5usize, 9usize, 256usize, 3usize);
            let rows = n_expert * per;
            let gw = random_weights(ty, rows, cols, &mut rng);
            let uw = random_weights(ty, rows, cols, &mut rng);
            let gm = GpuMatrix::upload(&gpu, ty, rows, cols, &gw).unwrap();
            let um = GpuMatrix::upload(&gpu, ty, rows, cols, &uw).unwrap();
            assert!(gm.bindings() > 1 && gm.split_like(&um), "{ty} ({v}): the stacks are not split alike");
            let x = rng.vec(cols, 1.0);
            let ids = [3u32, 0, 4];
            for act in [0u32, 1] {
                let what = format!("{ty}, act {act} ({v})");
                let mut g = Graph::new(&gpu, Arc::new(GraphOps::new(&gpu).unwrap())).unwrap();
                let idt = g.constant(&ids.map(f32::from_bits)).unwrap();
                let xt = g.constant(&x).unwrap();
                // Dense: every row of the pair.
                let (dg, du, dy) = (g.tensor(rows).unwrap(), g.tensor(rows).unwrap(), g.tensor(rows).unwrap());
                g.matvec(&gm, xt, dg).unwrap();
                g.matvec(&um, xt, du).unwrap();
                g.op(Op::Glu, OpParams { n: rows as u32, mode: act, ..Default::default() }, dg, Some(du), None, None)
                    .unwrap();
                g.matvec_glu(&gm, &um, act, xt, dy).unwrap();
                // Experts: the rows of the chosen experts.
                let n = k * per;
                let (eg, eu, ey) = (g.tensor(n).unwrap(), g.tensor(n).unwrap(), g.tensor(n).unwrap());
                g.experts(&gm, per, idt, k, xt, 0, eg).unwrap();
                g.experts(&um, per, idt, k, xt, 0, eu).unwrap();
                g.op(Op::Glu, OpParams { n: n as u32, mode: act, ..Default::default() }, eg, Some(eu), None, None)
                    .unwrap();
                g.experts_glu(&gm, &um, act, per, idt, k, xt, ey).unwrap();
                g.read_back(&[dg, dy, eg, ey]).unwrap();
                let mut got = Vec::new();
                g.run(0, &[], &mut got).unwrap();
                let (two, fused) = got.split_at(rows);
                let (fused, rest) = fused.split_at(rows);
                let (etwo, efused) = rest.split_at(n);
                assert!(two.iter().any(|&y| y != 0.0), "{what}: all zero");
                assert_eq!(two, fused, "{what}: dense");
                assert_eq!(etwo, efused, "{what}: experts");
                // And the two products are the CPU's.
                let row_bytes = gw.len() / rows;
                let e = ids[1] as usize;
                let slab = |w: &[u8]| w[e * per * row_bytes..(e + 1) * per * row_bytes].to_vec();
                let (want_g, _) = reference(ty, per, cols, &slab(&gw), &x, 1);
                let (want_u, _) = reference(ty, per, cols, &slab(&uw), &x, 1);
                let mut want: Vec<f32> = want_g.iter().map(|&g| g as f32).collect();
                if act == 0 {
                    ops::silu(&mut want);
                } else {
                    ops::gelu_tanh(&mut want);
                }
                want.iter_mut().zip(&want_u).for_each(|(a, &u)| *a *= u as f32);
                assert_near(&format!("{what}: expert {e}"), &efused[per..2 * per], &want, 5e-3);
            }
            let other = GpuMatrix::upload(&gpu, ty, rows - per, cols, &uw[..(rows - per) * (uw.len() / rows)]).unwrap();
            let mut g = Graph::new(&gpu, Arc::new(GraphOps::new(&gpu).unwrap())).unwrap();
            let (xt, y) = (g.constant(&x).unwrap(), g.tensor(rows).unwrap());
            assert!(g.matvec_glu(&gm, &other, 0, xt, y).is_err(), "{ty} ({v}): unlike matrices fused");
        }
    }
}

/// A decoded token's attention split over several workgroups per head
/// (`attention_split.wgsl`) gives what one workgroup per head gives
/// (`main`, itself tested against the CPU): chunks of a few positions, of
/// none (fewer positions than chunks), a sliding window, output gates,
/// grouped queries, heads larger than the workgroup, f16 and f32 caches.
#[test]
fn attention_split_over_positions_matches_one_workgroup_per_head() {
    // Heads, KV heads, head dim, value head dim, window, gated, f16, capacity, position.
    type Case = (usize, usize, usize, usize, Option<usize>, bool, bool, usize, usize);
    let cases: [Case; 5] = [
        (4, 2, 19, 19, None, false, true, 60, 45),
        (6, 3, 40, 40, Some(20), true, true, 60, 50),
        (8, 2, 64, 48, None, false, false, 60, 3),
        (2, 1, 130, 130, None, false, true, 300, 299),
        (3, 3, 16, 16, Some(33), true, false, 90, 89),
    ];
    let opts = GpuOptions { attention_chunk: Some(7), ..Default::default() };
    for gpu in variants(&opts) {
        let v = gpu.kernels().name();
        let kernel = GpuAttention::new(&gpu).unwrap();
        let mut rng = Rng::new(29);
        for (n_head, n_kv, hd, hdv, window, gated, f16, cap, pos) in cases {
            let what = format!(
                "{n_head}/{n_kv} heads of {hd}/{hdv}, window {window:?}, gated {gated}, f16 {f16}, at {pos} ({v})"
            );
            let ty = if f16 { KvType::F16 } else { KvType::F32 };
            let mut host = KvCache::new(ty, n_kv, hd, hdv, cap).unwrap();
            for p in 0..cap {
                for h in 0..n_kv {
                    host.store(h, p, &rng.vec(hd, 1.0), &rng.vec(hdv, 1.0));
                }
            }
            let mirror = KvMirror::new(&gpu, f16, n_kv, hd, hdv, cap).unwrap();
            let (k, vv) = host.raw().unwrap();
            mirror.write(k, vv, 0..cap).unwrap();
            let q_stride = if gated { 2 * hd } else { hd };
            let s = AttnShape {
                n_head,
                n_kv_head: n_kv,
                head_dim: hd,
                head_dim_v: hdv,
                q_rows: n_head * q_stride,
                q_stride,
                gated,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                pos0: pos,
                n: 1,
            };
            let q = rng.vec(s.q_rows, 2.0);
            let mut want = Vec::new();
            kernel.attend(&mirror, &s, &q, &mut want).unwrap();

            let mut g = Graph::new(&gpu, Arc::new(GraphOps::new(&gpu).unwrap())).unwrap();
            let (qt, out) = (g.tensor(s.q_rows).unwrap(), g.tensor(n_head * hdv).unwrap());
            let sc = g.tensor(n_head * window.map_or(cap, |w| w.min(cap))).unwrap();
            g.attention(&kernel, &mirror, s, qt, out, sc).unwrap();
            g.read_back(&[out]).unwrap();
            let before = gpu.counters();
            let mut got = Vec::new();
            g.run(pos, &[(qt, &q)], &mut got).unwrap();
            assert_eq!((gpu.counters() - before).dispatches, 4, "{what}: not split");
            let range = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let tol = if f16 { 1e-3 } else { 1e-5 } * range;
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!((a - b).abs() <= tol, "{what}: output {i}: one workgroup {a} vs split {b}");
            }
        }
    }
}

/// A token's keys and values written into the device's cache are the bytes
/// the host's cache stores, f16 with an odd head size (two heads' rows share
/// words) and f32.
#[test]
fn keys_and_values_land_as_the_host_stores_them() {
    for gpu in variants(&GpuOptions::default()) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(21);
        for (ty, dim) in [(KvType::F16, 5usize), (KvType::F16, 8), (KvType::F32, 5)] {
            let (heads, cap, pos) = (3usize, 4usize, 2usize);
            let mut host = KvCache::new(ty, heads, dim, dim, cap).unwrap();
            for p in 0..cap {
                for h in 0..heads {
                    host.store(h, p, &rng.vec(dim, 2.0), &rng.vec(dim, 2.0));
                }
            }
            let mirror = KvMirror::new(&gpu, ty == KvType::F16, heads, dim, dim, cap).unwrap();
            let (k, vv) = host.raw().unwrap();
            mirror.write(k, vv, 0..cap).unwrap();
            let (nk, nv) = (rng.vec(heads * dim, 70_000.0), rng.vec(heads * dim, 1e-6));
            let mut g = Graph::new(&gpu, Arc::new(GraphOps::new(&gpu).unwrap())).unwrap();
            let (kt, vt) = (g.tensor(heads * dim).unwrap(), g.tensor(heads * dim).unwrap());
            g.kv_store(&mirror, kt, vt).unwrap();
            g.read_back(&[]).unwrap();
            g.run(pos, &[(kt, &nk), (vt, &nv)], &mut Vec::new()).unwrap();
            for h in 0..heads {
                host.store(h, pos, &nk[h * dim..(h + 1) * dim], &nv[h * dim..(h + 1) * dim]);
            }
            let (k, vv) = host.raw().unwrap();
            for (what, buffer, want) in [("keys", &mirror.k, k), ("values", &mirror.v, vv)] {
                let words = Graph::read_words(&gpu, buffer);
                let got: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take(want.len()).collect();
                assert_eq!(got, want, "{ty:?} {what}, dim {dim} ({v})");
            }
        }
    }
}

/// A prompt's expert products over rows of a stack uploaded whole (the
/// same copy the decoded token reads by id): each expert's rows of the
/// stack, split over bindings in the middle of experts, over chosen tokens.
#[test]
fn prompt_products_over_an_expert_s_rows_of_a_stack() {
    let opts = GpuOptions { max_binding_bytes: Some(4096), ..Default::default() };
    for gpu in variants(&opts) {
        let v = gpu.kernels().name();
        let mut rng = Rng::new(29);
        let (ty, n_expert, per, cols) = (GgmlType::Q4K, 6usize, 7usize, 256usize);
        let w = random_weights(ty, n_expert * per, cols, &mut rng);
        let m = GpuMatrix::upload(&gpu, ty, n_expert * per, cols, &w).unwrap();
        assert!(m.bindings() > 1, "{v}: the stack is not split");
        // Three tokens: their activations within the forced 4 KiB binding.
        let n = 3;
        let x = rng.vec(n * cols, 1.0);
        let jobs = [(4usize, vec![0usize, 2]), (0, vec![1, 2]), (5, vec![2]), (2, vec![0, 1, 2])];
        let batch: Vec<super::RowsJob<'_>> = jobs
            .iter()
            .map(|(e, rows)| super::RowsJob { matrix: &m, input: 0, rows, w_rows: e * per..(e + 1) * per })
            .collect();
        let mut got = Vec::new();
        super::GpuBatch::new(&gpu).run(&[(&x, cols)], &batch, &mut got).unwrap();
        let row_bytes = w.len() / (n_expert * per);
        let mut at = 0;
        for (e, rows) in &jobs {
            let slab = &w[e * per * row_bytes..(e + 1) * per * row_bytes];
            for &t in rows {
                let (want, scale) = reference(ty, per, cols, slab, &x[t * cols..(t + 1) * cols], 1);
                assert_close(&format!("expert {e}, token {t} ({v})"), &got[at..at + per], &want, &scale);
                at += per;
            }
        }
        assert_eq!(at, got.len());
    }
}
