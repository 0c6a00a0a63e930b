//! Reading reference arrays: `.npy` (f32 and i32, C order) and uncompressed
//! `.npz` archives (NumPy's `savez`), plus the comparisons the conformance
//! tests report.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

/// An array from a `.npy` file.
#[derive(Debug, Clone)]
pub struct Array {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub i32: Vec<i32>,
}

/// Parse the bytes of a `.npy` file holding `<f4` or `<i4` data.
pub fn parse_npy(bytes: &[u8], what: &str) -> Array {
    assert!(bytes.len() >= 10 && &bytes[..6] == b"\x93NUMPY", "{what}: not an .npy file");
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).expect("ASCII header");
    assert!(header.contains("'fortran_order': False"), "{what}: not C order");
    let shape_text = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).expect("shape");
    let shape: Vec<usize> =
        shape_text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().expect("dim")).collect();
    let data = &bytes[start + hlen..];
    let words = data.chunks_exact(4).map(|b| [b[0], b[1], b[2], b[3]]);
    let mut a = Array { shape, f32: Vec::new(), i32: Vec::new() };
    if header.contains("'<f4'") {
        a.f32 = words.map(f32::from_le_bytes).collect();
    } else if header.contains("'<i4'") {
        a.i32 = words.map(i32::from_le_bytes).collect();
    } else {
        panic!("{what}: unsupported dtype in {header}");
    }
    a
}

pub fn read_npy(path: &Path) -> Array {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    parse_npy(&bytes, &path.display().to_string())
}

/// The members of an uncompressed `.npz` (zip, stored entries), by name without `.npy`.
pub fn read_npz(path: &Path) -> HashMap<String, Array> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut out = HashMap::new();
    let mut at = 0usize;
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as usize;
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
    // Local file headers: signature PK\x03\x04.
    while at + 30 <= bytes.len() && bytes[at..at + 4] == *b"PK\x03\x04" {
        let method = u16_at(&bytes, at + 8);
        assert_eq!(method, 0, "{}: compressed npz member", path.display());
        let mut size = u32_at(&bytes, at + 18);
        let name_len = u16_at(&bytes, at + 26);
        let extra_len = u16_at(&bytes, at + 28);
        let name = String::from_utf8_lossy(&bytes[at + 30..at + 30 + name_len]).to_string();
        if size == 0xFFFF_FFFF {
            // zip64: the size is in the extra field (id 1: original size, compressed size).
            let extra = &bytes[at + 30 + name_len..at + 30 + name_len + extra_len];
            size = u64::from_le_bytes(extra[4..12].try_into().unwrap()) as usize;
        }
        let data_at = at + 30 + name_len + extra_len;
        let member = &bytes[data_at..data_at + size];
        out.insert(name.trim_end_matches(".npy").to_string(), parse_npy(member, &name));
        at = data_at + size;
    }
    out
}

/// log-softmax in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p ‖ q) of two logit rows.
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    lp.iter().zip(&lq).map(|(&a, &b)| a.exp() * (a - b)).sum()
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median KL(reference ‖ ours) over the `v`-wide rows, and the rows whose top-1 agree.
pub fn median_kl_and_top1(reference: &[f32], ours: &[f32], v: usize) -> (f64, usize) {
    let (mut kls, mut top1) = (Vec::new(), 0);
    for (a, b) in reference.chunks_exact(v).zip(ours.chunks_exact(v)) {
        kls.push(kl(a, b));
        top1 += (argmax(a) == argmax(b)) as usize;
    }
    (median(kls), top1)
}
