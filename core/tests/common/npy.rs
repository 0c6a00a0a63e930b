//! A minimal `.npy` reader: little-endian f32 (`<f4`), C order, versions 1-3.

use std::path::Path;

/// The shape and values of an f32 `.npy` file. Panics on anything else.
pub fn read_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(bytes.len() >= 10 && &bytes[..6] == b"\x93NUMPY", "{}: not an .npy file", path.display());
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => panic!("{}: .npy version {v}", path.display()),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len]).expect("ASCII header");
    assert!(header.contains("'descr': '<f4'"), "{}: not little-endian f32: {header}", path.display());
    assert!(header.contains("'fortran_order': False"), "{}: not C order", path.display());
    let shape_text = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).expect("shape");
    let shape: Vec<usize> =
        shape_text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().expect("dim")).collect();
    let data = &bytes[start + header_len..];
    let count: usize = shape.iter().product();
    assert_eq!(data.len(), count * 4, "{}: {} data bytes for shape {shape:?}", path.display(), data.len());
    let values = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    (shape, values)
}
