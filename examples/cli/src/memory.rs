//! How a command loads its model: `--memory-budget SIZE|auto` (see
//! `pocket_core::model::MemoryPlan`) and `--backend cpu|gpu`, shared by
//! `run`, `chat`, `bench`, `logits` and `perplexity`.
//!
//! `auto` takes the budget from the memory the process may use: the limit of
//! its own memory cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`, the
//! tightest of the cgroup and its parents) or the system's `MemAvailable`,
//! whichever is less, less a margin for what the budget does not count. `run`,
//! `chat` and `bench` follow it while they run ([`Follower`]): between two
//! tokens, at most every half second, the limit is read again and the
//! model's budget set to what it allows.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pocket_core::model::{BackendKind, LoadOptions, Model};

/// `--memory-budget`: a size, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Bytes(u64),
    Auto,
}

/// The memory budget and backend of a command that loads a model.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Budget {
    /// Keep the model and one session within SIZE bytes (6G, 5500M, or bytes):
    /// the weights every token reads stay in memory, routed experts come from
    /// a cache sized to the rest; 0 = no budget (map the file); auto = what the
    /// process's memory cgroup or the system's available memory allows, less a
    /// margin, followed while running (run, chat, bench)
    #[arg(long = "memory-budget", value_name = "SIZE", default_value = "0", value_parser = parse_budget)]
    pub size: Size,
    /// Device for the passes: cpu, gpu (matrix products on the GPU), or auto (= cpu for now)
    #[arg(long, value_name = "DEVICE", default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendKind,
}

impl Budget {
    /// Load `path` under this budget on this backend; errors name the file.
    pub fn load(&self, path: &str) -> Result<Model, String> {
        self.load_with_template(path, None)
    }

    /// [`load`](Self::load) with a chat template used instead of the file's.
    pub fn load_with_template(&self, path: &str, chat_template: Option<String>) -> Result<Model, String> {
        let (bytes, auto) = match self.size {
            Size::Bytes(b) => (b, None),
            Size::Auto => {
                let limit = Limit::of_this_process();
                let Some((bytes, why)) = limit.budget(0) else {
                    return Err("--memory-budget auto: no memory limit or available memory could be read".into());
                };
                (bytes, Some(why))
            }
        };
        let opts = LoadOptions { memory_budget: bytes, backend: self.backend, chat_template };
        let model = Model::load_with(path, &opts).map_err(|e| match &auto {
            Some(why) => format!("{path}: --memory-budget auto ({why}): {e}"),
            None => format!("{path}: {e}"),
        })?;
        if let Some(why) = auto {
            eprintln!("pocket: memory budget {} ({why})", mib(bytes));
        }
        Ok(model)
    }

    /// What follows the limit while the command runs (`auto` only).
    pub fn follower(&self, model: &Model) -> Option<Follower> {
        (self.size == Size::Auto).then(|| Follower::new(model, Limit::of_this_process()))
    }

    /// The budget as given: bytes, `auto`, or 0.
    pub fn describe(&self) -> String {
        match self.size {
            Size::Bytes(b) => b.to_string(),
            Size::Auto => "auto".into(),
        }
    }
}

/// Sets a model's budget to what the process's memory limit allows, when
/// [`tick`](Self::tick)ed between tokens: the limit is read at most every
/// [`Follower::EVERY`] (a few small files), and the budget changes only when
/// the new one differs by more than [`Follower::STEP_DIV`]th of it (at least
/// [`Follower::STEP_MIN`] bytes).
pub struct Follower {
    limit: Limit,
    last: Instant,
    minimum: u64,
    clamped: bool,
}

impl Follower {
    pub const EVERY: Duration = Duration::from_millis(500);
    pub const STEP_DIV: u64 = 64;
    pub const STEP_MIN: u64 = 32 << 20;

    fn new(model: &Model, limit: Limit) -> Follower {
        Follower { limit, last: Instant::now(), minimum: model.memory_plan(0).minimum_budget_bytes, clamped: false }
    }

    /// Between two tokens: read the limit again if it is time, and follow it.
    pub fn tick(&mut self, model: &Model) {
        if self.last.elapsed() < Self::EVERY {
            return;
        }
        self.last = Instant::now();
        let Some((target, why)) = self.limit.budget(model.memory_usage().total()) else { return };
        let target = if target < self.minimum {
            if !self.clamped {
                eprintln!(
                    "pocket: {why} leaves {} for the model, below its minimum of {}: keeping the minimum",
                    mib(target),
                    mib(self.minimum)
                );
            }
            self.clamped = true;
            self.minimum
        } else {
            self.clamped = false;
            target
        };
        let current = model.memory_budget();
        let step = (current / Self::STEP_DIV).max(Self::STEP_MIN);
        if target.abs_diff(current) < step {
            return;
        }
        match model.set_memory_budget(target) {
            Ok(()) => eprintln!("pocket: memory budget {} -> {} ({why})", mib(current), mib(target)),
            Err(e) => eprintln!("pocket: memory budget {} not taken: {e}", mib(target)),
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Where the process's memory limit is read from.
#[derive(Clone, Debug, Default)]
pub struct Limit {
    /// The process's memory cgroup folder, and the folder its hierarchy is
    /// mounted at (the limits of the folders between count too).
    cgroup: Option<(Cgroup, PathBuf, PathBuf)>,
    /// `/proc/meminfo`.
    meminfo: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cgroup {
    V1,
    V2,
}

/// What the budget leaves for what it does not count (the binary, thread
/// stacks, the allocator's slack, the rest of the process): under a cgroup
/// limit a 32nd of it, at least 256 MiB; of the system's available memory a
/// 16th, at least 256 MiB (other processes come and go).
const MARGIN_MIN: u64 = 256 << 20;

/// v1's "no limit" is the largest page-aligned i64; anything this large is none.
const NO_LIMIT: u64 = 1 << 60;

impl Limit {
    /// The limit of this process: its memory cgroup from /proc/self/cgroup
    /// and /proc/self/mountinfo, and /proc/meminfo.
    pub fn of_this_process() -> Limit {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let cgroup = match (read("/proc/self/cgroup"), read("/proc/self/mountinfo")) {
            (Some(c), Some(m)) => find_cgroup(&c, &m),
            _ => None,
        };
        let meminfo = Path::new("/proc/meminfo");
        Limit { cgroup, meminfo: meminfo.is_file().then(|| meminfo.to_path_buf()) }
    }

    /// The cgroup's limit in bytes, if it has one (the tightest of its folder
    /// and the folders above it, up to the mount).
    fn cgroup_limit(&self) -> Option<u64> {
        let (kind, dir, mount) = self.cgroup.as_ref()?;
        let file = match kind {
            Cgroup::V1 => "memory.limit_in_bytes",
            Cgroup::V2 => "memory.max",
        };
        let mut limit = None::<u64>;
        let mut at = dir.as_path();
        loop {
            if let Some(v) = std::fs::read_to_string(at.join(file)).ok().and_then(|t| parse_limit(&t)) {
                limit = Some(limit.map_or(v, |l| l.min(v)));
            }
            if at == mount.as_path() {
                break;
            }
            match at.parent() {
                Some(p) if p.starts_with(mount) => at = p,
                _ => break,
            }
        }
        limit
    }

    /// `MemAvailable` in bytes.
    fn available(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.meminfo.as_ref()?).ok()?;
        meminfo_available(&text)
    }

    /// The budget the limit allows a model that holds `model_bytes` now,
    /// and where it comes from.
    pub fn budget(&self, model_bytes: u64) -> Option<(u64, String)> {
        let from_cgroup = self.cgroup_limit().map(|l| {
            let margin = (l / 32).max(MARGIN_MIN);
            (l.saturating_sub(margin), format!("cgroup memory limit {} less {}", mib(l), mib(margin)))
        });
        let from_available = self.available().map(|a| {
            let total = a + model_bytes;
            let margin = (total / 16).max(MARGIN_MIN);
            (total.saturating_sub(margin), format!("{} available to the model less {}", mib(total), mib(margin)))
        });
        match (from_cgroup, from_available) {
            (Some(c), Some(a)) => Some(if c.0 <= a.0 { c } else { a }),
            (c, a) => c.or(a),
        }
    }
}

/// A limit file's value: bytes, or `None` for "max" or v1's unlimited.
fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < NO_LIMIT).then_some(v)
}

/// `MemAvailable:  123456 kB` of /proc/meminfo, in bytes.
fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The process's memory cgroup folder and its hierarchy's mount point, from
/// /proc/self/cgroup (`ID:CONTROLLERS:PATH` lines; v2 is `0::PATH`) and
/// /proc/self/mountinfo. A v1 memory controller is preferred (on a hybrid
/// system it is the one that limits).
fn find_cgroup(cgroup: &str, mountinfo: &str) -> Option<(Cgroup, PathBuf, PathBuf)> {
    let mut v1 = None;
    let mut v2 = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    let mounts = mountinfo.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        Some((*f.get(3)?, *f.get(4)?, *r.first()?, *r.get(2).unwrap_or(&"")))
    });
    let mut v1_mount = None;
    let mut v2_mount = None;
    for (root, point, fstype, opts) in mounts {
        match fstype {
            "cgroup" if opts.split(',').any(|o| o == "memory") => v1_mount = Some((root, point)),
            "cgroup2" => v2_mount = Some((root, point)),
            _ => {}
        }
    }
    let place = |path: &str, (root, point): (&str, &str)| {
        // The process's path is relative to the hierarchy's root; the mount
        // shows the part of the hierarchy under `root` (a container's own).
        let rel = path.strip_prefix(root).unwrap_or(path).trim_start_matches('/');
        let mount = PathBuf::from(unescape(point));
        (mount.join(rel), mount)
    };
    if let (Some(path), Some(m)) = (v1, v1_mount) {
        let (dir, mount) = place(path, m);
        return Some((Cgroup::V1, dir, mount));
    }
    if let (Some(path), Some(m)) = (v2, v2_mount) {
        let (dir, mount) = place(path, m);
        return Some((Cgroup::V2, dir, mount));
    }
    None
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let oct: String = chars.clone().take(3).collect();
            if oct.len() == 3 {
                if let Ok(v) = u8::from_str_radix(&oct, 8) {
                    out.push(v as char);
                    chars.nth(2);
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

fn parse_budget(s: &str) -> Result<Size, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(Size::Auto);
    }
    parse_size(s).map(Size::Bytes).map_err(|e| format!("{e}, or auto"))
}

fn parse_backend(s: &str) -> Result<BackendKind, String> {
    BackendKind::from_name(s).ok_or_else(|| format!("'{s}' is not a backend (cpu, gpu or auto)"))
}

/// `6G`, `5500M`, `512K`, `1T` (powers of 1024, an optional `i`/`B`/`iB`
/// after the letter), or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("'{s}' is not a size (use e.g. 6G, 5500M or a number of bytes)");
    let digits = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches('B').trim_end_matches('I') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    if shift == 0 {
        return num.parse::<u64>().map_err(|_| bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_sizes_or_auto() {
        assert_eq!(parse_budget("auto"), Ok(Size::Auto));
        assert_eq!(parse_budget("AUTO"), Ok(Size::Auto));
        assert_eq!(parse_budget("6G"), Ok(Size::Bytes(6 << 30)));
        assert_eq!(parse_budget("0"), Ok(Size::Bytes(0)));
        assert!(parse_budget("automatic").is_err());
    }

    const MOUNTINFO: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";

    #[test]
    fn the_process_cgroup_is_found_in_v1_and_v2() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        let (kind, dir, mount) = find_cgroup(v1, MOUNTINFO).unwrap();
        assert_eq!(kind, Cgroup::V1);
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"));
        assert_eq!(mount, PathBuf::from("/sys/fs/cgroup/memory"));
        // v2 only; a container whose mount shows its own part of the hierarchy.
        let v2 = "0::/user.slice/app.scope\n";
        let info = "50 40 0:40 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let (kind, dir, mount) = find_cgroup(v2, info).unwrap();
        assert_eq!(kind, Cgroup::V2);
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/app.scope"));
        assert_eq!(mount, PathBuf::from("/sys/fs/cgroup"));
        assert!(find_cgroup("0::/\n", "1 0 8:1 / / rw - ext4 /dev/sda rw\n").is_none());
    }

    #[test]
    fn limits_are_the_tightest_up_the_tree_less_a_margin() {
        let root = std::env::temp_dir().join(format!("pocket-cgroup-{}", std::process::id()));
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("a/memory.max"), format!("{}\n", 8u64 << 30)).unwrap();
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        let meminfo = root.join("meminfo");
        std::fs::write(&meminfo, "MemTotal: 100 kB\nMemAvailable:   33554432 kB\n").unwrap(); // 32 GiB
        let limit = Limit { cgroup: Some((Cgroup::V2, leaf.clone(), root.clone())), meminfo: Some(meminfo.clone()) };
        assert_eq!(limit.cgroup_limit(), Some(8 << 30));
        let (b, why) = limit.budget(0).unwrap();
        assert_eq!(b, (8u64 << 30) - (256 << 20), "{why}");
        assert!(why.contains("cgroup"), "{why}");
        // Lowered while running: read again.
        std::fs::write(leaf.join("memory.max"), format!("{}\n", 5u64 << 30)).unwrap();
        assert_eq!(limit.budget(0).unwrap().0, (5u64 << 30) - (256 << 20));
        // Less available than the cgroup allows: what is available (plus what the model holds).
        std::fs::write(&meminfo, "MemAvailable: 2097152 kB\n").unwrap(); // 2 GiB
        let (b, why) = limit.budget(1 << 30).unwrap();
        assert_eq!(b, (3u64 << 30) - (256 << 20), "{why}");
        // v1's unlimited is no limit.
        std::fs::write(root.join("a/memory.max"), "9223372036854771712\n").unwrap();
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        assert_eq!(limit.cgroup_limit(), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn sizes_in_bytes_and_binary_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("123456"), Ok(123_456));
        assert_eq!(parse_size("6G"), Ok(6 << 30));
        assert_eq!(parse_size("6GiB"), Ok(6 << 30));
        assert_eq!(parse_size("5500M"), Ok(5500 << 20));
        assert_eq!(parse_size("5.5g"), Ok(5632 << 20));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        for bad in ["", "G", "6X", "-1G", "1.5", "6 GB extra"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
