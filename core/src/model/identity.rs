//! What ties saved state to the model file it was computed with.
//!
//! A KV cache or recurrent state is meaningless on any other weights, so a
//! session snapshot records the identity of its model and refuses to load on
//! another. Hashing the whole file would cost seconds on a phone (and read
//! gigabytes from flash); the header, metadata and tensor table (every byte
//! before the tensor data) name the architecture, the hyper-parameters, the
//! tokenizer and every tensor's type, shape and offset, and the file size
//! covers the data section's length. Two files that agree on all of that but
//! not on their weights (the same tensor table re-quantised identically, or a
//! fine-tune that changed no metadata) are not told apart: that is the price
//! of not reading the weights. A split model's identity covers every shard:
//! their sizes and their headers, in order.

use xxhash_rust::xxh3::Xxh3Default;

use crate::gguf::GgufFile;

/// The identity of a model file (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelIdentity {
    /// Bytes of the file (or of the descriptor range it was opened from).
    pub file_bytes: u64,
    /// Bytes before the tensor data (header, metadata, tensor table, padding).
    pub header_bytes: u64,
    /// XXH3-128 of those bytes.
    pub header_hash: u128,
}

impl ModelIdentity {
    /// The identity of an open file (hashes its header: a few MB at most, in
    /// memory). Of a split model: of all its shards, their sizes added and
    /// their headers hashed one after another, in order.
    pub fn of(file: &GgufFile) -> ModelIdentity {
        let bytes = file.source().bytes();
        let mut hash = Xxh3Default::new();
        let (mut file_bytes, mut header_bytes) = (0, 0);
        for s in file.shards() {
            let header = &bytes[s.start as usize..(s.start + s.data_offset.min(s.bytes)) as usize];
            hash.update(header);
            file_bytes += s.bytes;
            header_bytes += header.len() as u64;
        }
        ModelIdentity { file_bytes, header_bytes, header_hash: hash.digest128() }
    }
}

impl std::fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a {}-byte file whose {}-byte header hashes to {:032x}",
            self.file_bytes, self.header_bytes, self.header_hash
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, Value};
    use crate::quant::GgmlType;
    use xxhash_rust::xxh3::xxh3_128;

    fn file(name: &str, data: &[f32]) -> GgufFile {
        let mut w = GgufWriter::new();
        w.kv("general.name", Value::String(name.into())).tensor("t", GgmlType::F32, &[data.len() as u64]);
        let bytes = w.to_bytes(|_, out| {
            for (o, v) in out.chunks_exact_mut(4).zip(data) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        });
        GgufFile::from_bytes(bytes).unwrap()
    }

    #[test]
    fn the_header_and_the_size_identify_a_file_not_its_weights() {
        let a = ModelIdentity::of(&file("a", &[1.0; 8]));
        assert_eq!(a, ModelIdentity::of(&file("a", &[1.0; 8])));
        assert_ne!(a, ModelIdentity::of(&file("b", &[1.0; 8])), "metadata differs");
        assert_ne!(a, ModelIdentity::of(&file("a", &[1.0; 16])), "tensor table and size differ");
        // Same header and size, other weights: by design, the same identity.
        assert_eq!(a, ModelIdentity::of(&file("a", &[2.0; 8])));
        assert!(a.header_bytes > 0 && a.header_bytes < a.file_bytes);
        // One file's identity is what it always was: XXH3-128 of its header.
        let f = file("a", &[1.0; 8]);
        let header = &f.source().bytes()[..f.data_offset() as usize];
        assert_eq!(a.header_hash, xxh3_128(header));
    }
}
