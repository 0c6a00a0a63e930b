//! A memory budget changed while the model runs (`Model::set_memory_budget`),
//! from another thread: the expert cache shrinks and grows, a model loaded
//! without a budget takes one, `0` returns it to the mapping, and the text
//! a greedy generation writes is the unbudgeted model's, token for token.
//! `Model::memory_usage` follows each change.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pocket_core::model::{KvType, LoadOptions, Logits, MemoryPlan, MemoryUsage, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions};
use pocket_core::threads::ThreadPool;
use pocket_core::Error;

const MOE_FILES: &[&str] = &["qwen35moe-tiny-Q2_K", "qwen3moe-tiny-Q4_K_M", "mixtral-tiny-Q8_0"];

use common::model_file as path;

fn load(name: &str, budget: u64) -> Arc<Model> {
    Arc::new(Model::load_with(path(name), &LoadOptions { memory_budget: budget, ..Default::default() }).unwrap())
}

const PROMPT: &str = "The quick brown fox jumps over the lazy dog, and then";
const TOKENS: usize = 40;

fn greedy() -> GenerateOptions {
    GenerateOptions {
        max_tokens: TOKENS,
        sampler: SamplerConfig { temperature: 0.0, ..SamplerConfig::default() },
        ignore_eos: true,
        ..GenerateOptions::default()
    }
}

fn session(model: &Arc<Model>) -> Session {
    let opts = SessionOptions { context_length: 256, threads: 2, ..SessionOptions::default() };
    Session::new(Arc::clone(model), opts).unwrap()
}

/// Budgets of interest for a model: its minimum, room for a few more
/// experts, for half of them, for all of them.
struct Budgets {
    plan: MemoryPlan,
    min: u64,
    few: u64,
    half: u64,
    all: u64,
}

fn budgets(name: &str) -> Budgets {
    let plan = Model::load(path(name)).unwrap().memory_plan(0);
    let min = plan.minimum_budget_bytes;
    Budgets {
        plan,
        min,
        few: min + 3 * plan.slot_bytes,
        half: min + plan.expert_bytes / 2,
        all: min + plan.expert_bytes,
    }
}

/// What the other thread saw around one change.
#[derive(Debug)]
struct Seen {
    budget: u64,
    before: MemoryUsage,
    after: MemoryUsage,
    reported: u64,
}

/// Generate greedily on this thread; after the `k`-th piece of each
/// `(k, budget)`, another thread sets that budget while this one waits
/// (the change falls between two tokens, as an app's would). Returns the
/// tokens and what the other thread saw.
fn generate_with_changes(model: &Arc<Model>, changes: &[(usize, u64)]) -> (Vec<u32>, Vec<Seen>) {
    let pieces = AtomicUsize::new(0);
    let applied = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let seen = Mutex::new(Vec::new());
    let tokens = std::thread::scope(|s| {
        s.spawn(|| {
            for (i, &(k, budget)) in changes.iter().enumerate() {
                while pieces.load(Ordering::Acquire) < k && !done.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                let before = model.memory_usage();
                model.set_memory_budget(budget).unwrap();
                let after = model.memory_usage();
                seen.lock().unwrap().push(Seen { budget, before, after, reported: model.memory_budget() });
                applied.store(i + 1, Ordering::Release);
            }
        });
        let mut sess = session(model);
        let stats = sess
            .generate(PROMPT, &greedy(), &mut |_| {
                let n = pieces.fetch_add(1, Ordering::AcqRel) + 1;
                // Wait for the change due at this piece (the other thread makes it).
                let due = changes.iter().take_while(|&&(k, _)| k <= n).count();
                while applied.load(Ordering::Acquire) < due {
                    std::thread::sleep(Duration::from_micros(100));
                }
                true
            })
            .unwrap();
        done.store(true, Ordering::Release);
        stats.tokens
    });
    (tokens, seen.into_inner().unwrap())
}

fn unbudgeted_tokens(name: &str) -> Vec<u32> {
    let model = load(name, 0);
    let tokens = session(&model).generate(PROMPT, &greedy(), &mut |_| true).unwrap().tokens;
    assert_eq!(tokens.len(), TOKENS);
    tokens
}

/// What each change must show: the budget reported back, the cache within
/// the new plan once the call returns (a shrink frees before it returns),
/// the resident weights owned under a budget.
fn check_seen(name: &str, b: &Budgets, model: &Model, seen: &[Seen]) {
    for s in seen {
        assert_eq!(s.reported, s.budget, "{name}: memory_budget() after set_memory_budget({})", s.budget);
        if s.budget == 0 {
            assert_eq!(s.after.expert_cache_bytes, 0, "{name}: no cache without a budget: {s:?}");
        } else {
            let plan = model.memory_plan(s.budget);
            assert!(s.after.expert_cache_bytes <= plan.cache_bytes, "{name}: cache over its plan: {s:?} {plan:?}");
            assert_eq!(s.after.resident_weights_bytes, b.plan.resident_bytes, "{name}: {s:?}");
        }
        assert!(s.after.kv_cache_bytes > 0 && s.after.scratch_bytes > 0, "{name}: the session counted: {s:?}");
    }
}

#[test]
fn greedy_text_is_the_unbudgeted_text_while_the_budget_changes_from_another_thread() {
    for name in MOE_FILES {
        let want = unbudgeted_tokens(name);
        let b = budgets(name);

        // Loaded without a budget: takes one, shrinks, grows, returns to the
        // mapping, takes one again.
        let model = load(name, 0);
        let changes = [(3, b.half), (9, b.min), (15, b.all), (21, 0), (27, b.few), (33, b.half)];
        let (got, seen) = generate_with_changes(&model, &changes);
        assert_eq!(got, want, "{name}: the text changed with the budget");
        assert_eq!(seen.len(), changes.len());
        check_seen(name, &b, &model, &seen);
        // The shrink to the minimum gave memory back; the growth after it
        // filled more than the minimum's cache holds.
        assert!(seen[1].after.expert_cache_bytes < seen[1].before.expert_cache_bytes, "{name}: {:?}", seen[1]);
        assert!(seen[2].before.expert_cache_bytes <= b.plan.cache_bytes.max(model.memory_plan(b.min).cache_bytes));
        assert!(seen[3].before.expert_cache_bytes > model.memory_plan(b.min).cache_bytes, "{name}: {:?}", seen[3]);

        // Loaded with a budget: shrinks to the minimum, leaves for the
        // mapping, comes back.
        let model = load(name, b.all);
        let changes = [(5, b.min), (15, 0), (25, b.half)];
        let (got, seen) = generate_with_changes(&model, &changes);
        assert_eq!(got, want, "{name}: the text changed with the budget (loaded with one)");
        check_seen(name, &b, &model, &seen);
    }
}

/// Where the CPU path decodes rows interleaved by four (NEON with `sdot`),
/// a model loaded without a budget holds its Q4_K experts interleaved (and
/// counts them in its memory); a budget releases the copies for good, and
/// the text stays the same through the change (see the test above, which
/// runs this file's Q4_K experts through both layouts).
#[test]
fn a_budget_releases_the_experts_interleaved_copies_for_good() {
    let name = "qwen3moe-tiny-Q4_K_M";
    let b = budgets(name);
    let model = load(name, 0);
    let copies = model.expert_copies_bytes();
    if !pocket_core::kernels::interleaves(pocket_core::quant::GgmlType::Q4K) {
        assert_eq!(copies, 0, "copies without a kernel that reads them");
        return;
    }
    // Every stack of the file is Q4_K or Q6_K: all of them, 592 bytes for
    // 576 (Q4_K) or the same bytes (Q6_K).
    assert!(copies >= b.plan.expert_bytes && copies <= b.plan.expert_bytes / 576 * 592, "{copies} {:?}", b.plan);
    assert!(model.memory_usage().resident_weights_bytes >= copies);
    model.set_memory_budget(b.half).unwrap();
    assert_eq!(model.expert_copies_bytes(), 0);
    assert_eq!(model.memory_usage().resident_weights_bytes, b.plan.resident_bytes);
    model.set_memory_budget(0).unwrap();
    assert_eq!(model.expert_copies_bytes(), 0, "copies made again when the budget went");
    let loaded_with_one = load(name, b.all);
    assert_eq!(loaded_with_one.expert_copies_bytes(), 0);
}

/// Logits of a 16-token prompt as one batch, then of 8 tokens one at a time.
fn run(model: &Model, tokens: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let pool = ThreadPool::new(1);
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

#[test]
fn passes_compute_the_same_while_another_thread_keeps_changing_the_budget() {
    // Three sequences in threads over one model whose budget a fourth thread
    // changes without pause: changes land inside passes (a shrink while a
    // layer holds the slots it gives back, a prompt's experts fetched in
    // groups of a size that changes between groups), and every pass still
    // computes what the mapped model computes.
    let name = "qwen35moe-tiny-Q2_K";
    let b = budgets(name);
    let mapped = load(name, 0);
    let prompts: Vec<Vec<u32>> = (0..3).map(|k| (0..16).map(|i| 50 + 11 * k + 29 * i).collect()).collect();
    let want: Vec<_> = prompts.iter().map(|p| run(&mapped, p)).collect();
    let model = load(name, b.few);
    let running = AtomicUsize::new(prompts.len());
    let changes = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (p, w) in prompts.iter().zip(&want) {
            let (model, running) = (&model, &running);
            s.spawn(move || {
                for _ in 0..4 {
                    assert!(run(model, p) == *w, "a budget change changed a sequence's logits");
                }
                running.fetch_sub(1, Ordering::AcqRel);
            });
        }
        s.spawn(|| {
            let cycle = [b.min, b.half, b.few, 0, b.all, b.min, 0, b.few];
            for budget in cycle.iter().cycle() {
                if running.load(Ordering::Acquire) == 0 {
                    break;
                }
                model.set_memory_budget(*budget).unwrap();
                changes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(300));
            }
        });
    });
    assert!(changes.load(Ordering::Relaxed) >= 8, "the budget changed {} times", changes.load(Ordering::Relaxed));
}

#[test]
fn a_budget_below_the_minimum_is_refused_with_the_minimum_and_nothing_changes() {
    for name in ["qwen35moe-tiny-Q2_K", "gemma3-tiny-Q8_0"] {
        let plan = Model::load(path(name)).unwrap().memory_plan(0);
        let min = plan.minimum_budget_bytes;
        for loaded in [0, min + plan.expert_bytes] {
            let model = load(name, loaded);
            let pool = ThreadPool::new(1);
            let mut st = model.new_state(64, KvType::F16).unwrap();
            let prompt: Vec<u32> = (0..16).map(|i| 100 + 37 * i).collect();
            model.forward(&pool, &mut st, &prompt, Logits::Last).unwrap();
            let before = (model.memory_budget(), model.memory_usage());
            for below in [1, min / 2, min - 1] {
                match model.set_memory_budget(below) {
                    Err(Error::InvalidArgument(why)) => {
                        assert!(why.contains(&min.to_string()), "{name}: the refusal states the minimum: {why}")
                    }
                    other => panic!("{name}: a budget of {below} below the minimum {min}: {other:?}"),
                }
                assert_eq!(
                    (model.memory_budget(), model.memory_usage()),
                    before,
                    "{name}: a refusal changed the model"
                );
            }
            // The minimum itself is taken.
            model.set_memory_budget(min).unwrap();
            assert_eq!(model.memory_budget(), min);
        }
    }
}

#[test]
fn a_dense_model_takes_a_budget_and_gives_it_back_with_the_same_logits() {
    // No experts: the budget keeps every weight in owned memory, no cache.
    let name = "gemma3-tiny-Q8_0";
    let prompt: Vec<u32> = (0..16).map(|i| 10 + 37 * i).collect();
    let model = load(name, 0);
    let want = run(&model, &prompt);
    let plan = model.memory_plan(0);
    model.set_memory_budget(plan.minimum_budget_bytes).unwrap();
    assert!(run(&model, &prompt) == want);
    let usage = model.memory_usage();
    assert_eq!((usage.resident_weights_bytes, usage.expert_cache_bytes), (plan.resident_bytes, 0));
    model.set_memory_budget(0).unwrap();
    assert!(run(&model, &prompt) == want);
    assert_eq!(model.memory_budget(), 0);
}

#[test]
fn memory_usage_counts_weights_cache_and_sessions() {
    let name = "qwen3moe-tiny-Q4_K_M";
    let b = budgets(name);
    let prompt: Vec<u32> = (0..16).map(|i| 100 + 37 * i).collect();
    let pool = ThreadPool::new(1);

    // Mapped: the file's pages in memory, no cache; a session's KV cache and
    // scratch count while it lives.
    let model = load(name, 0);
    assert_eq!(model.memory_usage().kv_cache_bytes, 0);
    let mut st = model.new_state(64, KvType::F16).unwrap();
    let fresh = model.memory_usage();
    assert!(fresh.kv_cache_bytes > 0, "{fresh:?}");
    model.forward(&pool, &mut st, &prompt, Logits::Last).unwrap();
    let used = model.memory_usage();
    assert!(used.scratch_bytes > fresh.scratch_bytes && used.kv_cache_bytes >= fresh.kv_cache_bytes, "{used:?}");
    // (Where the path reads interleaved rows, the copies too: at most the
    // file's bytes again, 592 for 576.)
    let copies = if pocket_core::kernels::interleaves(pocket_core::quant::GgmlType::Q4K) { 592 } else { 0 };
    let most = b.plan.file_bytes + b.plan.file_bytes / 576 * copies;
    assert!(used.resident_weights_bytes > 0 && used.resident_weights_bytes <= most, "{used:?}");
    assert_eq!(used.expert_cache_bytes, 0);
    let mut second = model.new_state(32, KvType::F32).unwrap();
    model.forward(&pool, &mut second, &prompt[..4], Logits::Last).unwrap();
    assert!(model.memory_usage().kv_cache_bytes > used.kv_cache_bytes);
    drop(second);
    assert_eq!(model.memory_usage().kv_cache_bytes, used.kv_cache_bytes);
    assert_eq!(model.memory_usage().scratch_bytes, used.scratch_bytes);

    // Budgeted: the resident weights owned, the cache as filled, within the plan.
    model.set_memory_budget(b.all).unwrap();
    let taken = model.memory_usage();
    assert_eq!(taken.resident_weights_bytes, b.plan.resident_bytes);
    assert_eq!(taken.expert_cache_bytes, 0, "no slot filled yet: {taken:?}");
    model.forward(&pool, &mut st, &prompt, Logits::Last).unwrap();
    let filled = model.memory_usage();
    assert!(filled.expert_cache_bytes > 0 && filled.expert_cache_bytes <= model.memory_plan(b.all).cache_bytes);
    model.set_memory_budget(b.min).unwrap();
    let shrunk = model.memory_usage();
    assert!(shrunk.expert_cache_bytes <= model.memory_plan(b.min).cache_bytes, "{shrunk:?}");
    assert!(shrunk.expert_cache_bytes < filled.expert_cache_bytes);
    model.set_memory_budget(0).unwrap();
    assert_eq!(model.memory_usage().expert_cache_bytes, 0);
    drop(st);
    let idle = model.memory_usage();
    assert_eq!((idle.kv_cache_bytes, idle.scratch_bytes), (0, 0), "{idle:?}");
}
