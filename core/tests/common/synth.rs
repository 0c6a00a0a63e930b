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

/// `model`'s teacher-forced logits of `prompt`, as one batch and token by
/// token, against llama.cpp's (`NAME.llama.npy`): median KL ≤ 5e-3, top-1
/// ≥ 12 of 16, batch and decode within 1e-3; the reference itself must
/// not be degenerate (its top-1 changes along the prompt).
pub fn matches_llama_cpp(model: &pocket_core::model::Model, name: &str, prompt: &[u32]) {
    use super::arrays::{argmax, max_abs_diff, median_kl_and_top1, read_npy};
    let v = model.n_vocab();
    let reference = read_npy(&data_dir().join(format!("{name}.llama.npy")));
    assert_eq!(reference.shape, [prompt.len(), v]);
    let mut tops: Vec<usize> = reference.f32.chunks_exact(v).map(argmax).collect();
    tops.dedup();
    assert!(tops.len() >= 8, "{name}: llama.cpp's top-1 is nearly constant: {tops:?}");
    let pool = pocket_core::threads::ThreadPool::new(2);
    let (batch, decode) = super::batch_and_decode_logits(model, &pool, prompt);
    for (path, ours) in [("batch", &batch), ("decode", &decode)] {
        let (med, top1) = median_kl_and_top1(&reference.f32, ours, v);
        let d = max_abs_diff(ours, &reference.f32);
        eprintln!("{name} {path}: median KL {med:.2e}, top-1 {top1}/16, max |Δ| {d:.3e} vs llama.cpp");
        assert!(med <= 5e-3, "{name} {path}: median KL {med}");
        assert!(top1 >= 12, "{name} {path}: top-1 {top1}/16");
    }
    let d = max_abs_diff(&batch, &decode);
    eprintln!("{name}: batch vs decode max |Δ| {d:.3e}");
    assert!(d <= 1e-3, "{name}: batch and decode differ by {d}");
}
