//! `cargo xtask <command>`: repository tooling (model synthesis, benchmarks,
//! packaging). Each command lives in its own module.

mod synth;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  synth-model --arch qwen35moe|qwen3moe --geometry full|mid --quant q2_k|q4_k_m --out FILE
      a GGUF with a real model's exact geometry, random valid weights
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("synth-model") => synth::run(&args[1..]),
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
