//! `pocket run` (raw completion) and `pocket chat` (interactive chat with the
//! model's template).

use std::io::{self, BufRead, Write};
use std::sync::Arc;

use pocket_core::chat::ChatMessage;
use pocket_core::model::{KvType, Model};
use pocket_core::sampler::{check, SamplerConfig};
use pocket_core::session::{
    CancelHandle, ContextPolicy, GenerateOptions, GenerationStats, Session, SessionOptions, DEFAULT_MAX_CONTEXT,
    DEFAULT_SEED, DEFAULT_SLIDE_SINK,
};
use pocket_core::structured::GenerationEvent;
use serde_json::json;

use crate::memory::Follower;
use crate::structure::{call_json, parse_messages, Structure};

/// Complete a prompt, streaming the text
#[derive(clap::Args)]
pub struct RunArgs {
    /// The GGUF model file
    #[arg(long, value_name = "FILE")]
    model: String,
    /// The prompt, completed as it is (no chat template)
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true, required_unless_present = "tokens")]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids, evaluated as they are (no BOS added)
    #[arg(long, value_name = "IDS", value_parser = crate::logits::parse_tokens, conflicts_with = "prompt")]
    tokens: Option<crate::logits::Tokens>,
    /// Print one JSON object {text, tokens, prompt_tokens, stats} at the end instead of streaming
    #[arg(long)]
    json: bool,
    /// Do not print the prompt before the completion
    #[arg(long)]
    no_echo: bool,
    #[command(flatten)]
    common: Common,
}

/// Interactive chat with the model's template (/reset, /stats, /quit)
#[derive(clap::Args)]
pub struct ChatArgs {
    /// The GGUF model file
    #[arg(long, value_name = "FILE")]
    model: String,
    /// A system message that opens the conversation
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    system: Option<String>,
    /// Keep the conversation in FILE: restored from it when it exists, saved
    /// after each answer (crash-safe; /save and /load also use it)
    #[arg(long, value_name = "FILE")]
    session: Option<std::path::PathBuf>,
    /// Answer this conversation (a JSON array of {role, content, tool_calls?, tool_call_id?}; @PATH reads a file)
    /// and exit, instead of chatting interactively
    #[arg(long, value_name = "JSON")]
    messages: Option<String>,
    /// With --messages: print one JSON object {text, reasoning, tool_calls, stats} instead of streaming
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: Common,
}

/// Options shared by `run` and `chat`: sampling and session. Every default
/// is core's, so the help shows what a caller of the library gets too.
/// Sampler values go through core's range checks while parsing, so a bad one
/// is refused before the model loads, naming its flag; they may start with
/// '-' so that `--temp -1` reaches the check rather than reading as a flag
/// (integer flags take `-1` as a value too, to refuse it by name).
#[derive(clap::Args)]
struct Common {
    #[command(flatten)]
    budget: crate::memory::Budget,
    /// Tokens to generate at most
    #[arg(short = 'n', value_name = "N", default_value_t = GenerateOptions::default().max_tokens)]
    #[arg(allow_negative_numbers = true)]
    max_tokens: usize,
    /// Temperature; 0 = greedy
    #[arg(long = "temp", value_name = "T", default_value_t = SamplerConfig::default().temperature)]
    #[arg(value_parser = sampler(check::temperature), allow_hyphen_values = true)]
    temperature: f32,
    /// Keep the K most likely tokens; 0 = off
    #[arg(long, value_name = "K", default_value_t = SamplerConfig::default().top_k)]
    #[arg(allow_negative_numbers = true)]
    top_k: usize,
    /// Keep the most likely tokens whose probabilities reach P; 1 = off
    #[arg(long, value_name = "P", default_value_t = SamplerConfig::default().top_p)]
    #[arg(value_parser = sampler(check::probability), allow_hyphen_values = true)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 = off
    #[arg(long, value_name = "P", default_value_t = SamplerConfig::default().min_p)]
    #[arg(value_parser = sampler(check::probability), allow_hyphen_values = true)]
    min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by R; 1 = off
    #[arg(long, value_name = "R", default_value_t = SamplerConfig::default().repeat_penalty)]
    #[arg(value_parser = sampler(check::penalty), allow_hyphen_values = true)]
    repeat_penalty: f32,
    /// How many recent tokens the penalties look at
    #[arg(long, value_name = "N", default_value_t = SamplerConfig::default().penalty_last_n)]
    #[arg(allow_negative_numbers = true)]
    repeat_last_n: usize,
    /// Subtract this once from the logit of every recent token; 0 = off
    #[arg(long, value_name = "X", default_value_t = SamplerConfig::default().presence_penalty)]
    #[arg(value_parser = sampler(check::finite), allow_hyphen_values = true)]
    presence_penalty: f32,
    /// Subtract this per occurrence in the recent tokens; 0 = off
    #[arg(long, value_name = "X", default_value_t = SamplerConfig::default().frequency_penalty)]
    #[arg(value_parser = sampler(check::finite), allow_hyphen_values = true)]
    frequency_penalty: f32,
    /// Seed of the sampler
    #[arg(long, value_name = "S", default_value_t = DEFAULT_SEED, allow_negative_numbers = true)]
    seed: u64,
    /// Worker threads; 0 = the performance cores, else every core
    #[arg(long, value_name = "N", default_value_t = SessionOptions::default().threads)]
    #[arg(allow_negative_numbers = true)]
    threads: usize,
    #[arg(long, value_name = "N", default_value_t = SessionOptions::default().context_length)]
    #[arg(allow_negative_numbers = true)]
    #[arg(help = format!("Context length in tokens; 0 = the model's training context, at most {DEFAULT_MAX_CONTEXT}"))]
    ctx: usize,
    /// KV cache type: f32, f16 or q8_0
    #[arg(long, value_name = "TYPE", default_value = SessionOptions::default().kv_type.name())]
    kv: KvType,
    /// Stop before this text (never printed); repeatable
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// When the context is full, drop the oldest tokens but the first --keep and go on
    #[arg(long)]
    slide: bool,
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    #[arg(help = format!(
        "With --slide: tokens kept at the start of the context [default: {DEFAULT_SLIDE_SINK}, at most a quarter of it]"
    ))]
    keep: Option<usize>,
    /// Keep generating past end-of-generation tokens
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    structure: Structure,
    #[command(flatten)]
    speculate: crate::speculate::Speculate,
}

/// A clap value parser for an `f32` sampler flag checked by one of core's
/// [`check`] functions.
fn sampler(
    check: fn(f32) -> Result<f32, String>,
) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync + 'static {
    move |s| s.parse::<f32>().map_err(|e| e.to_string()).and_then(check)
}

/// The memory budget followed between tokens (`--memory-budget auto`).
struct Follow {
    model: Arc<Model>,
    follower: Option<Follower>,
}

impl Follow {
    fn tick(&mut self) {
        if let Some(f) = &mut self.follower {
            f.tick(&self.model);
        }
    }
}

/// Load a model and open a session from the common options.
fn open(path: &str, args: &Common) -> Result<(Session, GenerateOptions, Follow), String> {
    let model = Arc::new(args.budget.load_with_template(path, args.structure.template_source()?)?);
    let follow = Follow { follower: args.budget.follower(&model), model: Arc::clone(&model) };
    let context_policy = if args.slide { ContextPolicy::Slide { sink: args.keep } } else { ContextPolicy::Error };
    let opts = SessionOptions {
        context_length: args.ctx,
        kv_type: args.kv,
        threads: args.threads,
        context_policy,
        seed: args.seed,
        draft_model: args.speculate.draft_model()?,
    };
    let session = Session::new(model, opts).map_err(|e| e.to_string())?;
    let sampler = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        penalty_last_n: args.repeat_last_n,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
    };
    let mut gen = GenerateOptions {
        max_tokens: args.max_tokens,
        sampler,
        stop: args.stop.clone(),
        seed: Some(args.seed),
        show_special: false,
        ignore_eos: args.ignore_eos,
        speculation: args.speculate.speculation()?,
        ..GenerateOptions::default()
    };
    args.structure.apply(&mut gen)?;
    // Refused before anything is evaluated, naming the flag's field.
    gen.validate().map_err(|e| e.to_string())?;
    Ok((session, gen, follow))
}

pub fn run(args: RunArgs) -> Result<(), String> {
    let (mut session, gen, mut follow) = open(&args.model, &args.common)?;
    let json_out = args.json;
    let mut stdout = io::stdout().lock();
    if !json_out && !args.no_echo {
        let shown = match (&args.prompt, &args.tokens) {
            (Some(p), _) => p.clone(),
            (None, Some(t)) => session.model().tokenizer().decode(&t.0, false),
            (None, None) => String::new(),
        };
        let _ = write!(stdout, "{shown}");
        let _ = stdout.flush();
    }
    let _guard = interrupt::install(session.cancel_handle());
    let mut shown = Shown::default();
    let mut on_event = |event| {
        follow.tick();
        if !json_out {
            // A closed pipe (`| head`) stops generation quietly.
            return shown.show(&mut stdout, event);
        }
        true
    };
    let stats = match (&args.prompt, &args.tokens) {
        (_, Some(t)) => session.generate_tokens(&t.0, &gen, &mut on_event),
        (Some(p), None) => session.generate_events(p, &gen, &mut on_event),
        (None, None) => return Err("--prompt or --tokens is required".into()),
    }
    .map_err(|e| e.to_string())?;
    shown.end_if_closed();
    if json_out {
        let v = json!({
            "text": stats.text,
            "reasoning": stats.reasoning,
            "tool_calls": stats.tool_calls.iter().map(call_json).collect::<Vec<_>>(),
            "tokens": stats.tokens,
            "prompt_tokens": stats.prompt_tokens,
            "stats": stats_json(&stats),
        });
        outln!("{v}");
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
        "reasoning_chars": s.reasoning.chars().count(),
        "expert_cache_hits": s.expert_cache_hits,
        "expert_cache_misses": s.expert_cache_misses,
        "storage_bytes_read": s.storage_bytes_read,
        "drafted_tokens": s.drafted_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance": crate::speculate::acceptance(s.drafted_tokens, s.accepted_tokens),
    })
}

fn stats_line(s: &GenerationStats) -> String {
    let drafts = match crate::speculate::acceptance(s.drafted_tokens, s.accepted_tokens) {
        Some(a) => format!(" | drafts {}/{} accepted ({:.0} %)", s.accepted_tokens, s.drafted_tokens, a * 100.0),
        None => String::new(),
    };
    format!(
        "[{} prompt tokens ({} evaluated), {} generated | first token {:.0} ms | prefill {:.1} t/s | decode {:.1} t/s{drafts} | {}]",
        s.prompt_tokens,
        s.prompt_tokens_evaluated,
        s.generated_tokens,
        s.time_to_first_token_ms,
        s.prefill_tokens_per_second,
        s.decode_tokens_per_second,
        s.stop_reason.as_str()
    )
}

pub fn chat(args: ChatArgs) -> Result<(), String> {
    let (mut session, gen, mut follow) = open(&args.model, &args.common)?;
    let mut history: Vec<ChatMessage> = Vec::new();
    if let Some(sys) = &args.system {
        history.push(ChatMessage::new("system", sys));
    }
    if let Some(messages) = &args.messages {
        let text = match messages.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?,
            None => messages.clone(),
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("--messages: invalid JSON: {e}"))?;
        history.extend(parse_messages(&v)?);
        return answer_once(&mut session, &history, &gen, args.json, &mut follow);
    }
    let system_len = history.len();
    if let Some(path) = args.session.as_deref().filter(|p| p.exists()) {
        match crate::transcript::load(&mut session, path) {
            Ok(h) => {
                eprintln!(
                    "(restored {} messages, {} tokens from {})",
                    h.len(),
                    session.cached_tokens().len(),
                    path.display()
                );
                history = h;
            }
            Err(e) => eprintln!("(not restored: {e}; starting afresh)"),
        }
    }
    let _guard = interrupt::install(session.cancel_handle());
    eprintln!(
        "pocket chat — /reset clears the conversation, /stats shows the last answer's figures, \
         /save [FILE] and /load [FILE] keep it, /quit leaves."
    );
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
            cmd if cmd.starts_with("/save") || cmd.starts_with("/load") => {
                let arg = cmd[5..].trim();
                let path = if arg.is_empty() { args.session.clone() } else { Some(std::path::PathBuf::from(arg)) };
                let Some(path) = path else {
                    eprintln!("(give a file: /save FILE, /load FILE, or start with --session FILE)");
                    continue;
                };
                if cmd.starts_with("/save") {
                    match crate::transcript::save(&session, &history, &path) {
                        Ok(()) => eprintln!("(saved to {})", path.display()),
                        Err(e) => eprintln!("error: {e}"),
                    }
                } else {
                    match crate::transcript::load(&mut session, &path) {
                        Ok(h) => {
                            eprintln!("(loaded {} messages from {})", h.len(), path.display());
                            history = h;
                        }
                        Err(e) => eprintln!("error: {e}"),
                    }
                }
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", text));
        let mut out = io::stdout().lock();
        let mut shown = Shown { dim: true, ..Shown::default() };
        let result = session.chat_events(&history, &gen, &mut |event| {
            follow.tick();
            shown.show(&mut out, event)
        });
        shown.end_if_closed();
        let _ = writeln!(out);
        match result {
            Ok(stats) => {
                history.push(ChatMessage {
                    tool_calls: stats.tool_calls.clone(),
                    ..ChatMessage::new("assistant", stats.text.clone())
                });
                last = Some(stats);
                if let Some(path) = &args.session {
                    if let Err(e) = crate::transcript::save(&session, &history, path) {
                        eprintln!("error: {e}");
                    }
                }
            }
            Err(e) => {
                history.pop();
                eprintln!("error: {e}");
            }
        }
    }
    Ok(())
}

/// `pocket chat --messages`: answer once, streamed or as one JSON object.
fn answer_once(
    session: &mut Session,
    history: &[ChatMessage],
    gen: &GenerateOptions,
    json_out: bool,
    follow: &mut Follow,
) -> Result<(), String> {
    let _guard = interrupt::install(session.cancel_handle());
    let mut stdout = io::stdout().lock();
    let mut shown = Shown::default();
    let stats = session
        .chat_events(history, gen, &mut |event| {
            follow.tick();
            json_out || shown.show(&mut stdout, event)
        })
        .map_err(|e| e.to_string())?;
    shown.end_if_closed();
    if json_out {
        let v = json!({
            "text": stats.text,
            "reasoning": stats.reasoning,
            "tool_calls": stats.tool_calls.iter().map(call_json).collect::<Vec<_>>(),
            "stats": stats_json(&stats),
        });
        outln!("{v}");
    } else {
        let _ = writeln!(stdout);
        eprintln!("{}", stats_line(&stats));
    }
    Ok(())
}

/// Streams events to a terminal: thinking apart (dimmed in the interactive
/// chat), answer text, and each tool call on a line of its own.
#[derive(Default)]
struct Shown {
    dim: bool,
    in_thought: bool,
    /// The reader closed standard output (`| head`): generation stops, and
    /// the command ends quietly once the engine returns.
    closed: bool,
}

impl Shown {
    /// False when the output is closed.
    fn show(&mut self, out: &mut impl Write, event: GenerationEvent) -> bool {
        let r = match event {
            GenerationEvent::Reasoning(piece) => {
                let open = if self.in_thought {
                    ""
                } else if self.dim {
                    "\x1b[2m(thinking) "
                } else {
                    "<think>"
                };
                self.in_thought = true;
                write!(out, "{open}{piece}")
            }
            GenerationEvent::Text(piece) => {
                let close = self.close_thought();
                write!(out, "{close}{piece}")
            }
            GenerationEvent::ToolCall(call) => {
                let close = self.close_thought();
                writeln!(out, "{close}[tool call {}] {}", call.id, call_json(&call))
            }
        };
        match r.and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                // A closed pipe ends the command; another error (a full disk) too, said once.
                if !crate::out::is_closed(&e) {
                    eprintln!("pocket: stdout: {e}");
                }
                self.closed = true;
                false
            }
        }
    }

    /// End the process quietly if the output closed during the answer.
    fn end_if_closed(&self) {
        if self.closed {
            crate::out::closed();
        }
    }

    fn close_thought(&mut self) -> &'static str {
        if !std::mem::take(&mut self.in_thought) {
            ""
        } else if self.dim {
            "\x1b[0m\n\n"
        } else {
            "</think>\n\n"
        }
    }
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
