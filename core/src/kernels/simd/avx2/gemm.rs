//! Prefill as a GEMM for the K-quants (Q2_K..Q6_K), Q4_0 / Q5_0 and F32 on
//! AVX-512 VNNI.
//!
//! The four-token kernels unpack every weight block once per four tokens.
//! Here a tile's weight rows are decoded once, sixteen rows at a time, into
//! panels that `vpdpbusd` multiplies directly, and every token of the tile
//! reuses them:
//!
//! - values as unsigned bytes (offsets kept: Q3_K 0..8, Q6_K 0..64), 4 values
//!   of each of the 16 rows per 64-byte register, so one `vpdpbusd` with the
//!   token's 4 activations broadcast from memory adds 4 products to each of 16
//!   rows: 64 instructions per 256 values serve 16 rows;
//! - Q2_K's 2-bit values times their 4-bit group scale (at most 45, still a
//!   byte), so its block needs no per-group scaling;
//! - the other formats' group scales times the row's `d`, as f32 lanes, one
//!   conversion and multiply-add per group;
//! - minimums (Q2_K, Q4_K, Q5_K) and the offsets times the scales (Q3_K: 4,
//!   Q6_K: 32) as pairs of i16 that `vpdpwssd` meets with pairs of the
//!   activations' group sums (`bsums`), then `dmin` (or `d`).
//!
//! The integer sums are the scalar twin's; the f32 sums run in another order
//! (per group, then per block), within the tests' tolerance.

// The kernels index several parallel arrays (tokens' accumulators, rows' blocks)
// by one counter; iterator chains would hide which lanes meet.
#![allow(clippy::needless_range_loop)]
use super::kquants::{q2_mins, q3_scales, zmm};
use super::legacy::Signed32;
use super::{fp16, prefetch_panel};
use crate::quant::{
    as_blocks, scales_mins_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K,
    BlockQ8_0F,
};
use std::arch::x86_64::*;

/// Rows per panel (the lanes of a 512-bit register of i32).
pub(crate) const HEIGHT: usize = 16;
/// Tokens per kernel call, at most.
pub(crate) const ACTS: usize = 8;
/// Decode Q4_0 / Q5_0 panels from this many tokens on: their decoding is a
/// fraction of the K-quants' (4 tokens Q4_0 27 -> 31, 6 tokens 31 -> 46
/// GMAC/s). The K-quants' thresholds: [`install`].
pub(crate) const LEGACY_MIN_ACTS: usize = 4;

const VALUES: usize = 64 * 64;
const SCALES: usize = 16 * 64;
const PAIRS: usize = 8 * 64;
/// One decoded block of a panel: values, group scales, minimum pairs, `dmin`.
pub(crate) const BLOCK_BYTES: usize = VALUES + SCALES + PAIRS + 64;

/// What a format's decoder gives per row and block. Aligned to and sized in
/// whole 64-byte registers: the decoder loads 64 bytes from `q`, `sd` and
/// `m` of each row (`m`'s register runs into `dm` and the padding).
#[repr(C, align(64))]
struct RowBlock {
    /// The 256 values as unsigned bytes.
    q: [u8; 256],
    /// Group scales times `d` (not Q2_K).
    sd: [f32; 16],
    /// Minimums or offset terms as i16, per group of 16 values.
    m: [i16; 16],
    /// The factor of the minimums: `dmin` (or `d`).
    dm: f32,
    /// The row's `d`, where the values carry the group scales (Q2_K).
    d: f32,
}

impl RowBlock {
    fn new() -> RowBlock {
        RowBlock { q: [0; 256], sd: [0.0; 16], m: [0; 16], dm: 0.0, d: 0.0 }
    }
}

/// A K-quant block that fills one row's [`RowBlock`]. (A trait method, not
/// a closure: a closure would be compiled without the wrappers' target
/// features, and the intrinsics in it would become calls.)
trait PanelBlock: crate::quant::FileBlock {
    /// Whether the panel kernel reads all 16 group scales (Q2_K folds its
    /// scales into the values and reads only `d`, in group 0; its other 15
    /// scale registers are left unwritten).
    const GROUP_SCALES: bool = true;
    unsafe fn row(&self, rb: &mut RowBlock);
}

/// Index vectors of [`transpose16`]'s stages: for stage `k` (distance `b =
/// 2^k`), the lanes of the pair's first and second result.
static TRANSPOSE_IDX: [[[u32; 16]; 2]; 4] = {
    let mut t = [[[0u32; 16]; 2]; 4];
    let mut k = 0;
    while k < 4 {
        let b = 1 << k;
        let mut c = 0;
        while c < 16 {
            let low = c & b == 0;
            t[k][0][c] = if low { c } else { 16 + c - b } as u32;
            t[k][1][c] = if low { c + b } else { 16 + c } as u32;
            c += 1;
        }
        k += 1;
    }
    t
};

/// Transpose 16 registers of 16 words: lane `c` of register `r` moves to
/// lane `r` of register `c`. Four stages of two-source permutes; stage `k`
/// swaps bit `k` of the register and lane numbers (the off-diagonal blocks of
/// size `2^k` trade places), so all four together transpose. (The panels
/// used to be filled by gathers, one per register: on this VM's Xeon they
/// cost ~40 cycles each, a panel's decoding ~50 tokens' products.)
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512i; 16]) {
    for k in 0..4 {
        let b = 1 << k;
        let lo = _mm512_loadu_si512(TRANSPOSE_IDX[k][0].as_ptr().cast());
        let hi = _mm512_loadu_si512(TRANSPOSE_IDX[k][1].as_ptr().cast());
        for i in 0..16 {
            if i & b == 0 {
                let (a, c) = (r[i], r[i | b]);
                r[i] = _mm512_permutex2var_epi32(a, lo, c);
                r[i | b] = _mm512_permutex2var_epi32(a, hi, c);
            }
        }
    }
}

/// The 64 bytes at `at` of 16 rows `stride` apart from `base`, transposed:
/// register `i` holds their word `i` of every row.
#[inline(always)]
unsafe fn transposed(base: *const u8, stride: usize, at: usize) -> [__m512i; 16] {
    let mut r = [_mm512_setzero_si512(); 16];
    for (row, v) in r.iter_mut().enumerate() {
        *v = _mm512_loadu_si512(base.add(row * stride + at).cast());
    }
    transpose16(&mut r);
    r
}

/// The decoders' shared part: `rows` (16) weight rows of blocks `B` into
/// panel blocks.
#[inline(always)]
unsafe fn decode_with<B: PanelBlock>(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[B]; HEIGHT] = std::array::from_fn(|r| as_blocks::<B>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * BLOCK_BYTES, "decode: row lengths differ");
    let mut rb: [RowBlock; HEIGHT] = std::array::from_fn(|_| RowBlock::new());
    let stride = std::mem::size_of::<RowBlock>();
    let base = rb.as_ptr().cast::<u8>();
    for b in 0..nb {
        prefetch_panel(&x, b);
        for r in 0..HEIGHT {
            x[r][b].row(&mut rb[r]);
        }
        let p = out.as_mut_ptr().add(b * BLOCK_BYTES);
        // Values: word j of every row into register j, 16 registers at a time.
        for c in 0..4 {
            for (i, v) in transposed(base, stride, 64 * c).into_iter().enumerate() {
                _mm512_storeu_si512(p.add(64 * (16 * c + i)).cast(), v);
            }
        }
        // Scales: 16 f32 per row, or `d` alone (below).
        if B::GROUP_SCALES {
            for (g, v) in transposed(base, stride, std::mem::offset_of!(RowBlock, sd)).into_iter().enumerate() {
                _mm512_storeu_si512(p.add(VALUES + 64 * g).cast(), v);
            }
        }
        // The register from `m` holds its 8 words of pairs, then `dm` and `d`.
        // (Scalar loops over the rows here become gathers.)
        let t = transposed(base, stride, std::mem::offset_of!(RowBlock, m));
        for pair in 0..8 {
            _mm512_storeu_si512(p.add(VALUES + SCALES + 64 * pair).cast(), t[pair]);
        }
        _mm512_storeu_si512(p.add(VALUES + SCALES + PAIRS).cast(), t[8]);
        if !B::GROUP_SCALES {
            _mm512_storeu_si512(p.add(VALUES).cast(), t[9]);
        }
    }
}

/// The 64 bytes at `at` of 16 blocks, transposed: register `i` holds their
/// word `i` of every block (lane `r` from `blocks[r]`).
#[inline(always)]
unsafe fn transposed_at(blocks: &[*const u8; HEIGHT], at: usize) -> [__m512i; 16] {
    let mut r = [_mm512_setzero_si512(); 16];
    for (v, b) in r.iter_mut().zip(blocks) {
        *v = _mm512_loadu_si512(b.add(at).cast());
    }
    transpose16(&mut r);
    r
}

/// The 16 bytes at `at` of 16 blocks, transposed: register `k` holds their
/// word `k` of every block. Four blocks per register, a 4 x 4 transpose of
/// words inside each, then of 128-bit quarters across the four.
#[inline(always)]
unsafe fn transposed4_at(blocks: &[*const u8; HEIGHT], at: usize) -> [__m512i; 4] {
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut h = [_mm512_setzero_si512(); 4];
    for (q, v) in h.iter_mut().enumerate() {
        let b = &blocks[4 * q..4 * q + 4];
        let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(ld16(b[0].add(at))), ld16(b[1].add(at)));
        let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(ld16(b[2].add(at))), ld16(b[3].add(at)));
        // Quarter k now holds word k of the four blocks.
        *v = _mm512_permutexvar_epi32(idx, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
    }
    let (a, b) = (_mm512_shuffle_i32x4::<0x44>(h[0], h[1]), _mm512_shuffle_i32x4::<0xEE>(h[0], h[1]));
    let (c, d) = (_mm512_shuffle_i32x4::<0x44>(h[2], h[3]), _mm512_shuffle_i32x4::<0xEE>(h[2], h[3]));
    [
        _mm512_shuffle_i32x4::<0x88>(a, c),
        _mm512_shuffle_i32x4::<0xDD>(a, c),
        _mm512_shuffle_i32x4::<0x88>(b, d),
        _mm512_shuffle_i32x4::<0xDD>(b, d),
    ]
}

/// 16 bytes at `p`.
#[inline(always)]
unsafe fn ld16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// Byte `k` of every lane's word, as i32.
#[inline(always)]
unsafe fn byte_lanes(v: __m512i, k: u32) -> __m512i {
    _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(8 * k as i32)), _mm512_set1_epi32(0xFF))
}

/// Q4_K panels decoded with the 16 rows in the lanes throughout, instead of
/// row by row and then transposed: the packed values are transposed (32
/// words per row, not the 64 of the unpacked ones) and split into nibbles
/// afterwards, and the 6-bit scales and minimums are unpacked for all 16
/// rows at once from their transposed words (the packing of
/// `scales_mins_k4`, one lane per row). A third of the decoding's
/// permutes, and no scalar work per row.
#[inline(always)]
unsafe fn q4_k_lanes(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[BlockQ4K]; HEIGHT] = std::array::from_fn(|r| as_blocks::<BlockQ4K>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * BLOCK_BYTES, "decode: row lengths differ");
    let qs = std::mem::offset_of!(BlockQ4K, qs);
    let low = _mm512_set1_epi8(0x0F);
    for b in 0..nb {
        let mut blocks = [std::ptr::null::<u8>(); HEIGHT];
        for r in 0..HEIGHT {
            blocks[r] = x[r].as_ptr().add(b).cast();
        }
        prefetch_panel(&x, b);
        let p = out.as_mut_ptr().add(b * BLOCK_BYTES);
        // Packed word k = 8c + w (c a chunk of 64 values) holds values
        // 64c + 4w.. in its low nibbles, 64c + 32 + 4w.. in its high ones.
        for h in 0..2 {
            for (j, v) in transposed_at(&blocks, qs + 64 * h).into_iter().enumerate() {
                let (c, w) = (2 * h + j / 8, j % 8);
                _mm512_storeu_si512(p.add(64 * (16 * c + w)).cast(), _mm512_and_si512(v, low));
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                _mm512_storeu_si512(p.add(64 * (16 * c + 8 + w)).cast(), hi);
            }
        }
        // Words: `d | dmin << 16`, then the 12 scale bytes `a`, `b`, `c`.
        let [dd, a, bb, c] = transposed4_at(&blocks, 0);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
        let six = _mm512_set1_epi8(0x3F);
        let top = _mm512_set1_epi8(0x30);
        let s = [
            _mm512_and_si512(a, six),
            _mm512_or_si512(_mm512_and_si512(c, low), _mm512_and_si512(_mm512_srli_epi32::<2>(a), top)),
        ];
        let m = [
            _mm512_and_si512(bb, six),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(c), low),
                _mm512_and_si512(_mm512_srli_epi32::<2>(bb), top),
            ),
        ];
        for g in 0..8 {
            let sd = _mm512_mul_ps(d, _mm512_cvtepi32_ps(byte_lanes(s[g / 4], g as u32 % 4)));
            _mm512_storeu_ps(p.add(VALUES + 64 * g).cast(), sd);
            // The group's minimum in both halves: a pair of `bsums` meets it.
            let mg = byte_lanes(m[g / 4], g as u32 % 4);
            _mm512_storeu_si512(
                p.add(VALUES + SCALES + 64 * g).cast(),
                _mm512_or_si512(mg, _mm512_slli_epi32::<16>(mg)),
            );
        }
        _mm512_storeu_ps(p.add(VALUES + SCALES + PAIRS).cast(), dmin);
    }
}

/// 32 bytes at `p`.
#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
unsafe fn st(q: &mut [u8; 256], at: usize, v: __m256i) {
    _mm256_storeu_si256(q.as_mut_ptr().add(at).cast(), v);
}

/// `(v >> shift) & mask` per byte (16-bit shifts: the bits a byte takes from
/// its neighbour are masked off).
#[inline(always)]
unsafe fn bits(v: __m256i, shift: i32, mask: i8) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(mask))
}

/// `v << shift` per byte, for bytes whose shifted bits stay inside them.
#[inline(always)]
unsafe fn up(v: __m256i, shift: i32) -> __m256i {
    _mm256_sll_epi16(v, _mm_cvtsi32_si128(shift))
}

/// Q4_K / Q5_K scales times `d` and minimums (duplicated over each group's
/// two halves of 16, for the pairs of `bsums`).
#[inline(always)]
unsafe fn k4_scales(scales: &[u8; 12], d: f32, dmin: f32, rb: &mut RowBlock) {
    let (s, m) = scales_mins_k4(scales);
    for g in 0..8 {
        rb.sd[g] = d * s[g] as f32;
        rb.m[2 * g] = m[g] as i16;
        rb.m[2 * g + 1] = m[g] as i16;
    }
    rb.dm = dmin;
}

/// Q4_K's 256 values (0..16) into `q`, in order. (AVX2 alone: the AVX2
/// panels share it.)
#[inline(always)]
pub(super) unsafe fn q4_k_values(b: &BlockQ4K, q: &mut [u8; 256]) {
    for c in 0..4 {
        let v = ld(b.qs.as_ptr().add(32 * c));
        st(q, 64 * c, _mm256_and_si256(v, _mm256_set1_epi8(0x0F)));
        st(q, 64 * c + 32, bits(v, 4, 0x0F));
    }
}

/// Q5_K's 256 values (0..32) into `q` (AVX2 alone).
#[inline(always)]
pub(super) unsafe fn q5_k_values(b: &BlockQ5K, q: &mut [u8; 256]) {
    let h = ld(b.qh.as_ptr());
    for c in 0..4 {
        let v = ld(b.qs.as_ptr().add(32 * c));
        let lo = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), up(bits(h, 2 * c as i32, 1), 4));
        let hi = _mm256_or_si256(bits(v, 4, 0x0F), up(bits(h, 2 * c as i32 + 1, 1), 4));
        st(q, 64 * c, lo);
        st(q, 64 * c + 32, hi);
    }
}

#[inline(always)]
unsafe fn q5_k_row(b: &BlockQ5K, rb: &mut RowBlock) {
    q5_k_values(b, &mut rb.q);
    k4_scales(&b.scales, fp16(b.d), fp16(b.dmin), rb);
}

/// A block's four value registers into `rb.q` (aligned: `q` opens the
/// 64-byte aligned `RowBlock`).
#[inline(always)]
unsafe fn store_values(rb: &mut RowBlock, u: [__m512i; 4]) {
    for (p, v) in u.into_iter().enumerate() {
        _mm512_store_si512(rb.q.as_mut_ptr().add(64 * p).cast(), v);
    }
}

/// Q2_K: values times their group's scale (`q * s <= 45`, the four-token
/// kernel's byte table), so the panel needs `d` alone.
#[inline(always)]
unsafe fn q2_k_row(b: &BlockQ2K, rb: &mut RowBlock) {
    let packed = _mm_loadu_si128(b.scales.as_ptr().cast());
    store_values(rb, zmm::q2_k_scaled(b, packed));
    rb.d = fp16(b.d);
    _mm256_storeu_si256(rb.m.as_mut_ptr().cast(), q2_mins(packed));
    rb.dm = fp16(b.dmin);
}

/// Q3_K: 3-bit values 0..8 (the scalar format's `q - 4` plus 4).
#[inline(always)]
unsafe fn q3_k_row(b: &BlockQ3K, rb: &mut RowBlock) {
    store_values(rb, zmm::q3_k_values(b));
    let sc8 = q3_scales(&b.scales);
    let d = fp16(b.d);
    let sd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)), _mm512_set1_ps(d));
    _mm512_storeu_ps(rb.sd.as_mut_ptr(), sd);
    _mm256_storeu_si256(rb.m.as_mut_ptr().cast(), _mm256_slli_epi16::<2>(_mm256_cvtepi8_epi16(sc8)));
    rb.dm = d;
}

/// Q6_K's 256 values 0..64 (the scalar format's `q - 32` plus 32) into `q`
/// (AVX2 alone).
#[inline(always)]
pub(super) unsafe fn q6_k_values(b: &BlockQ6K, q: &mut [u8; 256]) {
    for h in 0..2 {
        let (l0, l1) = (ld(b.ql.as_ptr().add(64 * h)), ld(b.ql.as_ptr().add(64 * h + 32)));
        let qh = ld(b.qh.as_ptr().add(32 * h));
        let lows = [
            _mm256_and_si256(l0, _mm256_set1_epi8(0x0F)),
            _mm256_and_si256(l1, _mm256_set1_epi8(0x0F)),
            bits(l0, 4, 0x0F),
            bits(l1, 4, 0x0F),
        ];
        for (j, lo) in lows.into_iter().enumerate() {
            st(q, 128 * h + 32 * j, _mm256_or_si256(lo, up(bits(qh, 2 * j as i32, 3), 4)));
        }
    }
}

/// Q6_K: values 0..64, the offset 32 times the group scale as the "minimum".
#[inline(always)]
unsafe fn q6_k_row(b: &BlockQ6K, rb: &mut RowBlock) {
    q6_k_values(b, &mut rb.q);
    let d = fp16(b.d);
    for g in 0..16 {
        rb.sd[g] = d * b.scales[g] as f32;
        rb.m[g] = 32 * b.scales[g] as i16;
    }
    rb.dm = d;
}

/// Activations `4j..4j + 4` of `y` in every lane (a broadcast load).
#[inline(always)]
unsafe fn word(y: &BlockQ8K, j: usize) -> __m512i {
    _mm512_set1_epi32(y.qs.as_ptr().add(4 * j).cast::<i32>().read_unaligned())
}

/// `T` tokens against one decoded panel: row `r` with token `t` to
/// `out[stride t + r]`. `G` values per scale group (16 or 32), or the whole
/// block when `FOLD` (Q2_K).
#[inline(always)]
unsafe fn panel_dot<const T: usize, const G: usize, const FOLD: bool>(
    dec: &[u8],
    a: &[&[BlockQ8K]],
    out: *mut f32,
    stride: usize,
) {
    let nb = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == nb) && dec.len() >= nb * BLOCK_BYTES);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * BLOCK_BYTES);
        let y: [&BlockQ8K; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        let mut rf = [_mm512_setzero_ps(); T];
        if FOLD {
            let mut c = [_mm512_setzero_si512(); T];
            for j in 0..64 {
                let w = _mm512_loadu_si512(p.add(64 * j).cast());
                for t in 0..T {
                    c[t] = _mm512_dpbusd_epi32(c[t], w, word(y[t], j));
                }
            }
            for t in 0..T {
                rf[t] = _mm512_mul_ps(_mm512_cvtepi32_ps(c[t]), _mm512_loadu_ps(p.add(VALUES).cast()));
            }
        } else {
            for g in 0..256 / G {
                let mut c = [_mm512_setzero_si512(); T];
                for j in g * G / 4..(g + 1) * G / 4 {
                    let w = _mm512_loadu_si512(p.add(64 * j).cast());
                    for t in 0..T {
                        c[t] = _mm512_dpbusd_epi32(c[t], w, word(y[t], j));
                    }
                }
                let s = _mm512_loadu_ps(p.add(VALUES + 64 * g).cast());
                for t in 0..T {
                    rf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[t]), s, rf[t]);
                }
            }
        }
        // Minimums (or offsets) against the activations' group sums, in pairs.
        let mut m = [_mm512_setzero_si512(); T];
        for pair in 0..8 {
            let mp = _mm512_loadu_si512(p.add(VALUES + SCALES + 64 * pair).cast());
            for t in 0..T {
                let bs = _mm512_set1_epi32(y[t].bsums.as_ptr().add(2 * pair).cast::<i32>().read_unaligned());
                m[t] = _mm512_dpwssd_epi32(m[t], mp, bs);
            }
        }
        let dm = _mm512_loadu_ps(p.add(VALUES + SCALES + PAIRS).cast());
        for t in 0..T {
            let r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m[t]), dm, rf[t]);
            acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(y[t].d), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.add(stride * t), acc[t]);
    }
}

/// The formats decoded row by row ([`decode_with`]), and their rows.
macro_rules! row_blocks {
    ($($block:ident = $row:ident, $fold:literal;)*) => {$(
        impl PanelBlock for $block {
            const GROUP_SCALES: bool = !$fold;
            #[inline(always)]
            unsafe fn row(&self, rb: &mut RowBlock) {
                $row(self, rb)
            }
        }
    )*};
}

row_blocks! {
    BlockQ2K = q2_k_row, true;
    BlockQ3K = q3_k_row, false;
    BlockQ5K = q5_k_row, false;
    BlockQ6K = q6_k_row, false;
}

/// The decoder and the panel kernel of each format, compiled for AVX-512
/// F + BW + VNNI.
macro_rules! panels {
    ($($name:ident, $decode:ident = $with:expr, $g:literal, $fold:literal;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $decode(rows: &[&[u8]], out: &mut [u8]) {
            $with(rows, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $name(dec: &[u8], a: &[&[BlockQ8K]], out: *mut f32, stride: usize) {
            match a.len() {
                1 => panel_dot::<1, $g, $fold>(dec, a, out, stride),
                2 => panel_dot::<2, $g, $fold>(dec, a, out, stride),
                3 => panel_dot::<3, $g, $fold>(dec, a, out, stride),
                4 => panel_dot::<4, $g, $fold>(dec, a, out, stride),
                5 => panel_dot::<5, $g, $fold>(dec, a, out, stride),
                6 => panel_dot::<6, $g, $fold>(dec, a, out, stride),
                7 => panel_dot::<7, $g, $fold>(dec, a, out, stride),
                _ => panel_dot::<8, $g, $fold>(dec, a, out, stride),
            }
        }
    )*};
}

panels! {
    q2_k, decode_q2_k = decode_with::<BlockQ2K>, 256, true;
    q3_k, decode_q3_k = decode_with::<BlockQ3K>, 16, false;
    q4_k, decode_q4_k = q4_k_lanes, 32, false;
    q5_k, decode_q5_k = decode_with::<BlockQ5K>, 32, false;
    q6_k, decode_q6_k = decode_with::<BlockQ6K>, 16, false;
}

// ---- Q4_0 and Q5_0 (Q8_0 activations): one scale per 32 values ------------

const LEGACY_VALUES: usize = 8 * 64;
/// One decoded block of a Q4_0 / Q5_0 panel: values, then `d` per row.
pub(crate) const LEGACY_BLOCK_BYTES: usize = LEGACY_VALUES + 64;

/// `B`'s 16 weight rows into panel blocks: the values plus `OFF` (so
/// unsigned: Q4_0 0..16, Q5_0 0..32), `d` as f32.
#[inline(always)]
pub(super) unsafe fn decode_legacy<B: Signed32 + crate::quant::FileBlock, const OFF: i8>(
    rows: &[&[u8]],
    out: &mut [u8],
) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let x: [&[B]; HEIGHT] = std::array::from_fn(|r| as_blocks::<B>(rows[r]));
    let nb = x[0].len();
    assert!(x.iter().all(|r| r.len() == nb) && out.len() >= nb * LEGACY_BLOCK_BYTES, "decode: row lengths differ");
    for b in 0..nb {
        prefetch_panel(&x, b);
        let p = out.as_mut_ptr().add(b * LEGACY_BLOCK_BYTES);
        // One register per row: its 32 values, then `d` (in every word of
        // the high half), transposed: registers 0..8 the values, 8 the `d`s.
        let mut q = [_mm512_setzero_si512(); HEIGHT];
        for r in 0..HEIGHT {
            let values = _mm256_add_epi8(x[r][b].values(), _mm256_set1_epi8(OFF));
            let d = _mm256_castps_si256(x[r][b].scale_x8());
            q[r] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(values), d);
        }
        transpose16(&mut q);
        for (j, v) in q.into_iter().take(9).enumerate() {
            _mm512_storeu_si512(p.add(64 * j).cast(), v);
        }
    }
}

/// `T` tokens against one decoded Q4_0 / Q5_0 panel: `out[stride t + r]`.
#[inline(always)]
pub(super) unsafe fn legacy_dot<const T: usize, const OFF: i32>(
    dec: &[u8],
    a: &[&[BlockQ8_0F]],
    out: *mut f32,
    stride: usize,
) {
    let nb = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == nb) && dec.len() >= nb * LEGACY_BLOCK_BYTES);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let p = dec.as_ptr().add(b * LEGACY_BLOCK_BYTES);
        let y: [&BlockQ8_0F; T] = std::array::from_fn(|t| a[t].get_unchecked(b));
        // The offset times the activations' sum, taken off before the sums.
        let mut c: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(-OFF * y[t].s));
        for j in 0..8 {
            let w = _mm512_loadu_si512(p.add(64 * j).cast());
            for t in 0..T {
                c[t] = _mm512_dpbusd_epi32(
                    c[t],
                    w,
                    _mm512_set1_epi32(y[t].qs.as_ptr().add(4 * j).cast::<i32>().read_unaligned()),
                );
            }
        }
        let d = _mm512_loadu_ps(p.add(LEGACY_VALUES).cast());
        for t in 0..T {
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[t]), _mm512_mul_ps(d, _mm512_set1_ps(y[t].d)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.add(stride * t), acc[t]);
    }
}

macro_rules! legacy_panels {
    ($($name:ident, $decode:ident = $block:ident, $off:literal;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $decode(rows: &[&[u8]], out: &mut [u8]) {
            decode_legacy::<$block, $off>(rows, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $name(dec: &[u8], a: &[&[BlockQ8_0F]], out: *mut f32, stride: usize) {
            match a.len() {
                1 => legacy_dot::<1, $off>(dec, a, out, stride),
                2 => legacy_dot::<2, $off>(dec, a, out, stride),
                3 => legacy_dot::<3, $off>(dec, a, out, stride),
                4 => legacy_dot::<4, $off>(dec, a, out, stride),
                5 => legacy_dot::<5, $off>(dec, a, out, stride),
                6 => legacy_dot::<6, $off>(dec, a, out, stride),
                7 => legacy_dot::<7, $off>(dec, a, out, stride),
                _ => legacy_dot::<8, $off>(dec, a, out, stride),
            }
        }
    )*};
}

legacy_panels! {
    q4_0, decode_q4_0 = BlockQ4_0, 8;
    q5_0, decode_q5_0 = BlockQ5_0, 16;
}

// ---- F32 (MoE routers): f32 weights against f32 activations --------------

/// Bytes of one decoded F32 "block" (one column of the panel's 16 rows).
const F32_COLUMN: usize = 64;
/// Decode F32 panels from this many tokens on: the transpose of 16 columns
/// costs about what a dozen tokens' products with them do.
const F32_MIN_ACTS: usize = 32;

/// 16 f32 weight rows into panel columns: column `c` (16 lanes, one per row)
/// at `64c`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn decode_f32(rows: &[&[u8]], out: &mut [u8]) {
    assert_eq!(rows.len(), HEIGHT, "decode: a panel is {HEIGHT} rows");
    let k = rows[0].len() / 4;
    assert!(rows.iter().all(|r| r.len() == 4 * k) && out.len() >= k * F32_COLUMN, "decode: row lengths differ");
    let whole = k / 16 * 16;
    for c in (0..whole).step_by(16) {
        let mut r = [_mm512_setzero_si512(); HEIGHT];
        for (row, v) in r.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(rows[row].as_ptr().add(4 * c).cast());
        }
        transpose16(&mut r);
        for (i, v) in r.into_iter().enumerate() {
            _mm512_storeu_si512(out.as_mut_ptr().add(F32_COLUMN * (c + i)).cast(), v);
        }
    }
    for c in whole..k {
        for (row, w) in rows.iter().enumerate() {
            out[F32_COLUMN * c + 4 * row..F32_COLUMN * c + 4 * row + 4].copy_from_slice(&w[4 * c..4 * c + 4]);
        }
    }
}

/// `T` tokens against one decoded F32 panel: `out[stride t + r]`. Even and odd
/// columns in two sets of sums, for twice the independent chains.
#[inline(always)]
unsafe fn f32_dot<const T: usize>(dec: &[u8], a: &[&[f32]], out: *mut f32, stride: usize) {
    let k = a[0].len();
    assert!(a.len() == T && a.iter().all(|x| x.len() == k) && dec.len() >= k * F32_COLUMN);
    let mut acc = [[_mm512_setzero_ps(); T]; 2];
    let p = dec.as_ptr();
    for c in (0..k / 2 * 2).step_by(2) {
        for h in 0..2 {
            let w = _mm512_loadu_ps(p.add(F32_COLUMN * (c + h)).cast());
            for t in 0..T {
                acc[h][t] = _mm512_fmadd_ps(w, _mm512_set1_ps(*a[t].get_unchecked(c + h)), acc[h][t]);
            }
        }
    }
    if k % 2 == 1 {
        let w = _mm512_loadu_ps(p.add(F32_COLUMN * (k - 1)).cast());
        for t in 0..T {
            acc[0][t] = _mm512_fmadd_ps(w, _mm512_set1_ps(a[t][k - 1]), acc[0][t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.add(stride * t), _mm512_add_ps(acc[0][t], acc[1][t]));
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn f32_panel(dec: &[u8], a: &[&[f32]], out: *mut f32, stride: usize) {
    match a.len() {
        1 => f32_dot::<1>(dec, a, out, stride),
        2 => f32_dot::<2>(dec, a, out, stride),
        3 => f32_dot::<3>(dec, a, out, stride),
        4 => f32_dot::<4>(dec, a, out, stride),
        5 => f32_dot::<5>(dec, a, out, stride),
        6 => f32_dot::<6>(dec, a, out, stride),
        7 => f32_dot::<7>(dec, a, out, stride),
        _ => f32_dot::<8>(dec, a, out, stride),
    }
}

/// The panels of every K-quant, of Q4_0 / Q5_0 and of F32, for the AVX-512
/// VNNI table.
pub(crate) fn install(k: &mut crate::kernels::table::Kernels) {
    use crate::kernels::table::{PanelDot, Panels};
    type Decode = unsafe fn(&[&[u8]], &mut [u8]);
    let p = |decode: Decode, dot: PanelDot<BlockQ8K>, min_acts: usize| {
        Some(Panels { height: HEIGHT, block_bytes: BLOCK_BYTES, min_acts, acts: ACTS, decode, dot })
    };
    // The last argument: decode panels from this many tokens on (below, the
    // four-token kernels). A panel's decoding (the rows' values, then a
    // transpose in registers) costs about what 5-10 tokens' products with it
    // do. Measured with `pocket bench-kernels --tokens N --threads 1
    // --working-set-mib 8` on the expert shapes (GMAC/s, up / down
    // projection, medians of three alternating runs on a Zen 4; four-token
    // kernels -> panels): Q4_K (decoded with the rows in the lanes
    // throughout, the cheapest) 5 tokens 42/36 -> 58/53, 6 tokens 43/41 ->
    // 68/67; Q6_K 6 tokens 50/41 -> 45/39, 7 tokens 50/37 -> 50/46; Q2_K 6
    // tokens 57 -> 56, 7 tokens 51 -> 67 (up). Q3_K and Q5_K were even at
    // 6-7 tokens. (Earlier, every format decoded row by row, on a Sapphire
    // Rapids: 6 tokens Q2_K 51 -> 39, Q4_K 44 -> 35; 16 tokens Q4_K 54 -> 66.)
    k.q2_k.panels = p(decode_q2_k, q2_k, 7);
    k.q3_k.panels = p(decode_q3_k, q3_k, 8);
    k.q4_k.panels = p(decode_q4_k, q4_k, 5);
    k.q5_k.panels = p(decode_q5_k, q5_k, 8);
    k.q6_k.panels = p(decode_q6_k, q6_k, 7);
    let l = |decode: Decode, dot: PanelDot<BlockQ8_0F>| {
        Some(Panels {
            height: HEIGHT,
            block_bytes: LEGACY_BLOCK_BYTES,
            min_acts: LEGACY_MIN_ACTS,
            acts: ACTS,
            decode,
            dot,
        })
    };
    k.q4_0.panels = l(decode_q4_0, q4_0);
    k.q5_0.panels = l(decode_q5_0, q5_0);
    k.f32.panels = Some(Panels {
        height: HEIGHT,
        block_bytes: F32_COLUMN,
        min_acts: F32_MIN_ACTS,
        acts: ACTS,
        decode: decode_f32,
        dot: f32_panel,
    });
}
