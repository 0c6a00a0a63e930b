//! AVX2 kernels over plain floats: F32/F16/BF16 weight rows against f32
//! activations, and the dot/axpy pair of attention. Four accumulators of 8
//! lanes hide the FMA latency; tails run scalar. The loader closures are
//! defined inside the `#[target_feature]` functions, so they inherit the
//! features and their intrinsics inline.

// Register blocks are indexed by token and lane at once: index loops read best.
#![allow(clippy::needless_range_loop)]

pub(crate) mod avx2 {
    use super::super::hsum_ps;
    use crate::kernels::simd::head_passes;
    use half::f16 as F16;
    use std::arch::x86_64::*;

    /// `sum load(w, i) * x[i]` where `load` yields 8 f32 weights from element
    /// `i`: [`dot_n_with`] for one row, so that prefill and decode sum alike.
    #[inline(always)]
    unsafe fn dot_with(n: usize, x: &[f32], load: impl Fn(usize) -> __m256, tail: impl Fn(usize) -> f32) -> f32 {
        dot_n_with::<1>(n, [x], load, tail)[0]
    }

    /// [`dot_with`] for `N` activation rows: each 8 weights are loaded (and
    /// converted) once for all of them (prefill: the router's F32 rows over a
    /// prompt). Four accumulators of 8 lanes per row hide the FMA latency;
    /// they fill the registers at three rows, so four rows run as two passes
    /// of two. Every `N` sums a row the same way: the one-row kernels
    /// ([`dot_with`]) and the multi-row ones give the same products to the bit.
    #[inline(always)]
    unsafe fn dot_n_with<const N: usize>(
        n: usize,
        x: [&[f32]; N],
        load: impl Fn(usize) -> __m256,
        tail: impl Fn(usize) -> f32,
    ) -> [f32; N] {
        let mut acc = [[_mm256_setzero_ps(); 4]; N];
        let xp = x.map(<[f32]>::as_ptr);
        let mut i = 0;
        while i + 32 <= n {
            for u in 0..4 {
                let w = load(i + 8 * u);
                for t in 0..N {
                    acc[t][u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp[t].add(i + 8 * u)), acc[t][u]);
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            let w = load(i);
            for t in 0..N {
                acc[t][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp[t].add(i)), acc[t][0]);
            }
            i += 8;
        }
        let mut out = [0f32; N];
        for t in 0..N {
            let [a0, a1, a2, a3] = acc[t];
            let sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            out[t] = hsum_ps(sum) + (i..n).map(|j| tail(j) * x[t][j]).sum::<f32>();
        }
        out
    }

    /// 8 f16 from `p` (any alignment) as f32.
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    /// 8 bf16 from `p` as f32: widen to 32 bits, shift into the high half.
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())), 16))
    }

    fn f16_at(w: &[u8], j: usize) -> f32 {
        F16::from_bits(u16::from_le_bytes([w[2 * j], w[2 * j + 1]])).to_f32()
    }

    fn f32_at(w: &[u8], j: usize) -> f32 {
        f32::from_le_bytes([w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]])
    }

    fn bf16_at(w: &[u8], j: usize) -> f32 {
        f32::from_bits((u16::from_le_bytes([w[2 * j], w[2 * j + 1]]) as u32) << 16)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f32(w: &[u8], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), 4 * x.len());
        let p = w.as_ptr();
        dot_with(x.len(), x, |i| _mm256_loadu_ps(p.add(4 * i).cast()), |j| f32_at(w, j))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16(w: &[u8], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), 2 * x.len());
        let p = w.as_ptr();
        dot_with(x.len(), x, |i| load_f16(p.add(2 * i)), |j| f16_at(w, j))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn bf16(w: &[u8], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), 2 * x.len());
        let p = w.as_ptr();
        dot_with(x.len(), x, |i| load_bf16(p.add(2 * i)), |j| bf16_at(w, j))
    }

    /// `x2`, `x3`, `x4` of a float weight format: one row with that many
    /// activation rows ([`dot_n_with`]).
    macro_rules! multi {
        ($m:ident, $width:literal, $load:expr, $tail:expr) => {
            pub(crate) mod $m {
                use super::*;
                multi!(@n x2, 2, $width, $load, $tail);
                multi!(@n x3, 3, $width, $load, $tail);
                #[target_feature(enable = "avx2,fma,f16c")]
                pub(crate) unsafe fn x4(w: &[u8], x: [&[f32]; 4]) -> [f32; 4] {
                    let ([a, b], [c, d]) = (x2(w, [x[0], x[1]]), x2(w, [x[2], x[3]]));
                    [a, b, c, d]
                }
            }
        };
        (@n $name:ident, $n:literal, $width:literal, $load:expr, $tail:expr) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(crate) unsafe fn $name(w: &[u8], x: [&[f32]; $n]) -> [f32; $n] {
                let len = x[0].len();
                debug_assert!(w.len() == $width * len && x.iter().all(|r| r.len() == len));
                let p = w.as_ptr();
                let (load, tail) = ($load, $tail);
                dot_n_with(len, x, |i| load(p, i), |j| tail(w, j))
            }
        };
    }
    multi!(f32s, 4, |p: *const u8, i| _mm256_loadu_ps(p.add(4 * i).cast()), f32_at);
    multi!(f16s, 2, |p: *const u8, i| load_f16(p.add(2 * i)), f16_at);
    multi!(bf16s, 2, |p: *const u8, i| load_bf16(p.add(2 * i)), bf16_at);

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let p = b.as_ptr();
        dot_with(b.len(), a, |i| _mm256_loadu_ps(p.add(i)), |j| b[j])
    }

    /// `out[i] += a * x[i]`, 8 lanes at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_f32(out: &mut [f32], a: f32, x: &[f32]) {
        let n = out.len().min(x.len());
        let (op, xp) = (out.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(op.add(i), _mm256_fmadd_ps(va, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(op.add(i))));
            i += 8;
        }
        for (o, &v) in out[i..].iter_mut().zip(&x[i..]) {
            *o += a * v;
        }
    }

    /// `out[g * n + j] = q_g · k_j`: see [`crate::kernels::ops::scores_f16`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn scores_f16(q: &[f32], heads: usize, k: &[F16], out: &mut [f32]) {
        let (d, n) = (q.len() / heads, k.len() / (q.len() / heads));
        head_passes!(heads, |g, h| scores_h::<H>(&q[g * d..(g + h) * d], k, &mut out[g * n..]));
    }

    /// [`scores_f16`] for `H` heads: key row by key row, 16 values widened
    /// at a time and met by every head (two accumulators per head).
    #[inline(always)]
    unsafe fn scores_h<const H: usize>(q: &[f32], k: &[F16], out: &mut [f32]) {
        let d = q.len() / H;
        let n = k.len() / d;
        debug_assert!(out.len() >= H * n);
        let qp: [*const f32; H] = std::array::from_fn(|h| q.as_ptr().add(h * d));
        for (j, kj) in k.chunks_exact(d).enumerate() {
            let kp = kj.as_ptr().cast::<u8>();
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            let mut i = 0;
            while i + 16 <= d {
                let (k0, k1) = (load_f16(kp.add(2 * i)), load_f16(kp.add(2 * i + 16)));
                for h in 0..H {
                    acc[h][0] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(qp[h].add(i)), acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(qp[h].add(i + 8)), acc[h][1]);
                }
                i += 16;
            }
            if i + 8 <= d {
                let k0 = load_f16(kp.add(2 * i));
                for h in 0..H {
                    acc[h][0] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(qp[h].add(i)), acc[h][0]);
                }
                i += 8;
            }
            for h in 0..H {
                let tail: f32 = (i..d).map(|t| *qp[h].add(t) * kj[t].to_f32()).sum();
                *out.get_unchecked_mut(h * n + j) = hsum_ps(_mm256_add_ps(acc[h][0], acc[h][1])) + tail;
            }
        }
    }

    /// `out[g * d..][..d] = Σ_j w[g * n + j] · v_j`: see
    /// [`crate::kernels::ops::mix_f16`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn mix_f16(w: &[f32], heads: usize, v: &[F16], out: &mut [f32]) {
        let d = out.len() / heads;
        let n = v.len() / d;
        head_passes!(heads, |g, h| mix_h::<H>(&w[g * n..(g + h) * n], v, &mut out[g * d..(g + h) * d]));
    }

    /// [`mix_f16`] for `H` heads: 16 columns at a time held in registers
    /// for every head while the value rows stream past, each 8 values
    /// widened once.
    #[inline(always)]
    unsafe fn mix_h<const H: usize>(w: &[f32], v: &[F16], out: &mut [f32]) {
        let d = out.len() / H;
        let n = w.len() / H;
        let vp = v.as_ptr().cast::<u8>();
        let op = out.as_mut_ptr();
        let mut c = 0;
        while c + 16 <= d {
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            for j in 0..n {
                let p = vp.add(2 * (j * d + c));
                let (v0, v1) = (load_f16(p), load_f16(p.add(16)));
                for h in 0..H {
                    let a = _mm256_set1_ps(*w.get_unchecked(h * n + j));
                    acc[h][0] = _mm256_fmadd_ps(v0, a, acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(v1, a, acc[h][1]);
                }
            }
            for h in 0..H {
                _mm256_storeu_ps(op.add(h * d + c), acc[h][0]);
                _mm256_storeu_ps(op.add(h * d + c + 8), acc[h][1]);
            }
            c += 16;
        }
        // The last d % 16 columns.
        crate::kernels::scalar::mix_f16_cols(w, H, v, out, c);
    }

    /// Columns per block of the state kernels: 4 registers of 8 lanes per
    /// vector kept in registers while the rows stream past.
    const STATE_COLS: usize = 32;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn state_read(s: &[f32], k: &[f32], q: &[f32], u: &mut [f32], out: &mut [f32]) {
        let dv = u.len();
        let rows = k.len().min(s.len() / dv.max(1));
        let blocks = dv / STATE_COLS * STATE_COLS;
        let sp = s.as_ptr();
        for c in (0..blocks).step_by(STATE_COLS) {
            let mut au = [_mm256_setzero_ps(); 4];
            let mut ao = [_mm256_setzero_ps(); 4];
            for (r, (&kr, &qr)) in k[..rows].iter().zip(&q[..rows]).enumerate() {
                let (kr, qr) = (_mm256_set1_ps(kr), _mm256_set1_ps(qr));
                let p = sp.add(r * dv + c);
                for i in 0..4 {
                    let v = _mm256_loadu_ps(p.add(8 * i));
                    au[i] = _mm256_fmadd_ps(kr, v, au[i]);
                    ao[i] = _mm256_fmadd_ps(qr, v, ao[i]);
                }
            }
            for i in 0..4 {
                _mm256_storeu_ps(u.as_mut_ptr().add(c + 8 * i), au[i]);
                _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * i), ao[i]);
            }
        }
        crate::kernels::scalar::state_read_cols(s, k, q, u, out, blocks);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn state_update(s: &mut [f32], decay: f32, k: &[f32], d: &[f32]) {
        let dv = d.len();
        let rows = k.len().min(s.len() / dv.max(1));
        let blocks = dv / STATE_COLS * STATE_COLS;
        let sp = s.as_mut_ptr();
        let g = _mm256_set1_ps(decay);
        for c in (0..blocks).step_by(STATE_COLS) {
            let dd: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(d.as_ptr().add(c + 8 * i)));
            for (r, &kr) in k[..rows].iter().enumerate() {
                let kr = _mm256_set1_ps(kr);
                let p = sp.add(r * dv + c);
                for (i, di) in dd.iter().enumerate() {
                    let v = _mm256_mul_ps(g, _mm256_loadu_ps(p.add(8 * i)));
                    _mm256_storeu_ps(p.add(8 * i), _mm256_fmadd_ps(kr, *di, v));
                }
            }
        }
        crate::kernels::scalar::state_update_cols(s, decay, k, d, blocks);
    }

    /// In-place SiLU, `x / (1 + e^-x)`, eight lanes at a time: the NEON
    /// kernel's steps and constants ([`silu_exp`](crate::kernels::simd::silu_exp)),
    /// within a few ulp of libm's `expf` (the scalar twin) at a fraction of
    /// its cost.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn silu(x: &mut [f32]) {
        use crate::kernels::simd::silu_exp::*;
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            let v = _mm256_loadu_ps(c.as_ptr());
            let neg = _mm256_sub_ps(_mm256_setzero_ps(), v);
            let t = _mm256_min_ps(_mm256_max_ps(neg, _mm256_set1_ps(T_MIN)), _mm256_set1_ps(T_MAX));
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                t,
                _mm256_set1_ps(LOG2E),
            ));
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), t));
            let mut p = _mm256_set1_ps(P[0]);
            for &c in &P[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
            }
            // e^r = 1 + r + r^2 p(r), then times 2^n through the exponent bits.
            let e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
            let bits = _mm256_add_epi32(_mm256_castps_si256(e), _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n)));
            let e = _mm256_castsi256_ps(bits);
            // The numerator clamped (this operand order keeps NaNs).
            let num = _mm256_max_ps(_mm256_set1_ps(NUM_MIN), v);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_div_ps(num, _mm256_add_ps(e, _mm256_set1_ps(1.0))));
        }
        crate::kernels::scalar::silu(chunks.into_remainder());
    }
}

/// The recurrent-state read on 512-bit registers (the `avx512vnni` table
/// with AVX-512 F): the Gated DeltaNet's chunked prefill spends most of its
/// time here, over 32-column blocks of the state and over the chunk's rows.
pub(crate) mod zmm {
    use std::arch::x86_64::*;

    /// `u = S^T k`, `out = S^T q` (see `kernels::scalar::state_read`): 32 (then
    /// 16) columns at a time, even and odd rows in separate sums so that
    /// eight (four) chains of multiply-adds are in flight.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(crate) unsafe fn state_read(s: &[f32], k: &[f32], q: &[f32], u: &mut [f32], out: &mut [f32]) {
        let dv = u.len();
        let rows = k.len().min(q.len()).min(s.len() / dv.max(1));
        let sp = s.as_ptr();
        let mut c = 0;
        while c + 32 <= dv {
            cols::<2>(sp, dv, c, &k[..rows], &q[..rows], u, out);
            c += 32;
        }
        if c + 16 <= dv {
            cols::<1>(sp, dv, c, &k[..rows], &q[..rows], u, out);
            c += 16;
        }
        crate::kernels::scalar::state_read_cols(s, k, q, u, out, c);
    }

    /// Columns `c..c + 16 W` of [`state_read`].
    #[inline(always)]
    unsafe fn cols<const W: usize>(
        sp: *const f32,
        dv: usize,
        c: usize,
        k: &[f32],
        q: &[f32],
        u: &mut [f32],
        out: &mut [f32],
    ) {
        let mut au = [[_mm512_setzero_ps(); W]; 2];
        let mut ao = [[_mm512_setzero_ps(); W]; 2];
        let rows = k.len();
        for r in (0..rows / 2 * 2).step_by(2) {
            for h in 0..2 {
                let (kr, qr) = (_mm512_set1_ps(*k.get_unchecked(r + h)), _mm512_set1_ps(*q.get_unchecked(r + h)));
                let p = sp.add((r + h) * dv + c);
                for i in 0..W {
                    let v = _mm512_loadu_ps(p.add(16 * i));
                    au[h][i] = _mm512_fmadd_ps(kr, v, au[h][i]);
                    ao[h][i] = _mm512_fmadd_ps(qr, v, ao[h][i]);
                }
            }
        }
        if rows % 2 == 1 {
            let r = rows - 1;
            let (kr, qr) = (_mm512_set1_ps(k[r]), _mm512_set1_ps(q[r]));
            let p = sp.add(r * dv + c);
            for i in 0..W {
                let v = _mm512_loadu_ps(p.add(16 * i));
                au[0][i] = _mm512_fmadd_ps(kr, v, au[0][i]);
                ao[0][i] = _mm512_fmadd_ps(qr, v, ao[0][i]);
            }
        }
        for i in 0..W {
            _mm512_storeu_ps(u.as_mut_ptr().add(c + 16 * i), _mm512_add_ps(au[0][i], au[1][i]));
            _mm512_storeu_ps(out.as_mut_ptr().add(c + 16 * i), _mm512_add_ps(ao[0][i], ao[1][i]));
        }
    }
}
