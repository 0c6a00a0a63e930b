//! The IQ1 / IQ2 formats against gguf-py and against exact arithmetic.
//!
//! - Dequantisation: bit-equal to gguf-py's numpy code on random blocks
//!   (`testdata/iq/`, made by `testdata/iq/gen.py`; there are no real tensors
//!   of these types in the fixture store).
//! - Dot products: equal to `dequantised weights . dequantised Q8_K
//!   activations` summed in f64, within f32 rounding: the int8 activations
//!   are the same on both sides, so only the summation order differs.
//! - Bad bytes: every byte pattern is a valid block (indices are masked into
//!   their tables), so blocks of one repeated byte must decode to finite
//!   values without a panic.

use super::q8_k::quantize_row_q8_k;
use super::*;
use crate::kernels::dequantize_row;
use crate::kernels::testing::{random_weights, Rng};

const TYPES: [(GgmlType, &[u8], &[u8]); 5] = [
    (GgmlType::IQ2XXS, include_bytes!("testdata/iq/IQ2_XXS.raw"), include_bytes!("testdata/iq/IQ2_XXS.f32")),
    (GgmlType::IQ2XS, include_bytes!("testdata/iq/IQ2_XS.raw"), include_bytes!("testdata/iq/IQ2_XS.f32")),
    (GgmlType::IQ2S, include_bytes!("testdata/iq/IQ2_S.raw"), include_bytes!("testdata/iq/IQ2_S.f32")),
    (GgmlType::IQ1S, include_bytes!("testdata/iq/IQ1_S.raw"), include_bytes!("testdata/iq/IQ1_S.f32")),
    (GgmlType::IQ1M, include_bytes!("testdata/iq/IQ1_M.raw"), include_bytes!("testdata/iq/IQ1_M.f32")),
];

#[test]
fn dequantisation_equals_gguf_py_bit_for_bit() {
    for (ty, raw, want) in TYPES {
        let want: Vec<f32> = want.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(raw.len() / ty.type_size() * QK_K, want.len(), "{ty} reference size");
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(ty, raw, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: got {g}, gguf-py {w}");
        }
    }
}

fn scalar_dot(ty: GgmlType) -> fn(&[u8], &[BlockQ8K]) -> f32 {
    match ty {
        GgmlType::IQ2XXS => iq2_xxs::vec_dot,
        GgmlType::IQ2XS => iq2_xs::vec_dot,
        GgmlType::IQ2S => iq2_s::vec_dot,
        GgmlType::IQ1S => iq1_s::vec_dot,
        GgmlType::IQ1M => iq1_m::vec_dot,
        _ => unreachable!("{ty}"),
    }
}

/// The values a Q8_K row stands for.
fn dequantize_q8k(a: &[BlockQ8K]) -> Vec<f32> {
    a.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32)).collect()
}

#[test]
fn scalar_dots_equal_exact_products_of_the_dequantised_rows() {
    let mut rng = Rng::new(26);
    for (ty, _, _) in TYPES {
        for nb in [1, 2, 7] {
            let k = nb * QK_K;
            let w = random_weights(ty, 3, k, &mut rng);
            let x = rng.vec(k, 1.0);
            let mut a = vec![BlockQ8K::default(); nb];
            quantize_row_q8_k(&x, &mut a);
            let af = dequantize_q8k(&a);
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
fn any_bytes_decode_to_finite_values() {
    let mut rng = Rng::new(3);
    for (ty, _, _) in TYPES {
        for fill in [0x00u8, 0xFF, 0xAA, 0x55, 0x0F, 0xF0] {
            let mut w = vec![fill; 2 * ty.type_size()];
            crate::kernels::testing::make_valid(ty, &mut w, &mut rng);
            let mut out = vec![f32::NAN; 2 * QK_K];
            dequantize_row(ty, &w, &mut out);
            assert!(out.iter().all(|v| v.is_finite()), "{ty} fill {fill:#04x}");
            let x: Vec<f32> = (0..2 * QK_K).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
            let mut a = vec![BlockQ8K::default(); 2];
            quantize_row_q8_k(&x, &mut a);
            assert!(scalar_dot(ty)(&w, &a).is_finite(), "{ty} fill {fill:#04x} dot");
        }
    }
}

#[test]
fn sign_tables_follow_their_rules() {
    use super::iq::{ksign, KSIGN_BYTES, SIGN_BYTES};
    use super::iq_grids::KSIGNS_IQ2XS;
    for i in 0..128u8 {
        assert_eq!(ksign(i), KSIGNS_IQ2XS[i as usize], "ksigns[{i}]");
        assert_eq!(KSIGN_BYTES[i as usize], SIGN_BYTES[KSIGNS_IQ2XS[i as usize] as usize]);
    }
    for s in 0..=255u8 {
        let b = SIGN_BYTES[s as usize].to_le_bytes();
        assert!((0..8).all(|j| b[j] as i8 == if s >> j & 1 != 0 { -1 } else { 1 }), "{s:#04x}");
    }
}
