//! [`GpuBackend`] against [`Cpu`], operation by operation, on random data:
//! products over chosen rows (MoE experts), attention (and the device copy
//! of the KV cache through rewrites), the delta rule, each with the kernels
//! the adapter offers and with the portable ones. Without an adapter the
//! tests print why and pass; `POCKET_REQUIRE_GPU=1` makes that a failure.

use super::super::blocks::attention::{AttnParams, Rope};
use super::super::blocks::deltanet::DeltaParams;
use super::super::cache::{KvCache, KvType};
use super::super::pass::{Attend, DeltaRule, Pass};
use super::super::ssm::Ssm;
use super::{Backend, Cpu, GpuBackend};
use crate::gpu::{Gpu, GpuOptions, FORMATS};
use crate::kernels::testing::{random_weights, Rng};
use crate::kernels::{MatJob, QActs, QMatrix};
use crate::threads::ThreadPool;

/// A pass over no file (the operations these tests run read no weights).
fn bare_pass<'a>(pool: &'a ThreadPool, backend: &'a dyn Backend, pos0: usize, n: usize) -> Pass<'a> {
    Pass { file: &[], pool, backend, experts: None, map: None, copies: None, pos0, n, observer: None }
}

fn device() -> Option<Gpu> {
    device_with(&GpuOptions::default())
}

/// The device with the kernels the adapter offers (`shader-f16` and
/// subgroups on lavapipe) and with the portable ones: one when they are the
/// same, none without an adapter.
fn devices() -> Vec<Gpu> {
    let Some(best) = device() else { return Vec::new() };
    let Some(portable) = device_with(&GpuOptions::portable()) else { return Vec::new() };
    if best.kernels() == portable.kernels() {
        vec![best]
    } else {
        vec![best, portable]
    }
}

fn device_with(opts: &GpuOptions) -> Option<Gpu> {
    match Gpu::new(opts) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var("POCKET_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("POCKET_REQUIRE_GPU=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipping the GPU test: {e}");
            None
        }
    }
}

/// A MoE layer's shape of call: three experts of one stacked tensor in
/// the "file", each over its chosen rows of shared activations (rows
/// repeated and out of order), beside a whole-matrix product, for every
/// format the GPU computes with: the same outputs as the CPU's kernels
/// on the same quantised activations, none on the CPU.
#[test]
fn products_over_chosen_rows_match_the_cpu() {
    for gpu in devices() {
        products_over_chosen_rows_match_the_cpu_on(&gpu);
    }
}

fn products_over_chosen_rows_match_the_cpu_on(gpu: &Gpu) {
    let pool = ThreadPool::new(1);
    let mut rng = Rng::new(31);
    for ty in FORMATS {
        let cols = match ty.block_size() {
            1 => 67,
            32 => 7 * 32,
            b => 2 * b,
        };
        let (rows, n) = (19, 6);
        // Random blocks, and blocks as the quantiser makes them (Q4_1's and
        // Q5_1's minimums 8 or 16 steps below zero, as in a model).
        for quantised in [false, true] {
            let file: Vec<u8> = (0..3).flat_map(|_| weights(ty, rows, cols, quantised, &mut rng)).collect();
            let slab = file.len() / 3;
            let expert = |e: usize| QMatrix::new(ty, &file[e * slab..(e + 1) * slab], rows, cols).unwrap();
            let backend = GpuBackend::new(gpu.clone(), &file);
            // Centred activations, and activations of one sign (as a gated
            // FFN's hidden values), whose blocks' sums are large: Q4_1 and
            // Q5_1 multiply their minimums by them (Q8_1's `s`, rounded to
            // f16 on the CPU; the GPU once used the exact sum, which moved
            // the hybrid model's logits by up to 2.4).
            for offset in [0.0, 2.0] {
                let x: Vec<f32> = rng.vec(n * cols, 1.0).iter().map(|v| v + offset).collect();
                products_match(&backend, ty, (rows, cols), &expert, &x, n, &pool);
            }
        }
    }
}

/// `rows` rows of `cols` weights of type `ty`: random blocks, or random
/// values through the quantiser.
fn weights(ty: crate::quant::GgmlType, rows: usize, cols: usize, quantised: bool, rng: &mut Rng) -> Vec<u8> {
    if !quantised {
        return random_weights(ty, rows, cols, rng);
    }
    let mut out = vec![0u8; rows * ty.row_bytes(cols as u64).unwrap() as usize];
    crate::quantize::quantize_rows(ty, &rng.vec(rows * cols, 0.1), cols, None, &mut out).unwrap();
    out
}

/// Four products of `ty` weights over the activations `x` (`n` rows): three
/// of the experts `expert(e)` over chosen rows and one whole, on the CPU
/// and on `backend`, compared.
fn products_match<'a>(
    backend: &GpuBackend,
    ty: crate::quant::GgmlType,
    (rows, cols): (usize, usize),
    expert: &dyn Fn(usize) -> QMatrix<'a>,
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) {
    let kernels = backend.gpu.kernels().name();
    let mut acts = QActs::new();
    acts.quantize(ty, x, n, cols);
    let picks: [Option<&[usize]>; 4] = [Some(&[0, 3, 5]), Some(&[1]), Some(&[2, 4, 0, 5, 5]), None];
    let run = |b: &dyn Backend| {
        let mut outs: Vec<Vec<f32>> = picks.iter().map(|p| vec![0.0; p.map_or(n, |r| r.len()) * rows]).collect();
        let mut jobs: Vec<MatJob> = outs
            .iter_mut()
            .zip(picks)
            .enumerate()
            .map(|(e, (out, rows))| MatJob { w: expert(e % 3), x: &acts, rows, out })
            .collect();
        b.matmul(pool, &mut jobs);
        outs
    };
    let before = backend.counters();
    let (want, got) = (run(&Cpu), run(backend));
    let c = backend.counters() - before;
    assert_eq!((c.gpu_products, c.cpu_products), (4, 0), "{ty}");
    // The three over chosen rows in one submission, the whole product in another.
    assert_eq!((c.device.submissions, c.device.readbacks), (2, 2), "{ty}");
    // Per output, the sum of |w x| over its terms: the scale of the f32
    // rounding either side may make.
    let mut xs = Vec::new();
    acts.dequantize(&mut xs);
    let mut row = vec![0f32; cols];
    for (j, ((w, g), pick)) in want.iter().zip(&got).zip(picks).enumerate() {
        let m = expert(j % 3);
        let tokens: Vec<usize> = pick.map_or((0..n).collect(), |r| r.to_vec());
        let mut worst = 0f64;
        for (r, bytes) in m.data.chunks_exact(m.data.len() / rows).enumerate() {
            crate::kernels::dequantize_row(ty, bytes, &mut row);
            for (i, &t) in tokens.iter().enumerate() {
                let scale: f64 = row.iter().zip(&xs[t * cols..(t + 1) * cols]).map(|(a, b)| (a * b).abs() as f64).sum();
                let (a, b) = (w[i * rows + r], g[i * rows + r]);
                worst = worst.max((a - b).abs() as f64 / (scale + 1e-30));
            }
        }
        // f32 rounding: at most 1e-6 of the scale on lavapipe (the formats
        // with minimums, whose two terms cancel); the minimum times the
        // exact sum instead of `s` was up to 2.8e-3 (Q4_1) and 1.5e-3 (Q5_1).
        assert!(worst <= 1e-5, "{ty} ({kernels}) job {j}: cpu and gpu differ by {worst} of the terms' scale");
    }
}

/// An attention layer's shape for the tests.
fn layer(n_head: usize, n_kv_head: usize, hd: usize, hdv: usize, window: Option<usize>) -> AttnParams {
    AttnParams {
        n_head,
        n_kv_head,
        head_dim: hd,
        head_dim_v: hdv,
        rope: Rope { n_rot: hd & !1, base: 10000.0, scale: 1.0, neox: false },
        scale: 1.0 / (hd as f32).sqrt(),
        window,
        eps: 1e-6,
    }
}

/// Random keys and values at `positions` of every KV head.
fn fill(cache: &mut KvCache, positions: std::ops::Range<usize>, rng: &mut Rng) {
    for pos in positions {
        for h in 0..cache.n_kv_head {
            let (k, v) = (rng.vec(cache.head_dim_k, 1.0), rng.vec(cache.head_dim_v, 1.0));
            cache.store(h, pos, &k, &v);
        }
    }
}

/// `backend`'s attention of `n` random queries at `pos0` against the
/// CPU's, within f32 rounding (f32 cache) or one f16 rounding of the
/// weights (f16 cache), relative to the largest value.
#[allow(clippy::too_many_arguments)]
fn check(
    backend: &GpuBackend,
    cache: &KvCache,
    p: &AttnParams,
    pos0: usize,
    n: usize,
    gated: bool,
    rng: &mut Rng,
    what: &str,
) {
    let pool = ThreadPool::new(2);
    let q_rows = p.n_head * p.head_dim * if gated { 2 } else { 1 };
    let q = rng.vec(n * q_rows, 3.0);
    let a = Attend { p, cache, q: &q, q_rows, gated, sinks: None };
    let run = |b: &dyn Backend| {
        let pass = bare_pass(&pool, b, pos0, n);
        let mut out = vec![f32::NAN; n * p.n_head * p.head_dim_v];
        b.attend(&pass, &a, &mut out, &mut Vec::new());
        out
    };
    let (want, got) = (run(&Cpu), run(backend));
    let (_, v) = cache.raw().unwrap();
    let range = match cache.ty {
        KvType::F16 => {
            v.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32().abs()).fold(0f32, f32::max)
        }
        _ => v.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).abs()).fold(0f32, f32::max),
    };
    let tol = if cache.ty == KvType::F16 { 1e-3 } else { 2e-5 } * range.max(1.0);
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!((a - b).abs() <= tol, "{what}: output {i}: cpu {a} vs gpu {b} (tolerance {tol:e})");
    }
}

/// Heads, KV heads, head dim, value head dim, window, gated, cache type,
/// prefill tokens, decoded tokens.
type Case = (usize, usize, usize, usize, Option<usize>, bool, KvType, usize, usize);

/// Attention on the device against the CPU's: odd head sizes, GQA ratios
/// 1, 3 and 4, windows shorter and longer than the context, output
/// gates, one token and many, f16 and f32 caches, heads larger than the
/// workgroup and contexts longer than it.
#[test]
fn attention_matches_the_cpu() {
    for gpu in devices() {
        attention_matches_the_cpu_on(gpu);
    }
}

fn attention_matches_the_cpu_on(gpu: Gpu) {
    let kernels = gpu.kernels().name();
    let backend = GpuBackend::new(gpu, &[]);
    let mut rng = Rng::new(41);
    let cases: [Case; 6] = [
        (4, 1, 19, 19, None, false, KvType::F16, 1, 4),
        (6, 2, 40, 40, Some(5), false, KvType::F16, 9, 3),
        (8, 2, 64, 48, None, false, KvType::F32, 7, 2),
        (4, 2, 32, 32, Some(3), true, KvType::F16, 6, 2),
        (3, 3, 130, 130, Some(100), false, KvType::F16, 70, 2),
        (5, 5, 33, 33, Some(80), true, KvType::F32, 75, 1),
    ];
    for (n_head, n_kv, hd, hdv, window, gated, ty, prefill, decode) in cases {
        let p = layer(n_head, n_kv, hd, hdv, window);
        let mut cache = KvCache::new(ty, n_kv, hd, hdv, 96).unwrap();
        let what = format!("{n_head}/{n_kv} heads of {hd}/{hdv}, window {window:?}, gated {gated}, {ty:?} ({kernels})");
        fill(&mut cache, 0..prefill, &mut rng);
        check(&backend, &cache, &p, 0, prefill, gated, &mut rng, &format!("{what}: prefill {prefill}"));
        for pos in prefill..prefill + decode {
            fill(&mut cache, pos..pos + 1, &mut rng);
            let before = backend.counters().device;
            check(&backend, &cache, &p, pos, 1, gated, &mut rng, &format!("{what}: decode at {pos}"));
            // Only the new position went up: each head's key and value,
            // widened to whole words.
            let d = backend.counters().device - before;
            let (up, elem) = (d.cache_bytes_uploaded, if ty == KvType::F16 { 2 } else { 4 });
            assert!(up > 0 && up <= (n_kv * (elem * (hd + hdv) + 12)) as u64, "{what}: {up} bytes for one position");
            // Decoding makes no buffers (past a case's first token, whose
            // shape may be larger than the last case's).
            if pos > prefill {
                assert_eq!(d.buffers_created, 0, "{what}: decode at {pos}");
            }
        }
    }
    let c = backend.counters();
    assert_eq!((c.gpu_attention, c.cpu_attention), (6 + 14, 0));
}

/// A prompt whose scores do not fit one binding, or whose tokens exceed
/// the dispatch grid, goes in several dispatches with the same result.
#[test]
fn long_prompts_go_in_several_dispatches() {
    let p = layer(4, 2, 8, 8, None);
    // 20 tokens: 320 bytes of scores each for the last, 12 per 4 KiB
    // binding; at most 7 workgroups per dimension.
    for (opts, dispatches) in [
        (GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }, 2),
        (GpuOptions { max_workgroups_per_dimension: Some(7), ..Default::default() }, 3),
    ] {
        let Some(gpu) = device_with(&opts) else { return };
        let backend = GpuBackend::new(gpu, &[]);
        let mut rng = Rng::new(44);
        let mut cache = KvCache::new(KvType::F16, 2, 8, 8, 32).unwrap();
        fill(&mut cache, 0..20, &mut rng);
        let before = backend.counters();
        check(&backend, &cache, &p, 0, 20, false, &mut rng, &format!("{opts:?}"));
        let c = backend.counters() - before;
        assert_eq!((c.gpu_attention, c.device.submissions, c.device.readbacks), (1, dispatches, 1), "{opts:?}");
    }
}

/// A cache larger than the device's binding stays on the CPU: refused
/// once, then quietly, counted.
#[test]
fn a_cache_the_device_cannot_hold_stays_on_the_cpu() {
    let Some(gpu) = device_with(&GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }) else {
        return;
    };
    let backend = GpuBackend::new(gpu, &[]);
    let mut rng = Rng::new(45);
    let p = layer(4, 2, 24, 24, None);
    // 2 heads x 64 positions x 24 x 2 bytes: 6 KiB of keys.
    let mut cache = KvCache::new(KvType::F16, 2, 24, 24, 64).unwrap();
    fill(&mut cache, 0..3, &mut rng);
    check(&backend, &cache, &p, 0, 3, false, &mut rng, "too large");
    let before = backend.counters().device;
    check(&backend, &cache, &p, 2, 1, false, &mut rng, "too large, again");
    let c = backend.counters();
    assert_eq!((c.gpu_attention, c.cpu_attention), (0, 2));
    assert_eq!(c.device.buffers_created, before.buffers_created);
}

/// The device's copy of a cache follows what the session does to it:
/// positions rewritten after a truncation, a snapshot loaded over it, a
/// new cache in place of a dropped one; a q8_0 cache stays on the CPU.
#[test]
fn the_device_copy_of_the_cache_follows_rewrites() {
    let Some(gpu) = device() else { return };
    let backend = GpuBackend::new(gpu, &[]);
    let mut rng = Rng::new(42);
    let p = layer(4, 2, 24, 24, None);
    let mut cache = KvCache::new(KvType::F16, 2, 24, 24, 32).unwrap();
    fill(&mut cache, 0..10, &mut rng);
    check(&backend, &cache, &p, 0, 10, false, &mut rng, "prefill");
    // Truncated to 4 and re-evaluated: positions 4..7 are new.
    fill(&mut cache, 4..7, &mut rng);
    check(&backend, &cache, &p, 4, 3, false, &mut rng, "after a truncation");
    // A snapshot of another sequence loaded over positions 0..8, then a token.
    let mut other = KvCache::new(KvType::F16, 2, 24, 24, 32).unwrap();
    fill(&mut other, 0..8, &mut rng);
    let mut bytes = Vec::new();
    other.save_positions(8, &mut bytes);
    cache.load_positions(8, &bytes).unwrap();
    fill(&mut cache, 8..9, &mut rng);
    check(&backend, &cache, &p, 8, 1, false, &mut rng, "after loading a snapshot");
    // A checkpoint's prefix restored (positions untouched): only new ones go up.
    fill(&mut cache, 5..6, &mut rng);
    check(&backend, &cache, &p, 5, 1, false, &mut rng, "after a restore");
    assert_eq!(backend.mirrors.lock().unwrap().len(), 1);
    // A new cache (a new session) gets its own copy; the dropped one's goes.
    drop(cache);
    let mut fresh = KvCache::new(KvType::F16, 2, 24, 24, 32).unwrap();
    fill(&mut fresh, 0..3, &mut rng);
    check(&backend, &fresh, &p, 0, 3, false, &mut rng, "a new cache");
    assert_eq!(backend.mirrors.lock().unwrap().len(), 1);
    let c = backend.counters();
    assert_eq!((c.gpu_attention, c.cpu_attention), (5, 0));
    // q8_0: the CPU's, counted.
    let mut q8 = KvCache::new(KvType::Q8_0, 2, 32, 32, 8).unwrap();
    fill(&mut q8, 0..2, &mut rng);
    let pool = ThreadPool::new(1);
    let p8 = layer(4, 2, 32, 32, None);
    let q = rng.vec(2 * 4 * 32, 1.0);
    let a = Attend { p: &p8, cache: &q8, q: &q, q_rows: 4 * 32, gated: false, sinks: None };
    let pass = bare_pass(&pool, &backend, 0, 2);
    backend.attend(&pass, &a, &mut vec![0.0; 2 * 4 * 32], &mut Vec::new());
    let c = backend.counters();
    assert_eq!((c.gpu_attention, c.cpu_attention), (5, 1));
}

/// The delta rule on the device against the CPU's: odd head sizes, value
/// heads sharing key heads, heads wider than the workgroup, one token
/// and many (from 32 tokens the CPU takes its chunked form), over a
/// state carried from call to call; outputs and the advanced state.
#[test]
fn the_delta_rule_matches_the_cpu() {
    for gpu in devices() {
        the_delta_rule_matches_the_cpu_on(gpu);
    }
}

fn the_delta_rule_matches_the_cpu_on(gpu: Gpu) {
    let backend = GpuBackend::new(gpu, &[]);
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(43);
    // (key heads, value heads, key head, value head, tokens per call)
    let cases = [(1, 1, 19, 23, [1, 1, 5]), (2, 4, 32, 24, [7, 1, 40]), (1, 3, 130, 70, [3, 1, 1])];
    for (n_k_heads, n_v_heads, d_k, d_v, calls) in cases {
        let p = DeltaParams { n_k_heads, n_v_heads, d_k, d_v, d_conv: 4, eps: 1e-6 };
        let what = format!("{n_k_heads}/{n_v_heads} heads of {d_k}/{d_v}");
        let start = rng.vec(n_v_heads * d_k * d_v, 0.3);
        let (mut want_state, mut got_state) = (Ssm::new(start.len()), Ssm::new(start.len()));
        want_state.overwrite().copy_from_slice(&start);
        got_state.overwrite().copy_from_slice(&start);
        let mut pos0 = 0;
        for (call, n) in calls.into_iter().enumerate() {
            // q and k L2-normalised per head, as the layer hands them over.
            let mut qkv = rng.vec(n * p.conv_dim(), 1.0);
            for row in qkv.chunks_exact_mut(p.conv_dim()) {
                for h in row[..2 * p.key_dim()].chunks_exact_mut(d_k) {
                    let norm = h.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                    h.iter_mut().for_each(|x| *x /= norm);
                }
            }
            let g: Vec<f32> = (0..n * n_v_heads).map(|_| -rng.f32() * 0.7).collect();
            let beta: Vec<f32> = (0..n * n_v_heads).map(|_| rng.f32()).collect();
            let rule = DeltaRule { p: &p, qkv: &qkv, g: &g, beta: &beta };
            let run = |b: &dyn Backend, state: &mut Ssm| {
                let pass = bare_pass(&pool, b, pos0, n);
                let mut out = vec![f32::NAN; n * p.value_dim()];
                b.delta_rule(&pass, &rule, state, &mut out, &mut Vec::new()).unwrap();
                out
            };
            let want = run(&Cpu, &mut want_state);
            let before = backend.counters().device;
            let got = run(&backend, &mut got_state);
            // The state went up on the first call only and stays on the device.
            let d = backend.counters().device - before;
            assert_eq!((d.state_uploads, d.state_readbacks), (u64::from(call == 0), 0), "{what}, call {call}");
            assert!(got_state.ahead().is_some(), "{what}");
            // Token by token both sides round alike (measured on lavapipe:
            // 1.5e-8 at most); the CPU's chunked form differs more (3.6e-7).
            let tol = if n >= 32 { 1e-5 } else { 1e-6 };
            let (want_s, got_s) = (want_state.read().unwrap(), got_state.read().unwrap());
            for (name, w, g) in [("output", &want[..], &got[..]), ("state", &want_s[..], &got_s[..])] {
                let range = w.iter().fold(1f32, |m, v| m.max(v.abs()));
                for (i, (a, b)) in w.iter().zip(g.iter()).enumerate() {
                    assert!(
                        (a - b).abs() <= tol * range,
                        "{what}, {n} tokens at {pos0}: {name} {i}: cpu {a} vs gpu {b}"
                    );
                }
            }
            pos0 += n;
        }
    }
    let c = backend.counters();
    assert_eq!((c.gpu_delta, c.cpu_delta), (9, 0));
}

/// The device's copy of a recurrent state follows what the session does to
/// it, against the CPU on a twin state: uploaded once, then per decoded
/// token neither uploaded nor read back; read back (once) for a
/// checkpoint; uploaded again after a restore, a clear (a new sequence) or
/// a pass on the CPU; dropped with the state.
#[test]
fn the_device_copy_of_a_recurrent_state_follows_rewrites() {
    let Some(gpu) = device() else { return };
    let backend = GpuBackend::new(gpu, &[]);
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(46);
    let p = DeltaParams { n_k_heads: 2, n_v_heads: 4, d_k: 16, d_v: 12, d_conv: 4, eps: 1e-6 };
    let len = p.n_v_heads * p.d_k * p.d_v;
    let (mut cpu, mut gpu) = (Ssm::new(len), Ssm::new(len));
    let step = |b: &dyn Backend, cpu: &mut Ssm, gpu: &mut Ssm, rng: &mut Rng| {
        let n = 1 + rng.below(3);
        let qkv: Vec<f32> = rng.vec(n * p.conv_dim(), 0.2);
        let g: Vec<f32> = (0..n * p.n_v_heads).map(|_| -rng.f32() * 0.7).collect();
        let beta: Vec<f32> = (0..n * p.n_v_heads).map(|_| rng.f32()).collect();
        let rule = DeltaRule { p: &p, qkv: &qkv, g: &g, beta: &beta };
        let mut outs = Vec::new();
        for (b, st) in [(&Cpu as &dyn Backend, cpu), (b, gpu)] {
            let pass = bare_pass(&pool, b, 0, n);
            let mut out = vec![0.0; n * p.value_dim()];
            b.delta_rule(&pass, &rule, st, &mut out, &mut Vec::new()).unwrap();
            outs.push(out);
        }
        let diff = outs[0].iter().zip(&outs[1]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-5, "outputs differ by {diff}");
    };
    let same = |cpu: &Ssm, gpu: &Ssm, what: &str| {
        let (a, b) = (cpu.read().unwrap(), gpu.read().unwrap());
        let diff = a.iter().zip(b.iter()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-5, "{what}: states differ by {diff}");
    };
    let counted = |backend: &GpuBackend, f: &mut dyn FnMut()| {
        let before = backend.counters().device;
        f();
        let d = backend.counters().device - before;
        (d.state_uploads, d.state_readbacks)
    };
    // Prefill, then decoded tokens: one upload, no readback.
    assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (1, 0));
    for _ in 0..4 {
        assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (0, 0));
    }
    // A checkpoint reads it back once; decoding goes on without an upload.
    let mut saved = Vec::new();
    assert_eq!(counted(&backend, &mut || saved = gpu.read().unwrap().into_owned()), (0, 1));
    same(&cpu, &gpu, "checkpoint");
    let cpu_saved = cpu.read().unwrap().into_owned();
    assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (0, 0));
    // The checkpoint restored: uploaded again, once.
    gpu.overwrite().copy_from_slice(&saved);
    cpu.overwrite().copy_from_slice(&cpu_saved);
    assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (1, 0));
    assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (0, 0));
    same(&cpu, &gpu, "after a restore");
    // A pass on the CPU reads it back first; the next on the GPU uploads.
    assert_eq!(counted(&backend, &mut || step(&Cpu, &mut cpu, &mut gpu, &mut rng)), (0, 1));
    assert!(gpu.ahead().is_none());
    assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (1, 0));
    // A new sequence: zeros go up.
    gpu.clear();
    cpu.clear();
    assert_eq!(counted(&backend, &mut || step(&backend, &mut cpu, &mut gpu, &mut rng)), (1, 0));
    same(&cpu, &gpu, "after a clear");
    // Another state gets its own copy; a dropped one's goes.
    let mut other = Ssm::new(len);
    let mut other_cpu = Ssm::new(len);
    step(&backend, &mut other_cpu, &mut other, &mut rng);
    assert_eq!(backend.states.lock().unwrap().len(), 2);
    drop(other);
    step(&backend, &mut cpu, &mut gpu, &mut rng);
    assert_eq!(backend.states.lock().unwrap().len(), 1);
    same(&cpu, &gpu, "at the end");
    let c = backend.counters();
    assert_eq!(c.cpu_delta, 0);
}
