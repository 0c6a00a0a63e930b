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
