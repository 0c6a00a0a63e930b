//! A model under a memory budget computes what the mapped model computes:
//! the same kernels in the same order, the routed experts served from the
//! expert cache instead of the mapping. Budgets at the minimum force
//! evictions every token (and groups of experts within a prompt's layer).

mod common;

use pocket_core::model::{KvType, LoadOptions, Logits, Model};
use pocket_core::threads::ThreadPool;
use pocket_core::Error;

/// Gemma 4's experts are two stacks (gate|up fused, down) where the others have three.
const MOE_FILES: &[&str] = &[
    "qwen3moe-tiny-Q4_K_M",
    "qwen3moe-tiny-Q2_K",
    "qwen35moe-tiny-Q2_K",
    "qwen35moe-tiny-F32",
    "mixtral-tiny-Q8_0",
    "gemma4-moe-tiny-Q4_K_M",
    "gemma4-moe-tiny-Q8_0",
];

use common::model_file as path;

/// Logits of the 16-token prompt as one batch, then of 8 more tokens one at a time.
fn run(model: &Model, tokens: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let pool = ThreadPool::new(2);
    let mut st = model.new_state(64, KvType::F16).unwrap();
    model.forward(&pool, &mut st, tokens, Logits::All).unwrap();
    let batch = st.logits().to_vec();
    let mut steps = Vec::new();
    for &t in tokens.iter().take(8) {
        model.forward(&pool, &mut st, &[t], Logits::Last).unwrap();
        steps.extend_from_slice(st.logits());
    }
    (batch, steps)
}

fn prompt() -> Vec<u32> {
    (0..16).map(|i| 100 + 37 * i).collect()
}

#[test]
fn logits_with_a_budget_equal_logits_without() {
    for name in MOE_FILES {
        let mapped = Model::load(path(name)).unwrap();
        let plan = mapped.memory_plan(0);
        assert!(plan.expert_bytes > 0 && plan.resident_bytes > 0, "{name}: {plan:?}");
        let want = run(&mapped, &prompt());
        // At the minimum the cache holds one token's experts: a 16-token
        // prompt's layer routes to more, so its experts run in groups, and
        // every decoded token evicts.
        // With room for half the experts, the next layer's likely experts
        // are read ahead as well.
        let half = plan.minimum_budget_bytes + plan.expert_bytes / 2;
        for budget in [plan.minimum_budget_bytes, plan.minimum_budget_bytes + 3 * plan.slot_bytes, half] {
            let m = Model::load_with(path(name), &LoadOptions { memory_budget: budget, ..Default::default() }).unwrap();
            assert!(m.memory_plan(budget).cache_slots > 0);
            let got = run(&m, &prompt());
            assert!(got == want, "{name}, budget {budget}: logits differ from the mapped model's");
        }
    }
}

#[test]
fn the_cache_counts_hits_and_misses_and_reads_only_what_misses() {
    let name = "qwen3moe-tiny-Q4_K_M";
    let plan = Model::load(path(name)).unwrap().memory_plan(0);
    // Room for every expert: after the first pass, everything hits.
    let all = plan.minimum_budget_bytes + plan.expert_bytes;
    let m = Model::load_with(path(name), &LoadOptions { memory_budget: all, ..Default::default() }).unwrap();
    let pool = ThreadPool::new(2);
    let mut st = m.new_state(64, KvType::F16).unwrap();
    m.forward(&pool, &mut st, &prompt(), Logits::Last).unwrap();
    let first = st.expert_io();
    assert!(first.misses > 0 && first.bytes_read >= first.misses * (plan.slot_bytes / 2));
    m.forward(&pool, &mut st, &prompt(), Logits::Last).unwrap();
    let second = st.expert_io() - first;
    assert_eq!(second.misses, 0, "the same prompt again reads nothing");
    assert_eq!(second.bytes_read, 0);
    assert_eq!(second.hits, first.hits + first.misses);
}

#[test]
fn a_budget_below_the_minimum_is_refused_with_the_minimum() {
    for name in ["qwen35moe-tiny-Q2_K", "gemma3-tiny-Q8_0"] {
        let plan = Model::load(path(name)).unwrap().memory_plan(0);
        let below = plan.minimum_budget_bytes - 1;
        match Model::load_with(path(name), &LoadOptions { memory_budget: below, ..Default::default() }) {
            Err(Error::OutOfMemory(why)) => {
                assert!(why.contains(&plan.minimum_budget_bytes.to_string()), "{why}")
            }
            Err(e) => panic!("{name}: expected OutOfMemory, got {e}"),
            Ok(_) => panic!("{name}: a budget below the minimum loaded"),
        }
    }
    // A session larger than the budget left for it is refused at creation.
    let name = "qwen35moe-tiny-Q2_K";
    let plan = Model::load(path(name)).unwrap().memory_plan(0);
    let m =
        Model::load_with(path(name), &LoadOptions { memory_budget: plan.minimum_budget_bytes, ..Default::default() })
            .unwrap();
    assert!(m.new_state(4096, KvType::F16).is_ok(), "the default session fits");
    assert!(matches!(m.new_state(1 << 20, KvType::F32), Err(Error::OutOfMemory(_))));
}

#[test]
fn a_file_truncated_under_a_budgeted_model_is_an_io_error_and_recoverable() {
    let name = "qwen3moe-tiny-Q4_K_M";
    let src = path(name);
    let tmp = std::env::temp_dir().join(format!("pocket-budget-{}.gguf", std::process::id()));
    std::fs::copy(&src, &tmp).unwrap();
    let plan = Model::load(&tmp).unwrap().memory_plan(0);
    let m = Model::load_with(&tmp, &LoadOptions { memory_budget: plan.minimum_budget_bytes, ..Default::default() })
        .unwrap();
    let pool = ThreadPool::new(2);
    let mut st = m.new_state(64, KvType::F16).unwrap();
    let bytes = std::fs::read(&tmp).unwrap();
    // Cut the file in the middle of the experts: a miss must fail with Io, not crash.
    let f = std::fs::OpenOptions::new().write(true).open(&tmp).unwrap();
    f.set_len(plan.resident_bytes / 4).unwrap();
    drop(f);
    let e = m.forward(&pool, &mut st, &prompt(), Logits::Last).unwrap_err();
    assert!(matches!(e, Error::Io(_)), "{e}");
    // The file back: the model works again from a cleared state.
    std::fs::write(&tmp, &bytes).unwrap();
    st.clear();
    m.forward(&pool, &mut st, &prompt(), Logits::Last).unwrap();
    std::fs::remove_file(&tmp).ok();
}

#[test]
fn sequences_sharing_a_small_cache_compute_what_the_mapped_model_computes() {
    // Four threads, each its own sequence, over one cache that holds a few
    // tokens' experts: fetches wait for each other's leases, hit experts
    // other sequences are still reading, and evict what others read.
    let name = "qwen35moe-tiny-Q2_K";
    let mapped = Model::load(path(name)).unwrap();
    let plan = mapped.memory_plan(0);
    let prompts: Vec<Vec<u32>> = (0..4).map(|k| (0..16).map(|i| 50 + 11 * k + 29 * i).collect()).collect();
    let want: Vec<_> = prompts.iter().map(|p| run(&mapped, p)).collect();
    let budget = plan.minimum_budget_bytes + 4 * plan.slot_bytes;
    let m = Model::load_with(path(name), &LoadOptions { memory_budget: budget, ..Default::default() }).unwrap();
    std::thread::scope(|s| {
        for (p, w) in prompts.iter().zip(&want) {
            let m = &m;
            s.spawn(move || {
                for _ in 0..3 {
                    assert!(run(m, p) == *w, "a shared cache changed a sequence's logits");
                }
            });
        }
    });
}

#[test]
fn experts_read_ahead_are_counted_and_served_as_hits() {
    // (file, MoE layers x experts): three stacks per expert, and Gemma 4's two.
    for (name, experts) in [("qwen35moe-tiny-Q2_K", 4 * 8), ("gemma4-moe-tiny-Q8_0", 3 * 8)] {
        let plan = Model::load(path(name)).unwrap().memory_plan(0);
        let m = Model::load_with(
            path(name),
            &LoadOptions { memory_budget: plan.minimum_budget_bytes + plan.expert_bytes, ..Default::default() },
        )
        .unwrap();
        let pool = ThreadPool::new(2);
        let mut st = m.new_state(64, KvType::F16).unwrap();
        m.forward(&pool, &mut st, &prompt(), Logits::Last).unwrap();
        let io = st.expert_io();
        assert!(io.prefetched > 0, "{name}: {io:?}");
        // Every expert read, on demand or ahead, was read once: the cache holds them all.
        assert!(io.bytes_read >= (io.misses + io.prefetched) * (plan.slot_bytes / 2), "{name}: {io:?}");
        assert!(io.misses + io.prefetched <= experts, "{name}: {io:?}: more reads than experts");
    }
}
