//! The kernel table: the types of [`Kernels`] (one instruction-set path's
//! function pointers) and the scalar path that is the reference every other
//! is tested against. Filling the table for a SIMD path is `simd/`'s job;
//! choosing one at start-up is [`super::dispatch`]'s. This file knows neither.

use super::scalar;
use crate::quant::{self, BlockQ8K, BlockQ8_0F, BlockQ8_1F, GgmlType};
use half::f16;
use std::fmt;

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
    /// Prefill as a GEMM over decoded panels of weight rows, if the path has
    /// it: taken over `multi` for tiles of enough activation rows.
    pub(crate) panels: Option<Panels<B>>,
}

impl<B> Clone for Dot<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Dot<B> {}

impl<B> Dot<B> {
    pub(crate) const fn one(f: unsafe fn(&[u8], &[B]) -> f32) -> Dot<B> {
        Dot { one: f, multi: Multi::None, rows: None, panels: None }
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

/// Weight rows decoded a panel at a time (`height` rows), once per tile,
/// into a layout every token of the tile multiplies directly: a GEMM
/// microkernel's packed operand (see `simd/neon/gemm.rs`,
/// `simd/avx2/gemm.rs`).
pub(crate) struct Panels<B: 'static> {
    /// Weight rows per panel.
    pub(crate) height: usize,
    /// Bytes of one decoded block of a panel (`height` weight blocks).
    pub(crate) block_bytes: usize,
    /// Decode from this many activation rows on (below, the rows kernels).
    pub(crate) min_acts: usize,
    /// Activation rows per call of `dot` (at most).
    pub(crate) acts: usize,
    /// `height` weight rows (whole blocks each) into `out` (`block_bytes`
    /// per block).
    pub(crate) decode: unsafe fn(&[&[u8]], &mut [u8]),
    /// One decoded panel with one to `acts` activation rows: row `r` of the
    /// panel with activation row `t` is written to `out[t * stride + r]`
    /// (straight into the product's output: `stride` is its row length).
    /// The caller owns those `height` values of each of the rows, and
    /// nothing else there is touched.
    pub(crate) dot: PanelDot<B>,
}

/// See [`Panels::dot`]: `(decoded panel, activation rows, out, stride)`.
pub(crate) type PanelDot<B> = unsafe fn(&[u8], &[&[B]], *mut f32, usize);

impl<B> Clone for Panels<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Panels<B> {}

/// Kernels that compute several dot products per pass over the weights.
pub(crate) enum Multi<B: 'static> {
    None,
    /// Two weight rows with two activation rows (`smmla`):
    /// `[w0.a0, w0.a1, w1.a0, w1.a1]`.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Tile2x2(Tile2x2<B>),
    /// One weight row with up to four activation rows: each unpacked weight
    /// register serves every token.
    Acts(Acts<B>),
}

impl<B> Clone for Multi<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Multi<B> {}

/// Weight rows with up to `acts` activation rows per pass over the weights,
/// each product computed by the same float operations in the same order as
/// decoding computes it: the path's rows kernel (`Dot::rows`) over the same
/// weight rows (on x86 every row as `Dot::one`; on NEON the rows kernel's
/// multi-row bodies finish several weight rows in the lanes of one register,
/// so the exact kernels group the rows as it does). Only the unpacking of
/// the weights (and integer sums, which are exact in any order) is shared by
/// the activation rows. So a batch computed with these equals decoding it token by
/// token, bit for bit, which speculative verification needs (see
/// `session/speculate.rs`); the other multi-row kernels round differently.
pub(crate) struct Exact<B: 'static> {
    /// Activation rows per call, at most.
    pub(crate) acts: usize,
    pub(crate) rows: ExactRows<B>,
}

/// See [`Exact`]: `(w, row_bytes, acts, out, stride)`, the consecutive weight
/// rows `w` (`row_bytes` each) with one to [`Exact::acts`] activation rows:
/// weight row `r` with activation row `t` is written to `out[t * stride + r]`.
pub(crate) type ExactRows<B> = unsafe fn(&[u8], usize, &[&[B]], *mut f32, usize);

impl<B> Clone for Exact<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Exact<B> {}

/// The [`Exact`] kernels of one weight type, by activation format.
#[derive(Clone, Copy)]
pub(crate) enum ExactDot {
    Q8_0(Exact<BlockQ8_0F>),
    Q8_1(Exact<BlockQ8_1F>),
    Q8K(Exact<BlockQ8K>),
}

/// A path's [`Exact`] kernels by weight type (`None`: the type has none on
/// that path, and its batches that must equal decoding run row by row).
pub(crate) type ExactTable = fn(GgmlType) -> Option<ExactDot>;

/// The kernels for one weight type, by activation format.
#[derive(Clone, Copy)]
pub(crate) enum RowDot {
    Q8_0(Dot<BlockQ8_0F>),
    Q8_1(Dot<BlockQ8_1F>),
    Q8K(Dot<BlockQ8K>),
    F32(Dot<f32>),
}

/// One instruction-set path: a table of kernels.
pub struct Kernels {
    pub(crate) isa: Isa,
    pub(crate) q4_0: Dot<BlockQ8_0F>,
    pub(crate) q5_0: Dot<BlockQ8_0F>,
    pub(crate) q8_0: Dot<BlockQ8_0F>,
    pub(crate) q4_1: Dot<BlockQ8_1F>,
    pub(crate) q5_1: Dot<BlockQ8_1F>,
    pub(crate) q2_k: Dot<BlockQ8K>,
    pub(crate) q3_k: Dot<BlockQ8K>,
    pub(crate) q4_k: Dot<BlockQ8K>,
    pub(crate) q5_k: Dot<BlockQ8K>,
    pub(crate) q6_k: Dot<BlockQ8K>,
    pub(crate) iq2_xxs: Dot<BlockQ8K>,
    pub(crate) iq2_xs: Dot<BlockQ8K>,
    pub(crate) iq2_s: Dot<BlockQ8K>,
    pub(crate) iq1_s: Dot<BlockQ8K>,
    pub(crate) iq1_m: Dot<BlockQ8K>,
    pub(crate) iq4_nl: Dot<BlockQ8_0F>,
    pub(crate) mxfp4: Dot<BlockQ8_0F>,
    pub(crate) iq4_xs: Dot<BlockQ8K>,
    pub(crate) iq3_xxs: Dot<BlockQ8K>,
    pub(crate) iq3_s: Dot<BlockQ8K>,
    pub(crate) tq1_0: Dot<BlockQ8K>,
    pub(crate) tq2_0: Dot<BlockQ8K>,
    pub(crate) f32: Dot<f32>,
    pub(crate) f16: Dot<f32>,
    pub(crate) bf16: Dot<f32>,
    // f32 helpers (attention, norms)
    pub(crate) dot_f32: unsafe fn(&[f32], &[f32]) -> f32,
    pub(crate) axpy_f32: unsafe fn(&mut [f32], f32, &[f32]),
    // attention over an f16 KV cache: see ops::scores_f16 / mix_f16
    pub(crate) scores_f16: unsafe fn(&[f32], usize, &[f16], &mut [f32]),
    pub(crate) mix_f16: unsafe fn(&[f32], usize, &[f16], &mut [f32]),
    /// A tiled prompt attention (ops::attend_f16), where the ISA has one.
    pub(crate) attend_f16: Option<AttendF16>,
    // recurrent state (Gated DeltaNet): see ops::state_read / state_update
    pub(crate) state_read: StateRead,
    pub(crate) state_update: unsafe fn(&mut [f32], f32, &[f32], &[f32]),
    /// Mamba2's scan step: see ops::ssm_scan.
    pub(crate) ssm_scan: SsmScan,
    // activations
    pub(crate) silu: unsafe fn(&mut [f32]),
    /// Q8_K activation quantiser (equal to the bit to the scalar one).
    pub(crate) quantize_q8k: unsafe fn(&[f32], &mut [BlockQ8K]),
}

/// Groups of four interleaved Q4_K rows (`w`, `group_bytes` a group) with
/// one row of Q8_K activations: four products a group into `out`.
pub(crate) type X4Dot = X4Rows<BlockQ8K>;
/// Groups of four interleaved weight rows with one activation row.
pub(crate) type X4Rows<B> = unsafe fn(&[u8], usize, &[B], &mut [f32]);

/// `attend_f16(rows, out, scratch)`: see [`super::ops::attend_f16`].
pub(crate) type AttendF16 = unsafe fn(&super::ops::AttendRows<'_>, &mut [f32], &mut [f32]);

/// `ssm_scan(s, decay, dt, x, b, c, y)`: see [`super::ops::ssm_scan`].
pub(crate) type SsmScan = unsafe fn(&mut [f32], f32, f32, &[f32], &[f32], &[f32], &mut [f32]);

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
        iq2_xxs: Dot::one(quant::iq2_xxs::vec_dot),
        iq2_xs: Dot::one(quant::iq2_xs::vec_dot),
        iq2_s: Dot::one(quant::iq2_s::vec_dot),
        iq1_s: Dot::one(quant::iq1_s::vec_dot),
        iq1_m: Dot::one(quant::iq1_m::vec_dot),
        iq4_nl: Dot::one(quant::iq4::vec_dot_nl),
        mxfp4: Dot::one(quant::mxfp4::vec_dot),
        iq4_xs: Dot::one(quant::iq4::vec_dot_xs),
        iq3_xxs: Dot::one(quant::iq3_xxs::vec_dot),
        iq3_s: Dot::one(quant::iq3_s::vec_dot),
        tq1_0: Dot::one(quant::tq::vec_dot_tq1_0),
        tq2_0: Dot::one(quant::tq::vec_dot_tq2_0),
        f32: Dot::one(quant::float::vec_dot_f32),
        f16: Dot::one(quant::float::vec_dot_f16),
        bf16: Dot::one(quant::float::vec_dot_bf16),
        dot_f32: scalar::dot_f32,
        axpy_f32: scalar::axpy_f32,
        scores_f16: scalar::scores_f16,
        mix_f16: scalar::mix_f16,
        attend_f16: None,
        state_read: scalar::state_read,
        state_update: scalar::state_update,
        ssm_scan: scalar::ssm_scan,
        silu: scalar::silu,
        quantize_q8k: quant::q8_k::quantize_row_q8_k,
    };

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The [`Exact`] kernels for weights of type `ty` on this path, if it
    /// has them. (Beside the table rather than in it: the paths without them
    /// build their tables unchanged.)
    pub(crate) fn exact_dot(&self, ty: GgmlType) -> Option<ExactDot> {
        match self.isa {
            Isa::Scalar => scalar::exact_dot(ty),
            isa => super::simd::exact_table(isa)(ty),
        }
    }

    /// The kernel of four rows of type `ty` interleaved
    /// ([`crate::quant::x4`]) with one activation row, if this path has one
    /// (beside the table, as [`exact_dot`](Self::exact_dot)).
    pub(crate) fn x4(&self, ty: GgmlType) -> Option<X4Dot> {
        match self.isa {
            Isa::Scalar => None,
            isa => super::simd::x4(isa, ty),
        }
    }

    /// The kernel of four Q8_0 rows interleaved ([`crate::quant::q8_0_x4`]),
    /// as [`x4`](Self::x4) for the K-quants.
    pub(crate) fn x4_q8_0(&self) -> Option<X4Rows<crate::quant::BlockQ8_0F>> {
        match self.isa {
            Isa::Scalar => None,
            isa => super::simd::x4_q8_0(isa),
        }
    }

    /// Whether this path has a kernel of four interleaved rows of type `ty`.
    pub(crate) fn has_x4(&self, ty: GgmlType) -> bool {
        match ty {
            GgmlType::Q8_0 => self.x4_q8_0().is_some(),
            ty => self.x4(ty).is_some(),
        }
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
            T::IQ2XXS => RowDot::Q8K(self.iq2_xxs),
            T::IQ2XS => RowDot::Q8K(self.iq2_xs),
            T::IQ2S => RowDot::Q8K(self.iq2_s),
            T::IQ1S => RowDot::Q8K(self.iq1_s),
            T::IQ1M => RowDot::Q8K(self.iq1_m),
            T::IQ4NL => RowDot::Q8_0(self.iq4_nl),
            T::MXFP4 => RowDot::Q8_0(self.mxfp4),
            T::IQ4XS => RowDot::Q8K(self.iq4_xs),
            T::IQ3XXS => RowDot::Q8K(self.iq3_xxs),
            T::IQ3S => RowDot::Q8K(self.iq3_s),
            T::TQ1_0 => RowDot::Q8K(self.tq1_0),
            T::TQ2_0 => RowDot::Q8K(self.tq2_0),
            T::F32 => RowDot::F32(self.f32),
            T::F16 => RowDot::F32(self.f16),
            T::BF16 => RowDot::F32(self.bf16),
            _ => return None,
        })
    }
}
