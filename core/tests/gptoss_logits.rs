//! gpt-oss (`gpt-oss`) against llama.cpp on the tiny synthetic models
//! (`cargo xtask synth-model --arch gpt-oss --geometry tiny`, Q8_0 and
//! MXFP4_MOE; made by `scripts/synth-tiny.sh` into `$POCKET_SYNTH_TINY`):
//! teacher-forced logits as one batch and token by token, session
//! snapshots, the memory budget, and malformed files.
//!
//! Every mechanism is on in the tiny model: q/k/v/o biases, per-head sinks,
//! a window of 5 on layers 0 and 2, YaRN x4 over an original context of 32,
//! a biased router with softmax over the chosen 3 of 8 experts, biased
//! experts with the SwiGLU's clamp at 7 reached, random norms.

mod common;

use pocket_core::gguf::{GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, Model};
use pocket_core::threads::ThreadPool;

/// The 16-token prompt llama.cpp's logits were made for.
const PROMPT: [u32; 16] = [1, 300, 450, 17, 901, 77, 512, 33, 640, 128, 999, 260, 5, 731, 404, 888];

/// The presets of the tiny model, as synth-model names them.
const PRESETS: [&str; 2] = ["q8_0", "mxfp4_moe"];

fn name(preset: &str) -> String {
    format!("gptoss-tiny-{preset}")
}

fn load(preset: &str) -> Model {
    Model::load(common::synth::tiny_model(&name(preset))).unwrap_or_else(|e| panic!("{preset}: {e}"))
}

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

#[test]
fn gptoss_tiny_files_match_llama_cpp_as_a_batch_and_decoding() {
    for preset in PRESETS {
        common::synth::matches_llama_cpp(&load(preset), &name(preset), &PROMPT);
    }
}

/// With an f16 cache a prompt takes the tiled attention kernel, sinks and
/// windows included; token by token takes the per-position path (sinks in
/// f64), which the f32-cache test above holds to llama.cpp: the two agree.
#[test]
fn gptoss_f16_prompt_attention_with_sinks_matches_decoding() {
    use pocket_core::model::Logits;
    let model = load("mxfp4_moe");
    let pool = pool();
    let mut st = model.new_state(PROMPT.len(), KvType::F16).unwrap();
    model.forward(&pool, &mut st, &PROMPT, Logits::All).unwrap();
    let batch = st.logits().to_vec();
    let mut st = model.new_state(PROMPT.len(), KvType::F16).unwrap();
    let mut decode = Vec::with_capacity(batch.len());
    for &t in &PROMPT {
        model.forward(&pool, &mut st, &[t], Logits::Last).unwrap();
        decode.extend_from_slice(st.logits());
    }
    let scale = decode.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = batch.iter().zip(&decode).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("f16 cache: batch vs decode max |Δ| {d:.3e} (logits up to {scale:.3e})");
    assert!(d <= 2e-3 * scale, "batch and decode differ by {d} (logits up to {scale})");
}

/// A session saved after a request and restored elsewhere continues
/// exactly as the one it was saved from, reusing the saved prefix.
#[test]
fn gptoss_session_snapshot_continues_identically() {
    use pocket_core::sampler::SamplerConfig;
    use pocket_core::session::{GenerateOptions, Session, SessionOptions};
    use std::sync::Arc;
    let m = Arc::new(load("mxfp4_moe"));
    let opts = SessionOptions { context_length: 64, kv_type: KvType::F16, threads: 2, seed: 7, ..Default::default() };
    let greedy =
        GenerateOptions { max_tokens: 6, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let mut a = Session::new(m.clone(), opts.clone()).unwrap();
    let first = a.generate_tokens(&PROMPT, &greedy, &mut |_| true).unwrap();
    let mut bytes = Vec::new();
    a.write_snapshot(&mut bytes).unwrap();
    let mut r = &bytes[..];
    let mut b = Session::restore_from(m.clone(), &mut r, bytes.len() as u64, opts).unwrap();
    assert_eq!(a.cached_tokens(), b.cached_tokens());

    let seeded = GenerateOptions {
        max_tokens: 12,
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

/// Under a memory budget the experts (with their biases) come from the
/// expert cache: the same logits.
#[test]
fn gptoss_runs_under_a_memory_budget() {
    use pocket_core::model::LoadOptions;
    let plain = load("q8_0");
    let plan = plain.memory_plan(1 << 30);
    let opts = LoadOptions { memory_budget: plan.minimum_budget_bytes, ..LoadOptions::default() };
    let budgeted = Model::load_with(common::synth::tiny_model(&name("q8_0")), &opts).unwrap();
    let (a, _) = common::batch_and_decode_logits(&plain, &pool(), &PROMPT);
    let (b, _) = common::batch_and_decode_logits(&budgeted, &pool(), &PROMPT);
    assert_eq!(a, b);
}

/// A copy of the Q8_0 file with its metadata changed by `edit` and the
/// tensors `keep` accepts.
fn rewrite(edit: impl Fn(&str, &Value) -> Option<Value>, keep: impl Fn(&str) -> bool) -> Vec<u8> {
    let g = GgufFile::open(common::synth::tiny_model(&name("q8_0"))).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if let Some(v) = edit(k, v) {
            w.kv(k, v);
        }
    }
    let kept: Vec<_> = g.tensors().iter().filter(|t| keep(&t.name)).collect();
    for t in &kept {
        w.tensor(&t.name, t.ty, t.shape());
    }
    w.to_bytes(|i, out| out.copy_from_slice(g.tensor_data(kept[i])))
}

/// `key` set to `value`, everything else kept.
fn with(key: &'static str, value: Value) -> impl Fn(&str, &Value) -> Option<Value> {
    move |k, v| Some(if k == key { value.clone() } else { v.clone() })
}

#[test]
fn gptoss_malformed_files_are_typed_errors() {
    use pocket_core::gguf::Array;
    use pocket_core::Error;
    let load = |bytes: Vec<u8>| Model::from_gguf(GgufFile::from_bytes(bytes).unwrap());
    let all = |_: &str| true;
    // Unchanged, the rewrite loads, and every tensor of the file is used.
    let m = load(rewrite(|_, v| Some(v.clone()), all)).unwrap();
    assert!(m.summary().ignored_tensors.is_empty(), "{:?}", m.summary().ignored_tensors);

    let bad_key = |bytes: Vec<u8>, key: &str| match load(bytes) {
        Err(Error::InvalidHyperparameter { key: k, reason }) if k == key => eprintln!("{key}: {reason}"),
        other => panic!("{key}: {:?}", other.err()),
    };
    let window = "gpt-oss.attention.sliding_window";
    bad_key(rewrite(with(window, Value::U32(0)), all), window);
    let kv = "gpt-oss.attention.head_count_kv";
    bad_key(rewrite(with(kv, Value::U32(3)), all), kv);
    bad_key(rewrite(with(kv, Value::Array(Array::I32(vec![2, 2, 0, 2]))), all), kv);
    let used = "gpt-oss.expert_used_count";
    bad_key(rewrite(with(used, Value::U32(9)), all), used);
    let rope = "gpt-oss.rope.scaling.type";
    bad_key(rewrite(with(rope, Value::String("longrope".into())), all), rope);
    let factor = "gpt-oss.rope.scaling.factor";
    bad_key(rewrite(with(factor, Value::F32(-4.0)), all), factor);
    let vlen = "gpt-oss.attention.value_length";
    bad_key(rewrite(with(vlen, Value::U32(32)), all), vlen);
    let ff = "gpt-oss.expert_feed_forward_length";
    bad_key(rewrite(with(ff, Value::Array(Array::I32(vec![64, 64, 32, 64]))), all), ff);

    // A missing key or tensor names itself.
    let err = load(rewrite(|k, v| (k != window).then(|| v.clone()), all)).err().expect("no window");
    assert!(matches!(err, Error::MissingKey(ref k) if k == window), "{err}");
    for gone in [
        "blk.1.attn_sinks.weight",
        "blk.0.post_attention_norm.weight",
        "blk.2.ffn_gate_inp.bias",
        "blk.3.ffn_up_exps.bias",
        "blk.0.ffn_down_exps.bias",
        "blk.1.ffn_gate_exps.weight",
    ] {
        let err = load(rewrite(|_, v| Some(v.clone()), |n| n != gone)).err().expect("missing tensor");
        assert!(matches!(err, Error::MissingTensor(ref t) if t == gone), "{gone}: {err}");
    }
    // Fewer heads than the sinks and the projections have: shape errors.
    let heads = "gpt-oss.attention.head_count";
    let err = load(rewrite(with(heads, Value::U32(4)), all)).err().expect("4 heads for 8");
    assert!(matches!(err, Error::TensorShape { .. }), "{err}");
}
