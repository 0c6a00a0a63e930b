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

/// Collects the streamed text.
struct Collect(Mutex<String>);

impl TokenListener for Collect {
    fn on_token(&self, piece: String) -> Result<bool, PocketError> {
        self.0.lock().unwrap().push_str(&piece);
        Ok(true)
    }
}

#[test]
fn a_restored_session_continues_where_the_saved_one_stood() {
    let dir = std::env::temp_dir().join(format!("pocket-ffi-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("chat.snap").to_string_lossy().into_owned();
    let model = PocketModel::load(fixture("qwen35moe-tiny-Q4_K_M.gguf"), LoadOptions::default()).unwrap();
    let options = SessionOptions { context_length: 256, ..SessionOptions::default() };
    let greedy = GenerateOptions { max_tokens: 12, temperature: 0.0, ..GenerateOptions::default() };

    let s = PocketSession::new(model.clone(), options.clone()).unwrap();
    let first = s.generate("Once upon a time".into(), greedy.clone(), Arc::new(Quiet)).unwrap();
    s.save(path.clone()).unwrap();
    let next = format!("Once upon a time{} and", first.text);
    let uninterrupted = s.generate(next.clone(), greedy.clone(), Arc::new(Quiet)).unwrap();

    let r = PocketSession::restore(model.clone(), path.clone(), options.clone()).unwrap();
    let listener = Arc::new(Collect(Mutex::new(String::new())));
    let restored = r.generate(next, greedy, listener.clone()).unwrap();
    assert_eq!(restored.text, uninterrupted.text);
    assert_eq!(*listener.0.lock().unwrap(), uninterrupted.text);

    // Typed errors: other options, a damaged file, a missing file.
    let other_ctx = SessionOptions { context_length: 128, ..options.clone() };
    assert!(matches!(
        PocketSession::restore(model.clone(), path.clone(), other_ctx),
        Err(PocketError::InvalidArgument { reason }) if reason.contains("context")
    ));
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    let damaged = dir.join("damaged.snap").to_string_lossy().into_owned();
    std::fs::write(&damaged, &bytes).unwrap();
    assert!(matches!(
        PocketSession::restore(model.clone(), damaged, options.clone()),
        Err(PocketError::InvalidArgument { reason }) if reason.contains("checksum")
    ));
    let missing = dir.join("missing.snap").to_string_lossy().into_owned();
    assert!(matches!(PocketSession::restore(model.clone(), missing, options), Err(PocketError::Io { .. })));
    // Saving into a folder that does not exist is an I/O error, not a crash.
    let nowhere = dir.join("no/such/folder/x.snap").to_string_lossy().into_owned();
    assert!(matches!(s.save(nowhere), Err(PocketError::Io { .. })));
    std::fs::remove_dir_all(dir).unwrap();
}
