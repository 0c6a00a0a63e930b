//! Helpers for the buffers a forward pass reuses: growing a buffer to a
//! batch, quantising one input for several matrices, and a raw view for
//! threads that write disjoint parts of one buffer.

use crate::kernels::{ActFormat, QActs};
use crate::quant::GgmlType;

/// One input quantised for every activation format a group of matrices
/// needs (q, k and v read the same normalised input: quantise it once).
#[derive(Default)]
pub struct ActCache {
    slots: Vec<(ActFormat, QActs)>,
    used: usize,
}

impl ActCache {
    /// Quantise `x` (`n` rows of `k`) for weights of each type in `tys`.
    pub fn prepare(&mut self, x: &[f32], n: usize, k: usize, tys: &[GgmlType]) {
        self.used = 0;
        for &ty in tys {
            let fmt = ActFormat::for_weights(ty).unwrap_or_else(|| panic!("no kernels for {ty}"));
            if self.slots[..self.used].iter().any(|s| s.0 == fmt) {
                continue;
            }
            if self.used == self.slots.len() {
                self.slots.push((fmt, QActs::new()));
            }
            let slot = &mut self.slots[self.used];
            slot.0 = fmt;
            slot.1.quantize(ty, x, n, k);
            self.used += 1;
        }
    }

    /// The activations for weights of type `ty` (prepared by the last [`prepare`](Self::prepare)).
    pub fn get(&self, ty: GgmlType) -> &QActs {
        let fmt = ActFormat::for_weights(ty);
        self.slots[..self.used]
            .iter()
            .find(|s| Some(s.0) == fmt)
            .map(|s| &s.1)
            .unwrap_or_else(|| panic!("activations for {ty} were not prepared"))
    }
}

impl ActCache {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        heap(&self.slots) + self.slots.iter().map(|(_, q)| q.heap_bytes()).sum::<usize>()
    }
}

/// Bytes a vector has allocated.
pub fn heap<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

/// Resize `v` to `n` (zero-filled when growing) and return it.
#[inline]
pub fn take(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() != n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// A shared mutable slice for pool threads that each write a disjoint range.
#[derive(Clone, Copy)]
pub struct SharedMut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: users only create disjoint sub-slices from different threads.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    pub fn new(s: &mut [f32]) -> Self {
        SharedMut { ptr: s.as_mut_ptr(), len: s.len() }
    }

    /// A sub-slice.
    ///
    /// # Safety
    /// No two live slices obtained from the same `SharedMut` may overlap, and
    /// the original slice must outlive them.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "SharedMut range out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}
