//! Q3_K: super-blocks of 256 weights in 16 groups of 16, 3 bits each.
//!
//! Low 2 bits packed as in Q2_K; the high bit of value `128h + 32j + l` is bit
//! `4h + j` of `hmask[l]`, and a *clear* high bit subtracts 4 (values -4..4). Sixteen 6-bit scales, offset by 32, are
//! packed in 12 bytes: low nibbles in bytes 0..8, top 2 bits in bytes 8..12.
//! Value = `d * (sc - 32) * q`.

use super::{as_blocks, BlockQ8K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: F16Bytes,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ3K {}

/// The sixteen signed group scales (-32..32). Word-wise: scales 0..8 take the
/// low nibbles of bytes 0..8, scales 8..16 their high nibbles; bit pair `k` of
/// bytes 8..12 supplies the top two bits of scales `4k..4k + 4`.
#[inline(always)]
pub fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(unpack_scales_words(s)) {
        for (v, byte) in o.iter_mut().zip(w.to_le_bytes()) {
            *v = byte as i8 - 32;
        }
    }
    out
}

/// [`unpack_scales`] as four little-endian words of biased scales (byte `i`
/// of word `k` is scale `4k + i` plus 32), ready for a vector register.
#[inline(always)]
pub fn unpack_scales_words(s: &[u8; 12]) -> [u32; 4] {
    const NIBBLES: u32 = 0x0F0F_0F0F;
    const PAIRS: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a, b, high) = (word(0), word(1), word(2));
    [
        (a & NIBBLES) | ((high & PAIRS) << 4),
        (b & NIBBLES) | (((high >> 2) & PAIRS) << 4),
        ((a >> 4) & NIBBLES) | (((high >> 4) & PAIRS) << 4),
        ((b >> 4) & NIBBLES) | (((high >> 6) & PAIRS) << 4),
    ]
}

/// The 256 signed 3-bit values (-4..4) of a super-block, in element order.
#[inline(always)]
fn unpack(b: &BlockQ3K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for h in 0..2 {
        for j in 0..4 {
            let m = 1u8 << (4 * h + j);
            for l in 0..32 {
                let low = ((b.qs[32 * h + l] >> (2 * j)) & 3) as i8;
                v[128 * h + 32 * j + l] = low - if b.hmask[l] & m != 0 { 0 } else { 4 };
            }
        }
    }
    v
}

pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<BlockQ3K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let sc = unpack_scales(&b.scales);
        let q = unpack(b);
        for (g, &s) in sc.iter().enumerate() {
            let dl = d * s as f32;
            for l in 16 * g..16 * g + 16 {
                y[l] = dl * q[l] as f32;
            }
        }
    }
}

/// Dot product of one Q3_K row with Q8_K activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8K]) -> f32 {
    vec_dot_rows(w, [a])[0]
}

/// [`vec_dot`] of one row with `N` activation rows: the block's unpacking
/// shared, each row summed by the same float operations as alone (the
/// scalar path's exact kernels, `kernels::table::Exact`).
#[inline(always)]
pub fn vec_dot_rows<const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let blocks = as_blocks::<BlockQ3K>(w);
    assert!(a.iter().all(|a| a.len() == blocks.len()), "vec_dot: activation rows of another length");
    let mut sum = [0.0f32; N];
    for (i, x) in blocks.iter().enumerate() {
        let sc = unpack_scales(&x.scales);
        let q = unpack(x);
        for (s, a) in sum.iter_mut().zip(&a) {
            let y = &a[i];
            let mut isum = 0i32;
            for (g, &sg) in sc.iter().enumerate() {
                let dot: i32 = (16 * g..16 * g + 16).map(|l| q[l] as i32 * y.qs[l] as i32).sum();
                isum += sg as i32 * dot;
            }
            *s += x.d.to_f32() * y.d * isum as f32;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    /// The scale layout, spelled out one scale at a time.
    fn unpack_scales_bytewise(s: &[u8; 12]) -> [i8; 16] {
        let mut out = [0i8; 16];
        for (g, o) in out.iter_mut().enumerate() {
            let low = if g < 8 { s[g] & 0xF } else { s[g - 8] >> 4 };
            let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
            *o = (low | (high << 4)) as i8 - 32;
        }
        out
    }

    #[test]
    fn scale_unpacking_agrees_with_the_layout() {
        let mut rng = crate::kernels::testing::Rng::new(3);
        for _ in 0..1000 {
            let mut s = [0u8; 12];
            rng.fill_bytes(&mut s);
            assert_eq!(super::unpack_scales(&s), unpack_scales_bytewise(&s));
        }
    }
}
