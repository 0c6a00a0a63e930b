//! `cargo xtask <command>`: repository tooling (model synthesis, bindings,
//! packaging). Each command lives in its own module.

mod android;
mod apple;
mod bindings;
mod budget;
mod compare;
mod elf;
mod insn_profile;
mod llama;
mod pagesize;
mod sha256;
mod synth;
mod util;
mod zip;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  llama-source
      download and unpack llama.cpp's source tree (the llama-cpp-python sdist) into the
      cache if needed, and print its path (tests read its vocabulary corpora)
  llama-logits --model FILE --tokens IDS --out FILE.npy
      llama.cpp's teacher-forced logits for one batch of token ids (the fixtures' settings),
      the reference for tiny models made by synth-model
  synth-model --arch qwen35moe|qwen3moe|gemma4|lfm2moe|granitehybrid|gpt-oss|olmoe|ernie4_5-moe
              --geometry full|mid|e2b|tiny --quant PRESET --out FILE [--mtp]
      a GGUF with a real model's exact geometry, random valid weights in the type mix of
      PRESET, any of pocket quantize's (q2_k, q4_k_m, iq2_xxs, iq4_xs, mxfp4_moe, ...)
  bench-compare --model FILE [--threads N] [-p 128] [-n 32] [--draws 5] [--pocket BIN] [--isa avx2]
      llama.cpp and pocket alternately on one file, with the roofline; both decode varied tokens after
      the prompt (llama-bench's generation test at depth -p)
  bench-budget --model FILE --limit 6G [--threads 2] [-p 16] [-n 32] [--draws 3] [--budget SIZE]
               [--engines llama,mapped,budget] [--replay] [--json OUT] [--pocket BIN]
               [--routing local:repeat=0.5,zipf=1.1,seed=1]
      llama.cpp (mmap), pocket mapped and pocket with --memory-budget (default a little under
      the limit) inside a memory cgroup of --limit, caches dropped before each draw (root);
      pocket varies its tokens as llama-bench does (--replay: one prompt, one repeated token);
      --routing: pocket's MoE layers route with stated locality (the POCKET_ROUTING hook)
  insn-count --model FILE [-p 16] [-n 8] [--no-llama] [--by-function]
      aarch64 instructions per decoded / prompt token under qemu (pocket and llama.cpp);
      --by-function: each one's decode split by function, the top 25 printed
  bindings swift|kotlin|python [--release] [--out DIR]
      generate bindings in library mode from the host build of pocket_ffi; without --out,
      Swift goes to ios/Sources/Pocket, Kotlin to android/pocket/src/main/kotlin,
      Python (with the library) to target/bindings/python
  test-bindings python [PYTEST ARGS] | kotlin | generated
      Python tests (pytest), Kotlin tests on the JVM (kotlinc + JNA), or a check that the
      committed Swift/Kotlin bindings are up to date
  staticlibs [--profile release] [--quick] [--no-gpu] [--no-tls] [--target-dir DIR] [TARGET...]
      cargo rustc --crate-type staticlib of pocket-ffi for each target
      (default: aarch64-apple-ios and the three Android targets; --quick: no LTO, 16 codegen units;
      --no-tls: downloads over http:// only, for machines without Xcode or the NDK: ring compiles C)
  xcframework [--profile mobile] [--zip]
      iOS device + simulator (arm64 and x86_64, lipo) static libraries, headers and Swift
      bindings; ios/PocketFFI.xcframework via xcodebuild on macOS (elsewhere the commands
      are printed); --zip: the release zip and its SwiftPM checksum for Package.swift
  aar [--profile mobile]
      the Android AAR through Gradle + cargo-ndk when the NDK is present, checked for 16 KB
      pages and published with its POM to android/build/maven; else the three Android
      static libraries and what to run where the NDK is
  check-16k FILE...
      whether every LOAD segment of every .so (a library, or those in an AAR / APK) is
      aligned for 16 KB pages (p_align >= 16384), as Android 15+ devices need
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("llama-source") => llama::source().map(|p| println!("{}", p.display())),
        Some("llama-logits") => llama::logits_command(rest),
        Some("synth-model") => synth::run(rest),
        Some("bench-compare") => compare::bench_compare(rest),
        Some("bench-budget") => budget::bench_budget(rest),
        Some("insn-count") => compare::insn_count(rest),
        Some("bindings") => bindings::command(rest),
        Some("test-bindings") => bindings::test_command(rest),
        Some("staticlibs") => android::staticlibs_command(rest),
        Some("xcframework") => apple::command(rest),
        Some("aar") => android::aar_command(rest),
        Some("check-16k") => pagesize::command(rest),
        Some("help") | Some("--help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command '{other}'\n{USAGE}")),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}
