//! Scalar twins of the table's f32 kernels: the reference each SIMD body is
//! tested against, and the scalar path's entries.

use crate::quant::f16_to_f32;
use half::f16;

/// In-place SiLU with libm's `expf`.
pub fn silu(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = super::ops::silu1(*v));
}

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

pub fn axpy_f32(out: &mut [f32], a: f32, x: &[f32]) {
    out.iter_mut().zip(x).for_each(|(o, &v)| *o += a * v);
}

pub fn scores_f16(q: &[f32], heads: usize, k: &[f16], out: &mut [f32]) {
    let d = q.len() / heads;
    let n = k.len() / d;
    for (qg, out) in q.chunks_exact(d).zip(out.chunks_exact_mut(n)) {
        for (o, kj) in out.iter_mut().zip(k.chunks_exact(d)) {
            *o = qg.iter().zip(kj).map(|(&x, &y)| x * f16_to_f32(y.to_bits())).sum();
        }
    }
}

pub fn mix_f16(w: &[f32], heads: usize, v: &[f16], out: &mut [f32]) {
    mix_f16_cols(w, heads, v, out, 0);
}

/// [`mix_f16`] on columns `from..` of every head only (the SIMD kernels'
/// tails).
pub fn mix_f16_cols(w: &[f32], heads: usize, v: &[f16], out: &mut [f32], from: usize) {
    let d = out.len() / heads;
    let n = v.len() / d;
    for (wg, out) in w.chunks_exact(n).zip(out.chunks_exact_mut(d)) {
        out[from..].fill(0.0);
        for (&a, vj) in wg.iter().zip(v.chunks_exact(d)) {
            out[from..].iter_mut().zip(&vj[from..]).for_each(|(o, &x)| *o += a * f16_to_f32(x.to_bits()));
        }
    }
}

/// [`super::ops::attend_f16`] one row at a time: scores summed in f32 in
/// key order, `exp` from libm, the normaliser summed in f32, the weights
/// rounded to f16.
pub fn attend_f16(a: &super::ops::AttendRows<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let (d, dv) = (a.d, a.dv);
    for (r, &(lo, hi)) in a.ranges.iter().enumerate() {
        let q = &a.q[r * d..][..d];
        let p = &mut scratch[lo..hi];
        for (j, s) in (lo..hi).zip(p.iter_mut()) {
            let dot: f32 = q.iter().zip(&a.k[j * d..][..d]).map(|(&x, &y)| x * f16_to_f32(y.to_bits())).sum();
            *s = dot * a.scale;
        }
        let max = p.iter().fold(f32::MIN, |m, &s| m.max(s));
        let mut sum = 0.0f32;
        for s in p.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        for s in p.iter_mut() {
            *s = f16::from_f32(*s * inv).to_f32();
        }
        let o = &mut out[r * dv..][..dv];
        o.fill(0.0);
        for (j, &w) in (lo..hi).zip(p.iter()) {
            o.iter_mut().zip(&a.v[j * dv..][..dv]).for_each(|(o, &x)| *o += w * f16_to_f32(x.to_bits()));
        }
    }
}

pub fn state_read(s: &[f32], k: &[f32], q: &[f32], u: &mut [f32], out: &mut [f32]) {
    state_read_cols(s, k, q, u, out, 0);
}

pub fn state_update(s: &mut [f32], decay: f32, k: &[f32], d: &[f32]) {
    state_update_cols(s, decay, k, d, 0);
}

/// [`state_read`] on columns `from..` only (the SIMD kernels' tails).
pub fn state_read_cols(s: &[f32], k: &[f32], q: &[f32], u: &mut [f32], out: &mut [f32], from: usize) {
    let dv = u.len();
    if dv == 0 {
        return;
    }
    u[from..].fill(0.0);
    out[from..].fill(0.0);
    for ((row, &ki), &qi) in s.chunks_exact(dv).zip(k).zip(q) {
        axpy_f32(&mut u[from..], ki, &row[from..]);
        axpy_f32(&mut out[from..], qi, &row[from..]);
    }
}

/// [`state_update`] on columns `from..` only (the SIMD kernels' tails).
pub fn state_update_cols(s: &mut [f32], decay: f32, k: &[f32], d: &[f32], from: usize) {
    if d.is_empty() {
        return;
    }
    for (row, &ki) in s.chunks_exact_mut(d.len()).zip(k) {
        row[from..].iter_mut().zip(&d[from..]).for_each(|(v, &dj)| *v = decay * *v + ki * dj);
    }
}
