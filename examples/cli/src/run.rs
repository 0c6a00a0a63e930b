//! `pocket run` (raw completion) and `pocket chat` (interactive chat with the
//! model's template).

use std::io::{self, BufRead, Write};
use std::sync::Arc;

use pocket_core::chat::ChatMessage;
use pocket_core::model::{KvType, Model};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{CancelHandle, ContextPolicy, GenerateOptions, GenerationStats, Session, SessionOptions};
use serde_json::json;

use crate::args::{Args, Spec};

/// Options shared by `run` and `chat`: model, sampling, session.
const COMMON: Spec = Spec {
    values: &[
        "--model",
        "-n",
        "--temp",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--repeat-last-n",
        "--presence-penalty",
        "--frequency-penalty",
        "--seed",
        "--threads",
        "--ctx",
        "--kv",
        "--stop",
        "--keep",
    ],
    switches: &["--slide", "--ignore-eos"],
};

const RUN_SPEC: Spec = Spec { values: &["--prompt"], switches: &["--json", "--no-echo"] };

const CHAT_SPEC: Spec = Spec { values: &["--system"], switches: &[] };

pub const RUN_USAGE: &str = "usage: pocket run --model FILE --prompt TEXT [-n N] [--temp T] [--top-k K] [--top-p P] \
[--min-p P] [--repeat-penalty R] [--seed S] [--threads N] [--ctx N] [--kv f16|f32] [--stop TEXT]... [--json] [--no-echo]";

pub const CHAT_USAGE: &str =
    "usage: pocket chat --model FILE [--system TEXT] [-n N] [--temp T] [sampling options as for run]";

/// Load a model and open a session from the common options.
fn open(args: &Args) -> Result<(Session, GenerateOptions), String> {
    let path = args.required("--model")?;
    let model = Model::load(path).map_err(|e| format!("{path}: {e}"))?;
    let kv: KvType = args.value("--kv").unwrap_or("f16").parse().map_err(|e: pocket_core::Error| e.to_string())?;
    let context_policy = if args.switch("--slide") {
        ContextPolicy::Slide { sink: args.parsed("--keep")? }
    } else {
        ContextPolicy::Error
    };
    let seed: u64 = args.parsed("--seed")?.unwrap_or(pocket_core::session::DEFAULT_SEED);
    let opts = SessionOptions {
        context_length: args.parsed("--ctx")?.unwrap_or(0),
        kv_type: kv,
        threads: args.parsed("--threads")?.unwrap_or(0),
        context_policy,
        seed,
    };
    let session = Session::new(Arc::new(model), opts).map_err(|e| e.to_string())?;
    let d = SamplerConfig::default();
    let sampler = SamplerConfig {
        temperature: args.parsed("--temp")?.unwrap_or(d.temperature),
        top_k: args.parsed("--top-k")?.unwrap_or(d.top_k),
        top_p: args.parsed("--top-p")?.unwrap_or(d.top_p),
        min_p: args.parsed("--min-p")?.unwrap_or(d.min_p),
        repeat_penalty: args.parsed("--repeat-penalty")?.unwrap_or(d.repeat_penalty),
        penalty_last_n: args.parsed("--repeat-last-n")?.unwrap_or(d.penalty_last_n),
        presence_penalty: args.parsed("--presence-penalty")?.unwrap_or(d.presence_penalty),
        frequency_penalty: args.parsed("--frequency-penalty")?.unwrap_or(d.frequency_penalty),
        seed,
    };
    let gen = GenerateOptions {
        max_tokens: args.parsed("-n")?.unwrap_or(256),
        sampler,
        stop: args.values("--stop").to_vec(),
        seed: Some(seed),
        show_special: false,
        ignore_eos: args.switch("--ignore-eos"),
    };
    Ok((session, gen))
}

pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse_multi(argv, &[&COMMON, &RUN_SPEC]).map_err(|e| format!("{e}\n{RUN_USAGE}"))?;
    let prompt = args.required("--prompt").map_err(|e| format!("{e}\n{RUN_USAGE}"))?.to_string();
    let (mut session, gen) = open(&args)?;
    let json_out = args.switch("--json");
    let mut stdout = io::stdout().lock();
    if !json_out && !args.switch("--no-echo") {
        let _ = write!(stdout, "{prompt}");
        let _ = stdout.flush();
    }
    let _guard = interrupt::install(session.cancel_handle());
    let stats = session
        .generate(&prompt, &gen, &mut |piece| {
            if !json_out {
                // A closed pipe (`| head`) stops generation quietly.
                return write!(stdout, "{piece}").and_then(|_| stdout.flush()).is_ok();
            }
            true
        })
        .map_err(|e| e.to_string())?;
    if json_out {
        let v = json!({
            "text": stats.text,
            "tokens": stats.tokens,
            "prompt_tokens": stats.prompt_tokens,
            "stats": stats_json(&stats),
        });
        println!("{v}");
    } else {
        let _ = writeln!(stdout);
        eprintln!("{}", stats_line(&stats));
    }
    Ok(())
}

pub fn stats_json(s: &GenerationStats) -> serde_json::Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "prompt_tokens_evaluated": s.prompt_tokens_evaluated,
        "generated_tokens": s.generated_tokens,
        "time_to_first_token_ms": s.time_to_first_token_ms,
        "prefill_tokens_per_second": s.prefill_tokens_per_second,
        "decode_tokens_per_second": s.decode_tokens_per_second,
        "stop_reason": s.stop_reason.as_str(),
    })
}

fn stats_line(s: &GenerationStats) -> String {
    format!(
        "[{} prompt tokens ({} evaluated), {} generated | first token {:.0} ms | prefill {:.1} t/s | decode {:.1} t/s | {}]",
        s.prompt_tokens,
        s.prompt_tokens_evaluated,
        s.generated_tokens,
        s.time_to_first_token_ms,
        s.prefill_tokens_per_second,
        s.decode_tokens_per_second,
        s.stop_reason.as_str()
    )
}

pub fn chat(argv: &[String]) -> Result<(), String> {
    let args = Args::parse_multi(argv, &[&COMMON, &CHAT_SPEC]).map_err(|e| format!("{e}\n{CHAT_USAGE}"))?;
    let (mut session, gen) = open(&args)?;
    let mut history: Vec<ChatMessage> = Vec::new();
    if let Some(sys) = args.value("--system") {
        history.push(ChatMessage::new("system", sys));
    }
    let system_len = history.len();
    let _guard = interrupt::install(session.cancel_handle());
    eprintln!("pocket chat — /reset clears the conversation, /stats shows the last answer's figures, /quit leaves.");
    eprintln!("Ctrl-C stops an answer; Ctrl-D quits.");
    let stdin = io::stdin();
    let mut last: Option<GenerationStats> = None;
    loop {
        eprint!("> ");
        let _ = io::stderr().flush();
        let mut line = String::new();
        match stdin.lock().read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        let text = line.trim_end_matches(['\n', '\r']);
        match text.trim() {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history.truncate(system_len);
                session.reset();
                eprintln!("(conversation cleared)");
                continue;
            }
            "/stats" => {
                match &last {
                    Some(s) => eprintln!("{}", stats_line(s)),
                    None => eprintln!("(no answer yet)"),
                }
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", text));
        let mut out = io::stdout().lock();
        let result = session.chat(&history, &gen, &mut |piece| {
            let _ = write!(out, "{piece}");
            let _ = out.flush();
            true
        });
        let _ = writeln!(out);
        match result {
            Ok(stats) => {
                history.push(ChatMessage::new("assistant", stats.text.clone()));
                last = Some(stats);
            }
            Err(e) => {
                history.pop();
                eprintln!("error: {e}");
            }
        }
    }
    Ok(())
}

/// Ctrl-C cancels the running generation instead of killing the process.
mod interrupt {
    use std::sync::Mutex;

    use super::CancelHandle;

    static HANDLE: Mutex<Option<CancelHandle>> = Mutex::new(None);
    static FLAG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Uninstalls on drop.
    pub struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            if let Ok(mut h) = HANDLE.lock() {
                *h = None;
            }
        }
    }

    #[cfg(unix)]
    extern "C" fn on_sigint(_: libc::c_int) {
        // Only an atomic store: async-signal-safe. A watcher thread forwards it.
        FLAG.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn install(h: CancelHandle) -> Guard {
        if let Ok(mut slot) = HANDLE.lock() {
            *slot = Some(h);
        }
        #[cfg(unix)]
        {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                // SAFETY: installs a handler that only stores to an atomic.
                unsafe {
                    libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
                }
                std::thread::spawn(|| loop {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    if FLAG.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        match HANDLE.lock().ok().and_then(|h| h.clone()) {
                            Some(h) => h.cancel(),
                            None => std::process::exit(130),
                        }
                    }
                });
            });
        }
        Guard
    }
}
