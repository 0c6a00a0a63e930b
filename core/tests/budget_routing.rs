//! The routing benchmark hook (`POCKET_ROUTING`, read once per process:
//! this file's only test sets it) routes a model's MoE layers with the
//! stated locality, and a budgeted model computes what the mapped one does
//! under it, as without it.

mod common;

use common::model_file as path;
use pocket_core::model::{KvType, LoadOptions, LocalRouting, Logits, Model, ROUTING_ENV};
use pocket_core::threads::ThreadPool;

/// The 16-token prompt's logits, then 24 tokens' one at a time, and the
/// routing of the one-token passes (per pass, per MoE layer, its experts).
fn run(model: &Model) -> (Vec<f32>, Vec<Vec<Vec<u32>>>) {
    let pool = ThreadPool::new(2);
    let mut st = model.new_state(64, KvType::F16).unwrap();
    let prompt: Vec<u32> = (0..16).map(|i| 100 + 37 * i).collect();
    model.forward(&pool, &mut st, &prompt, Logits::All).unwrap();
    let mut logits = st.logits().to_vec();
    let mut routes = Vec::new();
    for i in 0..24u32 {
        st.trace = Some(Vec::new());
        model.forward(&pool, &mut st, &[200 + 13 * i], Logits::Last).unwrap();
        logits.extend_from_slice(st.logits());
        routes.push(st.trace.take().unwrap().into_iter().map(|r| r.experts).collect());
    }
    (logits, routes)
}

#[test]
fn local_routing_repeats_its_share_and_the_budget_computes_what_the_mapping_does() {
    std::env::set_var(ROUTING_ENV, "local:repeat=0.5,zipf=1.1,seed=3");
    let cfg = LocalRouting::from_env().unwrap().expect("the hook is set");
    assert_eq!(cfg.repeat, 0.5);
    for name in ["qwen35moe-tiny-Q2_K", "qwen3moe-tiny-Q4_K_M"] {
        let mapped = Model::load(path(name)).unwrap();
        let plan = mapped.memory_plan(0);
        let (want, routes) = run(&mapped);
        // Of each token's experts, the share the same layer routed to for the previous token.
        let (mut repeated, mut all) = (0usize, 0usize);
        for pair in routes.windows(2) {
            for (now, before) in pair[1].iter().zip(&pair[0]) {
                repeated += now.iter().filter(|e| before.contains(e)).count();
                all += now.len();
            }
        }
        let share = repeated as f64 / all as f64;
        assert!((share - 0.5).abs() < 0.15, "{name}: {share} of the experts repeated ({all} in all)");
        let half = plan.minimum_budget_bytes + plan.expert_bytes / 2;
        for budget in [plan.minimum_budget_bytes, half] {
            let m = Model::load_with(path(name), &LoadOptions { memory_budget: budget, ..Default::default() }).unwrap();
            let (got, got_routes) = run(&m);
            assert!(got_routes == routes, "{name}, budget {budget}: routed otherwise");
            assert!(got == want, "{name}, budget {budget}: logits differ from the mapped model's");
        }
    }
}
