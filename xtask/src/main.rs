//! `cargo xtask <command>`: repository tooling (model synthesis, benchmarks,
//! packaging). Each command lives in its own module.

mod compare;
mod llama;
mod synth;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  synth-model --arch qwen35moe|qwen3moe --geometry full|mid --quant q2_k|q4_k_m --out FILE
      a GGUF with a real model's exact geometry, random valid weights
  bench-compare --model FILE [--threads N] [-p 128] [-n 32] [--draws 5]
      llama.cpp and pocket alternately on one file, with the roofline
  insn-count --model FILE [-p 16] [-n 8]
      aarch64 instructions per decoded / prompt token under qemu (pocket and llama.cpp)
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("synth-model") => synth::run(&args[1..]),
        Some("bench-compare") => compare::bench_compare(&args[1..]),
        Some("insn-count") => compare::insn_count(&args[1..]),
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
