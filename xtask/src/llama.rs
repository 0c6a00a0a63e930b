//! Building the reference engine, llama.cpp, outside the repository: the copy
//! vendored in the PyPI sdist of llama-cpp-python 0.3.36 (commit 0c1e570),
//! for the host (side-by-side benchmarks) and for aarch64 (instruction counts
//! under qemu). Builds are cached in `$POCKET_CACHE` (~/.cache/pocket).

use std::path::{Path, PathBuf};
use std::process::Command;

pub const SDIST: &str = "llama_cpp_python-0.3.36";

pub fn cache_dir() -> PathBuf {
    match std::env::var_os("POCKET_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/pocket"),
    }
}

pub fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {status}"))
    }
}

/// The unpacked llama.cpp source tree (downloading the sdist with pip if needed).
pub fn source() -> Result<PathBuf, String> {
    let root = cache_dir().join("llama-src");
    let src = root.join(SDIST).join("vendor/llama.cpp");
    if src.join("CMakeLists.txt").is_file() {
        return Ok(src);
    }
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    // Only this package as source: with `:all:`, pip would also build the
    // sdist's build requirements (CMake itself) from source to read its metadata.
    run(Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python"])
        .arg(format!("llama-cpp-python=={}", &SDIST["llama_cpp_python-".len()..]))
        .arg("-d")
        .arg(&root))?;
    run(Command::new("tar").arg("xzf").arg(root.join(format!("{SDIST}.tar.gz"))).arg("-C").arg(&root))?;
    Ok(src)
}

/// Flags that keep AMX out (its instructions fault on some VMs).
const NO_AMX: &str = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";

/// Host build of llama-bench for the native ISA (`isa` None) or, with
/// `Some("avx2")`, for AVX2 + FMA + F16C only (GGML_NATIVE off): the match
/// of Pocket's `POCKET_ISA=avx2` table on a CPU that has more. Returns the
/// bin directory.
pub fn host_build(isa: Option<&str>) -> Result<PathBuf, String> {
    let (dir, flags): (&str, &[&str]) = match isa {
        None => ("llama-build-host", &["-DGGML_NATIVE=ON"]),
        Some("avx2") => (
            "llama-build-host-avx2",
            &[
                "-DGGML_NATIVE=OFF",
                "-DGGML_AVX=ON",
                "-DGGML_AVX2=ON",
                "-DGGML_FMA=ON",
                "-DGGML_F16C=ON",
                "-DGGML_BMI2=ON",
                "-DGGML_AVX_VNNI=OFF",
                "-DGGML_AVX512=OFF",
            ],
        ),
        Some(other) => return Err(format!("no llama.cpp build for ISA {other:?} (builds: native, avx2)")),
    };
    let build = cache_dir().join(dir);
    let bin = build.join("bin");
    if bin.join("llama-bench").is_file() {
        return Ok(bin);
    }
    require(&[("cmake", "cmake"), ("c++", "g++")])?;
    let src = source()?;
    run(Command::new("cmake")
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build)
        .args(["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF"])
        .args(flags)
        .arg(format!("-DCMAKE_C_FLAGS={NO_AMX}"))
        .arg(format!("-DCMAKE_CXX_FLAGS={NO_AMX}")))?;
    run(Command::new("cmake").arg("--build").arg(&build).args(["-j", &jobs(), "--target", "llama-bench"]))?;
    Ok(bin)
}

/// Static aarch64 build of llama-bench for `-march=armv8.2-a+dotprod(+i8mm)`.
pub fn aarch64_build(i8mm: bool) -> Result<PathBuf, String> {
    let name = if i8mm { "llama-build-aarch64-i8mm" } else { "llama-build-aarch64-dotprod" };
    let build = cache_dir().join(name);
    let exe = build.join("bin/llama-bench");
    if exe.is_file() {
        return Ok(exe);
    }
    // The test command installs only the C cross-compiler; llama.cpp needs C++ too.
    require(&[
        ("cmake", "cmake"),
        ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
        ("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu"),
    ])?;
    let src = source()?;
    let march = if i8mm { "-march=armv8.2-a+dotprod+i8mm" } else { "-march=armv8.2-a+dotprod" };
    run(Command::new("cmake")
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build)
        .args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_SYSTEM_NAME=Linux",
            "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
            "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_CURL=OFF",
            "-DGGML_NATIVE=OFF",
            "-DGGML_OPENMP=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
        ])
        .arg(format!("-DCMAKE_C_FLAGS={march}"))
        .arg(format!("-DCMAKE_CXX_FLAGS={march}"))
        .arg("-DCMAKE_EXE_LINKER_FLAGS=-static"))?;
    run(Command::new("cmake").arg("--build").arg(&build).args(["-j", &jobs(), "--target", "llama-bench"]))?;
    Ok(exe)
}

/// An error naming the package to install for the first of `tools` (program,
/// Debian package) that does not run, instead of a failed spawn deep in a build.
fn require(tools: &[(&str, &str)]) -> Result<(), String> {
    for (tool, package) in tools {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!("{tool} not found: install it first (apt-get install {package})"));
        }
    }
    Ok(())
}

fn jobs() -> String {
    std::thread::available_parallelism().map_or(2, |n| n.get()).to_string()
}

/// The workspace root (xtask runs from anywhere inside it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// `cargo xtask llama-logits --model FILE --tokens IDS --out FILE.npy`:
/// llama.cpp's teacher-forced logits for one batch of token ids, as the
/// fixtures' `*.llama.npy` files were made (n_ctx 256, F32 KV cache, flash
/// attention off, plain ggml kernels, 2 threads), written as an f32 `.npy` of
/// positions × vocabulary. The reference for families whose tiny models are
/// made here (`synth-model --geometry tiny`) instead of shipped as fixtures.
pub fn logits_command(args: &[String]) -> Result<(), String> {
    let (mut model, mut tokens, mut out) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--model" => model = Some(value.clone()),
            "--tokens" => tokens = Some(value.clone()),
            "--out" => out = Some(PathBuf::from(value)),
            other => return Err(format!("llama-logits: unknown option {other}")),
        }
    }
    let (Some(model), Some(tokens), Some(out)) = (model, tokens, out) else {
        return Err("usage: cargo xtask llama-logits --model FILE --tokens IDS --out FILE.npy".into());
    };
    let exe = dump_logits_tool()?;
    let raw = out.with_extension("f32");
    run(Command::new(&exe).arg(&model).arg(&tokens).arg(&raw))?;
    let bytes = std::fs::read(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
    std::fs::remove_file(&raw).ok();
    let rows = tokens.split(',').count();
    let cols = bytes.len() / 4 / rows.max(1);
    std::fs::write(&out, npy_f32(rows, cols, &bytes)).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("{rows} x {cols} logits -> {}", out.display());
    Ok(())
}

/// `xtask/c/dump-logits.c` compiled against the host build's libllama.
fn dump_logits_tool() -> Result<PathBuf, String> {
    let bin = host_build(None)?;
    let exe = cache_dir().join("tools/dump-logits");
    let c = workspace_root().join("xtask/c/dump-logits.c");
    let fresh = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    if exe.is_file() && fresh(&exe) >= fresh(&c) {
        return Ok(exe);
    }
    require(&[("cc", "gcc")])?;
    let src = source()?;
    std::fs::create_dir_all(exe.parent().unwrap()).map_err(|e| e.to_string())?;
    run(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&c)
        .arg(format!("-I{}", src.join("include").display()))
        .arg(format!("-I{}", src.join("ggml/include").display()))
        .arg(format!("-L{}", bin.display()))
        .args(["-lllama", "-lggml", "-lggml-base"])
        .arg(format!("-Wl,-rpath,{}", bin.display())))?;
    Ok(exe)
}

/// A version-1 `.npy` of little-endian f32 `rows × cols`.
fn npy_f32(rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}
