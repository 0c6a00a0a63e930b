//! Random but valid blocks for `synth-model`, in every type a quantisation
//! preset makes: random bytes (every grid index, sign pattern and sub-scale
//! is valid) with the scale fields set so that the weights are finite, of a
//! checkpoint's magnitude and average zero.
//!
//! Zero mean matters: a common offset in every row of every matrix turns the
//! hidden states of all tokens towards one direction, and every token of a
//! prompt then picks the same experts (measured on the earlier files: all
//! 128 tokens of a prompt in the same 8 experts of 256, in every layer).

use pocket_core::kernels::dequantize_row;
use pocket_core::quant::{F16Bytes, GgmlType};

/// What an F32 tensor is filled with.
#[derive(Clone, Copy, Debug)]
pub enum Fill {
    /// Weights: uniform in +-0.02.
    Random,
    /// Weights [`Fill::Random`] would give, times this gain.
    Loud(f32),
    Const(f32),
    /// Uniform in [lo, hi).
    Range(f32, f32),
    /// `(n, a, b)`: the first `n` values `a`, the rest `b` (F32 only).
    Split(usize, f32, f32),
    /// `(width, gain)`: a matrix of rows `width` long, `gain` on its
    /// diagonal (row r, column r) over [`Fill::Random`]'s values (F32 only).
    Eye(usize, f32),
}

impl Fill {
    /// The weights' gain over [`Fill::Random`]'s (1 for every other fill).
    fn gain(self) -> f32 {
        match self {
            Fill::Loud(g) => g,
            _ => 1.0,
        }
    }
}

/// xorshift64*: fast, good enough for filler bits.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// The RMS the calibrated formats' weights get (a checkpoint's, for a
/// 2048-wide model).
const TARGET_RMS: f32 = 0.02;

/// Where a block keeps its scale and how it is set.
#[derive(Clone, Copy)]
enum Scale {
    /// The K-quants, by hand (the files made before the IQ types came stay
    /// byte for byte the same): f16 `d` at `d_at`, and for formats with a
    /// minimum (`d * sc * q - dmin * m`) `dmin = d * mean(q)` at `min.0`,
    /// which with random sub-scales and mins (the same width, so the same
    /// mean) gives weights that average zero.
    Fixed { d_at: usize, min: Option<(usize, f32)>, d: f32 },
    /// An f16 `d` at `d_at`, calibrated to [`TARGET_RMS`]. `signed`: a
    /// random sign per block, for formats whose values are not symmetric
    /// about zero (`q - 8`, the IQ4 table); `min`: an f16 minimum at `min.0`
    /// set to `-d * mean(q)` (`d * q + m` formats).
    F16 { d_at: usize, signed: bool, min: Option<(usize, f32)> },
    /// IQ1_M: the f16 `d` in the top nibbles of the four little-endian scale
    /// words at byte 48, calibrated.
    Iq1M,
    /// MXFP4: an E8M0 exponent byte at 0, calibrated to the nearest power of two.
    E8M0,
}

fn scale_of(ty: GgmlType) -> Scale {
    use GgmlType as T;
    let f16 = |signed, min| Scale::F16 { d_at: 0, signed, min };
    match ty {
        T::Q2K => Scale::Fixed { d_at: 80, min: Some((82, 1.5)), d: 4e-4 },
        T::Q3K => Scale::Fixed { d_at: 108, min: None, d: 1.5e-4 },
        T::Q4K => Scale::Fixed { d_at: 0, min: Some((2, 7.5)), d: 2e-5 },
        T::Q5K => Scale::Fixed { d_at: 0, min: Some((2, 15.5)), d: 1e-5 },
        T::Q6K => Scale::Fixed { d_at: 208, min: None, d: 5e-6 },
        T::Q8_0 | T::Q4_0 | T::Q5_0 | T::IQ4NL => f16(true, None),
        T::Q4_1 => f16(false, Some((2, 7.5))),
        T::Q5_1 => f16(false, Some((2, 15.5))),
        T::IQ1S | T::IQ2XXS | T::IQ2XS | T::IQ2S | T::IQ3XXS | T::IQ3S | T::IQ4XS => f16(false, None),
        T::IQ1M => Scale::Iq1M,
        T::MXFP4 => Scale::E8M0,
        // Random trits: -1 as often as 1 (see `random_bytes` for TQ2_0).
        T::TQ1_0 => Scale::F16 { d_at: 52, signed: false, min: None },
        T::TQ2_0 => Scale::F16 { d_at: 64, signed: false, min: None },
        other => panic!("synth-model has no block recipe for {other}"),
    }
}

/// Fill `buf`, a whole tensor of type `ty`.
pub fn fill_tensor(ty: GgmlType, fill: Fill, buf: &mut [u8], rng: &mut Rng) {
    match ty {
        GgmlType::F32 => {
            for (i, c) in buf.chunks_exact_mut(4).enumerate() {
                let v = match fill {
                    Fill::Split(n, a, b) => {
                        if i < n {
                            a
                        } else {
                            b
                        }
                    }
                    Fill::Eye(width, gain) if i % width == i / width => gain + float(Fill::Random, rng),
                    _ => float(fill, rng),
                };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in buf.chunks_exact_mut(2) {
                c.copy_from_slice(&F16Bytes::from_f32(float(fill, rng)).0);
            }
        }
        GgmlType::BF16 => {
            for c in buf.chunks_exact_mut(2) {
                c.copy_from_slice(&((float(fill, rng).to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        _ => {
            let scale = scale_of(ty);
            let unit = fill.gain()
                * match scale {
                    Scale::Fixed { d, .. } => d,
                    _ => calibrate(ty, scale),
                };
            random_bytes(ty, buf, rng);
            for b in buf.chunks_exact_mut(ty.type_size()) {
                let jitter = 0.5 + rng.unit();
                let sign = match scale {
                    Scale::F16 { signed: true, .. } if rng.next() & 1 == 1 => -1.0,
                    _ => 1.0,
                };
                set_scale(scale, b, unit, sign * jitter);
            }
        }
    }
}

/// Random block bytes (scales set afterwards). TQ2_0's 2-bit values lose
/// the stored 3 (+2, which no quantiser writes): it becomes 1 (zero weight),
/// leaving -1 and +1 equally likely.
fn random_bytes(ty: GgmlType, buf: &mut [u8], rng: &mut Rng) {
    rng.fill(buf);
    if ty == GgmlType::TQ2_0 {
        for b in buf.iter_mut() {
            // the high bit of every pair whose two bits are set
            *b ^= *b & (*b << 1) & 0xAA;
        }
    }
}

fn float(fill: Fill, rng: &mut Rng) -> f32 {
    match fill {
        Fill::Const(v) => v,
        Fill::Range(lo, hi) => lo + (hi - lo) * rng.unit(),
        Fill::Random | Fill::Loud(_) | Fill::Eye(..) => (rng.unit() - 0.5) * 0.04 * fill.gain(),
        // Position-dependent: only an F32 tensor takes it (see fill_tensor).
        Fill::Split(_, a, _) => a,
    }
}

/// Set one block's scale fields for a scale of `unit * jitter` (for E8M0,
/// the nearest power of two).
fn set_scale(scale: Scale, b: &mut [u8], unit: f32, jitter: f32) {
    let f16 = F16Bytes::from_f32;
    let d = unit * jitter;
    match scale {
        Scale::Fixed { d_at, min, d: _ } => {
            b[d_at..d_at + 2].copy_from_slice(&half_bits(d).to_le_bytes());
            if let Some((m, mean_q)) = min {
                // In this order: the files made before keep their bytes.
                b[m..m + 2].copy_from_slice(&half_bits(unit * mean_q * jitter).to_le_bytes());
            }
        }
        Scale::F16 { d_at, min, .. } => {
            b[d_at..d_at + 2].copy_from_slice(&f16(d).0);
            if let Some((m, mean_q)) = min {
                b[m..m + 2].copy_from_slice(&f16(-d * mean_q).0);
            }
        }
        Scale::Iq1M => {
            let h = u16::from_le_bytes(f16(d).0);
            for k in 0..4 {
                let hi = &mut b[48 + 2 * k + 1];
                *hi = (*hi & 0x0F) | (((h >> (4 * k)) & 0xF) as u8) << 4;
            }
        }
        // Scale 2^(e - 127).
        Scale::E8M0 => b[0] = (127.0 + d.log2().round()).clamp(1.0, 254.0) as u8,
    }
}

/// The scale that gives `ty`'s random blocks an RMS of [`TARGET_RMS`]:
/// measured on blocks of scale 1.
fn calibrate(ty: GgmlType, scale: Scale) -> f32 {
    const BLOCKS: usize = 64;
    let mut rng = Rng(0x5EED_CA11_B8A7_E001);
    let mut buf = vec![0u8; BLOCKS * ty.type_size()];
    random_bytes(ty, &mut buf, &mut rng);
    for b in buf.chunks_exact_mut(ty.type_size()) {
        set_scale(scale, b, 1.0, 1.0);
    }
    let mut x = vec![0f32; BLOCKS * ty.block_size()];
    dequantize_row(ty, &buf, &mut x);
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    TARGET_RMS / rms
}

/// f32 -> f16 bits for normal, positive values in f16's range (truncating:
/// the K-quant files made before keep their bytes).
fn half_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        // Subnormal f16: value / 2^-24.
        return (v / 5.960_464_5e-8).round() as u16;
    }
    let mant = (bits >> 13) & 0x3ff;
    ((exp as u32) << 10 | mant) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type a preset makes, quantised ones first.
    const TYPES: [GgmlType; 24] = {
        use GgmlType as T;
        [
            T::Q2K,
            T::Q3K,
            T::Q4K,
            T::Q5K,
            T::Q6K,
            T::Q8_0,
            T::Q4_0,
            T::Q4_1,
            T::Q5_0,
            T::Q5_1,
            T::IQ1S,
            T::IQ1M,
            T::IQ2XXS,
            T::IQ2XS,
            T::IQ2S,
            T::IQ3XXS,
            T::IQ3S,
            T::IQ4NL,
            T::IQ4XS,
            T::MXFP4,
            T::TQ1_0,
            T::TQ2_0,
            T::F16,
            T::BF16,
        ]
    };

    #[test]
    fn random_blocks_dequantise_to_plausible_zero_mean_weights() {
        let mut rng = Rng(7);
        for ty in TYPES {
            // 256 rows of 4096 weights.
            let (cols, rows) = (4096usize, 256usize);
            let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
            let mut buf = vec![0u8; rows * row_bytes];
            fill_tensor(ty, Fill::Random, &mut buf, &mut rng);
            let mut x = vec![0f32; cols];
            let (mut sum, mut sq, mut max_row_mean) = (0f64, 0f64, 0f64);
            for row in buf.chunks_exact(row_bytes) {
                dequantize_row(ty, row, &mut x);
                assert!(x.iter().all(|v| v.is_finite()), "{ty}: not finite");
                let s: f64 = x.iter().map(|&v| v as f64).sum();
                sum += s;
                sq += x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
                max_row_mean = max_row_mean.max((s / cols as f64).abs());
            }
            let n = (rows * cols) as f64;
            let (mean, rms) = (sum / n, (sq / n).sqrt());
            eprintln!("{ty:>8}: rms {rms:.2e}, mean {mean:+.2e}, largest row mean {max_row_mean:.2e}");
            assert!((1e-3..1.0).contains(&rms), "{ty}: rms {rms}");
            // The mean is a small part of the spread (a common offset would be
            // a large one). A row's mean varies more (sub-block scales and
            // mins are shared by 16 or 32 weights: up to about rms / 4 in the
            // K-quants), but averages out over the rows.
            assert!(mean.abs() < rms / 100.0, "{ty}: mean {mean} against rms {rms}");
            assert!(max_row_mean < rms / 3.0, "{ty}: a row's mean {max_row_mean} against rms {rms}");
        }
    }
}
