//! Desktop and tests: stderr, only when asked for with `POCKET_LOG=LEVEL`.

use log::{LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        eprintln!("[pocket {} {}] {}", record.level(), record.target(), record.args());
    }

    fn flush(&self) {}
}

pub(super) fn logger() -> Option<(&'static dyn Log, LevelFilter)> {
    let level: LevelFilter = std::env::var("POCKET_LOG").ok()?.parse().ok()?;
    Some((&Stderr, level))
}
