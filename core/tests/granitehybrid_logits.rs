//! Granite 4.0-H (`granitehybrid`) against its references
//! (`manifest_moe_families.json`): llama.cpp's logits of both files (as one
//! batch and token by token), transformers' fp32 logits of the exact-weight
//! F16 file, greedy continuations, the Mamba2 state through checkpoints and
//! session snapshots, and malformed files.

mod common;

use common::arrays::{argmax, max_abs_diff, median_kl_and_top1, read_npy};
use pocket_core::gguf::{Array, GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions};
use pocket_core::threads::ThreadPool;
use pocket_core::Error;

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

fn granite() -> serde_json::Value {
    common::manifest_model("manifest_moe_families.json", "granitehybrid-tiny")
}

#[test]
fn both_granite_files_match_llama_cpp_as_a_batch_and_decoding() {
    assert_eq!(common::files_match_llama_cpp(&granite()).len(), 2, "F16 and Q8_0");
}

/// The exact-weight F16 file against transformers' fp32 logits (llama.cpp
/// lands 6.8e-3 from them: it rounds activations to f16 in F16 products).
#[test]
fn granite_f16_file_matches_transformers() {
    let (dir, m) = (common::fixtures(), granite());
    let f = m["files"].as_array().unwrap().iter().find(|f| f["type"] == "F16").expect("an F16 file");
    assert_eq!(f["exact_weights"], true);
    let model = Model::load(dir.join(f["gguf"].as_str().unwrap())).unwrap();
    let tokens = common::ids(&m, "prompt");
    let (batch, decode) = common::batch_and_decode_logits(&model, &pool(), &tokens);
    let hf = read_npy(&dir.join(m["hf_logits"].as_str().unwrap()));
    assert_eq!(hf.shape, [tokens.len(), model.n_vocab()]);
    for (path, ours) in [("batch", &batch), ("decode", &decode)] {
        let d = max_abs_diff(ours, &hf.f32);
        let (med, top1) = median_kl_and_top1(&hf.f32, ours, model.n_vocab());
        eprintln!(
            "granitehybrid-tiny F16 {path} vs transformers fp32: max |Δ| {d:.3e}, median KL {med:.2e}, top-1 {top1}/16"
        );
        assert!(d <= 1e-2, "{path}: max |Δ| {d}");
        assert_eq!(top1, 16, "{path}");
    }
}

/// Greedy 32 tokens after the prompt equal llama.cpp's on both files (and
/// transformers' on the F16 file).
#[test]
fn granite_greedy_continuations() {
    let (dir, m, p) = (common::fixtures(), granite(), pool());
    let tokens = common::ids(&m, "prompt");
    for f in m["files"].as_array().unwrap() {
        let file = f["gguf"].as_str().unwrap();
        let model = Model::load(dir.join(file)).unwrap();
        let want = common::ids(f, "llama_greedy32");
        let mut st = model.new_state(tokens.len() + want.len() + 1, KvType::F32).unwrap();
        model.forward(&p, &mut st, &tokens, Logits::Last).unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let next = argmax(st.logits()) as u32;
            got.push(next);
            model.forward(&p, &mut st, &[next], Logits::Last).unwrap();
        }
        assert_eq!(got, want, "{file}: greedy vs llama.cpp");
        if f["type"] == "F16" {
            assert_eq!(got, common::ids(&m, "hf_greedy32"), "{file}: greedy vs transformers");
        }
    }
}

/// A checkpoint taken mid-sequence restores the Mamba2 layer's conv window
/// and scan state: the tokens after it give the same logits again, bit for
/// bit, whether they first ran as one batch or one by one.
#[test]
fn a_checkpoint_restores_the_mamba2_state() {
    let (m, p) = (granite(), pool());
    let model = Model::load(common::model_file("granitehybrid-tiny-Q8_0")).unwrap();
    let tokens = common::ids(&m, "prompt");
    let (head, tail) = tokens.split_at(7);
    let mut st = model.new_state(32, KvType::F32).unwrap();
    assert!(st.is_recurrent());
    model.forward(&p, &mut st, head, Logits::None).unwrap();
    let cp = st.checkpoint().unwrap();
    assert!(cp.bytes() > 0, "the Mamba2 layer's state is copied");
    model.forward(&p, &mut st, tail, Logits::All).unwrap();
    let first = st.logits().to_vec();
    st.restore(&cp).unwrap();
    assert_eq!(st.n_past(), head.len());
    model.forward(&p, &mut st, tail, Logits::All).unwrap();
    assert_eq!(st.logits(), &first[..], "after restoring the checkpoint");
    // A rewind without a checkpoint is refused (the scan state cannot be undone).
    assert!(st.truncate(3).is_err());
}

/// A session saved after a request and restored continues exactly as the
/// uninterrupted one (the second request reuses the cached prefix through
/// the Mamba2 layer's checkpoint in both).
#[test]
fn a_restored_granite_session_continues_identically() {
    let model = std::sync::Arc::new(Model::load(common::model_file("granitehybrid-tiny-F16")).unwrap());
    let opts = || SessionOptions { context_length: 128, threads: 2, kv_type: KvType::F16, ..Default::default() };
    let o =
        GenerateOptions { max_tokens: 12, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let mut a = Session::new(model.clone(), opts()).unwrap();
    let (first, _) = common::generate_text(&mut a, "The capital of France is", &o);
    let mut bytes = Vec::new();
    a.write_snapshot(&mut bytes).unwrap();
    let mut r = &bytes[..];
    let mut b = Session::restore_from(model.clone(), &mut r, bytes.len() as u64, opts()).unwrap();
    assert_eq!(a.cached_tokens(), b.cached_tokens());
    let next = format!("The capital of France is{first} and");
    let (text_a, stats_a) = common::generate_text(&mut a, &next, &o);
    let (text_b, stats_b) = common::generate_text(&mut b, &next, &o);
    eprintln!("first {first:?}; then {text_a:?} ({} of the prompt evaluated)", stats_a.prompt_tokens_evaluated);
    assert_eq!((&text_a, stats_a.tokens), (&text_b, stats_b.tokens));
    assert_eq!(stats_a.prompt_tokens_evaluated, stats_b.prompt_tokens_evaluated);
    assert!(stats_a.prompt_tokens_evaluated < stats_a.prompt_tokens, "the prefix was reused");
    // And equals a fresh session that evaluates the whole prompt.
    let mut fresh = Session::new(model, opts()).unwrap();
    let (text_c, _) = common::generate_text(&mut fresh, &next, &o);
    assert_eq!(text_a, text_c);
}

/// A copy of `src` with its metadata changed by `edit` and the tensors `keep` accepts.
fn rewrite(src: &str, edit: impl Fn(&str, &Value) -> Option<Value>, keep: impl Fn(&str) -> bool) -> Vec<u8> {
    let g = GgufFile::open(common::fixtures().join(src)).unwrap();
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

#[test]
fn malformed_granite_files_are_typed_errors() {
    let src = "models/granitehybrid-tiny-Q8_0.gguf";
    let load = |bytes: Vec<u8>| Model::from_gguf(GgufFile::from_bytes(bytes).unwrap());
    let with = |key: &'static str, value: Value| {
        move |k: &str, v: &Value| Some(if k == key { value.clone() } else { v.clone() })
    };
    // Unchanged, the rewrite loads.
    load(rewrite(src, |_, v| Some(v.clone()), |_| true)).unwrap();
    let bad_key = |bytes: Vec<u8>, key: &str| match load(bytes) {
        Err(Error::InvalidHyperparameter { key: k, reason }) => {
            eprintln!("{k}: {reason}");
            assert_eq!(k, key);
        }
        Err(e) => panic!("{key}: {e}"),
        Ok(_) => panic!("{key}: accepted"),
    };
    // head_count_kv of one value for two layers; heads that do not split over the KV heads.
    let kv = "granitehybrid.attention.head_count_kv";
    bad_key(rewrite(src, with(kv, Value::Array(Array::U32(vec![0]))), |_| true), kv);
    bad_key(
        rewrite(src, with(kv, Value::Array(Array::U32(vec![0, 3]))), |_| true),
        "granitehybrid.attention.head_count",
    );
    // SSM heads that do not split inner_size, groups that do not split the heads, a huge conv.
    let heads = "granitehybrid.ssm.time_step_rank";
    bad_key(rewrite(src, with(heads, Value::U32(7)), |_| true), heads);
    let groups = "granitehybrid.ssm.group_count";
    bad_key(rewrite(src, with(groups, Value::U32(3)), |_| true), groups);
    let conv = "granitehybrid.ssm.conv_kernel";
    bad_key(rewrite(src, with(conv, Value::U32(1000)), |_| true), conv);
    // A logit scale whose inverse overflows.
    let ls = "granitehybrid.logit_scale";
    bad_key(rewrite(src, with(ls, Value::F32(1e-40)), |_| true), ls);
    // d_state that does not match the tensors: a shape error naming the first tensor read.
    let err = load(rewrite(src, with("granitehybrid.ssm.state_size", Value::U32(8)), |_| true)).err().unwrap();
    assert!(matches!(err, Error::TensorShape { ref tensor, .. } if tensor == "blk.0.ssm_conv1d.weight"), "{err}");
    // Missing tensors of either layer kind, and a missing shared expert the keys announce.
    for gone in ["blk.0.ssm_d", "blk.0.ssm_norm.weight", "blk.1.attn_k.weight", "blk.1.ffn_up_shexp.weight"] {
        let err = load(rewrite(src, |_, v| Some(v.clone()), |n| n != gone)).err().expect("missing tensor");
        assert!(matches!(err, Error::MissingTensor(ref t) if t == gone), "{gone}: {err}");
    }
}

/// The routing of both layers is traced: 2 of 4 experts per token.
#[test]
fn granite_routing_is_traced() {
    let model = Model::load(common::model_file("granitehybrid-tiny-F16")).unwrap();
    let mut st = model.new_state(8, KvType::F32).unwrap();
    st.trace = Some(Vec::new());
    model.forward(&pool(), &mut st, &[785, 272, 391], Logits::Last).unwrap();
    let trace = st.trace.take().unwrap();
    assert_eq!(trace.len(), 2, "one routing per layer");
    for r in &trace {
        assert_eq!(r.experts.len(), 3 * 2);
        assert!(r.experts.chunks_exact(2).all(|t| t[0] != t[1] && t.iter().all(|&e| e < 4)), "{r:?}");
    }
}

/// The file's chat template (Granite 4.0's, `templates/ibm-granite-granite-4.0.jinja`)
/// renders as transformers' Jinja does (strings from jinja2 3.1 with
/// transformers' settings), with its default system message when none is
/// given; the role markers tokenize as single special tokens and no BOS is
/// added.
#[test]
fn granite_chat_template_renders() {
    use pocket_core::chat::ChatMessage;
    let model = Model::load(common::model_file("granitehybrid-tiny-Q8_0")).unwrap();
    let file = std::fs::read_to_string(common::fixtures().join("templates/ibm-granite-granite-4.0.jinja")).unwrap();
    assert_eq!(model.file().get_str("tokenizer.chat_template").unwrap(), Some(file.as_str()));
    let t = model.chat_template().unwrap();
    let hello = t.render(&[ChatMessage::new("user", "Hello!")], true, &[]).unwrap();
    assert_eq!(
        hello,
        "<|start_of_role|>system<|end_of_role|>You are a helpful assistant. Please ensure responses are \
         professional, accurate, and safe.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello!<|end_of_text|>\n\
         <|start_of_role|>assistant<|end_of_role|>"
    );
    let turns = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hello!"),
        ChatMessage::new("assistant", "Hi."),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        t.render(&turns, true, &[]).unwrap(),
        "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello!\
         <|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi.<|end_of_text|>\n<|start_of_role|>user\
         <|end_of_role|>Bye<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"
    );
    let ids = model.tokenizer().encode(&hello, true, true).unwrap();
    let (start, end_role, end_text) = (1021, 1022, 1020);
    assert_eq!(ids[0], start, "no BOS before the first role");
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == end_role).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == end_text).count(), 2);
    assert_eq!(ids.last(), Some(&end_role));
}

/// The dense variant (Granite 4.0-H-Micro's FFN) and a MoE without a shared
/// expert, built from the fixture so that they must agree: the dense file's
/// `ffn_gate`/`ffn_up`/`ffn_down` are the shared expert's matrices, the MoE
/// file's four experts are four copies of them (the router's weights sum to
/// one, so the routed sum is that one FFN's output).
#[test]
fn dense_ffn_equals_a_moe_of_identical_experts() {
    let src = common::fixtures().join("models/granitehybrid-tiny-F16.gguf");
    let g = GgufFile::open(&src).unwrap();
    let build = |dense: bool| {
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            let drop = k == "granitehybrid.expert_shared_feed_forward_length"
                || (dense && (k == "granitehybrid.expert_count" || k == "granitehybrid.expert_used_count"));
            if !drop {
                w.kv(k, v.clone());
            }
        }
        // (name, source tensor, copies of it stacked as experts; 0: one plain matrix)
        let mut plan: Vec<(String, String, u64)> = Vec::new();
        for t in g.tensors() {
            let n = &t.name;
            if n.contains("_exps") || n.contains("_shexp") || (dense && n.contains("ffn_gate_inp")) {
                if let Some(stem) = n.strip_suffix("_shexp.weight") {
                    let name = if dense { format!("{stem}.weight") } else { format!("{stem}_exps.weight") };
                    plan.push((name, n.clone(), if dense { 0 } else { 4 }));
                }
                continue;
            }
            plan.push((n.clone(), n.clone(), 0));
        }
        for (name, source, copies) in &plan {
            let t = g.tensor(source).unwrap();
            let mut shape = t.shape().to_vec();
            if *copies > 0 {
                shape.push(*copies);
            }
            w.tensor(name, t.ty, &shape);
        }
        let bytes = w.to_bytes(|i, out| {
            let data = g.tensor_data(g.tensor(&plan[i].1).unwrap());
            out.chunks_exact_mut(data.len()).for_each(|c| c.copy_from_slice(data));
        });
        Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap()
    };
    let (dense, moe) = (build(true), build(false));
    let tokens = common::ids(&granite(), "prompt");
    let (a, a1) = common::batch_and_decode_logits(&dense, &pool(), &tokens);
    let (b, b1) = common::batch_and_decode_logits(&moe, &pool(), &tokens);
    let (d, d1) = (max_abs_diff(&a, &b), max_abs_diff(&a1, &b1));
    eprintln!("dense vs MoE of identical experts: max |Δ| {d:.2e} (batch), {d1:.2e} (decode)");
    assert!(d < 1e-3 && d1 < 1e-3, "{d} {d1}");
    // And neither is the fixture's model (which adds the shared expert to the routed ones).
    let full = Model::load(&src).unwrap();
    let (c, _) = common::batch_and_decode_logits(&full, &pool(), &tokens);
    assert!(max_abs_diff(&a, &c) > 0.1);
}

/// With `--backend gpu` the products run on the GPU and the Mamba2 scan on
/// the CPU (Granite does not record a one-submission decode): the same
/// logits as the CPU's, a checkpoint restoring the scan state. Without an
/// adapter it says why and passes, unless `POCKET_REQUIRE_GPU=1`.
#[cfg(feature = "gpu")]
#[test]
fn granite_on_the_gpu_backend_matches_the_cpu() {
    use pocket_core::model::{BackendKind, LoadOptions};
    let file = common::model_file("granitehybrid-tiny-Q8_0");
    let gpu = match Model::load_with(&file, &LoadOptions { backend: BackendKind::Gpu, ..Default::default() }) {
        Ok(m) => m,
        Err(e @ Error::GpuUnavailable(_)) => {
            assert!(std::env::var("POCKET_REQUIRE_GPU").as_deref() != Ok("1"), "POCKET_REQUIRE_GPU=1 but {e}");
            eprintln!("skipping the GPU test: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let cpu = Model::load(&file).unwrap();
    let tokens = common::ids(&granite(), "prompt");
    let p = pool();
    let run = |model: &Model| {
        let mut st = model.new_state(tokens.len(), KvType::F32).unwrap();
        model.forward(&p, &mut st, &tokens[..8], Logits::All).unwrap();
        let cp = st.checkpoint().unwrap();
        let mut all = st.logits().to_vec();
        for &t in &tokens[8..] {
            model.forward(&p, &mut st, &[t], Logits::Last).unwrap();
            all.extend_from_slice(st.logits());
        }
        st.restore(&cp).unwrap();
        model.forward(&p, &mut st, &tokens[8..], Logits::All).unwrap();
        all.extend_from_slice(st.logits());
        all
    };
    let (want, got) = (run(&cpu), run(&gpu));
    let v = cpu.n_vocab();
    let worst = max_abs_diff(&want, &got);
    let agree = want.chunks(v).zip(got.chunks(v)).filter(|(a, b)| argmax(a) == argmax(b)).count();
    let c = gpu.backend_counters().unwrap();
    eprintln!("granitehybrid-tiny-Q8_0: GPU vs CPU max |Δ| {worst:.2e}, top-1 {agree}/24, {c:?}");
    assert!(c.gpu_products > 0, "nothing ran on the GPU: {c:?}");
    assert!(agree >= 23 && worst < 0.2, "GPU max |Δ| {worst}, top-1 {agree}/24");
}
