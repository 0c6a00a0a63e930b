//! Gemma 4 (`gemma4`) against its references (`manifest_gemma4.json`):
//! llama.cpp's logits of every file (as one batch and token by token),
//! transformers' fp32 logits of the exact-weight F16 files, greedy
//! continuations, malformed files, and the per-layer embedding table
//! staying in the mapped file.

mod common;

use common::arrays::{argmax, max_abs_diff, median_kl_and_top1, read_npy};
use pocket_core::gguf::{GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, LoadOptions, Logits, Model};
use pocket_core::threads::ThreadPool;

fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

fn models() -> Vec<serde_json::Value> {
    let m = common::manifest_named("manifest_gemma4.json");
    let models = m["models"].as_array().unwrap().clone();
    assert_eq!(models.len(), 2, "gemma4-moe-tiny and gemma4-e-tiny");
    models
}

#[test]
fn every_gemma4_file_matches_llama_cpp_as_a_batch_and_decoding() {
    let checked: usize = models().iter().map(|m| common::files_match_llama_cpp(m).len()).sum();
    assert_eq!(checked, 6, "F16, Q8_0 and Q4_K_M of both models");
}

/// The exact-weight F16 files against transformers' fp32 logits: our F16
/// products take f32 activations (llama.cpp rounds them to f16 and lands
/// 6.6e-3 / 7.1e-3 from transformers on these files). Measured here:
/// 2.3e-3 (MoE) and 3.6e-3 (E), with an f32 KV cache; the rest most likely
/// comes from the GELU, which we evaluate as ggml does (through an f16
/// table), and from f32 summation order, amplified by attention scale 1.
#[test]
fn gemma4_f16_files_match_transformers() {
    let dir = common::fixtures();
    for m in models() {
        let name = m["name"].as_str().unwrap();
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
            eprintln!("{name} F16 {path} vs transformers fp32: max |Δ| {d:.3e}, median KL {med:.2e}, top-1 {top1}/16");
            assert!(d <= F16_VS_HF, "{name} {path}: max |Δ| {d} > {F16_VS_HF}");
            assert_eq!(top1, 16, "{name} {path}");
        }
    }
}

/// Tolerance of the F16 files against transformers fp32 (see the test).
const F16_VS_HF: f32 = 5e-3;

/// Greedy 32 tokens after the prompt: the F16 files equal transformers' and
/// llama.cpp's continuations; the quantised files are compared with
/// llama.cpp's up to the first step where its choice and ours are within a
/// near-tie of each other (the tiny random models flip there, as llama.cpp
/// flips between its own backends; the README asks not to compare their
/// free-running text beyond that).
#[test]
fn gemma4_greedy_continuations() {
    let dir = common::fixtures();
    let p = pool();
    for m in models() {
        let tokens = common::ids(&m, "prompt");
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
fn malformed_gemma4_files_are_typed_errors() {
    use pocket_core::Error;
    let load = |bytes: Vec<u8>| Model::from_gguf(GgufFile::from_bytes(bytes).unwrap());
    let moe = "models/gemma4-moe-tiny-Q8_0.gguf";
    let e_model = "models/gemma4-e-tiny-Q8_0.gguf";
    // Unchanged, the rewrite loads.
    load(rewrite(moe, |_, v| Some(v.clone()), |_| true)).unwrap();
    // head_count_kv with 2 values for 3 layers.
    let short = |k: &str, v: &Value| {
        Some(if k == "gemma4.attention.head_count_kv" {
            Value::Array(pocket_core::gguf::Array::U32(vec![2, 2]))
        } else {
            v.clone()
        })
    };
    let err = load(rewrite(moe, short, |_| true)).err().expect("short head_count_kv");
    eprintln!("short head_count_kv: {err}");
    assert!(matches!(err, Error::InvalidHyperparameter { ref key, .. } if key == "gemma4.attention.head_count_kv"));
    // A KV-head count that does not divide the heads.
    let odd = |k: &str, v: &Value| {
        Some(if k == "gemma4.attention.head_count_kv" {
            Value::Array(pocket_core::gguf::Array::U32(vec![2, 3, 1]))
        } else {
            v.clone()
        })
    };
    assert!(matches!(load(rewrite(moe, odd, |_| true)), Err(Error::InvalidHyperparameter { .. })));
    // A missing tensor, in either family.
    for (file, gone) in
        [(moe, "blk.1.ffn_gate_up_exps.weight"), (moe, "blk.2.attn_k.weight"), (e_model, "blk.4.proj.weight")]
    {
        let err = load(rewrite(file, |_, v| Some(v.clone()), |n| n != gone)).err().expect("missing tensor");
        eprintln!("without {gone}: {err}");
        assert!(matches!(err, Error::MissingTensor(ref t) if t == gone), "{gone}: {err}");
    }
    // The router scale must have n_embd values; the sliding pattern one per layer.
    let err =
        load(rewrite(e_model, |k, v| (k != "gemma4.attention.sliding_window_pattern").then(|| v.clone()), |_| true))
            .err()
            .expect("no sliding pattern");
    assert!(matches!(err, Error::MissingKey(_)), "{err}");
    // Every layer shared: no cache to read.
    let all_shared =
        |k: &str, v: &Value| Some(if k == "gemma4.attention.shared_kv_layers" { Value::U32(5) } else { v.clone() });
    assert!(matches!(load(rewrite(e_model, all_shared, |_| true)), Err(Error::InvalidHyperparameter { .. })));
}

/// Tensors a text model does not use (an MTP drafter's, a vision tower's)
/// are ignored: the file loads and computes the same logits.
#[test]
fn unused_tensors_are_ignored() {
    let src = "models/gemma4-e-tiny-Q8_0.gguf";
    let g = GgufFile::open(common::fixtures().join(src)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.kv(k, v.clone());
    }
    for t in g.tensors() {
        w.tensor(&t.name, t.ty, t.shape());
    }
    let extra = g.tensor("blk.0.proj.weight").unwrap();
    w.tensor("mtp.blk.0.proj.weight", extra.ty, extra.shape());
    w.tensor("v.blk.0.attn_q.weight", extra.ty, extra.shape());
    let n = g.tensors().len();
    let bytes = w.to_bytes(|i, out| out.copy_from_slice(g.tensor_data(if i < n { &g.tensors()[i] } else { extra })));
    let a = Model::load(common::fixtures().join(src)).unwrap();
    assert!(a.summary().ignored_tensors.is_empty(), "{:?}", a.summary().ignored_tensors);
    let b = Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap();
    // `pocket inspect` lists them.
    assert_eq!(b.summary().ignored_tensors, ["mtp.blk.0.proj.weight", "v.blk.0.attn_q.weight"]);
    let tokens = [2u32, 916, 1635, 1654];
    let (la, _) = common::batch_and_decode_logits(&a, &pool(), &tokens);
    let (lb, _) = common::batch_and_decode_logits(&b, &pool(), &tokens);
    assert_eq!(la, lb);
}

/// The per-layer embedding table stays in the mapped file: a budgeted
/// model keeps every other weight resident but not it, and computes the
/// same logits (it reads the table's rows from the mapping).
#[test]
fn per_layer_table_is_not_resident() {
    let dir = common::fixtures();
    let path = dir.join("models/gemma4-e-tiny-F16.gguf");
    let g = GgufFile::open(&path).unwrap();
    let table = g.tensor("per_layer_token_embd.weight").unwrap().size;
    let weights: u64 = g.tensors().iter().map(|t| t.size).sum();
    let plain = Model::load(&path).unwrap();
    let plan = plain.memory_plan(1 << 30);
    eprintln!(
        "file {} B, weights {weights} B, table {table} B, plan resident {} B",
        g.file_bytes(),
        plan.resident_bytes
    );
    // Resident: the header and every tensor but the table.
    assert!(plan.resident_bytes + table <= g.file_bytes(), "the plan keeps the table resident");
    assert!(plan.resident_bytes >= weights - table, "the plan drops more than the table");

    let opts = LoadOptions { memory_budget: 1 << 30, ..LoadOptions::default() };
    let budgeted = Model::load_with(&path, &opts).unwrap();
    let tokens = common::ids(&models()[1], "prompt");
    let (a, _) = common::batch_and_decode_logits(&plain, &pool(), &tokens);
    let (b, _) = common::batch_and_decode_logits(&budgeted, &pool(), &tokens);
    assert_eq!(a, b, "budgeted logits differ: the table was not read from the mapping");
    let used = budgeted.memory_usage().resident_weights_bytes;
    eprintln!("budgeted: resident weights {used} B");
    assert!(used <= g.file_bytes() - table, "resident {used} B includes the table");
}

/// A Gemma 4 file without a chat template talks in Gemma 4's turns.
#[test]
fn gemma4_without_a_template_uses_gemma4_turns() {
    use pocket_core::chat::ChatMessage;
    let bytes =
        rewrite("models/gemma4-e-tiny-Q8_0.gguf", |k, v| (k != "tokenizer.chat_template").then(|| v.clone()), |_| true);
    let model = Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap();
    let history = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hello!")];
    let text = model.chat_template().unwrap().render(&history, true, &[]).unwrap();
    assert_eq!(text, "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHello!<turn|>\n<|turn>model\n");
}

/// The MoE model reports its routing (3 of 8 experts per token, in every layer).
#[test]
fn gemma4_moe_routing_is_traced() {
    let model = Model::load(common::fixtures().join("models/gemma4-moe-tiny-F16.gguf")).unwrap();
    let mut st = model.new_state(8, KvType::F32).unwrap();
    st.trace = Some(Vec::new());
    model.forward(&pool(), &mut st, &[2, 916, 1635], Logits::Last).unwrap();
    let trace = st.trace.take().unwrap();
    assert_eq!(trace.len(), 3, "one routing per layer");
    for r in &trace {
        assert_eq!(r.experts.len(), 3 * 3);
        for t in r.experts.chunks_exact(3) {
            assert!(t.iter().all(|&e| e < 8) && t[0] != t[1] && t[1] != t[2] && t[0] != t[2], "{t:?}");
        }
    }
}
