//! Helpers shared by the CLI test files: the fixture store and the built
//! `pocket` binary.

// Each test file compiles its own copy and uses some of the helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The fixture store (`POCKET_FIXTURES`, default `../shared/fixtures`); absent is a failure.
pub fn fixtures() -> PathBuf {
    let dir = match std::env::var_os("POCKET_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    assert!(dir.join("manifest.json").is_file(), "fixture store not found at {}", dir.display());
    dir
}

/// Run the built `pocket` binary.
pub fn pocket(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocket")).args(args).output().expect("run pocket")
}

/// Run `pocket`, require success, return its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = pocket(args);
    assert!(out.status.success(), "pocket {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}
