//! Which instruction set the kernels use, chosen once at start-up.
//!
//! Every path fills the same [`Kernels`] table of function pointers; the
//! scalar table is the reference the others are tested against. Detection runs
//! once (a `OnceLock`), `POCKET_ISA` may force a lower path, and tests and
//! benchmarks can ask for any path the CPU has with [`Kernels::for_isa`].

use super::simd;
use crate::quant::{self, BlockQ8K, BlockQ8_0F, BlockQ8_1, GgmlType};
use half::f16;
use std::fmt;
use std::sync::OnceLock;

/// An instruction-set path of the kernels, from the reference up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust: the reference every other path is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 with the VEX-encoded int8 dot product (`vpdpbusd`, AVX-VNNI).
    AvxVnni,
    /// AVX2 with the EVEX-encoded 256-bit `vpdpbusd` (AVX-512 VNNI + VL);
    /// with AVX-512 F + BW as well, 512-bit four-token K-quant kernels.
    Avx512Vnni,
    /// aarch64 Advanced SIMD.
    Neon,
    /// NEON with the int8 dot product (`sdot`, ARMv8.2 DotProd).
    Dotprod,
    /// NEON with `sdot` and the int8 matrix multiply (`smmla`, ARMv8.6 I8MM).
    I8mm,
}

impl Isa {
    pub const ALL: [Isa; 7] =
        [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Neon, Isa::Dotprod, Isa::I8mm];

    /// The name `POCKET_ISA` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
            Isa::Dotprod => "dotprod",
            Isa::I8mm => "i8mm",
        }
    }

    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Kernel signatures. Each takes one weight row as bytes (a whole number of
// blocks) and the matching activation row(s); callers check the lengths once
// per matrix. They are `unsafe fn` because SIMD paths need their CPU features:
// a table holds only paths the CPU was found to have.

/// The dot product kernels of one weight type with activations of block type `B`.
pub(crate) struct Dot<B: 'static> {
    /// One weight row with one activation row.
    pub(crate) one: unsafe fn(&[u8], &[B]) -> f32,
    /// Several products per pass over the weights (prefill), if the path has them.
    pub(crate) multi: Multi<B>,
    /// Consecutive weight rows with one activation row in one call (no call
    /// and setup per row: rows of 512 values are only two K-quant blocks).
    pub(crate) rows: Option<Rows<B>>,
}

impl<B> Clone for Dot<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Dot<B> {}

impl<B> Dot<B> {
    pub(crate) const fn one(f: unsafe fn(&[u8], &[B]) -> f32) -> Dot<B> {
        Dot { one: f, multi: Multi::None, rows: None }
    }
}

/// `out.len()` consecutive weight rows of `row_bytes` bytes each (`w`) with one
/// activation row, into `out`.
pub(crate) type Rows<B> = unsafe fn(&[u8], usize, &[B], &mut [f32]);
/// Two weight rows with two activation rows.
pub(crate) type Tile2x2<B> = unsafe fn(&[u8], &[u8], &[B], &[B]) -> [f32; 4];
/// One weight row with two, three or four activation rows.
pub(crate) type Acts2<B> = unsafe fn(&[u8], [&[B]; 2]) -> [f32; 2];
pub(crate) type Acts3<B> = unsafe fn(&[u8], [&[B]; 3]) -> [f32; 3];
pub(crate) type Acts4<B> = unsafe fn(&[u8], [&[B]; 4]) -> [f32; 4];

/// One weight row with several activation rows: four per pass, and the two
/// or three left over (a MoE expert's token count is rarely a multiple of four).
pub(crate) struct Acts<B: 'static> {
    pub(crate) two: Acts2<B>,
    pub(crate) three: Acts3<B>,
    pub(crate) four: Acts4<B>,
    /// For formats whose blocks cost more to unpack than to use: a tile's
    /// weight rows decoded once, then dotted four activation rows at a time.
    pub(crate) decoded: Option<Decoded<B>>,
}

impl<B> Clone for Acts<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Acts<B> {}

/// Weight rows decoded once per tile into a layout that is cheaper to use
/// than to unpack: the unpacking of a block then serves all the activation
/// rows of a tile instead of four. Q4_0 / Q5_0 (whose 4- and 5-bit blocks
/// take as many instructions to unpack as to multiply) decode into int8
/// blocks with f32 scales ([`BlockQ8_0F`], the layout of the activations);
/// Q2_K into bytes of value times group scale (at most 45), so that two
/// registers of products share one widening step; Q3_K into unpacked bytes.
/// Either way the same integers meet the same float tail: the products equal
/// the four-row kernel's to the bit.
pub(crate) struct Decoded<B: 'static> {
    /// Bytes of one decoded block: a multiple of its layout's alignment (at
    /// most 8), so that rows of whole blocks in an 8-byte-aligned buffer stay
    /// aligned.
    pub(crate) block_bytes: usize,
    /// Decode a tile's weight rows from this many activation rows on: below,
    /// unpacking each block per four rows costs less than a pass that writes
    /// and reads the decoded rows.
    pub(crate) min_acts: usize,
    /// One weight row into `out` (`block_bytes` per weight block).
    pub(crate) decode: unsafe fn(&[u8], &mut [u8]),
    /// Decoded weight rows (of the given byte length each) with four
    /// activation rows: `out[n][r]` is row `r` with activation row `n` (one
    /// call per tile and group of four: the tile's rows are dotted without a
    /// call and four scattered stores each).
    pub(crate) four: DecodedRows4<B>,
}

/// `bytes` (a decoded row, see [`Decoded`]) as blocks of its layout `T`.
///
/// # Safety
/// `T` must be plain data (integer and float fields, no padding), valid for
/// any bit pattern.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) unsafe fn decoded_blocks<T>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {size}-byte blocks", bytes.len());
    assert!(bytes.as_ptr().cast::<T>().is_aligned(), "decoded blocks are misaligned");
    // SAFETY: aligned, in bounds, and any bit pattern is a valid `T` (caller).
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / size) }
}

/// [`decoded_blocks`], mutable.
///
/// # Safety
/// As for [`decoded_blocks`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) unsafe fn decoded_blocks_mut<T>(bytes: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {size}-byte blocks", bytes.len());
    assert!(bytes.as_ptr().cast::<T>().is_aligned(), "decoded blocks are misaligned");
    // SAFETY: as above; `bytes` is borrowed mutably for the result's lifetime.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / size) }
}

/// An 8-byte-aligned buffer of `len` bytes for decoded rows, grown as needed
/// and reused.
pub(crate) fn decoded_buffer(buf: &mut Vec<u64>, len: usize) -> &mut [u8] {
    buf.resize(len.div_ceil(8), 0);
    // SAFETY: `u64` storage of at least `len` bytes; bytes have no alignment
    // or validity requirement.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), len) }
}

/// See [`Decoded::four`].
pub(crate) type DecodedRows4<B> = unsafe fn(&[u8], usize, [&[B]; 4], [&mut [f32]; 4]);

impl<B> Clone for Decoded<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Decoded<B> {}

/// Kernels that compute several dot products per pass over the weights.
pub(crate) enum Multi<B: 'static> {
    None,
    /// Two weight rows with two activation rows (`smmla`):
    /// `[w0.a0, w0.a1, w1.a0, w1.a1]`.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Tile2x2(Tile2x2<B>),
    /// One weight row with up to four activation rows: each unpacked weight
    /// register serves every token.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Acts(Acts<B>),
}

impl<B> Clone for Multi<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Multi<B> {}

/// The kernels for one weight type, by activation format.
#[derive(Clone, Copy)]
pub(crate) enum RowDot {
    Q8_0(Dot<BlockQ8_0F>),
    Q8_1(Dot<BlockQ8_1>),
    Q8K(Dot<BlockQ8K>),
    F32(Dot<f32>),
}

/// One instruction-set path: a table of kernels.
pub struct Kernels {
    pub(crate) isa: Isa,
    pub(crate) q4_0: Dot<BlockQ8_0F>,
    pub(crate) q5_0: Dot<BlockQ8_0F>,
    pub(crate) q8_0: Dot<BlockQ8_0F>,
    pub(crate) q4_1: Dot<BlockQ8_1>,
    pub(crate) q5_1: Dot<BlockQ8_1>,
    pub(crate) q2_k: Dot<BlockQ8K>,
    pub(crate) q3_k: Dot<BlockQ8K>,
    pub(crate) q4_k: Dot<BlockQ8K>,
    pub(crate) q5_k: Dot<BlockQ8K>,
    pub(crate) q6_k: Dot<BlockQ8K>,
    pub(crate) f32: Dot<f32>,
    pub(crate) f16: Dot<f32>,
    pub(crate) bf16: Dot<f32>,
    // f32 helpers (attention, norms)
    pub(crate) dot_f32: unsafe fn(&[f32], &[f32]) -> f32,
    pub(crate) axpy_f32: unsafe fn(&mut [f32], f32, &[f32]),
    // attention over an f16 KV cache: see ops::scores_f16 / mix_f16
    pub(crate) scores_f16: unsafe fn(&[f32], usize, &[f16], &mut [f32]),
    pub(crate) mix_f16: unsafe fn(&[f32], usize, &[f16], &mut [f32]),
    // recurrent state (Gated DeltaNet): see ops::state_read / state_update
    pub(crate) state_read: StateRead,
    pub(crate) state_update: unsafe fn(&mut [f32], f32, &[f32], &[f32]),
    // activations
    pub(crate) silu: unsafe fn(&mut [f32]),
    /// Q8_K activation quantiser (equal to the bit to the scalar one).
    pub(crate) quantize_q8k: unsafe fn(&[f32], &mut [BlockQ8K]),
}

/// `state_read(s, k, q, u, out)`: see [`super::ops::state_read`].
pub(crate) type StateRead = unsafe fn(&[f32], &[f32], &[f32], &mut [f32], &mut [f32]);

impl Kernels {
    /// The portable reference path.
    pub(crate) const SCALAR: Kernels = Kernels {
        isa: Isa::Scalar,
        q4_0: Dot::one(quant::q4_0::vec_dot),
        q5_0: Dot::one(quant::q5_0::vec_dot),
        q8_0: Dot::one(quant::q8_0::vec_dot),
        q4_1: Dot::one(quant::q4_1::vec_dot),
        q5_1: Dot::one(quant::q5_1::vec_dot),
        q2_k: Dot::one(quant::q2_k::vec_dot),
        q3_k: Dot::one(quant::q3_k::vec_dot),
        q4_k: Dot::one(quant::q4_k::vec_dot),
        q5_k: Dot::one(quant::q5_k::vec_dot),
        q6_k: Dot::one(quant::q6_k::vec_dot),
        f32: Dot::one(quant::float::vec_dot_f32),
        f16: Dot::one(quant::float::vec_dot_f16),
        bf16: Dot::one(quant::float::vec_dot_bf16),
        dot_f32: super::ops::scalar::dot_f32,
        axpy_f32: super::ops::scalar::axpy_f32,
        scores_f16: super::ops::scalar::scores_f16,
        mix_f16: super::ops::scalar::mix_f16,
        state_read: super::ops::scalar::state_read,
        state_update: super::ops::scalar::state_update,
        silu: super::ops::scalar::silu,
        quantize_q8k: quant::q8_k::quantize_row_q8_k,
    };

    /// The path chosen at start-up: the best the CPU has, or `POCKET_ISA`.
    pub fn selected() -> &'static Kernels {
        let all = available();
        &all[*SELECTED.get_or_init(|| {
            let isas: Vec<Isa> = all.iter().map(|k| k.isa).collect();
            select(&isas, std::env::var("POCKET_ISA").ok().as_deref())
        })]
    }

    /// The path `isa`, if this CPU (and this build's architecture) has it.
    pub fn for_isa(isa: Isa) -> Option<&'static Kernels> {
        available().iter().find(|k| k.isa == isa)
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The kernels for weights of type `ty`, or `None` if unsupported.
    pub(crate) fn row_dot(&self, ty: GgmlType) -> Option<RowDot> {
        use GgmlType as T;
        Some(match ty {
            T::Q4_0 => RowDot::Q8_0(self.q4_0),
            T::Q5_0 => RowDot::Q8_0(self.q5_0),
            T::Q8_0 => RowDot::Q8_0(self.q8_0),
            T::Q4_1 => RowDot::Q8_1(self.q4_1),
            T::Q5_1 => RowDot::Q8_1(self.q5_1),
            T::Q2K => RowDot::Q8K(self.q2_k),
            T::Q3K => RowDot::Q8K(self.q3_k),
            T::Q4K => RowDot::Q8K(self.q4_k),
            T::Q5K => RowDot::Q8K(self.q5_k),
            T::Q6K => RowDot::Q8K(self.q6_k),
            T::F32 => RowDot::F32(self.f32),
            T::F16 => RowDot::F32(self.f16),
            T::BF16 => RowDot::F32(self.bf16),
            _ => return None,
        })
    }
}

static AVAILABLE: OnceLock<Vec<Kernels>> = OnceLock::new();
static SELECTED: OnceLock<usize> = OnceLock::new();

/// Every path this CPU can run, scalar first, best last.
fn available() -> &'static [Kernels] {
    AVAILABLE.get_or_init(|| {
        let mut all = vec![Kernels::SCALAR];
        all.extend(simd::detected());
        all
    })
}

/// Index in `available` of the path to use: the best, or `want` (the value of
/// `POCKET_ISA`) when the CPU has it; otherwise a warning and the best.
fn select(available: &[Isa], want: Option<&str>) -> usize {
    let best = available.len() - 1;
    let Some(want) = want else { return best };
    match Isa::from_name(want) {
        Some(isa) => available.iter().position(|&a| a == isa).unwrap_or_else(|| {
            log::warn!("POCKET_ISA={want}: this CPU lacks it; using {}", available[best]);
            best
        }),
        None => {
            let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
            log::warn!("POCKET_ISA={want} is not one of {}; using {}", names.join("|"), available[best]);
            best
        }
    }
}

/// The instruction-set path the kernels run on.
pub fn isa() -> Isa {
    Kernels::selected().isa
}

/// Every path this CPU can run, scalar first.
pub fn available_isas() -> Vec<Isa> {
    available().iter().map(|k| k.isa).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pocket_isa_forces_an_available_path_only() {
        let avail = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni];
        assert_eq!(select(&avail, None), 2);
        assert_eq!(select(&avail, Some("scalar")), 0);
        assert_eq!(select(&avail, Some("AVX2")), 1);
        assert_eq!(select(&avail, Some("i8mm")), 2, "missing path: the best instead");
        assert_eq!(select(&avail, Some("sse9")), 2, "unknown name: the best instead");
        for isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
            assert_eq!(isa.to_string(), isa.name());
        }
        // Every path this CPU reports has a table, scalar first.
        assert_eq!(available_isas()[0], Isa::Scalar);
        assert!(available_isas().iter().all(|&i| Kernels::for_isa(i).is_some_and(|k| k.isa() == i)));
    }
}
