//! Writing float32 arrays in NumPy's `.npy` format (version 1.0).

use std::io::{self, Write};

/// Write a C-order little-endian float32 array of `shape`.
pub fn write_f32(mut w: impl Write, shape: &[usize], data: &[f32]) -> io::Result<()> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_txt = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, ending in '\n'.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    let mut bytes = Vec::with_capacity(data.len() * 4);
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&bytes)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned_and_parsable() {
        let mut out = Vec::new();
        super::write_f32(&mut out, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let hlen = u16::from_le_bytes([out[8], out[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&out[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)"), "{header}");
        assert_eq!(out.len(), 10 + hlen + 24);
        assert_eq!(f32::from_le_bytes(out[10 + hlen + 4..10 + hlen + 8].try_into().unwrap()), 1.0);
    }
}
