//! The command line itself, through the built binary: help, the one-line
//! usage errors, sampler values refused by core's checks before the model
//! loads, and the flag forms scripts already use.

mod common;

use common::{fixtures, ok, pocket};
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::DEFAULT_SEED;

fn model() -> String {
    fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf").to_string_lossy().into_owned()
}

/// Run `pocket`, require failure with exactly one `pocket: ` line on stderr
/// and nothing on stdout; return that line.
fn one_line_error(args: &[&str]) -> String {
    let out = pocket(args);
    assert!(!out.status.success(), "pocket {args:?} succeeded");
    assert!(out.stdout.is_empty(), "pocket {args:?} printed {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8(out.stderr).expect("utf-8 stderr");
    assert_eq!(err.trim_end().lines().count(), 1, "pocket {args:?}: {err}");
    assert!(err.starts_with("pocket: "), "{err}");
    err
}

#[test]
fn out_of_range_sampler_values_name_their_flag() {
    let m = model();
    for (flag, value, reason) in [
        ("--top-p", "1.5", "does not lie in [0, 1]"),
        ("--temp", "-1", "is negative"),
        ("--temp", "nan", "not a finite number"),
        ("--min-p", "2", "does not lie in [0, 1]"),
        ("--temp", "-inf", "not a finite number"),
        ("--repeat-penalty", "0", "not positive"),
        ("--presence-penalty", "inf", "not a finite number"),
    ] {
        let err = one_line_error(&["run", "--model", &m, "--prompt", "hi", flag, value]);
        assert!(err.contains(&format!("'{value}' for '{flag} ")), "{flag} {value}: {err}");
        assert!(err.contains(reason), "{flag} {value}: {err}");
    }
    let err = one_line_error(&["chat", "--model", &m, "--top-p=1.5"]);
    assert!(err.contains("'--top-p <P>'"), "{err}");
}

#[test]
fn usage_mistakes_are_one_line() {
    let m = model();
    assert!(one_line_error(&["run", "--prompt", "hi"]).contains("--model"));
    assert!(one_line_error(&["run", "--model", &m, "--prompt", "hi", "--nope"]).contains("'--nope'"));
    assert!(one_line_error(&["run", "--model", &m, "--prompt", "hi", "-n", "x"]).contains("'-n <N>'"));
    assert!(one_line_error(&["run", "--model", &m, "--prompt", "hi", "--kv", "f8"]).contains("'--kv <TYPE>'"));
    assert!(one_line_error(&["logits", "--model", &m, "--tokens", "1,2"]).contains("--top"));
    assert!(one_line_error(&["logits", "--model", &m, "--tokens", "1,x", "--top", "1"]).contains("'--tokens <IDS>'"));
    assert!(one_line_error(&["template", "--messages", "[]"]).contains("--template"));
    assert!(one_line_error(&["inspect"]).contains("FILE"));
    assert!(one_line_error(&["nope"]).contains("'nope'"));
}

#[test]
fn help_lists_every_command_and_the_flags_with_core_defaults() {
    let top = ok(&[]);
    for cmd in ["inspect", "logits", "tokenize", "template", "run", "chat", "bench", "perplexity", "bench-kernels"] {
        assert!(top.contains(&format!("\n  {cmd} ")), "pocket lists no {cmd}: {top}");
        assert!(ok(&[cmd, "--help"]).contains("Usage: pocket "), "{cmd} --help");
    }
    assert_eq!(ok(&["help"]), top);
    assert_eq!(ok(&["--help"]), top);
    let run = ok(&["run", "--help"]);
    assert_eq!(ok(&["help", "run"]), run);
    let d = SamplerConfig::default();
    for (flag, default) in [
        ("--top-p <P>", d.top_p.to_string()),
        ("--temp <T>", d.temperature.to_string()),
        ("--min-p <P>", d.min_p.to_string()),
        ("--top-k <K>", d.top_k.to_string()),
        ("--seed <S>", DEFAULT_SEED.to_string()),
    ] {
        let line = run.lines().find(|l| l.trim_start().starts_with(flag)).unwrap_or_else(|| panic!("{flag}: {run}"));
        assert!(line.ends_with(&format!("[default: {default}]")), "{line}");
    }
}

#[test]
fn value_forms_scripts_use_still_parse() {
    // `--flag=value`, a repeated flag keeping its last value (-n), repeatable
    // --stop, and a negative value where one is valid.
    let m = model();
    let out = ok(&[
        "run",
        &format!("--model={m}"),
        "--prompt=The capital of France",
        "-n",
        "5",
        "-n",
        "2",
        "--temp=0",
        "--presence-penalty",
        "-0.5",
        "--stop",
        "zzz",
        "--stop=yyy",
        "--ignore-eos",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(v["tokens"].as_array().unwrap().len(), 2, "{v}");
}

#[test]
fn bench_kernels_measures_prefill_products_with_tokens() {
    // A tiny run: every case reports its multiply-adds per second for the
    // given token count (and, as ever, GB/s of weights).
    let args = ["bench-kernels", "--formats", "q4_k,f32", "--isa", "scalar", "--threads", "1", "--time-ms", "1"];
    let args = [&args[..], &["--working-set-mib", "1", "--head-rows", "16", "--tokens", "5", "--json"]].concat();
    let v: serde_json::Value = serde_json::from_str(&ok(&args)).expect("JSON");
    assert_eq!(v["tokens"], 5);
    let cases = v["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 6, "two formats x three shapes: {v}");
    for c in cases {
        assert!(c["gmacs"].as_f64().is_some_and(|g| g > 0.0) && c["gbps"].as_f64().is_some_and(|g| g > 0.0), "{c}");
    }
    let table = ok(&args[..args.len() - 1]);
    assert!(table.starts_with("5 tokens per product") && table.contains("GMAC/s"), "{table}");
}
