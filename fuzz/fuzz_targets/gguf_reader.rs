//! Fuzz the GGUF reader: any byte string must parse or fail with an error,
//! never panic, and every accepted tensor must lie inside the buffer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pocket_core::gguf::{GgufFile, Summary};

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = GgufFile::from_bytes(data.to_vec()) {
        let _ = Summary::of(&g);
        for t in g.tensors() {
            assert_eq!(g.tensor_data(t).len() as u64, t.size);
        }
        for (k, v) in g.metadata() {
            let _ = (k.len(), v.to_string());
        }
    }
});
