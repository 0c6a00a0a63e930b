//! A session shared between threads, as apps use one: requests queue for
//! their turn, `cancel()` never waits, and a listener that calls back into its
//! own session gets an error instead of a deadlock.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use super::{CancelHandle, GenerateOptions, GenerationStats, Session, SessionOptions, Ticket};
use crate::chat::ChatMessage;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::structured::GenerationEvent;

/// A [`Session`] behind a lock. A second request while one runs waits for it
/// (the first finishes or is cancelled), never races it; `cancel()` stops the
/// running request and every request issued before it, without the lock (see
/// [`CancelHandle`]).
pub struct SharedSession {
    session: Mutex<Session>,
    cancel: CancelHandle,
    /// The thread holding `session` while it runs a request (to refuse
    /// re-entry from that request's own listener).
    holder: Mutex<Option<ThreadId>>,
}

impl SharedSession {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<SharedSession> {
        Ok(SharedSession::from(Session::new(model, opts)?))
    }

    /// [`Session::restore`]: a session continuing from the snapshot at `path`.
    pub fn restore(model: Arc<Model>, path: impl AsRef<Path>, opts: SessionOptions) -> Result<SharedSession> {
        Ok(SharedSession::from(Session::restore(model, path, opts)?))
    }

    /// [`Session::save`], after the running request ends (cancel it first to
    /// make that quick). Refused from the session's own listener.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.with(|s| s.save(path))?
    }

    /// [`Session::load`], after the running request ends. Refused from the
    /// session's own listener.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        self.with(|s| s.load(path))?
    }

    /// [`Session::generate`], waiting for the session's turn.
    pub fn generate(
        &self,
        prompt: &str,
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        self.generate_events(prompt, opts, &mut super::text_only(on_piece))
    }

    /// [`Session::generate_events`], waiting for the session's turn.
    pub fn generate_events(
        &self,
        prompt: &str,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        self.request(|s, ticket| s.generate_issued(ticket, prompt, opts, on_event))
    }

    /// [`Session::chat`], waiting for the session's turn.
    pub fn chat(
        &self,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        self.chat_events(messages, opts, &mut super::text_only(on_piece))
    }

    /// [`Session::chat_events`], waiting for the session's turn.
    pub fn chat_events(
        &self,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(GenerationEvent) -> bool,
    ) -> Result<GenerationStats> {
        self.request(|s, ticket| s.chat_issued(ticket, messages, opts, on_event))
    }

    /// Stop the running request and those waiting; never blocks.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Forget the conversation, after the running request ends (cancel it
    /// first to make that quick). Refused from the session's own listener.
    pub fn reset(&self) -> Result<()> {
        self.with(Session::reset)
    }

    /// Run `f` on the session in its turn (refused from its own listener).
    pub fn with<R>(&self, f: impl FnOnce(&mut Session) -> R) -> Result<R> {
        self.refuse_reentry("this session's own token listener cannot use the session")?;
        let mut session = self.lock();
        let _holder = Holder::enter(&self.holder);
        Ok(f(&mut session))
    }

    fn request(&self, run: impl FnOnce(&mut Session, &Ticket) -> Result<GenerationStats>) -> Result<GenerationStats> {
        self.refuse_reentry("generate/chat called from this session's own token listener")?;
        // Issued now, before waiting: a cancel while it waits stops it.
        let ticket = self.cancel.issue();
        let mut session = self.lock();
        let _holder = Holder::enter(&self.holder);
        if ticket.cancelled() {
            return Ok(GenerationStats::cancelled());
        }
        run(&mut session, &ticket)
    }

    fn refuse_reentry(&self, what: &str) -> Result<()> {
        let held_here = *self.holder.lock().unwrap_or_else(|p| p.into_inner()) == Some(std::thread::current().id());
        if held_here {
            return Err(Error::InvalidArgument(what.into()));
        }
        Ok(())
    }

    /// The session. A panic during an earlier request poisoned the lock and
    /// may have left the state half-updated: start that conversation afresh.
    fn lock(&self) -> MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|poisoned| {
            let mut s = poisoned.into_inner();
            s.reset();
            self.session.clear_poison();
            s
        })
    }
}

impl From<Session> for SharedSession {
    fn from(session: Session) -> SharedSession {
        SharedSession { cancel: session.cancel_handle(), session: Mutex::new(session), holder: Mutex::new(None) }
    }
}

/// Marks the current thread as holding the session until dropped (also on panic).
struct Holder<'a>(&'a Mutex<Option<ThreadId>>);

impl<'a> Holder<'a> {
    fn enter(slot: &'a Mutex<Option<ThreadId>>) -> Self {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
        Holder(slot)
    }
}

impl Drop for Holder<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
