//! `LoadOptions.backend` and `ModelInfo.backend` / `ModelInfo.adapter`
//! through the FFI: the default and `Auto` run on the CPU and say so; `Gpu`
//! either runs on an adapter it names or is `PocketError.UnsupportedModel`
//! with the reason (no GPU, a driver failure, a build without the backend),
//! never a crash.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pocket_ffi::{
    Backend, GenerateOptions, LoadOptions, PocketError, PocketModel, PocketSession, SessionOptions, TokenListener,
};

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let store = std::env::var_os("POCKET_FIXTURES").map_or_else(|| root.join("../shared/fixtures"), PathBuf::from);
    store.join("models").join(name).to_string_lossy().into_owned()
}

fn load(backend: Option<Backend>) -> Result<Arc<PocketModel>, PocketError> {
    PocketModel::load(fixture("gemma3-tiny-Q8_0.gguf"), LoadOptions { backend, ..LoadOptions::default() })
}

/// Collects the streamed text.
#[derive(Default)]
struct Text(Mutex<String>);

impl TokenListener for Text {
    fn on_token(&self, piece: String) -> Result<bool, PocketError> {
        self.0.lock().unwrap().push_str(&piece);
        Ok(true)
    }
}

/// Sixteen greedy tokens after "Hello".
fn greedy(model: Arc<PocketModel>) -> String {
    let session = PocketSession::new(model, SessionOptions::default()).unwrap();
    let text = Arc::new(Text::default());
    let options = GenerateOptions { max_tokens: 16, temperature: 0.0, ..GenerateOptions::default() };
    session.generate("Hello".into(), options, text.clone()).unwrap();
    let out = text.0.lock().unwrap().clone();
    out
}

#[test]
fn the_default_and_auto_run_on_the_cpu() {
    for backend in [None, Some(Backend::Auto), Some(Backend::Cpu)] {
        let info = load(backend).unwrap().info();
        assert_eq!(info.backend, Backend::Cpu, "{backend:?}");
        assert_eq!(info.adapter, None, "{backend:?}");
    }
}

#[test]
fn gpu_runs_on_a_named_adapter_or_is_an_unsupported_model() {
    match load(Some(Backend::Gpu)) {
        Ok(model) => {
            let info = model.info();
            assert_eq!(info.backend, Backend::Gpu);
            let adapter = info.adapter.expect("a GPU model names its adapter");
            assert!(!adapter.name.is_empty() && ["vulkan", "metal"].contains(&adapter.api.as_str()), "{adapter:?}");
            // It generates: the same greedy text as the CPU's (on the F32
            // file, where only f32 rounding differs; the quantised tiny
            // files' near-ties may flip within a few tokens).
            drop(model);
            let f32_model = |backend| {
                PocketModel::load(fixture("gemma3-tiny-F32.gguf"), LoadOptions { backend, ..LoadOptions::default() })
                    .unwrap()
            };
            assert_eq!(greedy(f32_model(Some(Backend::Gpu))), greedy(f32_model(None)));
        }
        Err(PocketError::UnsupportedModel { reason }) => {
            eprintln!("no GPU here: {reason}");
            assert!(reason.contains("GPU unavailable"), "{reason}");
            if !pocket_core::gpu::BUILT {
                assert!(reason.contains("no GPU backend"), "{reason}");
            }
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn gpu_under_a_memory_budget_is_refused() {
    let options = LoadOptions { backend: Some(Backend::Gpu), memory_budget_bytes: 1 << 40, ..LoadOptions::default() };
    match PocketModel::load(fixture("gemma3-tiny-Q8_0.gguf"), options) {
        Err(PocketError::InvalidArgument { .. } | PocketError::UnsupportedModel { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded on the GPU under a budget"),
    }
}
