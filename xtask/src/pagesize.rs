//! `cargo xtask check-16k FILE...`: whether the native libraries in a `.so`,
//! an AAR or an APK load on 16 KB-page Android devices.
//!
//! Every `LOAD` segment of every library must have `p_align` ≥ 16384 (see
//! elf.rs). `cargo xtask aar` runs this on the AAR it builds and on the JNA
//! AAR the library depends on, whose `libjnidispatch.so` ends up in every app
//! too; a developer can run it on their own APK.

use std::path::Path;

use crate::elf::{self, PAGE_16K};
use crate::util::{Args, Result};
use crate::zip;

/// One native library and the alignment of each of its `LOAD` segments.
#[derive(Debug)]
pub struct Library {
    /// The file, or `archive!entry` for one inside a zip.
    pub name: String,
    pub aligns: Vec<u64>,
}

impl Library {
    pub fn loads_on_16k(&self) -> bool {
        self.aligns.iter().all(|&a| a >= PAGE_16K)
    }
}

/// `cargo xtask check-16k FILE...`
pub fn command(args: &[String]) -> Result {
    let files = Args::new(args).rest()?;
    if files.is_empty() {
        return Err("usage: cargo xtask check-16k FILE.so|FILE.aar|FILE.apk...".into());
    }
    let mut all = Vec::new();
    for file in &files {
        let libs = libraries(Path::new(file))?;
        if libs.is_empty() {
            eprintln!("{file}: no native libraries");
        }
        all.extend(libs);
    }
    require_16k(&all)
}

/// The native libraries of `path`: the file itself when it is an ELF file,
/// else every `*.so` inside it as a zip archive (AAR, APK, JAR).
pub fn libraries(path: &Path) -> Result<Vec<Library>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.starts_with(b"\x7fELF") {
        return Ok(vec![inspect(path.display().to_string(), &bytes)?]);
    }
    let entries = zip::extract(&bytes, |name| name.ends_with(".so")).map_err(|e| format!("{}: {e}", path.display()))?;
    entries.into_iter().map(|(name, so)| inspect(format!("{}!{name}", path.display()), &so)).collect()
}

fn inspect(name: String, elf: &[u8]) -> Result<Library> {
    let aligns = elf::load_segments(elf).map_err(|e| format!("{name}: {e}"))?.iter().map(|l| l.align).collect();
    Ok(Library { name, aligns })
}

/// Print each library's alignments; an error names every library aligned for smaller pages.
pub fn require_16k(libs: &[Library]) -> Result {
    let mut bad = Vec::new();
    for lib in libs {
        let aligns: Vec<String> = lib.aligns.iter().map(|a| format!("{a:#x}")).collect();
        let verdict = if lib.loads_on_16k() { "ok" } else { "NOT 16 KB aligned" };
        eprintln!("  {}: LOAD align {} ({verdict})", lib.name, aligns.join(" "));
        if !lib.loads_on_16k() {
            bad.push(lib.name.as_str());
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} native librar{} will not load on 16 KB-page devices (a LOAD segment has p_align < 16384): {}\n\
         link with -Wl,-z,max-page-size=16384, or move to a release of the dependency built that way",
        bad.len(),
        if bad.len() == 1 { "y" } else { "ies" },
        bad.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::elf::fixture::{shared_library, EM_AARCH64, EM_ARM, EM_X86_64};

    /// A fresh folder under the system temp dir for one test.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pocket-xtask-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The libraries as a 16 KB linker and a 4 KB one lay them out (ELF64 and ELF32).
    fn aligned_arm64() -> Vec<u8> {
        shared_library(true, false, EM_AARCH64, &[0x4000, 0x4000])
    }
    fn aligned_armv7() -> Vec<u8> {
        shared_library(false, false, EM_ARM, &[0x4000, 0x4000])
    }
    fn unaligned_x86_64() -> Vec<u8> {
        shared_library(true, false, EM_X86_64, &[0x1000, 0x1000])
    }
    fn unaligned_armv7() -> Vec<u8> {
        shared_library(false, false, EM_ARM, &[0x1000, 0x1000])
    }

    #[test]
    fn aligned_libraries_pass_and_unaligned_ones_fail_as_files() {
        let dir = scratch("files");
        for (name, so, ok) in [
            ("aligned-arm64.so", aligned_arm64(), true),
            ("aligned-armv7.so", aligned_armv7(), true),
            ("unaligned-x86_64.so", unaligned_x86_64(), false),
            ("unaligned-armv7.so", unaligned_armv7(), false),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, so).unwrap();
            let libs = libraries(&path).unwrap();
            assert_eq!(libs.len(), 1);
            assert_eq!(libs[0].loads_on_16k(), ok, "{name}: {:?}", libs[0]);
            let result = require_16k(&libs);
            assert_eq!(result.is_ok(), ok, "{name}: {result:?}");
            if let Err(e) = result {
                assert!(e.contains(name), "{e}");
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_aar_fails_on_its_one_unaligned_library_and_names_it() {
        let dir = scratch("aar");
        let good = dir.join("good.aar");
        std::fs::write(
            &good,
            zip::fixture::archive(&[
                ("AndroidManifest.xml", b"<manifest/>", true),
                ("classes.jar", b"PK", false),
                ("jni/arm64-v8a/libpocket_ffi.so", &aligned_arm64(), true),
                ("jni/armeabi-v7a/libpocket_ffi.so", &aligned_armv7(), true),
                ("jni/x86_64/libpocket_ffi.so", &shared_library(true, false, EM_X86_64, &[0x4000, 0x4000]), false),
            ]),
        )
        .unwrap();
        let libs = libraries(&good).unwrap();
        assert_eq!(libs.len(), 3);
        require_16k(&libs).unwrap();

        let bad = dir.join("jna.aar");
        std::fs::write(
            &bad,
            zip::fixture::archive(&[
                ("jni/arm64-v8a/libjnidispatch.so", &aligned_arm64(), true),
                ("jni/x86_64/libjnidispatch.so", &unaligned_x86_64(), true),
            ]),
        )
        .unwrap();
        let err = require_16k(&libraries(&bad).unwrap()).unwrap_err();
        assert!(err.contains("jna.aar!jni/x86_64/libjnidispatch.so"), "{err}");
        assert!(!err.contains("arm64-v8a"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_that_is_neither_elf_nor_zip_is_an_error() {
        let dir = scratch("neither");
        let path = dir.join("notes.txt");
        std::fs::write(&path, "just text, long enough to hold a zip's end record").unwrap();
        assert!(libraries(&path).unwrap_err().contains("not a zip"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
