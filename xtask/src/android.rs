//! Android: `cargo xtask aar` and the cross-compiled static libraries that
//! prove the FFI crate builds for every mobile target (`cargo xtask staticlibs`).
//!
//! The AAR needs the Android NDK (to link `libpocket_ffi.so`) and cargo-ndk.
//! The Gradle module (android/pocket) runs cargo-ndk itself before building,
//! for arm64-v8a, armeabi-v7a and x86_64, linked with 16 KB page alignment
//! (`-Wl,-z,max-page-size=16384`, passed to the linker by bindings/build.rs).
//! The AAR is then checked for that alignment, with the JNA AAR it depends on
//! (pagesize.rs), and published with its POM to a local Maven repository.
//! Without an NDK this command builds the three static libraries instead and
//! says what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bindings::{self, Lang};
use crate::pagesize;
use crate::util::{cargo, root, run, target_dir, Args, Result};

/// Android ABIs and their Rust targets.
pub const ABIS: [(&str, &str); 3] = [
    ("arm64-v8a", "aarch64-linux-android"),
    ("armeabi-v7a", "armv7-linux-androideabi"),
    ("x86_64", "x86_64-linux-android"),
];

/// Every mobile target the FFI crate must build for.
pub const MOBILE_TARGETS: [&str; 4] =
    ["aarch64-apple-ios", "aarch64-linux-android", "armv7-linux-androideabi", "x86_64-linux-android"];

/// `cargo xtask staticlibs [--profile P] [--quick] [--no-gpu] [--no-tls] [--target-dir DIR] [TARGET...]`
///
/// `--quick` keeps the profile but turns off LTO and allows 16 codegen units
/// (`CARGO_PROFILE_<P>_LTO=off`, `..._CODEGEN_UNITS=16`): the same code is
/// compiled for each target, about four times faster; the test suite uses it.
/// `--no-gpu` leaves the GPU backend out (wgpu's compile is most of the time
/// of a build: the test suite builds every target without it and only
/// checks the GPU build for the arm64 targets).
/// `--no-tls` leaves https out of `downloadModel` (pocket-ffi's default
/// feature `tls`: ring compiles C for the target, which needs Xcode or the
/// NDK's clang; the test suite builds without them).
pub fn staticlibs_command(args: &[String]) -> Result {
    let mut args = Args::new(args);
    let profile = args.value("--profile")?.unwrap_or_else(|| "release".into());
    let quick = args.flag("--quick");
    let gpu = !args.flag("--no-gpu");
    let tls = !args.flag("--no-tls");
    let target_dir = args.value("--target-dir")?.map(PathBuf::from);
    let targets = args.rest()?;
    let targets: Vec<String> =
        if targets.is_empty() { MOBILE_TARGETS.iter().map(|t| t.to_string()).collect() } else { targets };
    let opts = Build { profile: &profile, quick, gpu, tls, target_dir: target_dir.as_deref() };
    for target in &targets {
        staticlib(target, &opts)?;
    }
    Ok(())
}

struct Build<'a> {
    profile: &'a str,
    quick: bool,
    /// With the GPU backend (Metal on iOS, Vulkan on Android), as the shipped libraries have it.
    gpu: bool,
    /// With https for downloads (rustls on ring: needs a C compiler for the target).
    tls: bool,
    target_dir: Option<&'a Path>,
}

fn staticlib(target: &str, b: &Build) -> Result {
    let mut cmd = cargo();
    cmd.args(["rustc", "--target", target, "-p", "pocket-ffi", "--lib", "--crate-type", "staticlib"]);
    if !b.tls {
        cmd.arg("--no-default-features");
    }
    if b.gpu {
        cmd.args(["--features", "gpu"]);
    }
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
    let out = b.target_dir.map_or_else(target_dir, Path::to_path_buf);
    crate::util::stub_foreign_linker(&mut cmd, target, &out)?;
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
        // The committed Gradle wrapper; the module's cargoNdk task builds and links the three ABIs first.
        let gradlew = android.join(if cfg!(windows) { "gradlew.bat" } else { "gradlew" });
        run(Command::new(gradlew).current_dir(&android).args([
            ":pocket:assembleRelease",
            ":pocket:publishReleasePublicationToLocalRepository",
            &format!("-Ppocket.cargoProfile={profile}"),
        ]))?;
        let aar = android.join("pocket/build/outputs/aar/pocket-release.aar");
        check_aar(&aar)?;
        let repo = android.join("build/maven");
        check_pom(&repo)?;
        eprintln!("\nAAR: {}", aar.display());
        eprintln!("Maven repository (AAR + POM): {}", repo.display());
        eprintln!("  dependencies {{ implementation(\"dev.pocket:pocket:{}\") }}", env!("CARGO_PKG_VERSION"));
        return Ok(());
    }

    eprintln!("No Android NDK (ANDROID_NDK_HOME) or no cargo-ndk (`cargo install cargo-ndk`): building");
    eprintln!("the static libraries for the three ABIs to check the code compiles; the shared");
    eprintln!("libraries the AAR ships are linked by the NDK's clang.");
    for (_, target) in ABIS {
        staticlib(target, &Build { profile: &profile, quick: false, gpu: true, tls: true, target_dir: None })?;
    }
    eprintln!("\nOn a machine with the NDK and cargo-ndk:");
    eprintln!("  export ANDROID_NDK_HOME=$ANDROID_HOME/ndk/<version>");
    eprintln!(
        "  cargo xtask aar        # runs `gradlew :pocket:assembleRelease` and the Maven publication in android/"
    );
    eprintln!("  -> android/pocket/build/outputs/aar/pocket-release.aar (arm64-v8a, armeabi-v7a, x86_64; 16 KB pages)");
    eprintln!("  -> android/build/maven (dev.pocket:pocket with its POM: JNA and kotlinx-coroutines)");
    Ok(())
}

/// The Gradle module's build script, where the JNA dependency is pinned.
fn module_script() -> PathBuf {
    root().join("android/pocket/build.gradle.kts")
}

/// The JNA release pinned in `script` (`net.java.dev.jna:jna:X.Y.Z@aar`), as numbers.
fn jna_version(script: &str) -> Result<[u32; 3]> {
    const COORDINATE: &str = "\"net.java.dev.jna:jna:";
    let mut pins = script.match_indices(COORDINATE).map(|(at, _)| &script[at + COORDINATE.len()..]);
    let pin = pins.next().ok_or("no net.java.dev.jna:jna dependency")?;
    if pins.next().is_some() {
        return Err("JNA is pinned more than once".into());
    }
    let version = pin.split('"').next().unwrap_or_default();
    let Some(number) = version.strip_suffix("@aar") else {
        return Err(format!("JNA {version}: depend on the @aar artifact, which carries the Android libjnidispatch.so"));
    };
    let parts: Vec<u32> = number
        .split('.')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| format!("JNA version {number}: {e}"))?;
    parts.try_into().map_err(|p: Vec<u32>| format!("JNA version {number}: {} parts, expected 3", p.len()))
}

/// The oldest JNA whose Android `libjnidispatch.so` is 16 KB aligned (5.16/5.17
/// fixed the alignment) without the Structure deadlock 5.16 brought (fixed in 5.18).
#[cfg(test)]
const MIN_JNA: [u32; 3] = [5, 18, 1];

/// The built AAR: a 16 KB-aligned `libpocket_ffi.so` for each ABI, and the
/// JNA AAR it depends on (from Gradle's cache) aligned too.
fn check_aar(aar: &Path) -> Result {
    eprintln!("\n16 KB page alignment:");
    let mut libs = pagesize::libraries(aar)?;
    for (abi, _) in ABIS {
        let name = format!("!jni/{abi}/libpocket_ffi.so");
        if !libs.iter().any(|l| l.name.ends_with(&name)) {
            return Err(format!("{}: no jni/{abi}/libpocket_ffi.so", aar.display()));
        }
    }
    let script = module_script();
    let version = jna_version(&std::fs::read_to_string(&script).map_err(|e| format!("{}: {e}", script.display()))?)?;
    let jna = jna_aar_in_gradle_cache(version)?;
    let jna_libs = pagesize::libraries(&jna)?;
    if jna_libs.is_empty() {
        return Err(format!("{}: no native libraries in the JNA AAR", jna.display()));
    }
    libs.extend(jna_libs);
    pagesize::require_16k(&libs)
}

/// `jna-X.Y.Z.aar` where Gradle keeps downloaded artifacts
/// (`$GRADLE_USER_HOME` or `~/.gradle`, `caches/modules-2/files-2.1/<group>/<name>/<version>/<sha1>/`).
fn jna_aar_in_gradle_cache([a, b, c]: [u32; 3]) -> Result<PathBuf> {
    let version = format!("{a}.{b}.{c}");
    let home = std::env::var_os("GRADLE_USER_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".gradle")))
        .ok_or("neither GRADLE_USER_HOME nor HOME is set")?;
    let dir = home.join("caches/modules-2/files-2.1/net.java.dev.jna/jna").join(&version);
    let file = format!("jna-{version}.aar");
    std::fs::read_dir(&dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join(&file)))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{file} not found under {} (the Gradle build should have downloaded it)", dir.display()))
}

/// The published POM must carry the dependencies an app needs at run time.
fn check_pom(repo: &Path) -> Result {
    let version = env!("CARGO_PKG_VERSION");
    let pom = repo.join(format!("dev/pocket/pocket/{version}/pocket-{version}.pom"));
    let text = std::fs::read_to_string(&pom).map_err(|e| format!("{}: {e}", pom.display()))?;
    for artifact in ["<artifactId>jna</artifactId>", "<artifactId>kotlinx-coroutines-android</artifactId>"] {
        if !text.contains(artifact) {
            return Err(format!("{}: no {artifact} dependency", pom.display()));
        }
    }
    eprintln!("POM: {} (JNA, kotlinx-coroutines)", pom.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_jna_loads_on_16k_page_devices() {
        let script = std::fs::read_to_string(module_script()).unwrap();
        let pinned = jna_version(&script).unwrap();
        assert!(pinned >= MIN_JNA, "android/pocket/build.gradle.kts pins JNA {pinned:?}, below {MIN_JNA:?}");
    }

    #[test]
    fn jna_versions_are_read_from_the_dependency_line() {
        let line = |v: &str| format!("dependencies {{\n    api(\"net.java.dev.jna:jna:{v}\")\n}}");
        assert_eq!(jna_version(&line("5.18.1@aar")).unwrap(), [5, 18, 1]);
        assert_eq!(jna_version(&line("5.9.0@aar")).unwrap(), [5, 9, 0]);
        assert!(jna_version(&line("5.9.0@aar")).unwrap() < MIN_JNA, "compared as numbers, not text");
        assert!(jna_version(&line("5.15.0@aar")).unwrap() < MIN_JNA);
        assert!(jna_version(&line("5.18.1")).unwrap_err().contains("@aar"));
        assert!(jna_version(&line("5.18@aar")).unwrap_err().contains("3"));
        assert!(jna_version("dependencies {}").is_err());
        assert!(jna_version(&(line("5.18.1@aar") + &line("5.15.0@aar"))).unwrap_err().contains("more than once"));
    }
}
