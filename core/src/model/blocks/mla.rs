//! Multi-head Latent Attention (DeepSeek-V2/V3), with the up-projections
//! absorbed as llama.cpp runs it: the cache holds one compressed latent
//! `c` (`kv_lora` values, RMS-normed) and one rotary key `k_pe` (`rope`
//! values) per position, shared by every head. Per head `h`:
//!
//! ```text
//!   q_h = [q_nope | q_pe]                        (q_pe roped)
//!   score_j = (k_b[h] · q_nope) · c_j + q_pe · k_pe_j, times kq_scale
//!   o_h = v_b[h] · Σ_j softmax(score)_j c_j
//! ```
//!
//! which equals attention over the decompressed keys `[k_b[h]ᵀ c | k_pe]`
//! and values `v_b[h] c` without ever forming them.

use half::f16;

use super::super::cache::KvType;
use super::super::pass::{HostBlock, Pass};
use super::super::scratch::{heap, take, ActCache, SharedMut};
use super::super::weights::{Experts, Loader, Matrix};
use super::norm::RmsNorm;
use super::yarn::Yarn;
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{ops, MatJob, QActs};
use crate::threads::Pieces;

/// Shape of an MLA layer.
#[derive(Clone, Copy, Debug)]
pub struct MlaParams {
    pub n_head: usize,
    /// Rank of the query compression (0: the query is projected directly).
    pub q_lora: usize,
    /// Rank of the key-value compression (the latent's size).
    pub kv_lora: usize,
    /// Per head: the query/key dims without position, the rotary dims, the value dims.
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    /// Softmax scale of the scores (YaRN's mscale² / sqrt(nope + rope)).
    pub kq_scale: f32,
    pub yarn: Yarn,
    pub eps: f32,
}

impl MlaParams {
    /// Values cached per position: the latent, then the rotary key.
    pub fn width(&self) -> usize {
        self.kv_lora + self.rope
    }

    /// A fresh cache of one such layer for `n_ctx` positions.
    pub fn new_cache(&self, kv: KvType, n_ctx: usize) -> Result<LatentCache> {
        LatentCache::new(kv, self.width(), n_ctx)
    }
}

/// Rows stored in f32, or in f16 (an f16 or q8_0 KV type: the latent's
/// 512 + 64 values of DeepSeek-V3 are not kept in q8_0 blocks).
enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// The latent cache of one MLA layer: `[position][kv_lora + rope]`.
pub struct LatentCache {
    rows: Rows,
    width: usize,
    pub capacity: usize,
}

impl LatentCache {
    pub fn new(kv: KvType, width: usize, capacity: usize) -> Result<LatentCache> {
        let n = width.checked_mul(capacity).ok_or_else(|| Error::OutOfMemory("latent cache size".into()))?;
        let oom = || Error::OutOfMemory(format!("latent cache of {n} values"));
        let rows = match kv {
            KvType::F32 => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| oom())?;
                v.resize(n, 0.0);
                Rows::F32(v)
            }
            KvType::F16 | KvType::Q8_0 => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| oom())?;
                v.resize(n, f16::ZERO);
                Rows::F16(v)
            }
        };
        Ok(LatentCache { rows, width, capacity })
    }

    /// Bytes per value for a KV type.
    pub fn value_bytes(kv: KvType) -> usize {
        if kv == KvType::F32 {
            4
        } else {
            2
        }
    }

    /// Bytes of `n_pos` positions.
    pub fn bytes_for(&self, n_pos: usize) -> usize {
        n_pos * self.width * if matches!(self.rows, Rows::F32(_)) { 4 } else { 2 }
    }

    pub fn allocated_bytes(&self) -> usize {
        self.bytes_for(self.capacity)
    }

    fn store(&mut self, pos: usize, row: &[f32]) {
        let w = self.width;
        match &mut self.rows {
            Rows::F32(v) => v[pos * w..(pos + 1) * w].copy_from_slice(row),
            Rows::F16(v) => v[pos * w..(pos + 1) * w].iter_mut().zip(row).for_each(|(d, &s)| *d = f16::from_f32(s)),
        }
    }

    /// Positions `..n` as f32 into `out` (`[n][width]`).
    fn read(&self, n: usize, out: &mut [f32]) {
        match &self.rows {
            Rows::F32(v) => out.copy_from_slice(&v[..n * self.width]),
            Rows::F16(v) => out.iter_mut().zip(&v[..n * self.width]).for_each(|(d, s)| *d = s.to_f32()),
        }
    }

    /// A query rounded to the cache's precision (what a product with f16 rows sees).
    fn round(&self, q: &mut [f32]) {
        if matches!(self.rows, Rows::F16(_)) {
            q.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
        }
    }

    /// Append the raw bytes of positions `..n_pos` (a snapshot's).
    pub fn save_positions(&self, n_pos: usize, out: &mut Vec<u8>) {
        let n = n_pos * self.width;
        match &self.rows {
            Rows::F32(v) => v[..n].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Rows::F16(v) => v[..n].iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
        }
    }

    /// Positions `..n_pos` from [`save_positions`](Self::save_positions)'s bytes.
    pub fn load_positions(&mut self, n_pos: usize, bytes: &[u8]) -> Result<()> {
        if n_pos > self.capacity || bytes.len() != self.bytes_for(n_pos) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes for {n_pos} positions of a latent cache of {} ({} bytes expected)",
                bytes.len(),
                self.capacity,
                self.bytes_for(n_pos.min(self.capacity))
            )));
        }
        match &mut self.rows {
            Rows::F32(v) => v.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(d, b)| {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }),
            Rows::F16(v) => v.iter_mut().zip(bytes.chunks_exact(2)).for_each(|(d, b)| {
                *d = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
            }),
        }
        Ok(())
    }
}

/// How the query is projected: through its compression or directly.
pub enum QProj {
    /// `q_a [q_lora, n_embd]`, its norm `[q_lora]`, `q_b [n_head*(nope+rope), q_lora]`.
    Lora { a: Matrix, norm: RmsNorm, b: Matrix },
    /// `q [n_head*(nope+rope), n_embd]`.
    Direct(Matrix),
}

/// One MLA layer's weights. Shapes: kv_a `[kv_lora+rope, n_embd]`, kv norm
/// `[kv_lora]`, k_b `[n_head][kv_lora, nope]`, v_b `[n_head][v_dim, kv_lora]`,
/// o `[n_embd, n_head*v_dim]`.
pub struct Mla {
    pub p: MlaParams,
    pub q: QProj,
    pub kv_a: Matrix,
    pub kv_norm: RmsNorm,
    pub k_b: Experts,
    pub v_b: Experts,
    pub o: Matrix,
}

/// What an MLA layer reuses from pass to pass.
#[derive(Default)]
pub struct MlaScratch {
    input: ActCache,
    q_a: Vec<f32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    /// The queries without position, `[n][n_head][nope]`; absorbed, `[n_head][n][kv_lora]`.
    nope: Vec<f32>,
    absorbed: Vec<f32>,
    /// The cache's positions as f32; per thread, a query row and its scores.
    cached: Vec<f32>,
    work: Vec<f32>,
    /// The heads' weighted latents `[n][n_head][kv_lora]`; their values, `[n_head][n][v_dim]`.
    latent: Vec<f32>,
    values: Vec<f32>,
    att: Vec<f32>,
    /// Per head, its rows among `[n][n_head]` rows.
    head_rows: Vec<usize>,
    acts: QActs,
    heads: QActs,
}

impl MlaScratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        self.input.heap_bytes()
            + heap(&self.q_a)
            + heap(&self.q)
            + heap(&self.kv)
            + heap(&self.nope)
            + heap(&self.absorbed)
            + heap(&self.cached)
            + heap(&self.work)
            + heap(&self.latent)
            + heap(&self.values)
            + heap(&self.att)
            + self.head_rows.capacity() * std::mem::size_of::<usize>()
            + self.acts.heap_bytes()
            + self.heads.heap_bytes()
    }
}

impl Mla {
    /// Layer `il`'s tensors.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, p: MlaParams) -> Result<Mla> {
        let q_rows = p.n_head * (p.nope + p.rope);
        let q = if p.q_lora > 0 {
            QProj::Lora {
                a: ld.matrix(TensorKind::AttnQA, il, p.q_lora, n_embd)?,
                norm: RmsNorm::load(ld, TensorKind::AttnQANorm, il, p.q_lora, p.eps)?,
                b: ld.matrix(TensorKind::AttnQB, il, q_rows, p.q_lora)?,
            }
        } else {
            QProj::Direct(ld.matrix(TensorKind::AttnQ, il, q_rows, n_embd)?)
        };
        Ok(Mla {
            q,
            kv_a: ld.matrix(TensorKind::AttnKvAMqa, il, p.width(), n_embd)?,
            kv_norm: RmsNorm::load(ld, TensorKind::AttnKvANorm, il, p.kv_lora, p.eps)?,
            k_b: ld.experts(TensorKind::AttnKB, il, p.n_head, p.kv_lora, p.nope)?,
            v_b: ld.experts(TensorKind::AttnVB, il, p.n_head, p.v_dim, p.kv_lora)?,
            o: ld.matrix(TensorKind::AttnOut, il, n_embd, p.n_head * p.v_dim)?,
            p,
        })
    }

    /// `out = MLA(x)` for the pass's tokens (`x`, `out`: `[n][n_embd]`);
    /// their latents join `cache` at positions `pos0..pos0 + n`.
    pub fn forward(&self, pass: &Pass, cache: &mut LatentCache, s: &mut MlaScratch, x: &[f32], out: &mut [f32]) {
        let (p, n, pos0) = (&self.p, pass.n, pass.pos0);
        let (nh, hk, w) = (p.n_head, p.nope + p.rope, p.width());
        let n_embd = x.len() / n;

        // q = q_b · norm(q_a · x) (or q · x), [n][n_head][nope | rope]; kv = kv_a · x, [n][kv_lora | rope].
        let q = take(&mut s.q, n * nh * hk);
        let kv = take(&mut s.kv, n * w);
        let first = match &self.q {
            QProj::Lora { a, .. } => a,
            QProj::Direct(m) => m,
        };
        pass.observe(&[first, &self.kv_a], x);
        s.input.prepare(x, n, n_embd, &[first.ty, self.kv_a.ty]);
        match &self.q {
            QProj::Lora { a, norm, b } => {
                let qa = take(&mut s.q_a, n * p.q_lora);
                pass.matmul(&mut [
                    MatJob { w: a.view(pass.file), x: s.input.get(a.ty), rows: None, out: qa },
                    MatJob { w: self.kv_a.view(pass.file), x: s.input.get(self.kv_a.ty), rows: None, out: kv },
                ]);
                norm.forward_inplace(qa);
                pass.project(b, &mut s.acts, qa, q);
            }
            QProj::Direct(m) => pass.matmul(&mut [
                MatJob { w: m.view(pass.file), x: s.input.get(m.ty), rows: None, out: q },
                MatJob { w: self.kv_a.view(pass.file), x: s.input.get(self.kv_a.ty), rows: None, out: kv },
            ]),
        }

        // RoPE on q_pe (every head) and k_pe at each token's position; the
        // latent is normed; [c | k_pe] joins the cache.
        let mut cs = vec![(0.0f32, 0.0f32); p.rope / 2];
        for t in 0..n {
            p.yarn.angles(pos0 + t, &mut cs);
            for h in 0..nh {
                ops::rope_apply(&mut q[(t * nh + h) * hk + p.nope..][..p.rope], p.rope, &cs, false);
            }
            let row = &mut kv[t * w..(t + 1) * w];
            ops::rope_apply(&mut row[p.kv_lora..], p.rope, &cs, false);
            self.kv_norm.forward_inplace(&mut row[..p.kv_lora]);
            cache.store(pos0 + t, row);
        }

        // Absorb k_b into the queries: per head, k_b[h] · q_nope, [n_head][n][kv_lora].
        let nope = take(&mut s.nope, n * nh * p.nope);
        for (dst, src) in nope.chunks_exact_mut(p.nope).zip(q.chunks_exact(hk)) {
            dst.copy_from_slice(&src[..p.nope]);
        }
        s.head_rows.clear();
        s.head_rows.extend((0..nh).flat_map(|h| (0..n).map(move |t| t * nh + h)));
        let absorbed = take(&mut s.absorbed, nh * n * p.kv_lora);
        s.acts.quantize(self.k_b.all.ty, nope, n * nh, p.nope);
        per_head(pass, &self.k_b, &s.acts, &s.head_rows, n, nope, absorbed);

        // Scores over the cached latents and rotary keys, softmax, the weighted latent (on the host).
        pass.backend.on_host(HostBlock::LatentAttention);
        let len = pos0 + n;
        let cached = take(&mut s.cached, len * w);
        cache.read(len, cached);
        let latent = take(&mut s.latent, n * nh * p.kv_lora);
        let threads = pass.pool.n_threads();
        let stripe = w + len;
        let work = take(&mut s.work, threads * stripe);
        let (lat_out, work) = (SharedMut::new(latent), SharedMut::new(work));
        let (items, pieces) = (n * nh, Pieces::new(n * nh));
        let (cached, absorbed, q, cache) = (&*cached, &*absorbed, &*q, &*cache);
        pass.pool.run(&|ith, _| {
            // SAFETY: each thread owns its stripe of the work buffer.
            let (qrow, scores) = unsafe { work.slice(ith * stripe, stripe) }.split_at_mut(w);
            // The latest tokens (the most positions) first.
            for item in pieces.iter().map(|i| items - 1 - i) {
                let (t, h) = (item / nh, item % nh);
                let seen = pos0 + t + 1;
                qrow[..p.kv_lora].copy_from_slice(&absorbed[(h * n + t) * p.kv_lora..][..p.kv_lora]);
                qrow[p.kv_lora..].copy_from_slice(&q[(t * nh + h) * hk + p.nope..][..p.rope]);
                cache.round(qrow);
                let sc = &mut scores[..seen];
                for (j, s) in sc.iter_mut().enumerate() {
                    *s = ops::dot_f32(qrow, &cached[j * w..(j + 1) * w]) * p.kq_scale;
                }
                ops::softmax(sc);
                // SAFETY: the item owns head h of token t.
                let o = unsafe { lat_out.slice((t * nh + h) * p.kv_lora, p.kv_lora) };
                o.fill(0.0);
                for (j, &pj) in sc.iter().enumerate() {
                    ops::axpy_f32(o, pj, &cached[j * w..][..p.kv_lora]);
                }
            }
        });

        // Values: per head, v_b[h] · latent, into [n][n_head][v_dim]; then the output projection.
        let values = take(&mut s.values, nh * n * p.v_dim);
        s.acts.quantize(self.v_b.all.ty, latent, n * nh, p.kv_lora);
        per_head(pass, &self.v_b, &s.acts, &s.head_rows, n, latent, values);
        let att = take(&mut s.att, n * nh * p.v_dim);
        for h in 0..nh {
            for t in 0..n {
                att[(t * nh + h) * p.v_dim..][..p.v_dim].copy_from_slice(&values[(h * n + t) * p.v_dim..][..p.v_dim]);
            }
        }
        pass.project(&self.o, &mut s.heads, att, out);
    }
}

/// `out[h] = w[h] · x[rows of h]` for every head `h` of the stack `w`
/// (`x`: `[n][n_head]` rows quantised in `acts`; `rows`: head-major row
/// lists of `n` each; `out`: `[n_head][n][w.rows]`). `f32_x` is `x` before
/// quantisation, for the observer.
fn per_head(pass: &Pass, w: &Experts, acts: &QActs, rows: &[usize], n: usize, f32_x: &[f32], out: &mut [f32]) {
    let per = n * w.rows;
    let mut jobs: Vec<MatJob> = Vec::with_capacity(w.n_expert);
    for (h, (o, r)) in out.chunks_exact_mut(per).zip(rows.chunks_exact(n)).enumerate() {
        pass.observe_expert(&[w], h, f32_x, r);
        jobs.push(MatJob { w: w.slab(pass.file, h), x: acts, rows: Some(r), out: o });
    }
    pass.matmul(&mut jobs);
}
