//! What a device has been asked to do since it was opened: counted where it
//! happens (every submission, dispatch, buffer and copy in this module goes
//! through [`Tally`]), read as plain data ([`GpuCounters`]) so the CLI and
//! the bindings can report it whether or not the backend is built.

/// Totals since the device was opened. Subtract two readings for the work
/// between them (`after - before`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuCounters {
    /// Command buffers submitted to the queue.
    pub submissions: u64,
    /// Compute dispatches recorded.
    pub dispatches: u64,
    /// Buffers created (weights, parameters, activations, outputs, readbacks).
    pub buffers_created: u64,
    /// Weight bytes copied to the device (a matrix's blocks and its
    /// parameters, once per matrix, padded to whole words).
    pub weight_bytes_uploaded: u64,
    /// Activation bytes written to the device (every product's input,
    /// attention's queries).
    pub activation_bytes_uploaded: u64,
    /// KV cache bytes written to the device (the positions that changed).
    pub cache_bytes_uploaded: u64,
    /// Recurrent (delta-rule) states written to the device whole, and their
    /// bytes: when the host's copy changed under the device's (a new
    /// sequence, a restored checkpoint, a loaded snapshot, a pass on the
    /// CPU), never per decoded token.
    pub state_uploads: u64,
    pub state_bytes_uploaded: u64,
    /// Recurrent states read back (for a checkpoint, a snapshot, a pass on
    /// the CPU); counted among `readbacks` too.
    pub state_readbacks: u64,
    /// Readbacks waited for (each a map of a readback buffer).
    pub readbacks: u64,
    /// Bytes read back to the host.
    pub readback_bytes: u64,
}

impl GpuCounters {
    /// Every byte copied to the device: weights, activations, KV entries
    /// and recurrent states.
    pub fn bytes_uploaded(&self) -> u64 {
        self.weight_bytes_uploaded
            + self.activation_bytes_uploaded
            + self.cache_bytes_uploaded
            + self.state_bytes_uploaded
    }
}

/// Field by field: `add` sums the work of two spans, `sub` takes the work
/// between two readings (saturating).
macro_rules! fieldwise {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait for GpuCounters {
            type Output = GpuCounters;

            fn $method(self, o: GpuCounters) -> GpuCounters {
                GpuCounters {
                    submissions: self.submissions.$op(o.submissions),
                    dispatches: self.dispatches.$op(o.dispatches),
                    buffers_created: self.buffers_created.$op(o.buffers_created),
                    weight_bytes_uploaded: self.weight_bytes_uploaded.$op(o.weight_bytes_uploaded),
                    activation_bytes_uploaded: self.activation_bytes_uploaded.$op(o.activation_bytes_uploaded),
                    cache_bytes_uploaded: self.cache_bytes_uploaded.$op(o.cache_bytes_uploaded),
                    state_uploads: self.state_uploads.$op(o.state_uploads),
                    state_bytes_uploaded: self.state_bytes_uploaded.$op(o.state_bytes_uploaded),
                    state_readbacks: self.state_readbacks.$op(o.state_readbacks),
                    readbacks: self.readbacks.$op(o.readbacks),
                    readback_bytes: self.readback_bytes.$op(o.readback_bytes),
                }
            }
        }
    };
}

fieldwise!(Add, add, saturating_add);
fieldwise!(Sub, sub, saturating_sub);

/// The device's running counts (relaxed atomics: each is a total, read
/// between passes, never used to order anything).
#[cfg(feature = "gpu")]
#[derive(Default)]
pub(super) struct Tally {
    submissions: std::sync::atomic::AtomicU64,
    dispatches: std::sync::atomic::AtomicU64,
    buffers_created: std::sync::atomic::AtomicU64,
    weight_bytes_uploaded: std::sync::atomic::AtomicU64,
    activation_bytes_uploaded: std::sync::atomic::AtomicU64,
    cache_bytes_uploaded: std::sync::atomic::AtomicU64,
    state_uploads: std::sync::atomic::AtomicU64,
    state_bytes_uploaded: std::sync::atomic::AtomicU64,
    state_readbacks: std::sync::atomic::AtomicU64,
    readbacks: std::sync::atomic::AtomicU64,
    readback_bytes: std::sync::atomic::AtomicU64,
}

#[cfg(feature = "gpu")]
impl Tally {
    pub(super) fn submitted(&self, dispatches: u64) {
        self.submissions.fetch_add(1, RELAXED);
        self.dispatches.fetch_add(dispatches, RELAXED);
    }

    pub(super) fn created(&self, buffers: u64) {
        self.buffers_created.fetch_add(buffers, RELAXED);
    }

    pub(super) fn weights(&self, bytes: u64) {
        self.weight_bytes_uploaded.fetch_add(bytes, RELAXED);
    }

    pub(super) fn activations(&self, bytes: u64) {
        self.activation_bytes_uploaded.fetch_add(bytes, RELAXED);
    }

    pub(super) fn cache(&self, bytes: u64) {
        self.cache_bytes_uploaded.fetch_add(bytes, RELAXED);
    }

    pub(super) fn state_up(&self, bytes: u64) {
        self.state_uploads.fetch_add(1, RELAXED);
        self.state_bytes_uploaded.fetch_add(bytes, RELAXED);
    }

    pub(super) fn state_read(&self) {
        self.state_readbacks.fetch_add(1, RELAXED);
    }

    pub(super) fn read_back(&self, bytes: u64) {
        self.readbacks.fetch_add(1, RELAXED);
        self.readback_bytes.fetch_add(bytes, RELAXED);
    }

    pub(super) fn snapshot(&self) -> GpuCounters {
        GpuCounters {
            submissions: self.submissions.load(RELAXED),
            dispatches: self.dispatches.load(RELAXED),
            buffers_created: self.buffers_created.load(RELAXED),
            weight_bytes_uploaded: self.weight_bytes_uploaded.load(RELAXED),
            activation_bytes_uploaded: self.activation_bytes_uploaded.load(RELAXED),
            cache_bytes_uploaded: self.cache_bytes_uploaded.load(RELAXED),
            state_uploads: self.state_uploads.load(RELAXED),
            state_bytes_uploaded: self.state_bytes_uploaded.load(RELAXED),
            state_readbacks: self.state_readbacks.load(RELAXED),
            readbacks: self.readbacks.load(RELAXED),
            readback_bytes: self.readback_bytes.load(RELAXED),
        }
    }
}

#[cfg(feature = "gpu")]
const RELAXED: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;

#[cfg(test)]
mod tests {
    use super::GpuCounters;

    #[test]
    fn differences_of_readings() {
        let a = GpuCounters { submissions: 3, dispatches: 9, readback_bytes: 40, ..Default::default() };
        let b = GpuCounters { submissions: 5, dispatches: 14, readback_bytes: 100, activation_bytes_uploaded: 8, ..a };
        let d = b - a;
        assert_eq!((d.submissions, d.dispatches, d.readback_bytes, d.bytes_uploaded()), (2, 5, 60, 8));
        assert_eq!(a - b, GpuCounters::default());
        assert_eq!(a + d, b);
    }
}
