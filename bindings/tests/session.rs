//! The FFI session from Rust: cancellation of running and queued requests,
//! re-entry from a listener, errors from listeners. (The same API is tested
//! from Python and Kotlin in bindings/tests/python and bindings/tests/kotlin.)

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use pocket_ffi::{
    GenerateOptions, LoadOptions, PocketError, PocketModel, PocketSession, SessionOptions, StopReason, TokenListener,
};

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let store = std::env::var_os("POCKET_FIXTURES").map_or_else(|| root.join("../shared/fixtures"), PathBuf::from);
    store.join("models").join(name).to_string_lossy().into_owned()
}

fn session() -> Arc<PocketSession> {
    let model = PocketModel::load(fixture("qwen3moe-tiny-Q4_K_M.gguf"), LoadOptions::default()).expect("fixture model");
    PocketSession::new(model, SessionOptions::default()).unwrap()
}

/// Counts pieces; tells `started` about the first; sleeps a little per piece.
struct Slow {
    pieces: AtomicUsize,
    started: Mutex<Option<mpsc::Sender<()>>>,
}

impl Slow {
    fn new(started: mpsc::Sender<()>) -> Arc<Self> {
        Arc::new(Slow { pieces: AtomicUsize::new(0), started: Mutex::new(Some(started)) })
    }
}

impl TokenListener for Slow {
    fn on_token(&self, _piece: String) -> Result<bool, PocketError> {
        self.pieces.fetch_add(1, Ordering::SeqCst);
        if let Some(tx) = self.started.lock().unwrap().take() {
            let _ = tx.send(());
        }
        std::thread::sleep(Duration::from_millis(3));
        Ok(true)
    }
}

struct Quiet;

impl TokenListener for Quiet {
    fn on_token(&self, _piece: String) -> Result<bool, PocketError> {
        Ok(true)
    }
}

fn long() -> GenerateOptions {
    GenerateOptions { max_tokens: 2000, temperature: 1.0, ..GenerateOptions::default() }
}

#[test]
fn cancel_stops_the_running_request_and_the_queued_one() {
    let s = session();
    let (tx, rx) = mpsc::channel();
    let first = {
        let s = s.clone();
        std::thread::spawn(move || s.generate("Hello".into(), long(), Slow::new(tx)))
    };
    rx.recv_timeout(Duration::from_secs(30)).expect("first token");
    // A second request waits for the lock behind the first.
    let second = {
        let s = s.clone();
        std::thread::spawn(move || s.generate("Hello".into(), long(), Arc::new(Quiet)))
    };
    std::thread::sleep(Duration::from_millis(50));
    s.cancel();
    let a = first.join().unwrap().unwrap();
    let b = second.join().unwrap().unwrap();
    assert_eq!(a.stop_reason, StopReason::Cancelled);
    assert!(a.generated_tokens < 2000);
    assert_eq!(b.stop_reason, StopReason::Cancelled);
    // A request after the cancel runs normally.
    let c = s.generate("Hello".into(), GenerateOptions { max_tokens: 3, ..long() }, Arc::new(Quiet)).unwrap();
    assert_eq!((c.stop_reason, c.generated_tokens), (StopReason::MaxTokens, 3));
}

#[test]
fn listener_errors_and_reentry_are_errors_not_crashes() {
    struct Fails;
    impl TokenListener for Fails {
        fn on_token(&self, _: String) -> Result<bool, PocketError> {
            Err(PocketError::Internal { reason: "listener bug".into() })
        }
    }
    let s = session();
    let e = s.generate("Hi".into(), GenerateOptions::default(), Arc::new(Fails)).unwrap_err();
    assert_eq!(e, PocketError::Internal { reason: "listener bug".into() });

    struct Reenter(Arc<PocketSession>, Mutex<Option<PocketError>>);
    impl TokenListener for Reenter {
        fn on_token(&self, _: String) -> Result<bool, PocketError> {
            let inner = self.0.generate("again".into(), GenerateOptions::default(), Arc::new(Quiet));
            *self.1.lock().unwrap() = inner.err();
            self.0.reset(); // ignored from inside, never deadlocks
            Ok(false)
        }
    }
    let listener = Arc::new(Reenter(s.clone(), Mutex::new(None)));
    let stats = s.generate("Hi".into(), GenerateOptions::default(), listener.clone()).unwrap();
    assert_eq!(stats.stop_reason, StopReason::ListenerStopped);
    assert!(matches!(listener.1.lock().unwrap().take(), Some(PocketError::InvalidArgument { .. })));
    drop(listener); // breaks the session <-> listener cycle
}
