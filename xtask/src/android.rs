//! Android: `cargo xtask aar` and the cross-compiled static libraries that
//! prove the FFI crate builds for every mobile target (`cargo xtask staticlibs`).
//!
//! The AAR needs the Android NDK (to link `libpocket_ffi.so`) and cargo-ndk.
//! The Gradle module (android/pocket) runs cargo-ndk itself before building,
//! for arm64-v8a, armeabi-v7a and x86_64, linked with 16 KB page alignment
//! (`-Wl,-z,max-page-size=16384`, set for the Android targets in
//! .cargo/config.toml). Without an NDK this command builds the three static
//! libraries instead and says what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bindings::{self, Lang};
use crate::util::{cargo, on_path, root, run, target_dir, Args, Result};

/// Android ABIs and their Rust targets.
pub const ABIS: [(&str, &str); 3] = [
    ("arm64-v8a", "aarch64-linux-android"),
    ("armeabi-v7a", "armv7-linux-androideabi"),
    ("x86_64", "x86_64-linux-android"),
];

/// Every mobile target the FFI crate must build for.
pub const MOBILE_TARGETS: [&str; 4] =
    ["aarch64-apple-ios", "aarch64-linux-android", "armv7-linux-androideabi", "x86_64-linux-android"];

/// `cargo xtask staticlibs [--profile P] [--quick] [--target-dir DIR] [TARGET...]`
///
/// `--quick` keeps the profile but turns off LTO and allows 16 codegen units
/// (`CARGO_PROFILE_<P>_LTO=off`, `..._CODEGEN_UNITS=16`): the same code is
/// compiled for each target, about four times faster; the test suite uses it.
pub fn staticlibs_command(args: &[String]) -> Result {
    let mut args = Args::new(args);
    let profile = args.value("--profile")?.unwrap_or_else(|| "release".into());
    let quick = args.flag("--quick");
    let target_dir = args.value("--target-dir")?.map(PathBuf::from);
    let targets = args.rest()?;
    let targets: Vec<String> =
        if targets.is_empty() { MOBILE_TARGETS.iter().map(|t| t.to_string()).collect() } else { targets };
    let opts = Build { profile: &profile, quick, target_dir: target_dir.as_deref() };
    for target in &targets {
        staticlib(target, &opts)?;
    }
    Ok(())
}

struct Build<'a> {
    profile: &'a str,
    quick: bool,
    target_dir: Option<&'a Path>,
}

fn staticlib(target: &str, b: &Build) -> Result {
    let mut cmd = cargo();
    cmd.args(["rustc", "--target", target, "-p", "pocket-ffi", "--lib", "--crate-type", "staticlib"]);
    match b.profile {
        "release" => cmd.arg("--release"),
        p => cmd.args(["--profile", p]),
    };
    if let Some(dir) = b.target_dir {
        cmd.arg("--target-dir").arg(dir);
    }
    if b.quick {
        let p = b.profile.to_uppercase().replace('-', "_");
        cmd.env(format!("CARGO_PROFILE_{p}_LTO"), "off").env(format!("CARGO_PROFILE_{p}_CODEGEN_UNITS"), "16");
    }
    run(&mut cmd)?;
    let dir = if b.profile == "dev" { "debug" } else { b.profile };
    let lib = b.target_dir.map_or_else(target_dir, Path::to_path_buf).join(target).join(dir).join("libpocket_ffi.a");
    let size = std::fs::metadata(&lib).map_err(|e| format!("{}: {e}", lib.display()))?.len();
    eprintln!("  {} ({:.1} MB)", lib.display(), size as f64 / 1e6);
    Ok(())
}

/// `cargo xtask aar [--profile mobile|release]`
pub fn aar_command(args: &[String]) -> Result {
    let mut args = Args::new(args);
    let profile = args.value("--profile")?.unwrap_or_else(|| "mobile".into());
    args.rest()?;

    // Kotlin sources (the committed copy refreshed).
    let kotlin = bindings::generate(Lang::Kotlin, false, None)?;
    crate::util::copy(
        &kotlin.join("uniffi/pocket/pocket.kt"),
        &bindings::kotlin_sources().join("uniffi/pocket/pocket.kt"),
    )?;

    let ndk = ["ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "ANDROID_NDK"].iter().find_map(std::env::var_os);
    let cargo_ndk = Command::new("cargo").args(["ndk", "--version"]).output().is_ok_and(|o| o.status.success());
    let android = root().join("android");
    if ndk.is_some() && cargo_ndk {
        let gradle = if android.join("gradlew").is_file() {
            Some(android.join("gradlew").display().to_string())
        } else if on_path("gradle") {
            Some("gradle".to_string())
        } else {
            None
        };
        match gradle {
            Some(gradle) => {
                // The module's cargoNdk task builds and links the three ABIs first.
                run(Command::new(gradle)
                    .current_dir(&android)
                    .args([":pocket:assembleRelease", &format!("-Ppocket.cargoProfile={profile}")]))?;
                eprintln!("\nAAR: {}", android.join("pocket/build/outputs/aar/pocket-release.aar").display());
            }
            None => {
                let mut cmd = cargo();
                cmd.arg("ndk");
                for (abi, _) in ABIS {
                    cmd.args(["-t", abi]);
                }
                cmd.args(["--platform", "24", "-o"]).arg(android.join("pocket/src/main/jniLibs"));
                cmd.args(["build", "-p", "pocket-ffi", "--lib", "--profile", &profile]);
                run(&mut cmd)?;
                eprintln!("\nShared libraries are in android/pocket/src/main/jniLibs. No Gradle found:");
                eprintln!("open android/ in Android Studio (or run `gradle wrapper` there once) and");
                eprintln!("build :pocket:assembleRelease with -Ppocket.skipCargo=true to package the AAR.");
            }
        }
        return Ok(());
    }

    eprintln!("No Android NDK (ANDROID_NDK_HOME) or no cargo-ndk (`cargo install cargo-ndk`): building");
    eprintln!("the static libraries for the three ABIs to check the code compiles; the shared");
    eprintln!("libraries the AAR ships are linked by the NDK's clang.");
    for (_, target) in ABIS {
        staticlib(target, &Build { profile: &profile, quick: false, target_dir: None })?;
    }
    eprintln!("\nOn a machine with the NDK and cargo-ndk:");
    eprintln!("  export ANDROID_NDK_HOME=$ANDROID_HOME/ndk/<version>");
    eprintln!("  cargo xtask aar        # runs `gradle :pocket:assembleRelease` in android/");
    eprintln!("  -> android/pocket/build/outputs/aar/pocket-release.aar (arm64-v8a, armeabi-v7a, x86_64; 16 KB pages)");
    Ok(())
}
