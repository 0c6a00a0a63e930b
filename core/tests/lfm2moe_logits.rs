//! LFM2-MoE (`lfm2moe`) against its references (`manifest_moe_families.json`):
//! llama.cpp's logits of the F16 and Q8_0 files (as one batch and token by
//! token), transformers' fp32 logits of the exact-weight F16 file, greedy
//! continuations, the short convolution's window in checkpoints and session
//! snapshots, malformed files, and the LFM2 tokenizer.

mod common;

use common::arrays::{argmax, max_abs_diff, median_kl_and_top1, read_npy};
use pocket_core::gguf::{GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::threads::ThreadPool;

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

/// The manifest's `lfm2moe-tiny` entry.
fn entry() -> serde_json::Value {
    common::manifest_model("manifest_moe_families.json", "lfm2moe-tiny")
}

fn file_of(kind: &str) -> String {
    format!("models/lfm2moe-tiny-{kind}.gguf")
}

fn load(kind: &str) -> Model {
    Model::load(common::fixtures().join(file_of(kind))).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

#[test]
fn lfm2moe_files_match_llama_cpp_as_a_batch_and_decoding() {
    let files = common::files_match_llama_cpp(&entry());
    assert_eq!(files.len(), 2, "F16 and Q8_0");
    for (file, batch, decode) in files {
        let d = max_abs_diff(&batch, &decode);
        eprintln!("{file}: batch vs decode max |Δ| {d:.3e}");
        assert!(d <= 1e-3, "{file}: batch and decode differ by {d}");
    }
}

/// The exact-weight F16 file against transformers' fp32 logits (llama.cpp
/// itself lands 5.9e-3 from them: it rounds activations to f16; measured
/// here 7.7e-6, f32 activations and an f32 KV cache).
#[test]
fn lfm2moe_f16_matches_transformers() {
    let (dir, m) = (common::fixtures(), entry());
    let f = m["files"].as_array().unwrap().iter().find(|f| f["type"] == "F16").expect("an F16 file").clone();
    assert_eq!(f["exact_weights"], true);
    let model = load("F16");
    let tokens = common::ids(&m, "prompt");
    let (batch, decode) = common::batch_and_decode_logits(&model, &pool(), &tokens);
    let hf = read_npy(&dir.join(m["hf_logits"].as_str().unwrap()));
    assert_eq!(hf.shape, [tokens.len(), model.n_vocab()]);
    for (path, ours) in [("batch", &batch), ("decode", &decode)] {
        let d = max_abs_diff(ours, &hf.f32);
        let (med, top1) = median_kl_and_top1(&hf.f32, ours, model.n_vocab());
        eprintln!("F16 {path} vs transformers fp32: max |Δ| {d:.3e}, median KL {med:.2e}, top-1 {top1}/16");
        assert!(d <= 1e-3, "{path}: max |Δ| {d}");
        assert_eq!(top1, 16, "{path}");
    }
}

/// Greedy 32 tokens after the prompt: the F16 file gives transformers' and
/// llama.cpp's continuation; the Q8_0 file llama.cpp's up to the first
/// near-tie (the tiny random model's routes flip there).
#[test]
fn lfm2moe_greedy_continuations() {
    let (m, p) = (entry(), pool());
    let tokens = common::ids(&m, "prompt");
    for f in m["files"].as_array().unwrap() {
        let model = Model::load(common::fixtures().join(f["gguf"].as_str().unwrap())).unwrap();
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
        eprintln!("{}: greedy {same}/32 equal to llama.cpp's (first difference: {first_tie:?})", f["type"]);
        if f["type"] == "F16" {
            assert_eq!(got, want, "greedy vs llama.cpp");
            assert_eq!(got, common::ids(&m, "hf_greedy32"), "greedy vs transformers");
        } else if let Some((step, gap)) = first_tie {
            assert!(gap < 0.1, "step {step} departs from llama.cpp by {gap} logits");
        }
    }
}

/// A checkpoint holds the short convs' windows (2 tokens x 256 channels
/// each, 2 conv layers): turn 1, checkpoint, a detour thrown away, restore,
/// turn 2 gives the logits of one run over both turns.
#[test]
fn lfm2moe_checkpoint_restores_the_conv_windows() {
    let (m, p) = (load("F16"), pool());
    let tokens = common::ids(&entry(), "prompt");
    let (turn1, turn2) = tokens.split_at(9);
    let mut fresh = m.new_state(32, KvType::F32).unwrap();
    m.forward(&p, &mut fresh, &tokens, Logits::Last).unwrap();

    let mut st = m.new_state(32, KvType::F32).unwrap();
    assert!(st.is_recurrent());
    m.forward(&p, &mut st, turn1, Logits::Last).unwrap();
    let cp = st.checkpoint().unwrap();
    assert_eq!(cp.bytes(), 2 * 2 * 256 * 4, "two conv layers' windows");
    m.forward(&p, &mut st, &[7, 8, 9], Logits::Last).unwrap();
    assert!(st.truncate(9).is_err(), "a conv window cannot be rewound without a checkpoint");
    st.restore(&cp).unwrap();
    m.forward(&p, &mut st, turn2, Logits::Last).unwrap();
    let d = max_abs_diff(st.logits(), fresh.logits());
    eprintln!("checkpoint + continue vs one run: max |Δ| {d:.3e}");
    assert!(d <= 1e-5, "{d}");
    // Without the restore, the detour stays in the windows and the cache.
    let mut detoured = m.new_state(32, KvType::F32).unwrap();
    m.forward(&p, &mut detoured, turn1, Logits::Last).unwrap();
    m.forward(&p, &mut detoured, &[7, 8, 9], Logits::Last).unwrap();
    m.forward(&p, &mut detoured, turn2, Logits::Last).unwrap();
    assert!(max_abs_diff(detoured.logits(), fresh.logits()) > 1e-2);
}

/// A session saved after a request and restored elsewhere continues
/// exactly as the one it was saved from (the windows, the KV cache and the
/// checkpoints travel in the snapshot), reusing the saved prefix.
#[test]
fn lfm2moe_session_snapshot_continues_identically() {
    use pocket_core::sampler::SamplerConfig;
    use pocket_core::session::{GenerateOptions, Session, SessionOptions};
    use std::sync::Arc;
    let m = Arc::new(load("Q8_0"));
    let opts = SessionOptions { context_length: 96, kv_type: KvType::F16, threads: 2, seed: 7, ..Default::default() };
    let prompt = common::ids(&entry(), "prompt");
    let greedy =
        GenerateOptions { max_tokens: 6, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let mut a = Session::new(m.clone(), opts.clone()).unwrap();
    let first = a.generate_tokens(&prompt, &greedy, &mut |_| true).unwrap();
    let mut bytes = Vec::new();
    a.write_snapshot(&mut bytes).unwrap();
    let mut r = &bytes[..];
    let mut b = Session::restore_from(m.clone(), &mut r, bytes.len() as u64, opts).unwrap();
    assert_eq!(a.cached_tokens(), b.cached_tokens());

    // Seeded sampling over the context plus two new tokens: any difference
    // in the restored logits would show in the sampled tokens.
    let seeded = GenerateOptions {
        max_tokens: 16,
        sampler: SamplerConfig { temperature: 0.9, top_k: 50, top_p: 0.95, min_p: 0.0, ..Default::default() },
        seed: Some(99),
        ignore_eos: true,
        ..Default::default()
    };
    let mut next: Vec<u32> = prompt.iter().chain(&first.tokens).copied().collect();
    next.extend([285, 11]);
    let sa = a.generate_tokens(&next, &seeded, &mut |_| true).unwrap();
    let sb = b.generate_tokens(&next, &seeded, &mut |_| true).unwrap();
    eprintln!("after the snapshot: {:?} ({} evaluated)", sb.tokens, sb.prompt_tokens_evaluated);
    assert_eq!(sa.tokens, sb.tokens);
    assert_eq!(sa.prompt_tokens_evaluated, sb.prompt_tokens_evaluated);
    assert!(sb.prompt_tokens_evaluated < next.len(), "the restored prefix was evaluated again");
}

/// The prompt as LFM2's tokenizer makes it: BOS `<|startoftext|>` first.
#[test]
fn lfm2moe_tokenizer_adds_bos() {
    let (m, e) = (load("F16"), entry());
    let tok = m.tokenizer();
    assert_eq!((tok.bos(), tok.add_bos()), (Some(1014), true));
    let ids = tok.encode(e["prompt_text"].as_str().unwrap(), true, false).unwrap();
    let want = common::ids(&e, "prompt");
    assert_eq!(ids[..want.len()], want[..]);
}

/// The file's LFM2 template renders a chat with the model's BOS, and its
/// turn markers tokenize to the special ids; `<|im_end|>` ends generation.
#[test]
fn lfm2moe_chat_template_renders_and_tokenizes() {
    use pocket_core::chat::ChatMessage;
    let m = load("F16");
    let t = m.chat_template().unwrap();
    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    let text = t.render(&messages, true, &[]).unwrap();
    assert_eq!(
        text,
        "<|startoftext|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let tok = m.tokenizer();
    let ids = tok.encode(&text, false, true).unwrap();
    assert_eq!(ids[..2], [1014, 1016], "BOS and <|im_start|> as single tokens");
    assert_eq!(ids.iter().filter(|&&i| i == 1017).count(), 2, "two <|im_end|>");
    assert!(tok.is_end_of_generation(1017), "<|im_end|> ends a turn");
}

/// With `--backend gpu` the model runs per operation (LFM2 does not record
/// its layers as one submission; the load logs so): the products and the
/// attention on the device, the short convs and the routing on the CPU,
/// with the CPU's logits. Skipped without a GPU unless `POCKET_REQUIRE_GPU=1`.
#[cfg(feature = "gpu")]
#[test]
fn lfm2moe_gpu_backend_runs_per_operation() {
    use pocket_core::model::{BackendKind, LoadOptions};
    use pocket_core::Error;
    let path = common::fixtures().join(file_of("Q8_0"));
    let gpu = match Model::load_with(&path, &LoadOptions { backend: BackendKind::Gpu, ..Default::default() }) {
        Ok(m) => m,
        Err(e @ Error::GpuUnavailable(_)) if std::env::var("POCKET_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("POCKET_REQUIRE_GPU=1 but {e}")
        }
        Err(Error::GpuUnavailable(e)) => return eprintln!("skipping the GPU test: {e}"),
        Err(e) => panic!("{e}"),
    };
    let cpu = load("Q8_0");
    let tokens = common::ids(&entry(), "prompt");
    let p = pool();
    let (want_b, want_d) = common::batch_and_decode_logits(&cpu, &p, &tokens);
    let (got_b, got_d) = common::batch_and_decode_logits(&gpu, &p, &tokens);
    let c = gpu.backend_counters().unwrap();
    eprintln!("gpu counters: {c:?}");
    assert!(c.gpu_products > 0 && c.gpu_attention > 0, "{c:?}");
    assert_eq!(c.graph_tokens, 0, "no recorded decode");
    let v = cpu.n_vocab();
    for (path, want, got) in [("batch", &want_b, &got_b), ("decode", &want_d, &got_d)] {
        let (med, top1) = median_kl_and_top1(want, got, v);
        let d = max_abs_diff(want, got);
        eprintln!("gpu {path} vs cpu: median KL {med:.2e}, top-1 {top1}/16, max |Δ| {d:.3e}");
        assert!(med <= 1e-3 && top1 >= 15, "{path}");
    }
}

/// A copy of the Q8_0 file with its metadata changed by `edit` and the
/// tensors `keep` accepts.
fn rewrite(edit: impl Fn(&str, &Value) -> Option<Value>, keep: impl Fn(&str) -> bool) -> Vec<u8> {
    let g = GgufFile::open(common::fixtures().join(file_of("Q8_0"))).unwrap();
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
fn lfm2moe_malformed_files_are_typed_errors() {
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
    let kv = "lfm2moe.attention.head_count_kv";
    bad_key(rewrite(with(kv, Value::Array(Array::U32(vec![0, 2]))), all), kv);
    bad_key(rewrite(with(kv, Value::Array(Array::I32(vec![0, 0, 3]))), all), kv);
    bad_key(rewrite(with(kv, Value::Array(Array::I32(vec![0, -1, 2]))), all), kv);
    let l = "lfm2moe.shortconv.l_cache";
    bad_key(rewrite(with(l, Value::U32(1)), all), l);
    bad_key(rewrite(with(l, Value::U32(1 << 30)), all), l);
    let dense = "lfm2moe.leading_dense_block_count";
    bad_key(rewrite(with(dense, Value::U32(4)), all), dense);
    let used = "lfm2moe.expert_used_count";
    bad_key(rewrite(with(used, Value::U32(7)), all), used);
    let gating = "lfm2moe.expert_gating_func";
    bad_key(rewrite(with(gating, Value::U32(9)), all), gating);
    // 6 heads do not split 256 channels.
    bad_key(rewrite(with("lfm2moe.attention.head_count", Value::U32(6)), all), "lfm2moe.attention.head_count");

    // A missing key or tensor names itself.
    let err = load(rewrite(|k, v| (k != l).then(|| v.clone()), all)).err().expect("no l_cache");
    assert!(matches!(err, Error::MissingKey(ref k) if k == l), "{err}");
    for gone in [
        "blk.1.exp_probs_b.bias",
        "blk.2.attn_q_norm.weight",
        "blk.0.shortconv.conv.weight",
        "blk.1.shortconv.in_proj.weight",
        "token_embd_norm.weight",
        "blk.0.ffn_up.weight",
        "blk.2.ffn_down_exps.weight",
    ] {
        let err = load(rewrite(|_, v| Some(v.clone()), |n| n != gone)).err().expect("missing tensor");
        assert!(matches!(err, Error::MissingTensor(ref t) if t == gone), "{gone}: {err}");
    }
    // Taps that do not match l_cache, and a conv layer made attention, are shape errors.
    let err = load(rewrite(with(l, Value::U32(4)), all)).err().expect("4 taps for 3");
    assert!(matches!(err, Error::TensorShape { ref tensor, .. } if tensor == "blk.0.shortconv.conv.weight"), "{err}");
    let err = load(rewrite(with(kv, Value::Array(Array::U32(vec![2, 0, 2]))), all)).err().expect("layer 0 attention");
    assert!(matches!(err, Error::MissingTensor(_) | Error::TensorShape { .. }), "{err}");
}

/// Under a memory budget the experts come from the expert cache and the
/// rest (conv taps, selection biases included) from resident copies: the
/// same logits.
#[test]
fn lfm2moe_runs_under_a_memory_budget() {
    use pocket_core::model::LoadOptions;
    let path = common::fixtures().join(file_of("F16"));
    let plain = load("F16");
    let plan = plain.memory_plan(1 << 30);
    let opts = LoadOptions { memory_budget: plan.minimum_budget_bytes, ..LoadOptions::default() };
    let budgeted = Model::load_with(&path, &opts).unwrap();
    let tokens = common::ids(&entry(), "prompt");
    let (a, _) = common::batch_and_decode_logits(&plain, &pool(), &tokens);
    let (b, _) = common::batch_and_decode_logits(&budgeted, &pool(), &tokens);
    assert_eq!(a, b);
}

/// `pocket quantize` remakes the fixture's Q8_0 file from its F16 file
/// byte for byte, as llama-quantize made it (the conv taps, norms, router
/// and selection biases kept as they are).
#[test]
fn lfm2moe_q8_0_is_remade_byte_for_byte() {
    use pocket_core::quantize::file::{quantize_file, Options};
    use pocket_core::quantize::mix::FileType;
    let dir = std::env::temp_dir().join(format!("pocket-lfm2moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("lfm2moe-tiny-Q8_0.gguf");
    let o = Options { ftype: FileType::from_name("Q8_0").unwrap(), imatrix: None, allow_requantize: false, threads: 2 };
    quantize_file(&common::fixtures().join(file_of("F16")), &out, &o, &mut |_, _, _| {}).unwrap();
    let ours = std::fs::read(&out).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let theirs = std::fs::read(common::fixtures().join(file_of("Q8_0"))).unwrap();
    assert!(ours == theirs, "not the fixture file ({} vs {} bytes)", ours.len(), theirs.len());
}
