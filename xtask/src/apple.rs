//! `cargo xtask xcframework [--zip]`: the `PocketFFI.xcframework` the Swift package links.
//!
//! Builds the static library for devices (`aarch64-apple-ios`) and for the
//! simulator on both Mac kinds (`aarch64-apple-ios-sim` and `x86_64-apple-ios`,
//! joined by `lipo` into one library: Xcode builds both architectures for a
//! generic simulator destination and an archive, and fails to link if one is
//! missing), plus the macOS host slice when run on a Mac (so `swift test`
//! works there), and generates the Swift bindings and C headers. A target
//! rustup has no standard library for is built with nightly `-Zbuild-std`.
//! `lipo` and `xcodebuild -create-xcframework` need Xcode: elsewhere the exact
//! commands are printed with what was produced.
//!
//! `--zip` then packs the XCFramework for a release (`ditto`, the layout
//! SwiftPM expects: the `.xcframework` folder at the top of the zip) and
//! prints its SwiftPM checksum, the SHA-256 of the zip file (what
//! `swift package compute-checksum` prints), with the line for Package.swift.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bindings::{self, Lang};
use crate::sha256;
use crate::util::{cargo, cargo_of, installed_targets, root, run, show, target_dir, Args, Result};

/// The simulator architectures, one library joined by lipo.
const SIMULATOR_TARGETS: [&str; 2] = ["aarch64-apple-ios-sim", "x86_64-apple-ios"];

/// `cargo xtask xcframework [--profile mobile|release] [--zip]`
pub fn command(args: &[String]) -> Result {
    let mut args = Args::new(args);
    let profile = args.value("--profile")?.unwrap_or_else(|| "mobile".into());
    let zip = args.flag("--zip");
    args.rest()?;

    // Swift sources (committed copy refreshed) and the C header folder.
    let swift = bindings::generate(Lang::Swift, false, None)?;
    std::fs::copy(swift.join("Pocket.swift"), bindings::swift_sources().join("Pocket.swift"))
        .map_err(|e| e.to_string())?;
    let headers = swift.join("include");

    let installed = installed_targets();
    let build = |target: &str| staticlib(target, &profile, !installed.iter().any(|t| t == target));
    let device = build("aarch64-apple-ios")?;
    let simulator_parts = SIMULATOR_TARGETS.iter().map(|t| build(t)).collect::<Result<Vec<_>>>()?;
    let simulator = target_dir().join("ios-simulator").join(profile_dir(&profile)).join("libpocket_ffi.a");
    let mut lipo = Command::new("lipo");
    lipo.arg("-create").args(&simulator_parts).arg("-output").arg(&simulator);

    let mut slices = vec![device, simulator.clone()];
    if cfg!(target_os = "macos") {
        slices.push(build(if cfg!(target_arch = "aarch64") { "aarch64-apple-darwin" } else { "x86_64-apple-darwin" })?);
    }
    let output = root().join("ios/PocketFFI.xcframework");
    let mut xcodebuild = Command::new("xcodebuild");
    xcodebuild.arg("-create-xcframework");
    for lib in &slices {
        xcodebuild.arg("-library").arg(lib).arg("-headers").arg(&headers);
    }
    xcodebuild.arg("-output").arg(&output);

    if !cfg!(target_os = "macos") {
        eprintln!("\nBuilt (not on macOS, so no XCFramework yet):");
        for lib in slices.iter().take(1).chain(&simulator_parts) {
            let size = std::fs::metadata(lib).map(|m| m.len()).unwrap_or(0);
            eprintln!("  {} ({:.1} MB)", lib.display(), size as f64 / 1e6);
        }
        eprintln!("  {}/PocketFFI/{{PocketFFI.h,module.modulemap}}", headers.display());
        eprintln!("  {}", bindings::swift_sources().join("Pocket.swift").display());
        eprintln!("On a Mac with Xcode, run `cargo xtask xcframework` again, or from this output:");
        eprintln!("  mkdir -p {}", simulator.parent().expect("has a parent").display());
        eprintln!("  {}", show(&lipo));
        eprintln!("  {}", show(&xcodebuild));
        if zip {
            return Err("--zip packs the XCFramework, which only xcodebuild (on macOS) makes".into());
        }
        return Ok(());
    }

    std::fs::create_dir_all(simulator.parent().expect("has a parent")).map_err(|e| e.to_string())?;
    run(&mut lipo)?;
    if output.exists() {
        std::fs::remove_dir_all(&output).map_err(|e| format!("{}: {e}", output.display()))?;
    }
    run(&mut xcodebuild)?;
    eprintln!("\n{} is ready: `swift build` / `swift test` at the repository root use it", output.display());
    eprintln!("with POCKET_LOCAL_XCFRAMEWORK=1 set (see ios/README.md).");
    if zip {
        release_zip(&output)?;
    }
    Ok(())
}

/// Zip `xcframework` for a GitHub release and print its SwiftPM checksum and Package.swift line.
fn release_zip(xcframework: &Path) -> Result {
    let zip = target_dir().join("xcframework/PocketFFI.xcframework.zip");
    std::fs::create_dir_all(zip.parent().expect("has a parent")).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&zip);
    // --keepParent: the zip holds PocketFFI.xcframework/, as SwiftPM requires.
    run(Command::new("ditto").args(["-c", "-k", "--sequesterRsrc", "--keepParent"]).arg(xcframework).arg(&zip))?;
    let bytes = std::fs::read(&zip).map_err(|e| format!("{}: {e}", zip.display()))?;
    let checksum = sha256::hex(&bytes);
    std::fs::write(zip.with_extension("zip.sha256"), format!("{checksum}\n")).map_err(|e| e.to_string())?;
    let version = env!("CARGO_PKG_VERSION");
    eprintln!("\nRelease zip: {} ({:.1} MB)", zip.display(), bytes.len() as f64 / 1e6);
    eprintln!("SwiftPM checksum (sha256 of the zip): {checksum}");
    eprintln!("Upload the zip to the v{version} release, and set in Package.swift before tagging:");
    eprintln!("{}", release_line(&release_url(version), &checksum));
    Ok(())
}

/// Where the release zip of `version` is downloaded from: the repository's GitHub release.
fn release_url(version: &str) -> String {
    let repository = env!("CARGO_PKG_REPOSITORY");
    format!("{repository}/releases/download/v{version}/PocketFFI.xcframework.zip")
}

/// The `releasedXCFramework` declaration of Package.swift for a release.
fn release_line(url: &str, checksum: &str) -> String {
    format!("let releasedXCFramework: (url: String, checksum: String)? = (\n    url: \"{url}\",\n    checksum: \"{checksum}\"\n)")
}

/// Build `pocket_ffi` as a static library for `target`; returns its path.
fn staticlib(target: &str, profile: &str, build_std: bool) -> Result<PathBuf> {
    let mut cmd = if build_std { cargo_of("nightly") } else { cargo() };
    cmd.args(["rustc", "--target", target, "-p", "pocket-ffi", "--lib", "--crate-type", "staticlib"]);
    // The GPU backend (Metal) is part of the shipped library.
    cmd.args(["--features", "gpu", "--profile", profile]);
    if build_std {
        // No prebuilt standard library for this target: build it (needs `rustup component add rust-src --toolchain nightly`).
        cmd.args(["-Z", "build-std=std,panic_unwind"]);
    }
    run(&mut cmd)?;
    Ok(target_dir().join(target).join(profile_dir(profile)).join("libpocket_ffi.a"))
}

/// Cargo's output folder for `profile`.
fn profile_dir(profile: &str) -> &str {
    if profile == "dev" {
        "debug"
    } else {
        profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_release_line_is_what_package_swift_declares() {
        let manifest = std::fs::read_to_string(root().join("Package.swift")).unwrap();
        let declaration = "let releasedXCFramework: (url: String, checksum: String)? =";
        assert!(manifest.contains(declaration), "Package.swift no longer declares `{declaration}`");
        let line = release_line(&release_url("1.2.3"), &sha256::hex(b"zip"));
        assert!(line.starts_with(declaration), "{line}");
        assert!(
            line.contains(
                "\"https://github.com/pocket-llm/pocket/releases/download/v1.2.3/PocketFFI.xcframework.zip\""
            ),
            "{line}"
        );
        assert!(line.contains(&format!("checksum: \"{}\"", sha256::hex(b"zip"))), "{line}");
    }
}
