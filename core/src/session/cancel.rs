//! Cancellation by epochs: one counter per session, bumped by every cancel.
//!
//! A request remembers the epoch at which it was issued (when the caller
//! asked for it, which for a shared session is before it waits its turn) and
//! is cancelled once the counter has moved past it. So a cancel stops the
//! request that is running and every request already issued and waiting,
//! and a cancel that lands before a request is issued does not touch it:
//! nothing needs clearing at the start of a request, and nothing can race
//! such a clearing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Cancels a session's requests from any thread, without waiting.
#[derive(Clone, Debug, Default)]
pub struct CancelHandle(Arc<AtomicU64>);

impl CancelHandle {
    /// Stop the running request after its current token, and every request
    /// issued before this call that is still waiting to run; requests issued
    /// later are not affected.
    pub fn cancel(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// A ticket for a request issued now.
    pub(crate) fn issue(&self) -> Ticket {
        Ticket { handle: self.0.clone(), epoch: self.0.load(Ordering::SeqCst) }
    }
}

/// The cancellation state of one request.
#[derive(Clone, Debug)]
pub(crate) struct Ticket {
    handle: Arc<AtomicU64>,
    epoch: u64,
}

impl Ticket {
    /// Whether a cancel has come since the request was issued.
    pub(crate) fn cancelled(&self) -> bool {
        self.handle.load(Ordering::SeqCst) != self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::CancelHandle;

    #[test]
    fn a_cancel_stops_issued_requests_only() {
        let h = CancelHandle::default();
        h.cancel(); // before anything was issued: poisons nothing
        let (running, queued) = (h.issue(), h.issue());
        assert!(!running.cancelled() && !queued.cancelled());
        h.clone().cancel(); // from another handle of the same session
        assert!(running.cancelled() && queued.cancelled());
        assert!(!h.issue().cancelled(), "a request issued after the cancel runs");
    }
}
