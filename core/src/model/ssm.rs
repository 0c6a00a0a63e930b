//! The delta-rule state S of one DeltaNet layer for one sequence, whose
//! newest values a backend may keep on its device.
//!
//! The GPU backend advances S in a device buffer and leaves it there: the
//! host copy goes stale and the state holds a [`DeviceCopy`] to read the
//! device's values back through, which happens only when the CPU needs them
//! (a checkpoint, a snapshot, a pass on the CPU). Every write of the host
//! copy (a new sequence, a restored checkpoint, a loaded snapshot, a pass on
//! the CPU) counts, so a backend knows from [`Ssm::identity`] and
//! [`Ssm::writes`] whether its device copy is still true (as
//! [`KvCache`](super::cache::KvCache) tells the device's copy of the KV
//! cache which positions changed).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::Result;

/// A device's copy of a state, newer than the host's.
pub trait DeviceCopy: Send + Sync {
    /// The device's values, into `out` (as long as the state).
    fn read_back(&self, out: &mut [f32]) -> Result<()>;
}

/// A state's id, unique in the process (a backend's key for its copy).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// S of every value head, `[n_v_heads][d_k][d_v]`.
pub struct Ssm {
    /// The values, unless `ahead` holds newer ones.
    host: Vec<f32>,
    id: u64,
    /// Dies with the state (a backend drops its copy then).
    life: Arc<()>,
    /// Writes of the host copy so far.
    writes: u64,
    /// A device copy newer than `host`, the one to read.
    ahead: Option<Arc<dyn DeviceCopy>>,
}

impl std::fmt::Debug for Ssm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ssm").field("len", &self.host.len()).field("on_device", &self.ahead.is_some()).finish()
    }
}

impl Ssm {
    /// `len` zeros.
    pub fn new(len: usize) -> Ssm {
        Ssm {
            host: vec![0.0; len],
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            life: Arc::new(()),
            writes: 0,
            ahead: None,
        }
    }

    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }

    /// The values: the host copy, or the device's read back when it is newer.
    pub fn read(&self) -> Result<Cow<'_, [f32]>> {
        match &self.ahead {
            None => Ok(Cow::Borrowed(&self.host)),
            Some(device) => {
                let mut out = vec![0.0; self.host.len()];
                device.read_back(&mut out)?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// The host copy to update in place: first read back from the device
    /// when it is newer. Counts as a write.
    pub fn host_mut(&mut self) -> Result<&mut [f32]> {
        if let Some(device) = &self.ahead {
            device.read_back(&mut self.host)?;
        }
        Ok(self.written())
    }

    /// The host copy to overwrite whole (a restore, a snapshot being read):
    /// nothing is read back. Counts as a write.
    pub fn overwrite(&mut self) -> &mut [f32] {
        self.written()
    }

    /// Zeros (a new sequence).
    pub fn clear(&mut self) {
        self.written().fill(0.0);
    }

    fn written(&mut self) -> &mut [f32] {
        self.ahead = None;
        self.writes += 1;
        &mut self.host
    }

    /// The id a backend keys its copy by, and a handle that dies with the state.
    pub fn identity(&self) -> (u64, Weak<()>) {
        (self.id, Arc::downgrade(&self.life))
    }

    /// Writes of the host copy so far: a device copy made at another count
    /// is stale.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// The device copy that is newer than the host's, if one is.
    pub fn ahead(&self) -> Option<&Arc<dyn DeviceCopy>> {
        self.ahead.as_ref()
    }

    /// The host copy as it lies, for a backend uploading it: true unless
    /// [`ahead`](Self::ahead) says otherwise.
    pub fn host(&self) -> &[f32] {
        &self.host
    }

    /// The device behind `copy` now holds the newest values (a backend
    /// advanced them there). Not a write: the host copy is only stale.
    pub fn advanced_on(&mut self, copy: Arc<dyn DeviceCopy>) {
        self.ahead = Some(copy);
    }
}

#[cfg(test)]
mod tests {
    use super::{DeviceCopy, Ssm};
    use std::sync::Arc;

    struct Sevens;

    impl DeviceCopy for Sevens {
        fn read_back(&self, out: &mut [f32]) -> crate::Result<()> {
            out.fill(7.0);
            Ok(())
        }
    }

    struct Lost;

    impl DeviceCopy for Lost {
        fn read_back(&self, _out: &mut [f32]) -> crate::Result<()> {
            Err(crate::Error::Gpu("device lost".into()))
        }
    }

    #[test]
    fn reads_go_through_a_newer_device_copy_and_writes_are_counted() {
        let mut s = Ssm::new(3);
        let (a, b) = (s.identity().0, Ssm::new(1).identity().0);
        assert_ne!(a, b);
        assert_eq!((&s.read().unwrap()[..], s.writes()), (&[0.0; 3][..], 0));
        s.advanced_on(Arc::new(Sevens));
        // Read back for the reader; the host copy stays stale, no write.
        assert_eq!(&s.read().unwrap()[..], &[7.0; 3]);
        assert_eq!((s.host(), s.writes()), (&[0.0; 3][..], 0));
        // An update in place reads back first.
        s.host_mut().unwrap()[0] = 1.0;
        assert_eq!((s.host(), s.writes(), s.ahead().is_none()), (&[1.0, 7.0, 7.0][..], 1, true));
        // A whole overwrite or a clear needs no readback.
        s.advanced_on(Arc::new(Lost));
        assert!(s.read().is_err());
        s.overwrite().copy_from_slice(&[2.0; 3]);
        assert_eq!((&s.read().unwrap()[..], s.writes()), (&[2.0; 3][..], 2));
        s.advanced_on(Arc::new(Lost));
        assert!(s.host_mut().is_err());
        s.clear();
        assert_eq!((&s.read().unwrap()[..], s.writes()), (&[0.0; 3][..], 3));
        let life = s.identity().1;
        drop(s);
        assert_eq!(life.strong_count(), 0);
    }
}
