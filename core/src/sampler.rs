//! The sampling chain: penalties over recent tokens, then top-k, top-p,
//! min-p and temperature, then a draw from a seeded generator. Temperature 0
//! is greedy (argmax after penalties).

use std::collections::VecDeque;

/// Sampling settings; every stage can be switched off.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recent tokens (1 = off).
    pub repeat_penalty: f32,
    /// Subtract once from the logit of every recent token (0 = off).
    pub presence_penalty: f32,
    /// Subtract per occurrence in the recent tokens (0 = off).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: DEFAULT_SEED,
        }
    }
}

/// The seed of a session whose caller does not choose one (every front end:
/// the CLI, the bindings and Rust callers).
pub const DEFAULT_SEED: u64 = 0x5EED;

impl SamplerConfig {
    /// Argmax sampling with no penalties.
    pub fn greedy() -> Self {
        SamplerConfig { temperature: 0.0, repeat_penalty: 1.0, ..Default::default() }
    }

    /// Every setting in its range ([`check`] names the first that is not).
    pub fn validate(&self) -> crate::Result<()> {
        let at = |field: &str, e: String| crate::Error::InvalidArgument(format!("{field}: {e}"));
        check::temperature(self.temperature).map_err(|e| at("temperature", e))?;
        check::probability(self.top_p).map_err(|e| at("top_p", e))?;
        check::probability(self.min_p).map_err(|e| at("min_p", e))?;
        check::penalty(self.repeat_penalty).map_err(|e| at("repeat_penalty", e))?;
        check::finite(self.presence_penalty).map_err(|e| at("presence_penalty", e))?;
        check::finite(self.frequency_penalty).map_err(|e| at("frequency_penalty", e))?;
        Ok(())
    }
}

/// The range of each sampler setting, one function per kind of value, each
/// returning the value or why it is refused. [`SamplerConfig::validate`] and
/// every front end (the CLI's flag parsers, the bindings) use these, so a
/// setting means the same everywhere. (Top-k needs no check: any count is
/// valid, 0 switches it off.)
pub mod check {
    /// A finite number.
    pub fn finite(v: f32) -> Result<f32, String> {
        if v.is_finite() {
            Ok(v)
        } else {
            Err(format!("{v} is not a finite number"))
        }
    }

    /// Temperature: finite and >= 0 (0 = greedy).
    pub fn temperature(v: f32) -> Result<f32, String> {
        match finite(v)? {
            v if v >= 0.0 => Ok(v),
            v => Err(format!("{v} is negative (0 = greedy)")),
        }
    }

    /// Top-p and min-p: a probability in [0, 1].
    pub fn probability(v: f32) -> Result<f32, String> {
        match finite(v)? {
            v if (0.0..=1.0).contains(&v) => Ok(v),
            v => Err(format!("{v} does not lie in [0, 1]")),
        }
    }

    /// Repeat penalty: finite and > 0 (1 = off).
    pub fn penalty(v: f32) -> Result<f32, String> {
        match finite(v)? {
            v if v > 0.0 => Ok(v),
            v => Err(format!("{v} is not positive (1 = off)")),
        }
    }
}

/// A small, fast, seedable generator (xoshiro256**, seeded by SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One candidate token: id and logit (later its probability).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cand {
    id: u32,
    logit: f32,
    p: f32,
}

/// Samples tokens from logits; remembers recent tokens for the penalties.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    recent: VecDeque<u32>,
    cands: Vec<Cand>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        Sampler { rng: Rng::new(cfg.seed), cfg, recent: VecDeque::new(), cands: Vec::new() }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Record a token of the context (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.cfg.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.cfg.penalty_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Forget the recent tokens (the generator keeps its position).
    pub fn reset(&mut self) {
        self.recent.clear();
    }

    /// Choose the next token from a row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let cfg = &self.cfg;
        let penalised = cfg.repeat_penalty != 1.0 || cfg.presence_penalty != 0.0 || cfg.frequency_penalty != 0.0;
        if cfg.temperature <= 0.0 && !penalised {
            return argmax(logits) as u32;
        }
        self.cands.clear();
        self.cands.extend(logits.iter().enumerate().map(|(i, &l)| Cand { id: i as u32, logit: l, p: 0.0 }));
        if penalised {
            self.apply_penalties();
        }
        if self.cfg.temperature <= 0.0 {
            let logits: Vec<f32> = self.cands.iter().map(|c| c.logit).collect();
            return argmax(&logits) as u32;
        }
        self.top_k();
        self.top_p();
        self.min_p();
        // Temperature, then the draw.
        let t = self.cfg.temperature;
        self.cands.iter_mut().for_each(|c| c.logit /= t);
        softmax(&mut self.cands);
        let r = self.rng.next_f64() as f32;
        let mut acc = 0.0;
        for c in &self.cands {
            acc += c.p;
            if r < acc {
                return c.id;
            }
        }
        self.cands.last().map_or(0, |c| c.id)
    }

    fn apply_penalties(&mut self) {
        let cfg = &self.cfg;
        let mut counts: Vec<(u32, u32)> = Vec::with_capacity(self.recent.len());
        for &t in &self.recent {
            match counts.iter_mut().find(|c| c.0 == t) {
                Some(c) => c.1 += 1,
                None => counts.push((t, 1)),
            }
        }
        for (t, n) in counts {
            let Some(c) = self.cands.get_mut(t as usize) else { continue };
            if c.logit > 0.0 {
                c.logit /= cfg.repeat_penalty;
            } else {
                c.logit *= cfg.repeat_penalty;
            }
            c.logit -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
        }
    }

    /// Keep the k largest logits, sorted largest first.
    fn top_k(&mut self) {
        let k = if self.cfg.top_k == 0 { self.cands.len() } else { self.cfg.top_k.min(self.cands.len()) };
        let by_logit = |a: &Cand, b: &Cand| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        if k < self.cands.len() {
            self.cands.select_nth_unstable_by(k - 1, by_logit);
            self.cands.truncate(k);
        }
        self.cands.sort_unstable_by(by_logit);
    }

    fn top_p(&mut self) {
        let p = self.cfg.top_p;
        if p >= 1.0 {
            return;
        }
        softmax(&mut self.cands);
        let mut acc = 0.0;
        let mut keep = self.cands.len();
        for (i, c) in self.cands.iter().enumerate() {
            acc += c.p;
            if acc >= p {
                keep = i + 1;
                break;
            }
        }
        self.cands.truncate(keep.max(1));
    }

    fn min_p(&mut self) {
        let m = self.cfg.min_p;
        if m <= 0.0 || self.cands.is_empty() {
            return;
        }
        // Sorted largest first: p_i / p_max = exp(l_i - l_max).
        let max = self.cands[0].logit;
        let cut = max + m.ln();
        let keep = self.cands.iter().take_while(|c| c.logit >= cut).count();
        self.cands.truncate(keep.max(1));
    }
}

fn softmax(c: &mut [Cand]) {
    let max = c.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.logit));
    let mut sum = 0.0;
    for x in c.iter_mut() {
        x.p = (x.logit - max).exp();
        sum += x.p;
    }
    c.iter_mut().for_each(|x| x.p /= sum);
}

/// Index of the largest value (first on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SamplerConfig {
        SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Default::default() }
    }

    fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
        let mut h = vec![0; logits.len()];
        for _ in 0..n {
            h[s.sample(logits) as usize] += 1;
        }
        h
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]), 1);
    }

    #[test]
    fn same_seed_same_draws_other_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig { seed, ..cfg() });
            (0..40).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn draws_follow_the_softmax() {
        let logits = [0.0f32, (3f32).ln()]; // p = 0.25, 0.75
        let h = histogram(&mut Sampler::new(cfg()), &logits, 20_000);
        let p1 = h[1] as f64 / 20_000.0;
        assert!((p1 - 0.75).abs() < 0.02, "{p1}");
    }

    #[test]
    fn top_k_keeps_only_k() {
        let logits = [1.0f32, 5.0, 4.0, 3.0, 2.0];
        let h = histogram(&mut Sampler::new(SamplerConfig { top_k: 2, ..cfg() }), &logits, 2000);
        assert_eq!(h[0] + h[3] + h[4], 0);
        assert!(h[1] > 0 && h[2] > 0);
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // p ≈ [0.64, 0.24, 0.09, 0.03]: top_p 0.8 keeps the first two.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let h = histogram(&mut Sampler::new(SamplerConfig { top_p: 0.8, ..cfg() }), &logits, 3000);
        assert_eq!(h[2] + h[3], 0);
        assert!(h[1] > 0);
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // Relative to the best: 1, e^-1 ≈ 0.37, e^-3 ≈ 0.05.
        let logits = [3.0f32, 2.0, 0.0];
        let h = histogram(&mut Sampler::new(SamplerConfig { min_p: 0.1, ..cfg() }), &logits, 3000);
        assert_eq!(h[2], 0);
        assert!(h[1] > 0);
    }

    #[test]
    fn temperature_sharpens() {
        let logits = [0.0f32, 1.0];
        let cold = histogram(&mut Sampler::new(SamplerConfig { temperature: 0.2, ..cfg() }), &logits, 5000);
        let hot = histogram(&mut Sampler::new(SamplerConfig { temperature: 5.0, ..cfg() }), &logits, 5000);
        assert!(cold[1] > 4800, "{cold:?}");
        assert!(hot[1] < 3500, "{hot:?}");
    }

    #[test]
    fn penalties_apply_to_recent_tokens_only() {
        let logits = [2.0f32, 1.9, -1.0];
        // Repetition: token 0 (logit 2.0 -> 1.0) loses to token 1.
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, repeat_penalty: 2.0, ..cfg() });
        s.accept(0);
        assert_eq!(s.sample(&logits), 1);
        // Frequency: 2 occurrences x 0.1 -> 1.8 < 1.9.
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, frequency_penalty: 0.1, ..cfg() });
        s.accept(0);
        s.accept(0);
        assert_eq!(s.sample(&logits), 1);
        // Presence: once, whatever the count.
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, presence_penalty: 0.05, ..cfg() });
        s.accept(0);
        s.accept(0);
        assert_eq!(s.sample(&logits), 0);
        // Window: only the last N tokens count.
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, repeat_penalty: 2.0, penalty_last_n: 1, ..cfg() });
        s.accept(0);
        s.accept(2);
        assert_eq!(s.sample(&logits), 0);
        // Negative logits are multiplied.
        let mut s = Sampler::new(SamplerConfig { temperature: 0.0, repeat_penalty: 4.0, ..cfg() });
        s.accept(1);
        assert_eq!(s.sample(&[-1.0, -0.3, -1.1]), 0);
    }

    #[test]
    fn settings_out_of_range_are_refused_naming_the_field() {
        assert!(SamplerConfig::default().validate().is_ok());
        assert!(SamplerConfig::greedy().validate().is_ok());
        let bad = [
            (SamplerConfig { temperature: -1.0, ..cfg() }, "temperature"),
            (SamplerConfig { temperature: f32::NAN, ..cfg() }, "temperature"),
            (SamplerConfig { top_p: 1.5, ..cfg() }, "top_p"),
            (SamplerConfig { min_p: 2.0, ..cfg() }, "min_p"),
            (SamplerConfig { min_p: -0.1, ..cfg() }, "min_p"),
            (SamplerConfig { repeat_penalty: 0.0, ..cfg() }, "repeat_penalty"),
            (SamplerConfig { frequency_penalty: f32::INFINITY, ..cfg() }, "frequency_penalty"),
        ];
        for (c, field) in bad {
            let e = c.validate().expect_err(field).to_string();
            assert!(e.contains(field), "{e}");
        }
        // The edges are valid.
        for c in [SamplerConfig { top_p: 1.0, min_p: 0.0, temperature: 0.0, ..cfg() }, cfg()] {
            assert!(c.validate().is_ok());
        }
    }
}
