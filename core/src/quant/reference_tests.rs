//! The scalar references against llama.cpp and against plain f32 math.
//!
//! - Activation quantisers: bit-identical to the ones llama.cpp runs on x86-64
//!   (golden bytes made by calling llama.cpp's own code, `testdata/q8_ref.c`).
//! - Dot products: equal to `dequantised weights . original activations` within
//!   the error the int8 activations can introduce (a worst-case bound per
//!   element, computed from the activation scales).
//!
//! Dequantisation against gguf-py's reference lives in `tests/dequant_fixtures.rs`.

use super::q8_0::{quantize_row_q8_0, quantize_row_q8_0f, quantize_row_q8_1, quantize_row_q8_1f};
use super::q8_k::quantize_row_q8_k;
use super::*;
use crate::kernels::testing::{random_weights, Rng};
use crate::kernels::{dequantize_row, QActs};

const GOLDEN: &[u8] = include_bytes!("testdata/q8_ref.bin");
const N: usize = 1024;

fn golden_input() -> Vec<f32> {
    GOLDEN[..4 * N].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn q8_0_and_q8_1_match_llama_reference_bytes() {
    let x = golden_input();
    let mut y0 = vec![BlockQ8_0::default(); N / 32];
    quantize_row_q8_0(&x, &mut y0);
    let mut y1 = vec![BlockQ8_1::default(); N / 32];
    quantize_row_q8_1(&x, &mut y1);
    let want0 = as_blocks::<BlockQ8_0>(&GOLDEN[4 * N..4 * N + 34 * N / 32]);
    let want1 = as_blocks::<BlockQ8_1>(&GOLDEN[4 * N + 34 * N / 32..4 * N + 70 * N / 32]);
    let mut yf = vec![BlockQ8_0F::default(); N / 32];
    quantize_row_q8_0f(&x, &mut yf);
    for (i, ((a, f), b)) in y0.iter().zip(&yf).zip(want0).enumerate() {
        assert_eq!((a.d, a.qs), (b.d, b.qs), "Q8_0 block {i}");
        // The activation blocks: the same quants, the same scale widened.
        assert_eq!((f.d.to_bits(), f.qs), (b.d.to_f32().to_bits(), b.qs), "Q8_0 activation block {i}");
    }
    let mut y1f = vec![BlockQ8_1F::default(); N / 32];
    quantize_row_q8_1f(&x, &mut y1f);
    for (i, ((a, f), b)) in y1.iter().zip(&y1f).zip(want1).enumerate() {
        assert_eq!((a.d, a.s, a.qs), (b.d, b.s, b.qs), "Q8_1 block {i}");
        let widened = (b.d.to_f32().to_bits(), b.s.to_f32().to_bits(), b.qs);
        assert_eq!((f.d.to_bits(), f.s.to_bits(), f.qs), widened, "Q8_1 activation block {i}");
    }
}

#[test]
fn q8_k_matches_llama_reference_bytes() {
    let x = golden_input();
    let mut y = vec![BlockQ8K::default(); N / QK_K];
    quantize_row_q8_k(&x, &mut y);
    let want = &GOLDEN[4 * N + 70 * N / 32..];
    assert_eq!(want.len(), 292 * N / QK_K);
    for (i, (a, b)) in y.iter().zip(want.chunks_exact(292)).enumerate() {
        assert_eq!(a.d.to_le_bytes(), b[0..4], "Q8_K block {i} scale");
        assert!(a.qs.iter().zip(&b[4..260]).all(|(&q, &w)| q as u8 == w), "Q8_K block {i} quants");
        for (j, s) in a.bsums.iter().enumerate() {
            assert_eq!(s.to_le_bytes(), b[260 + 2 * j..262 + 2 * j], "Q8_K block {i} bsum {j}");
        }
    }
}

#[test]
fn rounding_modes_are_llamas() {
    // Q8_0 scale 1: rounds half to even, as llama.cpp's x86 quantiser.
    let mut x = [0.0f32; 32];
    x[..5].copy_from_slice(&[127.0, 2.5, -2.5, 3.5, -0.5]);
    let mut y = [BlockQ8_0::default()];
    quantize_row_q8_0(&x, &mut y);
    assert_eq!(&y[0].qs[..5], &[127, 2, -2, 4, 0]);
    // Q8_K maps the signed maximum to -127 and rounds half to even.
    let mut x = [0.0f32; 256];
    x[..5].copy_from_slice(&[127.0, 2.5, -2.5, 3.5, -0.5]);
    let mut y = [BlockQ8K::default()];
    quantize_row_q8_k(&x, &mut y);
    assert_eq!(&y[0].qs[..5], &[-127, -2, 2, -4, 0]);
    assert_eq!(y[0].d, -1.0);
    assert_eq!(y[0].bsums[0], -127 - 4);
    // All zero: zero scale, zero quants.
    quantize_row_q8_k(&[0.0; 256], &mut y);
    assert_eq!((y[0].d, y[0].qs, y[0].bsums), (0.0, [0; 256], [0; 16]));
}

#[test]
fn q8_k_scale_comes_from_the_first_value_of_largest_magnitude() {
    // The sign of the scale is the sign of the first value reaching the
    // largest magnitude, whichever comes first when both signs reach it;
    // NaNs take no part in the search.
    for (first, second) in [(-3.0f32, 3.0f32), (3.0, -3.0)] {
        for pos in [0usize, 7, 8, 100, 255] {
            let mut x = [0.5f32; 256];
            x[1] = f32::NAN;
            x[pos.min(254)] = first;
            x[(pos + 1).min(255).max(pos.min(254) + 1)] = second;
            let mut y = [BlockQ8K::default()];
            quantize_row_q8_k(&x, &mut y);
            assert_eq!(y[0].d, 1.0 / (-127.0 / first), "first {first} at {pos}");
        }
    }
    // A larger magnitude later wins over an earlier smaller one, either sign.
    let mut x = [0.0f32; 256];
    x[3] = 2.0;
    x[200] = -5.0;
    let mut y = [BlockQ8K::default()];
    quantize_row_q8_k(&x, &mut y);
    assert_eq!((y[0].d, y[0].qs[200], y[0].qs[3]), (1.0 / (-127.0 / -5.0), -127, 51));
}

/// `sum_i |w_i| * e_i`, with `e_i` the largest error the activation format
/// can put on element `i`, plus f32 summation slack.
fn error_bound(ty: GgmlType, w: &[f32], x: &[f32], k: usize) -> f64 {
    let mag: f64 = w.iter().zip(x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
    let per_elem = |blk: usize| -> Vec<f64> {
        // Activation step of each block: amax / 127 (f16-rounded scales add
        // at most 127 * d * 2^-11 per element).
        x.chunks(blk)
            .flat_map(|c| {
                let d = c.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                std::iter::repeat_n(d * (0.5 + 127.0 / 2048.0) * 1.001, c.len())
            })
            .collect()
    };
    let e = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => vec![0.0; k],
        t if t.block_size() == 32 => per_elem(32),
        _ => per_elem(QK_K),
    };
    let mut bound: f64 = w.iter().zip(&e).map(|(&a, &b)| a.abs() as f64 * b).sum::<f64>() + 2e-6 * mag;
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        // The f16 `s = d * sum(q)` of Q8_1 is off by up to |d * sum| * 2^-10; its
        // weight is the block minimum, at most max|w| of the block.
        for (wc, xc) in w.chunks(32).zip(x.chunks(32)) {
            let m = wc.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
            bound += m * xc.iter().map(|v| v.abs() as f64).sum::<f64>() * 1.1 / 1024.0;
        }
    }
    bound
}

#[test]
fn scalar_dots_match_f32_math() {
    let mut rng = Rng::new(7);
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ2S,
        GgmlType::IQ1S,
        GgmlType::IQ1M,
        GgmlType::IQ4NL,
        GgmlType::MXFP4,
        GgmlType::IQ4XS,
        GgmlType::IQ3XXS,
        GgmlType::IQ3S,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
    ];
    let scalar = crate::kernels::Kernels::for_isa(crate::kernels::Isa::Scalar).expect("scalar path");
    let pool = crate::threads::ThreadPool::new(1);
    for ty in types {
        for nb in [1, 3, 8] {
            let k = nb * ty.block_size().max(32) * if ty.block_size() == 1 { 8 } else { 1 };
            let rows = 4;
            let wb = random_weights(ty, rows, k, &mut rng);
            let x = rng.vec(k, 1.0);
            let mut acts = QActs::new();
            acts.quantize(ty, &x, 1, k);
            let w = crate::kernels::QMatrix::new(ty, &wb, rows, k).expect("matrix");
            let mut got = vec![0.0; rows];
            scalar.matmul(&pool, &w, &acts, &mut got);
            let mut wf = vec![0.0f32; k];
            for (r, &g) in got.iter().enumerate() {
                dequantize_row(ty, w.row(r), &mut wf);
                let want: f64 = wf.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let bound = error_bound(ty, &wf, &x, k);
                let err = (g as f64 - want).abs();
                assert!(err <= bound, "{ty} k={k} row {r}: got {g}, f32 math {want}, |err| {err:e} > bound {bound:e}");
            }
        }
    }
}

/// The IQ formats and MXFP4: the scalar dot equals `dequantised weights .
/// dequantised activations` up to f32 rounding (the integer sums are exact;
/// only the block scales are rounded), so a wrong grid value, sign or scale
/// shows even where the activation error bound above would hide it.
#[test]
fn iq_scalar_dots_equal_dequantised_products() {
    let mut rng = Rng::new(26);
    let scalar = crate::kernels::Kernels::for_isa(crate::kernels::Isa::Scalar).expect("scalar path");
    let pool = crate::threads::ThreadPool::new(1);
    for ty in [GgmlType::IQ4NL, GgmlType::MXFP4, GgmlType::IQ4XS, GgmlType::IQ3XXS, GgmlType::IQ3S] {
        for nb in [1, 2, 5] {
            let (rows, k) = (8, nb * QK_K);
            let wb = random_weights(ty, rows, k, &mut rng);
            let x = rng.vec(k, 1.0);
            let mut acts = QActs::new();
            acts.quantize(ty, &x, 1, k);
            let xq = acts.dequantized();
            let w = crate::kernels::QMatrix::new(ty, &wb, rows, k).expect("matrix");
            let mut got = vec![0.0; rows];
            scalar.matmul(&pool, &w, &acts, &mut got);
            let mut wf = vec![0.0f32; k];
            for (r, &g) in got.iter().enumerate() {
                dequantize_row(ty, w.row(r), &mut wf);
                let want: f64 = wf.iter().zip(&xq).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wf.iter().zip(&xq).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let err = (g as f64 - want).abs();
                assert!(
                    err <= 1e-6 * mag + 1e-30,
                    "{ty} k={k} row {r}: got {g}, dequantised product {want}, |err| {err:e}"
                );
            }
        }
    }
}
