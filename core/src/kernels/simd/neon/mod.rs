//! aarch64 NEON kernels, with and without the int8 dot product (`sdot`), plus
//! the int8 matrix multiply (`smmla`) for prefill.
//!
//! Kernel bodies are `#[inline(always)]` and generic over `D`: whether 16-byte
//! int8 dot products use `sdot` (ARMv8.2 DotProd) or widening multiplies and
//! pairwise adds (plain ARMv8.0 NEON). [`paths!`] instantiates each body in
//! `#[target_feature]` wrappers. `sdot`, `smmla` and the f16 conversions are
//! written with `asm!` (their intrinsics are not stable), each inside a tiny
//! function compiled with the feature it needs, so no path ever contains an
//! instruction its CPU lacks.

mod attend;
mod float;
mod gemm;
mod i8mm;
mod iq12;
mod iq34;
mod kquants;
mod legacy;
mod quant;
mod ternary;

use crate::kernels::table::{Dot, Exact, ExactDot, ExactTable, Isa, Kernels, Multi};
use crate::quant::F16Bytes;
use std::arch::aarch64::*;
use std::arch::{asm, is_aarch64_feature_detected};

/// The NEON tables this CPU supports, lowest first.
pub(crate) fn detected() -> Vec<Kernels> {
    let mut out = Vec::new();
    if !is_aarch64_feature_detected!("neon") {
        return out;
    }
    out.push(table!(neon, Isa::Neon, Multi::None, none));
    if !is_aarch64_feature_detected!("dotprod") {
        return out;
    }
    out.push(table!(dotprod, Isa::Dotprod, Multi::None, quads));
    if is_aarch64_feature_detected!("i8mm") {
        // `smmla`: 2x2 tiles for Q4_0, eight-row panels for the K-quants
        // (see i8mm.rs).
        out.push(table!(dotprod, Isa::I8mm, Multi::Tile2x2(i8mm::tile_q4_0), mm));
    }
    out
}

/// The prefill GEMM of a K-quant: panels of four rows with `sdot` (`quads`),
/// of eight with `smmla` (`mm`), or none.
macro_rules! quads {
    (none, $f:ident, $decode:ident) => {
        None
    };
    (mm, $f:ident, $decode:ident) => {
        quads!(@panels i8mm::MmHalf, i8mm::$f, $decode)
    };
    (quads, $f:ident, $decode:ident) => {
        quads!(@panels gemm::Quad, gemm::$f, $decode)
    };
    // Rows and block size from the decoded layout.
    (@panels $layout:ty, $dot:path, $decode:ident) => {
        Some(crate::kernels::table::Panels {
            height: <$layout as gemm::Layout>::ROWS,
            block_bytes: <$layout as gemm::Layout>::BLOCK_BYTES,
            min_acts: gemm::MIN_ACTS,
            acts: 4,
            decode: gemm::$decode::<$layout>,
            dot: $dot,
        })
    };
}
use quads;

/// A kernel table from the wrappers in module `$m` of every kernel file.
macro_rules! table {
    ($m:ident, $isa:expr, $t40:expr, $q:ident) => {
        Kernels {
            isa: $isa,
            q4_0: Dot { one: legacy::$m::q4_0, multi: $t40, rows: Some(legacy::$m::q4_0_rows), panels: None },
            q5_0: Dot { one: legacy::$m::q5_0, multi: Multi::None, rows: Some(legacy::$m::q5_0_rows), panels: None },
            q8_0: Dot { one: legacy::$m::q8_0, multi: Multi::None, rows: Some(legacy::$m::q8_0_rows), panels: None },
            q4_1: Dot { one: legacy::$m::q4_1, multi: Multi::None, rows: Some(legacy::$m::q4_1_rows), panels: None },
            q5_1: Dot { one: legacy::$m::q5_1, multi: Multi::None, rows: Some(legacy::$m::q5_1_rows), panels: None },
            q2_k: Dot {
                one: kquants::$m::q2_k,
                multi: Multi::None,
                rows: Some(kquants::$m::q2_k_rows),
                panels: quads!($q, q2_k, decode_q2_k),
            },
            q3_k: Dot {
                one: kquants::$m::q3_k,
                multi: Multi::None,
                rows: Some(kquants::$m::q3_k_rows),
                panels: quads!($q, q3_k, decode_q3_k),
            },
            q4_k: Dot {
                one: kquants::$m::q4_k,
                multi: Multi::None,
                rows: Some(kquants::$m::q4_k_rows),
                panels: quads!($q, q4_k, decode_q4_k),
            },
            q5_k: Dot {
                one: kquants::$m::q5_k,
                multi: Multi::None,
                rows: Some(kquants::$m::q5_k_rows),
                panels: quads!($q, q5_k, decode_q5_k),
            },
            q6_k: Dot {
                one: kquants::$m::q6_k,
                multi: Multi::None,
                rows: Some(kquants::$m::q6_k_rows),
                panels: quads!($q, q6_k, decode_q6_k),
            },
            iq2_xxs: acts_dot!(iq12::$m::iq2_xxs),
            iq2_xs: acts_dot!(iq12::$m::iq2_xs),
            iq2_s: acts_dot!(iq12::$m::iq2_s),
            iq1_s: acts_dot!(iq12::$m::iq1_s),
            iq1_m: acts_dot!(iq12::$m::iq1_m),
            iq4_nl: acts_dot!(iq34::$m::iq4_nl),
            mxfp4: acts_dot!(iq34::$m::mxfp4),
            iq4_xs: acts_dot!(iq34::$m::iq4_xs),
            iq3_xxs: acts_dot!(iq34::$m::iq3_xxs),
            iq3_s: acts_dot!(iq34::$m::iq3_s),
            tq1_0: Dot {
                one: ternary::$m::tq1_0,
                multi: Multi::None,
                rows: Some(ternary::$m::tq1_0_rows),
                panels: None,
            },
            tq2_0: Dot {
                one: ternary::$m::tq2_0,
                multi: Multi::None,
                rows: Some(ternary::$m::tq2_0_rows),
                panels: None,
            },
            f32: Dot { one: float::f32, multi: Multi::None, rows: Some(float::f32_rows), panels: None },
            f16: Dot::one(float::f16),
            bf16: Dot::one(float::bf16),
            dot_f32: float::dot_f32,
            axpy_f32: float::axpy_f32,
            scores_f16: float::scores_f16,
            mix_f16: float::mix_f16,
            attend_f16: Some(attend::attend_f16),
            state_read: float::state_read,
            state_update: float::state_update,
            // (The scalar twin vectorises as it is on NEON.)
            ssm_scan: crate::kernels::scalar::ssm_scan,
            silu: float::silu,
            quantize_q8k: quant::quantize_q8_k,
        }
    };
}
use table;

/// Instantiate kernel bodies `$body::<D>` as `#[target_feature]` functions
/// in modules `neon` (D = false) and `dotprod` (D = true): `$name` (one row)
/// and `$rows` (consecutive weight rows with one activation row). A format
/// with a multi-row body (`/ $bodyn * N`) runs its rows N at a time, sharing
/// every activation load, and the last `rows % N` through `$body`.
macro_rules! paths {
    ($($name:ident, $rows:ident = $body:ident ($act:ty) $(/ $bodyn:ident * $n:literal)?;)*) => {
        paths!(@path neon, "neon", false; $($name, $rows = $body ($act) $(/ $bodyn * $n)?;)*);
        paths!(@path dotprod, "neon,dotprod", true; $($name, $rows = $body ($act) $(/ $bodyn * $n)?;)*);
    };
    (@path $m:ident, $feat:literal, $d:literal; $($name:ident, $rows:ident = $body:ident ($act:ty) $(/ $bodyn:ident * $n:literal)?;)*) => {
        pub(crate) mod $m {
            #[allow(unused_imports)]
            use crate::quant::*;
            $(
                #[target_feature(enable = $feat)]
                pub(crate) unsafe fn $name(w: &[u8], a: &[$act]) -> f32 {
                    super::$body::<$d>(w, a)
                }
                #[target_feature(enable = $feat)]
                #[allow(unused_mut)]
                pub(crate) unsafe fn $rows(w: &[u8], row_bytes: usize, a: &[$act], out: &mut [f32]) {
                    let mut done = 0;
                    $(
                        for (o, r) in out.chunks_exact_mut($n).zip(w.chunks_exact($n * row_bytes)) {
                            let rows: [&[u8]; $n] = std::array::from_fn(|i| &r[i * row_bytes..(i + 1) * row_bytes]);
                            o.copy_from_slice(&super::$bodyn::<$d, $n>(rows, a));
                            done += $n;
                        }
                    )?
                    let rest = w.get(done * row_bytes..).unwrap_or_default();
                    for (o, row) in out[done..].iter_mut().zip(rest.chunks_exact(row_bytes)) {
                        *o = super::$body::<$d>(row, a);
                    }
                }
            )*
        }
    };
}
use paths;

/// Instantiate the exact kernels (see [`Exact`]) of the formats in
/// [`paths!`]: module `exact::$m::$name` (`$m` = `neon`, `dotprod`) holds
/// `rows`, the weight rows grouped as the rows kernel groups them (`$n` at a
/// time, the rest one by one) with one to [`EXACT_ACTS`] activation rows.
/// `$exactn::<D, $n, N>` computes a group with `N` activation rows, each
/// lane by the float operations of `$bodyn::<D, $n>` (only the weights'
/// unpacking and integer sums are shared); `$exact::<D, N>` a lone row, as
/// `$body::<D>` does. So every product equals the one decoding computes, to
/// the bit, where the tiles are decoding's (one-row mode keeps them).
macro_rules! exact_paths {
    ($($name:ident = $exact:ident ($act:ty) $(/ $exactn:ident * $n:literal)?;)*) => {
        /// The exact kernels (see [`crate::kernels::table::Exact`]).
        pub(crate) mod exact {
            use super::exact_paths;
            exact_paths!(@path neon, "neon", false; $($name = $exact ($act) $(/ $exactn * $n)?;)*);
            exact_paths!(@path dotprod, "neon,dotprod", true; $($name = $exact ($act) $(/ $exactn * $n)?;)*);
        }
    };
    (@path $m:ident, $feat:literal, $d:literal; $($name:ident = $exact:ident ($act:ty) $(/ $exactn:ident * $n:literal)?;)*) => {
        pub(crate) mod $m {
            $(
                pub(crate) mod $name {
                    #[allow(unused_imports)]
                    use crate::quant::*;
                    /// Every weight row of `w` with the `N` activation rows `a`:
                    /// weight row `r` with activation row `t` to `out[t * stride + r]`.
                    #[inline]
                    #[target_feature(enable = $feat)]
                    #[allow(unused_mut)]
                    unsafe fn n_rows<const N: usize>(
                        w: &[u8],
                        row_bytes: usize,
                        a: [&[$act]; N],
                        out: *mut f32,
                        stride: usize,
                    ) {
                        let mut done = 0;
                        $(
                            for g in w.chunks_exact($n * row_bytes) {
                                let rows: [&[u8]; $n] = std::array::from_fn(|i| &g[i * row_bytes..(i + 1) * row_bytes]);
                                let v = super::super::super::$exactn::<$d, $n, N>(rows, a);
                                for (t, vt) in v.iter().enumerate() {
                                    for (i, x) in vt.iter().enumerate() {
                                        *out.add(t * stride + done + i) = *x;
                                    }
                                }
                                done += $n;
                            }
                        )?
                        let rest = w.get(done * row_bytes..).unwrap_or_default();
                        for row in rest.chunks_exact(row_bytes) {
                            let v = super::super::super::$exact::<$d, N>(row, a);
                            for (t, x) in v.into_iter().enumerate() {
                                *out.add(t * stride + done) = x;
                            }
                            done += 1;
                        }
                    }
                    #[target_feature(enable = $feat)]
                    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: &[&[$act]], out: *mut f32, stride: usize) {
                        with_acts!(a, 4, |acts| n_rows(w, row_bytes, acts, out, stride))
                    }
                }
            )*
        }
    };
}
use exact_paths;

/// The kernel of four rows of type `ty` interleaved ([`crate::quant::x4`])
/// with one activation row, on the paths with `sdot`.
pub(crate) fn x4(isa: Isa, ty: crate::quant::GgmlType) -> Option<crate::kernels::table::X4Dot> {
    use crate::quant::GgmlType as T;
    match (isa, ty) {
        (Isa::Dotprod | Isa::I8mm, T::Q4K) => Some(kquants::q4_k_x4),
        (Isa::Dotprod | Isa::I8mm, T::Q6K) => Some(kquants::q6_k_x4),
        _ => None,
    }
}

/// The kernel of four Q8_0 rows interleaved ([`crate::quant::q8_0_x4`])
/// with one activation row, on the paths with `sdot`.
pub(crate) fn x4_q8_0(isa: Isa) -> Option<crate::kernels::table::X4Rows<crate::quant::BlockQ8_0F>> {
    match isa {
        Isa::Dotprod | Isa::I8mm => Some(legacy::q8_0_x4),
        _ => None,
    }
}

/// Activation rows per call of the exact kernels, at most.
/// (`with_acts!` in the kernels above names the same limit.)
pub(super) const EXACT_ACTS: usize = 4;

/// The exact kernels of path `isa` (see [`Exact`]). The plain NEON path
/// has them as the dot-product path does; the i8mm path decodes with the
/// dot-product path's rows kernels, so it takes those exact kernels.
pub(crate) fn exact_table(isa: Isa) -> ExactTable {
    macro_rules! exact_table {
        ($m:ident) => {
            |ty| {
                use crate::quant::GgmlType as T;
                Some(match ty {
                    T::Q4_0 => ExactDot::Q8_0(Exact { acts: EXACT_ACTS, rows: legacy::exact::$m::q4_0::rows }),
                    T::Q5_0 => ExactDot::Q8_0(Exact { acts: EXACT_ACTS, rows: legacy::exact::$m::q5_0::rows }),
                    T::Q8_0 => ExactDot::Q8_0(Exact { acts: EXACT_ACTS, rows: legacy::exact::$m::q8_0::rows }),
                    T::Q4_1 => ExactDot::Q8_1(Exact { acts: EXACT_ACTS, rows: legacy::exact::$m::q4_1::rows }),
                    T::Q5_1 => ExactDot::Q8_1(Exact { acts: EXACT_ACTS, rows: legacy::exact::$m::q5_1::rows }),
                    T::Q4K => ExactDot::Q8K(Exact { acts: EXACT_ACTS, rows: kquants::exact::$m::q4_k::rows }),
                    // Four activation rows spill the two rows' chains.
                    T::Q6K => ExactDot::Q8K(Exact { acts: 3, rows: kquants::exact::$m::q6_k::rows }),
                    _ => return None,
                })
            }
        };
    }
    match isa {
        Isa::Neon => exact_table!(neon),
        Isa::Dotprod | Isa::I8mm => exact_table!(dotprod),
        _ => |_| None,
    }
}

/// Like [`paths!`], for bodies `$body::<D, N>` of one weight row with `N`
/// activation rows: module `$m::$name` (`$m` = `neon`, `dotprod`) holds
/// `one`, `x2`, `x3`, `x4` (for [`Multi::Acts`]) and `rows` (consecutive
/// weight rows with one activation row; by `$bodyn::<D, N>`, N weight rows at
/// a time, where the format has one, as in [`paths!`]).
macro_rules! acts_paths {
    ($($name:ident = $body:ident ($act:ty) $(/ $bodyn:ident * $n:literal)?;)*) => {
        acts_paths!(@path neon, "neon", false; $($name = $body ($act) $(/ $bodyn * $n)?;)*);
        acts_paths!(@path dotprod, "neon,dotprod", true; $($name = $body ($act) $(/ $bodyn * $n)?;)*);
    };
    (@path $m:ident, $feat:literal, $d:literal; $($name:ident = $body:ident ($act:ty) $(/ $bodyn:ident * $n:literal)?;)*) => {
        pub(crate) mod $m {
            $(
                pub(crate) mod $name {
                    #[allow(unused_imports)]
                    use crate::quant::*;
                    #[target_feature(enable = $feat)]
                    pub(crate) unsafe fn one(w: &[u8], a: &[$act]) -> f32 {
                        super::super::$body::<$d, 1>(w, [a])[0]
                    }
                    #[target_feature(enable = $feat)]
                    pub(crate) unsafe fn x2(w: &[u8], a: [&[$act]; 2]) -> [f32; 2] {
                        super::super::$body::<$d, 2>(w, a)
                    }
                    #[target_feature(enable = $feat)]
                    pub(crate) unsafe fn x3(w: &[u8], a: [&[$act]; 3]) -> [f32; 3] {
                        super::super::$body::<$d, 3>(w, a)
                    }
                    #[target_feature(enable = $feat)]
                    pub(crate) unsafe fn x4(w: &[u8], a: [&[$act]; 4]) -> [f32; 4] {
                        super::super::$body::<$d, 4>(w, a)
                    }
                    #[target_feature(enable = $feat)]
                    #[allow(unused_mut)]
                    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: &[$act], out: &mut [f32]) {
                        let mut done = 0;
                        $(
                            for (o, r) in out.chunks_exact_mut($n).zip(w.chunks_exact($n * row_bytes)) {
                                let rows: [&[u8]; $n] =
                                    std::array::from_fn(|i| &r[i * row_bytes..(i + 1) * row_bytes]);
                                o.copy_from_slice(&super::super::$bodyn::<$d, $n>(rows, a));
                                done += $n;
                            }
                        )?
                        let rest = w.get(done * row_bytes..).unwrap_or_default();
                        for (o, row) in out[done..].iter_mut().zip(rest.chunks_exact(row_bytes)) {
                            *o = super::super::$body::<$d, 1>(row, [a])[0];
                        }
                    }
                }
            )*
        }
    };
}
use acts_paths;

/// The [`Dot`] of a format from its [`acts_paths!`] module.
macro_rules! acts_dot {
    ($($p:ident)::+) => {
        Dot {
            one: $($p)::+::one,
            multi: Multi::Acts(crate::kernels::table::Acts {
                two: $($p)::+::x2,
                three: $($p)::+::x3,
                four: $($p)::+::x4,
                decoded: None,
            }),
            rows: Some($($p)::+::rows),
            panels: None,
        }
    };
}
use acts_dot;

// ---- shared helpers ------------------------------------------------------

/// `acc + a . b` on 16 int8 lanes, summed into 4 i32 lanes (which lane gets
/// which products differs between the two ways; callers only use lane sums).
#[inline(always)]
pub(super) unsafe fn dot16<const D: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if D {
        sdot(acc, a, b)
    } else {
        // Widening multiplies (|a * b| <= 128 * 127 fits i16), then pairwise
        // add-accumulate into i32.
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// `sdot`: each i32 lane += the dot product of 4 adjacent int8 pairs.
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
        options(pure, nomem, nostack)
    );
    acc
}

/// `sdot` by element: each i32 lane `i` += the dot product of bytes
/// `4i..4i + 4` of `a` with bytes `4L..4L + 4` of `b`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) unsafe fn sdot_lane<const L: usize>(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.4b[{l}]",
        acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b, l = const L,
        options(pure, nomem, nostack)
    );
    acc
}

/// f16 -> f32 (`fcvt`, base AArch64).
#[inline(always)]
pub(super) unsafe fn fp16(h: F16Bytes) -> f32 {
    let bits = u16::from_le_bytes(h.0) as u32;
    let out: f32;
    asm!("fcvt {o:s}, {i:h}", o = lateout(vreg) out, i = in(vreg) bits, options(pure, nomem, nostack));
    out
}

/// The two f16 values at `p` (4 bytes, any alignment) -> `[p0, p1, 0, 0]` as
/// f32 (`fcvtl`).
#[inline(always)]
pub(super) unsafe fn fp16x2(p: *const u8) -> float32x4_t {
    let bits = std::ptr::read_unaligned(p.cast::<u32>());
    let out: float32x4_t;
    asm!("fcvtl {o:v}.4s, {i:v}.4h", o = lateout(vreg) out, i = in(vreg) bits, options(pure, nomem, nostack));
    out
}

/// The f16 values at `p[0..4]` (2 bytes each, any alignment) as f32 lanes:
/// four lane loads straight into one register, then `fcvtl` (LLVM assembles
/// four scalar loads with shifts and ors and moves the result across).
#[inline(always)]
pub(super) unsafe fn fp16x4(p: [*const u8; 4]) -> float32x4_t {
    let out: float32x4_t;
    asm!(
        "ld1 {{ {o:v}.h }}[0], [{p0}]",
        "ld1 {{ {o:v}.h }}[1], [{p1}]",
        "ld1 {{ {o:v}.h }}[2], [{p2}]",
        "ld1 {{ {o:v}.h }}[3], [{p3}]",
        "fcvtl {o:v}.4s, {o:v}.4h",
        o = out(vreg) out, p0 = in(reg) p[0], p1 = in(reg) p[1], p2 = in(reg) p[2], p3 = in(reg) p[3],
        options(pure, readonly, nostack, preserves_flags)
    );
    out
}

/// Four consecutive f16 values as f32 lanes.
#[inline(always)]
pub(super) unsafe fn fp16x4_packed(h: &[crate::quant::F16Bytes; 4]) -> float32x4_t {
    let v = vld1_u16(h.as_ptr().cast());
    let f: float32x4_t;
    asm!("fcvtl {o:v}.4s, {i:v}.4h", o = lateout(vreg) f, i = in(vreg) v, options(pure, nomem, nostack));
    f
}

/// The sums of the lanes of `v[0..4]` (lane `r`: the sum of `v[r]`'s
/// lanes), by pairwise adds.
#[inline(always)]
pub(super) unsafe fn lane_sums4<const R: usize>(v: &[int32x4_t; R]) -> int32x4_t {
    const { assert!(R == 4) };
    vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]))
}

/// `f(0), f(1), .., f(n - 1)`, two calls to an iteration: the loop's count
/// and pointer updates shared by two blocks.
#[inline(always)]
pub(super) fn by_twos(n: usize, mut f: impl FnMut(usize)) {
    let mut i = 0;
    while i + 2 <= n {
        f(i);
        f(i + 1);
        i += 2;
    }
    if i < n {
        f(i);
    }
}

/// `acc + p * s[lane]` (`lane` a constant once inlined).
#[inline(always)]
pub(super) unsafe fn mla_lane(acc: int32x4_t, p: int32x4_t, s: int32x4_t, lane: usize) -> int32x4_t {
    match lane {
        0 => vmlaq_laneq_s32::<0>(acc, p, s),
        1 => vmlaq_laneq_s32::<1>(acc, p, s),
        2 => vmlaq_laneq_s32::<2>(acc, p, s),
        _ => vmlaq_laneq_s32::<3>(acc, p, s),
    }
}

/// `v` unchanged, hidden from the optimiser: scales computed in narrow lanes
/// and widened stay one register for [`mla_lane`] (else LLVM moves the lane
/// selection before the widening: a `dup` and an `sxtl` per use).
#[inline(always)]
pub(super) unsafe fn opaque(mut v: int32x4_t) -> int32x4_t {
    asm!("/* {v:v} */", v = inout(vreg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// The four 7-bit sign patterns of an IQ2_XXS / IQ3_XXS group word as +-1
/// bytes (the eighth sign of each by parity, `KSIGN_BYTES`): weights 0..16
/// and 16..32 of the group.
#[inline(always)]
pub(super) unsafe fn ksigns32(aux: u32) -> [int8x16_t; 2] {
    let sign = |k: u32| vcreate_s8(crate::quant::iq::KSIGN_BYTES[(aux >> (7 * k) & 127) as usize]);
    [vcombine_s8(sign(0), sign(1)), vcombine_s8(sign(2), sign(3))]
}

/// Those group words' scales `2 * (aux >> 28) + 1`, as `aux >> 27 | 1`
/// (bit 27, a sign bit, lands on the 1).
#[inline(always)]
pub(super) unsafe fn aux_scales(aux: uint32x4_t) -> int32x4_t {
    vreinterpretq_s32_u32(vorrq_u32(vshrq_n_u32::<27>(aux), vdupq_n_u32(1)))
}

/// u32 lanes `v` as the scales `2v + 1`.
#[inline(always)]
pub(super) unsafe fn odd(v: uint32x4_t) -> int32x4_t {
    vreinterpretq_s32_u32(vorrq_u32(vshlq_n_u32::<1>(v), vdupq_n_u32(1)))
}

/// Sixteen u8 lanes widened to four registers of u32 lanes.
#[inline(always)]
pub(super) unsafe fn widen16(v: uint8x16_t) -> [uint32x4_t; 4] {
    let (lo, hi) = (vmovl_u8(vget_low_u8(v)), vmovl_high_u8(v));
    [vmovl_u16(vget_low_u16(lo)), vmovl_high_u16(lo), vmovl_u16(vget_low_u16(hi)), vmovl_high_u16(hi)]
}

/// Eight nibbles, two to a byte of `b` (the low nibble first), in order as
/// u8 lanes.
#[inline(always)]
pub(super) unsafe fn nibbles8(b: [u8; 4]) -> uint8x8_t {
    let v = vcreate_u8(u32::from_le_bytes(b) as u64);
    vzip1_u8(vand_u8(v, vdup_n_u8(0xF)), vshr_n_u8::<4>(v))
}

/// The little-endian 32-bit word at byte `at` of `b`.
#[inline(always)]
pub(super) unsafe fn word(b: &[u8], at: usize) -> u32 {
    debug_assert!(at + 4 <= b.len());
    u32::from_le(b.as_ptr().add(at).cast::<u32>().read_unaligned())
}

/// 16 bytes from `p` as int8 lanes.
#[inline(always)]
pub(super) unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    vld1q_s8(p.cast())
}
