//! Scalar twins of the table's f32 kernels: the reference each SIMD body is
//! tested against, and the scalar path's entries.

use super::table::{Exact, ExactDot};
use crate::quant::{f16_to_f32, GgmlType};
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

/// `e^x` for `x <= 0` as the tiled attention kernels compute it, lane for
/// lane: `x` clamped at -87, `x = m ln 2 + r` (`m` rounded to even, `ln 2`
/// in two parts), a degree-6 Taylor polynomial in `r` by fused multiply-adds,
/// times `2^m` made in the exponent bits. Within 4 ulp of libm's.
pub fn exp_attend(x: f32) -> f32 {
    let x = x.max(-87.0);
    let m = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-m).mul_add(LN2_HI, x);
    let r = (-m).mul_add(LN2_LO, r);
    let p = EXP_TAYLOR.iter().fold(1.0 / 720.0, |p: f32, &c| p.mul_add(r, c));
    p * f32::from_bits(((m as i32 + 127) << 23) as u32)
}

/// `ln 2` = `LN2_HI + LN2_LO`, the high part exact in few bits.
pub(crate) const LN2_HI: f32 = 0.693_145_75;
pub(crate) const LN2_LO: f32 = 1.428_606_8e-6;
/// The Taylor coefficients of `e^r` after `1/6!`, highest first.
pub(crate) const EXP_TAYLOR: [f32; 6] = [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];

/// [`super::ops::attend_f16`] one row at a time, in the order and roundings
/// of the SIMD kernels' lanes (fused multiply-adds along the dimension and
/// down the positions, [`exp_attend`], the normaliser summed in key order
/// after the row's sink,
/// the weights rounded to f16), so they agree to the bit.
pub fn attend_f16(a: &super::ops::AttendRows<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let (d, dv) = (a.d, a.dv);
    for (r, &(lo, hi)) in a.ranges.iter().enumerate() {
        let q = &a.q[r * d..][..d];
        let p = &mut scratch[lo..hi];
        for (j, s) in (lo..hi).zip(p.iter_mut()) {
            let k = &a.k[j * d..][..d];
            let dot = q.iter().zip(k).fold(0.0f32, |acc, (&x, &y)| x.mul_add(f16_to_f32(y.to_bits()), acc));
            *s = dot * a.scale;
        }
        // A sink joins the maximum and starts the sum.
        let sink = a.sinks.map(|s| s[r]);
        let max = p.iter().fold(sink.map_or(f32::MIN, |s| s.max(f32::MIN)), |m, &s| m.max(s));
        let mut sum = sink.map_or(0.0, |s| exp_attend(s - max));
        for s in p.iter_mut() {
            *s = exp_attend(*s - max);
            sum += *s;
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        for s in p.iter_mut() {
            *s = f16::from_f32(*s * inv).to_f32();
        }
        let o = &mut out[r * dv..][..dv];
        o.fill(0.0);
        for (j, &w) in (lo..hi).zip(p.iter()) {
            o.iter_mut().zip(&a.v[j * dv..][..dv]).for_each(|(o, &x)| *o = w.mul_add(f16_to_f32(x.to_bits()), *o));
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

/// The scalar path's exact kernels (see [`Exact`]): the formats whose dot
/// products are written over `N` activation rows (`vec_dot_rows`), up to
/// four rows per pass over the weights.
pub(crate) fn exact_dot(ty: GgmlType) -> Option<ExactDot> {
    use crate::quant::{q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
    /// An exact kernel from a format's `vec_dot_rows`.
    macro_rules! exact {
        ($variant:ident, $m:ident) => {
            ExactDot::$variant(Exact {
                acts: 4,
                // SAFETY (the caller's): `out` holds the outputs (see `ExactRows`).
                rows: |w, row_bytes, a, out, stride| unsafe {
                    match *a {
                        [a0] => exact_rows(w, row_bytes, [a0], out, stride, $m::vec_dot_rows),
                        [a0, a1] => exact_rows(w, row_bytes, [a0, a1], out, stride, $m::vec_dot_rows),
                        [a0, a1, a2] => exact_rows(w, row_bytes, [a0, a1, a2], out, stride, $m::vec_dot_rows),
                        [a0, a1, a2, a3] => exact_rows(w, row_bytes, [a0, a1, a2, a3], out, stride, $m::vec_dot_rows),
                        _ => panic!("exact kernels take 1 to 4 activation rows, not {}", a.len()),
                    }
                },
            })
        };
    }
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => exact!(Q8_0, q4_0),
        T::Q5_0 => exact!(Q8_0, q5_0),
        T::Q8_0 => exact!(Q8_0, q8_0),
        T::Q4_1 => exact!(Q8_1, q4_1),
        T::Q5_1 => exact!(Q8_1, q5_1),
        T::Q3K => exact!(Q8K, q3_k),
        T::Q4K => exact!(Q8K, q4_k),
        T::Q5K => exact!(Q8K, q5_k),
        T::Q6K => exact!(Q8K, q6_k),
        _ => return None,
    })
}

/// Every weight row of `w` (`row_bytes` each) with the `N` activation rows
/// `a`: row `r` with activation row `t` into `out[t * stride + r]`.
///
/// # Safety
/// `out` must hold those elements.
#[inline(always)]
unsafe fn exact_rows<B, const N: usize>(
    w: &[u8],
    row_bytes: usize,
    a: [&[B]; N],
    out: *mut f32,
    stride: usize,
    dot: impl Fn(&[u8], [&[B]; N]) -> [f32; N],
) {
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        for (t, v) in dot(row, a).into_iter().enumerate() {
            // SAFETY: in `out` (caller).
            unsafe { *out.add(t * stride + r) = v };
        }
    }
}

/// Lanes of [`ssm_scan`]'s dot products, as the SIMD kernels' registers hold them.
pub const SCAN_LANES: usize = 16;

/// One token's step of a selective-scan head (see [`super::ops::ssm_scan`]):
/// per state row `i`, `s_i = s_i * decay + b * (x_i dt)` (two products and a
/// sum, unfused, as ggml's scan), then `y_i = s_i . c` summed in
/// [`SCAN_LANES`] lanes (lane `l` takes the columns `j ≡ l` mod 16 by fused
/// multiply-adds), the lanes added in halves (`l + l+8`, then 4, 2, 1), the
/// last `len % 16` columns after them one at a time: the SIMD kernels' order,
/// so they agree to the bit (and on aarch64 this loop vectorises as it is).
pub fn ssm_scan(s: &mut [f32], decay: f32, dt: f32, x: &[f32], b: &[f32], c: &[f32], y: &mut [f32]) {
    let ds = b.len();
    if ds == 0 {
        y.fill(0.0);
        return;
    }
    let full = ds / SCAN_LANES * SCAN_LANES;
    for ((row, &xi), y) in s.chunks_exact_mut(ds).zip(x).zip(y) {
        let xd = xi * dt;
        let (head, tail) = row.split_at_mut(full);
        let mut acc = [0f32; SCAN_LANES];
        for ((sv, bv), cv) in
            head.chunks_exact_mut(SCAN_LANES).zip(b.chunks_exact(SCAN_LANES)).zip(c.chunks_exact(SCAN_LANES))
        {
            for l in 0..SCAN_LANES {
                sv[l] = sv[l] * decay + bv[l] * xd;
                acc[l] = sv[l].mul_add(cv[l], acc[l]);
            }
        }
        let mut width = SCAN_LANES / 2;
        while width > 0 {
            for l in 0..width {
                acc[l] += acc[l + width];
            }
            width /= 2;
        }
        let mut sum = acc[0];
        for ((sv, &bv), &cv) in tail.iter_mut().zip(&b[full..]).zip(&c[full..]) {
            *sv = *sv * decay + bv * xd;
            sum = sv.mul_add(cv, sum);
        }
        *y = sum;
    }
}
