//! Block formats of GGUF tensors.
//!
//! [`GgmlType`] is the table of every type id a GGUF file may name, with its
//! block geometry; the reader validates tensors against it. The block layouts
//! and their scalar reference code live one family per file.

use std::fmt;

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
        if n % bs != 0 {
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
    fn row_bytes() {
        assert_eq!(GgmlType::Q4K.row_bytes(2048), Some(8 * 144));
        assert_eq!(GgmlType::Q4K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
    }
}
