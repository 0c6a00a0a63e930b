//! The KV cache of one attention layer, `[kv_head][position][dim]` in f32,
//! f16 or q8_0, with the score and mix passes attention runs over it; and
//! which logits a forward pass produces.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::error::{Error, Result};
use crate::kernels::ops;
use crate::quant::q8_0::{quantize_row_q8_0, BlockQ8_0, QK8_0};

/// Bytes of one q8_0 block in a snapshot (the f16 scale, then the quants).
const Q8_0_BYTES: usize = 2 + QK8_0;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    #[default]
    F16,
    /// 8-bit blocks of 32 with an f16 scale (head sizes must be multiples of 32).
    Q8_0,
}

impl KvType {
    /// Bytes per `n` elements.
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n / QK8_0 * std::mem::size_of::<BlockQ8_0>(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(Error::InvalidArgument(format!("KV cache type '{other}' (expected f32, f16 or q8_0)"))),
        }
    }
}

enum Buf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Rows of whole blocks; `at` offsets count elements.
    Q8_0(Vec<BlockQ8_0>),
}

fn alloc<T: Clone>(n: usize, zero: T, what: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory(format!("KV cache of {what} elements")))?;
    v.resize(n, zero);
    Ok(v)
}

impl Buf {
    fn new(ty: KvType, n: usize) -> Result<Buf> {
        Ok(match ty {
            KvType::F32 => Buf::F32(alloc(n, 0.0, n)?),
            KvType::F16 => Buf::F16(alloc(n, f16::ZERO, n)?),
            KvType::Q8_0 => Buf::Q8_0(alloc(n / QK8_0, BlockQ8_0::default(), n)?),
        })
    }

    #[inline]
    fn store(&mut self, at: usize, x: &[f32]) {
        match self {
            Buf::F32(v) => v[at..at + x.len()].copy_from_slice(x),
            Buf::F16(v) => v[at..at + x.len()].convert_from_f32_slice(x),
            Buf::Q8_0(v) => quantize_row_q8_0(x, &mut v[at / QK8_0..(at + x.len()) / QK8_0]),
        }
    }

    /// `out[g * n + j] = q_g · row(at + j * d)` for the `heads` queries `q_g =
    /// q[g * d..][..d]` and `n = out.len() / heads` consecutive rows of `d`.
    /// With an f16 cache, q arrives already rounded to f16 (see
    /// [`KvCache::round_query`]).
    fn scores(&self, at: usize, q: &[f32], heads: usize, out: &mut [f32]) {
        let (d, n) = (q.len() / heads, out.len() / heads);
        let rows = at..at + n * d;
        match self {
            Buf::F16(v) => ops::scores_f16(q, heads, &v[rows], out),
            Buf::F32(v) => {
                for (qg, out) in q.chunks_exact(d).zip(out.chunks_exact_mut(n)) {
                    for (o, row) in out.iter_mut().zip(v[rows.clone()].chunks_exact(d)) {
                        *o = ops::dot_f32(qg, row);
                    }
                }
            }
            Buf::Q8_0(v) => {
                for (qg, out) in q.chunks_exact(d).zip(out.chunks_exact_mut(n)) {
                    for (o, row) in out.iter_mut().zip(v[at / QK8_0..rows.end / QK8_0].chunks_exact(d / QK8_0)) {
                        *o = row
                            .iter()
                            .zip(qg.chunks_exact(QK8_0))
                            .map(|(b, qs)| b.d.to_f32() * dot_i8(&b.qs, qs))
                            .sum();
                    }
                }
            }
        }
    }

    /// `out[g * d..][..d] = Σ_j w[g * n + j] · row(at + j * d)` for `heads`
    /// weight vectors of `n = w.len() / heads` and `d = out.len() / heads`.
    /// With an f16 cache the weights are rounded to f16 first, like the
    /// values they scale.
    fn mix(&self, at: usize, w: &mut [f32], heads: usize, out: &mut [f32]) {
        let (d, n) = (out.len() / heads, w.len() / heads);
        let rows = at..at + n * d;
        match self {
            Buf::F16(v) => {
                round_f16(w);
                ops::mix_f16(w, heads, &v[rows], out)
            }
            Buf::F32(v) => {
                for (wg, out) in w.chunks_exact(n).zip(out.chunks_exact_mut(d)) {
                    out.fill(0.0);
                    for (&a, row) in wg.iter().zip(v[rows.clone()].chunks_exact(d)) {
                        ops::axpy_f32(out, a, row);
                    }
                }
            }
            Buf::Q8_0(v) => {
                for (wg, out) in w.chunks_exact(n).zip(out.chunks_exact_mut(d)) {
                    out.fill(0.0);
                    for (&a, row) in wg.iter().zip(v[at / QK8_0..rows.end / QK8_0].chunks_exact(d / QK8_0)) {
                        for (b, o) in row.iter().zip(out.chunks_exact_mut(QK8_0)) {
                            let s = a * b.d.to_f32();
                            o.iter_mut().zip(&b.qs).for_each(|(o, &q)| *o += s * q as f32);
                        }
                    }
                }
            }
        }
    }

    /// Append elements `range` as little-endian bytes in the buffer's own
    /// precision (q8_0: whole blocks, each its f16 scale then its 32 quants,
    /// as in a GGUF file).
    fn save(&self, range: Range<usize>, out: &mut Vec<u8>) {
        match self {
            Buf::F32(v) => v[range].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Buf::F16(v) => v[range].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Buf::Q8_0(v) => v[range.start / QK8_0..range.end / QK8_0].iter().for_each(|b| {
                out.extend_from_slice(&b.d.0);
                out.extend(b.qs.iter().map(|&q| q as u8));
            }),
        }
    }

    /// Overwrite the elements from `at` with `bytes` written by [`Buf::save`]
    /// (whole elements or blocks; the caller checked the length).
    fn load(&mut self, at: usize, bytes: &[u8]) {
        match self {
            Buf::F32(v) => v[at..].iter_mut().zip(bytes.chunks_exact(4)).for_each(|(x, b)| {
                *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }),
            Buf::F16(v) => v[at..].iter_mut().zip(bytes.chunks_exact(2)).for_each(|(x, b)| {
                *x = f16::from_le_bytes([b[0], b[1]]);
            }),
            Buf::Q8_0(v) => v[at / QK8_0..].iter_mut().zip(bytes.chunks_exact(Q8_0_BYTES)).for_each(|(x, b)| {
                x.d.0 = [b[0], b[1]];
                x.qs.iter_mut().zip(&b[2..]).for_each(|(q, &byte)| *q = byte as i8);
            }),
        }
    }
}

impl Buf {
    /// The elements' bytes, for f32 and f16.
    fn raw(&self) -> Option<&[u8]> {
        // SAFETY: f32 and f16 (a `u16` in a transparent wrapper) have no
        // padding and every byte is initialised; u8 has alignment 1; the
        // length covers exactly the same memory. Every target is little-endian.
        match self {
            Buf::F32(v) => Some(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(&v[..])) }),
            Buf::F16(v) => Some(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(&v[..])) }),
            Buf::Q8_0(_) => None,
        }
    }
}

/// `x` rounded to the nearest f16 values (vectorised through `half`'s slice
/// conversions), in place.
fn round_f16(x: &mut [f32]) {
    let mut tmp = [f16::ZERO; 64];
    for c in x.chunks_mut(tmp.len()) {
        let t = &mut tmp[..c.len()];
        t.convert_from_f32_slice(c);
        t.convert_to_f32_slice(c);
    }
}

/// Σ q_i x_i of one block (i8 quants, f32 activations).
#[inline]
fn dot_i8(q: &[i8; QK8_0], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (qc, xc) in q.chunks_exact(8).zip(x.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += qc[i] as f32 * xc[i];
        }
    }
    acc.iter().sum()
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
    /// What a copy of the cache elsewhere (the GPU's) needs to stay true:
    /// an id no other cache of this process has, a handle that dies with
    /// the cache, a count of writes, and per position the count when it was
    /// last written.
    id: u64,
    life: Arc<()>,
    writes: u64,
    stamps: Vec<u64>,
}

/// The ids of caches, never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl KvCache {
    pub fn new(ty: KvType, n_kv_head: usize, head_dim_k: usize, head_dim_v: usize, capacity: usize) -> Result<Self> {
        if ty == KvType::Q8_0 && (!head_dim_k.is_multiple_of(QK8_0) || !head_dim_v.is_multiple_of(QK8_0)) {
            return Err(Error::InvalidArgument(format!(
                "a q8_0 KV cache needs head sizes that are multiples of {QK8_0} (this model: {head_dim_k}, {head_dim_v})"
            )));
        }
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
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            life: Arc::new(()),
            writes: 0,
            stamps: alloc(capacity, 0, capacity)?,
        })
    }

    /// Store the key and value of `kv_head` at `pos`.
    #[inline]
    pub fn store(&mut self, kv_head: usize, pos: usize, k: &[f32], v: &[f32]) {
        self.k.store((kv_head * self.capacity + pos) * self.head_dim_k, &k[..self.head_dim_k]);
        self.v.store((kv_head * self.capacity + pos) * self.head_dim_v, &v[..self.head_dim_v]);
        self.writes += 1;
        self.stamps[pos] = self.writes;
    }

    /// This cache's id (unique in the process) and a handle that dies with
    /// it: the key of a copy kept elsewhere, and when to drop that copy.
    pub fn identity(&self) -> (u64, Weak<()>) {
        (self.id, Arc::downgrade(&self.life))
    }

    /// Writes so far (every [`store`](Self::store) and load counts).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// The first position below `end` written after the cache had seen
    /// `writes` writes, or `end` when none was: where a copy of positions
    /// `..end` taken then starts to differ.
    pub fn changed_since(&self, writes: u64, end: usize) -> usize {
        let end = end.min(self.capacity);
        self.stamps[..end].iter().position(|&s| s > writes).unwrap_or(end)
    }

    /// The keys' and the values' bytes, whole (`[kv_head][capacity][dim]`
    /// little-endian), for an f16 or f32 cache; `None` for q8_0.
    pub fn raw(&self) -> Option<(&[u8], &[u8])> {
        Some((self.k.raw()?, self.v.raw()?))
    }

    /// The keys and the values of `kv_head` at positions `lo..hi` of an f16
    /// cache (`None` for another type).
    pub fn f16_rows(&self, kv_head: usize, lo: usize, hi: usize) -> Option<(&[f16], &[f16])> {
        let at = kv_head * self.capacity;
        match (&self.k, &self.v) {
            (Buf::F16(k), Buf::F16(v)) => Some((
                &k[(at + lo) * self.head_dim_k..(at + hi) * self.head_dim_k],
                &v[(at + lo) * self.head_dim_v..(at + hi) * self.head_dim_v],
            )),
            _ => None,
        }
    }

    /// `dst = q`, rounded to the cache's precision before it meets the keys
    /// (an f16 cache multiplies f16 by f16, as llama.cpp's f16 cache does).
    pub fn round_query(&self, q: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(q);
        if self.ty == KvType::F16 {
            round_f16(dst);
        }
    }

    /// Scores of `heads` queries (`q`: `heads` rows of `head_dim_k`, from
    /// [`KvCache::round_query`]) against the keys of `kv_head` at positions
    /// `lo..lo + n`, `n = out.len() / heads`: `out[g * n + j]`.
    pub fn k_scores(&self, kv_head: usize, lo: usize, q: &[f32], heads: usize, out: &mut [f32]) {
        debug_assert_eq!(q.len(), heads * self.head_dim_k);
        self.k.scores((kv_head * self.capacity + lo) * self.head_dim_k, q, heads, out);
    }

    /// `out[g * head_dim_v..][..head_dim_v] = Σ_j w[g * n + j] · value(kv_head,
    /// lo + j)` for `heads` weight vectors of `n = w.len() / heads`
    /// positions; the weights may be rounded in place (an f16 cache).
    pub fn v_mix(&self, kv_head: usize, lo: usize, w: &mut [f32], heads: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), heads * self.head_dim_v);
        self.v.mix((kv_head * self.capacity + lo) * self.head_dim_v, w, heads, out);
    }

    /// Bytes the entries of `n_pos` positions take.
    pub fn bytes_for(&self, n_pos: usize) -> usize {
        n_pos * self.n_kv_head * (self.ty.bytes_for(self.head_dim_k) + self.ty.bytes_for(self.head_dim_v))
    }

    /// Bytes allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.bytes_for(self.capacity)
    }

    /// Append the entries of positions `0..n_pos` (at most the capacity) in
    /// the cache's own precision: every key head's rows, then every value
    /// head's, [`bytes_for`](Self::bytes_for)`(n_pos)` bytes. Positions past
    /// `n_pos` are not written: a snapshot holds only what is used.
    pub fn save_positions(&self, n_pos: usize, out: &mut Vec<u8>) {
        let n_pos = n_pos.min(self.capacity);
        out.reserve(self.bytes_for(n_pos));
        for (buf, d) in [(&self.k, self.head_dim_k), (&self.v, self.head_dim_v)] {
            for h in 0..self.n_kv_head {
                let at = h * self.capacity * d;
                buf.save(at..at + n_pos * d, out);
            }
        }
    }

    /// Overwrite positions `0..n_pos` with the bytes of
    /// [`save_positions`](Self::save_positions); refused unless `bytes` is
    /// exactly that long and the positions fit.
    pub fn load_positions(&mut self, n_pos: usize, bytes: &[u8]) -> Result<()> {
        if n_pos > self.capacity || bytes.len() != self.bytes_for(n_pos) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of KV entries for {n_pos} positions (expected {} for a cache of {} positions)",
                bytes.len(),
                self.bytes_for(n_pos.min(self.capacity)),
                self.capacity
            )));
        }
        self.writes += 1;
        self.stamps[..n_pos].fill(self.writes);
        let mut rest = bytes;
        let (cap, heads, ty) = (self.capacity, self.n_kv_head, self.ty);
        for (buf, d) in [(&mut self.k, self.head_dim_k), (&mut self.v, self.head_dim_v)] {
            for h in 0..heads {
                let (head, tail) = rest.split_at(ty.bytes_for(n_pos * d));
                buf.load(h * cap * d, head);
                rest = tail;
            }
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(ty: KvType, capacity: usize, n_pos: usize) -> KvCache {
        let mut c = KvCache::new(ty, 2, 32, 64, capacity).unwrap();
        for h in 0..2 {
            for p in 0..n_pos {
                let k: Vec<f32> = (0..32).map(|i| (h * 1000 + p * 10 + i) as f32 * 0.01).collect();
                let v: Vec<f32> = (0..64).map(|i| -((h * 1000 + p * 10 + i) as f32) * 0.02).collect();
                c.store(h, p, &k, &v);
            }
        }
        c
    }

    #[test]
    fn used_positions_round_trip_in_their_own_precision() {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let c = filled(ty, 16, 5);
            let mut bytes = Vec::new();
            c.save_positions(5, &mut bytes);
            assert_eq!(bytes.len(), c.bytes_for(5), "{ty:?}");
            assert_eq!(bytes.len(), 5 * 2 * (ty.bytes_for(32) + ty.bytes_for(64)), "{ty:?}: only used positions");

            let mut back = KvCache::new(ty, 2, 32, 64, 16).unwrap();
            back.load_positions(5, &bytes).unwrap();
            let mut again = Vec::new();
            back.save_positions(5, &mut again);
            assert_eq!(bytes, again, "{ty:?}");
            // The restored entries score and mix like the originals.
            let q: Vec<f32> = (0..32).map(|i| i as f32 * 0.1).collect();
            let (mut a, mut b) = (vec![0.0; 5], vec![0.0; 5]);
            c.k_scores(1, 0, &q, 1, &mut a);
            back.k_scores(1, 0, &q, 1, &mut b);
            assert_eq!(a, b, "{ty:?}");
            let (mut wa, mut wb) = (vec![0.2f32; 5], vec![0.2f32; 5]);
            let (mut oa, mut ob) = (vec![0.0; 64], vec![0.0; 64]);
            c.v_mix(0, 0, &mut wa, 1, &mut oa);
            back.v_mix(0, 0, &mut wb, 1, &mut ob);
            assert_eq!(oa, ob, "{ty:?}");
        }
    }

    #[test]
    fn loading_checks_the_length_and_the_capacity() {
        let c = filled(KvType::F16, 8, 3);
        let mut bytes = Vec::new();
        c.save_positions(3, &mut bytes);
        let mut back = KvCache::new(KvType::F16, 2, 32, 64, 8).unwrap();
        assert!(back.load_positions(3, &bytes[1..]).is_err());
        assert!(back.load_positions(2, &bytes).is_err());
        assert!(back.load_positions(9, &bytes).is_err());
        let mut small = KvCache::new(KvType::F16, 2, 32, 64, 2).unwrap();
        assert!(small.load_positions(3, &bytes).is_err());
    }
}
