//! NEON kernels over plain floats: F32/F16/BF16 weight rows against f32
//! activations, and the dot/axpy pair of attention. Four accumulators of 4
//! lanes; tails run scalar. f16 widens with `fcvtl` (base AArch64).

// Register blocks are indexed by token and lane at once: index loops read best.
#![allow(clippy::needless_range_loop)]

use half::f16 as F16;
use std::arch::aarch64::*;
use std::arch::asm;

use crate::kernels::simd::head_passes;

/// 8 f16 from `p` (any alignment) as two f32x4.
#[inline(always)]
unsafe fn load_f16x8(p: *const u8) -> (float32x4_t, float32x4_t) {
    let h = vld1q_u8(p);
    let (lo, hi): (float32x4_t, float32x4_t);
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        // `lo` is written before `h` is read again: an early-clobber `out`,
        // never `lateout` (which may share `h`'s register).
        h = in(vreg) h, lo = out(vreg) lo, hi = lateout(vreg) hi,
        options(pure, nomem, nostack)
    );
    (lo, hi)
}

/// 8 bf16 from `p` as two f32x4: widen into the high half of 32 bits.
#[inline(always)]
unsafe fn load_bf16x8(p: *const u8) -> (float32x4_t, float32x4_t) {
    let h = vld1q_u16(p.cast());
    (vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))), vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)))
}

/// `sum w[i] * x[i]` where `load(i)` yields weights `i..i + 8`.
#[inline(always)]
unsafe fn dot_with(x: &[f32], load: impl Fn(usize) -> (float32x4_t, float32x4_t), tail: impl Fn(usize) -> f32) -> f32 {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        let (a0, a1) = load(i);
        let (a2, a3) = load(i + 8);
        acc[0] = vfmaq_f32(acc[0], a0, vld1q_f32(xp.add(i)));
        acc[1] = vfmaq_f32(acc[1], a1, vld1q_f32(xp.add(i + 4)));
        acc[2] = vfmaq_f32(acc[2], a2, vld1q_f32(xp.add(i + 8)));
        acc[3] = vfmaq_f32(acc[3], a3, vld1q_f32(xp.add(i + 12)));
        i += 16;
    }
    while i + 8 <= n {
        let (a0, a1) = load(i);
        acc[0] = vfmaq_f32(acc[0], a0, vld1q_f32(xp.add(i)));
        acc[1] = vfmaq_f32(acc[1], a1, vld1q_f32(xp.add(i + 4)));
        i += 8;
    }
    let s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    vaddvq_f32(s) + (i..n).map(|j| tail(j) * x[j]).sum::<f32>()
}

fn f16_at(w: &[u8], j: usize) -> f32 {
    F16::from_bits(u16::from_le_bytes([w[2 * j], w[2 * j + 1]])).to_f32()
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn f32(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 4 * x.len());
    let p = w.as_ptr();
    dot_with(
        x,
        |i| (vld1q_f32(p.add(4 * i).cast()), vld1q_f32(p.add(4 * i + 16).cast())),
        |j| f32::from_le_bytes([w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]]),
    )
}

/// Consecutive F32 weight rows (`row_bytes` each) against `x`, two rows a
/// pass sharing the activation loads; each row's sum in the order [`f32`]
/// forms it (four accumulators, the same pairing and tail), so the same
/// floats.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn f32_rows(w: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    let n = x.len();
    debug_assert!(row_bytes == 4 * n && w.len() >= out.len() * row_bytes);
    let xp = x.as_ptr();
    let rows = out.len();
    for r in (0..rows / 2).map(|p| 2 * p) {
        let (p0, p1) = (w.as_ptr().add(r * row_bytes).cast::<f32>(), w.as_ptr().add((r + 1) * row_bytes).cast::<f32>());
        let (mut a, mut b) = ([vdupq_n_f32(0.0); 4], [vdupq_n_f32(0.0); 4]);
        let mut i = 0;
        // Steps of 16 columns into the four accumulators, then of 8 into
        // the first two (as `dot_with` takes them).
        for (step, accs) in [(16, 4), (8, 2)] {
            while i + step <= n {
                for k in 0..accs {
                    let xv = vld1q_f32(xp.add(i + 4 * k));
                    a[k] = vfmaq_f32(a[k], vld1q_f32(p0.add(i + 4 * k)), xv);
                    b[k] = vfmaq_f32(b[k], vld1q_f32(p1.add(i + 4 * k)), xv);
                }
                i += step;
            }
        }
        let sum = |acc: [float32x4_t; 4], p: *const f32| {
            let s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
            vaddvq_f32(s) + (i..n).map(|j| p.add(j).read_unaligned() * x[j]).sum::<f32>()
        };
        out[r] = sum(a, p0);
        out[r + 1] = sum(b, p1);
    }
    if rows % 2 == 1 {
        out[rows - 1] = f32(&w[(rows - 1) * row_bytes..rows * row_bytes], x);
    }
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn f16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 2 * x.len());
    let p = w.as_ptr();
    dot_with(x, |i| load_f16x8(p.add(2 * i)), |j| f16_at(w, j))
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn bf16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 2 * x.len());
    let p = w.as_ptr();
    dot_with(
        x,
        |i| load_bf16x8(p.add(2 * i)),
        |j| f32::from_bits((u16::from_le_bytes([w[2 * j], w[2 * j + 1]]) as u32) << 16),
    )
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let p = b.as_ptr();
    dot_with(a, |i| (vld1q_f32(p.add(i)), vld1q_f32(p.add(i + 4))), |j| b[j])
}

/// `out[i] += a * x[i]`, 8 lanes at a time.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn axpy_f32(out: &mut [f32], a: f32, x: &[f32]) {
    let n = out.len().min(x.len());
    let (op, xp) = (out.as_mut_ptr(), x.as_ptr());
    let mut i = 0;
    while i + 8 <= n {
        vst1q_f32(op.add(i), vfmaq_n_f32(vld1q_f32(op.add(i)), vld1q_f32(xp.add(i)), a));
        vst1q_f32(op.add(i + 4), vfmaq_n_f32(vld1q_f32(op.add(i + 4)), vld1q_f32(xp.add(i + 4)), a));
        i += 8;
    }
    for (o, &v) in out[i..].iter_mut().zip(&x[i..]) {
        *o += a * v;
    }
}

/// `out[g * n + j] = q_g · k_j`: see [`crate::kernels::ops::scores_f16`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn scores_f16(q: &[f32], heads: usize, k: &[F16], out: &mut [f32]) {
    let (d, n) = (q.len() / heads, k.len() / (q.len() / heads));
    head_passes!(heads, |g, h| scores_h::<H>(&q[g * d..(g + h) * d], k, &mut out[g * n..]));
}

/// [`scores_f16`] for `H` heads: key row by key row, 8 values widened at a
/// time and met by every head (two accumulators per head).
#[inline(always)]
unsafe fn scores_h<const H: usize>(q: &[f32], k: &[F16], out: &mut [f32]) {
    let d = q.len() / H;
    let n = k.len() / d;
    debug_assert!(out.len() >= H * n);
    let qp: [*const f32; H] = std::array::from_fn(|h| q.as_ptr().add(h * d));
    for (j, kj) in k.chunks_exact(d).enumerate() {
        let kp = kj.as_ptr().cast::<u8>();
        let mut acc = [[vdupq_n_f32(0.0); 2]; H];
        let mut i = 0;
        while i + 8 <= d {
            let (k0, k1) = load_f16x8(kp.add(2 * i));
            for h in 0..H {
                acc[h][0] = vfmaq_f32(acc[h][0], k0, vld1q_f32(qp[h].add(i)));
                acc[h][1] = vfmaq_f32(acc[h][1], k1, vld1q_f32(qp[h].add(i + 4)));
            }
            i += 8;
        }
        for h in 0..H {
            let tail: f32 = (i..d).map(|t| *qp[h].add(t) * kj[t].to_f32()).sum();
            *out.get_unchecked_mut(h * n + j) = vaddvq_f32(vaddq_f32(acc[h][0], acc[h][1])) + tail;
        }
    }
}

/// `out[g * d..][..d] = Σ_j w[g * n + j] · v_j`: see
/// [`crate::kernels::ops::mix_f16`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn mix_f16(w: &[f32], heads: usize, v: &[F16], out: &mut [f32]) {
    let d = out.len() / heads;
    let n = v.len() / d;
    head_passes!(heads, |g, h| mix_h::<H>(&w[g * n..(g + h) * n], v, &mut out[g * d..(g + h) * d]));
}

/// [`mix_f16`] for `H` heads: 16 columns at a time held in registers for
/// every head while the value rows stream past, each 8 values widened once.
#[inline(always)]
unsafe fn mix_h<const H: usize>(w: &[f32], v: &[F16], out: &mut [f32]) {
    let d = out.len() / H;
    let n = w.len() / H;
    let vp = v.as_ptr().cast::<u8>();
    let op = out.as_mut_ptr();
    let mut c = 0;
    while c + 16 <= d {
        let mut acc = [[vdupq_n_f32(0.0); 4]; H];
        for j in 0..n {
            let p = vp.add(2 * (j * d + c));
            let ((v0, v1), (v2, v3)) = (load_f16x8(p), load_f16x8(p.add(16)));
            for h in 0..H {
                let a = *w.get_unchecked(h * n + j);
                acc[h][0] = vfmaq_n_f32(acc[h][0], v0, a);
                acc[h][1] = vfmaq_n_f32(acc[h][1], v1, a);
                acc[h][2] = vfmaq_n_f32(acc[h][2], v2, a);
                acc[h][3] = vfmaq_n_f32(acc[h][3], v3, a);
            }
        }
        for h in 0..H {
            for (u, &a) in acc[h].iter().enumerate() {
                vst1q_f32(op.add(h * d + c + 4 * u), a);
            }
        }
        c += 16;
    }
    // The last d % 16 columns.
    crate::kernels::scalar::mix_f16_cols(w, H, v, out, c);
}

/// Columns per block of `state_read`: 8 registers per vector kept in
/// registers while the rows stream past (16 for its two sums), so each
/// row's scalar loads and loop step are paid once per 32 columns:
/// instructions per state element 1.0 -> 0.81; each column's sums in the
/// same order. (`state_update` takes blocks of 64.)
const STATE_COLS: usize = 32;
/// Vectors per block.
const STATE_VECS: usize = STATE_COLS / 4;

/// `u = s^T k`, `out = s^T q` for a row-major state of `k.len()` rows of
/// `u.len()`: one pass over the state, column blocks held in registers.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn state_read(s: &[f32], k: &[f32], q: &[f32], u: &mut [f32], out: &mut [f32]) {
    let dv = u.len();
    let rows = k.len().min(s.len() / dv.max(1));
    let blocks = dv / STATE_COLS * STATE_COLS;
    let sp = s.as_ptr();
    for c in (0..blocks).step_by(STATE_COLS) {
        let mut au = [vdupq_n_f32(0.0); STATE_VECS];
        let mut ao = [vdupq_n_f32(0.0); STATE_VECS];
        for r in 0..rows {
            let (kr, qr) = (*k.get_unchecked(r), *q.get_unchecked(r));
            let p = sp.add(r * dv + c);
            for i in 0..STATE_VECS {
                let v = vld1q_f32(p.add(4 * i));
                au[i] = vfmaq_n_f32(au[i], v, kr);
                ao[i] = vfmaq_n_f32(ao[i], v, qr);
            }
        }
        for i in 0..STATE_VECS {
            vst1q_f32(u.as_mut_ptr().add(c + 4 * i), au[i]);
            vst1q_f32(out.as_mut_ptr().add(c + 4 * i), ao[i]);
        }
    }
    crate::kernels::scalar::state_read_cols(s, k, q, u, out, blocks);
}

/// `s = decay * s + k d^T`, column blocks of `d` held in registers.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn state_update(s: &mut [f32], decay: f32, k: &[f32], d: &[f32]) {
    let dv = d.len();
    let rows = k.len().min(s.len() / dv.max(1));
    // Blocks of 64 columns (16 registers of `d`), then one of 32: the update
    // holds no sums, so it can take twice the read's block (1.0 -> 0.81
    // instructions an element, against 0.88 at 32).
    let mut c = 0;
    while c + 64 <= dv {
        update_block::<16>(s.as_mut_ptr(), dv, c, rows, decay, k, d);
        c += 64;
    }
    if c + 32 <= dv {
        update_block::<8>(s.as_mut_ptr(), dv, c, rows, decay, k, d);
        c += 32;
    }
    crate::kernels::scalar::state_update_cols(s, decay, k, d, c);
}

/// [`state_update`] on columns `c..c + 4V` of the `rows` rows (each `dv`
/// long) at `sp`, `d`'s block held in `V` registers.
#[inline(always)]
unsafe fn update_block<const V: usize>(
    sp: *mut f32,
    dv: usize,
    c: usize,
    rows: usize,
    decay: f32,
    k: &[f32],
    d: &[f32],
) {
    let dd: [float32x4_t; V] = std::array::from_fn(|i| vld1q_f32(d.as_ptr().add(c + 4 * i)));
    for r in 0..rows {
        let kr = *k.get_unchecked(r);
        let p = sp.add(r * dv + c);
        for (i, di) in dd.iter().enumerate() {
            let v = vmulq_n_f32(vld1q_f32(p.add(4 * i)), decay);
            vst1q_f32(p.add(4 * i), vfmaq_n_f32(v, *di, kr));
        }
    }
}

/// In-place SiLU, `x / (1 + e^-x)`, four lanes at a time with a polynomial
/// `e^t` ([`silu_exp`](crate::kernels::simd::silu_exp): Cephes' reduction and
/// coefficients): within a few ulp of libm's `expf` (the scalar twin), at a
/// tenth of its instructions.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn silu(x: &mut [f32]) {
    use crate::kernels::simd::silu_exp::*;
    let mut chunks = x.chunks_exact_mut(4);
    for c in &mut chunks {
        let v = vld1q_f32(c.as_ptr());
        let t = vminq_f32(vmaxq_f32(vnegq_f32(v), vdupq_n_f32(T_MIN)), vdupq_n_f32(T_MAX));
        let n = vrndnq_f32(vmulq_n_f32(t, LOG2E));
        let r = vfmsq_f32(vfmsq_f32(t, n, vdupq_n_f32(LN2_HI)), n, vdupq_n_f32(LN2_LO));
        let mut p = vdupq_n_f32(P[0]);
        for &c in &P[1..] {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        // e^r = 1 + r + r^2 p(r), then times 2^n through the exponent bits.
        let e = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0));
        let e = vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(e), vshlq_n_s32::<23>(vcvtq_s32_f32(n))));
        // The numerator clamped (NaNs pass).
        let num = vmaxq_f32(v, vdupq_n_f32(NUM_MIN));
        vst1q_f32(c.as_mut_ptr(), vdivq_f32(num, vaddq_f32(e, vdupq_n_f32(1.0))));
    }
    crate::kernels::scalar::silu(chunks.into_remainder());
}
