//! `pocket`: the command-line face of the engine.
//!
//! Every subcommand reports failure as one line on stderr and a non-zero exit
//! status; nothing here panics on bad input. Each subcommand's file declares
//! its options as a clap struct, so its help and its parsing cannot disagree.

// First: its `out!`/`outln!` macros serve every module below.
#[macro_use]
mod out;
mod bench;
mod bench_kernels;
mod bench_structured;
mod bench_verify;
mod fingerprint;
mod gpu_info;
mod imatrix;
mod inspect;
mod logits;
mod memory;
mod npy;
mod perplexity;
mod pull;
mod quantize;
mod run;
mod speculate;
mod split;
mod structure;
mod template;
mod tokenize;
mod transcript;

use std::process::ExitCode;
use std::sync::Mutex;

use clap::{CommandFactory, Parser, Subcommand};

/// The message of a panic, kept by the hook for the one-line report.
static PANIC_MESSAGE: Mutex<Option<String>> = Mutex::new(None);

/// pocket — on-device LLM engine
#[derive(Parser)]
#[command(name = "pocket", disable_version_flag = true)]
#[command(after_help = "`pocket COMMAND --help` lists a command's options and their defaults.")]
// A flag given twice keeps its last value, as scripts that append to a
// command line expect; repeatable flags (--stop, --var) still collect.
#[command(args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

/// One variant per subcommand; each file declares its own options.
#[derive(Subcommand)]
enum Command {
    Inspect(inspect::Args),
    Logits(logits::Args),
    Tokenize(tokenize::Args),
    Template(template::Args),
    Run(run::RunArgs),
    Chat(run::ChatArgs),
    Bench(bench::Args),
    Perplexity(perplexity::Args),
    BenchKernels(bench_kernels::Args),
    GpuInfo(gpu_info::Args),
    Imatrix(imatrix::Args),
    Quantize(quantize::Args),
    Pull(pull::Args),
    Split(split::SplitArgs),
    Merge(split::MergeArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return parse_failure(e),
    };
    // A bug must still end as one line on stderr, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut m) = PANIC_MESSAGE.lock() {
            *m = Some(info.to_string().replace('\n', " "));
        }
    }));
    let result = std::panic::catch_unwind(|| run(cli)).unwrap_or_else(|_| {
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

fn run(cli: Cli) -> Result<(), String> {
    let Some(command) = cli.command else {
        return out::check(Cli::command().print_help());
    };
    match command {
        Command::Inspect(a) => inspect::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Template(a) => template::run(a),
        Command::Run(a) => run::run(a),
        Command::Chat(a) => run::chat(a),
        Command::Bench(a) => bench::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::BenchKernels(a) => bench_kernels::run(a),
        Command::GpuInfo(a) => gpu_info::run(a),
        Command::Imatrix(a) => imatrix::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Pull(a) => pull::run(a),
        Command::Split(a) => split::split(a),
        Command::Merge(a) => split::merge(a),
    }
}

/// Help goes to stdout with success; a usage error becomes the same one line
/// on stderr as every other failure.
fn parse_failure(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        // `--help`/`--version` to a closed pipe is no error either.
        let _ = out::check(e.print());
        return ExitCode::SUCCESS;
    }
    eprintln!("pocket: {}", one_line(&e.to_string()));
    ExitCode::FAILURE
}

/// clap's error text cut to its first paragraph, on one line: the paragraph
/// names the flag and the reason (a list of missing flags spans several lines);
/// the usage and "For more information" trailers after it are dropped.
fn one_line(rendered: &str) -> String {
    let text = rendered.trim_start().strip_prefix("error: ").unwrap_or(rendered);
    let first = text.split("\n\n").next().unwrap_or_default();
    first.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Threads to use when the user does not say: the performance cores where
/// the OS tells them apart, else every core (core's rule, as sessions use).
pub fn default_threads() -> usize {
    pocket_core::threads::default_threads().threads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_definition_is_consistent() {
        // clap's own check: no clashing names or shorts, groups name real flags.
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_help() {
        for cmd in Cli::command().get_subcommands() {
            for arg in cmd.get_arguments() {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                assert!(!help.is_empty() && !help.contains('\n'), "{} {}: {help:?}", cmd.get_name(), arg.get_id());
            }
        }
    }

    #[test]
    fn errors_render_as_one_line() {
        let e = Cli::try_parse_from(["pocket", "run", "--prompt", "hi"]).err().unwrap();
        assert_eq!(one_line(&e.to_string()), "the following required arguments were not provided: --model <FILE>");
        let e = Cli::try_parse_from(["pocket", "inspect", "--nope", "f"]).err().unwrap();
        assert_eq!(one_line(&e.to_string()), "unexpected argument '--nope' found");
    }
}
