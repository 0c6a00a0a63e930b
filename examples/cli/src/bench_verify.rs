//! `pocket bench --verify-cost K`: what speculative decoding's verify pass
//! costs against one decoded token, and what that makes of decode speed at
//! a given acceptance rate.
//!
//! After a prompt of `-p` varied tokens, each draw times, from the same
//! position: one decoded token; a verify pass of k + 1 tokens (the last
//! token and k drafts, evaluated as speculation evaluates them: the pool in
//! one-row mode, logits for every row) for k = 1..=K; with a file that has a
//! multi-token-prediction layer, one draft step of it (the layer over one
//! token and its hidden state, its logits, the argmax). The state goes back
//! to the position after each (a checkpoint restored: the recurrent layers
//! cannot drop tokens; taking the checkpoint, before every verify pass,
//! and restoring it, after a rejection, are timed too). Tokens are varied, so a
//! MoE's verify pass reads the experts of k + 1 different tokens, as real
//! drafts do (a synthetic file's near-uniform routing makes this the
//! costly end: trained routers repeat experts between neighbours).
//!
//! The projection: drafting k tokens that are each accepted with
//! probability a (independently), a verify pass yields on average
//! (1 - a^(k+1)) / (1 - a) tokens and costs verify(k) + k x draft (+ for
//! recurrent models the checkpoint, and the restore when a draft is
//! rejected, probability 1 - a^k); speed = tokens / time, against 1 / decode.

use std::time::Instant;

use pocket_core::model::{KvType, Logits, Model};
use pocket_core::sampler::argmax;
use pocket_core::threads::ThreadPool;
use serde_json::json;

/// The acceptance rates the projection is printed for (the published range
/// of Qwen3.5/3.6's MTP layer with 4 drafts: 0.48-0.81).
pub const ACCEPTANCE: [f64; 3] = [0.5, 0.65, 0.8];

/// Median of `v` (non-empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Tokens a verify pass yields on average with `k` drafts each accepted
/// with probability `a`: the accepted run plus the model's own token.
pub fn expected_tokens(k: usize, a: f64) -> f64 {
    if a >= 1.0 {
        return (k + 1) as f64;
    }
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

pub struct Costs {
    /// Milliseconds: one decoded token, each verify pass (index k - 1),
    /// one MTP draft step, taking and restoring a checkpoint.
    pub decode_ms: f64,
    pub verify_ms: Vec<f64>,
    pub draft_ms: Option<f64>,
    /// The draft step with the whole vocabulary's head, and how many tokens
    /// the drafter's head scores (`session::mtp_draft_head_rows`).
    pub draft_full_head_ms: Option<f64>,
    pub draft_head_rows: usize,
    pub checkpoint_ms: f64,
    pub restore_ms: f64,
    pub recurrent: bool,
}

impl Costs {
    /// Projected decode t/s with `k` drafts accepted at rate `a`.
    pub fn projected(&self, k: usize, a: f64) -> f64 {
        let draft = self.draft_ms.unwrap_or(0.0) * k as f64;
        let restore = match self.recurrent {
            true => self.checkpoint_ms + self.restore_ms * (1.0 - a.powi(k as i32)),
            false => 0.0,
        };
        1e3 * expected_tokens(k, a) / (self.verify_ms[k - 1] + draft + restore)
    }

    /// The best draft length at rate `a`, with its speed.
    pub fn best(&self, a: f64) -> (usize, f64) {
        (1..=self.verify_ms.len()).map(|k| (k, self.projected(k, a))).fold((1, 0.0), |best, x| {
            if x.1 > best.1 {
                x
            } else {
                best
            }
        })
    }
}

/// Measure (see the module). `draws` timings of each, medians kept.
pub fn measure(
    model: &Model,
    pool: &ThreadPool,
    kv: KvType,
    n_prompt: usize,
    max_k: usize,
    draws: usize,
) -> Result<Costs, String> {
    let e = |x: pocket_core::Error| x.to_string();
    let vocab = model.n_vocab() as u64;
    let token = |i: u64| ((i * 7919 + 1009) % (vocab - 300) + 256) as u32;
    let n_ctx = n_prompt + max_k + 2;
    let mut state = model.new_state(n_ctx, kv).map_err(e)?;
    let has_mtp = model.has_mtp().unwrap_or(false);
    state.keep_hidden(has_mtp);
    let prompt: Vec<u32> = (0..n_prompt.max(1) as u64).map(token).collect();
    model.forward(pool, &mut state, &prompt, Logits::Last).map_err(e)?;
    let base = state.checkpoint().map_err(e)?;
    // The session reuses one checkpoint's memory from verify pass to verify pass.
    let mut spare = state.checkpoint().map_err(e)?;
    let mut mtp = if has_mtp { Some(model.new_mtp_state(n_ctx, kv).map_err(e)?) } else { None };
    let h_last = if has_mtp {
        let h = state.hidden();
        h[h.len() - model.n_embd()..].to_vec()
    } else {
        Vec::new()
    };

    let (mut decode, mut restore, mut draft, mut checkpoint) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut draft_full = Vec::new();
    let head_rows = pocket_core::session::mtp_draft_head_rows(model.n_vocab());
    let head_extra = pocket_core::session::mtp_draft_extra_tokens(model, head_rows);
    let mut verify: Vec<Vec<f64>> = vec![Vec::new(); max_k];
    // Draw 0 warms up (pages the weights in, fills an expert cache) and is not kept.
    for d in 0..=draws {
        let step = |i: u64| token(100_000 + d as u64 * 1_000 + i);
        let t = Instant::now();
        state.checkpoint_into(&mut spare).map_err(e)?;
        let checkpoint_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        model.forward(pool, &mut state, &[step(0)], Logits::Last).map_err(e)?;
        let decode_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        state.restore(&base).map_err(e)?;
        let restore_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut verify_ms = Vec::with_capacity(max_k);
        for k in 1..=max_k {
            let batch: Vec<u32> = (0..=k as u64).map(|i| step(10 * k as u64 + i)).collect();
            pool.set_one_row(true);
            let t = Instant::now();
            let r = model.forward(pool, &mut state, &batch, Logits::All);
            verify_ms.push(t.elapsed().as_secs_f64() * 1e3);
            pool.set_one_row(false);
            r.map_err(e)?;
            state.restore(&base).map_err(e)?;
        }
        // A draft step as the drafter runs it (its head), and with the whole head.
        let mut draft_step = |rows: usize| -> Result<Option<f64>, String> {
            let Some(st) = mtp.as_mut() else { return Ok(None) };
            st.set_head_rows(rows);
            st.set_head_extra(if rows == head_rows { head_extra.clone() } else { Vec::new() });
            let at = st.n_past();
            let t = Instant::now();
            model.mtp_forward(pool, st, &[step(1)], &h_last, true).map_err(e)?;
            std::hint::black_box(argmax(st.logits()));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            st.truncate(at);
            Ok(Some(ms))
        };
        // Each right after a pass of the trunk, as drafting runs (the trunk's
        // pass has evicted the layer's weights from the caches).
        let draft_ms = draft_step(head_rows)?;
        let mut trunk_pass = || -> Result<(), String> {
            let r = model.forward(pool, &mut state, &[step(2)], Logits::Last);
            r.map_err(e)?;
            state.restore(&base).map_err(e)
        };
        trunk_pass()?;
        let full_ms = draft_step(usize::MAX)?;
        if d > 0 {
            decode.push(decode_ms);
            checkpoint.push(checkpoint_ms);
            restore.push(restore_ms);
            verify.iter_mut().zip(verify_ms).for_each(|(v, ms)| v.push(ms));
            draft.extend(draft_ms);
            draft_full.extend(full_ms);
        }
    }
    Ok(Costs {
        decode_ms: median(&mut decode),
        verify_ms: verify.iter_mut().map(|v| median(v)).collect(),
        draft_ms: (!draft.is_empty()).then(|| median(&mut draft)),
        draft_full_head_ms: (!draft_full.is_empty()).then(|| median(&mut draft_full)),
        draft_head_rows: head_rows,
        checkpoint_ms: median(&mut checkpoint),
        restore_ms: median(&mut restore),
        recurrent: state.is_recurrent(),
    })
}

/// The figures as JSON (`bench --verify-cost K --json`).
pub fn to_json(c: &Costs) -> serde_json::Value {
    json!({
        "decode_ms": c.decode_ms,
        "checkpoint_ms": c.checkpoint_ms,
        "restore_ms": c.restore_ms,
        "recurrent": c.recurrent,
        "mtp_draft_ms": c.draft_ms,
        "mtp_draft_full_head_ms": c.draft_full_head_ms,
        "mtp_draft_head_rows": c.draft_head_rows,
        "verify": c.verify_ms.iter().enumerate().map(|(i, ms)| json!({
            "drafts": i + 1,
            "ms": ms,
            "decode_ratio": ms / c.decode_ms,
        })).collect::<Vec<_>>(),
        "projected": ACCEPTANCE.iter().map(|&a| {
            let (k, tps) = c.best(a);
            json!({
                "acceptance": a,
                "best_drafts": k,
                "decode_tps": tps,
                "speedup": tps * c.decode_ms / 1e3,
                "by_drafts": (1..=c.verify_ms.len()).map(|k| c.projected(k, a)).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}

/// The figures as a few lines.
pub fn text(c: &Costs) -> Vec<String> {
    let mut out = vec![
        format!(
            "decode       {:.2} ms per token ({:.2} t/s); checkpoint {:.2} ms, restore {:.2} ms{}",
            c.decode_ms,
            1e3 / c.decode_ms,
            c.checkpoint_ms,
            c.restore_ms,
            if c.recurrent { "" } else { " (not needed: attention only)" }
        ),
        match c.draft_ms {
            Some(ms) => format!(
                "mtp draft    {ms:.2} ms per drafted token ({:.2}x a decoded one; head over the first {} tokens; \
                 the whole head: {:.2} ms)",
                ms / c.decode_ms,
                c.draft_head_rows,
                c.draft_full_head_ms.unwrap_or(f64::NAN)
            ),
            None => "mtp draft    (no MTP layer in this file: projections without draft cost)".into(),
        },
        format!("{:<8} {:>10} {:>12}", "drafts", "verify ms", "x decode"),
    ];
    for (i, ms) in c.verify_ms.iter().enumerate() {
        out.push(format!("{:<8} {:>10.2} {:>12.2}", i + 1, ms, ms / c.decode_ms));
    }
    for a in ACCEPTANCE {
        let (k, tps) = c.best(a);
        out.push(format!(
            "acceptance {a:.2}: best {k} drafts, {tps:.2} t/s projected ({:.2}x decode)",
            tps * c.decode_ms / 1e3
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_tokens_counts_the_accepted_run_and_the_models_token() {
        // No draft accepted: the model's own token only; all: k + 1.
        assert_eq!(expected_tokens(4, 0.0), 1.0);
        assert_eq!(expected_tokens(4, 1.0), 5.0);
        // k = 1, a = 0.5: one token, plus one more half the time.
        assert!((expected_tokens(1, 0.5) - 1.5).abs() < 1e-12);
        // Summing the series by hand: 1 + a + a^2 + a^3.
        let a: f64 = 0.65;
        assert!((expected_tokens(3, a) - (1.0 + a + a * a + a * a * a)).abs() < 1e-12);
    }

    #[test]
    fn the_projection_picks_the_fastest_draft_length() {
        // Verify cost rising 10 % per draft, no draft cost: at a = 0.8 longer is better up to a point.
        let c = Costs {
            decode_ms: 10.0,
            verify_ms: (1..=8).map(|k| 10.0 * (1.0 + 0.1 * k as f64)).collect(),
            draft_ms: None,
            draft_full_head_ms: None,
            draft_head_rows: 0,
            checkpoint_ms: 0.0,
            restore_ms: 0.0,
            recurrent: false,
        };
        let (k, tps) = c.best(0.8);
        let all: Vec<f64> = (1..=8).map(|k| c.projected(k, 0.8)).collect();
        assert_eq!(tps, all.iter().cloned().fold(0.0, f64::max));
        assert!(k > 1 && k < 8, "{k} {all:?}");
        // At a = 0 drafting only costs: the best is one draft, slower than decoding.
        let (k0, t0) = c.best(0.0);
        assert_eq!(k0, 1);
        assert!(t0 < 1e3 / c.decode_ms);
    }
}
