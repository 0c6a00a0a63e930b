//! Hand-built malformed GGUF files: each gives its own typed error, none panics.

use pocket_core::gguf::{Array, GgufFile, GgufWriter, StringArray, Value};
use pocket_core::quant::GgmlType;
use pocket_core::Error;

/// Raw byte builder for headers the writer would refuse to produce.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    /// A u32 metadata pair.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    /// A tensor index entry.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pad to 32 and append `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Self {
        let pad = self.0.len().div_ceil(32) * 32;
        self.0.resize(pad + n, 0);
        self
    }
    fn open(&self) -> Result<GgufFile, Error> {
        GgufFile::from_bytes(self.0.clone())
    }
}

/// A small valid file: metadata of several types and three tensors.
fn valid() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(1))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(["a", "b", "<s>"].into_iter().collect())))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0, -1.0, -2.0])))
        .tensor("token_embd.weight", GgmlType::F32, &[8, 3])
        .tensor("blk.0.attn_q.weight", GgmlType::Q8_0, &[32, 2])
        .tensor("output_norm.weight", GgmlType::F32, &[8]);
    w.to_bytes(|i, b| b.fill(i as u8 + 1))
}

macro_rules! assert_err {
    ($r:expr, $pat:pat) => {
        match $r {
            Err(e @ $pat) => {
                let msg = e.to_string();
                assert!(!msg.is_empty());
            }
            Err(e) => panic!("wrong error: {e:?}"),
            Ok(_) => panic!("accepted a malformed file"),
        }
    };
}

#[test]
fn valid_file_round_trips() {
    let g = GgufFile::from_bytes(valid()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture().unwrap(), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count").unwrap(), Some(1));
    assert_eq!(g.tensors().len(), 3);
    let t = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((t.ty, t.shape(), t.size), (GgmlType::Q8_0, &[32u64, 2][..], 68));
    assert!(g.tensor_data(t).iter().all(|&b| b == 2));
    assert_err!(g.get_str("llama.block_count"), Error::WrongValueType { .. });
}

#[test]
fn every_value_type_round_trips() {
    let nested = Array::Array(vec![Array::I16(vec![-1, 2]), Array::Bool(vec![true, false])]);
    let values = vec![
        Value::U8(7),
        Value::I8(-7),
        Value::U16(700),
        Value::I16(-700),
        Value::U32(70000),
        Value::I32(-70000),
        Value::F32(1.5),
        Value::Bool(true),
        Value::String("héllo".into()),
        Value::U64(1 << 40),
        Value::I64(-(1 << 40)),
        Value::F64(2.25),
        Value::Array(Array::U64(vec![1, 2, 3])),
        Value::Array(nested),
        Value::Array(Array::String(StringArray::default())),
    ];
    let mut w = GgufWriter::new();
    for (i, v) in values.iter().enumerate() {
        w.kv(&format!("k{i}"), v.clone());
    }
    let g = GgufFile::from_bytes(w.to_bytes(|_, _| {})).unwrap();
    for (i, v) in values.iter().enumerate() {
        assert_eq!(g.get(&format!("k{i}")), Some(v));
    }
}

#[test]
fn version_2_opens() {
    let mut w = GgufWriter::new();
    w.version = 2;
    w.kv("general.architecture", Value::String("gemma3".into()));
    assert_eq!(GgufFile::from_bytes(w.to_bytes(|_, _| {})).unwrap().version(), 2);
}

// ---- header -----------------------------------------------------------------

#[test]
fn empty_file() {
    assert_err!(GgufFile::from_bytes(vec![]), Error::Truncated { section: "header", .. });
}

#[test]
fn truncated_magic() {
    assert_err!(GgufFile::from_bytes(b"GG".to_vec()), Error::Truncated { section: "header", .. });
}

#[test]
fn bad_magic() {
    let mut b = valid();
    b[0] = b'X';
    assert_err!(GgufFile::from_bytes(b), Error::BadMagic(_));
}

#[test]
fn version_1_rejected() {
    assert_err!(Raw::header(1, 0, 0).open(), Error::UnsupportedVersion(1));
}

#[test]
fn version_99_rejected() {
    assert_err!(Raw::header(99, 0, 0).open(), Error::UnsupportedVersion(99));
}

#[test]
fn truncated_in_version() {
    assert_err!(Raw::default().bytes(b"GGUF\x03\x00").open(), Error::Truncated { section: "header", .. });
}

#[test]
fn truncated_in_counts() {
    let mut r = Raw::default();
    r.bytes(b"GGUF").u32(3).u64(0).bytes(&[1, 0, 0]);
    assert_err!(r.open(), Error::Truncated { section: "header", .. });
}

#[test]
fn absurd_tensor_count() {
    assert_err!(Raw::header(3, u64::MAX, 0).open(), Error::TooManyTensors { .. });
}

#[test]
fn absurd_kv_count() {
    assert_err!(Raw::header(3, 0, 1 << 40).open(), Error::TooManyKeys { .. });
}

// ---- metadata ---------------------------------------------------------------

#[test]
fn key_length_past_eof() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(1000).bytes(b"general.architecture").u32(4).u32(0);
    assert_err!(r.open(), Error::StringTooLong { .. });
}

#[test]
fn key_length_absurd() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(&[0; 32]);
    assert_err!(r.open(), Error::StringTooLong { .. });
}

#[test]
fn truncated_inside_value() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"llama.block_count").u32(4).bytes(&[1, 0]);
    assert_err!(r.open(), Error::Truncated { section: "metadata", .. });
}

#[test]
fn string_value_past_eof() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.name").u32(8).u64(1 << 20).bytes(b"short");
    match r.open() {
        Err(Error::StringTooLong { context, .. }) => assert!(context.contains("general.name"), "{context}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn array_length_past_eof() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.scores").u32(9).u32(6).u64(1000).bytes(&[0; 40]);
    assert_err!(r.open(), Error::ArrayTooLong { .. });
}

#[test]
fn array_length_absurd() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(u64::MAX).bytes(&[0; 40]);
    assert_err!(r.open(), Error::ArrayTooLong { .. });
}

#[test]
fn string_array_element_past_eof() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str(b"ok").u64(500).bytes(b"xx");
    assert_err!(r.open(), Error::StringTooLong { .. });
}

#[test]
fn array_nesting_bomb() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"bomb").u32(9);
    for _ in 0..1000 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(1).u32(0);
    assert_err!(r.open(), Error::NestingTooDeep { .. });
}

#[test]
fn unknown_value_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.mystery").u32(13).u32(0);
    assert_err!(r.open(), Error::UnknownValueType { type_id: 13, .. });
}

#[test]
fn unknown_array_element_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.mystery").u32(9).u32(77).u64(1).u32(0);
    assert_err!(r.open(), Error::UnknownValueType { type_id: 77, .. });
}

#[test]
fn non_utf8_key() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.\xff\xfe").u32(4).u32(0);
    assert_err!(r.open(), Error::InvalidUtf8 { .. });
}

#[test]
fn non_utf8_string_value() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.name").u32(8).str(b"bad \xc3\x28 name");
    match r.open() {
        Err(Error::InvalidUtf8 { context }) => assert!(context.contains("general.name")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn non_utf8_string_array_element() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(3).str(b"ok").str(b"\xff").str(b"fine");
    match r.open() {
        Err(Error::InvalidUtf8 { context }) => assert!(context.contains("element 1"), "{context}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn multibyte_char_split_across_array_elements() {
    // "é" is C3 A9: each half alone is invalid, though the concatenation is valid.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str(b"a\xc3").str(b"\xa9b");
    match r.open() {
        Err(Error::InvalidUtf8 { context }) => assert!(context.contains("element 0"), "{context}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn duplicate_key() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("llama.block_count", 1).kv_u32("llama.block_count", 2);
    match r.open() {
        Err(Error::DuplicateKey(k)) => assert_eq!(k, "llama.block_count"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn alignment_not_power_of_two() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 3);
    assert_err!(r.open(), Error::BadAlignment(3));
}

#[test]
fn alignment_zero() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 0);
    assert_err!(r.open(), Error::BadAlignment(0));
}

// ---- tensor index -------------------------------------------------------------

#[test]
fn truncated_in_tensor_index() {
    let mut r = Raw::header(3, 1, 0);
    r.str(b"output.weight").u32(2).u64(256).bytes(&[0; 12]);
    assert_err!(r.open(), Error::Truncated { section: "tensor index", .. });
}

#[test]
fn zero_dimensions() {
    let mut r = Raw::header(3, 1, 0);
    r.str(b"output.weight").u32(0).u32(0).u64(0).bytes(&[0; 32]);
    assert_err!(r.open(), Error::BadDimCount { n_dims: 0, .. });
}

#[test]
fn five_dimensions() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[1, 1, 1, 1, 1], 0, 0).data(4);
    assert_err!(r.open(), Error::BadDimCount { n_dims: 5, .. });
}

#[test]
fn zero_dim() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[256, 0], 0, 0).data(64);
    match r.open() {
        Err(Error::ZeroDim { tensor }) => assert_eq!(tensor, "output.weight"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn element_count_overflow() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[1 << 32, 1 << 32, 1 << 32], 0, 0).data(64);
    assert_err!(r.open(), Error::ShapeOverflow { .. });
}

#[test]
fn byte_size_overflow() {
    let mut r = Raw::header(3, 1, 0);
    // 2^62 elements fit in i64, but 2^62 f64 values take 2^65 bytes.
    r.tensor("output.weight", &[1 << 62], 28, 0).data(64);
    assert_err!(r.open(), Error::ShapeOverflow { .. });
}

#[test]
fn unknown_tensor_type() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[32], 4, 0).data(64);
    assert_err!(r.open(), Error::UnknownTensorType { type_id: 4, .. });
}

#[test]
fn row_not_whole_blocks() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[100, 2], 12, 0).data(1024);
    assert_err!(r.open(), Error::PartialBlock { row: 100, block: 256, .. });
}

#[test]
fn misaligned_offset() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[4], 0, 3).data(64);
    assert_err!(r.open(), Error::MisalignedTensor { offset: 3, alignment: 32, .. });
}

#[test]
fn tensor_offset_past_eof() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[4], 0, 1 << 40).data(64);
    assert_err!(r.open(), Error::TensorOutOfBounds { .. });
}

#[test]
fn tensor_runs_past_eof() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[64], 0, 0).data(100);
    match r.open() {
        Err(Error::TensorOutOfBounds { tensor, end, data_len, .. }) => {
            assert_eq!((tensor.as_str(), end, data_len), ("output.weight", 256, 100))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn offset_plus_size_overflows() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("output.weight", &[64], 0, u64::MAX - 31).data(64);
    assert_err!(r.open(), Error::TensorOutOfBounds { .. });
}

#[test]
fn overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a.weight", &[16], 0, 0).tensor("b.weight", &[16], 0, 32).data(128);
    match r.open() {
        Err(Error::TensorOverlap { first, second }) => {
            assert_eq!((first.as_str(), second.as_str()), ("a.weight", "b.weight"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn duplicate_tensor() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a.weight", &[8], 0, 0).tensor("a.weight", &[8], 0, 32).data(64);
    match r.open() {
        Err(Error::DuplicateTensor(n)) => assert_eq!(n, "a.weight"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn non_utf8_tensor_name() {
    let mut r = Raw::header(3, 1, 0);
    r.str(b"blk.0.\x80q").u32(1).u64(8).u32(0).u64(0).data(32);
    match r.open() {
        Err(Error::InvalidUtf8 { context }) => assert!(context.contains("tensor #0"), "{context}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tensor_name_too_long() {
    let mut r = Raw::header(3, 1, 0);
    r.u64(1 << 20).bytes(&vec![b'a'; 1 << 20]).u32(1).u64(8).u32(0).u64(0).data(32);
    assert_err!(r.open(), Error::StringTooLong { .. });
}

// ---- whole-file properties ----------------------------------------------------

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let full = valid();
    for len in 0..full.len() {
        let r = GgufFile::from_bytes(full[..len].to_vec());
        assert!(r.is_err(), "prefix of {len} of {} bytes accepted", full.len());
    }
}

#[test]
fn random_corruption_never_panics() {
    let full = valid();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let mut b = full.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            b[i] = next() as u8;
        }
        if let Ok(g) = GgufFile::from_bytes(b) {
            for t in g.tensors() {
                assert_eq!(g.tensor_data(t).len() as u64, t.size);
            }
        }
    }
}

#[cfg(unix)]
#[test]
fn opens_a_range_of_a_descriptor_at_an_unaligned_offset() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let body = valid();
    let path = std::env::temp_dir().join(format!("pocket-fd-{}.bin", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&vec![0xAB; 4097]).unwrap();
    f.write_all(&body).unwrap();
    f.write_all(&[0xCD; 100]).unwrap();
    drop(f);
    let f = std::fs::File::open(&path).unwrap();
    let g = GgufFile::open_fd(f.as_raw_fd(), 4097, body.len() as u64).unwrap();
    drop(f); // the mapping outlives the caller's descriptor
    assert_eq!(g.file_bytes(), body.len() as u64);
    let t = g.tensor("token_embd.weight").unwrap();
    assert!(g.tensor_data(t).iter().all(|&b| b == 1));
    let f = std::fs::File::open(&path).unwrap();
    assert_err!(GgufFile::open_fd(f.as_raw_fd(), 4097, body.len() as u64 + 101), Error::RangeOutsideFile { .. });
    assert_err!(GgufFile::open_fd(-1, 0, 10), Error::InvalidArgument(_));
    std::fs::remove_file(&path).unwrap();
}
