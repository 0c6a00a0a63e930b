//! Shared helpers: the repository layout, running commands, host facts.

use std::path::{Path, PathBuf};
use std::process::Command;

pub type Result<T = ()> = std::result::Result<T, String>;

/// The repository root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent").to_path_buf()
}

/// Cargo's target directory for host builds (`CARGO_TARGET_DIR` or `target/`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

/// `cargo` from the running toolchain, started in the repository root.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// `cargo` of another toolchain through rustup, free of the variables the
/// outer `cargo xtask` set for its own toolchain.
pub fn cargo_of(toolchain: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", toolchain, "cargo"]).current_dir(root());
    for var in ["RUSTUP_TOOLCHAIN", "CARGO", "RUSTC", "RUSTDOC", "RUSTC_WRAPPER"] {
        c.env_remove(var);
    }
    c
}

/// Run a command, echoing it; an error names the command on failure.
pub fn run(cmd: &mut Command) -> Result {
    eprintln!("+ {}", show(cmd));
    let status = cmd.status().map_err(|e| format!("cannot start {}: {e}", show(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", show(cmd)))
    }
}

/// A command as a shell line.
pub fn show(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| {
        let a = a.to_string_lossy();
        if a.contains(' ') {
            format!("'{a}'")
        } else {
            a.into_owned()
        }
    }));
    parts.join(" ")
}

/// File name of the host's dynamic library for `lib_name`.
pub fn host_cdylib(lib_name: &str) -> String {
    if cfg!(target_os = "macos") {
        format!("lib{lib_name}.dylib")
    } else if cfg!(windows) {
        format!("{lib_name}.dll")
    } else {
        format!("lib{lib_name}.so")
    }
}

/// Rust targets rustup has installed for the active toolchain.
pub fn installed_targets() -> Vec<String> {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect())
        .unwrap_or_default()
}

pub fn copy(from: &Path, to: &Path) -> Result {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(from, to).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    Ok(())
}

/// Simple flag parsing: `--name value` pairs and bare `--switch`es.
pub struct Args(Vec<String>);

impl Args {
    pub fn new(args: &[String]) -> Self {
        Args(args.to_vec())
    }

    pub fn flag(&mut self, name: &str) -> bool {
        let before = self.0.len();
        self.0.retain(|a| a != name);
        self.0.len() != before
    }

    pub fn value(&mut self, name: &str) -> Result<Option<String>> {
        match self.0.iter().position(|a| a == name) {
            None => Ok(None),
            Some(i) if i + 1 < self.0.len() => {
                let v = self.0.remove(i + 1);
                self.0.remove(i);
                Ok(Some(v))
            }
            Some(_) => Err(format!("{name} needs a value")),
        }
    }

    /// The remaining positional arguments; an unknown `--option` is an error.
    pub fn rest(self) -> Result<Vec<String>> {
        if let Some(bad) = self.0.iter().find(|a| a.starts_with("--")) {
            return Err(format!("unknown option {bad}"));
        }
        Ok(self.0)
    }
}

/// The files directly inside `dir` whose name ends in `.ext`, sorted.
pub fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    Ok(files)
}

/// Whether `output` exists and is newer than every input.
pub fn newer_than_all(output: &Path, inputs: &[PathBuf]) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(out) = modified(output) else { return false };
    inputs.iter().all(|i| modified(i).is_some_and(|t| t < out))
}

/// Let a static-library build for a foreign `target` run where that target's
/// linker is missing (Linux CI for iOS and Android, no Xcode, no NDK).
///
/// A static library is never linked, but Cargo builds every crate type a
/// dependency declares, and llguidance declares a `cdylib`: without a linker
/// its by-product dylib fails the build. When the target is a phone's (and, for
/// Apple's, the host is not a Mac) and no `CARGO_TARGET_<TRIPLE>_LINKER` is set, this points the linker at a
/// script that writes an empty file for `-o`, and says so. The static library
/// (the only output used) is unaffected; a Mac with Xcode or a machine with
/// the NDK (cargo-ndk sets the variable) links the dylib for real.
pub fn stub_foreign_linker(cmd: &mut Command, target: &str, dir: &Path) -> Result {
    // Xcode links Apple targets on a Mac; every other mobile target needs an SDK we do not assume.
    let foreign = target.contains("android") || (target.contains("apple") && !cfg!(target_os = "macos"));
    let var = format!("CARGO_TARGET_{}_LINKER", target.to_uppercase().replace('-', "_"));
    if !foreign || std::env::var_os(&var).is_some() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let stub = dir.join("no-link.sh");
    let script = "#!/bin/sh\n# Written by `cargo xtask`: see stub_foreign_linker in xtask/src/util.rs.\n\
                  while [ $# -gt 0 ]; do [ \"$1\" = -o ] && : > \"$2\"; shift; done\n";
    std::fs::write(&stub, script).map_err(|e| format!("{}: {e}", stub.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", stub.display()))?;
    }
    eprintln!(
        "  no {target} linker here ({var} unset): dependencies' dylibs are written empty, the static library is whole"
    );
    cmd.env(var, stub);
    Ok(())
}
