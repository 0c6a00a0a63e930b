//! SIMD paths, one folder per instruction-set family. Each architecture
//! module exposes `detected()`: the kernel tables this CPU can run, from the
//! lowest path up. The `cfg` lives here, at module level only.

use super::dispatch::Kernels;

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

/// The SIMD kernel tables this CPU supports, lowest first.
pub(crate) fn detected() -> Vec<Kernels> {
    arch::detected()
}
