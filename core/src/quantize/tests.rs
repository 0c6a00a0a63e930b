//! Every quantiser against llama.cpp's output on the golden data of
//! `scripts/quantize-golden.sh`: eight rows of 512 weights (ordinary, wide,
//! with outliers, uniform, zero, one-signed, tiny, sparse), quantised with
//! and without an importance vector that has zeros and a wide range.

use super::*;

const ROWS: usize = 8;
const COLS: usize = 512;

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Our blocks against llama.cpp's; on a mismatch, which rows and blocks differ.
fn check(ty: GgmlType, imatrix: bool, golden: &[u8]) {
    let src = floats(include_bytes!("testdata/input.f32"));
    let w = floats(include_bytes!("testdata/imatrix.f32"));
    assert_eq!(src.len(), ROWS * COLS);
    let row_bytes = ty.row_bytes(COLS as u64).unwrap() as usize;
    assert_eq!(golden.len(), ROWS * row_bytes, "{ty}: golden size");
    let mut ours = vec![0u8; golden.len()];
    quantize_rows(ty, &src, COLS, imatrix.then_some(&w[..]), &mut ours).unwrap();
    let bs = ty.type_size();
    let differing: Vec<(usize, usize)> = (0..golden.len() / bs)
        .filter(|&b| ours[b * bs..(b + 1) * bs] != golden[b * bs..(b + 1) * bs])
        .map(|b| (b * bs / row_bytes, (b * bs % row_bytes) / bs))
        .collect();
    assert!(
        differing.is_empty(),
        "{ty} (imatrix: {imatrix}): {} of {} blocks differ from llama.cpp's, (row, block): {:?}",
        differing.len(),
        golden.len() / bs,
        &differing[..differing.len().min(16)]
    );
}

macro_rules! golden {
    ($name:ident, $ty:expr, $file:literal) => {
        #[test]
        fn $name() {
            check($ty, false, include_bytes!(concat!("testdata/", $file, ".bin")));
            check($ty, true, include_bytes!(concat!("testdata/", $file, ".imatrix.bin")));
        }
    };
    ($name:ident, $ty:expr, $file:literal, imatrix only) => {
        #[test]
        fn $name() {
            check($ty, true, include_bytes!(concat!("testdata/", $file, ".imatrix.bin")));
            let src = floats(include_bytes!("testdata/input.f32"));
            let mut out = vec![0u8; ROWS * $ty.row_bytes(COLS as u64).unwrap() as usize];
            assert!(matches!(quantize_rows($ty, &src, COLS, None, &mut out), Err(Error::InvalidArgument(_))));
        }
    };
}

golden!(f16_equals_llama_cpp, GgmlType::F16, "f16");
golden!(bf16_equals_llama_cpp, GgmlType::BF16, "bf16");
golden!(q4_0_equals_llama_cpp, GgmlType::Q4_0, "q4_0");
golden!(q4_1_equals_llama_cpp, GgmlType::Q4_1, "q4_1");
golden!(q5_0_equals_llama_cpp, GgmlType::Q5_0, "q5_0");
golden!(q5_1_equals_llama_cpp, GgmlType::Q5_1, "q5_1");
golden!(q8_0_equals_llama_cpp, GgmlType::Q8_0, "q8_0");
golden!(q2_k_equals_llama_cpp, GgmlType::Q2K, "q2_K");
golden!(q3_k_equals_llama_cpp, GgmlType::Q3K, "q3_K");
golden!(q4_k_equals_llama_cpp, GgmlType::Q4K, "q4_K");
golden!(q5_k_equals_llama_cpp, GgmlType::Q5K, "q5_K");
golden!(q6_k_equals_llama_cpp, GgmlType::Q6K, "q6_K");
golden!(iq1_s_equals_llama_cpp, GgmlType::IQ1S, "iq1_s", imatrix only);
golden!(iq1_m_equals_llama_cpp, GgmlType::IQ1M, "iq1_m");
golden!(iq2_xxs_equals_llama_cpp, GgmlType::IQ2XXS, "iq2_xxs", imatrix only);
golden!(iq2_xs_equals_llama_cpp, GgmlType::IQ2XS, "iq2_xs", imatrix only);
golden!(iq2_s_equals_llama_cpp, GgmlType::IQ2S, "iq2_s");
golden!(iq3_xxs_equals_llama_cpp, GgmlType::IQ3XXS, "iq3_xxs");
golden!(iq3_s_equals_llama_cpp, GgmlType::IQ3S, "iq3_s");
golden!(iq4_nl_equals_llama_cpp, GgmlType::IQ4NL, "iq4_nl");
golden!(iq4_xs_equals_llama_cpp, GgmlType::IQ4XS, "iq4_xs");
golden!(mxfp4_equals_llama_cpp, GgmlType::MXFP4, "mxfp4");
golden!(tq1_0_equals_llama_cpp, GgmlType::TQ1_0, "tq1_0");
golden!(tq2_0_equals_llama_cpp, GgmlType::TQ2_0, "tq2_0");

#[test]
fn bad_calls_are_errors() {
    let src = vec![0.5f32; 300];
    let mut out = vec![0u8; 1000];
    // Not whole blocks, wrong sizes, a type nobody makes, a bad imatrix.
    assert!(quantize_rows(GgmlType::Q4K, &src, 300, None, &mut out).is_err());
    assert!(quantize_rows(GgmlType::Q8_0, &src[..256], 256, None, &mut out).is_err());
    assert!(quantize_rows(GgmlType::Q8K, &src[..256], 256, None, &mut out[..292]).is_err());
    let mut q8 = vec![0u8; 8 * 34];
    assert!(quantize_rows(GgmlType::Q8_0, &src[..256], 256, Some(&[1.0; 255]), &mut q8).is_err());
    assert!(quantize_rows(GgmlType::Q8_0, &src[..256], 256, Some(&[f32::NAN; 256]), &mut q8).is_err());
    assert!(quantize_rows(GgmlType::Q8_0, &src[..256], 256, Some(&[1.0; 256]), &mut q8).is_ok());
}

/// Deterministic pseudo-random values (xorshift, a sum of four uniforms for
/// a bell shape), about one in fifty an outlier eight times wider.
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..n)
        .map(|_| {
            let v = uniform() + uniform() + uniform() + uniform();
            if uniform() > 0.48 {
                8.0 * v
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn f32_round_trips() {
    let src = floats(include_bytes!("testdata/input.f32"));
    let mut out = vec![0u8; src.len() * 4];
    quantize_rows(GgmlType::F32, &src, COLS, None, &mut out).unwrap();
    let mut back = vec![0.0f32; src.len()];
    crate::quant::float::dequantize_row_f32(&out, &mut back);
    assert!(src.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// Quantise -> dequantise keeps each format's relative RMS error within its
/// bound, with and without an importance vector; with one, the weighted error
/// is no worse than without.
#[test]
fn dequantised_error_is_bounded() {
    use crate::quant::{float, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
    type Dequantize = fn(&[u8], &mut [f32]);
    // Bounds about 1.3 times what these quantisers reach on this data (2% of
    // the values are 8-sigma outliers, which the block formats pay for).
    let formats: [(GgmlType, Dequantize, f32); 13] = [
        (GgmlType::F32, float::dequantize_row_f32, 0.0),
        (GgmlType::F16, float::dequantize_row_f16, 0.0005),
        (GgmlType::BF16, float::dequantize_row_bf16, 0.003),
        (GgmlType::Q8_0, q8_0::dequantize_row, 0.015),
        (GgmlType::Q5_0, q5_0::dequantize_row, 0.1),
        (GgmlType::Q5_1, q5_1::dequantize_row, 0.08),
        (GgmlType::Q4_0, q4_0::dequantize_row, 0.2),
        (GgmlType::Q4_1, q4_1::dequantize_row, 0.14),
        (GgmlType::Q6K, q6_k::dequantize_row, 0.04),
        (GgmlType::Q5K, q5_k::dequantize_row, 0.07),
        (GgmlType::Q4K, q4_k::dequantize_row, 0.14),
        (GgmlType::Q3K, q3_k::dequantize_row, 0.28),
        (GgmlType::Q2K, q2_k::dequantize_row, 0.45),
    ];
    let (rows, cols) = (4, 1024);
    let src: Vec<f32> = noise(rows * cols, 7).iter().map(|v| v * 0.03).collect();
    let w: Vec<f32> = noise(cols, 11).iter().map(|v| v.abs() * v.abs() * 10.0).collect();
    for (ty, dequantize, bound) in formats {
        let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut errors = [0.0f32; 2];
        for (k, imatrix) in [None, Some(&w[..])].into_iter().enumerate() {
            let mut q = vec![0u8; rows * row_bytes];
            quantize_rows(ty, &src, cols, imatrix, &mut q).unwrap();
            let mut back = vec![0.0f32; src.len()];
            for (q, y) in q.chunks_exact(row_bytes).zip(back.chunks_exact_mut(cols)) {
                dequantize(q, y);
            }
            let (mut err, mut norm, mut werr) = (0.0f64, 0.0f64, 0.0f64);
            for (i, (&x, &y)) in src.iter().zip(&back).enumerate() {
                let d = (x - y) as f64;
                err += d * d;
                norm += (x as f64) * (x as f64);
                werr += w[i % cols] as f64 * d * d;
            }
            let rel = (err / norm).sqrt() as f32;
            assert!(rel <= bound, "{ty} (imatrix: {}): relative rms error {rel} > {bound}", imatrix.is_some());
            errors[k] = werr as f32;
        }
        assert!(errors[1] <= errors[0] * 1.001, "{ty}: the importance vector made the weighted error worse");
    }
}

/// Weights that are ternary already (each block `{-a, 0, a}`, `a` exact in
/// f16) come back exactly from both ternary formats.
#[test]
fn ternary_weights_round_trip_exactly() {
    use crate::quant::tq;
    let cols = 1024;
    let x: Vec<f32> = noise(4 * cols, 5)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let a = 0.5f32.powi((i / 256 % 4) as i32 + 3);
            if v > 0.3 {
                a
            } else if v < -0.3 {
                -a
            } else {
                0.0
            }
        })
        .collect();
    for (ty, dequantize) in [
        (GgmlType::TQ1_0, tq::dequantize_row_tq1_0 as fn(&[u8], &mut [f32])),
        (GgmlType::TQ2_0, tq::dequantize_row_tq2_0),
    ] {
        let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut q = vec![0u8; 4 * row_bytes];
        quantize_rows(ty, &x, cols, None, &mut q).unwrap();
        let mut back = vec![f32::NAN; x.len()];
        for (q, y) in q.chunks_exact(row_bytes).zip(back.chunks_exact_mut(cols)) {
            dequantize(q, y);
        }
        assert!(x.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty}");
    }
}
