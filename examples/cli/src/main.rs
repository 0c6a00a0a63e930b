//! `pocket`: the command-line face of the engine.
//!
//! Every subcommand reports failure as one line on stderr and a non-zero exit
//! status; nothing here panics on bad input.

mod args;
mod bench_kernels;
mod inspect;
mod logits;
mod npy;

use std::process::ExitCode;
use std::sync::Mutex;

/// The message of a panic, kept by the hook for the one-line report.
static PANIC_MESSAGE: Mutex<Option<String>> = Mutex::new(None);

const USAGE: &str = "\
pocket — on-device LLM engine

usage: pocket <command> [options]

commands:
  inspect FILE [--json] [--tensors]   what a GGUF file holds
  logits --model F --tokens 1,2,3 (--out F.npy | --top K [--json]) [--kv f32|f16] [--threads N]
                                      teacher-forced logits of every position
  bench-kernels [--threads N] [--json] matvec GB/s per weight format and kernel path
  help                                this text
";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // A bug must still end as one line on stderr, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut m) = PANIC_MESSAGE.lock() {
            *m = Some(info.to_string().replace('\n', " "));
        }
    }));
    let result = std::panic::catch_unwind(|| run(&argv)).unwrap_or_else(|_| {
        let msg = PANIC_MESSAGE.lock().ok().and_then(|mut m| m.take()).unwrap_or_default();
        Err(format!("internal error: {msg}"))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pocket: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(argv: &[String]) -> Result<(), String> {
    let Some(cmd) = argv.first() else {
        print!("{USAGE}");
        return Ok(());
    };
    let rest = &argv[1..];
    match cmd.as_str() {
        "inspect" => inspect::run(rest),
        "bench-kernels" => bench_kernels::run(rest),
        "logits" => logits::run(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command '{other}' (try `pocket help`)")),
    }
}

/// Threads to use when the user does not say: every core the OS offers.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
