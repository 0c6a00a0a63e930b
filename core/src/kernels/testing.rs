//! Seeded random data for tests and benchmarks: a small PRNG, random f32
//! vectors, and random but valid weight rows of any supported type.

use crate::quant::GgmlType;
use half::{bf16, f16};

/// SplitMix64: tiny, seedable, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        2.0 * self.f32() - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// `n` values uniform in [-amp, amp), with an occasional outlier ten times
    /// larger (as real activations have).
    pub fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.signed() * amp * if self.below(50) == 0 { 10.0 } else { 1.0 }).collect()
    }
}

/// Byte offsets of the f16 scale fields inside one block of `ty`.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => &[0, 2],
        T::Q2K => &[80, 82],
        T::Q3K => &[108],
        T::Q6K => &[208],
        T::IQ2XXS | T::IQ2XS | T::IQ2S | T::IQ1S => &[0],
        T::IQ4NL | T::IQ4XS | T::IQ3XXS | T::IQ3S => &[0],
        T::TQ1_0 => &[52],
        T::TQ2_0 => &[64],
        _ => &[],
    }
}

/// `rows` random rows of `cols` elements of type `ty`: random quant bits and
/// scales of realistic size (never NaN or infinite).
pub fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let mut data = vec![0u8; rows * row_bytes];
    match ty {
        GgmlType::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.signed() * 0.1).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(rng.signed() * 0.1).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(rng.signed() * 0.1).to_le_bytes());
            }
        }
        _ => {
            rng.fill_bytes(&mut data);
            make_valid(ty, &mut data, rng);
        }
    }
    data
}

/// Turn random bytes into valid weights of `ty` in place: realistic scales in
/// the f16 fields of quantised blocks; normal, finite values in float formats
/// (the exponent's top bit cleared and the next one set: magnitudes below 2,
/// no NaN and no denormal slow paths).
pub fn make_valid(ty: GgmlType, data: &mut [u8], rng: &mut Rng) {
    match ty {
        GgmlType::F16 | GgmlType::BF16 => data.chunks_exact_mut(2).for_each(|c| c[1] = (c[1] & 0xBF) | 0x20),
        GgmlType::F32 => data.chunks_exact_mut(4).for_each(|c| c[3] = (c[3] & 0xBF) | 0x20),
        GgmlType::IQ1M => {
            // The f16 scale is the top nibbles of the four scale words (bytes 48..56).
            for block in data.chunks_exact_mut(ty.type_size()) {
                let v = (0.2 + rng.f32()) * 2e-3 * if rng.below(4) == 0 { -1.0 } else { 1.0 };
                let bits = f16::from_f32(v).to_bits();
                for i in 0..4 {
                    let b = &mut block[49 + 2 * i];
                    *b = (*b & 0x0F) | ((bits >> (4 * i)) as u8 & 0x0F) << 4;
                }
            }
        }
        GgmlType::MXFP4 => {
            // E8M0 exponents around 2^-10 (2^-11 after the doubled values).
            for block in data.chunks_exact_mut(ty.type_size()) {
                block[0] = 112 + rng.below(8) as u8;
            }
        }
        _ => {
            let fields = f16_fields(ty);
            for block in data.chunks_exact_mut(ty.type_size()) {
                for &off in fields {
                    // Scales around 1e-3 with either sign (mins may be negative too).
                    let v = (0.2 + rng.f32()) * 2e-3 * if rng.below(4) == 0 { -1.0 } else { 1.0 };
                    block[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
        }
    }
}
