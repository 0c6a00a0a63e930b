//! The ternary formats against llama.cpp and against exact arithmetic.
//!
//! - Dequantisation: bit-equal to gguf-py's on random blocks, every byte
//!   value of a TQ1_0 trit byte and TQ2_0's unused stored 3 included
//!   (`testdata/tq/`, made by `testdata/tq/gen.py`, which checks gguf-py
//!   against llama.cpp's own `dequantize_row_tq*` first).
//! - Dot products: equal to `dequantised weights . dequantised Q8_K
//!   activations` summed in f64, within f32 rounding.
//! - The digit extraction: every byte, every digit, as the reference's
//!   `uint8_t` arithmetic, and the inverse of the quantiser's packing.

use super::q8_k::quantize_row_q8_k;
use super::*;
use crate::kernels::dequantize_row;
use crate::kernels::testing::{random_weights, Rng};

const TYPES: [(GgmlType, &[u8], &[u8]); 2] = [
    (GgmlType::TQ1_0, include_bytes!("testdata/tq/TQ1_0.raw"), include_bytes!("testdata/tq/TQ1_0.f32")),
    (GgmlType::TQ2_0, include_bytes!("testdata/tq/TQ2_0.raw"), include_bytes!("testdata/tq/TQ2_0.f32")),
];

#[test]
fn dequantisation_equals_llama_cpp_bit_for_bit() {
    for (ty, raw, want) in TYPES {
        let want: Vec<f32> = want.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(raw.len() / ty.type_size() * QK_K, want.len(), "{ty} reference size");
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(ty, raw, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: got {g}, llama.cpp {w}");
        }
    }
}

fn scalar_dot(ty: GgmlType) -> fn(&[u8], &[BlockQ8K]) -> f32 {
    match ty {
        GgmlType::TQ1_0 => tq::vec_dot_tq1_0,
        GgmlType::TQ2_0 => tq::vec_dot_tq2_0,
        _ => unreachable!("{ty}"),
    }
}

#[test]
fn scalar_dots_equal_exact_products_of_the_dequantised_rows() {
    let mut rng = Rng::new(34);
    for (ty, _, _) in TYPES {
        for nb in [1, 2, 7] {
            let k = nb * QK_K;
            let w = random_weights(ty, 3, k, &mut rng);
            let x = rng.vec(k, 1.0);
            let mut a = vec![BlockQ8K::default(); nb];
            quantize_row_q8_k(&x, &mut a);
            let af: Vec<f32> = a.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32)).collect();
            let mut wf = vec![0.0f32; k];
            for row in w.chunks_exact(ty.type_size() * nb) {
                let got = scalar_dot(ty)(row, &a);
                dequantize_row(ty, row, &mut wf);
                let want: f64 = wf.iter().zip(&af).map(|(&p, &q)| p as f64 * q as f64).sum();
                let mag: f64 = wf.iter().zip(&af).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
                assert!((got as f64 - want).abs() <= 1e-5 * mag + 1e-30, "{ty} nb={nb}: got {got}, exact {want}");
            }
        }
    }
}

#[test]
fn digits_are_the_reference_s_for_every_byte() {
    for q in 0..=255u8 {
        let mut n = 0u32;
        for k in 0..5 {
            // llama.cpp: uint8_t q = x * pow3[k]; int16_t xi = ((uint16_t) q * 3) >> 8;
            let shifted = (q as u32 * [1, 3, 9, 27, 81][k]) % 256;
            let want = (shifted * 3) >> 8;
            assert_eq!(tq::trit(q, k) as u32, want, "byte {q} digit {k}");
            n = 3 * n + want;
        }
        // The packing is the inverse: ceil(256 n / 243) for n < 243 reads back as n.
        if q as u32 == (n * 256).div_ceil(243) {
            assert!(n < 243);
        }
    }
    for n in 0..243u32 {
        let q = (n * 256).div_ceil(243) as u8;
        let digits: u32 = (0..5).fold(0, |acc, k| 3 * acc + tq::trit(q, k) as u32);
        assert_eq!(digits, n, "base-3 {n} packed as {q}");
    }
}
