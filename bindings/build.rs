//! Android: link `libpocket_ffi.so` for 16 KB pages (Android 15+ devices may use
//! them, and Google Play requires it) and give it a SONAME. As cdylib link
//! arguments these hold whatever RUSTFLAGS a build tool (cargo-ndk) sets.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("android") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,max-page-size=16384");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libpocket_ffi.so");
    }
}
