//! Causal self-attention over the KV cache: grouped-query heads, RoPE,
//! optional QK-norm, biases, an output gate, and sliding windows.

use super::cache::KvCache;
use super::scratch::{split, take, Scratch, SharedMut};
use super::weights::{Loader, Matrix};
use crate::error::Result;
use crate::gguf::TensorKind;
use crate::kernels::{self, ops, MatJob};
use crate::threads::ThreadPool;

/// How positions rotate queries and keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Dimensions rotated at the start of each head (partial rotary when < head_dim).
    pub n_rot: usize,
    pub base: f32,
    /// 1 / linear scaling factor.
    pub scale: f32,
    /// NeoX pairs (i, i + n_rot/2) rather than adjacent pairs (2i, 2i+1).
    pub neox: bool,
}

/// Shape and behaviour of one attention layer.
#[derive(Clone, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub rope: Rope,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// Attend only to the last `window` positions (including the current one).
    pub window: Option<usize>,
    /// Epsilon of the per-head QK RMSNorm.
    pub eps: f32,
}

/// Weights of one attention layer. Shapes: q `[n_head*hd (x2 if gated), n_embd]`,
/// k/v `[n_kv_head*hd, n_embd]`, o `[n_embd, n_head*hd_v]`.
pub struct AttnWeights {
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub o: Matrix,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// q carries a per-head output gate after each head's query
    /// (`[q_h | gate_h]` per head): the output is `att * sigmoid(gate)`.
    pub gated: bool,
}

impl AttnWeights {
    /// Load the standard tensors of layer `il`.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, p: &AttnParams, gated: bool) -> Result<AttnWeights> {
        let q_rows = p.n_head * p.head_dim * if gated { 2 } else { 1 };
        let kv_k = p.n_kv_head * p.head_dim;
        let kv_v = p.n_kv_head * p.head_dim_v;
        Ok(AttnWeights {
            q: ld.matrix(TensorKind::AttnQ, il, q_rows, n_embd)?,
            k: ld.matrix(TensorKind::AttnK, il, kv_k, n_embd)?,
            v: ld.matrix(TensorKind::AttnV, il, kv_v, n_embd)?,
            o: ld.matrix(TensorKind::AttnOut, il, n_embd, p.n_head * p.head_dim_v)?,
            q_norm: ld.vector_opt(TensorKind::AttnQNorm, il, p.head_dim)?,
            k_norm: ld.vector_opt(TensorKind::AttnKNorm, il, p.head_dim)?,
            q_bias: ld.bias_opt(TensorKind::AttnQ, il, q_rows)?,
            k_bias: ld.bias_opt(TensorKind::AttnK, il, kv_k)?,
            v_bias: ld.bias_opt(TensorKind::AttnV, il, kv_v)?,
            gated,
        })
    }
}

/// Run attention for `n` tokens at positions `pos0..pos0+n` whose normalised
/// inputs are `s.xn` (`[n][n_embd]`); the projected output lands in `s.out`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    file: &[u8],
    pool: &ThreadPool,
    p: &AttnParams,
    w: &AttnWeights,
    cache: &mut KvCache,
    pos0: usize,
    n: usize,
    n_embd: usize,
    s: &mut Scratch,
) {
    let (hd, hdv) = (p.head_dim, p.head_dim_v);
    let q_rows = w.q.rows;
    let (kv_k, kv_v) = (p.n_kv_head * hd, p.n_kv_head * hdv);

    // Projections: q (and its gate), k, v = W · xn.
    let xn = &s.xn[..n * n_embd];
    let q = take(&mut s.q, n * q_rows);
    let k = take(&mut s.k, n * kv_k);
    let v = take(&mut s.v, n * kv_v);
    s.shared.prepare(xn, n, n_embd, &[w.q.ty, w.k.ty, w.v.ty]);
    kernels::matmul_batch(
        pool,
        &mut [
            MatJob { w: w.q.view(file), x: s.shared.get(w.q.ty), rows: None, out: q },
            MatJob { w: w.k.view(file), x: s.shared.get(w.k.ty), rows: None, out: k },
            MatJob { w: w.v.view(file), x: s.shared.get(w.v.ty), rows: None, out: v },
        ],
    );
    for (bias, out, width) in [(&w.q_bias, &mut *q, q_rows), (&w.k_bias, &mut *k, kv_k), (&w.v_bias, &mut *v, kv_v)] {
        if let Some(b) = bias {
            out.chunks_exact_mut(width).for_each(|row| ops::add(row, b));
        }
    }

    // Per head: QK-norm, then RoPE at the token's position; keys and values go to the cache.
    let q_stride = if w.gated { 2 * hd } else { hd };
    for t in 0..n {
        let pos = pos0 + t;
        let qt = &mut q[t * q_rows..(t + 1) * q_rows];
        let kt = &mut k[t * kv_k..(t + 1) * kv_k];
        ops::with_rope_angles(p.rope.n_rot, pos, p.rope.base, p.rope.scale, |cs| {
            for h in 0..p.n_head {
                let qh = &mut qt[h * q_stride..][..hd];
                if let Some(nw) = &w.q_norm {
                    ops::rms_norm_inplace(qh, Some(nw), p.eps);
                }
                ops::rope_apply(qh, hd, cs, p.rope.neox);
            }
            if let Some(nw) = &w.k_norm {
                kt.chunks_exact_mut(hd).for_each(|kh| ops::rms_norm_inplace(kh, Some(nw), p.eps));
            }
            ops::rope_apply(kt, hd, cs, p.rope.neox);
        });
        for h in 0..p.n_kv_head {
            cache.store(h, pos, &kt[h * hd..(h + 1) * hd], &v[t * kv_v + h * hdv..][..hdv]);
        }
    }

    // softmax(scale · q·K) · V for every (token, head). The query heads that
    // share a KV head run together: the score and mix kernels read each key
    // and value row once for all of them; work items are (token, KV head,
    // slice of its query heads), split over threads. Each thread's stripe of
    // `s.scores` holds the item's scores and its queries, gathered into
    // consecutive rows and rounded to the cache's precision.
    let att = take(&mut s.att, n * p.n_head * hdv);
    let cap = cache.capacity;
    let group = p.n_head / p.n_kv_head;
    let per_item = heads_per_item(group, n * p.n_kv_head, pool.n_threads());
    let stripe = per_item * (cap + hd);
    let scratch = take(&mut s.scores, pool.n_threads() * stripe);
    let (att_out, scratch) = (SharedMut::new(att), SharedMut::new(scratch));
    let cache = &*cache;
    let q = &*q;
    let slices = group / per_item;
    pool.run(&|ith, nth| {
        let (a, b) = split(n * p.n_kv_head * slices, ith, nth);
        // SAFETY: each thread owns its stripe of the scratch.
        let (sc_all, qs) = unsafe { scratch.slice(ith * stripe, stripe) }.split_at_mut(per_item * cap);
        for item in a..b {
            let (t, rest) = (item / (p.n_kv_head * slices), item % (p.n_kv_head * slices));
            let (kvh, h0) = (rest / slices, (rest / slices) * group + (rest % slices) * per_item);
            let pos = pos0 + t;
            let lo = p.window.map_or(0, |wnd| (pos + 1).saturating_sub(wnd));
            let len = pos + 1 - lo;
            for (g, qg) in qs.chunks_exact_mut(hd).enumerate() {
                cache.round_query(&q[t * q_rows + (h0 + g) * q_stride..][..hd], qg);
            }
            let sc = &mut sc_all[..per_item * len];
            cache.k_scores(kvh, lo, qs, per_item, sc);
            for row in sc.chunks_exact_mut(len) {
                ops::scale(row, p.scale);
                ops::softmax(row);
            }
            // SAFETY: the item owns heads h0..h0 + per_item of token t.
            let out = unsafe { att_out.slice((t * p.n_head + h0) * hdv, per_item * hdv) };
            cache.v_mix(kvh, lo, sc, per_item, out);
            if w.gated {
                for (g, o) in out.chunks_exact_mut(hdv).enumerate() {
                    let gate = &q[t * q_rows + (h0 + g) * q_stride + hd..][..hd];
                    for (o, &gv) in o.iter_mut().zip(gate) {
                        *o *= ops::sigmoid(gv);
                    }
                }
            }
        }
    });

    // Output projection.
    let out = take(&mut s.out, n * n_embd);
    project(pool, file, &w.o, &mut s.acts2, &s.att[..n * p.n_head * hdv], n, out);
}

/// Query heads per work item: the whole group sharing a KV head when there
/// are enough (token, KV head) items to keep every thread busy, else the
/// largest divisor of the group that makes enough items.
fn heads_per_item(group: usize, kv_items: usize, threads: usize) -> usize {
    (1..=group).rev().find(|&k| group.is_multiple_of(k) && kv_items * (group / k) >= threads).unwrap_or(1)
}

/// out = W · x for `n` rows of x.
pub fn project(
    pool: &ThreadPool,
    file: &[u8],
    w: &Matrix,
    acts: &mut kernels::QActs,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    acts.quantize(w.ty, x, n, w.cols);
    kernels::matmul(pool, &w.view(file), acts, out);
}

#[cfg(test)]
mod tests {
    use super::heads_per_item;

    #[test]
    fn query_heads_split_only_as_far_as_the_threads_need() {
        // Qwen3.5 decode: 2 KV heads of 8 query heads, 2 threads: whole groups.
        assert_eq!(heads_per_item(8, 2, 2), 8);
        // 6 threads: quarters of each group (8 items).
        assert_eq!(heads_per_item(8, 2, 6), 2);
        // Gemma 3 270M decode: one KV head of 4, 2 threads: halves.
        assert_eq!(heads_per_item(4, 1, 2), 2);
        // More threads than heads: one head per item; prefill: whole groups.
        assert_eq!(heads_per_item(4, 1, 8), 1);
        assert_eq!(heads_per_item(4, 128, 8), 4);
        assert_eq!(heads_per_item(1, 1, 2), 1);
    }
}
