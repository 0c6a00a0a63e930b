//! GGUF metadata values.
//!
//! Arrays are stored typed and flat (a token list is one string buffer plus
//! offsets, a score list one `Vec<f32>`), so that a 262k-token vocabulary
//! costs two allocations, not 262k.

use std::fmt;

/// The value type ids of the GGUF format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Size in the file of one scalar of this type (strings and arrays: their
    /// smallest possible encoding, used to bound counts by the file size).
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array, stored flat by element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StringArray),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// Many strings in one buffer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StringArray {
    buf: String,
    /// End offset of each string in `buf`.
    ends: Vec<usize>,
}

impl StringArray {
    pub fn with_capacity(count: usize, bytes: usize) -> Self {
        StringArray { buf: String::with_capacity(bytes), ends: Vec::with_capacity(count) }
    }

    /// Strings given as one buffer and the end offset of each (ends must be
    /// ascending char boundaries of `buf`).
    pub fn from_parts(buf: String, ends: Vec<usize>) -> Self {
        debug_assert!(ends.windows(2).all(|w| w[0] <= w[1]) && ends.last().is_none_or(|&e| e == buf.len()));
        StringArray { buf, ends }
    }

    pub fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.ends.push(self.buf.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.buf[start..end])
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(move |i| self.get(i).unwrap_or_default())
    }
}

impl<'a> FromIterator<&'a str> for StringArray {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let mut out = StringArray::default();
        for s in iter {
            out.push(s);
        }
        out
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type that fits in u64 (negative values do not).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as i64 (u64 values above i64::MAX do not fit).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Floats, and integers converted to f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Integer elements as i64 (any integer element type; `None` otherwise or
    /// when a u64 element exceeds i64::MAX).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy + TryInto<i64>>(v: &[T]) -> Option<Vec<i64>> {
            v.iter().map(|&x| x.try_into().ok()).collect()
        }
        match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => None,
        }
    }

    /// Float elements as f32 (F32 and F64 arrays).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    pub fn as_strings(&self) -> Option<&StringArray> {
        match self {
            Array::String(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    /// A short human rendering; long arrays show their first elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => {
                let short: String = s.chars().take(60).collect();
                if short.len() < s.len() {
                    write!(f, "{short:?}... ({} bytes)", s.len())
                } else {
                    write!(f, "{s:?}")
                }
            }
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOW: usize = 8;
        fn list<T: fmt::Debug>(f: &mut fmt::Formatter<'_>, v: &[T]) -> fmt::Result {
            let shown = &v[..v.len().min(SHOW)];
            write!(f, "[")?;
            for (i, x) in shown.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{x:?}")?;
            }
            if v.len() > SHOW {
                write!(f, ", ... ({} elements)", v.len())?;
            }
            write!(f, "]")
        }
        match self {
            Array::U8(v) => list(f, v),
            Array::I8(v) => list(f, v),
            Array::U16(v) => list(f, v),
            Array::I16(v) => list(f, v),
            Array::U32(v) => list(f, v),
            Array::I32(v) => list(f, v),
            Array::F32(v) => list(f, v),
            Array::Bool(v) => list(f, v),
            Array::String(v) => list(f, &v.iter().take(SHOW + 1).collect::<Vec<_>>()[..]).and_then(|_| {
                if v.len() > SHOW + 1 {
                    write!(f, " ({} strings)", v.len())
                } else {
                    Ok(())
                }
            }),
            Array::Array(v) => {
                write!(f, "[")?;
                for (i, a) in v.iter().take(SHOW).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{a}")?;
                }
                if v.len() > SHOW {
                    write!(f, ", ... ({} arrays)", v.len())?;
                }
                write!(f, "]")
            }
            Array::U64(v) => list(f, v),
            Array::I64(v) => list(f, v),
            Array::F64(v) => list(f, v),
        }
    }
}
