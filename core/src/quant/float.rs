//! Plain element types: F32, F16 and BF16 (little-endian, any alignment).
//!
//! Their dot products take f32 activations and accumulate in f32.

fn f16_at(b: &[u8]) -> f32 {
    super::f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

fn bf16_at(b: &[u8]) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
}

fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 4);
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32_at(b);
    }
}

pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 2);
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_at(b);
    }
}

pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 2);
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_at(b);
    }
}

pub fn vec_dot_f32(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len() * 4);
    w.chunks_exact(4).zip(x).map(|(b, &v)| f32_at(b) * v).sum()
}

pub fn vec_dot_f16(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len() * 2);
    w.chunks_exact(2).zip(x).map(|(b, &v)| f16_at(b) * v).sum()
}

pub fn vec_dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len() * 2);
    w.chunks_exact(2).zip(x).map(|(b, &v)| bf16_at(b) * v).sum()
}
