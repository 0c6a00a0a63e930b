//! qwen35moe specifics: the chunked delta rule inside a real model, and
//! checkpoints of the hybrid (KV + recurrent) state.

mod common;

use common::arrays::max_abs_diff;
use pocket_core::model::{KvType, Logits, Model};
use pocket_core::threads::ThreadPool;

fn model(kind: &str) -> Model {
    Model::load(common::fixtures().join(format!("models/qwen35moe-tiny-{kind}.gguf"))).unwrap()
}

/// A prompt long enough for the chunked prefill path (>= 32 tokens, > 1 chunk of 64 not needed).
fn long_prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 977 + 13) % 4000).collect()
}

#[test]
fn chunked_prefill_equals_token_by_token_decode() {
    let m = model("F32");
    let pool = ThreadPool::new(2);
    let tokens = long_prompt(80); // chunks of 64 + 16
    let mut batch = m.new_state(128, KvType::F32).unwrap();
    m.forward(&pool, &mut batch, &tokens, Logits::All).unwrap();
    let v = m.n_vocab();
    let mut st = m.new_state(128, KvType::F32).unwrap();
    let mut worst = 0f32;
    for (i, &t) in tokens.iter().enumerate() {
        m.forward(&pool, &mut st, &[t], Logits::Last).unwrap();
        worst = worst.max(max_abs_diff(st.logits(), &batch.logits()[i * v..(i + 1) * v]));
    }
    eprintln!("chunked prefill vs sequential decode: max |Δ| = {worst:.3e}");
    assert!(worst <= 1e-4, "{worst}");
}

#[test]
fn checkpoint_then_continue_equals_a_fresh_run() {
    let m = model("F32");
    let pool = ThreadPool::new(2);
    let tokens = long_prompt(40);
    let (turn1, turn2) = tokens.split_at(24);

    // Fresh: the whole sequence at once.
    let mut fresh = m.new_state(64, KvType::F32).unwrap();
    m.forward(&pool, &mut fresh, &tokens, Logits::Last).unwrap();

    // Turn 1, checkpoint, a detour the user throws away, restore, turn 2.
    let mut st = m.new_state(64, KvType::F32).unwrap();
    m.forward(&pool, &mut st, turn1, Logits::Last).unwrap();
    let cp = st.checkpoint().unwrap();
    eprintln!("checkpoint at {} tokens holds {} bytes", cp.n_past(), cp.bytes());
    assert!(cp.bytes() > 0);
    m.forward(&pool, &mut st, &[7, 8, 9], Logits::Last).unwrap();
    st.restore(&cp).unwrap();
    assert_eq!(st.n_past(), 24);
    m.forward(&pool, &mut st, turn2, Logits::Last).unwrap();

    let d = max_abs_diff(st.logits(), fresh.logits());
    eprintln!("checkpoint + continue vs fresh: max |Δ| = {d:.3e}");
    assert!(d <= 1e-5, "{d}");
}

#[test]
fn a_checkpoint_taken_into_an_older_one_restores_the_newer_position() {
    // checkpoint_into reuses an earlier checkpoint's memory (speculation
    // takes one before every verify pass): restoring it is restoring a fresh one.
    let m = model("F32");
    let pool = ThreadPool::new(2);
    let tokens = long_prompt(40);
    let mut a = m.new_state(64, KvType::F32).unwrap();
    m.forward(&pool, &mut a, &tokens[..8], Logits::Last).unwrap();
    let mut reused = a.checkpoint().unwrap();
    m.forward(&pool, &mut a, &tokens[8..24], Logits::Last).unwrap();
    a.checkpoint_into(&mut reused).unwrap();
    let fresh = a.checkpoint().unwrap();
    assert_eq!((reused.n_past(), reused.bytes()), (fresh.n_past(), fresh.bytes()));
    m.forward(&pool, &mut a, &[7, 8, 9], Logits::Last).unwrap();
    a.restore(&reused).unwrap();
    m.forward(&pool, &mut a, &tokens[24..], Logits::Last).unwrap();
    // The same with a checkpoint taken fresh at 24 tokens.
    let mut b = m.new_state(64, KvType::F32).unwrap();
    m.forward(&pool, &mut b, &tokens[..8], Logits::Last).unwrap();
    m.forward(&pool, &mut b, &tokens[8..24], Logits::Last).unwrap();
    let cp = b.checkpoint().unwrap();
    m.forward(&pool, &mut b, &[7, 8, 9], Logits::Last).unwrap();
    b.restore(&cp).unwrap();
    m.forward(&pool, &mut b, &tokens[24..], Logits::Last).unwrap();
    assert_eq!(a.logits(), b.logits(), "restoring the reused checkpoint differs from a fresh one's");
}

#[test]
fn stale_checkpoints_and_rewinds_are_refused() {
    let m = model("Q4_K_M");
    let pool = ThreadPool::new(1);
    let mut st = m.new_state(32, KvType::F16).unwrap();
    m.forward(&pool, &mut st, &[1, 2, 3, 4], Logits::None).unwrap();
    let early = st.checkpoint().unwrap();
    m.forward(&pool, &mut st, &[5, 6], Logits::None).unwrap();
    let late = st.checkpoint().unwrap();
    // A recurrent state cannot simply be truncated.
    assert!(st.truncate(2).is_err());
    // Back to 4 tokens, then overwrite positions 4.. : the later checkpoint is gone.
    st.restore(&early).unwrap();
    m.forward(&pool, &mut st, &[9, 9, 9], Logits::None).unwrap();
    assert!(st.restore(&late).is_err());
    // The earlier one still holds.
    st.restore(&early).unwrap();
    assert_eq!(st.n_past(), 4);
}

#[test]
fn pure_attention_models_checkpoint_for_free() {
    let m = Model::load(common::fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf")).unwrap();
    let pool = ThreadPool::new(1);
    let mut st = m.new_state(16, KvType::F16).unwrap();
    m.forward(&pool, &mut st, &[1, 2, 3], Logits::None).unwrap();
    let cp = st.checkpoint().unwrap();
    assert_eq!(cp.bytes(), 0);
    st.truncate(1).unwrap();
    assert_eq!(st.n_past(), 1);
    assert!(st.restore(&cp).is_ok(), "nothing was rewritten yet");
}

/// Every parallel section claims its pieces from a counter, so which thread
/// runs a piece changes with timing; what a piece computes must not. A
/// worker slowed before each piece it takes (a phone's little core) leaves
/// its pieces to the others: the logits are the same, bit for bit, as the
/// same pool's without it (prompt: chunked delta rule, attention over every
/// token, tiled over an f16 cache; then decode).
#[test]
fn a_slow_worker_changes_no_bit() {
    let tokens = long_prompt(80);
    let logits = |m: &Model, pool: &ThreadPool, kv: KvType| {
        let mut st = m.new_state(128, kv).unwrap();
        m.forward(pool, &mut st, &tokens, Logits::All).unwrap();
        let mut all: Vec<u32> = st.logits().iter().map(|x| x.to_bits()).collect();
        for t in [5, 77, 901] {
            m.forward(pool, &mut st, &[t], Logits::Last).unwrap();
            all.extend(st.logits().iter().map(|x| x.to_bits()));
        }
        all
    };
    for kind in ["F32", "Q4_K_M"] {
        let m = model(kind);
        for kv in [KvType::F32, KvType::F16] {
            let want = logits(&m, &ThreadPool::with_slow_worker(3, 0), kv);
            for spin_us in [20, 300] {
                let got = logits(&m, &ThreadPool::with_slow_worker(3, spin_us), kv);
                assert!(got == want, "{kind}, {kv:?} cache, worker slowed by {spin_us} us");
            }
        }
    }
}
