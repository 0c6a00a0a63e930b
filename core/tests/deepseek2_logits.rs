//! DeepSeek-V2/V3 (`deepseek2`) against its references
//! (`manifest_moe_families.json`, `deepseek2-tiny`): llama.cpp's logits of
//! both files (as one batch and token by token), transformers' fp32 logits
//! of the exact-weight F16 file, greedy continuations, a session restored
//! from a snapshot, and malformed files.

mod common;

use std::sync::Arc;

use common::arrays::{argmax, max_abs_diff, median_kl_and_top1, read_npy};
use pocket_core::gguf::{GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions};
use pocket_core::threads::ThreadPool;
use pocket_core::Error;

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

fn model_entry() -> serde_json::Value {
    common::manifest_model("manifest_moe_families.json", "deepseek2-tiny")
}

#[test]
fn both_deepseek2_files_match_llama_cpp_as_a_batch_and_decoding() {
    assert_eq!(common::files_match_llama_cpp(&model_entry()).len(), 2, "F16 and Q8_0");
}

/// The exact-weight F16 file against transformers' fp32 logits (llama.cpp
/// lands 6.7e-3 from them on this file).
#[test]
fn deepseek2_f16_file_matches_transformers() {
    let dir = common::fixtures();
    let m = model_entry();
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
            "deepseek2-tiny F16 {path} vs transformers fp32: max |Δ| {d:.3e}, median KL {med:.2e}, top-1 {top1}/16"
        );
        assert!(d <= 1e-2, "{path}: max |Δ| {d}");
        assert_eq!(top1, 16, "{path}");
    }
}

/// With the default f16 latent cache the logits stay as close to llama.cpp's.
#[test]
fn an_f16_latent_cache_keeps_the_logits() {
    let dir = common::fixtures();
    let m = model_entry();
    let f = &m["files"][0];
    let model = Model::load(dir.join(f["gguf"].as_str().unwrap())).unwrap();
    let tokens = common::ids(&m, "prompt");
    let mut st = model.new_state(tokens.len(), KvType::F16).unwrap();
    model.forward(&pool(), &mut st, &tokens, Logits::All).unwrap();
    let reference = read_npy(&dir.join(f["llama_logits"].as_str().unwrap()));
    let (med, top1) = median_kl_and_top1(&reference.f32, st.logits(), model.n_vocab());
    eprintln!("f16 latent cache: median KL {med:.2e}, top-1 {top1}/16 vs llama.cpp");
    assert!(med <= 5e-3 && top1 >= 12, "median KL {med}, top-1 {top1}");
}

/// Greedy 32 tokens after the prompt: the F16 file equals transformers' and
/// llama.cpp's continuations; the Q8_0 file follows llama.cpp's up to the
/// first near-tie between its choice and ours.
#[test]
fn deepseek2_greedy_continuations() {
    let dir = common::fixtures();
    let m = model_entry();
    let tokens = common::ids(&m, "prompt");
    let p = pool();
    for f in m["files"].as_array().unwrap() {
        let file = f["gguf"].as_str().unwrap();
        let model = Model::load(dir.join(file)).unwrap();
        let want = common::ids(f, "llama_greedy32");
        let mut st = model.new_state(tokens.len() + want.len() + 1, KvType::F32).unwrap();
        model.forward(&p, &mut st, &tokens, Logits::Last).unwrap();
        let (mut got, mut first_tie) = (Vec::new(), None);
        for (i, &w) in want.iter().enumerate() {
            let row = st.logits();
            let next = argmax(row) as u32;
            if next != w && first_tie.is_none() {
                first_tie = Some((i, row[next as usize] - row[w as usize]));
            }
            got.push(next);
            model.forward(&p, &mut st, &[next], Logits::Last).unwrap();
        }
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!("{file}: greedy {same}/32 equal to llama.cpp's (first difference: {first_tie:?})");
        if f["type"] == "F16" {
            assert_eq!(got, want, "{file}: greedy vs llama.cpp");
            assert_eq!(got, common::ids(&m, "hf_greedy32"), "{file}: greedy vs transformers");
        } else if let Some((step, gap)) = first_tie {
            assert!(gap < 0.1, "{file}: step {step} departs from llama.cpp by {gap} logits");
        }
    }
}

/// The MoE layers (1 and 2) report their routing: 3 distinct experts per
/// token, all from 2 of the 3 groups of 4.
#[test]
fn deepseek2_routing_stays_in_the_best_groups() {
    let model = Model::load(common::fixtures().join("models/deepseek2-tiny-F16.gguf")).unwrap();
    let tokens = common::ids(&model_entry(), "prompt");
    let mut st = model.new_state(tokens.len(), KvType::F32).unwrap();
    st.trace = Some(Vec::new());
    model.forward(&pool(), &mut st, &tokens, Logits::Last).unwrap();
    let trace = st.trace.take().unwrap();
    assert_eq!(trace.len(), 2, "one routing per MoE layer");
    for r in &trace {
        assert_eq!(r.experts.len(), 3 * tokens.len());
        for t in r.experts.chunks_exact(3) {
            assert!(t.iter().all(|&e| e < 12) && t[0] != t[1] && t[1] != t[2] && t[0] != t[2], "{t:?}");
            let mut groups: Vec<u32> = t.iter().map(|e| e / 4).collect();
            groups.dedup();
            groups.sort();
            groups.dedup();
            assert!(groups.len() <= 2, "{t:?} spans {groups:?}");
        }
    }
}

/// A session saved mid-conversation and restored into a fresh session
/// continues exactly as the uninterrupted one, with each latent-cache precision.
#[test]
fn a_restored_deepseek2_session_continues_identically() {
    let model = Arc::new(Model::load(common::fixtures().join("models/deepseek2-tiny-Q8_0.gguf")).unwrap());
    let dir = std::env::temp_dir().join(format!("pocket-deepseek2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let greedy =
        GenerateOptions { max_tokens: 12, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let opts = SessionOptions { context_length: 128, kv_type: kv, threads: 2, seed: 7, ..Default::default() };
        let mut s = Session::new(model.clone(), opts.clone()).unwrap();
        let a = s.generate("The capital of France is", &greedy, &mut |_| true).unwrap();
        let path = dir.join(format!("{}.snap", kv.name()));
        s.save(&path).unwrap();
        let next = format!("The capital of France is{} and then", a.text);
        let b = s.generate(&next, &greedy, &mut |_| true).unwrap();
        assert!(b.prompt_tokens_evaluated < b.prompt_tokens, "{}: the second request reuses the first's", kv.name());
        let mut r = Session::restore(model.clone(), &path, opts).unwrap();
        let c = r.generate(&next, &greedy, &mut |_| true).unwrap();
        eprintln!("{} cache: {:?} / restored {:?}", kv.name(), b.text, c.text);
        assert_eq!((&b.text, &b.tokens, b.prompt_tokens_evaluated), (&c.text, &c.tokens, c.prompt_tokens_evaluated));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of `src` with its metadata changed by `edit` and the tensors
/// `keep` accepts.
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
fn malformed_deepseek2_files_are_typed_errors() {
    let load = |bytes: Vec<u8>| Model::from_gguf(GgufFile::from_bytes(bytes).unwrap());
    let src = "models/deepseek2-tiny-Q8_0.gguf";
    let with = |key: &str, value: Value| {
        let key = key.to_string();
        rewrite(src, move |k, v| Some(if k == key { value.clone() } else { v.clone() }), |_| true)
    };
    load(rewrite(src, |_, v| Some(v.clone()), |_| true)).unwrap();
    let bad_key = |key: &str, value: Value| {
        let err = load(with(key, value)).err().expect(key);
        eprintln!("{key}: {err}");
        assert!(matches!(err, Error::InvalidHyperparameter { .. }), "{key}: {err}");
    };
    // 12 experts do not fall into 5 groups; 4 (or none) of 3 groups cannot be used.
    bad_key("deepseek2.expert_group_count", Value::U32(5));
    bad_key("deepseek2.expert_group_used_count", Value::U32(4));
    bad_key("deepseek2.expert_group_used_count", Value::U32(0));
    // More rotary dims than the head has; an unknown RoPE scaling; more dense layers than layers.
    bad_key("deepseek2.rope.dimension_count", Value::U32(48));
    bad_key("deepseek2.rope.scaling.type", Value::String("longrope".into()));
    bad_key("deepseek2.leading_dense_block_count", Value::U32(4));
    // A wrong latent rank shows in the tensors' shapes.
    let err = load(with("deepseek2.attention.kv_lora_rank", Value::U32(32))).err().unwrap();
    assert!(matches!(err, Error::TensorShape { .. }), "{err}");
    // No q LoRA rank: the query is projected directly, and attn_q is missing.
    let err =
        load(rewrite(src, |k, v| (k != "deepseek2.attention.q_lora_rank").then(|| v.clone()), |_| true)).err().unwrap();
    assert!(matches!(err, Error::MissingTensor(ref t) if t == "blk.0.attn_q.weight"), "{err}");
    for gone in ["blk.1.attn_k_b.weight", "blk.2.exp_probs_b.bias", "blk.2.ffn_up_shexp.weight"] {
        let bytes = rewrite(src, |_, v| Some(v.clone()), |n| n != gone);
        match load(bytes) {
            // The selection bias is optional (DeepSeek-V2 has none).
            Ok(_) => assert_eq!(gone, "blk.2.exp_probs_b.bias"),
            Err(err) => assert!(matches!(err, Error::MissingTensor(ref t) if t == gone), "{gone}: {err}"),
        }
    }
}

/// The file's DeepSeek-V3.1 template renders as jinja2 renders it (the
/// expected strings are jinja2 3.1's output for the same template and
/// messages), thinking off by default and on when asked.
#[test]
fn deepseek2_chat_template_renders() {
    use pocket_core::chat::ChatMessage;
    let model = Model::load(common::fixtures().join("models/deepseek2-tiny-Q8_0.gguf")).unwrap();
    let t = model.chat_template().unwrap();
    let first = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hello!")];
    assert_eq!(
        t.render(&first, true, &[]).unwrap(),
        "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hello!<｜Assistant｜><think></think>"
    );
    let mut history = first.to_vec();
    history.push(ChatMessage::new("assistant", "<think>hm</think>Hi there."));
    history.push(ChatMessage::new("user", "Who are you?"));
    let turns = "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hello!<｜Assistant｜><think></think>Hi there.\
                 <｜end▁of▁sentence｜><｜User｜>Who are you?<｜Assistant｜>";
    assert_eq!(t.render(&history, true, &[]).unwrap(), format!("{turns}<think></think>"));
    let thinking = [("thinking".to_string(), serde_json::json!(true))];
    assert_eq!(t.render(&history, true, &thinking).unwrap(), format!("{turns}<think>"));
    // The turns' markers are single tokens of the vocabulary, BOS first.
    let tok = model.tokenizer();
    for marker in ["<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
    {
        assert_eq!(tok.encode(marker, false, true).unwrap().len(), 1, "{marker}");
    }
    let ids = tok.encode(&t.render(&first, true, &[]).unwrap(), false, true).unwrap();
    assert_eq!(ids[0], 1009, "BOS");
}

/// A file without q LoRA (DeepSeek-V2-Lite: `attn_q` projects the query
/// directly) loads and runs, as a batch as token by token. Its `attn_q` is
/// made from the first rows of the F16 file's embedding table; the logits
/// must differ from the q-LoRA file's (the query changed) and agree
/// between batch and decode.
#[test]
fn a_file_without_q_lora_projects_the_query_directly() {
    let src = "models/deepseek2-tiny-F16.gguf";
    let g = GgufFile::open(common::fixtures().join(src)).unwrap();
    let embd = g.tensor("token_embd.weight").unwrap();
    let q_bytes = 192 * 256 * 2; // [256, 192] F16
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "deepseek2.attention.q_lora_rank" {
            w.kv(k, v.clone());
        }
    }
    let kept: Vec<_> = g.tensors().iter().filter(|t| !t.name.contains(".attn_q_")).collect();
    for t in &kept {
        w.tensor(&t.name, t.ty, t.shape());
    }
    for il in 0..3 {
        w.tensor(&format!("blk.{il}.attn_q.weight"), embd.ty, &[256, 192]);
    }
    let bytes = w.to_bytes(|i, out| match kept.get(i) {
        Some(t) => out.copy_from_slice(g.tensor_data(t)),
        None => out.copy_from_slice(&g.tensor_data(embd)[..q_bytes]),
    });
    let lite = Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap();
    let lora = Model::load(common::fixtures().join(src)).unwrap();
    let tokens = common::ids(&model_entry(), "prompt");
    let (batch, decode) = common::batch_and_decode_logits(&lite, &pool(), &tokens);
    assert!(batch.iter().all(|v| v.is_finite()));
    let d = max_abs_diff(&batch, &decode);
    assert!(d < 1e-4, "batch vs decode: {d}");
    let (with_lora, _) = common::batch_and_decode_logits(&lora, &pool(), &tokens);
    let apart = max_abs_diff(&batch, &with_lora);
    eprintln!("without q LoRA: batch vs decode {d:.2e}; {apart:.2e} from the q-LoRA file");
    assert!(apart > 1e-2, "the direct query changed nothing ({apart})");
}

/// The latent cache is what the memory plan counts: 80 values (latent 64 +
/// rotary key 16) per position and layer, in f16 by default; under the
/// smallest budget the plan allows (routed experts read through the expert
/// cache) the logits are the mapped model's.
#[test]
fn the_memory_plan_counts_the_latent_cache_and_a_budget_keeps_the_logits() {
    use pocket_core::model::{default_context, LoadOptions};
    let path = common::fixtures().join("models/deepseek2-tiny-Q8_0.gguf");
    let model = Model::load(&path).unwrap();
    let n_ctx = default_context(Some(512));
    for (kv, bytes) in [(KvType::F16, 2), (KvType::F32, 4), (KvType::Q8_0, 2)] {
        let st = model.new_state(n_ctx, kv).unwrap();
        assert_eq!(st.cache_bytes(), 3 * n_ctx * 80 * bytes, "{}", kv.name());
    }
    let plan = model.memory_plan(0);
    let f16_state = (3 * n_ctx * 80 * 2) as u64;
    // The plan's session: the f16 state and a fixed scratch allowance (160 MiB).
    assert_eq!(plan.session_bytes, f16_state + (160 << 20));

    let tokens = common::ids(&model_entry(), "prompt");
    let (mapped_batch, mapped_decode) = common::batch_and_decode_logits(&model, &pool(), &tokens);
    let opts = LoadOptions { memory_budget: plan.minimum_budget_bytes, ..Default::default() };
    let budgeted = Model::load_with(&path, &opts).unwrap();
    let (batch, decode) = common::batch_and_decode_logits(&budgeted, &pool(), &tokens);
    assert_eq!(max_abs_diff(&batch, &mapped_batch), 0.0, "batch under a budget");
    assert_eq!(max_abs_diff(&decode, &mapped_decode), 0.0, "decode under a budget");
}
