//! A GGUF writer: metadata and tensor index up front, tensor data streamed.
//!
//! Used to synthesise full-size benchmark models without holding them in
//! memory, and by tests to build valid (and deliberately broken) files.

use std::io::{self, Write};

use super::parse::DEFAULT_ALIGNMENT;
use super::value::{Array, Value};
use crate::quant::GgmlType;

/// A tensor to be written: name, type, shape (innermost first).
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorSpec {
    /// Bytes of the tensor's data (the shape must be whole blocks).
    pub fn bytes(&self) -> u64 {
        let rows: u64 = self.dims[1..].iter().product();
        self.ty.row_bytes(self.dims[0]).unwrap_or(0) * rows
    }
}

/// Collects metadata and tensor specs, then writes the file.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    kvs: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter { version: 3, alignment: DEFAULT_ALIGNMENT, kvs: Vec::new(), tensors: Vec::new() }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a metadata pair (`general.alignment` also sets the alignment used).
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_u64().filter(|a| a.is_power_of_two()) {
                self.alignment = a;
            }
        }
        self.kvs.push((key.to_string(), value));
        self
    }

    pub fn tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> &mut Self {
        self.tensors.push(TensorSpec { name: name.to_string(), ty, dims: dims.to_vec() });
        self
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Offsets of each tensor within the data section.
    pub fn offsets(&self) -> Vec<u64> {
        let mut off = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let o = off;
                off = (off + t.bytes()).div_ceil(self.alignment) * self.alignment;
                o
            })
            .collect()
    }

    /// Header, metadata, tensor index and the padding up to the data section.
    pub fn header(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut b, k);
            b.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut b, v);
        }
        for (t, off) in self.tensors.iter().zip(self.offsets()) {
            put_str(&mut b, &t.name);
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.ty.id().to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        let padded = (b.len() as u64).div_ceil(self.alignment) * self.alignment;
        b.resize(padded as usize, 0);
        b
    }

    /// Write the whole file: `fill(i, buf)` fills tensor `i`'s bytes (one
    /// tensor in memory at a time; `buf` arrives zeroed).
    pub fn write<W: Write>(&self, mut w: W, mut fill: impl FnMut(usize, &mut [u8])) -> io::Result<()> {
        w.write_all(&self.header())?;
        let mut buf = Vec::new();
        for (i, t) in self.tensors.iter().enumerate() {
            let n = t.bytes() as usize;
            buf.clear();
            buf.resize(n, 0);
            fill(i, &mut buf);
            w.write_all(&buf)?;
            // Every tensor padded, the last too: ggml's reader (gguf_init_from_file
            // with data) expects the data section in whole aligned units.
            let pad = (n as u64).div_ceil(self.alignment) * self.alignment - n as u64;
            w.write_all(&vec![0u8; pad as usize])?;
        }
        w.flush()
    }

    /// The whole file in memory (tests).
    pub fn to_bytes(&self, fill: impl FnMut(usize, &mut [u8])) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out, fill).expect("writing to a Vec cannot fail");
        out
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.push(*x as u8),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| x as u8)),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|x| put_array(b, x)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}
