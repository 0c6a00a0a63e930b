//! The GGUF parser: header, metadata and tensor index, every length and count
//! checked against the bytes that remain before anything is allocated.

use std::collections::HashMap;

use super::value::{Array, StringArray, Value, ValueType};
use super::TensorInfo;
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// Arrays may nest this deep (real files use depth 1).
pub const MAX_NESTING: usize = 8;
/// Keys are short identifiers; anything longer is corrupt.
pub const MAX_KEY_LEN: u64 = 1 << 16;
/// Largest supported tensor rank.
pub const MAX_DIMS: u32 = 4;
/// Default when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Smallest encoding of one metadata pair: key length, one key byte, type, one value byte.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest encoding of one tensor info: name length, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// What the parser found, before it is wrapped with the bytes.
pub struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
    pub data_len: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    section: &'static str,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, context: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated { section: self.section, offset: self.pos as u64, context: context() });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed UTF-8 string; `context` names it in errors.
    fn string(&mut self, max: u64, context: &dyn Fn() -> String) -> Result<&'a str> {
        let at = self.pos as u64;
        let len = self.u64(context)?;
        if len > max || len > self.remaining() {
            return Err(Error::StringTooLong { context: context(), offset: at, len });
        }
        let bytes = self.take(len, context)?;
        std::str::from_utf8(bytes).map_err(|_| Error::InvalidUtf8 { context: context() })
    }
}

/// Parse the header, metadata and tensor index of a GGUF file held in `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0, section: "header" };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(Error::BadMagic(magic));
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(Error::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata key count".into())?;
    let file_len = buf.len() as u64;
    // Each entry needs a minimum number of bytes: a count the rest of the file
    // cannot hold is rejected before any allocation sized by it.
    if n_kv > c.remaining() / MIN_KV_BYTES {
        return Err(Error::TooManyKeys { count: n_kv, file_len });
    }
    if n_tensors > c.remaining() / MIN_TENSOR_INFO_BYTES {
        return Err(Error::TooManyTensors { count: n_tensors, file_len });
    }

    c.section = "metadata";
    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(MAX_KEY_LEN, &|| format!("metadata key #{i}"))?.to_string();
        if seen.insert(key.clone(), ()).is_some() {
            return Err(Error::DuplicateKey(key));
        }
        let type_id = c.u32(&|| format!("type of key '{key}'"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType { key: key.clone(), type_id })?;
        let value = read_value(&mut c, ty, &key, 0)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => {
            let a = v.as_u64().ok_or(Error::BadAlignment(0))?;
            if a == 0 || !a.is_power_of_two() || a > 1 << 30 {
                return Err(Error::BadAlignment(a));
            }
            a
        }
    };

    c.section = "tensor index";
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(MAX_KEY_LEN, &|| format!("name of tensor #{i}"))?.to_string();
        let n_dims = c.u32(&|| format!("rank of tensor '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(Error::BadDimCount { tensor: name, n_dims });
        }
        let mut dims = [1u64; 4];
        for d in dims.iter_mut().take(n_dims as usize) {
            *d = c.u64(&|| format!("shape of tensor '{name}'"))?;
        }
        let type_id = c.u32(&|| format!("type of tensor '{name}'"))?;
        let offset = c.u64(&|| format!("offset of tensor '{name}'"))?;
        let ty =
            GgmlType::from_id(type_id).ok_or_else(|| Error::UnknownTensorType { tensor: name.clone(), type_id })?;
        let size = tensor_bytes(&name, ty, &dims[..n_dims as usize])?;
        if offset % alignment != 0 {
            return Err(Error::MisalignedTensor { tensor: name, offset, alignment });
        }
        if names.insert(name.clone(), ()).is_some() {
            return Err(Error::DuplicateTensor(name));
        }
        tensors.push(TensorInfo { name, ty, n_dims: n_dims as usize, dims, offset, size, shard: 0 });
    }

    // The data section starts at the next multiple of the alignment.
    let data_offset = (c.pos as u64).div_ceil(alignment).saturating_mul(alignment);
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        let end = t.offset.checked_add(t.size);
        if end.is_none_or(|e| e > data_len) {
            return Err(Error::TensorOutOfBounds {
                tensor: t.name.clone(),
                start: t.offset,
                end: end.unwrap_or(u64::MAX),
                data_len,
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for w in by_offset.windows(2) {
        if w[0].offset + w[0].size > w[1].offset {
            return Err(Error::TensorOverlap { first: w[0].name.clone(), second: w[1].name.clone() });
        }
    }
    Ok(Parsed { version, metadata, tensors, alignment, data_offset, data_len })
}

/// Byte size of a tensor, with every step checked.
fn tensor_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64> {
    if dims.contains(&0) {
        return Err(Error::ZeroDim { tensor: name.to_string() });
    }
    let overflow = || Error::ShapeOverflow { tensor: name.to_string() };
    let mut elements: u64 = 1;
    for &d in dims {
        elements = elements.checked_mul(d).ok_or_else(overflow)?;
    }
    if elements > i64::MAX as u64 {
        return Err(overflow());
    }
    let block = ty.block_size() as u64;
    if !dims[0].is_multiple_of(block) {
        return Err(Error::PartialBlock { tensor: name.to_string(), ty: ty.name().to_string(), row: dims[0], block });
    }
    (elements / block).checked_mul(ty.type_size() as u64).ok_or_else(overflow)
}

fn read_value(c: &mut Cursor, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
    let what = || format!("value of key '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(&what)?[0]),
        ValueType::I8 => Value::I8(c.array::<1>(&what)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => Value::U32(c.u32(&what)?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => Value::Bool(read_bool(c, key)?),
        ValueType::U64 => Value::U64(c.u64(&what)?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::String => Value::String(c.string(u64::MAX, &what)?.to_string()),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1)?),
    })
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool> {
    // Any non-zero byte is true, as in the reference reader.
    Ok(c.array::<1>(&|| format!("value of key '{key}'"))?[0] != 0)
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array> {
    if depth > MAX_NESTING {
        return Err(Error::NestingTooDeep { key: key.to_string(), limit: MAX_NESTING });
    }
    let type_id = c.u32(&|| format!("array type of key '{key}'"))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType { key: key.to_string(), type_id })?;
    let len = c.u64(&|| format!("array length of key '{key}'"))?;
    if len > c.remaining() / ty.min_encoded_size() {
        return Err(Error::ArrayTooLong { key: key.to_string(), len });
    }
    let n = len as usize;
    // Fixed-size elements: one bounds check for the whole array.
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            let size = std::mem::size_of::<$t>();
            let bytes = c.take(len * size as u64, &|| format!("array of key '{key}'"))?;
            Array::$variant(
                bytes.chunks_exact(size).map(|b| <$t>::from_le_bytes(b.try_into().expect("chunk size"))).collect(),
            )
        }};
    }
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(len, &|| format!("array of key '{key}'"))?.to_vec()),
        ValueType::I8 => fixed!(I8, i8),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            Array::Bool(c.take(len, &|| format!("array of key '{key}'"))?.iter().map(|&b| b != 0).collect())
        }
        ValueType::String => {
            // One pass copies the bytes (bounds-checked); UTF-8 is then
            // validated once over the whole buffer, plus a char-boundary check
            // at every string end: together that proves each string valid.
            let mut bytes = Vec::new();
            let mut ends = Vec::with_capacity(n);
            for i in 0..n {
                let what = || format!("element {i} of key '{key}'");
                let at = c.pos as u64;
                let len = c.u64(&what)?;
                if len > c.remaining() {
                    return Err(Error::StringTooLong { context: what(), offset: at, len });
                }
                bytes.extend_from_slice(c.take(len, &what)?);
                ends.push(bytes.len());
            }
            let bad = |i: usize| Error::InvalidUtf8 { context: format!("element {i} of key '{key}'") };
            let text = match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => {
                    let at = e.utf8_error().valid_up_to();
                    return Err(bad(ends.partition_point(|&end| end <= at)));
                }
            };
            if let Some(i) = ends.iter().position(|&end| !text.is_char_boundary(end)) {
                return Err(bad(i));
            }
            Array::String(StringArray::from_parts(text, ends))
        }
        ValueType::Array => {
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                out.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(out)
        }
    })
}
