//! docs/cli-reference.md is `pocket --help` and every command's `--help`,
//! as the built binary prints them: a flag or command added without
//! regenerating it fails here. Regenerate with
//! `POCKET_UPDATE_DOCS=1 cargo test -p pocket-cli --test cli_reference`.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pocket")).args(args).env("COLUMNS", "100").output().expect("run pocket");
    assert!(out.status.success(), "pocket {args:?} failed");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

fn commands(top: &str) -> Vec<String> {
    let list = top.split("Commands:").nth(1).expect("a command list").split("\n\n").next().unwrap_or_default();
    list.lines().filter_map(|l| l.split_whitespace().next()).filter(|c| *c != "help").map(str::to_string).collect()
}

fn reference() -> String {
    let top = help(&["--help"]);
    let mut doc = String::from(
        "# `pocket` command reference\n\n\
         Generated from the binary's help by `examples/cli/tests/cli_reference.rs`\n\
         (`POCKET_UPDATE_DOCS=1 cargo test -p pocket-cli --test cli_reference`); a test\n\
         fails when it is stale. A guide to the commands: [cli.md](cli.md).\n\n",
    );
    doc += &format!("## pocket\n\n```text\n{}\n```\n", top.trim_end());
    for command in commands(&top) {
        doc += &format!("\n## pocket {command}\n\n```text\n{}\n```\n", help(&[&command, "--help"]).trim_end());
    }
    doc
}

#[test]
fn the_cli_reference_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli-reference.md");
    let want = reference();
    if std::env::var_os("POCKET_UPDATE_DOCS").is_some() {
        std::fs::write(path, &want).expect("write docs/cli-reference.md");
        return;
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/cli-reference.md is stale: regenerate it with \
         `POCKET_UPDATE_DOCS=1 cargo test -p pocket-cli --test cli_reference`"
    );
}
