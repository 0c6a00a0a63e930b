//! Standard output for every command: one writer, and a closed pipe is the
//! end of the command, not an error.
//!
//! `pocket inspect FILE | head` closes the pipe after ten lines; Rust ignores
//! SIGPIPE, so the next write fails with `BrokenPipe` and `println!` would
//! panic. Every command writes through `outln!`/`out!` (or [`check`] for its
//! own buffered writes), which end the process quietly with status 0 there,
//! as `head`'s users expect; any other write error is the command's error.

use std::fmt;
use std::io::{self, Write};

/// Write formatted text to standard output (the `out!`/`outln!` macros).
pub fn emit(args: fmt::Arguments) {
    let mut stdout = io::stdout().lock();
    if let Err(e) = check(stdout.write_fmt(args)) {
        // Not a closed pipe (a full disk behind a redirection): say it once and stop.
        eprintln!("pocket: {e}");
        std::process::exit(1);
    }
}

/// The result of a write to standard output: a closed pipe ends the process
/// (status 0); another error is returned, naming stdout.
pub fn check<T>(result: io::Result<T>) -> Result<T, String> {
    match result {
        Ok(v) => Ok(v),
        Err(e) if is_closed(&e) => closed(),
        Err(e) => Err(format!("stdout: {e}")),
    }
}

/// Whether a write error means the reader went away.
pub fn is_closed(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// The reader closed standard output: nothing more can be shown, so the
/// command is over.
pub fn closed() -> ! {
    std::process::exit(0)
}

/// `println!` through [`emit`].
macro_rules! outln {
    () => { $crate::out::emit(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::emit(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` through [`emit`].
#[allow(unused_macros)]
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::emit(format_args!($($arg)*)) };
}
