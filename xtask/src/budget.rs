//! `cargo xtask bench-budget`: the model inside a memory cgroup of a phone's
//! size, as an app would meet it after launch: llama.cpp (mmap, no repack),
//! Pocket mapped, and Pocket with `--memory-budget` a little under the
//! limit, alternating draw by draw, the page cache dropped before each
//! draw. The cgroup counts the page cache as a phone counts it against an
//! app. Needs root (cgroup v1 `memory.limit_in_bytes` or v2 `memory.max`).
//!
//! Prints t/s, the cgroup's peak usage, major faults, storage bytes per
//! decoded token and the expert hit rate; `--json FILE` writes every draw
//! for `scripts/budget-chart.py`. Before the draws it measures the storage's
//! rate for expert-sized direct reads (so that bytes per token read as time
//! on any machine), and after them it checks that Pocket's engines computed
//! the same logits draw by draw.
//!
//! `--routing local:repeat=R,zipf=S,seed=N` routes Pocket's MoE layers
//! with stated locality (the `POCKET_ROUTING` benchmark hook, see
//! `pocket_core::model::LocalRouting`) instead of the synthetic weights'
//! nearly uniform routing; llama.cpp cannot, and is left out.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::llama;

/// The engines of one comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Llama,
    Mapped,
    Budget,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Llama => "llama.cpp",
            Engine::Mapped => "pocket-mapped",
            Engine::Budget => "pocket-budget",
        }
    }
}

struct Opts {
    model: PathBuf,
    /// The cgroup limit in bytes (0 = no limit: the unlimited column).
    limit: u64,
    /// Pocket's budget; default a little under the limit.
    budget: u64,
    threads: usize,
    p: usize,
    n: usize,
    draws: usize,
    engines: Vec<Engine>,
    json: Option<PathBuf>,
    pocket: Option<PathBuf>,
    /// Pocket repeats one prompt and one decode token (`pocket bench`'s plain
    /// protocol) instead of varying them as llama-bench does.
    replay: bool,
    /// `POCKET_ROUTING` for Pocket's engines (`None`: the router's own).
    routing: Option<pocket_core::model::LocalRouting>,
}

/// `6G`, `5500M`, or bytes (powers of 1024), as the CLI's `--memory-budget` reads them.
fn size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.chars().last() {
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        _ => (t, 0),
    };
    let v: f64 = num.parse().map_err(|_| format!("'{s}' is not a size (6G, 5500M, bytes)"))?;
    Ok((v * (1u64 << shift) as f64) as u64)
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        model: PathBuf::new(),
        limit: 0,
        budget: 0,
        threads: 2,
        p: 16,
        n: 32,
        draws: 3,
        engines: vec![Engine::Llama, Engine::Mapped, Engine::Budget],
        json: None,
        pocket: None,
        replay: false,
        routing: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--model" => o.model = PathBuf::from(val()?),
            "--limit" => o.limit = size(&val()?)?,
            "--budget" => o.budget = size(&val()?)?,
            "--threads" => o.threads = val()?.parse().map_err(|_| "bad --threads")?,
            "-p" => o.p = val()?.parse().map_err(|_| "bad -p")?,
            "-n" => o.n = val()?.parse().map_err(|_| "bad -n")?,
            "--draws" => o.draws = val()?.parse().map_err(|_| "bad --draws")?,
            "--json" => o.json = Some(PathBuf::from(val()?)),
            "--pocket" => o.pocket = Some(PathBuf::from(val()?)),
            "--replay" => o.replay = true,
            "--routing" => o.routing = pocket_core::model::LocalRouting::parse(&val()?)?,
            "--engines" => {
                o.engines = val()?
                    .split(',')
                    .map(|e| match e.trim() {
                        "llama" => Ok(Engine::Llama),
                        "mapped" => Ok(Engine::Mapped),
                        "budget" => Ok(Engine::Budget),
                        other => Err(format!("unknown engine '{other}' (llama, mapped, budget)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.model.as_os_str().is_empty() {
        return Err("--model is required".into());
    }
    if o.budget == 0 && o.limit > 0 {
        // Room for what the budget does not count: the binary, thread stacks, the allocator's slack.
        o.budget = o.limit - (o.limit / 32).max(192 << 20);
    }
    if o.budget == 0 {
        o.engines.retain(|&e| e != Engine::Budget);
    }
    if o.routing.is_some() {
        o.engines.retain(|&e| e != Engine::Llama);
    }
    Ok(o)
}

/// A memory cgroup of the machine's kind (v1 or v2) for one draw.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn new(limit: u64) -> Result<Cgroup, String> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.is_dir() {
            (v1.join("pocket-bench-budget"), false)
        } else {
            (PathBuf::from("/sys/fs/cgroup/pocket-bench-budget"), true)
        };
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e} (bench-budget needs root)", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        let limit = if limit == 0 { "max".to_string() } else { limit.to_string() };
        if v2 {
            cg.write("memory.max", &limit)?;
            cg.write("memory.swap.max", "0").ok();
        } else {
            let limit = if limit == "max" { "-1".into() } else { limit };
            cg.write("memory.limit_in_bytes", &limit)?;
            cg.write("memory.max_usage_in_bytes", "0").ok();
        }
        Ok(cg)
    }

    fn write(&self, file: &str, v: &str) -> Result<(), String> {
        std::fs::write(self.dir.join(file), v).map_err(|e| format!("{}/{file}: {e}", self.dir.display()))
    }

    /// Peak usage (page cache included) since the cgroup was set up.
    fn peak(&self) -> u64 {
        let f = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(f)).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// OOM kills inside the cgroup so far.
    fn oom_kills(&self) -> u64 {
        let (f, key) = if self.v2 { ("memory.events", "oom_kill") } else { ("memory.oom_control", "oom_kill") };
        std::fs::read_to_string(self.dir.join(f))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok())))
            .unwrap_or(0)
    }

    /// `cmd` run inside the cgroup under GNU time (major faults, peak RSS).
    fn command(&self, cmd: &Command, time_out: &Path) -> Command {
        let mut sh = Command::new("sh");
        let procs = self.dir.join("cgroup.procs");
        let program = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        sh.arg("-c").arg(format!(
            "echo $$ > {} && exec /usr/bin/time -f '%F %M' -o {} {program}",
            shell_quote(&procs.to_string_lossy()),
            shell_quote(&time_out.to_string_lossy())
        ));
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                sh.env(k, v);
            }
        }
        sh
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn drop_caches() -> Result<(), String> {
    llama::run(&mut Command::new("sync"))?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| format!("drop_caches: {e} (needs root)"))
}

/// One draw of `engine` in a fresh cgroup: its figures as JSON.
fn draw(engine: Engine, o: &Opts, pocket: &Path, llama_bin: Option<&Path>) -> Result<Value, String> {
    drop_caches()?;
    let cg = Cgroup::new(o.limit)?;
    let time_out = std::env::temp_dir().join(format!("pocket-budget-time-{}.txt", std::process::id()));
    let (p, n, t) = (o.p.to_string(), o.n.to_string(), o.threads.to_string());
    let mut cmd = match engine {
        Engine::Llama => {
            let bin = llama_bin.ok_or("llama.cpp was not built")?;
            let mut c = Command::new(bin.join("llama-bench"));
            c.env("LD_LIBRARY_PATH", bin).arg("-m").arg(&o.model);
            c.args(["-t", &t, "-p", &p, "-n", &n, "-r", "1", "-o", "json", "-lm", "mmap", "--repack", "0"]);
            c
        }
        Engine::Mapped | Engine::Budget => {
            let mut c = Command::new(pocket);
            // Varied tokens, as llama-bench's generation test draws random ones (unless --replay).
            c.args(["bench", "--json", "--draws", "1", "-p", &p, "-n", &n, "--threads", &t]);
            if !o.replay {
                c.arg("--varied");
            }
            c.arg("--model").arg(&o.model);
            c.env(pocket_core::model::ROUTING_ENV, o.routing.map_or("uniform".into(), |r| r.describe()));
            if engine == Engine::Budget {
                c.args(["--memory-budget", &o.budget.to_string()]);
            }
            c
        }
    };
    let mut run = cg.command(&cmd, &time_out);
    eprintln!("+ [{} in {} MiB] {:?}", engine.name(), o.limit >> 20, cmd);
    let out = run.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    let _ = &mut cmd;
    let (majflt, rss) = std::fs::read_to_string(&time_out)
        .ok()
        .and_then(|s| {
            let l = s.lines().last()?.to_string();
            let mut w = l.split_whitespace();
            Some((w.next()?.parse::<u64>().ok()?, w.next()?.parse::<u64>().ok()? * 1024))
        })
        .unwrap_or((0, 0));
    let mut v = json!({
        "engine": engine.name(),
        "limit": o.limit,
        "budget": if engine == Engine::Budget { o.budget } else { 0 },
        "cgroup_peak_bytes": cg.peak(),
        "major_faults": majflt,
        "peak_rss_bytes": rss,
        "oom_killed": cg.oom_kills() > 0 || !out.status.success(),
    });
    if !out.status.success() {
        v["error"] = json!(String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string());
        return Ok(v);
    }
    let r: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("{} output: {e}", engine.name()))?;
    match engine {
        Engine::Llama => {
            for test in r.as_array().into_iter().flatten() {
                let tps = test["avg_ts"].as_f64().unwrap_or(0.0);
                if test["n_gen"].as_u64() == Some(0) {
                    v["prefill_tps"] = json!(tps);
                    v["time_to_first_token_ms"] = json!(1e3 * o.p as f64 / tps.max(1e-9));
                } else {
                    v["decode_tps"] = json!(tps);
                }
            }
        }
        _ => {
            v["prefill_tps"] = r["prefill_tps"]["mean"].clone();
            v["decode_tps"] = r["decode_tps"]["mean"].clone();
            v["expert_hit_rate"] = r["expert_hit_rate"].clone();
            v["storage_bytes_per_token"] = r["storage_bytes_per_token"].clone();
            // The warm-up draw is the cold start: the first request after launch.
            v["time_to_first_token_ms"] = r["warmup"]["time_to_first_token_ms"].clone();
            v["cold_decode_tps"] = r["warmup"]["decode_tps"].clone();
            v["load_ms"] = r["config"]["load_ms"].clone();
            v["routing"] = r["config"]["routing"].clone();
            let digests = std::iter::once(&r["warmup"]).chain(r["draws"].as_array().into_iter().flatten());
            v["logits_digests"] = json!(digests.map(|d| d["logits_digest"].clone()).collect::<Vec<_>>());
        }
    }
    Ok(v)
}

/// Whether Pocket's mapped and budgeted draws ended on the same logits
/// (`None` with fewer than both engines, or a failed draw).
fn same_outputs(rows: &[Value]) -> Option<bool> {
    let digests = |e: Engine| -> Vec<&Value> {
        rows.iter().filter(|v| v["engine"] == e.name()).filter_map(|v| v.get("logits_digests")).collect()
    };
    let (mapped, budget) = (digests(Engine::Mapped), digests(Engine::Budget));
    (!mapped.is_empty() && mapped.len() == budget.len()).then(|| mapped == budget)
}

/// How storage is probed: like the expert cache's reads.
const STORAGE_PROBE: &str = "16 threads, direct reads of 1 MiB at random offsets, 2 s";

/// Bytes per second that 16 threads of direct 1 MiB reads at random places
/// of `model` get (the expert cache reads 1.15 MB experts on 16 threads).
fn storage_rate(model: &Path) -> Result<f64, String> {
    use pocket_core::gguf::direct::{AlignedBuf, DirectFile};
    let file = std::fs::File::open(model).map_err(|e| format!("{}: {e}", model.display()))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let direct = DirectFile::open(&file, 0, len).map_err(|e| e.to_string())?;
    const CHUNK: usize = 1 << 20;
    let blocks = (len / CHUNK as u64).max(1);
    let start = std::time::Instant::now();
    let bytes = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let (direct, bytes) = (&direct, &bytes);
            s.spawn(move || {
                let mut buf = AlignedBuf::new(CHUNK + 8192).expect("1 MiB");
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                while start.elapsed().as_secs_f64() < 2.0 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let span = direct.span((x % blocks) * CHUNK as u64, CHUNK);
                    if direct.read(span, buf.as_mut_slice()).is_err() {
                        return;
                    }
                    bytes.fetch_add(span.len as u64, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    Ok(bytes.into_inner() as f64 / start.elapsed().as_secs_f64())
}

pub fn bench_budget(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let pocket = match &o.pocket {
        Some(p) => p.clone(),
        None => {
            let root = llama::workspace_root();
            llama::run(Command::new("cargo").current_dir(&root).args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "pocket-cli",
            ]))?;
            root.join("target/release/pocket")
        }
    };
    let llama_bin = if o.engines.contains(&Engine::Llama) { Some(llama::host_build(None)?) } else { None };
    drop_caches()?;
    let storage = storage_rate(&o.model)?;
    eprintln!("storage: {:.2} GB/s ({STORAGE_PROBE})", storage / 1e9);
    let mut rows = Vec::new();
    for d in 0..o.draws {
        for &e in &o.engines {
            let v = draw(e, &o, &pocket, llama_bin.as_deref())?;
            eprintln!("draw {}: {v}", d + 1);
            rows.push(v);
        }
    }
    let f = |v: &Value, k: &str| v[k].as_f64();
    let routing = o.routing.map_or("router (uniform on synthetic weights)".into(), |r| r.describe());
    println!(
        "model {}  limit {} MiB  pocket budget {} MiB  threads {}  -p {} -n {}  draws {}",
        o.model.display(),
        o.limit >> 20,
        o.budget >> 20,
        o.threads,
        o.p,
        o.n,
        o.draws
    );
    println!("routing {routing}  storage {:.2} GB/s ({STORAGE_PROBE})", storage / 1e9);
    println!(
        "{:<15} {:>9} {:>9} {:>10} {:>11} {:>9} {:>10} {:>8} ok",
        "engine", "pp t/s", "tg t/s", "TTFT s", "peak MiB", "majflt", "MB/token", "hit %"
    );
    for &e in &o.engines {
        let mine: Vec<&Value> = rows.iter().filter(|v| v["engine"] == e.name()).collect();
        let mean = |k: &str| {
            let xs: Vec<f64> = mine.iter().filter_map(|v| f(v, k)).collect();
            if xs.is_empty() {
                f64::NAN
            } else {
                xs.iter().sum::<f64>() / xs.len() as f64
            }
        };
        let peak = mine.iter().filter_map(|v| v["cgroup_peak_bytes"].as_u64()).max().unwrap_or(0);
        let ok = mine.iter().all(|v| v["oom_killed"] == false);
        println!(
            "{:<15} {:>9.2} {:>9.2} {:>10.1} {:>11.0} {:>9.0} {:>10.1} {:>8.1} {}",
            e.name(),
            mean("prefill_tps"),
            mean("decode_tps"),
            mean("time_to_first_token_ms") / 1e3,
            peak as f64 / (1u64 << 20) as f64,
            mean("major_faults"),
            mean("storage_bytes_per_token") / 1e6,
            mean("expert_hit_rate") * 100.0,
            if ok { "yes" } else { "OOM/failed" }
        );
    }
    let same = same_outputs(&rows);
    if let Some(same) = same {
        println!("outputs: mapped and budget logits {}", if same { "identical in every draw" } else { "DIFFER" });
    }
    if let Some(path) = &o.json {
        let doc = json!({"model": o.model, "limit": o.limit, "budget": o.budget, "threads": o.threads,
                         "p": o.p, "n": o.n, "replay": o.replay, "routing": routing,
                         "storage_bytes_per_second": storage, "outputs_identical": same, "draws": rows});
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
