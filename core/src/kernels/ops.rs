//! f32 helpers of the forward pass: norms, activations, RoPE, elementwise ops,
//! and the dot/axpy pair attention runs over an f32 or f16 KV cache.
//!
//! Formulas follow ggml's CPU backend (accumulation width, constants, RoPE
//! angle recurrence), so results track the reference engine. The dot and axpy
//! kernels go through the SIMD table; the rest is simple enough for the
//! compiler to vectorise.

use super::table::Kernels;
use half::f16;

/// `1 / sqrt(mean(x^2) + eps)`, with the squares summed in f64 as ggml does.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// `out = x / sqrt(mean(x^2) + eps)`, times `weight` if given.
pub fn rms_norm(out: &mut [f32], x: &[f32], weight: Option<&[f32]>, eps: f32) {
    assert_eq!(out.len(), x.len(), "rms_norm: output length");
    let scale = rms_scale(x, eps);
    match weight {
        Some(w) => {
            assert_eq!(w.len(), x.len(), "rms_norm: weight length");
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
                *o = (v * scale) * g;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * scale;
            }
        }
    }
}

/// [`rms_norm`] in place (per-head norms of Q and K).
pub fn rms_norm_inplace(x: &mut [f32], weight: Option<&[f32]>, eps: f32) {
    let scale = rms_scale(x, eps);
    match weight {
        Some(w) => {
            assert_eq!(w.len(), x.len(), "rms_norm: weight length");
            x.iter_mut().zip(w).for_each(|(v, &g)| *v = (*v * scale) * g);
        }
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}

/// In-place softmax; the normaliser is summed in f64, as ggml does.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    scale(x, inv);
}

/// `1 / (1 + e^-x)` (router gates, attention output gates).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub(super) fn silu1(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU (tanh approximation) as ggml evaluates it for f32: through an f16
/// table, i.e. the input rounded to f16 and the result rounded to f16, with
/// identity/zero beyond +-10.
#[inline]
fn gelu1(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_f32(gelu_formula(f16::from_f32(x).to_f32())).to_f32()
    }
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline]
fn gelu_formula(h: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * h * (1.0 + (SQRT_2_OVER_PI * h * (1.0 + COEF_A * h * h)).tanh())
}

/// In-place SiLU: `x * sigmoid(x)`.
pub fn silu(x: &mut [f32]) {
    // SAFETY: the selected table holds only kernels this CPU has.
    unsafe { (Kernels::selected().silu)(x) }
}

/// The GELU of every f16 value, by bit pattern (ggml's table): between -10
/// and 10 the function only ever sees f16 inputs, so 128 KiB replace the tanh.
static GELU_TABLE: once_cell::sync::Lazy<Box<[f16]>> = once_cell::sync::Lazy::new(|| {
    (0..=u16::MAX).map(|b| f16::from_f32(gelu_formula(f16::from_bits(b).to_f32()))).collect()
});

/// In-place GELU, tanh approximation (ggml's `gelu`), through the f16 table.
/// The f32 <-> f16 conversions run a chunk at a time (`half`'s slice
/// conversions: F16C where the CPU has it, the same rounding as one by one),
/// leaving a table load and the clamps per value.
pub fn gelu_tanh(x: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    const CHUNK: usize = 64;
    let table = &**GELU_TABLE;
    let (mut h, mut g) = ([f16::ZERO; CHUNK], [0f32; CHUNK]);
    for chunk in x.chunks_mut(CHUNK) {
        let (h, g) = (&mut h[..chunk.len()], &mut g[..chunk.len()]);
        h.convert_from_f32_slice(chunk);
        h.iter_mut().for_each(|v| *v = table[v.to_bits() as usize]);
        h.convert_to_f32_slice(g);
        for (v, &gv) in chunk.iter_mut().zip(g.iter()) {
            *v = if *v <= -10.0 {
                0.0
            } else if *v >= 10.0 {
                *v
            } else {
                gv
            };
        }
    }
}

/// `out = silu(gate) * up` (SwiGLU feed-forward).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "swiglu: lengths");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu1(g) * u;
    }
}

/// `out = gelu_tanh(gate) * up` (GeGLU feed-forward, Gemma).
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "geglu: lengths");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu1(g) * u;
    }
}

/// `out += x`.
pub fn add(out: &mut [f32], x: &[f32]) {
    assert_eq!(out.len(), x.len(), "add: lengths");
    out.iter_mut().zip(x).for_each(|(o, &v)| *o += v);
}

/// `out *= x`, elementwise.
pub fn mul(out: &mut [f32], x: &[f32]) {
    assert_eq!(out.len(), x.len(), "mul: lengths");
    out.iter_mut().zip(x).for_each(|(o, &v)| *o *= v);
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// `sum(a * b)` in f32.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: lengths");
    // SAFETY: the selected table holds only kernels this CPU has.
    unsafe { (Kernels::selected().dot_f32)(a, b) }
}

/// `out += a * x`.
pub fn axpy_f32(out: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(out.len(), x.len(), "axpy_f32: lengths");
    // SAFETY: as above.
    unsafe { (Kernels::selected().axpy_f32)(out, a, x) }
}

/// Attention scores of `heads` queries against the keys of an f16 KV cache:
/// `out[g * n + j] = q_g · k_j` for query `q_g = q[g * d..][..d]` and key
/// `k_j = k[j * d..][..d]` (`d = q.len() / heads`, `n = k.len() / d`). Each
/// key is read and widened once for several heads (grouped-query attention).
pub fn scores_f16(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    assert!(heads > 0 && q.len().is_multiple_of(heads), "scores_f16: queries");
    let d = q.len() / heads;
    assert!(d > 0 && k.len().is_multiple_of(d), "scores_f16: keys");
    assert_eq!(out.len(), heads * (k.len() / d), "scores_f16: output");
    // SAFETY: as above.
    unsafe { (Kernels::selected().scores_f16)(q, heads, k, out) }
}

/// Attention-weighted sums of the values of an f16 KV cache for `heads`
/// heads: `out[g * d..][..d] = Σ_j w[g * n + j] · v_j` for value `v_j =
/// v[j * d..][..d]` (`d = out.len() / heads`, `n = v.len() / d`). Each value
/// is read and widened once for several heads.
pub fn mix_f16(w: &[f32], heads: usize, v: &[f16], out: &mut [f32]) {
    assert!(heads > 0 && out.len().is_multiple_of(heads), "mix_f16: output");
    let d = out.len() / heads;
    assert!(d > 0 && v.len().is_multiple_of(d), "mix_f16: values");
    assert_eq!(w.len(), heads * (v.len() / d), "mix_f16: weights");
    // SAFETY: as above.
    unsafe { (Kernels::selected().mix_f16)(w, heads, v, out) }
}

/// Query rows [`attend_f16`] takes at once.
pub const ATTEND_ROWS: usize = 16;

/// A block of query rows that share one KV head (a few tokens of a prompt
/// times the query heads of the group), with what each row may see.
pub struct AttendRows<'a> {
    /// `rows × d` queries, already rounded as the cache wants them.
    pub q: &'a [f32],
    /// Key length.
    pub d: usize,
    /// `n × d` keys of positions `base..base + n` of the KV head.
    pub k: &'a [f16],
    /// `n × dv` values of the same positions.
    pub v: &'a [f16],
    /// Value length.
    pub dv: usize,
    /// Per row, the keys it attends: `lo..hi`, relative to `base`, `lo < hi <= n`.
    pub ranges: &'a [(usize, usize)],
    /// Applied to the scores before the softmax.
    pub scale: f32,
    /// Per row, one more logit (not scaled) that takes part in the
    /// softmax's denominator but mixes no value (gpt-oss's sinks), if any.
    pub sinks: Option<&'a [f32]>,
}

impl AttendRows<'_> {
    /// The kernels' lane layout: the queries transposed into `qt` (`d` rows
    /// of [`ATTEND_ROWS`] lanes, lanes past the block zero), each lane's key
    /// range as floats (`lo..hi`; positions are far below 2^24; lanes past
    /// the block see no key), and the union `jlo..jhi` of the ranges.
    pub(crate) fn lanes(&self, qt: &mut [f32]) -> ([f32; ATTEND_ROWS], [f32; ATTEND_ROWS], usize, usize) {
        let rows = self.ranges.len();
        for i in 0..self.d {
            for r in 0..ATTEND_ROWS {
                qt[i * ATTEND_ROWS + r] = if r < rows { self.q[r * self.d + i] } else { 0.0 };
            }
        }
        let (mut lo, mut hi) = ([0f32; ATTEND_ROWS], [0f32; ATTEND_ROWS]);
        for (r, &(l, h)) in self.ranges.iter().enumerate() {
            (lo[r], hi[r]) = (l as f32, h as f32);
        }
        let jlo = self.ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let jhi = self.ranges.iter().map(|r| r.1).max().unwrap_or(0);
        (lo, hi, jlo, jhi)
    }

    /// Each lane's sink, -inf where there is none (lanes past the block, or
    /// no sinks): a sink joins the row's maximum, and its `exp` starts the
    /// row's sum (the softmax's normaliser) where it is finite.
    pub(crate) fn sink_lanes(&self) -> [f32; ATTEND_ROWS] {
        let mut out = [f32::NEG_INFINITY; ATTEND_ROWS];
        if let Some(s) = self.sinks {
            out[..s.len()].copy_from_slice(s);
        }
        out
    }
}

/// Scratch `f32`s [`attend_f16`] needs for keys of length `d` and `n` positions.
pub fn attend_f16_scratch(d: usize, n: usize) -> usize {
    ATTEND_ROWS * (d + n) + ATTEND_KEYS * d
}

/// Keys per block of the tiled kernels (their widened copy lives in the scratch).
pub(crate) const ATTEND_KEYS: usize = 8;

/// Whether the selected kernels have a tiled [`attend_f16`] (else the
/// caller's per-token path over [`scores_f16`] and [`mix_f16`] is as fast).
pub fn has_tiled_attention() -> bool {
    Kernels::selected().attend_f16.is_some()
}

/// Softmax attention of up to [`ATTEND_ROWS`] query rows over an f16 KV
/// head: row `r`'s scores `scale · q_r · k_j` for `j` in its range, their
/// softmax (with the row's sink in the denominator, if any) rounded to f16 (as [`mix_f16`]'s callers round the weights), and
/// `out[r * dv..][..dv] = Σ_j p_rj · v_j`. The keys and values are read
/// once for all the rows. `scratch`: [`attend_f16_scratch`]`(d, n)` values.
pub fn attend_f16(a: &AttendRows<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let rows = a.ranges.len();
    assert!(rows > 0 && rows <= ATTEND_ROWS, "attend_f16: rows");
    assert!(a.d > 0 && a.dv > 0 && a.q.len() == rows * a.d, "attend_f16: queries");
    assert!(a.k.len().is_multiple_of(a.d), "attend_f16: keys");
    let n = a.k.len() / a.d;
    assert_eq!(a.v.len(), n * a.dv, "attend_f16: values");
    assert!(a.ranges.iter().all(|&(lo, hi)| lo < hi && hi <= n), "attend_f16: ranges");
    assert!(a.sinks.is_none_or(|s| s.len() == rows && s.iter().all(|v| v.is_finite())), "attend_f16: sinks");
    assert_eq!(out.len(), rows * a.dv, "attend_f16: output");
    assert!(scratch.len() >= attend_f16_scratch(a.d, n), "attend_f16: scratch");
    let kernel = Kernels::selected().attend_f16.unwrap_or(super::scalar::attend_f16);
    // SAFETY: the sizes are checked above; the table's kernels run on this CPU.
    unsafe { kernel(a, out, scratch) }
}

/// The two reads of a recurrent state matrix `s` (`k.len()` rows of
/// `u.len()` values) in one pass: `u = s^T k` and `out = s^T q`.
pub fn state_read(s: &[f32], k: &[f32], q: &[f32], u: &mut [f32], out: &mut [f32]) {
    assert!(k.len() == q.len() && u.len() == out.len(), "state_read: lengths");
    assert_eq!(s.len(), k.len() * u.len(), "state_read: state size");
    // SAFETY: as above.
    unsafe { (Kernels::selected().state_read)(s, k, q, u, out) }
}

/// The decayed rank-one update of a recurrent state matrix `s` (`k.len()`
/// rows of `d.len()` values): `s = decay * s + k d^T`.
pub fn state_update(s: &mut [f32], decay: f32, k: &[f32], d: &[f32]) {
    assert_eq!(s.len(), k.len() * d.len(), "state_update: state size");
    // SAFETY: as above.
    unsafe { (Kernels::selected().state_update)(s, decay, k, d) }
}

/// One token's step of a Mamba2 head's selective scan over its state `s`
/// (`x.len()` rows of `b.len()` values): `s_i = decay * s_i + (x_i dt) b`
/// for every row `i`, then `y_i = s_i . c`. One pass over the state: it is
/// read and written once per token.
pub fn ssm_scan(s: &mut [f32], decay: f32, dt: f32, x: &[f32], b: &[f32], c: &[f32], y: &mut [f32]) {
    assert!(b.len() == c.len() && x.len() == y.len(), "ssm_scan: lengths");
    assert_eq!(s.len(), x.len() * b.len(), "ssm_scan: state size");
    // SAFETY: as above.
    unsafe { (Kernels::selected().ssm_scan)(s, decay, dt, x, b, c, y) }
}

/// Rotary position embedding of `x` (`n_heads * head_dim` values, heads
/// contiguous) at position `pos`, on the first `n_rot` dims of each head
/// (partial rotary; the rest pass through).
///
/// Pair `i` (0..n_rot/2) turns by `pos * freq_scale * theta_base^(-2i/n_rot)`,
/// the angle built by repeated multiplication as ggml does. Normal mode
/// rotates adjacent pairs `(2i, 2i+1)`; NeoX mode pairs `(i, i + n_rot/2)`.
pub fn rope(x: &mut [f32], head_dim: usize, n_rot: usize, pos: usize, theta_base: f32, freq_scale: f32, neox: bool) {
    with_rope_angles(n_rot, pos, theta_base, freq_scale, |cs| rope_apply(x, head_dim, cs, neox));
}

/// `f` of the `(cos, sin)` of [`rope`]'s `n_rot / 2` angles at position `pos`
/// (on the stack up to 512 rotated dims): compute them once per position and
/// turn every head of the queries and keys with [`rope_apply`].
pub fn with_rope_angles<R>(
    n_rot: usize,
    pos: usize,
    theta_base: f32,
    freq_scale: f32,
    f: impl FnOnce(&[(f32, f32)]) -> R,
) -> R {
    with_rope_angles_factors(n_rot, pos, theta_base, freq_scale, None, f)
}

/// [`with_rope_angles`] with per-pair frequency factors (`n_rot / 2` of
/// them; ggml's `rope_freqs`): pair `i`'s angle is divided by `factors[i]`.
/// Gemma 4's proportional RoPE leaves pairs unrotated with factors of 1e30.
pub fn with_rope_angles_factors<R>(
    n_rot: usize,
    pos: usize,
    theta_base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    f: impl FnOnce(&[(f32, f32)]) -> R,
) -> R {
    assert!(n_rot.is_multiple_of(2), "rope: odd n_rot {n_rot}");
    if let Some(ff) = factors {
        assert_eq!(ff.len(), n_rot / 2, "rope: {} frequency factors for n_rot {n_rot}", ff.len());
    }
    let half = n_rot / 2;
    let mut stack = [(0.0f32, 0.0f32); 256];
    let mut big = Vec::new();
    let cs: &mut [(f32, f32)] = if half <= stack.len() {
        &mut stack[..half]
    } else {
        big.resize(half, (0.0, 0.0));
        &mut big
    };
    let theta_scale = theta_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for (i, c) in cs.iter_mut().enumerate() {
        // Frequency factors divide the angle (a huge factor leaves the pair unrotated).
        let t = match factors {
            Some(ff) => freq_scale * theta / ff[i],
            None => freq_scale * theta,
        };
        *c = (t.cos(), t.sin());
        theta *= theta_scale;
    }
    f(cs)
}

/// Turn the first `2 * cs.len()` dims of every head of `x` (heads of
/// `head_dim`, contiguous) by the angles `cs` of [`with_rope_angles`].
pub fn rope_apply(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)], neox: bool) {
    let half = cs.len();
    assert!(head_dim > 0 && x.len().is_multiple_of(head_dim), "rope: {} values in heads of {head_dim}", x.len());
    assert!(2 * half <= head_dim, "rope: n_rot {} for head_dim {head_dim}", 2 * half);
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in cs.iter().enumerate() {
            let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

#[cfg(test)]
mod gelu_table_tests {
    #[test]
    fn the_table_equals_the_formula() {
        let mut x: Vec<f32> = (-12_000..12_000).map(|i| i as f32 * 1e-3).collect();
        x.extend((0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).filter(|v| v.is_finite()));
        let mut y = x.clone();
        super::gelu_tanh(&mut y);
        for (&a, &b) in x.iter().zip(&y) {
            assert_eq!(super::gelu1(a).to_bits(), b.to_bits(), "gelu({a})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    #[test]
    fn rope_frequency_factors_divide_the_angles() {
        let plain = with_rope_angles(8, 7, 10_000.0, 1.0, |cs| cs.to_vec());
        let ones = with_rope_angles_factors(8, 7, 10_000.0, 1.0, Some(&[1.0; 4]), |cs| cs.to_vec());
        assert_eq!(plain, ones);
        // Gemma 4's proportional RoPE: a huge factor leaves the pair unrotated.
        let ff = [1.0, 2.0, 1e30, 1e30];
        let cs = with_rope_angles_factors(8, 7, 10_000.0, 1.0, Some(&ff), |cs| cs.to_vec());
        assert_eq!(cs[0], plain[0]);
        let half = 7.0f32 * 10_000f32.powf(-2.0 / 8.0) / 2.0;
        assert!(close(cs[1].0, half.cos(), 1e-6) && close(cs[1].1, half.sin(), 1e-6));
        for &(cos, sin) in &cs[2..] {
            assert!(cos == 1.0 && sin.abs() < 1e-20, "({cos}, {sin})");
        }
    }

    #[test]
    fn rms_norm_matches_formula() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, -1.0];
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
        let s = 1.0 / (ms + 1e-6f32).sqrt();
        let mut out = [0.0; 4];
        rms_norm(&mut out, &x, Some(&w), 1e-6);
        for i in 0..4 {
            assert!(close(out[i], x[i] * s * w[i], 1e-6));
        }
        let mut y = x;
        rms_norm_inplace(&mut y, Some(&w), 1e-6);
        assert_eq!(y, out);
        rms_norm_inplace(&mut y, None, 1e-6);
        let r: f32 = y.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!(close(r, 1.0, 1e-5));
    }

    #[test]
    fn softmax_and_activations() {
        let mut x = [1.0f32, 2.0, 3.0, -1e30];
        softmax(&mut x);
        let e = [(-2.0f32).exp(), (-1.0f32).exp(), 1.0];
        let z: f32 = e.iter().sum();
        for i in 0..3 {
            assert!(close(x[i], e[i] / z, 1e-6));
        }
        assert_eq!(x[3], 0.0);
        assert!(close(sigmoid(0.0), 0.5, 0.0));
        let mut s = [1.0f32, -3.0];
        silu(&mut s);
        assert!(close(s[0], 0.731_058_6, 1e-6) && close(s[1], -3.0 * sigmoid(-3.0), 1e-6));
        // GELU through f16 (ggml's table): 1.0 -> f16(0.841192) = 0.8413086
        let mut g = [1.0f32, -20.0, 20.0, 0.0];
        gelu_tanh(&mut g);
        assert_eq!(g, [0.841_308_6, 0.0, 20.0, 0.0]);
        let (mut o1, mut o2) = ([0.0; 2], [0.0; 2]);
        swiglu(&[1.0, -3.0], &[2.0, 0.5], &mut o1);
        assert!(close(o1[0], 2.0 * s[0], 1e-6) && close(o1[1], 0.5 * s[1], 1e-6));
        geglu(&[1.0, 0.0], &[2.0, 3.0], &mut o2);
        assert_eq!(o2, [2.0 * 0.841_308_6, 0.0]);
    }

    #[test]
    fn rope_normal_and_neox() {
        // Two heads of 6 dims, rotating the first 4 (partial rotary).
        let x: Vec<f32> = (0..12).map(|i| i as f32 + 1.0).collect();
        let (t0, t1) = (3.0f32, 3.0 * 100f32.powf(-0.5));
        let rot = |a: f32, b: f32, t: f32| (a * t.cos() - b * t.sin(), a * t.sin() + b * t.cos());
        let mut n = x.clone();
        rope(&mut n, 6, 4, 3, 100.0, 1.0, false);
        let mut neox = x.clone();
        rope(&mut neox, 6, 4, 3, 100.0, 1.0, true);
        for h in 0..2 {
            let b = 6 * h;
            // normal: pairs (0,1) and (2,3)
            let (a0, a1) = rot(x[b], x[b + 1], t0);
            let (a2, a3) = rot(x[b + 2], x[b + 3], t1);
            for (i, want) in [a0, a1, a2, a3].into_iter().enumerate() {
                assert!(close(n[b + i], want, 1e-5), "normal head {h} dim {i}");
            }
            // neox: pairs (0,2) and (1,3)
            let (c0, c2) = rot(x[b], x[b + 2], t0);
            let (c1, c3) = rot(x[b + 1], x[b + 3], t1);
            for (i, want) in [c0, c1, c2, c3].into_iter().enumerate() {
                assert!(close(neox[b + i], want, 1e-5), "neox head {h} dim {i}");
            }
            // dims past n_rot pass through
            assert_eq!(&n[b + 4..b + 6], &x[b + 4..b + 6]);
            assert_eq!(&neox[b + 4..b + 6], &x[b + 4..b + 6]);
        }
        // position 0 is the identity; freq_scale scales the angle
        let mut z = x.clone();
        rope(&mut z, 6, 6, 0, 1e4, 1.0, true);
        assert_eq!(z, x);
        let (mut a, mut b) = (x.clone(), x.clone());
        rope(&mut a, 6, 4, 6, 100.0, 0.5, false);
        rope(&mut b, 6, 4, 3, 100.0, 1.0, false);
        assert!(a.iter().zip(&b).all(|(p, q)| close(*p, *q, 1e-5)));
    }

    #[test]
    fn elementwise() {
        let mut a = [1.0f32, 2.0, 3.0];
        add(&mut a, &[1.0, 1.0, 1.0]);
        mul(&mut a, &[2.0, 0.5, 1.0]);
        scale(&mut a, 2.0);
        assert_eq!(a, [8.0, 3.0, 8.0]);
        assert_eq!(dot_f32(&a, &[1.0, 1.0, 1.0]), 19.0);
        let h: Vec<f16> = [1.0f32, 2.0, 0.5].iter().map(|&v| f16::from_f32(v)).collect();
        // two heads against one key; two keys weighted for one head
        let mut s = [0.0f32; 2];
        scores_f16(&[a[0], a[1], a[2], 1.0, 1.0, 1.0], 2, &h, &mut s);
        assert_eq!(s, [8.0 + 6.0 + 4.0, 3.5]);
        let hh: Vec<f16> = h.iter().chain(&h).copied().collect();
        let mut m = [9.0f32; 3];
        mix_f16(&[2.0, -1.0], 1, &hh, &mut m);
        assert_eq!(m, [1.0, 2.0, 0.5]);
        axpy_f32(&mut a, -1.0, &[1.0, 1.0, 1.0]);
        assert_eq!(a, [7.0, 2.0, 7.0]);
    }
}
