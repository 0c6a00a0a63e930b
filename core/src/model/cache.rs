//! Per-sequence state: the KV cache of attention layers and the recurrent
//! state of linear-attention layers, plus the session's scratch buffers.

use half::f16;

use crate::error::{Error, Result};
use crate::kernels::ops;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    #[default]
    F16,
}

impl KvType {
    pub fn bytes_per_element(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            other => Err(Error::InvalidArgument(format!("KV cache type '{other}' (expected f32 or f16)"))),
        }
    }
}

enum Buf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Buf {
    fn new(ty: KvType, n: usize) -> Result<Buf> {
        let oom = || Error::OutOfMemory(format!("KV cache of {n} elements"));
        Ok(match ty {
            KvType::F32 => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| oom())?;
                v.resize(n, 0.0);
                Buf::F32(v)
            }
            KvType::F16 => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| oom())?;
                v.resize(n, f16::ZERO);
                Buf::F16(v)
            }
        })
    }

    #[inline]
    fn store(&mut self, at: usize, x: &[f32]) {
        match self {
            Buf::F32(v) => v[at..at + x.len()].copy_from_slice(x),
            Buf::F16(v) => {
                for (d, &s) in v[at..at + x.len()].iter_mut().zip(x) {
                    *d = f16::from_f32(s);
                }
            }
        }
    }

    #[inline]
    fn dot(&self, at: usize, q: &[f32]) -> f32 {
        match self {
            Buf::F32(v) => ops::dot_f32(q, &v[at..at + q.len()]),
            Buf::F16(v) => ops::dot_f16(q, &v[at..at + q.len()]),
        }
    }

    #[inline]
    fn axpy(&self, at: usize, a: f32, out: &mut [f32]) {
        match self {
            Buf::F32(v) => ops::axpy_f32(out, a, &v[at..at + out.len()]),
            Buf::F16(v) => ops::axpy_f16(out, a, &v[at..at + out.len()]),
        }
    }
}

/// Keys and values of one attention layer, `[kv_head][position][dim]`.
pub struct KvCache {
    pub n_kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Positions the cache can hold.
    pub capacity: usize,
    pub ty: KvType,
    k: Buf,
    v: Buf,
}

impl KvCache {
    pub fn new(ty: KvType, n_kv_head: usize, head_dim_k: usize, head_dim_v: usize, capacity: usize) -> Result<Self> {
        let n = |d: usize| {
            n_kv_head
                .checked_mul(capacity)
                .and_then(|x| x.checked_mul(d))
                .ok_or_else(|| Error::OutOfMemory(format!("KV cache for {capacity} positions")))
        };
        Ok(KvCache {
            k: Buf::new(ty, n(head_dim_k)?)?,
            v: Buf::new(ty, n(head_dim_v)?)?,
            n_kv_head,
            head_dim_k,
            head_dim_v,
            capacity,
            ty,
        })
    }

    /// Store the key and value of `kv_head` at `pos`.
    #[inline]
    pub fn store(&mut self, kv_head: usize, pos: usize, k: &[f32], v: &[f32]) {
        self.k.store((kv_head * self.capacity + pos) * self.head_dim_k, &k[..self.head_dim_k]);
        self.v.store((kv_head * self.capacity + pos) * self.head_dim_v, &v[..self.head_dim_v]);
    }

    /// q · key(kv_head, pos).
    #[inline]
    pub fn k_dot(&self, kv_head: usize, pos: usize, q: &[f32]) -> f32 {
        self.k.dot((kv_head * self.capacity + pos) * self.head_dim_k, &q[..self.head_dim_k])
    }

    /// out += a · value(kv_head, pos).
    #[inline]
    pub fn v_axpy(&self, kv_head: usize, pos: usize, a: f32, out: &mut [f32]) {
        self.v.axpy((kv_head * self.capacity + pos) * self.head_dim_v, a, &mut out[..self.head_dim_v]);
    }

    /// Bytes the entries of `n_pos` positions take.
    pub fn bytes_for(&self, n_pos: usize) -> usize {
        n_pos * self.n_kv_head * (self.head_dim_k + self.head_dim_v) * self.ty.bytes_per_element()
    }

    /// Bytes allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.bytes_for(self.capacity)
    }
}

/// Which logits a forward pass should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// One row per input token (teacher forcing, perplexity).
    All,
    /// Only the last token's row (generation).
    Last,
    /// None (prompt chunks whose logits nobody reads).
    None,
}
