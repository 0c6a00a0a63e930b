//! OLMoE (`olmoe`) on the tiny synthetic model `olmoe-tiny-q8_0`
//! (`scripts/synth-tiny.sh`): llama.cpp's teacher-forced logits of a fixed
//! prompt, as one batch and token by token, a session snapshot, and
//! malformed files.

mod common;

use pocket_core::gguf::{GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, Model};
use pocket_core::threads::ThreadPool;

const NAME: &str = "olmoe-tiny-q8_0";

/// The prompt `core/tests/data/synth/olmoe-tiny-q8_0.llama.npy` holds
/// llama.cpp's logits of (`cargo xtask llama-logits --tokens ...`).
const PROMPT: [u32; 16] = [1, 17, 300, 412, 513, 600, 77, 999, 256, 730, 128, 845, 301, 302, 1000, 42];

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

fn load() -> Model {
    Model::load(common::synth::tiny_model(NAME)).unwrap()
}

#[test]
fn olmoe_tiny_matches_llama_cpp_as_a_batch_and_decoding() {
    common::synth::matches_llama_cpp(&load(), NAME, &PROMPT);
}

/// A session saved after a request and restored elsewhere continues
/// exactly as the one it was saved from, reusing the saved prefix.
#[test]
fn olmoe_session_snapshot_continues_identically() {
    use pocket_core::sampler::SamplerConfig;
    use pocket_core::session::{GenerateOptions, Session, SessionOptions};
    use std::sync::Arc;
    let m = Arc::new(load());
    let opts = SessionOptions { context_length: 96, kv_type: KvType::F16, threads: 2, seed: 7, ..Default::default() };
    let greedy =
        GenerateOptions { max_tokens: 6, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let mut a = Session::new(m.clone(), opts.clone()).unwrap();
    let first = a.generate_tokens(&PROMPT, &greedy, &mut |_| true).unwrap();
    let mut bytes = Vec::new();
    a.write_snapshot(&mut bytes).unwrap();
    let mut r = &bytes[..];
    let mut b = Session::restore_from(m.clone(), &mut r, bytes.len() as u64, opts).unwrap();
    assert_eq!(a.cached_tokens(), b.cached_tokens());

    // Seeded sampling over the context plus two new tokens: any difference
    // in the restored state would show in the sampled tokens.
    let seeded = GenerateOptions {
        max_tokens: 16,
        sampler: SamplerConfig { temperature: 0.9, top_k: 50, top_p: 0.95, min_p: 0.0, ..Default::default() },
        seed: Some(99),
        ignore_eos: true,
        ..Default::default()
    };
    let mut next: Vec<u32> = PROMPT.iter().chain(&first.tokens).copied().collect();
    next.extend([285, 11]);
    let sa = a.generate_tokens(&next, &seeded, &mut |_| true).unwrap();
    let sb = b.generate_tokens(&next, &seeded, &mut |_| true).unwrap();
    eprintln!("after the snapshot: {:?} ({} evaluated)", sb.tokens, sb.prompt_tokens_evaluated);
    assert_eq!(sa.tokens, sb.tokens);
    assert_eq!(sa.prompt_tokens_evaluated, sb.prompt_tokens_evaluated);
    assert!(sb.prompt_tokens_evaluated < next.len(), "the restored prefix was evaluated again");
}

/// A copy of the tiny file with its metadata changed by `edit`, the tensors
/// `keep` accepts, and tensor `reshape.0` declared as `reshape.1`.
fn rewrite(
    edit: impl Fn(&str, &Value) -> Option<Value>,
    keep: impl Fn(&str) -> bool,
    reshape: Option<(&str, &[u64])>,
) -> Vec<u8> {
    let g = GgufFile::open(common::synth::tiny_model(NAME)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if let Some(v) = edit(k, v) {
            w.kv(k, v);
        }
    }
    let kept: Vec<_> = g.tensors().iter().filter(|t| keep(&t.name)).collect();
    for t in &kept {
        match reshape {
            Some((name, dims)) if name == t.name => w.tensor(&t.name, t.ty, dims),
            _ => w.tensor(&t.name, t.ty, t.shape()),
        };
    }
    w.to_bytes(|i, out| out.copy_from_slice(g.tensor_data(kept[i])))
}

/// `key` set to `value`, everything else kept.
fn with(key: &'static str, value: Value) -> impl Fn(&str, &Value) -> Option<Value> {
    move |k, v| Some(if k == key { value.clone() } else { v.clone() })
}

#[test]
fn olmoe_malformed_files_are_typed_errors() {
    use pocket_core::Error;
    let load = |bytes: Vec<u8>| Model::from_gguf(GgufFile::from_bytes(bytes).unwrap());
    let (all, same) = (|_: &str| true, |_: &str, v: &Value| Some(v.clone()));
    // Unchanged, the rewrite loads, and every tensor of the file is used.
    let m = load(rewrite(same, all, None)).unwrap();
    assert!(m.summary().ignored_tensors.is_empty(), "{:?}", m.summary().ignored_tensors);

    let bad_key = |bytes: Vec<u8>, key: &str| match load(bytes) {
        Err(Error::InvalidHyperparameter { key: k, reason }) if k == key => eprintln!("{key}: {reason}"),
        other => panic!("{key}: {:?}", other.err()),
    };
    // 3 heads do not span 256; 5 of 8 experts... of 4; a negative epsilon.
    let heads = "olmoe.attention.head_count";
    bad_key(rewrite(with(heads, Value::U32(3)), all, None), "olmoe.attention.head_count_kv");
    let used = "olmoe.expert_used_count";
    bad_key(rewrite(with(used, Value::U32(9)), all, None), used);
    let eps = "olmoe.attention.layer_norm_rms_epsilon";
    bad_key(rewrite(with(eps, Value::F32(-1.0)), all, None), eps);

    // Missing keys and tensors name themselves.
    for gone in [eps, "olmoe.feed_forward_length", "olmoe.expert_count"] {
        let err = load(rewrite(|k, v| (k != gone).then(|| v.clone()), all, None)).err().expect(gone);
        assert!(matches!(err, Error::MissingKey(ref k) if k == gone), "{gone}: {err}");
    }
    for gone in ["blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight", "output.weight", "blk.0.ffn_gate_inp.weight"] {
        let err = load(rewrite(same, |n| n != gone, None)).err().expect("missing tensor");
        assert!(matches!(err, Error::MissingTensor(ref t) if t == gone), "{gone}: {err}");
    }
    // A per-head q norm ([64], Qwen3's) is not OLMoE's whole-projection one.
    let q_norm = "blk.0.attn_q_norm.weight";
    let err = load(rewrite(same, all, Some((q_norm, &[64, 4])))).err().expect("per-head norm");
    assert!(matches!(err, Error::TensorShape { ref tensor, .. } if tensor == q_norm), "{err}");
}

/// Under the smallest memory budget the routed experts come from the
/// expert cache and the rest from resident copies: the same logits.
#[test]
fn olmoe_runs_under_a_memory_budget() {
    use pocket_core::model::LoadOptions;
    let plain = load();
    let plan = plain.memory_plan(1 << 30);
    let opts = LoadOptions { memory_budget: plan.minimum_budget_bytes, ..LoadOptions::default() };
    let budgeted = Model::load_with(common::synth::tiny_model(NAME), &opts).unwrap();
    let (a, _) = common::batch_and_decode_logits(&plain, &pool(), &PROMPT);
    let (b, _) = common::batch_and_decode_logits(&budgeted, &pool(), &PROMPT);
    assert_eq!(a, b);
}
