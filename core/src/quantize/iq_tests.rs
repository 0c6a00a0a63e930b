//! The IQ and MXFP4 quantisers against their formats' dequantisers: what
//! they make decodes close to the input (a per-format bound on the relative
//! RMS error), and values already on a format's grid come back exactly.

use super::*;
use crate::quant::{iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4, mxfp4};

/// Deterministic, roughly normal weights (sum of four uniforms).
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..n).map(|_| (uniform() + uniform() + uniform() + uniform()) * 0.05).collect()
}

fn relative_rms_error(ty: GgmlType, x: &[f32], imatrix: Option<&[f32]>) -> f32 {
    let dequantize: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::IQ1S => iq1_s::dequantize_row,
        GgmlType::IQ1M => iq1_m::dequantize_row,
        GgmlType::IQ2XXS => iq2_xxs::dequantize_row,
        GgmlType::IQ2XS => iq2_xs::dequantize_row,
        GgmlType::IQ2S => iq2_s::dequantize_row,
        GgmlType::IQ3XXS => iq3_xxs::dequantize_row,
        GgmlType::IQ3S => iq3_s::dequantize_row,
        GgmlType::IQ4NL => iq4::dequantize_row_nl,
        GgmlType::IQ4XS => iq4::dequantize_row_xs,
        GgmlType::MXFP4 => mxfp4::dequantize_row,
        _ => unreachable!(),
    };
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_rows(ty, x, x.len(), imatrix, &mut q).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize(&q, &mut y);
    let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
    (err / x.iter().map(|a| a * a).sum::<f32>()).sqrt()
}

#[test]
fn decoded_rows_are_close() {
    let x = weights(4096, 7);
    let ones = vec![1.0f32; 4096];
    for (ty, bound) in [
        (GgmlType::IQ1S, 0.52),
        (GgmlType::IQ1M, 0.62),
        (GgmlType::IQ2XXS, 0.38),
        (GgmlType::IQ2XS, 0.33),
        (GgmlType::IQ2S, 0.29),
        (GgmlType::IQ3XXS, 0.23),
        (GgmlType::IQ3S, 0.18),
        (GgmlType::IQ4NL, 0.09),
        (GgmlType::IQ4XS, 0.09),
        (GgmlType::MXFP4, 0.14),
    ] {
        let with = relative_rms_error(ty, &x, Some(&ones));
        eprintln!("{ty}: relative RMS error {with:.4} (imatrix of ones)");
        assert!(with < bound, "{ty}: {with}");
        if !requires_imatrix(ty) {
            let without = relative_rms_error(ty, &x, None);
            eprintln!("{ty}: relative RMS error {without:.4} (no imatrix)");
            assert!(without < bound, "{ty}: {without}");
        }
    }
}

#[test]
fn grid_values_come_back_exactly() {
    // Table values under an f16 (IQ4_NL) or power-of-two (MXFP4) scale,
    // in a scrambled order, each block of 32 holding the table's extreme
    // (index 0 of IQ4_NL, 7 of MXFP4) so the search finds the scale exactly.
    let index = |i: usize, extreme: usize| if i % 32 == 5 { extreme } else { (i * 7 + i / 32) % 16 };
    let nl: Vec<f32> = (0..256).map(|i| 0.0078125 * iq4::KVALUES_IQ4NL[index(i, 0)] as f32).collect();
    let fp4: Vec<f32> = (0..256).map(|i| 0.25 * mxfp4::KVALUES_MXFP4[index(i, 7)] as f32).collect();
    for (ty, row) in [(GgmlType::IQ4NL, &nl), (GgmlType::MXFP4, &fp4)] {
        let mut q = vec![0u8; ty.row_bytes(256).unwrap() as usize];
        quantize_rows(ty, row, 256, None, &mut q).unwrap();
        let mut y = vec![0.0f32; 256];
        match ty {
            GgmlType::IQ4NL => iq4::dequantize_row_nl(&q, &mut y),
            _ => mxfp4::dequantize_row(&q, &mut y),
        }
        assert_eq!(&y, row, "{ty}");
    }
}
