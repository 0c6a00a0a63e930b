//! f32 helpers of the forward pass: norms, activations, RoPE, elementwise ops,
//! and the dot/axpy pair attention runs over an f32 or f16 KV cache.
//!
//! Formulas follow ggml's CPU backend (accumulation width, constants, RoPE
//! angle recurrence), so results track the reference engine. The dot and axpy
//! kernels go through the SIMD table; the rest is simple enough for the
//! compiler to vectorise.

use super::dispatch::Kernels;
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
fn silu1(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU (tanh approximation) as ggml evaluates it for f32: through an f16
/// table, i.e. the input rounded to f16 and the result rounded to f16, with
/// identity/zero beyond +-10.
#[inline]
fn gelu1(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let h = f16::from_f32(x).to_f32();
        let g = 0.5 * h * (1.0 + (SQRT_2_OVER_PI * h * (1.0 + COEF_A * h * h)).tanh());
        f16::from_f32(g).to_f32()
    }
}

/// In-place SiLU: `x * sigmoid(x)`.
pub fn silu(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu1(*v));
}

/// In-place GELU, tanh approximation (ggml's `gelu`).
pub fn gelu_tanh(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu1(*v));
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

/// `sum(a * b)` with `b` in f16 (a key of an f16 KV cache), in f32.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: lengths");
    // SAFETY: as above.
    unsafe { (Kernels::selected().dot_f16)(a, b) }
}

/// `out += a * x`.
pub fn axpy_f32(out: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(out.len(), x.len(), "axpy_f32: lengths");
    // SAFETY: as above.
    unsafe { (Kernels::selected().axpy_f32)(out, a, x) }
}

/// `out += a * x` with `x` in f16 (a value of an f16 KV cache).
pub fn axpy_f16(out: &mut [f32], a: f32, x: &[f16]) {
    assert_eq!(out.len(), x.len(), "axpy_f16: lengths");
    // SAFETY: as above.
    unsafe { (Kernels::selected().axpy_f16)(out, a, x) }
}

/// Rotary position embedding of `x` (`n_heads * head_dim` values, heads
/// contiguous) at position `pos`, on the first `n_rot` dims of each head
/// (partial rotary; the rest pass through).
///
/// Pair `i` (0..n_rot/2) turns by `pos * freq_scale * theta_base^(-2i/n_rot)`,
/// the angle built by repeated multiplication as ggml does. Normal mode
/// rotates adjacent pairs `(2i, 2i+1)`; NeoX mode pairs `(i, i + n_rot/2)`.
pub fn rope(x: &mut [f32], head_dim: usize, n_rot: usize, pos: usize, theta_base: f32, freq_scale: f32, neox: bool) {
    assert!(head_dim > 0 && x.len().is_multiple_of(head_dim), "rope: {} values in heads of {head_dim}", x.len());
    assert!(n_rot <= head_dim && n_rot.is_multiple_of(2), "rope: n_rot {n_rot} for head_dim {head_dim}");
    let half = n_rot / 2;
    let mut cache = [(0.0f32, 0.0f32); 256];
    let mut big = Vec::new();
    let cs: &mut [(f32, f32)] = if half <= cache.len() {
        &mut cache[..half]
    } else {
        big.resize(half, (0.0, 0.0));
        &mut big
    };
    let theta_scale = theta_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for c in cs.iter_mut() {
        let t = freq_scale * theta;
        *c = (t.cos(), t.sin());
        theta *= theta_scale;
    }
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in cs.iter().enumerate() {
            let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// Scalar twins of the table's f32 kernels.
pub(crate) mod scalar {
    use half::f16;

    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(&x, &y)| x * y).sum()
    }

    pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        a.iter().zip(b).map(|(&x, &y)| x * y.to_f32()).sum()
    }

    pub fn axpy_f32(out: &mut [f32], a: f32, x: &[f32]) {
        out.iter_mut().zip(x).for_each(|(o, &v)| *o += a * v);
    }

    pub fn axpy_f16(out: &mut [f32], a: f32, x: &[f16]) {
        out.iter_mut().zip(x).for_each(|(o, &v)| *o += a * v.to_f32());
    }
}
