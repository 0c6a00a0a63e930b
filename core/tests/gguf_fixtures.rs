//! Every GGUF file of the fixture store opens with the right architecture and counts.

mod common;

use pocket_core::gguf::GgufFile;

#[test]
fn every_fixture_model_opens() {
    let dir = common::fixtures();
    let manifest = common::manifest();
    let mut opened = 0;
    for model in manifest["models"].as_array().expect("models") {
        let name = model["name"].as_str().unwrap();
        let arch = match name.split('-').next().unwrap() {
            "mixtral" => "llama",
            a => a,
        };
        for file in model["files"].as_array().unwrap() {
            let path = dir.join(file["gguf"].as_str().unwrap());
            let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(g.architecture().unwrap(), Some(arch), "{}", path.display());
            assert_eq!(g.file_bytes(), file["bytes"].as_u64().unwrap());
            assert!(g.tensors().len() > 10);
            let n_layers = g.get_u32(&format!("{arch}.block_count")).unwrap().unwrap();
            assert!((2..=6).contains(&n_layers));
            for t in g.tensors() {
                assert_eq!(g.tensor_data(t).len() as u64, t.size);
            }
            opened += 1;
        }
    }
    assert_eq!(opened, 14);
}

#[test]
fn vocab_only_files_open() {
    let dir = common::fixtures().join("tokenizer");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gguf") {
            let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(g.get("tokenizer.ggml.tokens").is_some());
            n += 1;
        }
    }
    assert!(n >= 4);
}
