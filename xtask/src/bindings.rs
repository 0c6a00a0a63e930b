//! `cargo xtask bindings swift|kotlin|python` and the binding test runners.
//!
//! Bindings are generated in library mode: the pinned `uniffi-bindgen`
//! (bindings/uniffi-bindgen) reads the interface from the host build of
//! `pocket_ffi` itself, with the settings of `bindings/uniffi.toml`.
//! The Swift and Kotlin outputs are committed (ios/Sources/Pocket/Pocket.swift,
//! android/pocket/src/main/kotlin/uniffi/pocket/pocket.kt) so they can be
//! reviewed; `test-bindings` fails when they are stale.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, cargo, copy, host_cdylib, root, run, target_dir, Args, Result};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lang {
    Swift,
    Kotlin,
    Python,
}

impl Lang {
    fn parse(s: &str) -> Result<Lang> {
        match s {
            "swift" => Ok(Lang::Swift),
            "kotlin" => Ok(Lang::Kotlin),
            "python" => Ok(Lang::Python),
            other => Err(format!("unknown language '{other}' (swift, kotlin or python)")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lang::Swift => "swift",
            Lang::Kotlin => "kotlin",
            Lang::Python => "python",
        }
    }
}

/// Where generated Swift sources are committed.
pub fn swift_sources() -> PathBuf {
    root().join("ios/Sources/Pocket")
}

/// Where generated Kotlin sources are committed.
pub fn kotlin_sources() -> PathBuf {
    root().join("android/pocket/src/main/kotlin")
}

const KOTLIN_FILE: &str = "uniffi/pocket/pocket.kt";

/// `cargo xtask bindings <lang> [--release] [--out DIR]` (`--out-dir` works too)
pub fn command(args: &[String]) -> Result {
    let mut args = Args::new(args);
    let release = args.flag("--release");
    let out = args.value("--out")?.or(args.value("--out-dir")?).map(PathBuf::from);
    let rest = args.rest()?;
    let [lang] = rest.as_slice() else { return Err("usage: cargo xtask bindings swift|kotlin|python".into()) };
    let lang = Lang::parse(lang)?;
    let installed = out.is_none();
    let dir = generate(lang, release, out)?;
    if installed {
        install(lang, &dir)?;
    }
    eprintln!("{} bindings generated in {}", lang.name(), dir.display());
    Ok(())
}

/// Build the host library and the pinned bindgen, and generate `lang` into
/// `out` (default `target/bindings/<lang>`). Returns the output folder.
pub fn generate(lang: Lang, release: bool, out: Option<PathBuf>) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    let mut build = cargo();
    // The host library with the GPU backend, as the Linux bindings ship it
    // (the Python and Kotlin tests then load models on lavapipe too).
    build.args(["build", "-p", "pocket-ffi", "-p", "uniffi-bindgen", "--features", "pocket-ffi/gpu"]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let bin_dir = target_dir().join(profile);
    let lib = bin_dir.join(host_cdylib("pocket_ffi"));
    let out = out.unwrap_or_else(|| target_dir().join("bindings").join(lang.name()));
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    run(Command::new(bin_dir.join(format!("uniffi-bindgen{}", std::env::consts::EXE_SUFFIX)))
        .current_dir(root())
        .args(["generate", "--no-format", "--language", lang.name(), "--library"])
        .arg(&lib)
        .arg("--out-dir")
        .arg(&out))?;
    match lang {
        // The module loads the library from its own folder.
        Lang::Python => copy(&lib, &out.join(lib.file_name().expect("library file name")))?,
        // The header folder of an XCFramework slice: `PocketFFI/{PocketFFI.h,module.modulemap}`
        // (in a subfolder, so that it cannot collide with another framework's module map).
        Lang::Swift => {
            copy(&out.join("PocketFFI.h"), &out.join("include/PocketFFI/PocketFFI.h"))?;
            copy(&out.join("PocketFFI.modulemap"), &out.join("include/PocketFFI/module.modulemap"))?;
        }
        Lang::Kotlin => {}
    }
    Ok(out)
}

/// Copy generated sources to where the Swift package and the Gradle module use them.
fn install(lang: Lang, dir: &Path) -> Result {
    match lang {
        Lang::Swift => copy(&dir.join("Pocket.swift"), &swift_sources().join("Pocket.swift")),
        Lang::Kotlin => copy(&dir.join(KOTLIN_FILE), &kotlin_sources().join(KOTLIN_FILE)),
        Lang::Python => Ok(()),
    }
}

/// The committed Swift and Kotlin bindings must equal freshly generated ones.
fn check_committed() -> Result {
    for (lang, generated, committed) in [
        (Lang::Swift, "Pocket.swift", swift_sources().join("Pocket.swift")),
        (Lang::Kotlin, KOTLIN_FILE, kotlin_sources().join(KOTLIN_FILE)),
    ] {
        let dir = generate(lang, false, Some(target_dir().join("bindings/check").join(lang.name())))?;
        let fresh = std::fs::read(dir.join(generated)).map_err(|e| e.to_string())?;
        if std::fs::read(&committed).ok().as_deref() != Some(fresh.as_slice()) {
            return Err(format!(
                "{} is stale: run `cargo xtask bindings {}` and commit the result",
                committed.display(),
                lang.name()
            ));
        }
    }
    eprintln!("committed Swift and Kotlin bindings are up to date");
    Ok(())
}

/// `cargo xtask test-bindings python|kotlin|generated`
pub fn test_command(args: &[String]) -> Result {
    match args.first().map(String::as_str) {
        Some("python") => test_python(&args[1..]),
        Some("kotlin") => test_kotlin(),
        Some("generated") => check_committed(),
        _ => Err("usage: cargo xtask test-bindings python [PYTEST ARGS]|kotlin|generated".into()),
    }
}

/// pytest over bindings/tests/python against the generated module.
fn test_python(pytest_args: &[String]) -> Result {
    let dir = generate(Lang::Python, false, None)?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(Command::new(python)
        .current_dir(root())
        .env("POCKET_PY_BINDINGS", &dir)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "bindings/tests/python"])
        .args(pytest_args))
}

/// The Kotlin harness (bindings/tests/kotlin) on the JVM against the host
/// library: generated Kotlin + the Flow layer + the descriptor checks behind the
/// Android helpers + the tests, compiled with kotlinc
/// (KOTLIN_HOME, default the npm `kotlin-compiler` package in ~/.cache/pocket/tools)
/// and run with JNA (JNA_JAR, default Debian's /usr/share/java/jna.jar).
fn test_kotlin() -> Result {
    let kotlin_home = std::env::var_os("KOTLIN_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/pocket/tools/node_modules/kotlin-compiler")
    });
    let jna = std::env::var_os("JNA_JAR").map(PathBuf::from).unwrap_or_else(|| "/usr/share/java/jna.jar".into());
    let lib_dir = kotlin_home.join("lib");
    for need in [lib_dir.join("kotlin-compiler.jar"), jna.clone()] {
        if !need.is_file() {
            return Err(format!("{} not found (see scripts/test.sh for how it is installed)", need.display()));
        }
    }
    // Builds the host library too; the committed sources are what gets compiled.
    check_committed()?;
    // Every Android-free source of the AAR module; PocketAndroid.kt (the Android shell) needs the SDK.
    let mut sources = vec![kotlin_sources().join(KOTLIN_FILE)];
    sources.extend(
        ["PocketFlow.kt", "PocketDescriptors.kt", "PocketMemory.kt", "PocketDownload.kt"]
            .map(|f| kotlin_sources().join("uniffi/pocket").join(f)),
    );
    sources.extend(util::files_with_extension(&root().join("bindings/tests/kotlin"), "kt")?);

    let jar = target_dir().join("bindings/kotlin-tests.jar");
    let coroutines = lib_dir.join("kotlinx-coroutines-core-jvm.jar");
    let stdlib = lib_dir.join("kotlin-stdlib.jar");
    let classpath = |parts: &[&Path]| std::env::join_paths(parts).map_err(|e| e.to_string());
    if !util::newer_than_all(&jar, &sources) {
        let compiler = ["kotlin-compiler.jar", "kotlin-stdlib.jar", "kotlin-script-runtime.jar", "kotlin-reflect.jar"]
            .map(|j| lib_dir.join(j));
        let compiler: Vec<&Path> = compiler.iter().map(PathBuf::as_path).collect();
        run(Command::new("java")
            .args(["-Xmx1g", "-Xss8m", "-cp"])
            .arg(classpath(&compiler)?)
            .arg("org.jetbrains.kotlin.cli.jvm.K2JVMCompiler")
            .arg("-kotlin-home")
            .arg(&kotlin_home)
            .args(["-no-reflect", "-nowarn", "-jvm-target", "17", "-cp"])
            .arg(classpath(&[&jna, &coroutines])?)
            .arg("-d")
            .arg(&jar)
            .args(&sources))?;
    }
    run(Command::new("java")
        .current_dir(root())
        .arg(format!("-Djna.library.path={}", target_dir().join("debug").display()))
        .arg("-cp")
        .arg(classpath(&[&jar, &stdlib, &coroutines, &jna])?)
        .arg("PocketTestKt"))
}
