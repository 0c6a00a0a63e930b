//! Speculative decoding (prompt lookup, a draft model): the same tokens as
//! without it, greedy and seeded, on every fixture architecture (the
//! hybrid's rollback included) and the real Gemma 3 270M; the same
//! next-token distribution over seeds; the requests and draft models it
//! refuses or switches off.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use pocket_core::model::Model;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{testing, GenerateOptions, GenerationStats, Session, SessionOptions, Speculation};
use pocket_core::Error;

fn tiny(name: &str) -> Arc<Model> {
    Arc::new(Model::load(common::fixtures().join(format!("models/{name}.gguf"))).unwrap())
}

/// Sessions of these tests draft whenever their drafter can: they test
/// verification, and the cost gate would rightly stop most drafts on the
/// fixtures' random-weight models (the gate's own tests are in
/// `session::speculate`; `greedy_is_identical_on_gemma_270m` runs it too).
fn session(model: &Arc<Model>) -> Session {
    testing::ungated(true);
    Session::new(model.clone(), SessionOptions { context_length: 512, threads: 2, ..Default::default() }).unwrap()
}

const LOOKUP: Speculation = Speculation::Lookup { ngram: 3, max_draft: 6 };

use common::generate_text as run;

/// A prompt that repeats itself, so lookup has something to propose.
const REPETITIVE: &str = "one two three four five six. one two three four five six. one two three four five six. \
                          seven eight nine, seven eight nine, seven eight nine. one two three";

/// Every `every`-th token of `tokens` from `from` on changed (drafts the model will reject).
fn corrupted(tokens: &[u32], from: usize, every: usize) -> Vec<u32> {
    let mut t = tokens.to_vec();
    for (i, x) in t.iter_mut().enumerate().skip(from) {
        if (i - from) % every == every - 1 {
            *x = if *x > 0 { *x - 1 } else { 1 };
        }
    }
    t
}

/// Greedy with and without speculation on `model`: identical tokens and
/// text. With `scripted`, the drafts are the model's own greedy tokens with
/// every 4th changed (the fixtures' random weights never repeat themselves,
/// so lookup's drafts are never accepted there): drafts are then accepted
/// and rejected, and every rollback path runs. A second request continuing
/// the conversation checks the state the rollbacks left.
fn greedy_identical(model: &Arc<Model>, max_tokens: usize, scripted: bool) -> GenerationStats {
    let off = GenerateOptions { max_tokens, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
    let (mut a, mut b) = (session(model), session(model));
    let (text_off, stats_off) = run(&mut a, REPETITIVE, &off);
    if scripted {
        testing::script_drafts(Some(corrupted(a.cached_tokens(), stats_off.prompt_tokens, 4)));
    }
    let (text_on, stats_on) = run(&mut b, REPETITIVE, &on);
    assert_eq!(stats_on.tokens, stats_off.tokens, "tokens differ with speculation");
    assert_eq!(text_on, text_off);
    assert_eq!((stats_off.drafted_tokens, stats_off.accepted_tokens), (0, 0));
    assert!(stats_on.drafted_tokens > 0, "lookup proposed nothing");
    if scripted {
        assert!(stats_on.accepted_tokens > 0, "no draft accepted: {stats_on:?}");
        assert!(stats_on.accepted_tokens < stats_on.drafted_tokens, "no draft rejected: rollback not exercised");
    }
    assert_eq!(b.cached_tokens(), a.cached_tokens(), "the caches hold different conversations");
    // The next turn reuses the cache the verifications left.
    let next = format!("{REPETITIVE}{text_off} seven eight");
    let (t2_off, s2_off) = run(&mut a, &next, &off);
    let (t2_on, s2_on) = run(&mut b, &next, &on);
    assert_eq!(s2_on.tokens, s2_off.tokens, "second turn differs");
    assert_eq!(t2_on, t2_off);
    testing::script_drafts(None);
    stats_on
}

const FIXTURES: [&str; 4] =
    ["qwen35moe-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M", "gemma3-tiny-Q4_K_M", "mixtral-tiny-Q8_0"];

/// The same architectures with other weight types (F32 takes other kernels).
const F32_FIXTURES: [&str; 3] = ["qwen35moe-tiny-F32", "qwen3moe-tiny-F32", "gemma3-tiny-F32"];

#[test]
fn greedy_is_identical_with_lookup_on_every_fixture_architecture() {
    for name in FIXTURES {
        let s = greedy_identical(&tiny(name), 64, false);
        eprintln!("{name} lookup: drafted {}, accepted {}", s.drafted_tokens, s.accepted_tokens);
    }
}

#[test]
fn greedy_is_identical_through_accepted_and_rejected_drafts_on_every_fixture_architecture() {
    for name in FIXTURES.into_iter().chain(F32_FIXTURES) {
        let s = greedy_identical(&tiny(name), 64, true);
        eprintln!("{name} scripted: drafted {}, accepted {}", s.drafted_tokens, s.accepted_tokens);
    }
}

#[test]
fn the_hybrid_rolls_back_its_recurrent_state() {
    // qwen35moe: Gated DeltaNet layers restore a checkpoint and replay.
    let m = tiny("qwen35moe-tiny-F32");
    let s = greedy_identical(&m, 128, true);
    eprintln!("qwen35moe-tiny-F32: drafted {}, accepted {}", s.drafted_tokens, s.accepted_tokens);
}

#[test]
fn a_replay_without_new_drafts_is_evaluated_as_decoding_would() {
    // The script ends early: the last rejections' replays are evaluated
    // with no drafts after them (the plain decode step), on the quantised
    // hybrid, whose multi-row kernels would round differently.
    for name in ["qwen35moe-tiny-Q4_K_M", "qwen35moe-tiny-F32"] {
        let m = tiny(name);
        let off = GenerateOptions {
            max_tokens: 64,
            sampler: SamplerConfig::greedy(),
            ignore_eos: true,
            ..Default::default()
        };
        let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
        let (mut a, mut b) = (session(&m), session(&m));
        let (_, x) = run(&mut a, REPETITIVE, &off);
        let script = corrupted(a.cached_tokens(), x.prompt_tokens, 3);
        for cut in [x.prompt_tokens + 8, x.prompt_tokens + 21] {
            testing::script_drafts(Some(script[..cut].to_vec()));
            b.reset();
            let (_, y) = run(&mut b, REPETITIVE, &on);
            testing::script_drafts(None);
            assert_eq!(y.tokens, x.tokens, "{name}, script cut at {cut}");
            assert!(y.accepted_tokens > 0 && y.accepted_tokens < y.drafted_tokens, "{y:?}");
            // The state the replays left continues as decoding's does: the
            // conversation so far plus a few tokens, evaluated from each cache.
            assert_eq!(b.cached_tokens(), a.cached_tokens());
            let mut next = a.cached_tokens().to_vec();
            next.extend_from_slice(&x.tokens[..4]);
            let (mut z_off, mut z_on) = (Vec::new(), Vec::new());
            for (s, z) in [(&mut a, &mut z_off), (&mut b, &mut z_on)] {
                let cached = s.cached_tokens().len();
                let st = s.generate_tokens(&next, &off, &mut |_| true).unwrap();
                assert_eq!(st.prompt_tokens_evaluated, next.len() - cached, "only the new tokens are evaluated");
                *z = st.tokens;
            }
            assert_eq!(z_on, z_off, "{name}: the next request differs");
            // `a` moved on: back to the first request's state for the next cut.
            a.reset();
            run(&mut a, REPETITIVE, &off);
        }
    }
}

#[test]
fn greedy_with_penalties_is_identical() {
    // The penalties at each verified position see the tokens before it.
    let m = tiny("qwen3moe-tiny-F32");
    let sampler = SamplerConfig { repeat_penalty: 1.3, frequency_penalty: 0.2, ..SamplerConfig::greedy() };
    let off = GenerateOptions { max_tokens: 64, sampler, ignore_eos: true, ..Default::default() };
    let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
    let mut s = session(&m);
    let (_, a) = run(&mut s, REPETITIVE, &off);
    testing::script_drafts(Some(corrupted(s.cached_tokens(), a.prompt_tokens, 4)));
    let (_, b) = run(&mut session(&m), REPETITIVE, &on);
    testing::script_drafts(None);
    assert_eq!(a.tokens, b.tokens);
    assert!(b.accepted_tokens > 0 && b.accepted_tokens < b.drafted_tokens, "{b:?}");
}

#[test]
fn greedy_is_identical_on_gemma_270m() {
    let Some(path) = common::gemma_270m() else {
        eprintln!("greedy_is_identical_on_gemma_270m: skipped, Gemma 3 270M absent");
        return;
    };
    let m = Arc::new(Model::load(path).unwrap());
    let prompts = [
        "Copy the list, changing pears to figs.\nList: apples, pears, plums, cherries, grapes, lemons, limes.\nCopy: apples,",
        "Fix the typo in this code.\nfn main() {\n    let total = 5;\n    printn!(\"{}\", total);\n}\nFixed:\nfn main() {\n",
    ];
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts {
        let off = GenerateOptions { max_tokens: 40, sampler: SamplerConfig::greedy(), ..Default::default() };
        let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
        let (ta, a) = run(&mut session(&m), prompt, &off);
        let (tb, b) = run(&mut session(&m), prompt, &on);
        eprintln!("gemma 270m: {ta:?}; drafted {}, accepted {}", b.drafted_tokens, b.accepted_tokens);
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(ta, tb);
        // With the cost gate (what it drafts depends on timing; the output must not).
        let mut gated = session(&m);
        testing::ungated(false);
        let (tc, c) = run(&mut gated, prompt, &on);
        eprintln!("gemma 270m gated: drafted {}, accepted {}", c.drafted_tokens, c.accepted_tokens);
        assert_eq!((a.tokens, ta), (c.tokens, tc));
        (drafted, accepted) = (drafted + b.drafted_tokens, accepted + b.accepted_tokens);
    }
    assert!(drafted > 0 && accepted > 0, "drafted {drafted}, accepted {accepted}");
    assert!(accepted < drafted, "no draft rejected");
}

/// Seeded sampling (temperature 0.8, top-k 20, top-p 0.95) on `m` without
/// and with `spec`, whose drafts are the first run's tokens with every
/// `every`-th changed: the same tokens. The stats with speculation.
fn sampled_identical(m: &Arc<Model>, spec: Speculation, max_tokens: usize, every: usize, seed: u64) -> GenerationStats {
    let sampler = SamplerConfig { temperature: 0.8, top_k: 20, top_p: 0.95, min_p: 0.0, ..Default::default() };
    let off = GenerateOptions { max_tokens, sampler, seed: Some(seed), ..Default::default() };
    let on = GenerateOptions { speculation: spec, ..off.clone() };
    let mut s = session(m);
    let (_, a) = run(&mut s, REPETITIVE, &off);
    testing::script_drafts(Some(corrupted(s.cached_tokens(), a.prompt_tokens, every)));
    let (_, b) = run(&mut session(m), REPETITIVE, &on);
    testing::script_drafts(None);
    assert_eq!(a.tokens, b.tokens, "seed {seed}");
    b
}

#[test]
fn seeded_sampling_gives_the_same_tokens() {
    // Each emitted token takes one draw, as without speculation.
    for name in ["qwen3moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M", "gemma3-tiny-F32"] {
        let m = tiny(name);
        for seed in [1, 2, 3] {
            let b = sampled_identical(&m, LOOKUP, 48, 3, seed);
            assert!(b.accepted_tokens > 0 && b.accepted_tokens < b.drafted_tokens, "{name}: {b:?}");
        }
    }
}

/// Two-sample chi-square statistic over the categories of `a` and `b`
/// (categories expected fewer than 5 times pooled into one), and its degrees of freedom.
fn chi_square(a: &BTreeMap<u32, usize>, b: &BTreeMap<u32, usize>) -> (f64, usize) {
    let (na, nb) = (a.values().sum::<usize>() as f64, b.values().sum::<usize>() as f64);
    let keys: std::collections::BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rest = (0.0, 0.0);
    for k in keys {
        let (x, y) = (*a.get(&k).unwrap_or(&0) as f64, *b.get(&k).unwrap_or(&0) as f64);
        if (x + y) * na.min(nb) / (na + nb) < 5.0 {
            rest = (rest.0 + x, rest.1 + y);
        } else {
            cells.push((x, y));
        }
    }
    if rest.0 + rest.1 > 0.0 {
        cells.push(rest);
    }
    let n = na + nb;
    let stat = cells
        .iter()
        .map(|&(x, y)| {
            let t = x + y;
            let (ea, eb) = (t * na / n, t * nb / n);
            (x - ea).powi(2) / ea + (y - eb).powi(2) / eb
        })
        .sum();
    (stat, cells.len().saturating_sub(1))
}

/// The chi-square critical value at significance 0.001 for `df` degrees of
/// freedom (Wilson-Hilferty; z = 3.090).
fn critical_001(df: usize) -> f64 {
    let k = df as f64;
    let h = 2.0 / (9.0 * k);
    k * (1.0 - h + 3.090 * h.sqrt()).powi(3)
}

#[test]
fn the_next_token_distribution_over_seeds_is_unchanged() {
    // The 2nd and 3rd generated tokens over 300 seeds, with and without
    // lookup: both are sampled from verify-pass rows when speculating (the
    // test checks drafts were made for most seeds, and accepted and
    // rejected). The drafts are scripted: the greedy 2nd and 3rd tokens
    // (likely under the sampler, so often accepted). Significance 0.001 on
    // a two-sample chi-square test. Power: with 300 draws a side over ~8
    // categories, a shift of 10% of the probability mass between two
    // categories (Cohen's w ~ 0.3, noncentrality 300 * 0.3^2 / 2 = 13.5)
    // is detected about half the time, and a draft accepted without the
    // draw (w ~ 1) always.
    const SEEDS: u64 = 300;
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let sampler = SamplerConfig { temperature: 1.0, top_k: 8, top_p: 1.0, min_p: 0.0, ..Default::default() };
    let prompt = "The capital of France is";
    let mut dist = [[BTreeMap::new(), BTreeMap::new()], [BTreeMap::new(), BTreeMap::new()]];
    let mut speculated = 0;
    let (mut drafted, mut accepted) = (0, 0);
    let mut s = session(&m);
    let greedy =
        GenerateOptions { max_tokens: 3, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let (_, g) = run(&mut s, prompt, &greedy);
    let script = s.cached_tokens().to_vec();
    assert_eq!(script.len(), g.prompt_tokens + 3);
    for (arm, spec) in [Speculation::Off, Speculation::Lookup { ngram: 2, max_draft: 4 }].into_iter().enumerate() {
        let mut s = session(&m);
        testing::script_drafts(Some(script.clone()));
        for seed in 0..SEEDS {
            let o = GenerateOptions {
                max_tokens: 3,
                sampler: sampler.clone(),
                seed: Some(1000 + seed),
                ignore_eos: true,
                speculation: spec,
                ..Default::default()
            };
            let (_, st) = run(&mut s, prompt, &o);
            assert_eq!(st.tokens.len(), 3);
            speculated += usize::from(st.drafted_tokens > 0);
            (drafted, accepted) = (drafted + st.drafted_tokens, accepted + st.accepted_tokens);
            for (pos, d) in dist.iter_mut().enumerate() {
                *d[arm].entry(st.tokens[pos + 1]).or_insert(0usize) += 1;
            }
        }
    }
    testing::script_drafts(None);
    eprintln!("drafted {drafted}, accepted {accepted}");
    assert!(speculated as u64 > SEEDS * 8 / 10, "drafts for only {speculated} of {SEEDS} seeds");
    assert!(accepted > 0 && accepted < drafted);
    for (pos, d) in dist.iter().enumerate() {
        let (stat, df) = chi_square(&d[0], &d[1]);
        let crit = critical_001(df.max(1));
        eprintln!("token {}: chi-square {stat:.2} on {df} df (critical {crit:.2})", pos + 2);
        assert!(df >= 2, "too few categories to test: {:?}", d[0]);
        assert!(stat < crit, "token {}: the distributions differ (chi-square {stat:.2} > {crit:.2})", pos + 2);
    }
}

#[test]
fn the_chi_square_test_sees_a_real_difference() {
    // The test above can fail: a shifted distribution is rejected.
    let a: BTreeMap<u32, usize> = [(0, 100), (1, 100), (2, 100)].into_iter().collect();
    let b: BTreeMap<u32, usize> = [(0, 150), (1, 75), (2, 75)].into_iter().collect();
    let (stat, df) = chi_square(&a, &b);
    assert_eq!(df, 2);
    assert!(stat > critical_001(df), "{stat}");
    let (same, _) = chi_square(&a, &a);
    assert!(same < 1e-9);
    // Wilson-Hilferty against the table: 13.82 (2 df), 24.32 (7 df).
    assert!((critical_001(2) - 13.82).abs() < 0.5 && (critical_001(7) - 24.32).abs() < 0.5);
}

/// A constrained request speculates: every verified row sampled under its
/// own mask gives the tokens decoding gives, greedy and seeded, through
/// accepted drafts and drafts sampling rejects.
fn constrained_identical(name: &str, sampler: SamplerConfig, seed: u64) -> GenerationStats {
    let m = tiny(name);
    let off = GenerateOptions {
        max_tokens: 32,
        sampler,
        seed: Some(seed),
        // Letters and spaces: no token is forced (a forced batch is evaluated
        // as decoding evaluates it, without drafts), so every step may draft.
        regex: Some("[a-z ]{1,400}".into()),
        ..Default::default()
    };
    let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
    let mut s = session(&m);
    let (ta, a) = run(&mut s, REPETITIVE, &off);
    testing::script_drafts(Some(common::swapped(s.cached_tokens(), a.prompt_tokens)));
    let (tb, b) = run(&mut session(&m), REPETITIVE, &on);
    testing::script_drafts(None);
    assert_eq!((&ta, &a.tokens), (&tb, &b.tokens), "{name} seed {seed}: tokens differ with speculation");
    assert!(b.accepted_tokens > 0, "{name}: {b:?}");
    b
}

#[test]
fn a_constrained_request_speculates_with_a_mask_per_row() {
    let (mut drafted, mut accepted) = (0, 0);
    for name in ["qwen3moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M", "gemma3-tiny-F32"] {
        let b = constrained_identical(name, SamplerConfig::greedy(), 0);
        eprintln!("{name} constrained greedy: drafted {}, accepted {}", b.drafted_tokens, b.accepted_tokens);
        let sampler = SamplerConfig { temperature: 0.8, top_k: 20, top_p: 0.95, min_p: 0.0, ..Default::default() };
        for seed in [1, 2] {
            let s = constrained_identical(name, sampler.clone(), seed);
            (drafted, accepted) = (drafted + s.drafted_tokens, accepted + s.accepted_tokens);
        }
        (drafted, accepted) = (drafted + b.drafted_tokens, accepted + b.accepted_tokens);
    }
    // Drafts sampling rejected under the mask, not only accepted ones.
    assert!(accepted < drafted, "drafted {drafted}, accepted {accepted}");
}

/// The evaluated state in a saved session: its tokens and every layer's
/// cache (`TOKS`, `ATTN`, `DNET` sections; the clock, which counts passes, left out).
fn state_sections(path: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let (mut at, mut out) = (12, Vec::new());
    while at + 20 <= bytes.len() {
        let tag = String::from_utf8_lossy(&bytes[at..at + 4]).into_owned();
        let len = u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap()) as usize;
        let payload = bytes[at + 20..at + 20 + len].to_vec();
        if ["TOKS", "ATTN", "DNET"].contains(&tag.as_str()) {
            out.push((tag, payload));
        }
        at += 20 + len;
    }
    assert!(out.iter().any(|(t, _)| t != "TOKS"), "no layer found in {}", path.display());
    out
}

#[test]
fn a_constrained_request_leaves_the_state_decoding_leaves() {
    // A schema forces tokens (its keys) after sampled ones; decoding evaluates
    // a sampled token and those forced after it in one batch, which rounds
    // otherwise than a verified row: the state after a speculative request
    // must still be the state without speculation, bit for bit (compared as
    // saved sessions), on an attention model and on the hybrid.
    // Long keys: batches of forced tokens wide enough for the prefill kernels.
    let schema = r#"{"type":"object","properties":{"the_full_name_of_the_person_in_question":{"type":"string"},"the_city_where_this_person_lives_today":{"type":"string"},"count":{"type":"integer"}},"required":["the_full_name_of_the_person_in_question","the_city_where_this_person_lives_today","count"],"additionalProperties":false}"#;
    let dir = std::env::temp_dir().join(format!("pocket-spec-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["qwen3moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M"] {
        let m = tiny(name);
        let off = GenerateOptions {
            max_tokens: 48,
            sampler: SamplerConfig::greedy(),
            json_schema: Some(schema.into()),
            ..Default::default()
        };
        let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
        // An F32 cache keeps every bit a pass computes.
        let f32_session = || {
            let o = SessionOptions { context_length: 512, threads: 2, kv_type: KvType::F32, ..Default::default() };
            Session::new(m.clone(), o).unwrap()
        };
        let mut a = f32_session();
        let (ta, sa) = run(&mut a, REPETITIVE, &off);
        // Drafts: the answer's own tokens, so drafts right before forced keys are accepted.
        testing::script_drafts(Some(a.cached_tokens().to_vec()));
        let mut b = f32_session();
        let (tb, sb) = run(&mut b, REPETITIVE, &on);
        testing::script_drafts(None);
        assert_eq!((&ta, &sa.tokens), (&tb, &sb.tokens), "{name}");
        assert!(sb.accepted_tokens > 0, "{name}: {sb:?}");
        let (fa, fb) = (dir.join(format!("{name}-off")), dir.join(format!("{name}-on")));
        a.save(&fa).unwrap();
        b.save(&fb).unwrap();
        let (sa, sb) = (state_sections(&fa), state_sections(&fb));
        assert_eq!(sa.len(), sb.len());
        for ((tag, x), (_, y)) in sa.iter().zip(&sb) {
            assert!(x == y, "{name}: the saved {tag} sections differ");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_schema_answer_on_gemma_270m_is_the_same_with_lookup() {
    // The real model, real lookup drafts (the answer copies the input), the
    // default F16 cache: prompt attention is tiled there, so a forced batch
    // computed otherwise than decoding computes it shows.
    let Some(path) = common::gemma_270m() else {
        eprintln!("a_schema_answer_on_gemma_270m_is_the_same_with_lookup: skipped, Gemma 3 270M absent");
        return;
    };
    let m = Arc::new(Model::load(path).unwrap());
    let schema = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"city":{"type":"string"},"job":{"type":"string"},"summary":{"type":"string"}},"required":["name","age","city","job","summary"],"additionalProperties":false}"#;
    let msgs = [pocket_core::chat::ChatMessage::new(
        "user",
        "Extract the name, age, city and job of the person as JSON.\n\nMaria Lopez, 34, is an architect. She moved \
         from Seville to Valencia in 2015, where she now lives and runs a small studio designing schools.",
    )];
    let off = GenerateOptions {
        max_tokens: 96,
        sampler: SamplerConfig::greedy(),
        json_schema: Some(schema.into()),
        ..Default::default()
    };
    let on = GenerateOptions { speculation: Speculation::Lookup { ngram: 3, max_draft: 8 }, ..off.clone() };
    let (mut a, mut b) = (session(&m), session(&m));
    let sa = a.chat(&msgs, &off, &mut |_| true).unwrap();
    let sb = b.chat(&msgs, &on, &mut |_| true).unwrap();
    eprintln!("gemma 270m schema: {:?}; drafted {}, accepted {}", sa.text, sb.drafted_tokens, sb.accepted_tokens);
    assert_eq!(sa.tokens, sb.tokens);
    assert!(sb.accepted_tokens > 0, "{sb:?}");
    let dir = std::env::temp_dir().join(format!("pocket-spec-gemma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (fa, fb) = (dir.join("off"), dir.join("on"));
    a.save(&fa).unwrap();
    b.save(&fb).unwrap();
    let (xa, xb) = (state_sections(&fa), state_sections(&fb));
    std::fs::remove_dir_all(&dir).ok();
    for ((tag, x), (_, y)) in xa.iter().zip(&xb) {
        assert!(x == y, "the saved {tag} sections differ");
    }
}

#[test]
fn drafts_the_constraint_refuses_are_not_verified() {
    // Lookup over the prompt proposes its words' tokens, punctuation among
    // them, which the constraint refuses: those are cut before the pass.
    let m = tiny("qwen3moe-tiny-Q4_K_M");
    let off = GenerateOptions {
        max_tokens: 24,
        sampler: SamplerConfig::greedy(),
        regex: Some("[a-z ]{1,200}".into()),
        ..Default::default()
    };
    let on = GenerateOptions { speculation: LOOKUP, ..off.clone() };
    let mut s = session(&m);
    let (ta, a) = run(&mut s, REPETITIVE, &off);
    let dot = m.tokenizer().encode(".", false, false).unwrap()[0];
    let mut script = s.cached_tokens()[..a.prompt_tokens].to_vec();
    script.extend(std::iter::repeat_n(dot, 64));
    testing::script_drafts(Some(script));
    let (tb, b) = run(&mut session(&m), REPETITIVE, &on);
    testing::script_drafts(None);
    assert_eq!((&ta, &a.tokens), (&tb, &b.tokens));
    assert_eq!(b.drafted_tokens, 0, "a draft the constraint refuses was verified: {b:?}");
}

#[test]
fn mtp_and_draft_model_without_one_are_refused_by_name() {
    let m = tiny("gemma3-tiny-Q4_K_M");
    let mut s = session(&m);
    let refused = |s: &mut Session, speculation| {
        let o = GenerateOptions { max_tokens: 4, speculation, ..Default::default() };
        match s.generate("hello", &o, &mut |_| true) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    };
    let e = refused(&mut s, Speculation::Mtp { max_draft: 4 });
    assert!(e.contains("no MTP layer"), "{e}");
    let e = refused(&mut s, Speculation::DraftModel { max_draft: 4 });
    assert!(e.contains("no draft model"), "{e}");
    let e = refused(&mut s, Speculation::Lookup { ngram: 0, max_draft: 4 });
    assert!(e.contains("ngram"), "{e}");
}

// ---- a draft model ----

const DRAFT: Speculation = Speculation::DraftModel { max_draft: 4 };

fn with_draft(model: &Arc<Model>, draft: &Arc<Model>) -> pocket_core::Result<Session> {
    testing::ungated(true);
    let opts =
        SessionOptions { context_length: 512, threads: 2, draft_model: Some(draft.clone()), ..Default::default() };
    Session::new(model.clone(), opts)
}

/// Greedy on `model` without speculation and with `draft` drafting:
/// identical tokens, text and cache, over two turns (the second reuses the
/// state the rollbacks left, in both sessions). The first turn's figures.
fn greedy_identical_with_draft(model: &Arc<Model>, draft: &Arc<Model>, max_tokens: usize) -> GenerationStats {
    let off = GenerateOptions { max_tokens, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let on = GenerateOptions { speculation: DRAFT, ..off.clone() };
    let (mut a, mut b) = (session(model), with_draft(model, draft).unwrap());
    let (text_off, stats_off) = run(&mut a, REPETITIVE, &off);
    let (text_on, stats_on) = run(&mut b, REPETITIVE, &on);
    assert_eq!(stats_on.tokens, stats_off.tokens, "tokens differ with a draft model");
    assert_eq!(text_on, text_off);
    assert_eq!(b.cached_tokens(), a.cached_tokens(), "the caches hold different conversations");
    let next = format!("{REPETITIVE}{text_off} seven eight");
    let (t2_off, s2_off) = run(&mut a, &next, &off);
    let (t2_on, s2_on) = run(&mut b, &next, &on);
    assert_eq!(s2_on.tokens, s2_off.tokens, "second turn differs");
    assert_eq!(t2_on, t2_off);
    assert!(s2_on.drafted_tokens > 0, "no drafts in the second turn");
    stats_on
}

#[test]
fn a_model_drafting_for_itself_has_every_draft_accepted() {
    // The draft session computes each token as the session does, so its
    // greedy drafts are the session's own tokens (attention and hybrid).
    for name in ["gemma3-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M"] {
        let m = tiny(name);
        let s = greedy_identical_with_draft(&m, &m, 48);
        eprintln!("{name} drafting for itself: drafted {}, accepted {}", s.drafted_tokens, s.accepted_tokens);
        assert!(s.drafted_tokens > 0);
        assert_eq!(s.accepted_tokens, s.drafted_tokens, "{name}: a draft of the model itself was rejected");
    }
}

#[test]
fn another_quantisation_drafts_and_rolls_back_its_rejected_drafts() {
    // Drafts both accepted and rejected: the draft session truncates its KV
    // cache (gemma3) or restores its checkpoint and replays (qwen35moe).
    for (model, draft) in [("gemma3-tiny-F32", "gemma3-tiny-Q4_1"), ("qwen35moe-tiny-F32", "qwen35moe-tiny-Q4_K_M")] {
        let s = greedy_identical_with_draft(&tiny(model), &tiny(draft), 64);
        eprintln!("{draft} drafting for {model}: drafted {}, accepted {}", s.drafted_tokens, s.accepted_tokens);
        assert!(s.accepted_tokens > 0, "{draft} for {model}: no draft accepted");
        assert!(s.accepted_tokens < s.drafted_tokens, "{draft} for {model}: no draft rejected");
    }
}

#[test]
fn a_draft_model_rolls_back_the_drafts_sampling_rejects() {
    // The model drafting for itself, sampled from its top 2 tokens: a draft
    // (the argmax) is accepted with its probability, about 1/2 on the
    // fixtures' flat distributions, and rejected otherwise. A draft state
    // left wrong by a rollback would draft other tokens than the model's top
    // one (agreement then falls to chance, near 0 on random weights), so
    // acceptance above a quarter shows the rollbacks (KV truncation,
    // checkpoint and replay) exact. (Checked while writing: every draft was
    // the verify row's argmax; the counts are deterministic for the seed.)
    let sampler = SamplerConfig { temperature: 1.0, top_k: 2, top_p: 1.0, min_p: 0.0, ..Default::default() };
    for name in ["gemma3-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M", "qwen35moe-tiny-F32"] {
        let m = tiny(name);
        let off = GenerateOptions {
            max_tokens: 64,
            sampler: sampler.clone(),
            seed: Some(7),
            ignore_eos: true,
            ..Default::default()
        };
        let on = GenerateOptions { speculation: DRAFT, ..off.clone() };
        let (_, a) = run(&mut session(&m), REPETITIVE, &off);
        let (_, b) = run(&mut with_draft(&m, &m).unwrap(), REPETITIVE, &on);
        let (drafted, accepted) = (b.drafted_tokens, b.accepted_tokens);
        eprintln!("{name} sampled from its top 2: drafted {drafted}, accepted {accepted}");
        assert_eq!(a.tokens, b.tokens, "{name}");
        assert!(accepted < drafted, "{name}: no draft rejected");
        assert!(accepted * 4 > drafted, "{name}: drafted {drafted}, accepted {accepted}");
    }
}

#[test]
fn seeded_sampling_gives_the_same_tokens_with_a_draft_model() {
    let sampler = SamplerConfig { temperature: 0.5, top_k: 20, top_p: 0.95, min_p: 0.0, ..Default::default() };
    for (model, draft) in [("gemma3-tiny-F32", "gemma3-tiny-Q4_1"), ("qwen35moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M")]
    {
        let (m, d) = (tiny(model), tiny(draft));
        let (mut drafted, mut accepted) = (0, 0);
        for seed in [1, 2, 3] {
            let off =
                GenerateOptions { max_tokens: 40, sampler: sampler.clone(), seed: Some(seed), ..Default::default() };
            let on = GenerateOptions { speculation: DRAFT, ..off.clone() };
            let (_, a) = run(&mut session(&m), REPETITIVE, &off);
            let (_, b) = run(&mut with_draft(&m, &d).unwrap(), REPETITIVE, &on);
            assert_eq!(a.tokens, b.tokens, "{draft} for {model}, seed {seed}");
            (drafted, accepted) = (drafted + b.drafted_tokens, accepted + b.accepted_tokens);
        }
        eprintln!("{draft} for {model}, seeded: drafted {drafted}, accepted {accepted}");
        assert!(accepted > 0 && accepted < drafted, "{draft} for {model}: drafted {drafted}, accepted {accepted}");
    }
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let (gemma, qwen) = (tiny("gemma3-tiny-Q4_K_M"), tiny("qwen3moe-tiny-Q4_K_M"));
    match with_draft(&gemma, &qwen) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("vocabulary") && m.contains("tokens"), "{m}"),
        Err(e) => panic!("expected InvalidArgument, got {e:?}"),
        Ok(_) => panic!("a draft model of another vocabulary was accepted"),
    }
    // The same model is its own valid draft; another file of it too.
    assert!(with_draft(&gemma, &tiny("gemma3-tiny-F32")).is_ok());
}

// ---- the model's multi-token-prediction layer ----

#[path = "../../xtask/src/sha256.rs"]
mod sha256;

use pocket_core::model::{KvType, Logits};
use pocket_core::sampler::argmax;
use pocket_core::threads::ThreadPool;

/// The tiny qwen35moe with an MTP layer (`scripts/synth-tiny.sh` writes it
/// into `$POCKET_SYNTH_TINY`), checked against the hash committed beside
/// the expected figures (they were made from this very file).
fn mtp_model() -> Arc<Model> {
    Arc::new(Model::load(mtp_model_path()).unwrap())
}

/// The tiny MTP file's path, its hash checked (see [`mtp_model`]).
fn mtp_model_path() -> std::path::PathBuf {
    testing::ungated(true);
    let name = "qwen35moe-tiny-mtp-Q8_0";
    let dir = std::env::var_os("POCKET_SYNTH_TINY")
        .expect("POCKET_SYNTH_TINY is not set: export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)");
    let path = std::path::Path::new(&dir).join(format!("{name}.gguf"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run scripts/synth-tiny.sh)", path.display()));
    let want = include_str!("data/synth/qwen35moe-tiny-mtp-Q8_0.sha256");
    assert_eq!(
        sha256::hex(&bytes),
        want.split_whitespace().next().unwrap(),
        "{name}: synth-model writes another file now: regenerate it (scripts/synth-tiny.sh after deleting it), \
         its hash (core/tests/data/synth/{name}.sha256) and llama.cpp's figures in \
         mtp_drafts_and_acceptance_are_llama_cpps (the command is in its comment)"
    );
    path
}

const MTP: Speculation = Speculation::Mtp { max_draft: 3 };
const MTP_PROMPT: &str = "Hello world, this is a test of the drafter.";

/// llama.cpp 0c1e570, on the tiny MTP file:
/// `llama-speculative-simple -m qwen35moe-tiny-mtp-Q8_0.gguf --spec-type draft-mtp --spec-draft-n-max 3
///  -p "Hello world, this is a test of the drafter." -n 48 --temp 0 --top-k 1 -t 1 -c 512 -lv 5`
/// printed n_drafted = 100, n_accept = 17, n_predict = 51; per step, its
/// debug log's drafts ("draft candidate 0" of each position) and accepted
/// counts ("accepted A/D draft tokens"), and the target's tokens.
const LLAMA_DRAFTS: [&[u32]; 9] = [
    &[392, 331, 273],
    &[999, 307, 551],
    &[266, 946, 480],
    &[918, 938, 486],
    &[271, 993, 752],
    &[793, 48, 179],
    &[1017, 788, 656],
    &[19, 391, 903],
    &[170, 709, 684],
];
/// From the 10th step on the target repeats its 12-token cycle and the
/// drafts those of steps 2..9 (then 1 draft where 2 tokens were left, and
/// 3 again where none were: llama.cpp does not cut a draft to nothing).
const LLAMA_CYCLE: [&[u32]; 8] = [
    &[824, 999, 307],
    &[266, 946, 480],
    &[918, 938, 486],
    &[271, 993, 752],
    &[793, 48, 179],
    &[1017, 788, 656],
    &[19, 391, 903],
    &[170, 709, 684],
];
const LLAMA_ACCEPTED_FIRST: [usize; 9] = [0, 1, 0, 0, 0, 0, 2, 0, 0];
const LLAMA_ACCEPTED_CYCLE: [usize; 8] = [2, 0, 0, 0, 0, 2, 0, 0];
const LLAMA_TOKENS: [u32; 12] = [824, 999, 262, 926, 390, 873, 639, 1017, 788, 579, 176, 108];

/// llama.cpp's steps: (drafts, accepted), 34 of them.
fn llama_steps() -> Vec<(Vec<u32>, usize)> {
    let mut steps: Vec<(Vec<u32>, usize)> =
        LLAMA_DRAFTS.iter().zip(LLAMA_ACCEPTED_FIRST).map(|(d, a)| (d.to_vec(), a)).collect();
    while steps.len() < 34 {
        let i = (steps.len() - 9) % 8;
        steps.push((LLAMA_CYCLE[i].to_vec(), LLAMA_ACCEPTED_CYCLE[i]));
    }
    steps[31].0.truncate(1);
    steps
}

/// Pairs tokens with the hidden state before each (`h_prev` before the
/// first) and runs them through the MTP layer; returns the last token's state.
fn mtp_take(
    m: &Model,
    pool: &ThreadPool,
    st: &mut pocket_core::model::MtpState,
    tokens: &[u32],
    h: &[f32],
    h_prev: &[f32],
) -> Vec<f32> {
    let e = m.n_embd();
    let mut paired = h_prev.to_vec();
    paired.extend_from_slice(&h[..(tokens.len() - 1) * e]);
    m.mtp_forward(pool, st, tokens, &paired, false).unwrap();
    h[(tokens.len() - 1) * e..].to_vec()
}

/// [`MTP_PROMPT`]'s tokens and the trunk's hidden state at each of them.
fn prompt_hidden(m: &Model, pool: &ThreadPool) -> (Vec<u32>, Vec<f32>) {
    let prompt = m.tokenizer().encode(MTP_PROMPT, true, true).unwrap();
    let mut st = m.new_state(64, KvType::F16).unwrap();
    st.keep_hidden(true);
    m.forward(pool, &mut st, &prompt, Logits::None).unwrap();
    let hidden = st.hidden().to_vec();
    (prompt, hidden)
}

/// The drafting head over the first tokens of the vocabulary
/// (`MtpState::set_head_rows`, what the drafter uses on large vocabularies)
/// gives those tokens' logits exactly as the whole head does.
#[test]
fn a_head_over_the_first_tokens_gives_their_logits_as_the_whole_head() {
    let m = mtp_model();
    let pool = ThreadPool::new(2);
    let e = m.n_embd();
    let (prompt, hidden) = prompt_hidden(&m, &pool);
    let h = hidden[(prompt.len() - 1) * e..].to_vec();
    let mut mtp = m.new_mtp_state(64, KvType::F16).unwrap();
    m.mtp_forward(&pool, &mut mtp, &[prompt[0]], &h, true).unwrap();
    let whole = mtp.logits().to_vec();
    assert_eq!(whole.len(), m.n_vocab());
    for rows in [1, 300, m.n_vocab() - 1] {
        mtp.truncate(0);
        mtp.set_head_rows(rows);
        m.mtp_forward(&pool, &mut mtp, &[prompt[0]], &h, true).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(mtp.logits()), bits(&whole[..rows]), "{rows} rows");
    }
    // Extra tokens past the first rows: runs and single ids, in id order,
    // each once (ids within the first rows or outside the vocabulary ignored).
    let rows = 300;
    let last = m.n_vocab() as u32 - 1;
    mtp.truncate(0);
    mtp.set_head_rows(rows);
    mtp.set_head_extra(vec![last, 305, 306, 307, 100, 420, 306, last + 5]);
    m.mtp_forward(&pool, &mut mtp, &[prompt[0]], &h, true).unwrap();
    let scored = [305, 306, 307, 420, last];
    let mut want = whole[..rows].to_vec();
    want.extend(scored.iter().map(|&t| whole[t as usize]));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(mtp.logits()), bits(&want));
    assert_eq!(mtp.logit_token(7), 7);
    assert_eq!((mtp.logit_token(rows), mtp.logit_token(rows + 3), mtp.logit_token(rows + 4)), (305, 420, last));
    // The drafter's extra tokens are the added and end-of-turn ones past its head.
    let extra = pocket_core::session::mtp_draft_extra_tokens(&m, 0);
    let tok = m.tokenizer();
    assert!(!extra.is_empty() && extra.iter().all(|&t| tok.is_added(t) || tok.is_end_of_generation(t)));
    assert!(tok.end_of_generation_tokens().all(|t| extra.contains(&t)), "{extra:?}");
    // The drafter scores a large vocabulary's first tokens, a small one whole.
    assert_eq!(pocket_core::session::mtp_draft_head_rows(248_320), pocket_core::session::MTP_DRAFT_VOCAB);
    assert_eq!(pocket_core::session::mtp_draft_head_rows(m.n_vocab()), m.n_vocab());
}

/// Under a memory budget the layer runs as the trunk does: its weights from
/// the budget's resident copy, its routed experts through the expert cache
/// (budgeted with the trunk's, not resident in full), and it computes what
/// the mapped model computes, at the smallest budget too.
#[test]
fn the_mtp_layer_under_a_memory_budget_computes_what_the_mapping_does() {
    use pocket_core::model::LoadOptions;
    let path = mtp_model_path();
    let file = pocket_core::gguf::GgufFile::open(&path).unwrap();
    let exps: u64 = file.tensors().iter().filter(|t| t.name.contains("_exps.")).map(|t| t.size).sum();
    let run = |m: &Model| {
        let pool = ThreadPool::new(2);
        let e = m.n_embd();
        let (prompt, hidden) = prompt_hidden(m, &pool);
        let mut paired = vec![0.0; e];
        paired.extend_from_slice(&hidden[..(prompt.len() - 1) * e]);
        let mut mtp = m.new_mtp_state(64, KvType::F16).unwrap();
        m.mtp_forward(&pool, &mut mtp, &prompt, &paired, true).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        (bits(mtp.logits()), bits(mtp.hidden()))
    };
    let mapped = Model::load(&path).unwrap();
    let plan = mapped.memory_plan(0);
    assert_eq!(plan.expert_bytes, exps, "the MTP layer's experts are budgeted with the trunk's");
    let want = run(&mapped);
    assert_eq!(want.0.len(), mapped.n_vocab());
    for budget in [plan.minimum_budget_bytes, plan.minimum_budget_bytes + plan.expert_bytes / 2] {
        let m = Model::load_with(&path, &LoadOptions { memory_budget: budget, ..Default::default() }).unwrap();
        assert!(run(&m) == want, "budget {budget}: the layer computed otherwise");
    }
}

/// Pocket's MTP layer driven as `llama-speculative-simple --spec-type
/// draft-mtp` drives llama.cpp's (the prompt but its last token evaluated,
/// then per step: 3 greedy drafts chained through the layer, verified in one
/// pass, the longest agreeing prefix kept, both states cut back to it):
/// the same drafts at every step, so the same acceptance.
#[test]
fn mtp_drafts_and_acceptance_are_llama_cpps() {
    let m = mtp_model();
    let pool = ThreadPool::new(2);
    let (n_ctx, n_predict_max, n_max): (usize, usize, usize) = (512, 48, 3);
    let e = m.n_embd();
    let prompt = m.tokenizer().encode(MTP_PROMPT, true, true).unwrap();
    let mut st = m.new_state(n_ctx, KvType::F16).unwrap();
    st.keep_hidden(true);
    let mut mtp = m.new_mtp_state(n_ctx, KvType::F16).unwrap();
    let n = prompt.len();
    m.forward(&pool, &mut st, &prompt[..n - 1], Logits::None).unwrap();
    let mut pending_h = mtp_take(&m, &pool, &mut mtp, &prompt[..n - 1], st.hidden(), &vec![0.0; e]);
    let (mut id_last, mut n_past, mut n_predict) = (prompt[n - 1], n - 1, 0);
    let (mut steps, mut generated) = (Vec::new(), Vec::new());
    while n_predict <= n_predict_max {
        // Draft: (id_last, pending_h) at n_past, then each draft with the layer's own output.
        let n_draft_max = (n_ctx - n_past - 2).min(n_predict_max.saturating_sub(n_predict + 1));
        let (mut drafts, mut tok, mut h) = (Vec::new(), id_last, pending_h.clone());
        while drafts.len() < n_max {
            m.mtp_forward(&pool, &mut mtp, &[tok], &h, true).unwrap();
            tok = argmax(mtp.logits()) as u32;
            drafts.push(tok);
            h = mtp.hidden().to_vec();
        }
        mtp.truncate(n_past);
        if n_draft_max > 0 {
            drafts.truncate(n_draft_max);
        }
        // Verify [id_last, drafts] in one pass; the layer takes it with the trunk's states.
        let cp = st.checkpoint().unwrap();
        let mut batch = vec![id_last];
        batch.extend_from_slice(&drafts);
        m.forward(&pool, &mut st, &batch, Logits::All).unwrap();
        let rows = st.hidden().to_vec();
        mtp_take(&m, &pool, &mut mtp, &batch, &rows, &pending_h);
        let n_vocab = m.n_vocab();
        let mut ids = Vec::new();
        for (i, row) in st.logits().chunks_exact(n_vocab).enumerate() {
            ids.push(argmax(row) as u32);
            if i == drafts.len() || ids[i] != drafts[i] {
                break;
            }
        }
        let accepted = ids.len() - 1;
        pending_h = rows[accepted * e..(accepted + 1) * e].to_vec();
        n_past += 1 + accepted;
        n_predict += ids.len();
        if accepted < drafts.len() {
            // Cut both back to the accepted tokens (the hybrid: restore and replay).
            st.restore(&cp).unwrap();
            m.forward(&pool, &mut st, &batch[..1 + accepted], Logits::None).unwrap();
            mtp.truncate(n_past);
        }
        id_last = *ids.last().unwrap();
        generated.extend_from_slice(&ids);
        steps.push((drafts, accepted));
    }
    let want_tokens: Vec<u32> = LLAMA_TOKENS.iter().cycle().take(51).copied().collect();
    assert_eq!(generated, want_tokens, "the target's greedy tokens are not llama.cpp's");
    let want = llama_steps();
    for (i, (got, want)) in steps.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "step {i}: (drafts, accepted) differ from llama.cpp's");
    }
    assert_eq!(steps.len(), want.len());
    let drafted: usize = steps.iter().map(|s| s.0.len()).sum();
    let accepted: usize = steps.iter().map(|s| s.1).sum();
    assert_eq!((drafted, accepted, n_predict), (100, 17, 51), "llama.cpp: n_drafted 100, n_accept 17, n_predict 51");
}

/// Greedy with MTP drafting: the tokens without it (the hybrid's rollback
/// through rejected drafts included), drafts both accepted and rejected; a
/// second turn continues on the state the verifications left.
#[test]
fn greedy_is_identical_with_mtp() {
    let m = mtp_model();
    let off =
        GenerateOptions { max_tokens: 40, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let on = GenerateOptions { speculation: MTP, ..off.clone() };
    // Its pieces are byte tokens: the text of a turn is ~5 tokens a token.
    let long = || Session::new(m.clone(), SessionOptions { context_length: 4096, threads: 2, ..Default::default() });
    let (mut a, mut b) = (long().unwrap(), long().unwrap());
    let (text_off, stats_off) = run(&mut a, MTP_PROMPT, &off);
    let (text_on, stats_on) = run(&mut b, MTP_PROMPT, &on);
    assert_eq!(stats_on.tokens, stats_off.tokens, "tokens differ with MTP drafting");
    assert_eq!(text_on, text_off);
    assert!(stats_on.accepted_tokens > 0, "no draft accepted: {stats_on:?}");
    assert!(stats_on.accepted_tokens < stats_on.drafted_tokens, "no draft rejected: {stats_on:?}");
    assert_eq!(b.cached_tokens(), a.cached_tokens());
    let next = format!("{MTP_PROMPT}{text_off} and more");
    let (t2_off, s2_off) = run(&mut a, &next, &off);
    let (t2_on, s2_on) = run(&mut b, &next, &on);
    assert_eq!(s2_on.tokens, s2_off.tokens, "second turn differs");
    assert_eq!(t2_on, t2_off);
    assert!(s2_on.drafted_tokens > 0, "the second turn drafted nothing: {s2_on:?}");
    // A turn without MTP, then one with it again: the layer starts over, still exact.
    let third = format!("{next}{t2_off} again");
    let (t3_off, _) = run(&mut a, &third, &off);
    let (t3_on, _) = run(&mut b, &third, &off);
    assert_eq!(t3_on, t3_off);
    let fourth = format!("{third}{t3_off} once more");
    let (_, s4_off) = run(&mut a, &fourth, &off);
    let (_, s4_on) = run(&mut b, &fourth, &on);
    assert_eq!(s4_on.tokens, s4_off.tokens, "MTP after a turn without it differs");
    assert!(s4_on.drafted_tokens > 0);
}

/// Seeded sampling with MTP drafting: the same tokens as without.
#[test]
fn seeded_sampling_with_mtp_gives_the_same_tokens() {
    let m = mtp_model();
    let sampler = SamplerConfig { temperature: 1.5, top_k: 20, ..SamplerConfig::default() };
    let off = GenerateOptions { max_tokens: 32, sampler, ignore_eos: true, seed: Some(7), ..Default::default() };
    let on = GenerateOptions { speculation: MTP, ..off.clone() };
    let (_, a) = run(&mut session(&m), MTP_PROMPT, &off);
    let (_, b) = run(&mut session(&m), MTP_PROMPT, &on);
    assert_eq!(a.tokens, b.tokens);
    assert!(b.drafted_tokens > 0);
}

#[test]
fn seeded_sampling_on_the_quantised_hybrid_through_many_rejecting_passes() {
    // Every third draft wrong: every verify pass rejects, and the recurrent
    // layers replay what the passes before accepted. Their replays once
    // grew without bound (30 tokens and more), and a pass of 32 tokens took
    // the delta rule's chunked form, which sums in another order: a third of
    // these seeds sampled another token within 48 (on every kernel path).
    let m = tiny("qwen35moe-tiny-Q4_K_M");
    for seed in 1..=12 {
        let b = sampled_identical(&m, LOOKUP, 64, 3, seed);
        assert!(b.accepted_tokens > 0 && b.accepted_tokens < b.drafted_tokens, "{b:?}");
    }
}

#[test]
fn a_verify_pass_longer_than_the_delta_rules_chunk_is_exact() {
    // Drafts of up to 40 tokens: passes of more than 32 tokens, where a
    // prompt takes the chunked delta rule; a verify pass must not.
    let m = tiny("qwen35moe-tiny-Q4_K_M");
    for seed in 1..=6 {
        let b = sampled_identical(&m, Speculation::Lookup { ngram: 3, max_draft: 40 }, 96, 37, seed);
        assert!(b.drafted_tokens >= 32, "{b:?}");
    }
}
