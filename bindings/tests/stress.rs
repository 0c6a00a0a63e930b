//! The SDK under load, as an app drives it: one model, four sessions
//! generating and chatting on four threads, `cancel()`, `reset()` and
//! `save()` fired at random moments from two other threads, listeners that
//! stop early or throw, sessions saved and replaced by restored ones in the
//! middle. A watchdog fails the test if the threads stop making progress
//! (a deadlock); any unexpected error or panic fails it too. Afterwards every
//! session still generates the same greedy text as a fresh one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use pocket_ffi::{
    ChatMessage, GenerateOptions, LoadOptions, PocketError, PocketModel, PocketSession, SessionOptions, StopReason,
    TokenListener,
};

/// How long the threads run at each other.
const CHAOS: Duration = Duration::from_secs(25);
/// A thread silent for this long is stuck.
const STUCK: Duration = Duration::from_secs(60);
const WORKERS: usize = 4;
const CHAOS_THREADS: usize = 2;
const THROWN: &str = "the listener threw";

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let store = std::env::var_os("POCKET_FIXTURES").map_or_else(|| root.join("../shared/fixtures"), PathBuf::from);
    store.join("models").join(name).to_string_lossy().into_owned()
}

/// xorshift64*: a reproducible stream of choices per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// What a listener does after `after` pieces.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Listen,
    Stop,
    Throw,
}

struct Listener {
    behaviour: Behaviour,
    after: usize,
    seen: AtomicUsize,
}

impl TokenListener for Listener {
    fn on_token(&self, _piece: String) -> Result<bool, PocketError> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        match self.behaviour {
            Behaviour::Stop if n >= self.after => Ok(false),
            Behaviour::Throw if n >= self.after => Err(PocketError::Internal { reason: THROWN.into() }),
            _ => Ok(true),
        }
    }
}

#[derive(Default)]
struct Counts {
    requests: AtomicUsize,
    chats: AtomicUsize,
    cancelled: AtomicUsize,
    stopped: AtomicUsize,
    thrown: AtomicUsize,
    tokens: AtomicUsize,
    cancels: AtomicUsize,
    resets: AtomicUsize,
    saves: AtomicUsize,
    restores: AtomicUsize,
}

struct Shared {
    model: Arc<PocketModel>,
    options: SessionOptions,
    slots: Vec<RwLock<Arc<PocketSession>>>,
    dir: PathBuf,
    counts: Counts,
    /// Milliseconds since `start` of each thread's last completed step.
    beats: Vec<AtomicU64>,
    start: Instant,
    failure: RwLock<Option<String>>,
    stop: AtomicBool,
}

impl Shared {
    fn session(&self, i: usize) -> Arc<PocketSession> {
        self.slots[i].read().unwrap().clone()
    }

    fn beat(&self, thread: usize) {
        self.beats[thread].store(self.start.elapsed().as_millis() as u64, Ordering::SeqCst);
    }

    fn fail(&self, what: String) {
        self.failure.write().unwrap().get_or_insert(what);
        self.stop.store(true, Ordering::SeqCst);
    }
}

const PROMPTS: [&str; 4] = ["Once upon a time", "The capital of France", "Write a haiku about rain", "1, 2, 3,"];

fn worker(sh: &Shared, i: usize, seed: u64) {
    let mut rng = Rng(seed);
    let snap = sh.dir.join(format!("worker-{i}.snap")).to_string_lossy().into_owned();
    let common = sh.dir.join("common.snap").to_string_lossy().into_owned();
    while sh.start.elapsed() < CHAOS && !sh.stop.load(Ordering::SeqCst) {
        let session = sh.session(i);
        match rng.below(10) {
            0..=6 => {
                let behaviour =
                    [Behaviour::Listen, Behaviour::Listen, Behaviour::Stop, Behaviour::Throw][rng.below(4) as usize];
                let listener =
                    Arc::new(Listener { behaviour, after: 1 + rng.below(8) as usize, seen: AtomicUsize::new(0) });
                let options = GenerateOptions {
                    max_tokens: 1 + rng.below(24) as u32,
                    temperature: if rng.below(2) == 0 { 0.0 } else { 0.8 },
                    seed: Some(rng.below(1000)),
                    ..GenerateOptions::default()
                };
                let prompt = PROMPTS[rng.below(PROMPTS.len() as u64) as usize].to_string();
                let chat = rng.below(3) == 0;
                let result = if chat {
                    sh.counts.chats.fetch_add(1, Ordering::Relaxed);
                    let messages = vec![ChatMessage::new("user", prompt)];
                    session.chat(messages, options, listener.clone())
                } else {
                    session.generate(prompt, options, listener.clone())
                };
                sh.counts.requests.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(stats) => {
                        sh.counts.tokens.fetch_add(stats.generated_tokens as usize, Ordering::Relaxed);
                        match stats.stop_reason {
                            StopReason::Cancelled => sh.counts.cancelled.fetch_add(1, Ordering::Relaxed),
                            StopReason::ListenerStopped => sh.counts.stopped.fetch_add(1, Ordering::Relaxed),
                            _ => 0,
                        };
                        if stats.stop_reason == StopReason::ListenerStopped && behaviour != Behaviour::Stop {
                            sh.fail(format!("worker {i}: stopped by a listener that never stops"));
                        }
                    }
                    Err(PocketError::Internal { reason }) if reason == THROWN && behaviour == Behaviour::Throw => {
                        sh.counts.thrown.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => sh.fail(format!("worker {i}: request failed: {e}")),
                }
            }
            7 | 8 => {
                // Save, then go on with a session restored from the file (this
                // worker's, or the one every worker writes to: both are snapshots
                // of this model with these options, complete whoever wrote last).
                let path = if rng.below(2) == 0 { &snap } else { &common };
                if let Err(e) = session.save(path.clone()) {
                    sh.fail(format!("worker {i}: save failed: {e}"));
                }
                sh.counts.saves.fetch_add(1, Ordering::Relaxed);
                match PocketSession::restore(sh.model.clone(), path.clone(), sh.options.clone()) {
                    Ok(restored) => *sh.slots[i].write().unwrap() = restored,
                    Err(e) => sh.fail(format!("worker {i}: restore failed: {e}")),
                }
                sh.counts.restores.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                session.reset();
                sh.counts.resets.fetch_add(1, Ordering::Relaxed);
            }
        }
        sh.beat(i);
    }
}

fn chaos(sh: &Shared, j: usize, seed: u64) {
    let mut rng = Rng(seed);
    let path = sh.dir.join(format!("chaos-{j}.snap")).to_string_lossy().into_owned();
    while sh.start.elapsed() < CHAOS && !sh.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(rng.below(20)));
        let session = sh.session(rng.below(WORKERS as u64) as usize);
        match rng.below(10) {
            0..=6 => {
                session.cancel();
                sh.counts.cancels.fetch_add(1, Ordering::Relaxed);
            }
            7 | 8 => {
                session.reset();
                sh.counts.resets.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                if let Err(e) = session.save(path.clone()) {
                    sh.fail(format!("chaos {j}: save failed: {e}"));
                }
                sh.counts.saves.fetch_add(1, Ordering::Relaxed);
            }
        }
        sh.beat(WORKERS + j);
    }
}

fn greedy_text(session: &PocketSession) -> String {
    struct Quiet;
    impl TokenListener for Quiet {
        fn on_token(&self, _: String) -> Result<bool, PocketError> {
            Ok(true)
        }
    }
    let o = GenerateOptions { max_tokens: 16, temperature: 0.0, ..GenerateOptions::default() };
    session.generate("The capital of France".into(), o, Arc::new(Quiet)).unwrap().text
}

fn clean_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
}

#[test]
fn four_sessions_under_cancel_reset_save_and_restore_stay_correct_and_never_deadlock() {
    let model = PocketModel::load(fixture("qwen35moe-tiny-Q4_K_M.gguf"), LoadOptions::default()).unwrap();
    let options = SessionOptions { context_length: 512, sliding_window: true, threads: 1, ..SessionOptions::default() };
    let dir = std::env::temp_dir().join(format!("pocket-stress-{}", std::process::id()));
    clean_dir(&dir);
    let sh = Arc::new(Shared {
        slots: (0..WORKERS).map(|_| RwLock::new(PocketSession::new(model.clone(), options.clone()).unwrap())).collect(),
        model,
        options,
        dir: dir.clone(),
        counts: Counts::default(),
        beats: (0..WORKERS + CHAOS_THREADS).map(|_| AtomicU64::new(0)).collect(),
        start: Instant::now(),
        failure: RwLock::new(None),
        stop: AtomicBool::new(false),
    });
    let mut threads = Vec::new();
    for i in 0..WORKERS {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || worker(&sh, i, 0x9E37_79B9 + i as u64)));
    }
    for j in 0..CHAOS_THREADS {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || chaos(&sh, j, 0xC0FF_EE00 + j as u64)));
    }

    // The watchdog: every thread must finish its step within STUCK.
    while threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
        let now = sh.start.elapsed().as_millis() as u64;
        let stuck: Vec<usize> = (0..threads.len())
            .filter(|&t| {
                !threads[t].is_finished()
                    && now.saturating_sub(sh.beats[t].load(Ordering::SeqCst)) > STUCK.as_millis() as u64
            })
            .collect();
        assert!(stuck.is_empty(), "deadlock: threads {stuck:?} made no progress for {STUCK:?}");
    }
    for t in threads {
        assert!(t.join().is_ok(), "a thread panicked");
    }
    if let Some(f) = sh.failure.read().unwrap().as_ref() {
        panic!("{f}");
    }

    let c = &sh.counts;
    let n = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    eprintln!(
        "stress: {:.1} s, {} requests ({} chat, {} tokens): {} cancelled, {} stopped by the listener, {} thrown; \
         {} cancel() calls, {} resets, {} saves, {} restores",
        sh.start.elapsed().as_secs_f64(),
        n(&c.requests),
        n(&c.chats),
        n(&c.tokens),
        n(&c.cancelled),
        n(&c.stopped),
        n(&c.thrown),
        n(&c.cancels),
        n(&c.resets),
        n(&c.saves),
        n(&c.restores),
    );
    for (what, count) in [
        ("requests", &c.requests),
        ("cancelled requests", &c.cancelled),
        ("listener stops", &c.stopped),
        ("listener errors", &c.thrown),
        ("resets", &c.resets),
        ("restores", &c.restores),
    ] {
        assert!(n(count) > 0, "the run exercised no {what}");
    }

    // Every session, whatever it went through, answers like a fresh one.
    let fresh = greedy_text(&PocketSession::new(sh.model.clone(), sh.options.clone()).unwrap());
    for i in 0..WORKERS {
        let s = sh.session(i);
        s.reset();
        assert_eq!(greedy_text(&s), fresh, "session {i}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
