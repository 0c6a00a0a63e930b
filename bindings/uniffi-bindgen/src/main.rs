//! `uniffi-bindgen`, pinned to the workspace's UniFFI version so that the
//! generated bindings always match the scaffolding compiled into pocket_ffi.
//! Used by `cargo xtask bindings ...` (library mode).

fn main() {
    uniffi::uniffi_bindgen_main()
}
