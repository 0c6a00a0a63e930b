//! x86-64 AVX2 + FMA + F16C kernels, and their AVX-VNNI / AVX-512-VNNI twins.
//!
//! Each kernel body is written once, `#[inline(always)]` and generic over
//! `V`, the way int8 products are summed:
//! - [`MADD`]: `vpmaddubsw` (u8 x i8 -> i16 pairs) then `vpmaddwd` (-> i32);
//! - [`VEX`]: AVX-VNNI `vpdpbusd` / `vpdpwssd`, fused multiply-accumulate;
//! - [`EVEX`]: the same instructions in their AVX-512 VNNI + VL encoding.
//!
//! The [`paths!`] macro instantiates every body three times inside
//! `#[target_feature]` wrappers, so the instructions of each path are only
//! ever executed on a CPU that reported them. None of the sums can saturate:
//! unsigned operands stay below 64 and activations within +-127, so every
//! path computes exactly the scalar twin's integers.

mod attend;
mod attend_ymm;
mod float;
mod gemm;
mod gemm_mxfp4;
mod gemm_ymm;
mod iq12;
mod iq34;
mod kquants;
mod legacy;
mod quant;
mod ssm;
mod ternary;

use crate::kernels::table::{Acts, Decoded, Dot, Exact, ExactDot, ExactTable, Isa, Kernels, Multi};
use crate::quant::F16Bytes;
use std::arch::x86_64::*;

pub(super) const MADD: u8 = 0;
pub(super) const VEX: u8 = 1;
pub(super) const EVEX: u8 = 2;

/// The AVX2 tables this CPU supports, lowest first.
pub(crate) fn detected() -> Vec<Kernels> {
    let mut out = Vec::new();
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        return out;
    }
    let mut k = table!(avx2, Isa::Avx2);
    gemm_ymm::avx2::install(&mut k);
    out.push(k);
    let evex = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl");
    // With AVX-512 F + BW too, the EVEX path's four-token K-quant kernels
    // (prefill) run on 512-bit registers, and it is the best path.
    let zmm = evex && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    if evex && !zmm {
        out.push(table!(avx512vnni, Isa::Avx512Vnni));
    }
    if is_x86_feature_detected!("avxvnni") {
        // The VEX encoding is shorter than EVEX and runs on either port set.
        let mut k = table!(avxvnni, Isa::AvxVnni);
        gemm_ymm::avxvnni::install(&mut k);
        out.push(k);
    }
    if zmm {
        let mut k = table!(avx512vnni, Isa::Avx512Vnni);
        kquants::zmm::install(&mut k);
        gemm::install(&mut k);
        gemm_mxfp4::install(&mut k);
        k.attend_f16 = Some(attend::attend_f16);
        k.state_read = float::zmm::state_read;
        k.ssm_scan = ssm::ssm_scan_zmm;
        out.push(k);
    }
    out
}

/// The kernels of one format from its module of wrappers (see [`paths!`]);
/// with a second module, the decoded-rows prefill of that format (its
/// `decode`, `x4`, `BLOCK_BYTES` and `MIN_ACTS`).
macro_rules! dot {
    ($($p:ident)::+) => {
        dot!(@ $($p)::+; None)
    };
    ($($p:ident)::+; $($d:ident)::+) => {
        dot!(@ $($p)::+; Some(Decoded {
            block_bytes: $($d)::+::BLOCK_BYTES,
            min_acts: $($d)::+::MIN_ACTS,
            decode: $($d)::+::decode,
            four: $($d)::+::x4,
        }))
    };
    (@ $($p:ident)::+; $decoded:expr) => {
        Dot {
            one: $($p)::+::one,
            multi: Multi::Acts(Acts {
                two: $($p)::+::x2,
                three: $($p)::+::x3,
                four: $($p)::+::x4,
                decoded: $decoded,
            }),
            rows: Some($($p)::+::rows),
            panels: None,
        }
    };
}
use dot;

/// The kernels of a float weight format: one row, and one row with two to
/// four activation rows (the same on every x86 path).
macro_rules! float_dot {
    ($one:ident, $multi:ident) => {
        Dot {
            one: float::avx2::$one,
            multi: Multi::Acts(Acts {
                two: float::avx2::$multi::x2,
                three: float::avx2::$multi::x3,
                four: float::avx2::$multi::x4,
                decoded: None,
            }),
            rows: None,
            panels: None,
        }
    };
}
use float_dot;

/// A kernel table from the wrappers in module `$m` of every kernel file.
macro_rules! table {
    ($m:ident, $isa:expr) => {
        Kernels {
            isa: $isa,
            q4_0: dot!(legacy::$m::q4_0; legacy::decoded::$m::q4_0),
            q5_0: dot!(legacy::$m::q5_0; legacy::decoded::$m::q5_0),
            q8_0: dot!(legacy::$m::q8_0),
            q4_1: dot!(legacy::$m::q4_1),
            q5_1: dot!(legacy::$m::q5_1),
            q2_k: dot!(kquants::$m::q2_k; kquants::decoded::$m::q2_k),
            q3_k: dot!(kquants::$m::q3_k; kquants::decoded::$m::q3_k),
            q4_k: dot!(kquants::$m::q4_k),
            q5_k: dot!(kquants::$m::q5_k),
            q6_k: dot!(kquants::$m::q6_k),
            iq2_xxs: dot!(iq12::$m::iq2_xxs),
            iq2_xs: dot!(iq12::$m::iq2_xs),
            iq2_s: dot!(iq12::$m::iq2_s),
            iq1_s: dot!(iq12::$m::iq1_s),
            iq1_m: dot!(iq12::$m::iq1_m),
            iq4_nl: dot!(iq34::$m::iq4_nl),
            mxfp4: dot!(iq34::$m::mxfp4),
            iq4_xs: dot!(iq34::$m::iq4_xs),
            iq3_xxs: dot!(iq34::$m::iq3_xxs),
            iq3_s: dot!(iq34::$m::iq3_s),
            tq1_0: dot!(ternary::$m::tq1_0),
            tq2_0: dot!(ternary::$m::tq2_0),
            f32: float_dot!(f32, f32s),
            f16: float_dot!(f16, f16s),
            bf16: float_dot!(bf16, bf16s),
            dot_f32: float::avx2::dot_f32,
            axpy_f32: float::avx2::axpy_f32,
            scores_f16: float::avx2::scores_f16,
            mix_f16: float::avx2::mix_f16,
            attend_f16: Some(attend_ymm::attend_f16),
            state_read: float::avx2::state_read,
            state_update: float::avx2::state_update,
            ssm_scan: ssm::ssm_scan,
            silu: float::avx2::silu,
            quantize_q8k: quant::quantize_q8_k,
        }
    };
}
use table;

/// Instantiate kernel bodies `$body::<V, N>` (`$body::<V, N, FUSE>` for a
/// body written `$body<FUSE>`) as `#[target_feature]` functions
/// in modules `avx2`, `avxvnni` and `avx512vnni`, one module per format
/// (`$name`) holding `one` (one activation row), `x2`, `x3`, `x4` (that many
/// activation rows per pass over the weights) and `rows` (consecutive weight
/// rows with one activation row).
macro_rules! paths {
    ($($name:ident = $body:ident $(<$fuse:literal>)? ($act:ty);)*) => {
        paths!(@isa avx2, "avx2,fma,f16c", MADD; $($name = $body [$($fuse)?] ($act);)*);
        paths!(@isa avxvnni, "avx2,fma,f16c,avxvnni", VEX; $($name = $body [$($fuse)?] ($act);)*);
        paths!(@isa avx512vnni, "avx2,fma,f16c,avx512vnni,avx512vl", EVEX; $($name = $body [$($fuse)?] ($act);)*);
    };
    (@isa $m:ident, $features:literal, $v:ident; $($name:ident = $body:ident [$($fuse:literal)?] ($act:ty);)*) => {
        pub(crate) mod $m {
            $(
                pub(crate) mod $name {
                    #[allow(unused_imports)]
                    use crate::quant::*;
                    use super::super::super::$v as V;
                    #[target_feature(enable = $features)]
                    pub(crate) unsafe fn one(w: &[u8], a: &[$act]) -> f32 {
                        super::super::$body::<V, 1 $(, $fuse)?>(w, [a])[0]
                    }
                    #[target_feature(enable = $features)]
                    pub(crate) unsafe fn x2(w: &[u8], a: [&[$act]; 2]) -> [f32; 2] {
                        super::super::$body::<V, 2 $(, $fuse)?>(w, a)
                    }
                    #[target_feature(enable = $features)]
                    pub(crate) unsafe fn x3(w: &[u8], a: [&[$act]; 3]) -> [f32; 3] {
                        // The four-row body with the last row twice beats a
                        // three-row body (more registers than AVX2 has).
                        let v = super::super::$body::<V, 4 $(, $fuse)?>(w, [a[0], a[1], a[2], a[2]]);
                        [v[0], v[1], v[2]]
                    }
                    #[target_feature(enable = $features)]
                    pub(crate) unsafe fn x4(w: &[u8], a: [&[$act]; 4]) -> [f32; 4] {
                        super::super::$body::<V, 4 $(, $fuse)?>(w, a)
                    }
                    #[target_feature(enable = $features)]
                    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: &[$act], out: &mut [f32]) {
                        for (o, row) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
                            *o = super::super::$body::<V, 1 $(, $fuse)?>(row, [a])[0];
                        }
                    }
                }
            )*
        }
    };
}
use paths;

/// Instantiate kernel bodies whose every activation row is computed by the
/// same float operations as with one row (see [`Exact`]) as exact kernels:
/// module `exact::<isa>::<format>::rows` for `$body::<V, N>` (or
/// `$body::<V, N, FUSE>` for a body written `$body<FUSE>`), `N` from 1 to
/// the module's `ACTS`.
macro_rules! exact_paths {
    // `wide`: activation rows per call on AVX-512 (32 vector registers), 4 or
    // 8; the AVX2 paths (16 registers) take 4.
    (wide = $wide:tt; $($name:ident = $body:ident $(<$fuse:literal>)? ($act:ty);)*) => {
        /// The exact kernels (see [`crate::kernels::table::Exact`]).
        pub(crate) mod exact {
            use super::exact_paths;
            exact_paths!(@isa avx2, "avx2,fma,f16c", MADD, 4; $($name = $body [$($fuse)?] ($act);)*);
            exact_paths!(@isa avxvnni, "avx2,fma,f16c,avxvnni", VEX, 4; $($name = $body [$($fuse)?] ($act);)*);
            exact_paths!(@isa avx512vnni, "avx2,fma,f16c,avx512vnni,avx512vl", EVEX, $wide; $($name = $body [$($fuse)?] ($act);)*);
        }
    };
    ($($name:ident = $body:ident $(<$fuse:literal>)? ($act:ty);)*) => {
        exact_paths!(wide = 4; $($name = $body $(<$fuse>)? ($act);)*);
    };
    (@isa $m:ident, $features:literal, $v:ident, $acts:tt; $($name:ident = $body:ident [$($fuse:literal)?] ($act:ty);)*) => {
        pub(crate) mod $m {
            $(
                pub(crate) mod $name {
                    #[allow(unused_imports)]
                    use crate::quant::*;
                    use super::super::super::super::$v as V;
                    /// Activation rows per call, at most.
                    pub(crate) const ACTS: usize = $acts;
                    /// Every weight row of `w` with the `N` activation rows `a`.
                    #[inline]
                    #[target_feature(enable = $features)]
                    unsafe fn n_rows<const N: usize>(
                        w: &[u8],
                        row_bytes: usize,
                        a: [&[$act]; N],
                        out: *mut f32,
                        stride: usize,
                    ) {
                        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                            let v = super::super::super::$body::<V, N $(, $fuse)?>(row, a);
                            for (t, vt) in v.into_iter().enumerate() {
                                *out.add(t * stride + r) = vt;
                            }
                        }
                    }
                    #[target_feature(enable = $features)]
                    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: &[&[$act]], out: *mut f32, stride: usize) {
                        with_acts!(a, $acts, |acts| n_rows(w, row_bytes, acts, out, stride))
                    }
                }
            )*
        }
    };
}
use exact_paths;

/// The exact kernels of path `isa` (see [`Exact`]): the formats whose bodies
/// compute each activation row as the one-row kernel does.
pub(crate) fn exact_table(isa: Isa) -> ExactTable {
    macro_rules! exact_table {
        ($m:ident) => {
            |ty| {
                use crate::quant::GgmlType as T;
                // Each format's kernel and its activation rows per call.
                macro_rules! e {
                    ($dot:ident, $file:ident, $f:ident) => {
                        ExactDot::$dot(Exact { acts: $file::exact::$m::$f::ACTS, rows: $file::exact::$m::$f::rows })
                    };
                }
                Some(match ty {
                    T::Q4_0 => e!(Q8_0, legacy, q4_0),
                    T::Q5_0 => e!(Q8_0, legacy, q5_0),
                    T::Q8_0 => e!(Q8_0, legacy, q8_0),
                    T::Q4_1 => e!(Q8_1, legacy, q4_1),
                    T::Q5_1 => e!(Q8_1, legacy, q5_1),
                    T::Q3K => e!(Q8K, kquants, q3_k),
                    T::Q4K => e!(Q8K, kquants, q4_k),
                    T::Q5K => e!(Q8K, kquants, q5_k),
                    T::Q6K => e!(Q8K, kquants, q6_k),
                    _ => return None,
                })
            }
        };
    }
    match isa {
        Isa::Avx2 => exact_table!(avx2),
        Isa::AvxVnni => exact_table!(avxvnni),
        Isa::Avx512Vnni => exact_table!(avx512vnni),
        _ => |_| None,
    }
}

// ---- shared helpers (inlined into the target_feature wrappers) ----------

/// `out[n][r] = dot(row r)[n]` over the rows of `w` (`row_bytes` each): the
/// decoded-rows prefill's loop, inlined into each format's wrapper.
#[inline(always)]
pub(super) unsafe fn rows4(w: &[u8], row_bytes: usize, out: [&mut [f32]; 4], mut dot: impl FnMut(&[u8]) -> [f32; 4]) {
    let [o0, o1, o2, o3] = out;
    debug_assert!(w.len() == o0.len() * row_bytes && [&o1, &o2, &o3].iter().all(|o| o.len() == o0.len()));
    for ((((row, o0), o1), o2), o3) in w.chunks_exact(row_bytes).zip(o0).zip(o1).zip(o2).zip(o3) {
        [*o0, *o1, *o2, *o3] = dot(row);
    }
}

/// f16 -> f32 with F16C.
#[inline(always)]
pub(super) unsafe fn fp16(h: F16Bytes) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(h.0) as i32)))
}

/// f16 -> f32 with F16C, in all eight lanes: the f16 broadcast as it loads
/// (`vpbroadcastw`) and converted once, instead of a scalar conversion and a
/// broadcast.
#[inline(always)]
pub(super) unsafe fn fp16_x8(h: F16Bytes) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(h.0)))
}

/// 32 bytes from `p`, any alignment.
#[inline(always)]
pub(super) unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// Sum of the 8 lanes.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    hsum_ps128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)))
}

/// Sum of the 4 lanes.
#[inline(always)]
pub(super) unsafe fn hsum_ps128(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Ask for the cache lines `PREFETCH_AHEAD` bytes past `block` (a weight
/// block of `size` bytes): one line per 64 bytes streamed, so that memory
/// keeps the next rows in flight while this one is computed (measured: +15-30%
/// on Q4_K matvec from DRAM). Prefetches past the end of the data are harmless.
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(block: *const u8, size: usize) {
    let p = block.wrapping_add(PREFETCH_AHEAD);
    let mut off = 0;
    while off < size {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
}

pub(super) const PREFETCH_AHEAD: usize = 2048;

/// `acc + (sums of 4 adjacent u8(u) * i8(s) products)` in i32 lanes.
#[inline(always)]
pub(super) unsafe fn dot_u8i8<const V: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    match V {
        VEX => _mm256_dpbusd_avx_epi32(acc, u, s),
        EVEX => _mm256_dpbusd_epi32(acc, u, s),
        _ => _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))),
    }
}

/// `acc + (sums of 2 adjacent i16(a) * i16(b) products)` in i32 lanes.
#[inline(always)]
pub(super) unsafe fn dot_i16<const V: u8>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    match V {
        VEX => _mm256_dpwssd_avx_epi32(acc, a, b),
        EVEX => _mm256_dpwssd_epi32(acc, a, b),
        _ => _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)),
    }
}

/// Blocks ahead of the decoding that [`prefetch_panel`] asks for.
const PREFETCH_BLOCKS: usize = 2;

/// Ask for block `b + PREFETCH_BLOCKS` of each of a panel's rows `x`, or
/// past a row's end for the next panel's first blocks (its rows follow these
/// in memory). The panel's decoding is where a prompt's weights come from
/// DRAM, a few blocks of `N` short streams at a time: too short for the
/// hardware prefetcher to follow, and without this nearly all of the
/// decoding's time was the first loads' misses. A prefetch never faults, so
/// the addresses past the matrix's end (the last panel's) are harmless.
#[inline(always)]
pub(super) unsafe fn prefetch_panel<B, const N: usize>(x: &[&[B]; N], b: usize) {
    let (bytes, nb) = (std::mem::size_of::<B>(), x[0].len());
    // Block `b + PREFETCH_BLOCKS` of the same row, or of the row `N` on.
    let t = b + PREFETCH_BLOCKS;
    let at = if t < nb { t * bytes } else { N * nb * bytes + (t - nb) * bytes };
    for row in x {
        let p = row.as_ptr().cast::<u8>().wrapping_add(at);
        // Every line of the block: the next block's first line covers the
        // one a block's last byte may open.
        for line in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line).cast());
        }
    }
}
