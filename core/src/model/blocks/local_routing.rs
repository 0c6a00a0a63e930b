//! `POCKET_ROUTING`: a benchmark hook that replaces the experts a MoE router
//! chooses with a stream that has stated locality, so that an expert cache
//! can be measured on synthetic weights (whose routing is nearly uniform: a
//! floor) under the kind of locality a trained model's routing shows.
//!
//! `POCKET_ROUTING=local:repeat=R,zipf=S,seed=N` (read once per process;
//! unset, empty or `uniform`: the router's own choice, nothing changes):
//! for each layer, each of the previous token's experts is kept with
//! probability `R` (so on average a share `R` of a token's experts are the
//! previous token's), and the rest are drawn from a Zipf popularity of
//! exponent `S` over the layer's experts (rank `r` drawn with probability
//! proportional to `r^-S`, the ranks assigned to experts by a permutation
//! of its own per layer), never one of the previous token's. The first
//! token of a sequence (or one whose predecessor this pass did not see, as
//! after a rewind) draws all its experts. Each draw comes from a hash of
//! `(seed, layer, position, the token's input row)`: both engines (mapped
//! and budgeted), whose hidden states are bit-identical, route identically,
//! and another prompt routes differently. The experts' weights are the
//! router's probabilities of the experts chosen, as without the hook.
//!
//! Only the choice is replaced: the read-ahead still guesses with the next
//! layer's router, so a guess is as good as a real predictor's on this stream.

use std::sync::OnceLock;

/// The environment variable of the hook.
pub const ROUTING_ENV: &str = "POCKET_ROUTING";

/// The stated locality of an overridden routing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalRouting {
    /// Probability that each of the previous token's experts is kept.
    pub repeat: f64,
    /// Exponent of the per-layer Zipf popularity of the experts drawn anew.
    pub zipf: f64,
    pub seed: u64,
}

impl LocalRouting {
    /// `local:repeat=R,zipf=S,seed=N` (any of the three may be left out:
    /// 0.5, 1.0, 1); `uniform` or empty: none.
    pub fn parse(spec: &str) -> Result<Option<LocalRouting>, String> {
        let spec = spec.trim();
        if spec.is_empty() || spec == "uniform" {
            return Ok(None);
        }
        let Some(params) = spec.strip_prefix("local") else {
            return Err(format!("{ROUTING_ENV}='{spec}': expected 'uniform' or 'local:repeat=R,zipf=S,seed=N'"));
        };
        let mut r = LocalRouting { repeat: 0.5, zipf: 1.0, seed: 1 };
        for kv in params.trim_start_matches(':').split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("{ROUTING_ENV}: '{kv}' is not key=value"))?;
            let bad = || format!("{ROUTING_ENV}: bad value '{v}' for {k}");
            match k.trim() {
                "repeat" => r.repeat = v.trim().parse().map_err(|_| bad())?,
                "zipf" => r.zipf = v.trim().parse().map_err(|_| bad())?,
                "seed" => r.seed = v.trim().parse().map_err(|_| bad())?,
                other => return Err(format!("{ROUTING_ENV}: unknown key '{other}' (repeat, zipf, seed)")),
            }
        }
        if !(0.0..=1.0).contains(&r.repeat) || !(0.0..=8.0).contains(&r.zipf) {
            return Err(format!("{ROUTING_ENV}: repeat must be in [0, 1] and zipf in [0, 8]"));
        }
        Ok(Some(r))
    }

    /// The hook as set in the environment (parsed once): `Err` when it is set
    /// but malformed (a benchmark must not measure the wrong routing quietly).
    pub fn from_env() -> Result<Option<LocalRouting>, String> {
        static HOOK: OnceLock<Result<Option<LocalRouting>, String>> = OnceLock::new();
        HOOK.get_or_init(|| LocalRouting::parse(&std::env::var(ROUTING_ENV).unwrap_or_default())).clone()
    }

    /// The parameters, as `parse` reads them.
    pub fn describe(&self) -> String {
        format!("local:repeat={},zipf={},seed={}", self.repeat, self.zipf, self.seed)
    }
}

/// What the hook keeps per sequence: the Zipf table, each layer's
/// permutation of ranks to experts and its last token's experts.
#[derive(Default)]
pub struct LocalRouter {
    /// Cumulative probability of ranks `0..=r`, for `n_expert` experts.
    cdf: Vec<f64>,
    /// Per layer: expert of each popularity rank (empty until first used).
    perm: Vec<Vec<u32>>,
    /// Per layer: the position of the last token routed and its experts.
    prev: Vec<(usize, Vec<u32>)>,
    /// Scratch: the previous token's experts while a token is drawn.
    last: Vec<u32>,
}

impl LocalRouter {
    /// Replace `chosen` (one token's experts, `k` of `n_expert`) of `layer`
    /// at position `pos` whose input row hashes to `row`.
    pub fn choose(
        &mut self,
        cfg: &LocalRouting,
        layer: usize,
        pos: usize,
        row: u64,
        n_expert: usize,
        chosen: &mut [u32],
    ) {
        if self.cdf.len() != n_expert {
            *self = LocalRouter::default();
            let w: Vec<f64> = (1..=n_expert).map(|r| (r as f64).powf(-cfg.zipf)).collect();
            let total: f64 = w.iter().sum();
            let mut acc = 0.0;
            self.cdf = w
                .iter()
                .map(|x| {
                    acc += x / total;
                    acc
                })
                .collect();
        }
        if self.perm.len() <= layer {
            self.perm.resize_with(layer + 1, Vec::new);
            self.prev.resize_with(layer + 1, || (usize::MAX, Vec::new()));
        }
        if self.perm[layer].is_empty() {
            self.perm[layer] = permutation(n_expert, mix(cfg.seed ^ 0x5045_524d, layer as u64));
        }
        let (prev_pos, prev) = &self.prev[layer];
        self.last.clear();
        if pos > 0 && *prev_pos == pos - 1 {
            self.last.extend_from_slice(prev);
        }
        let mut rng = mix(mix(mix(cfg.seed, layer as u64), pos as u64), row);
        let k = chosen.len();
        let mut n = 0;
        for &e in &self.last {
            if n < k && unit(&mut rng) < cfg.repeat {
                chosen[n] = e;
                n += 1;
            }
        }
        // The previous token's experts are left out of the fresh draws (so the
        // share repeated is the share kept), unless too few experts remain.
        let avoid_last = n_expert >= k + self.last.len();
        let eligible =
            |e: u32, chosen: &[u32], last: &[u32]| !(chosen.contains(&e) || (avoid_last && last.contains(&e)));
        let mut tries = 0;
        while n < k {
            let e = if tries < 64 {
                let u = unit(&mut rng);
                let rank = self.cdf.partition_point(|&c| c < u).min(n_expert - 1);
                self.perm[layer][rank]
            } else {
                // A heavy skew keeps drawing taken experts: the most popular free one.
                let perm = &self.perm[layer];
                *perm.iter().find(|&&e| eligible(e, &chosen[..n], &self.last)).expect("k <= n_expert")
            };
            tries += 1;
            if eligible(e, &chosen[..n], &self.last) {
                chosen[n] = e;
                n += 1;
            }
        }
        let slot = &mut self.prev[layer];
        slot.0 = pos;
        slot.1.clear();
        slot.1.extend_from_slice(chosen);
    }

    /// Layer `layer`'s expert of popularity rank `rank` (0 = the most
    /// popular), once the layer has routed a token.
    pub fn expert_of_rank(&self, layer: usize, rank: usize) -> Option<u32> {
        self.perm.get(layer).and_then(|p| p.get(rank)).copied()
    }

    /// The probability the Zipf table gives rank `rank` (0-based).
    pub fn rank_probability(&self, rank: usize) -> f64 {
        self.cdf[rank] - if rank == 0 { 0.0 } else { self.cdf[rank - 1] }
    }
}

/// A hash of one token's input row (its bits: identical rows, identical hash).
pub fn row_hash(x: &[f32]) -> u64 {
    // FNV-1a over the words, then a final mix.
    let h = x.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3));
    mix(h, 0)
}

/// SplitMix64 of `a` combined with `b`.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The next uniform draw in [0, 1) of the stream `state`.
fn unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    (mix(*state, 0) >> 11) as f64 / (1u64 << 53) as f64
}

/// A permutation of `0..n` drawn from `seed` (Fisher-Yates).
fn permutation(n: usize, mut seed: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = (unit(&mut seed) * (i + 1) as f64) as usize;
        p.swap(i, j.min(i));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::{row_hash, LocalRouter, LocalRouting};

    #[test]
    fn the_spec_parses_and_rejects() {
        assert_eq!(LocalRouting::parse("").unwrap(), None);
        assert_eq!(LocalRouting::parse("uniform").unwrap(), None);
        let r = LocalRouting::parse("local:repeat=0.6,zipf=1.2,seed=7").unwrap().unwrap();
        assert_eq!(r, LocalRouting { repeat: 0.6, zipf: 1.2, seed: 7 });
        assert_eq!(LocalRouting::parse(&r.describe()).unwrap(), Some(r));
        assert_eq!(LocalRouting::parse("local").unwrap().unwrap().repeat, 0.5);
        for bad in ["local:repeat=2", "local:zipf=x", "local:foo=1", "lokal", "local:repeat"] {
            assert!(LocalRouting::parse(bad).is_err(), "{bad}");
        }
    }

    /// Many tokens of one layer: `(share of each token's experts that the
    /// previous token had, how often each rank was chosen per token)`.
    fn stream(cfg: &LocalRouting, n_expert: usize, k: usize, tokens: usize) -> (f64, Vec<f64>, LocalRouter) {
        let mut r = LocalRouter::default();
        let (mut prev, mut chosen) = (Vec::new(), vec![0u32; k]);
        let (mut repeated, mut counted) = (0usize, 0usize);
        let mut per_expert = vec![0usize; n_expert];
        for pos in 0..tokens {
            r.choose(cfg, 3, pos, row_hash(&[pos as f32 * 0.25]), n_expert, &mut chosen);
            let mut sorted = chosen.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), k, "distinct experts");
            assert!(chosen.iter().all(|&e| (e as usize) < n_expert));
            if pos > 0 {
                repeated += chosen.iter().filter(|e| prev.contains(*e)).count();
                counted += k;
            }
            chosen.iter().for_each(|&e| per_expert[e as usize] += 1);
            prev.clone_from(&chosen);
        }
        let by_rank = (0..n_expert)
            .map(|q| per_expert[r.expert_of_rank(3, q).unwrap() as usize] as f64 / tokens as f64)
            .collect();
        (repeated as f64 / counted as f64, by_rank, r)
    }

    #[test]
    fn the_share_repeated_is_the_stated_one() {
        for repeat in [0.0, 0.3, 0.5, 0.8] {
            let cfg = LocalRouting { repeat, zipf: 1.1, seed: 1 };
            let (share, _, _) = stream(&cfg, 256, 8, 20_000);
            assert!((share - repeat).abs() < 0.01, "repeat {repeat}: measured {share}");
        }
    }

    #[test]
    fn fresh_draws_follow_the_stated_popularity() {
        // Nothing kept: every expert is drawn from the Zipf table, without
        // the token's own and the previous token's (which flattens the top
        // ranks a little: a rank cannot be chosen twice per token).
        let cfg = LocalRouting { repeat: 0.0, zipf: 1.1, seed: 2 };
        let (_, by_rank, r) = stream(&cfg, 256, 1, 50_000);
        // One expert per token, only the previous one excluded: the rank's
        // chance is p(rank) / (1 - p(prev)), close to p(rank) past the top.
        for q in [2, 5, 20, 100] {
            let p = r.rank_probability(q);
            assert!((by_rank[q] - p).abs() < 0.15 * p + 0.002, "rank {q}: measured {}, stated {p}", by_rank[q]);
        }
        // With 8 per token the popularity stays skewed: the top ranks are
        // chosen far more often than the tail.
        let (_, by_rank, r) = stream(&cfg, 256, 8, 20_000);
        let head: f64 = by_rank[..16].iter().sum::<f64>() / 16.0;
        let tail: f64 = by_rank[128..].iter().sum::<f64>() / 128.0;
        assert!(head > 10.0 * tail, "head {head}, tail {tail}");
        assert!(r.rank_probability(0) > r.rank_probability(1));
    }

    #[test]
    fn a_token_s_experts_are_a_function_of_its_position_layer_and_row() {
        let cfg = LocalRouting { repeat: 0.5, zipf: 1.1, seed: 9 };
        let run = |rows: &[u64]| {
            let mut r = LocalRouter::default();
            let mut out = Vec::new();
            for (pos, &row) in rows.iter().enumerate() {
                for layer in [0, 1] {
                    let mut c = [0u32; 4];
                    r.choose(&cfg, layer, pos, row, 64, &mut c);
                    out.push(c);
                }
            }
            out
        };
        let a = run(&[1, 2, 3, 4]);
        assert_eq!(a, run(&[1, 2, 3, 4]));
        // Another prompt routes otherwise; two layers route otherwise.
        assert_ne!(a, run(&[5, 6, 7, 8]));
        assert_ne!(a[0], a[1]);
        // A token whose predecessor was not routed (a rewind, a new
        // sequence) draws afresh, as a router that never saw the others.
        let mut r = LocalRouter::default();
        let mut c = [0u32; 4];
        for pos in [0, 1, 5] {
            r.choose(&cfg, 0, pos, 3, 64, &mut c);
        }
        let mut fresh = LocalRouter::default();
        let mut d = [0u32; 4];
        fresh.choose(&cfg, 0, 5, 3, 64, &mut d);
        assert_eq!(c, d);
    }

    #[test]
    fn few_experts_still_give_distinct_choices() {
        let cfg = LocalRouting { repeat: 0.5, zipf: 4.0, seed: 3 };
        let (share, _, _) = stream(&cfg, 4, 2, 2_000);
        assert!(share > 0.0);
        let (_, _, _) = stream(&cfg, 8, 8, 100);
    }
}
