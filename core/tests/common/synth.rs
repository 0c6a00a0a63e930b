//! The tiny synthetic models of `scripts/synth-tiny.sh` (in
//! `$POCKET_SYNTH_TINY`) and their committed references in
//! `core/tests/data/synth/`.

use std::path::PathBuf;

/// Where a tiny model's references are committed.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/synth")
}

/// The tiny model `name` (`$POCKET_SYNTH_TINY/NAME.gguf`), after checking
/// that it is the file the committed references were made from.
pub fn tiny_model(name: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    let dir = std::env::var_os("POCKET_SYNTH_TINY")
        .unwrap_or_else(|| panic!("POCKET_SYNTH_TINY is not set: export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)"));
    let path = PathBuf::from(dir).join(format!("{name}.gguf"));
    let bytes =
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (scripts/synth-tiny.sh writes it)", path.display()));
    let got: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    let want_path = data_dir().join(format!("{name}.sha256"));
    let want = std::fs::read_to_string(&want_path).unwrap_or_else(|e| panic!("{}: {e}", want_path.display()));
    assert_eq!(
        got,
        want.trim(),
        "{} is not the file the references were made from. If synth-model changed on purpose: delete it, run \
         scripts/synth-tiny.sh, write its sha256 to {} and its reference logits with `cargo xtask llama-logits \
         --model FILE --tokens (the test's prompt) --out core/tests/data/synth/{name}.llama.npy`",
        path.display(),
        want_path.display(),
    );
    path
}
