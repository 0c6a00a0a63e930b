//! `cargo xtask bench-compare`: Pocket and llama.cpp on the same file and
//! thread count, alternating draw by draw, with the read bandwidth measured
//! in the same run and each engine's fraction of the roofline.
//!
//! `cargo xtask insn-count`: aarch64 instructions per decoded and per prompt
//! token under qemu (deterministic), for Pocket and for llama.cpp builds;
//! with `--by-function`, each one's decode split by function (`insn_profile`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pocket_core::gguf::{GgufFile, Summary};
use pocket_core::threads::ThreadPool;

use crate::insn_profile::{self, Profile};
use crate::llama;

struct Opts {
    model: PathBuf,
    threads: usize,
    p: usize,
    n: usize,
    draws: usize,
    /// insn-count: also count llama.cpp (`--no-llama`: Pocket only).
    llama: bool,
    /// bench-compare: this `pocket` binary instead of a release build of the
    /// working tree (a machine without cargo, or a build frozen for a long run).
    pocket: Option<PathBuf>,
    /// bench-compare: both engines on one lower instruction set (`avx2`):
    /// Pocket with `POCKET_ISA`, llama.cpp built for it (not native).
    isa: Option<String>,
    /// insn-count: also the decode's instructions by function.
    by_function: bool,
}

fn parse(args: &[String], default_p: usize, default_n: usize) -> Result<Opts, String> {
    let mut o = Opts {
        model: PathBuf::new(),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        p: default_p,
        n: default_n,
        draws: 5,
        llama: true,
        pocket: None,
        isa: None,
        by_function: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--model" => o.model = PathBuf::from(val()?),
            "--threads" => o.threads = val()?.parse().map_err(|_| "bad --threads")?,
            "-p" => o.p = val()?.parse().map_err(|_| "bad -p")?,
            "-n" => o.n = val()?.parse().map_err(|_| "bad -n")?,
            "--draws" => o.draws = val()?.parse().map_err(|_| "bad --draws")?,
            "--no-llama" => o.llama = false,
            "--pocket" => o.pocket = Some(PathBuf::from(val()?)),
            "--isa" => o.isa = Some(val()?),
            "--by-function" => o.by_function = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.model.as_os_str().is_empty() {
        return Err("--model is required".into());
    }
    Ok(o)
}

fn output(cmd: &mut Command) -> Result<String, String> {
    eprintln!("+ {cmd:?}");
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn pocket_release() -> Result<PathBuf, String> {
    let root = llama::workspace_root();
    llama::run(Command::new("cargo").current_dir(&root).args(["build", "--quiet", "--release", "-p", "pocket-cli"]))?;
    Ok(root.join("target/release/pocket"))
}

/// One Pocket draw: (prefill t/s, decode t/s, peak RSS bytes, private RSS bytes).
fn pocket_draw(exe: &Path, o: &Opts) -> Result<(f64, f64, u64, u64), String> {
    let mut cmd = Command::new(exe);
    if let Some(isa) = &o.isa {
        cmd.env("POCKET_ISA", isa);
    }
    // Varied tokens, as llama-bench's generation test feeds random ones: one
    // token repeated routes a MoE to the same experts at every step.
    let out = output(cmd.args(["bench", "--json", "--varied", "--draws", "1"]).arg("--model").arg(&o.model).args([
        "-p",
        &o.p.to_string(),
        "-n",
        &o.n.to_string(),
        "--threads",
        &o.threads.to_string(),
    ]))?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("pocket bench output: {e}"))?;
    Ok((
        v["prefill_tps"]["mean"].as_f64().unwrap_or(0.0),
        v["decode_tps"]["mean"].as_f64().unwrap_or(0.0),
        v["memory"]["peak_rss_bytes"].as_u64().unwrap_or(0),
        v["memory"]["anon_rss_bytes"].as_u64().unwrap_or(0),
    ))
}

/// One llama-bench draw (its own warm-ups included): (pp t/s, tg t/s, peak
/// RSS bytes as GNU time reports it, 0 without it).
///
/// `pocket bench` decodes after its prompt, so the generation test runs at
/// the prompt's depth (`-d P`) in a second invocation: llama-bench's plain
/// `tg` starts from an empty cache, which flatters it against Pocket as the
/// prompt grows (attention over P cached positions per decoded token).
fn llama_draw(bin: &Path, o: &Opts, big: bool) -> Result<(f64, f64, u64), String> {
    let (p, n) = (o.p.to_string(), o.n.to_string());
    let (pp, pp_rss) = if o.p > 0 { llama_bench(bin, o, big, &["-p", &p, "-n", "0"])? } else { (0.0, 0) };
    let (tg, tg_rss) = if o.n > 0 { llama_bench(bin, o, big, &["-p", "0", "-n", &n, "-d", &p])? } else { (0.0, 0) };
    Ok((pp, tg, pp_rss.max(tg_rss)))
}

/// One llama-bench invocation of a single test: (t/s, peak RSS bytes).
fn llama_bench(bin: &Path, o: &Opts, big: bool, test: &[&str]) -> Result<(f64, u64), String> {
    let rss_file = std::env::temp_dir().join(format!("pocket-llama-rss-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&rss_file);
    let time = Path::new("/usr/bin/time");
    let mut cmd = if time.exists() {
        let mut c = Command::new(time);
        c.args(["-f", "%M", "-o"]).arg(&rss_file).arg(bin.join("llama-bench"));
        c
    } else {
        Command::new(bin.join("llama-bench"))
    };
    cmd.env("LD_LIBRARY_PATH", bin).arg("-m").arg(&o.model).args([
        "-t",
        &o.threads.to_string(),
        "-r",
        "1",
        "-o",
        "json",
    ]);
    cmd.args(test);
    if big {
        // Repacking copies the weights: on files over about half the RAM it thrashes.
        cmd.args(["-lm", "mmap", "--repack", "0"]);
    }
    let out = output(&mut cmd)?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("llama-bench output: {e}"))?;
    let tests = v.as_array().map_or(&[][..], |a| a.as_slice());
    let [test] = tests else {
        return Err(format!("llama-bench {test:?}: expected one test in its output, got {}", tests.len()));
    };
    let tps = test["avg_ts"].as_f64().ok_or("llama-bench output: no avg_ts")?;
    let rss_kib = std::fs::read_to_string(&rss_file).ok().and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(0);
    Ok((tps, rss_kib * 1024))
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (m, var.sqrt())
}

fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("MemTotal:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()))
        .map_or(0, |k| k * 1024)
}

pub fn bench_compare(args: &[String]) -> Result<(), String> {
    let o = parse(args, 128, 32)?;
    let summary = Summary::of(&GgufFile::open(&o.model).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let bin = llama::host_build(o.isa.as_deref())?;
    let pocket = match &o.pocket {
        Some(exe) => exe.clone(),
        None => pocket_release()?,
    };
    let big = summary.file_bytes > total_memory() / 2;

    // Read bandwidth, same machine, same moment: a buffer far larger than the caches.
    let bw = {
        let pool = ThreadPool::new(o.threads);
        let words: Vec<u64> = (0..(1usize << 30) / 8).map(|i| i as u64).collect();
        pocket_core::kernels::bench::read_bandwidth(&pool, &words, Duration::from_millis(500))
    };
    let roofline = bw * 1e9 / summary.bytes_per_token_estimate as f64;

    let mut rows = Vec::new();
    for d in 0..o.draws {
        let l = llama_draw(&bin, &o, big)?;
        let p = pocket_draw(&pocket, &o)?;
        eprintln!("draw {}: llama pp {:.2} tg {:.2} | pocket pp {:.2} tg {:.2}", d + 1, l.0, l.1, p.0, p.1);
        rows.push((l, p));
    }
    type Row = ((f64, f64, u64), (f64, f64, u64, u64));
    let col = |f: &dyn Fn(&Row) -> f64| mean_sd(&rows.iter().map(f).collect::<Vec<_>>());
    let (lpp, ltg) = (col(&|r| r.0 .0), col(&|r| r.0 .1));
    let (ppp, ptg) = (col(&|r| r.1 .0), col(&|r| r.1 .1));
    let (rpp, rtg) = (col(&|r| r.1 .0 / r.0 .0), col(&|r| r.1 .1 / r.0 .1));
    println!(
        "model      {} ({} {}, {:.2} GB)",
        o.model.display(),
        summary.architecture,
        summary.quantization,
        summary.file_bytes as f64 / 1e9
    );
    println!(
        "threads    {}   draws {}   llama.cpp flags {}   isa {}",
        o.threads,
        o.draws,
        if big { "-lm mmap --repack 0" } else { "(default)" },
        o.isa.as_deref().unwrap_or("native (Pocket: its best table)")
    );
    println!(
        "bandwidth  {bw:.1} GB/s read; {:.2} GB per decoded token (est.) -> roofline {roofline:.2} t/s",
        summary.bytes_per_token_estimate as f64 / 1e9
    );
    println!("{:<10} {:>18} {:>18} {:>14}", "", "llama.cpp", "pocket", "ratio");
    println!(
        "{:<10} {:>11.2} ± {:<5.2} {:>11.2} ± {:<5.2} {:>7.2} ± {:<4.2}",
        format!("pp{}", o.p),
        lpp.0,
        lpp.1,
        ppp.0,
        ppp.1,
        rpp.0,
        rpp.1
    );
    println!(
        "{:<10} {:>11.2} ± {:<5.2} {:>11.2} ± {:<5.2} {:>7.2} ± {:<4.2}",
        format!("tg{}@d{}", o.n, o.p),
        ltg.0,
        ltg.1,
        ptg.0,
        ptg.1,
        rtg.0,
        rtg.1
    );
    println!("roofline   llama.cpp {:.0} %   pocket {:.0} %", 100.0 * ltg.0 / roofline, 100.0 * ptg.0 / roofline);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let max = |f: &dyn Fn(&Row) -> u64| rows.iter().map(f).max().unwrap_or(0);
    println!(
        "peak RSS   llama.cpp {:.2} GiB   pocket {:.2} GiB (of which private {:.2} GiB; the rest is mapped file pages)",
        gib(max(&|r| r.0 .2)),
        gib(max(&|r| r.1 .2)),
        gib(max(&|r| r.1 .3))
    );
    Ok(())
}

/// Guest instructions of one qemu run (by function too when `by_function`).
fn count(plugin: &Path, by_function: bool, cpu: &str, exe: &Path, args: &[String]) -> Result<Profile, String> {
    let out = std::env::temp_dir().join(format!("pocket-insns-{}.txt", std::process::id()));
    let by = if by_function { ",by_function=1" } else { "" };
    let mut cmd = Command::new("qemu-aarch64");
    cmd.args(["-L", "/usr/aarch64-linux-gnu", "-cpu", cpu])
        .arg("-plugin")
        .arg(format!("{},out={}{by}", plugin.display(), out.display()))
        .arg(exe)
        .args(args);
    output(&mut cmd)?;
    Profile::read(&out)
}

pub fn insn_count(args: &[String]) -> Result<(), String> {
    let mut o = parse(args, 16, 8)?;
    o.threads = 1;
    let root = llama::workspace_root();
    // The plugin and Pocket's aarch64 build.
    let plugin = root.join("target/libinsn_count.so");
    llama::run(
        Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&plugin)
            .arg(root.join("tools/insn-count/insn_count.c")),
    )?;
    llama::run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--quiet",
        "--release",
        "--target",
        "aarch64-unknown-linux-gnu",
        "-p",
        "pocket-cli",
    ]))?;
    let pocket = root.join("target/aarch64-unknown-linux-gnu/release/pocket");
    let m = o.model.to_string_lossy().into_owned();
    let pb = |p: usize, n: usize| -> Vec<String> {
        ["bench", "--model", &m, "-p", &p.to_string(), "-n", &n.to_string(), "--threads", "1", "--draws", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    // bench runs a warm-up and one draw: every token counted twice. Marginal costs:
    // decode = (p, n) - (p, 0); prefill = (2p, 0) - (p, 0).
    let (p, n) = (o.p, o.n);
    let by = o.by_function;
    // The decode profiles, printed after the table.
    let mut profiles = Vec::new();
    println!("{:<26} {:>16} {:>16}", "", "decode insn/tok", "prompt insn/tok");
    for (label, cpu) in [("pocket (-cpu max: i8mm)", "max"), ("pocket (-cpu cortex-a76: dotprod)", "cortex-a76")] {
        let base = count(&plugin, by, cpu, &pocket, &pb(p, 0))?;
        let dec = count(&plugin, by, cpu, &pocket, &pb(p, n))?;
        let pre = count(&plugin, false, cpu, &pocket, &pb(2 * p, 0))?;
        let per_token = (dec.total - base.total) as f64 / (2 * n) as f64;
        println!(
            "{:<26} {:>14.2}M {:>14.2}M",
            label,
            per_token / 1e6,
            (pre.total - base.total) as f64 / (2 * p) as f64 / 1e6
        );
        if by {
            profiles.push((label, insn_profile::per_token(&dec, &base, 2 * n), per_token));
        }
    }
    for i8mm in [false, true].into_iter().filter(|_| o.llama) {
        let exe = llama::aarch64_build(i8mm)?;
        let lb = |pp: usize, nn: usize| -> Vec<String> {
            ["-m", &m, "-t", "1", "-p", &pp.to_string(), "-n", &nn.to_string(), "-r", "1"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        // llama-bench warms up with the whole prompt but a single generated
        // token, then runs the test once: n more tokens decode n more times,
        // p more prompt tokens are evaluated twice.
        let d1 = count(&plugin, by, "max", &exe, &lb(0, n))?;
        let d2 = count(&plugin, by, "max", &exe, &lb(0, 2 * n))?;
        let p1 = count(&plugin, false, "max", &exe, &lb(p, 0))?;
        let p2 = count(&plugin, false, "max", &exe, &lb(2 * p, 0))?;
        let label = if i8mm { "llama.cpp (dotprod+i8mm)" } else { "llama.cpp (dotprod)" };
        let per_token = (d2.total - d1.total) as f64 / n as f64;
        println!(
            "{:<26} {:>14.2}M {:>14.2}M",
            label,
            per_token / 1e6,
            (p2.total - p1.total) as f64 / (2 * p) as f64 / 1e6
        );
        if by {
            profiles.push((label, insn_profile::per_token(&d2, &d1, n), per_token));
        }
    }
    for (label, rows, per_token) in &profiles {
        println!();
        insn_profile::print(&format!("{label} decode"), rows, *per_token, 25);
    }
    Ok(())
}
