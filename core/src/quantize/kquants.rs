//! The K-quants Q2_K..Q6_K: super-blocks of 256 values in sub-blocks of 16
//! or 32, each sub-block with its own scale (and, for Q2/Q4/Q5_K, offset),
//! the sub-block scales themselves quantised against one or two f16 scales
//! per super-block.
//!
//! Without an importance vector these are llama.cpp's reference
//! quantisers: each sub-block fitted on its own, the sub-block scales
//! rounded against the largest. With one, the sub-blocks are fitted with
//! weights importance · sqrt(σ² + x²) (σ² the super-block's mean square,
//! doubled for Q3_K..Q5_K) and the sub-block scales are themselves searched, weighted by
//! each sub-block's total weight. Q6_K's weighted fit uses the importance
//! vector as the weights directly, as llama.cpp does. Either way the levels
//! are finally re-rounded against the scales as stored.

use super::common::{
    each_block, importance, make_q3_quants, make_qkx_quants, make_qp_quants, make_qx_quants, nearest_int, positive_max,
    sum, sum_squares, ScaleMinSearch, GROUP_MAX_EPS,
};
use crate::quant::{scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, F16Bytes, QK_K};

/// One level per value of a super-block.
type Levels = [u8; QK_K];

/// The scale-and-offset search of every weighted sub-block fit.
const WEIGHTED_SEARCH: ScaleMinSearch = ScaleMinSearch { rmin: -0.9, rdelta: 0.05, steps: 36, mad: false };

// ---- Q2_K: 16 sub-blocks of 16, levels 0..=3, 4-bit scales and mins ----

pub(super) fn q2_k(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ2K| {
        let mut l = [0u8; QK_K];
        match qw {
            None => q2_k_plain(x, &mut l, b),
            Some(qw) => q2_k_weighted(x, qw, &mut l, b),
        }
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        requantize_affine::<16>(x, 3, d, dmin, |j| (b.scales[j] & 0xF, b.scales[j] >> 4), &mut l);
        b.qs = pack_2bit(&l);
    });
}

/// Each sub-block fitted by mean absolute error weighted by |x|; scales
/// and mins rounded to 4 bits against the largest of each.
fn q2_k_plain(x: &[f32; QK_K], l: &mut Levels, b: &mut BlockQ2K) {
    const SEARCH: ScaleMinSearch = ScaleMinSearch { rmin: -0.5, rdelta: 0.1, steps: 15, mad: true };
    let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
    for (j, (xs, ls)) in x.as_chunks::<16>().0.iter().zip(l.as_chunks_mut::<16>().0).enumerate() {
        let w = xs.map(f32::abs);
        (scales[j], mins[j]) = make_qkx_quants(3, xs, &w, ls, SEARCH);
    }
    let (max_scale, max_min) = (positive_max(&scales), positive_max(&mins));
    b.scales = [0; 16];
    b.d = F16Bytes::from_f32(0.0);
    b.dmin = F16Bytes::from_f32(0.0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (q, &s) in b.scales.iter_mut().zip(&scales) {
            *q = nearest_int(iscale * s) as u8;
        }
        b.d = F16Bytes::from_f32(max_scale / 15.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (q, &m) in b.scales.iter_mut().zip(&mins) {
            *q |= (nearest_int(iscale * m) << 4) as u8;
        }
        b.dmin = F16Bytes::from_f32(max_min / 15.0);
    }
}

fn q2_k_weighted(x: &[f32; QK_K], qw: &[f32; QK_K], l: &mut Levels, b: &mut BlockQ2K) {
    let sigma2 = sum_squares(x) / QK_K as f32;
    let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
    let subs = x.as_chunks::<16>().0.iter().zip(qw.as_chunks::<16>().0).zip(l.as_chunks_mut::<16>().0);
    for (j, ((xs, qws), ls)) in subs.enumerate() {
        let w = importance(xs, qws, sigma2);
        sw[j] = sum(&w);
        (scales[j], mins[j]) = make_qkx_quants(3, xs, &w, ls, WEIGHTED_SEARCH);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    b.d = F16Bytes::from_f32(make_qp_quants(15, &scales, &sw, &mut ls));
    b.dmin = F16Bytes::from_f32(make_qp_quants(15, &mins, &sw, &mut lm));
    b.scales = std::array::from_fn(|j| ls[j] | (lm[j] << 4));
}

// ---- Q3_K: 16 sub-blocks of 16, levels -4..=3, 6-bit signed scales ----

pub(super) fn q3_k(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ3K| {
        let mut l = [0u8; QK_K];
        let (d, scales) = match qw {
            None => q3_k_plain(x, &mut l),
            Some(qw) => q3_k_weighted(x, qw, &mut l),
        };
        (b.d, b.scales) = (F16Bytes::from_f32(d), scales);
        requantize_symmetric::<16>(x, 4, b.d.to_f32(), |j| q3_k_scale(&b.scales, j), &mut l);
        (b.hmask, b.qs) = pack_q3_k(&mut l);
    });
}

/// Each sub-block fitted by x²-weighted least squares; the scales rounded
/// to -32..=31 against the largest in magnitude. Returns (d, packed scales).
fn q3_k_plain(x: &[f32; QK_K], l: &mut Levels) -> (f32, [u8; 12]) {
    let mut scales = [0.0f32; 16];
    for (s, (xs, ls)) in scales.iter_mut().zip(x.as_chunks::<16>().0.iter().zip(l.as_chunks_mut::<16>().0)) {
        *s = make_q3_quants(4, xs, ls);
    }
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for &s in &scales {
        if s.abs() > amax {
            (max_scale, amax) = (s, s.abs());
        }
    }
    let mut packed = [0u8; 12];
    if max_scale == 0.0 {
        return (0.0, packed);
    }
    let iscale = -32.0 / max_scale;
    for (j, &s) in scales.iter().enumerate() {
        let q = (nearest_int(iscale * s) as i8 as i32).clamp(-32, 31) + 32;
        set_q3_k_scale(&mut packed, j, q as u8);
    }
    (1.0 / iscale, packed)
}

fn q3_k_weighted(x: &[f32; QK_K], qw: &[f32; QK_K], l: &mut Levels) -> (f32, [u8; 12]) {
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
    let subs = x.as_chunks::<16>().0.iter().zip(qw.as_chunks::<16>().0).zip(l.as_chunks_mut::<16>().0);
    for (j, ((xs, qws), ls)) in subs.enumerate() {
        let w = importance(xs, qws, sigma2);
        sw[j] = sum(&w);
        scales[j] = make_qx_quants(4, xs, Some(&w), ls);
    }
    let mut ls = [0u8; 16];
    let d = make_qx_quants(32, &scales, Some(&sw), &mut ls);
    let mut packed = [0u8; 12];
    for (j, &q) in ls.iter().enumerate() {
        set_q3_k_scale(&mut packed, j, q);
    }
    (d, packed)
}

/// Store 6-bit scale `j` (0..64, offset by 32): low nibbles in bytes 0..8
/// (scales 8..16 in the high halves), top two bits in bytes 8..12.
fn set_q3_k_scale(packed: &mut [u8; 12], j: usize, q: u8) {
    packed[j % 8] |= (q & 0xF) << (4 * (j / 8));
    packed[8 + j % 4] |= (q >> 4) << (2 * (j / 4));
}

/// Signed scale `j` as [`set_q3_k_scale`] stored it.
fn q3_k_scale(packed: &[u8; 12], j: usize) -> i32 {
    let low = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
    let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// Levels 0..8: the high bit of value j in bit j/32 of `hmask[j % 32]`,
/// the low two bits as [`pack_2bit`].
fn pack_q3_k(l: &mut Levels) -> ([u8; QK_K / 8], [u8; QK_K / 4]) {
    let mut hmask = [0u8; QK_K / 8];
    for (j, q) in l.iter_mut().enumerate() {
        if *q > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *q -= 4;
        }
    }
    (hmask, pack_2bit(l))
}

// ---- Q4_K and Q5_K: 8 sub-blocks of 32, 6-bit scales and mins ----

/// What differs between Q4_K and Q5_K's searches.
struct ScaleMinFormat {
    nmax: i32,
    /// The unweighted sub-block search.
    plain: ScaleMinSearch,
    /// Whether the weighted path caps the searched scales at 63 (llama.cpp's
    /// Q5_K does, its Q4_K does not; it only matters for a negative scale).
    cap_weighted: bool,
}

const Q4_K: ScaleMinFormat = ScaleMinFormat {
    nmax: 15,
    plain: ScaleMinSearch { rmin: -1.0, rdelta: 0.1, steps: 20, mad: false },
    cap_weighted: false,
};
const Q5_K: ScaleMinFormat = ScaleMinFormat {
    nmax: 31,
    plain: ScaleMinSearch { rmin: -0.5, rdelta: 0.1, steps: 15, mad: false },
    cap_weighted: true,
};

pub(super) fn q4_k(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ4K| {
        let mut l = [0u8; QK_K];
        (b.d, b.dmin, b.scales) = scale_min_block(x, qw, &Q4_K, &mut l);
        for (q, pair) in b.qs.as_chunks_mut::<32>().0.iter_mut().zip(l.as_chunks::<64>().0) {
            *q = std::array::from_fn(|i| pair[i] | (pair[i + 32] << 4));
        }
    });
}

pub(super) fn q5_k(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ5K| {
        let mut l = [0u8; QK_K];
        (b.d, b.dmin, b.scales) = scale_min_block(x, qw, &Q5_K, &mut l);
        // Pair c of 64 values: low nibbles as Q4_K, fifth bits in bits 2c, 2c + 1.
        b.qh = [0; QK_K / 8];
        for (c, (q, pair)) in b.qs.as_chunks_mut::<32>().0.iter_mut().zip(l.as_chunks::<64>().0).enumerate() {
            for i in 0..32 {
                let (lo, hi) = (pair[i], pair[i + 32]);
                b.qh[i] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
                q[i] = (lo & 0xF) | ((hi & 0xF) << 4);
            }
        }
    });
}

/// Q4_K/Q5_K's scales and levels: (d, dmin, packed scales and mins), levels
/// 0..=nmax re-rounded against them.
fn scale_min_block(
    x: &[f32; QK_K],
    qw: Option<&[f32; QK_K]>,
    format: &ScaleMinFormat,
    l: &mut Levels,
) -> (F16Bytes, F16Bytes, [u8; 12]) {
    let nmax = format.nmax;
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (subs, levels) = (x.as_chunks::<32>().0, l.as_chunks_mut::<32>().0);
    let (d, dmin, packed) = match qw {
        // Each sub-block weighted by its rms + |x|; scales and mins rounded
        // to 6 bits against the largest of each.
        None => {
            for (j, (xs, ls)) in subs.iter().zip(levels).enumerate() {
                let av_x = (sum_squares(xs) / 32.0).sqrt();
                let w = xs.map(|v| av_x + v.abs());
                (scales[j], mins[j]) = make_qkx_quants(nmax, xs, &w, ls, format.plain);
            }
            let (max_scale, max_min) = (positive_max(&scales), positive_max(&mins));
            let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
            let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
            let ls = scales.map(|s| (nearest_int(inv_scale * s) as u8).min(63));
            let lm = mins.map(|m| (nearest_int(inv_min * m) as u8).min(63));
            (max_scale / 63.0, max_min / 63.0, pack_scale_min_k4(&ls, &lm))
        }
        Some(qw) => {
            let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
            let mut sw = [0.0f32; 8];
            for (j, ((xs, ls), qws)) in subs.iter().zip(levels).zip(qw.as_chunks::<32>().0).enumerate() {
                let w = importance(xs, qws, sigma2);
                sw[j] = sum(&w);
                (scales[j], mins[j]) = make_qkx_quants(nmax, xs, &w, ls, WEIGHTED_SEARCH);
            }
            let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
            let d = make_qp_quants(63, &scales, &sw, &mut ls);
            let dmin = make_qp_quants(63, &mins, &sw, &mut lm);
            if format.cap_weighted {
                (ls, lm) = (ls.map(|q| q.min(63)), lm.map(|q| q.min(63)));
            }
            (d, dmin, pack_scale_min_k4(&ls, &lm))
        }
    };
    let (d, dmin) = (F16Bytes::from_f32(d), F16Bytes::from_f32(dmin));
    requantize_affine::<32>(x, nmax, d.to_f32(), dmin.to_f32(), |j| scale_min_k4(j, &packed), l);
    (d, dmin, packed)
}

/// Pack eight 6-bit scales and mins as [`scale_min_k4`] reads them.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        (q[j], q[j + 4]) = (ls[j], lm[j]);
    }
    for j in 4..8 {
        q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
        q[j - 4] |= (ls[j] >> 4) << 6;
        q[j] |= (lm[j] >> 4) << 6;
    }
    q
}

// ---- Q6_K: 16 sub-blocks of 16, levels -32..=31, 8-bit signed scales ----

pub(super) fn q6_k(row: &[f32], imatrix: Option<&[f32]>, out: &mut [u8]) {
    each_block(row, imatrix, out, |x, qw, b: &mut BlockQ6K| {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        for (ib, (xs, ls)) in x.as_chunks::<16>().0.iter().zip(l.as_chunks_mut::<16>().0).enumerate() {
            let w = qw.map(|qw| &qw[16 * ib..16 * ib + 16]);
            scales[ib] = make_qx_quants(32, xs, w, ls);
        }
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for &s in &scales {
            if s.abs() > amax {
                (max_scale, amax) = (s, s.abs());
            }
        }
        if amax < GROUP_MAX_EPS {
            *b = BlockQ6K { ql: [0; QK_K / 2], qh: [0; QK_K / 4], scales: [0; QK_K / 16], d: F16Bytes::from_f32(0.0) };
            return;
        }
        let iscale = -128.0 / max_scale;
        b.d = F16Bytes::from_f32(1.0 / iscale);
        b.scales = scales.map(|s| nearest_int(iscale * s).min(127) as i8);
        requantize_symmetric::<16>(x, 32, b.d.to_f32(), |j| b.scales[j] as i32, &mut l);
        // Each half of 128 values: 64 bytes of low nibbles (values i and
        // i + 64 share a byte), 32 bytes of high bit pairs (i + 32k in bits 2k).
        let halves = b.ql.as_chunks_mut::<64>().0.iter_mut().zip(b.qh.as_chunks_mut::<32>().0);
        for ((ql, qh), l) in halves.zip(l.as_chunks::<128>().0) {
            for i in 0..32 {
                let [l0, l1, l2, l3] = [l[i], l[i + 32], l[i + 64], l[i + 96]];
                ql[i] = (l0 & 0xF) | ((l2 & 0xF) << 4);
                ql[i + 32] = (l1 & 0xF) | ((l3 & 0xF) << 4);
                qh[i] = (l0 >> 4) | ((l1 >> 4) << 2) | ((l2 >> 4) << 4) | ((l3 >> 4) << 6);
            }
        }
    });
}

// ---- Shared by the formats ----

/// Re-round each sub-block of `S` values to levels 0..=nmax against its
/// stored scale and min (`scale_min(j)`, multiples of `d` and `dmin`):
/// value ≈ d·sc·l - dmin·m. A sub-block whose scale is zero keeps the
/// levels of its search.
fn requantize_affine<const S: usize>(
    x: &[f32; QK_K],
    nmax: i32,
    d: f32,
    dmin: f32,
    scale_min: impl Fn(usize) -> (u8, u8),
    l: &mut Levels,
) {
    for (j, (xs, ls)) in x.as_chunks::<S>().0.iter().zip(l.as_chunks_mut::<S>().0).enumerate() {
        let (sc, m) = scale_min(j);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / dj).clamp(0, nmax) as u8;
        }
    }
}

/// Re-round each sub-block of `S` values to levels -half..half-1 (stored
/// offset by `half`) against its stored signed scale `scale(j)`, a multiple
/// of `d`. A sub-block whose scale is zero keeps the levels of its search.
fn requantize_symmetric<const S: usize>(
    x: &[f32; QK_K],
    half: i32,
    d: f32,
    scale: impl Fn(usize) -> i32,
    l: &mut Levels,
) {
    for (j, (xs, ls)) in x.as_chunks::<S>().0.iter().zip(l.as_chunks_mut::<S>().0).enumerate() {
        let dj = d * scale(j) as f32;
        if dj == 0.0 {
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest_int(v / dj).clamp(-half, half - 1) + half) as u8;
        }
    }
}

/// Levels 0..4 four to a byte: in each half of 128 values, byte i holds
/// values i, i + 32, i + 64, i + 96 in bits 0, 2, 4, 6.
fn pack_2bit(l: &Levels) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for (q, l) in qs.as_chunks_mut::<32>().0.iter_mut().zip(l.as_chunks::<128>().0) {
        *q = std::array::from_fn(|i| l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6));
    }
    qs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k4_scales_round_trip() {
        let ls = [0, 1, 17, 63, 32, 5, 48, 63];
        let lm = [63, 0, 2, 40, 15, 16, 33, 1];
        let packed = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &packed), (ls[j], lm[j]), "pair {j}");
        }
    }

    #[test]
    fn q3_k_scales_round_trip() {
        let mut packed = [0u8; 12];
        let qs: [u8; 16] = std::array::from_fn(|j| ((j * 23 + 5) % 64) as u8);
        for (j, &q) in qs.iter().enumerate() {
            set_q3_k_scale(&mut packed, j, q);
        }
        for (j, &q) in qs.iter().enumerate() {
            assert_eq!(q3_k_scale(&packed, j), q as i32 - 32, "scale {j}");
        }
    }
}
