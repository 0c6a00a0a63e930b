//! Dequantisation equals gguf-py's reference on real tensor rows from the
//! fixture store (`dequant/<TYPE>.raw` -> `<TYPE>.deq.npy`), within 1e-6;
//! and, for the formats the store has no rows of, on random blocks that
//! gguf-py dequantised (`tests/data/<TYPE>.raw` -> `<TYPE>.deq.f32`: 8
//! super-blocks, random f16 scales and bits, the last one all 0xFF), exactly.

mod common;

use pocket_core::kernels::{dequantize_row, supports};
use pocket_core::quant::GgmlType;

const TYPES: [&str; 13] =
    ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"];

fn ty(name: &str) -> GgmlType {
    GgmlType::all().find(|t| t.name() == name).unwrap_or_else(|| panic!("type {name}"))
}

#[test]
fn dequantisation_matches_reference() {
    let dir = common::fixtures().join("dequant");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).expect("index.json")).expect("json");
    for name in TYPES {
        let t = ty(name);
        assert!(supports(t), "{name} supported");
        let meta = &index[name];
        let rows = meta["rows"].as_u64().expect("rows") as usize;
        let cols = meta["row_len"].as_u64().expect("row_len") as usize;
        let row_bytes = meta["bytes_per_row"].as_u64().expect("bytes_per_row") as usize;
        assert_eq!(t.row_bytes(cols as u64), Some(row_bytes as u64), "{name} row size");
        let raw = std::fs::read(dir.join(format!("{name}.raw"))).expect("raw");
        assert_eq!(raw.len(), rows * row_bytes, "{name}.raw size");
        let (shape, want) = common::npy::read_f32(&dir.join(format!("{name}.deq.npy")));
        assert_eq!(shape, vec![rows, cols], "{name} shape");
        let mut got = vec![0.0f32; cols];
        let mut worst = 0.0f32;
        for r in 0..rows {
            dequantize_row(t, &raw[r * row_bytes..(r + 1) * row_bytes], &mut got);
            for (c, (&g, &w)) in got.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
                assert!((g - w).abs() <= 1e-6, "{name} row {r} col {c}: got {g}, reference {w}");
                worst = worst.max((g - w).abs());
            }
        }
        eprintln!("{name}: {rows}x{cols} dequantised, max |diff| {worst:e}");
    }
}

#[test]
fn dequantisation_of_random_blocks_matches_gguf_py() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for name in ["IQ3_XXS", "IQ3_S"] {
        let t = ty(name);
        assert!(supports(t), "{name} supported");
        let raw = std::fs::read(dir.join(format!("{name}.raw"))).expect("raw");
        let want: Vec<f32> = std::fs::read(dir.join(format!("{name}.deq.f32")))
            .expect("deq")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(raw.len() / t.type_size() * t.block_size(), want.len(), "{name} sizes");
        let mut got = vec![0.0f32; want.len()];
        dequantize_row(t, &raw, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} value {i}: got {g}, gguf-py {w}");
        }
    }
}
