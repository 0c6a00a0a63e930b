//! SIMD paths, one folder per instruction-set family. Each architecture
//! module exposes `detected()`: the kernel tables this CPU can run, from the
//! lowest path up. The `cfg` lives here, at module level only.

use super::table::Kernels;

/// `$call` with `$acts` (a slice of one to `$max` activation rows, `$max`
/// 4 or 8) bound to `$arr` as an array of its length: the exact kernels' step
/// from a slice to their bodies, generic over the number of rows.
macro_rules! with_acts {
    ($acts:expr, 4, |$arr:ident| $call:expr) => {
        with_acts!(@arms $acts, 4, $arr, $call; [a0] [a0, a1] [a0, a1, a2] [a0, a1, a2, a3])
    };
    ($acts:expr, 8, |$arr:ident| $call:expr) => {
        with_acts!(@arms $acts, 8, $arr, $call; [a0] [a0, a1] [a0, a1, a2] [a0, a1, a2, a3]
            [a0, a1, a2, a3, a4] [a0, a1, a2, a3, a4, a5] [a0, a1, a2, a3, a4, a5, a6]
            [a0, a1, a2, a3, a4, a5, a6, a7])
    };
    (@arms $acts:expr, $max:literal, $arr:ident, $call:expr; $([$($a:ident),*])*) => {
        match *$acts {
            $(
                [$($a),*] => {
                    let $arr = [$($a),*];
                    $call
                }
            )*
            _ => panic!("exact kernels take 1 to {} activation rows, not {}", $max, $acts.len()),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
use avx2 as arch;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
use neon as arch;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod arch {
    pub(crate) fn detected() -> Vec<super::Kernels> {
        Vec::new()
    }
}

/// The [`Exact`](super::table::Exact) kernels of the SIMD path `isa` (on
/// every x86 and NEON path).
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::exact_table;
#[cfg(target_arch = "aarch64")]
pub(crate) use neon::exact_table;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn exact_table(_: super::table::Isa) -> super::table::ExactTable {
    |_| None
}

#[cfg(target_arch = "aarch64")]
pub(crate) use neon::{x4, x4_q8_0};
#[cfg(not(target_arch = "aarch64"))]
pub(crate) fn x4(_: super::table::Isa, _: crate::quant::GgmlType) -> Option<super::table::X4Dot> {
    None
}
#[cfg(not(target_arch = "aarch64"))]
pub(crate) fn x4_q8_0(_: super::table::Isa) -> Option<super::table::X4Rows<crate::quant::BlockQ8_0F>> {
    None
}

/// Ask for the cache line holding `p` to be brought into this core's L2
/// (`prefetcht1`, `prfm pldl2keep`: the driver prefetches the next tile's
/// weights while the current tile's decoded panels stream through L1; some
/// cores fill L1 as well). A hint: it never faults, so any address will do;
/// nothing on other targets.
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and never faults (SSE: x86-64's baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above; `prfm` reads nothing and never faults.
    unsafe {
        std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// The attention kernels' passes over the query heads of a KV group: up to
/// four heads per pass, each pass run by the body instantiated for its head
/// count. `head_passes!(heads, |g, h| body::<H>(args))` runs
/// `body::<H>(args)` with `g` the first head and `h` (= `H`) the pass's
/// heads.
#[allow(unused_macros)] // unused on targets without attention kernels
macro_rules! head_passes {
    ($heads:expr, |$g:ident, $h:ident| $body:ident::<H>($($arg:expr),*)) => {
        for $g in (0..$heads).step_by(4) {
            let $h = ($heads - $g).min(4);
            match $h {
                1 => $body::<1>($($arg),*),
                2 => $body::<2>($($arg),*),
                3 => $body::<3>($($arg),*),
                _ => $body::<4>($($arg),*),
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use head_passes;

/// The constants of the vector SiLU kernels (AVX2 and NEON run the same
/// steps): `e^t` by Cephes' `expf` reduction, `t = n ln2 + r` with `ln2`
/// split in two for exactness, `|r| <= ln2 / 2`, `e^r = 1 + r + r^2 p(r)`
/// with `p` of degree 5 (highest coefficient first), `2^n` added to the
/// exponent bits. `t` is clamped to `T_MIN..=T_MAX` (where `2^n` stays a
/// normal float and the quotient has long reached `x` or 0) and the numerator
/// to `>= NUM_MIN` (below it the quotient is under 1e-34 either way).
#[allow(dead_code)] // unused on targets without a vector SiLU
pub(crate) mod silu_exp {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    pub const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
    pub const T_MIN: f32 = -87.0;
    pub const T_MAX: f32 = 88.0;
    pub const NUM_MIN: f32 = -1.0e4;
}

/// The SIMD kernel tables this CPU supports, lowest first.
pub(crate) fn detected() -> Vec<Kernels> {
    arch::detected()
}
