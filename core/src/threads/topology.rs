//! How many threads to use when the caller does not say: the performance
//! cores where the OS tells them apart, else every core.
//!
//! A pass over the pool waits for its slowest thread at every barrier, so on a
//! phone (2 performance + 4 efficiency cores on Apple, 1 + 3 + 4 on many
//! Snapdragons) threads on the little cores hold every token up; memory
//! bandwidth, not core count, bounds decode anyway. The rule:
//!
//! - iOS and macOS: `sysctlbyname("hw.perflevel0.physicalcpu")`, the cores of
//!   the fastest performance level. Where it fails (an Intel Mac): every core.
//! - Android and Linux: every CPU listed in `/sys/devices/system/cpu` (those
//!   whose `online` reads 0 left out) must report `cpu_capacity` (the
//!   scheduler's relative throughput, largest 1024); the performance cores are
//!   those with at least [`CAPACITY_PERCENT`] % of the largest. Without
//!   capacities, `cpufreq/cpuinfo_max_freq` the same way with at least
//!   [`FREQ_PERCENT`] % (a frequency hides the narrower core, so the bar is
//!   higher). A CPU missing the value, or a value that is not a positive
//!   number, rules that file out: no guessing from half a table.
//! - Anywhere else, or when every core passes the bar: every core.
//!
//! Never more threads than CPUs the process may run on
//! (`available_parallelism`, which honours `sched_getaffinity` and cgroup
//! quotas); when that is the smaller number, the source is "all cores".

use std::fmt;
use std::io::Read;
use std::path::Path;

/// A performance core has at least this share (%) of the largest
/// `cpu_capacity`. Little cores (Cortex-A55, A510, A520) sit far below it,
/// mid and big cores above it: a 1 + 3 + 4 Snapdragon gives 4.
pub const CAPACITY_PERCENT: u64 = 40;
/// A performance core has at least this share (%) of the highest
/// `cpuinfo_max_freq`: little cores clock at around 1.8-2.0 GHz against
/// 2.4-3.3 for the others.
pub const FREQ_PERCENT: u64 = 80;

/// Where a session's thread count came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadSource {
    /// The caller's setting (`SessionOptions.threads`, `--threads`).
    Given,
    /// The performance cores, as the named OS value tells them apart.
    PerformanceCores(&'static str),
    /// Every CPU the process may run on: the cores are all alike, or the OS
    /// does not say which are which.
    AllCores,
}

impl fmt::Display for ThreadSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThreadSource::Given => f.write_str("given"),
            ThreadSource::PerformanceCores(what) => write!(f, "performance cores ({what})"),
            ThreadSource::AllCores => f.write_str("all cores"),
        }
    }
}

/// A thread count and how it was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadCount {
    pub threads: usize,
    pub source: ThreadSource,
}

/// `requested` threads, or the default ([`default_threads`]) for 0.
pub fn resolve(requested: usize) -> ThreadCount {
    if requested == 0 {
        default_threads()
    } else {
        ThreadCount { threads: requested, source: ThreadSource::Given }
    }
}

/// The default thread count of this machine and process (see the module).
pub fn default_threads() -> ThreadCount {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    capped(os_performance_cores(), allowed)
}

/// `perf` performance cores (with their source) within `allowed` CPUs.
fn capped(perf: Option<(usize, &'static str)>, allowed: usize) -> ThreadCount {
    match perf {
        Some((n, what)) if n > 0 && n < allowed => {
            ThreadCount { threads: n, source: ThreadSource::PerformanceCores(what) }
        }
        _ => ThreadCount { threads: allowed.max(1), source: ThreadSource::AllCores },
    }
}

#[cfg(target_vendor = "apple")]
fn os_performance_cores() -> Option<(usize, &'static str)> {
    use std::ffi::{c_char, c_int, c_void};
    extern "C" {
        fn sysctlbyname(
            name: *const c_char,
            oldp: *mut c_void,
            oldlenp: *mut usize,
            newp: *mut c_void,
            newlen: usize,
        ) -> c_int;
    }
    let mut value: i32 = 0;
    let mut len = std::mem::size_of::<i32>();
    // SAFETY: a NUL-terminated name, and an output buffer of `len` bytes.
    let r = unsafe {
        sysctlbyname(
            c"hw.perflevel0.physicalcpu".as_ptr(),
            (&mut value as *mut i32).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (r == 0 && len == std::mem::size_of::<i32>() && value > 0).then_some((value as usize, "hw.perflevel0.physicalcpu"))
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn os_performance_cores() -> Option<(usize, &'static str)> {
    from_sysfs(Path::new("/sys/devices/system/cpu"))
}

#[cfg(not(any(target_vendor = "apple", target_os = "linux", target_os = "android")))]
fn os_performance_cores() -> Option<(usize, &'static str)> {
    None
}

/// One CPU and its capacity (any unit in which a faster core is larger).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    pub id: usize,
    pub capacity: u64,
}

/// How many of `cpus` have at least `percent` % of the largest capacity;
/// `None` when that is all of them (or there are none): nothing to leave out.
pub fn performance_cores(cpus: &[Cpu], percent: u64) -> Option<usize> {
    let max = cpus.iter().map(|c| c.capacity).max()?;
    // capacity / max >= percent / 100, in integers (u128: no overflow).
    let fast = cpus.iter().filter(|c| u128::from(c.capacity) * 100 >= u128::from(max) * u128::from(percent)).count();
    (fast < cpus.len()).then_some(fast)
}

/// The performance cores of the CPUs described under `root` (a
/// `/sys/devices/system/cpu`), with the file that told them apart; `None`
/// when they are all alike or the files do not say.
pub fn from_sysfs(root: &Path) -> Option<(usize, &'static str)> {
    let ids = online_cpus(root)?;
    let sources = [
        ("cpu_capacity", "cpu_capacity", CAPACITY_PERCENT),
        ("cpufreq/cpuinfo_max_freq", "cpuinfo_max_freq", FREQ_PERCENT),
    ];
    for (file, what, percent) in sources {
        let cpus: Option<Vec<Cpu>> = ids
            .iter()
            .map(|&id| read_number(&root.join(format!("cpu{id}")).join(file)).map(|capacity| Cpu { id, capacity }))
            .collect();
        if let Some(cpus) = cpus {
            // The first complete table decides, alike or not.
            return performance_cores(&cpus, percent).map(|n| (n, what));
        }
    }
    None
}

/// Ids of the `cpuN` directories under `root`, less those whose `online`
/// reads 0; `None` when there are none (or more than a sane machine has).
fn online_cpus(root: &Path) -> Option<Vec<usize>> {
    const MAX_CPUS: usize = 4096;
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_prefix("cpu")).and_then(|d| {
            (!d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())).then(|| d.parse::<usize>().ok()).flatten()
        }) else {
            continue;
        };
        // cpu0 often has no `online` file: present means online unless it says 0.
        if read_text(&entry.path().join("online")).is_some_and(|t| t.trim() == "0") {
            continue;
        }
        ids.push(id);
        if ids.len() > MAX_CPUS {
            return None;
        }
    }
    ids.sort_unstable();
    (!ids.is_empty()).then_some(ids)
}

/// A small file's text, if it can be read (at most 64 bytes of it).
fn read_text(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(64).read_to_string(&mut text).ok()?;
    Some(text)
}

/// A file holding one positive decimal number.
fn read_number(path: &Path) -> Option<u64> {
    read_text(path)?.trim().parse::<u64>().ok().filter(|&v| v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `/sys/devices/system/cpu` in a fresh temporary directory,
    /// removed on drop.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(name: &str) -> FakeSysfs {
            let dir = std::env::temp_dir().join(format!("pocket-sysfs-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            // What a real tree also holds beside the CPUs.
            for other in ["cpufreq", "cpuidle", "possible", "online"] {
                std::fs::create_dir_all(dir.join(other)).unwrap();
            }
            FakeSysfs(dir)
        }

        /// `cpuN/<file>` holding `text`.
        fn write(&self, cpu: usize, file: &str, text: &str) -> &Self {
            let path = self.0.join(format!("cpu{cpu}")).join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
            self
        }

        /// CPUs `0..values.len()` with `file` holding each value.
        fn cpus(&self, file: &str, values: &[u64]) -> &Self {
            for (id, v) in values.iter().enumerate() {
                self.write(id, file, &format!("{v}\n"));
            }
            self
        }

        fn read(&self) -> Option<(usize, &'static str)> {
            from_sysfs(&self.0)
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const FREQ: &str = "cpufreq/cpuinfo_max_freq";

    #[test]
    fn snapdragon_1_3_4_gives_the_prime_and_big_cores() {
        // Four little, three big, one prime core (Snapdragon 888-like figures).
        let t = FakeSysfs::new("sd888");
        t.cpus("cpu_capacity", &[238, 238, 238, 238, 732, 732, 732, 1024]);
        assert_eq!(t.read(), Some((4, "cpu_capacity")));
        assert_eq!(
            capped(t.read(), 8),
            ThreadCount { threads: 4, source: ThreadSource::PerformanceCores("cpu_capacity") }
        );
        // Frequencies alone tell the same (1.8, 2.42, 2.84 GHz).
        let f = FakeSysfs::new("sd888-freq");
        f.cpus(FREQ, &[1_804_800, 1_804_800, 1_804_800, 1_804_800, 2_419_200, 2_419_200, 2_419_200, 2_841_600]);
        assert_eq!(f.read(), Some((4, "cpuinfo_max_freq")));
    }

    #[test]
    fn two_big_four_little_gives_two() {
        let t = FakeSysfs::new("2p4e");
        t.cpus("cpu_capacity", &[1024, 1024, 310, 310, 310, 310]);
        assert_eq!(t.read(), Some((2, "cpu_capacity")));
    }

    #[test]
    fn homogeneous_cores_give_every_core() {
        let t = FakeSysfs::new("homog");
        t.cpus("cpu_capacity", &[1024; 4]).cpus(FREQ, &[3_000_000, 3_000_000, 2_000_000, 2_000_000]);
        // Complete capacities decide (all alike), even where frequencies differ.
        assert_eq!(t.read(), None);
        assert_eq!(capped(t.read(), 4), ThreadCount { threads: 4, source: ThreadSource::AllCores });
        // A desktop whose favoured cores boost a little higher: all alike too.
        let f = FakeSysfs::new("homog-freq");
        f.cpus(FREQ, &[4_900_000, 4_900_000, 4_700_000, 4_700_000]);
        assert_eq!(f.read(), None);
    }

    #[test]
    fn missing_files_fall_back() {
        // No tree at all, an empty tree, CPUs without either file.
        assert_eq!(from_sysfs(Path::new("/nonexistent/pocket/sysfs")), None);
        let t = FakeSysfs::new("empty");
        assert_eq!(t.read(), None);
        t.write(0, "topology/core_id", "0").write(1, "topology/core_id", "1");
        assert_eq!(t.read(), None);
        // One CPU without a capacity: the capacities are not used; the
        // frequencies are, when every CPU has one.
        let p = FakeSysfs::new("partial");
        p.cpus("cpu_capacity", &[1024, 1024, 300]).write(3, FREQ, "1800000");
        assert_eq!(p.read(), None);
        p.cpus(FREQ, &[2_800_000, 2_800_000, 1_800_000, 1_800_000]);
        assert_eq!(p.read(), Some((2, "cpuinfo_max_freq")));
    }

    #[test]
    fn garbage_contents_are_not_believed() {
        for (i, junk) in
            ["", "\n", "abc", "-5", "0", "1e3", "99999999999999999999999", "\u{0}\u{1}", "12 34"].iter().enumerate()
        {
            let t = FakeSysfs::new(&format!("junk{i}"));
            t.cpus("cpu_capacity", &[1024, 1024, 300, 300]).write(3, "cpu_capacity", junk);
            assert_eq!(t.read(), None, "{junk:?}");
        }
        // A huge file is read only in part (and is not a number).
        let t = FakeSysfs::new("huge");
        t.cpus("cpu_capacity", &[1024, 300]).write(1, "cpu_capacity", &"7".repeat(1 << 16));
        assert_eq!(t.read(), None);
        // Odd directory names are not CPUs; a capacity that is a directory is unreadable.
        let t = FakeSysfs::new("names");
        t.cpus("cpu_capacity", &[1024, 1024, 300, 300]);
        for odd in ["cpu", "cpux", "cpu1a", "cpu-1"] {
            std::fs::create_dir_all(t.0.join(odd)).unwrap();
        }
        assert_eq!(t.read(), Some((2, "cpu_capacity")));
        std::fs::create_dir_all(t.0.join("cpu4/cpu_capacity")).unwrap();
        assert_eq!(t.read(), None);
    }

    #[test]
    fn offline_cpus_are_left_out() {
        let t = FakeSysfs::new("offline");
        t.cpus("cpu_capacity", &[300, 300, 1024, 1024]).write(0, "online", "0\n").write(2, "online", "1\n");
        // Of cpu1..3: one little, two big.
        assert_eq!(t.read(), Some((2, "cpu_capacity")));
        // All the littles offline: the online CPUs are alike.
        t.write(1, "online", "0");
        assert_eq!(t.read(), None);
    }

    #[test]
    fn affinity_caps_the_count() {
        let four = Some((4, "cpu_capacity"));
        assert_eq!(capped(four, 8).threads, 4);
        // Allowed onto 2 CPUs (or 4): that many threads, "all cores".
        assert_eq!(capped(four, 2), ThreadCount { threads: 2, source: ThreadSource::AllCores });
        assert_eq!(capped(four, 4), ThreadCount { threads: 4, source: ThreadSource::AllCores });
        assert_eq!(capped(None, 6), ThreadCount { threads: 6, source: ThreadSource::AllCores });
        assert_eq!(capped(Some((0, "x")), 3).threads, 3);
    }

    #[test]
    fn the_rule_over_plain_tables() {
        let cpus =
            |caps: &[u64]| caps.iter().enumerate().map(|(id, &capacity)| Cpu { id, capacity }).collect::<Vec<_>>();
        assert_eq!(performance_cores(&cpus(&[]), 40), None);
        assert_eq!(performance_cores(&cpus(&[1024]), 40), None);
        // Tensor G1-like 2 + 2 + 4: the mid cores (49 %) count.
        assert_eq!(performance_cores(&cpus(&[160, 160, 160, 160, 498, 498, 1024, 1024]), 40), Some(4));
        // Exactly at the bar counts; just under does not.
        assert_eq!(performance_cores(&cpus(&[40, 100]), 40), None);
        assert_eq!(performance_cores(&cpus(&[39, 100]), 40), Some(1));
        assert_eq!(performance_cores(&cpus(&[u64::MAX, u64::MAX / 2]), 40), None);
    }

    #[test]
    fn resolve_keeps_a_given_count() {
        assert_eq!(resolve(3), ThreadCount { threads: 3, source: ThreadSource::Given });
        let d = resolve(0);
        assert!(d.threads >= 1 && d.threads <= std::thread::available_parallelism().map_or(1, |n| n.get()));
        assert_ne!(d.source, ThreadSource::Given);
        assert_eq!(d, default_threads());
    }
}
