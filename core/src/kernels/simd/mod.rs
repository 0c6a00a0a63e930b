//! SIMD paths, one file per instruction set. Each architecture module exposes
//! `detected()`: the kernel tables this CPU can run, from the lowest path up.

use super::dispatch::Kernels;

/// The SIMD kernel tables this CPU supports, lowest first.
pub(crate) fn detected() -> Vec<Kernels> {
    Vec::new()
}
