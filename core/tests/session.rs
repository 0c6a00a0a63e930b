//! Sessions end to end: seeds, stop strings, cancellation, context limits,
//! sliding windows, chat turns that reuse the cache, KV cache types.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use pocket_core::chat::ChatMessage;
use pocket_core::model::{KvType, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{ContextPolicy, GenerateOptions, Session, SessionOptions, StopReason};
use pocket_core::Error;

fn tiny(name: &str) -> Arc<Model> {
    Arc::new(Model::load(common::model_file(name)).unwrap())
}

fn session(model: &Arc<Model>, ctx: usize) -> Session {
    Session::new(model.clone(), SessionOptions { context_length: ctx, threads: 2, ..Default::default() }).unwrap()
}

fn sampled(seed: u64, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler: SamplerConfig { temperature: 0.9, top_k: 50, top_p: 0.95, min_p: 0.0, ..Default::default() },
        seed: Some(seed),
        ignore_eos: true,
        ..Default::default()
    }
}

use common::generate_text as collect;

#[test]
fn same_seed_same_text_other_seed_other_text() {
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let mut s = session(&m, 128);
    let (a, sa) = collect(&mut s, "The capital of France", &sampled(42, 24));
    s.reset();
    let (b, _) = collect(&mut s, "The capital of France", &sampled(42, 24));
    s.reset();
    let (c, _) = collect(&mut s, "The capital of France", &sampled(43, 24));
    assert_eq!(a, b);
    assert_ne!(sa.tokens, s.cached_tokens()[s.cached_tokens().len() - 24..].to_vec(), "seed 43 should differ");
    assert_ne!(a, c);
    assert_eq!(sa.generated_tokens, 24);
    assert_eq!(sa.stop_reason, StopReason::MaxTokens);
    assert_eq!(a, sa.text, "the streamed text is the returned text");
}

#[test]
fn greedy_is_deterministic_and_stats_are_filled() {
    let m = tiny("gemma3-tiny-Q8_0");
    let mut s = session(&m, 64);
    let o = GenerateOptions { max_tokens: 8, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let (a, st) = collect(&mut s, "Hello", &o);
    s.reset();
    let (b, _) = collect(&mut s, "Hello", &o);
    assert_eq!(a, b);
    assert_eq!(st.prompt_tokens, st.prompt_tokens_evaluated);
    assert!(st.time_to_first_token_ms > 0.0 && st.prefill_tokens_per_second > 0.0 && st.decode_tokens_per_second > 0.0);
}

#[test]
fn stop_strings_across_token_boundaries_are_not_emitted() {
    let Some(path) = common::gemma_270m() else { return };
    let m = Arc::new(Model::load(path).unwrap());
    let mut s = session(&m, 128);
    let greedy = GenerateOptions { max_tokens: 16, sampler: SamplerConfig::greedy(), ..Default::default() };
    let (full, _) = collect(&mut s, "The capital of France is", &greedy);
    // A stop string that starts inside one token and ends in another.
    let at = full.find("capital of").expect("the greedy text repeats 'capital'");
    let stop = full[at + 3..at + 10].to_string(); // "ital of"
    s.reset();
    let o = GenerateOptions { stop: vec![stop.clone()], ..greedy };
    let (text, st) = collect(&mut s, "The capital of France is", &o);
    assert_eq!(st.stop_reason, StopReason::StopString);
    assert!(!text.contains(&stop), "{text:?} contains {stop:?}");
    assert_eq!(text, full[..at + 3], "everything before the stop string, nothing after");
}

#[test]
fn cancel_from_another_thread_stops_within_one_token() {
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let mut s = session(&m, 4096);
    let cancel = s.cancel_handle();
    let (tx, rx) = mpsc::channel::<()>();
    let seen = Arc::new(AtomicUsize::new(0));
    let at_cancel = Arc::new(AtomicUsize::new(0));
    let (seen2, at_cancel2) = (seen.clone(), at_cancel.clone());
    let canceller = std::thread::spawn(move || {
        rx.recv().unwrap();
        at_cancel2.store(seen2.load(Ordering::SeqCst), Ordering::SeqCst);
        cancel.cancel();
    });
    let mut text = String::new();
    let st = s
        .generate("Tell me a long story", &sampled(7, 3000), &mut |p| {
            text.push_str(p);
            if seen.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
                tx.send(()).unwrap();
                // Give the other thread time to cancel while this token is "being shown".
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            true
        })
        .unwrap();
    canceller.join().unwrap();
    assert_eq!(st.stop_reason, StopReason::Cancelled);
    let pieces = seen.load(Ordering::SeqCst);
    assert!(
        pieces <= at_cancel.load(Ordering::SeqCst) + 1,
        "{pieces} pieces after cancelling at {}",
        at_cancel.load(Ordering::SeqCst)
    );
    assert!(st.generated_tokens < 3000);
    assert_eq!(st.text, text, "the partial text is returned");
    // The session is usable afterwards.
    let (_, again) = collect(&mut s, "Again", &sampled(1, 4));
    assert_eq!(again.stop_reason, StopReason::MaxTokens);
}

#[test]
fn listener_can_stop_generation() {
    let m = tiny("gemma3-tiny-Q4_K_M");
    let mut s = session(&m, 256);
    let mut n = 0;
    let st = s
        .generate("Once", &sampled(3, 100), &mut |_| {
            n += 1;
            n < 5
        })
        .unwrap();
    assert_eq!(st.stop_reason, StopReason::ListenerStopped);
    assert_eq!(n, 5);
}

#[test]
fn a_full_context_is_a_typed_error() {
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let mut s = session(&m, 32);
    let err = s.generate("The capital of France", &sampled(1, 100), &mut |_| true).unwrap_err();
    assert!(matches!(err, Error::ContextFull { n_ctx: 32 }), "{err:?}");
    // A prompt longer than the context fails up front.
    let long = "word ".repeat(100);
    assert!(matches!(s.generate(&long, &sampled(1, 4), &mut |_| true), Err(Error::ContextFull { .. })));
}

#[test]
fn a_sliding_window_runs_far_past_the_context() {
    for name in ["qwen3moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M", "gemma3-tiny-Q8_0"] {
        let m = tiny(name);
        let opts = SessionOptions {
            context_length: 64,
            threads: 2,
            context_policy: ContextPolicy::Slide { sink: Some(4) },
            ..Default::default()
        };
        let mut s = Session::new(m.clone(), opts).unwrap();
        let (_, st) = collect(&mut s, "The capital of France", &sampled(5, 4 * 64));
        assert_eq!(st.generated_tokens, 256, "{name}");
        assert_eq!(st.stop_reason, StopReason::MaxTokens, "{name}");
        assert!(s.cached_tokens().len() <= 64, "{name}");
    }
}

#[test]
fn a_chat_turn_evaluates_only_its_new_tokens() {
    for name in ["qwen3moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M", "gemma3-tiny-Q8_0"] {
        let m = tiny(name);
        let mut s = session(&m, 512);
        let o = GenerateOptions { max_tokens: 12, ..sampled(9, 12) };
        let mut history = vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hello there")];
        let t1 = s.chat(&history, &o, &mut |_| true).unwrap();
        assert_eq!(t1.prompt_tokens_evaluated, t1.prompt_tokens, "{name}: the first turn evaluates everything");
        history.push(ChatMessage::new("assistant", t1.text.clone()));
        history.push(ChatMessage::new("user", "And then?"));

        let cached_before = s.cached_tokens().to_vec();
        let rendered = m.chat_template().unwrap().render(&history, true, &[]).unwrap();
        let p2 = m.tokenizer().encode(&rendered, false, true).unwrap();
        let common = cached_before.iter().zip(&p2).take_while(|(a, b)| a == b).count();
        let t2 = s.chat(&history, &o, &mut |_| true).unwrap();
        eprintln!(
            "{name}: turn 2 prompt {} tokens, {} evaluated ({} reused)",
            t2.prompt_tokens,
            t2.prompt_tokens_evaluated,
            t2.prompt_tokens - t2.prompt_tokens_evaluated
        );
        assert_eq!(t2.prompt_tokens, p2.len());
        assert!(common >= t1.prompt_tokens, "{name}: the first turn's prompt is a prefix of the second");
        if !m.summary().architecture.starts_with("qwen35") || common == cached_before.len() {
            assert_eq!(t2.prompt_tokens_evaluated, p2.len() - common, "{name}: only the new tokens are evaluated");
        } else {
            // A recurrent state rewinds only to checkpoints (end of the last prompt, end of the
            // last answer): when the sampled answer re-tokenises differently inside the template,
            // the answer is evaluated again from the end of the first prompt.
            assert_eq!(t2.prompt_tokens_evaluated, p2.len() - t1.prompt_tokens, "{name}");
        }
    }
}

#[test]
fn every_kv_cache_type_generates() {
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let greedy =
        GenerateOptions { max_tokens: 6, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let mut texts = Vec::new();
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let mut s = Session::new(
            m.clone(),
            SessionOptions { context_length: 64, kv_type: kv, threads: 1, ..Default::default() },
        )
        .unwrap();
        let (t, st) = collect(&mut s, "The capital of France", &greedy);
        assert_eq!(st.generated_tokens, 6, "{kv:?}");
        texts.push(t);
    }
    // Greedy text of f16 and q8_0 caches stays close to f32's on this model (first tokens equal).
    assert_eq!(texts[0].chars().next(), texts[1].chars().next());
    assert!(s_memory_ordering(&m));
}

/// A q8_0 cache is smaller than f16, which is smaller than f32.
fn s_memory_ordering(m: &Arc<Model>) -> bool {
    let bytes = |kv| {
        Session::new(m.clone(), SessionOptions { context_length: 256, kv_type: kv, threads: 1, ..Default::default() })
            .unwrap()
            .memory_bytes()
    };
    let (a, b, c) = (bytes(KvType::F32), bytes(KvType::F16), bytes(KvType::Q8_0));
    a > b && b > c
}

#[test]
fn a_cancel_before_a_request_does_not_poison_it_and_bad_settings_are_refused() {
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let mut s = session(&m, 128);
    s.cancel_handle().cancel();
    let (_, st) = collect(&mut s, "Hello", &sampled(1, 4));
    assert_eq!((st.stop_reason, st.generated_tokens), (StopReason::MaxTokens, 4));
    // Core refuses out-of-range sampler settings for every caller, naming them.
    for (bad, field) in [
        (SamplerConfig { top_p: 1.5, ..Default::default() }, "top_p"),
        (SamplerConfig { temperature: -1.0, ..Default::default() }, "temperature"),
        (SamplerConfig { min_p: 2.0, ..Default::default() }, "min_p"),
    ] {
        let o = GenerateOptions { sampler: bad, ..sampled(1, 4) };
        let e = s.generate("Hello", &o, &mut |_| true).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains(field)), "{e}");
    }
}

#[test]
fn a_shared_session_queues_requests_and_cancels_the_queued_ones() {
    use pocket_core::session::SharedSession;
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let s = Arc::new(SharedSession::from(session(&m, 4096)));
    let (tx, rx) = mpsc::channel();
    let first = {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            s.generate("Hello", &sampled(1, 3000), &mut |_| {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
                true
            })
        })
    };
    rx.recv().unwrap();
    let queued = {
        let s = s.clone();
        std::thread::spawn(move || s.generate("Hello", &sampled(1, 3000), &mut |_| true))
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    s.cancel();
    assert_eq!(first.join().unwrap().unwrap().stop_reason, StopReason::Cancelled);
    assert_eq!(queued.join().unwrap().unwrap().stop_reason, StopReason::Cancelled);
    let after = s.generate("Hello", &sampled(1, 3), &mut |_| true).unwrap();
    assert_eq!((after.stop_reason, after.generated_tokens), (StopReason::MaxTokens, 3));
    // The session's own listener cannot re-enter it.
    let inner = s.generate("Hi", &sampled(1, 2), &mut |_| {
        assert!(matches!(s.reset(), Err(Error::InvalidArgument(_))));
        false
    });
    assert_eq!(inner.unwrap().stop_reason, StopReason::ListenerStopped);
}
