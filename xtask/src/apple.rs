//! `cargo xtask xcframework`: the `PocketFFI.xcframework` the Swift package links.
//!
//! Builds the static library for devices (`aarch64-apple-ios`) and the
//! simulator on Apple silicon (`aarch64-apple-ios-sim`; with nightly
//! `-Zbuild-std` where rustup has no standard library for it), plus the
//! macOS host slice when run on a Mac (so `swift test` works there), and
//! generates the Swift bindings and C headers. The final
//! `xcodebuild -create-xcframework` needs Xcode: elsewhere the exact command
//! is printed with what was produced.

use std::path::PathBuf;
use std::process::Command;

use crate::bindings::{self, Lang};
use crate::util::{cargo, cargo_of, installed_targets, root, run, show, target_dir, Args, Result};

/// `cargo xtask xcframework [--profile mobile|release]`
pub fn command(args: &[String]) -> Result {
    let mut args = Args::new(args);
    let profile = args.value("--profile")?.unwrap_or_else(|| "mobile".into());
    args.rest()?;

    // Swift sources (committed copy refreshed) and the C header folder.
    let swift = bindings::generate(Lang::Swift, false, None)?;
    std::fs::copy(swift.join("Pocket.swift"), bindings::swift_sources().join("Pocket.swift"))
        .map_err(|e| e.to_string())?;
    let headers = swift.join("include");

    let mut slices = vec![staticlib("aarch64-apple-ios", &profile, false)?];
    let sim_on_stable = installed_targets().iter().any(|t| t == "aarch64-apple-ios-sim");
    slices.push(staticlib("aarch64-apple-ios-sim", &profile, !sim_on_stable)?);
    if cfg!(target_os = "macos") {
        slices.push(staticlib(
            if cfg!(target_arch = "aarch64") { "aarch64-apple-darwin" } else { "x86_64-apple-darwin" },
            &profile,
            false,
        )?);
    }

    let output = root().join("ios/PocketFFI.xcframework");
    let mut xcodebuild = Command::new("xcodebuild");
    xcodebuild.arg("-create-xcframework");
    for lib in &slices {
        xcodebuild.arg("-library").arg(lib).arg("-headers").arg(&headers);
    }
    xcodebuild.arg("-output").arg(&output);

    if cfg!(target_os = "macos") {
        if output.exists() {
            std::fs::remove_dir_all(&output).map_err(|e| format!("{}: {e}", output.display()))?;
        }
        run(&mut xcodebuild)?;
        eprintln!("\n{} is ready: `swift build` / `swift test` at the repository root use it.", output.display());
    } else {
        eprintln!("\nBuilt (not on macOS, so no XCFramework yet):");
        for lib in &slices {
            let size = std::fs::metadata(lib).map(|m| m.len()).unwrap_or(0);
            eprintln!("  {} ({:.1} MB)", lib.display(), size as f64 / 1e6);
        }
        eprintln!("  {}/PocketFFI/{{PocketFFI.h,module.modulemap}}", headers.display());
        eprintln!("  {}", bindings::swift_sources().join("Pocket.swift").display());
        eprintln!("On a Mac with Xcode, run `cargo xtask xcframework` again, or from this output:");
        eprintln!("  {}", show(&xcodebuild));
    }
    Ok(())
}

/// Build `pocket_ffi` as a static library for `target`; returns its path.
fn staticlib(target: &str, profile: &str, build_std: bool) -> Result<PathBuf> {
    let mut cmd = if build_std { cargo_of("nightly") } else { cargo() };
    cmd.args(["rustc", "--target", target, "-p", "pocket-ffi", "--lib", "--crate-type", "staticlib"]);
    cmd.args(["--profile", profile]);
    if build_std {
        // No prebuilt standard library for this target: build it (needs `rustup component add rust-src --toolchain nightly`).
        cmd.args(["-Z", "build-std=std,panic_unwind"]);
    }
    run(&mut cmd)?;
    let dir = if profile == "dev" { "debug" } else { profile };
    Ok(target_dir().join(target).join(dir).join("libpocket_ffi.a"))
}
