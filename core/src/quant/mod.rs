//! Block formats of GGUF tensors.
//!
//! [`GgmlType`] is the table of every type id a GGUF file may name, with its
//! block geometry; the reader validates tensors against it. The block layouts
//! and their scalar reference code live one family per file.

use std::fmt;

pub mod float;
pub mod iq;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
#[rustfmt::skip]
pub mod iq_grids;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4;
pub mod mxfp4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q4_k_x4;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q6_k_x4;
pub mod q8_0;
pub mod q8_0_x4;
pub mod q8_k;
pub mod tq;
pub mod x4;

pub use iq1_m::BlockIQ1M;
pub use iq1_s::BlockIQ1S;
pub use iq2_s::BlockIQ2S;
pub use iq2_xs::BlockIQ2XS;
pub use iq2_xxs::BlockIQ2XXS;
pub use iq3_s::BlockIQ3S;
pub use iq3_xxs::BlockIQ3XXS;
pub use iq4::{BlockIQ4NL, BlockIQ4XS};
pub use mxfp4::BlockMXFP4;
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::{BlockQ8_0, BlockQ8_0F, BlockQ8_1, BlockQ8_1F};
pub use q8_k::BlockQ8K;
pub use tq::{BlockTQ1_0, BlockTQ2_0};

/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;

/// A half-precision float as it lies in a file: two little-endian bytes, no
/// alignment requirement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16Bytes(pub [u8; 2]);

/// f16 bits -> f32, exactly, without branches on the common path: the
/// exponent and mantissa are moved into f32 position and rescaled by 2^112,
/// which also turns f16 subnormals into the right normal f32; infinities
/// and NaNs keep an all-ones exponent.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let rest = (h & 0x7FFF) as u32;
    let v = if rest >= 0x7C00 {
        f32::from_bits((rest << 13) | 0x7F80_0000)
    } else {
        f32::from_bits(rest << 13) * f32::from_bits(0x7780_0000) // 2^112
    };
    f32::from_bits(v.to_bits() | sign)
}

/// Round half to even for |x| < 2^22, without a libm call: adding and
/// removing 1.5 * 2^23 leaves the nearest integer under IEEE
/// round-to-nearest-even (bit-identical to `f32::round_ties_even` there).
#[inline(always)]
pub fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

impl F16Bytes {
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f16_to_f32(u16::from_le_bytes(self.0))
    }

    /// Round to nearest even, as `GGML_FP32_TO_FP16` does.
    #[inline]
    pub fn from_f32(v: f32) -> F16Bytes {
        F16Bytes(half::f16::from_f32(v).to_bits().to_le_bytes())
    }
}

/// A block type that can be viewed in place over file bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have alignment 1 and no padding, and every bit
/// pattern is a valid value (they are made of byte arrays only).
pub unsafe trait FileBlock: Copy + 'static {}

/// A block's bytes.
pub fn block_bytes<B: FileBlock>(b: &B) -> &[u8] {
    // SAFETY: `B: FileBlock` is plain bytes (alignment 1, no padding).
    unsafe { std::slice::from_raw_parts((b as *const B).cast::<u8>(), std::mem::size_of::<B>()) }
}

/// View `bytes` as a slice of blocks. Weights come from a memory map at any
/// address; file blocks have alignment 1, so the view never assumes more.
///
/// Panics when `bytes` is not a whole number of blocks (a caller bug: shapes
/// are validated when a matrix is built).
#[inline]
pub fn as_blocks<B: FileBlock>(bytes: &[u8]) -> &[B] {
    let size = std::mem::size_of::<B>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {size}-byte blocks", bytes.len());
    debug_assert_eq!(std::mem::align_of::<B>(), 1);
    // SAFETY: `B: FileBlock` has alignment 1, no padding and no invalid bit
    // patterns; the length is a whole number of blocks inside `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// The 6-bit scale and min number `j` (0..8) of a Q4_K/Q5_K super-block,
/// packed in 12 bytes: the low 6 bits of bytes 0..4 (scales) and 4..8 (mins)
/// for j < 4; nibbles of bytes 8..12 plus the top 2 bits of bytes 0..8 above.
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// All eight (scale, min) pairs of a Q4_K/Q5_K super-block, as two arrays;
/// word-wise (no per-pair branches): the same values as [`scale_min_k4`].
#[inline(always)]
pub fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (sc, m) = scales_mins_k4_words(q);
    (sc.to_le_bytes(), m.to_le_bytes())
}

/// [`scales_mins_k4`] as two little-endian words (byte `j` = pair `j`),
/// ready to move into a vector register.
#[inline(always)]
pub fn scales_mins_k4_words(q: &[u8; 12]) -> (u64, u64) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const NIBBLES: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    // Pairs 0..4: low 6 bits of bytes 0..4 (scales) and 4..8 (mins).
    // Pairs 4..8: nibbles of bytes 8..12, plus the top 2 bits of bytes 0..4 / 4..8.
    let scales_hi = (c & NIBBLES) | (((a >> 6) & TOP2) << 4);
    let mins_hi = ((c >> 4) & NIBBLES) | (((b >> 6) & TOP2) << 4);
    ((a & LOW6) as u64 | (scales_hi as u64) << 32, (b & LOW6) as u64 | (mins_hi as u64) << 32)
}

/// A tensor element type as numbered in GGUF (`ggml_type`).
///
/// Every id that llama.cpp can write is listed so that any valid file opens and
/// can be inspected; which types the kernels can compute with is a separate
/// question answered by the model loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// (type, GGUF id, name, elements per block, bytes per block)
const TYPES: &[(GgmlType, u32, &str, u32, u32)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
    (GgmlType::Q2_0, 42, "Q2_0", 64, 18),
];

impl GgmlType {
    /// The type with GGUF id `id`, or `None` for an id no llama.cpp writes.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.1 == id).map(|t| t.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, u32, u32) {
        // Every variant has exactly one row (checked by a test).
        TYPES.iter().find(|t| t.0 == self).unwrap_or(&TYPES[0])
    }

    /// The GGUF id of this type.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The name llama.cpp prints (`Q4_K`, `F32`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain element types).
    pub fn block_size(self) -> usize {
        self.row().3 as usize
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4 as usize
    }

    /// Bytes taken by a row of `n` elements, or `None` when `n` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    /// All known types, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TYPES.iter().map(|t| t.0)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod iq_tests;
#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tq_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_one_row_and_ids_round_trip() {
        for (i, t) in TYPES.iter().enumerate() {
            assert_eq!(TYPES.iter().filter(|u| u.0 == t.0).count(), 1, "{}", t.2);
            assert_eq!(GgmlType::from_id(t.1), Some(t.0));
            assert_eq!(t.0.id(), t.1);
            if i > 0 {
                assert!(TYPES[i - 1].1 < t.1, "ids sorted");
            }
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let (want, got) = (half::f16::from_bits(bits).to_f32(), f16_to_f32(bits));
            assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()), "{bits:#06x}: {got} vs {want}");
        }
    }

    #[test]
    fn k4_scales_unpack_word_wise() {
        let mut rng = crate::kernels::testing::Rng::new(5);
        for _ in 0..1000 {
            let mut q = [0u8; 12];
            rng.fill_bytes(&mut q);
            let (sc, m) = scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min_k4(j, &q), "pair {j} of {q:?}");
            }
        }
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::Q4K.row_bytes(2048), Some(8 * 144));
        assert_eq!(GgmlType::Q4K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
    }
}

#[cfg(test)]
mod round_tests {
    #[test]
    fn round_even_matches_the_std_rounding() {
        let mut x = -300.0f32;
        while x < 300.0 {
            for v in [x, x + 0.5, x - 0.5, x + 0.499_999_97, -x] {
                assert_eq!(
                    super::round_even(v).to_bits() | 0x8000_0000,
                    v.round_ties_even().to_bits() | 0x8000_0000,
                    "{v}"
                );
            }
            x += 0.037;
        }
    }
}
