//! `pocket`: the command-line face of the engine.
//!
//! Every subcommand reports failure as one line on stderr and a non-zero exit
//! status; nothing here panics on bad input.

mod args;
mod bench;
mod bench_kernels;
mod fingerprint;
mod inspect;
mod logits;
mod npy;
mod perplexity;
mod run;
mod template;
mod tokenize;

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
  tokenize --model F [--json] [--no-bos] [--no-special] TEXT
                                      token ids of a text (--help for more)
  template (--model F | --template F.jinja) --messages JSON [--add-generation-prompt] [--var K=V]
                                      render a chat prompt exactly
  run --model F --prompt TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
      [--repeat-penalty R] [--seed S] [--threads N] [--json]
                                      complete a prompt, streaming the text
  chat --model F [--system TEXT]      interactive chat with the model's template
  bench --model F [-p 128] [-n 32] [--threads N] [--draws 5] [--json]
                                      prefill and decode speed, fixed protocol
  perplexity --model F --file TEXT [--ctx 128] [--json] [--save-logits F] [--kl-base F]
                                      perplexity as llama-perplexity computes it
  bench-kernels [--threads N] [--json] [--quick]
                                      matvec throughput per format and ISA path vs read bandwidth
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
        "tokenize" => tokenize::run(rest),
        "template" => template::run(rest),
        "run" => run::run(rest),
        "chat" => run::chat(rest),
        "bench" => bench::run(rest),
        "perplexity" => perplexity::run(rest),
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
