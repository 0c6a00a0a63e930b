//! AVX2 dot products of the K-quants (Q2_K..Q6_K) with Q8_K activations.
//!
//! The common shape: unpack 32 weights into unsigned bytes, `vpmaddubsw` them
//! with 32 activations into 16 i16 pair sums, and multiply-add those with the
//! group scales (as i16) into 8 i32 lanes. Offsets and minimums are folded in
//! once per super-block through the activation group sums (`bsums`): e.g.
//! Q6_K's `sum sc * (q - 32) * y` is `sum sc * q * y - 32 * sum sc * bsum`.

pub(super) mod zmm;

use super::{dot_i16, dot_u8i8, exact_paths, fp16, hsum_ps, load32, paths, prefetch_ahead};
use crate::quant::{as_blocks, scales_mins_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

paths! {
    q2_k = dot_q2_k(BlockQ8K);
    q3_k = dot_q3_k<true>(BlockQ8K);
    q4_k = dot_q4_k<true>(BlockQ8K);
    q5_k = dot_q5_k<true>(BlockQ8K);
    q6_k = dot_q6_k<true>(BlockQ8K);
}

// Without `FUSE` the bodies finish every token's block as with one token:
// the exact kernels (see `crate::kernels::table::Exact`). (Q2_K's one-token
// body is another kernel than its multi-token one: it has none.)
exact_paths! {
    q3_k = dot_q3_k<false>(BlockQ8K);
    q4_k = dot_q4_k<false>(BlockQ8K);
    q5_k = dot_q5_k<false>(BlockQ8K);
    q6_k = dot_q6_k<false>(BlockQ8K);
}

// Every body dots one weight row with `N` activation rows: each weight
// register is unpacked once and meets the `N` rows' activations in turn.
// With `FUSE` (the prefill kernels), four tokens end each block in one
// shared float tail, which rounds differently from one token's.

/// Activations `32r..32r + 32` of a Q8_K block.
#[inline(always)]
unsafe fn acts(y: &BlockQ8K, r: usize) -> __m256i {
    load32(y.qs.as_ptr().add(32 * r).cast())
}

/// A block's integer sums, one per activation row: with one row (decode)
/// the steps alternate between two chains, so that each `vpdpwssd` (or
/// `vpmaddwd` + add) waits on the one two steps back, not the last one;
/// with more rows their chains already overlap. The sum is the same integer
/// in either order, so every path's products are unchanged to the bit.
/// (Measured on a Zen 4, one thread, Q2_K matrices in L3: 14.5 -> 15.7 GB/s.)
struct Sums<const N: usize> {
    rows: [__m256i; N],
    odd: __m256i,
}

impl<const N: usize> Sums<N> {
    #[inline(always)]
    unsafe fn new() -> Self {
        Sums { rows: [_mm256_setzero_si256(); N], odd: _mm256_setzero_si256() }
    }

    /// Row `n`'s sum plus the 16 i16 products `x` times `s` (pairs added):
    /// step `step` of the block.
    #[inline(always)]
    unsafe fn add<const V: u8>(&mut self, n: usize, step: usize, x: __m256i, s: __m256i) {
        if N == 1 && step % 2 == 1 {
            self.odd = dot_i16::<V>(self.odd, x, s);
        } else {
            self.rows[n] = dot_i16::<V>(self.rows[n], x, s);
        }
    }

    #[inline(always)]
    unsafe fn done(self) -> [__m256i; N] {
        let mut rows = self.rows;
        if N == 1 {
            rows[0] = _mm256_add_epi32(rows[0], self.odd);
        }
        rows
    }
}

/// The 16 group sums of a Q8_K block, as i16.
#[inline(always)]
unsafe fn bsums(y: &BlockQ8K) -> __m256i {
    _mm256_loadu_si256(y.bsums.as_ptr().cast())
}

/// For groups of 16: the 16 i8 scales `sc` widened to i16, even groups in the
/// low 128-bit half and odd groups in the high half, so that [`scale_i16`]
/// serves register `r` (groups `2r`, `2r + 1`) with one in-lane shuffle.
#[inline(always)]
unsafe fn scales_even_odd(sc: __m128i) -> __m256i {
    let order = _mm_set_epi8(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, order))
}

/// A table on its own cache lines: no load of a whole mask from it straddles
/// two (measured on Zen 3, one-row kernels: Q2_K +3 %, Q4_K and Q6_K +2 %).
#[repr(align(64))]
pub(super) struct Aligned<T>(pub(super) T);

/// Shuffle masks broadcasting i16 lane `i` of each 128-bit half.
static SCALE_MASKS: Aligned<[[u8; 32]; 8]> = Aligned({
    let mut m = [[0u8; 32]; 8];
    let mut i = 0;
    while i < 8 {
        let mut b = 0;
        while b < 32 {
            m[i][b] = (2 * i + b % 2) as u8;
            b += 1;
        }
        i += 1;
    }
    m
});

/// i16 lane `i` of each 128-bit half, broadcast over that half: one `vpshufb`
/// with its mask from memory. (With a constant mask LLVM rewrites it as two
/// word shuffles, `vpshuflw` + `vpshufd`, on the two busiest pipes; the empty
/// `asm!` makes the mask table opaque and costs no instruction.)
#[inline(always)]
#[allow(clippy::pointers_in_nomem_asm_block)] // the asm only hides the pointer's value; it reads nothing
unsafe fn scale_i16(sc: __m256i, i: usize) -> __m256i {
    let mut masks = SCALE_MASKS.0.as_ptr();
    std::arch::asm!("/* {0} */", inout(reg) masks, options(pure, nomem, nostack, preserves_flags));
    _mm256_shuffle_epi8(sc, _mm256_loadu_si256(masks.add(i).cast()))
}

/// `v >> shift` per byte, keeping `mask` (shifting 16-bit lanes is exact for
/// the bits a mask below `0xFF >> shift` keeps).
#[inline(always)]
unsafe fn bits(v: __m256i, shift: i32, mask: i8) -> __m256i {
    let shifted = match shift {
        0 => v,
        1 => _mm256_srli_epi16(v, 1),
        2 => _mm256_srli_epi16(v, 2),
        3 => _mm256_srli_epi16(v, 3),
        4 => _mm256_srli_epi16(v, 4),
        5 => _mm256_srli_epi16(v, 5),
        6 => _mm256_srli_epi16(v, 6),
        _ => _mm256_srli_epi16(v, 7),
    };
    _mm256_and_si256(shifted, _mm256_set1_epi8(mask))
}

/// The lane sums of `N` accumulators (a loop, not a closure: see legacy.rs).
#[inline(always)]
unsafe fn hsums<const N: usize>(acc: [__m256; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    for n in 0..N {
        out[n] = hsum_ps(acc[n]);
    }
    out
}

/// `acc + d * sumi - dmin * summ`, lane-wise, as f32.
#[inline(always)]
unsafe fn scale_acc(acc: __m256, d: f32, sumi: __m256i, dmin: f32, summ: __m256i) -> __m256 {
    let acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(summ), acc)
}

/// Four activation rows' scales `d` for block `i`, as `[y0, y1, y2, y3]`.
#[inline(always)]
unsafe fn act_scales4<const N: usize>(a: &[&[BlockQ8K]; N], i: usize) -> __m128 {
    _mm_set_ps(a[3][i].d, a[2][i].d, a[1][i].d, a[0][i].d)
}

/// `[a0+a2, b0+b2, a1+a3, b1+b3 | a4+a6, b4+b6, a5+a7, b5+b7]`: the lanes of
/// two i32 vectors summed in pairs and interleaved, by unpacking. (`vphaddd`
/// does it in one instruction, but as three uops that llvm-mca's Zen 3 model
/// puts on the first vector pipe, one of the two that run `vpmaddubsw` /
/// `vpmaddwd`; the unpacks run on the others. Measured no slower.)
#[inline(always)]
unsafe fn zip_add32(a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
}

/// `[a0+a2, a1+a3, b0+b2, b1+b3 | a4+a6, a5+a7, b4+b6, b5+b7]`: as
/// [`zip_add32`], by pairs of lanes.
#[inline(always)]
unsafe fn zip_add64(a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b))
}

/// The super-block tail of a four-token pass for formats with minimums
/// (Q2_K, Q4_K, Q5_K): the integer sums `s[n]` (scaled by `d`) and `m[n]`
/// (scaled by `-dmin`) of the four tokens are reduced together across lanes
/// first, so the float work is one conversion and one multiply-add for all
/// four. `acc` lanes: `[S0, M0, S1, M1 | S2, M2, S3, M3]`, see [`finish4_min`].
#[inline(always)]
unsafe fn tail4_min(acc: __m256, s: &[__m256i], m: &[__m256i], d: f32, dmin: f32, yd: __m128) -> __m256 {
    // t_n = [s02 m02 s13 m13 | s46 m46 s57 m57] (sums of lanes)
    let t = [zip_add32(s[0], m[0]), zip_add32(s[1], m[1]), zip_add32(s[2], m[2]), zip_add32(s[3], m[3])];
    // [S0 M0 S1 M1 | same, other half's lanes], likewise tokens 2, 3
    let (u01, u23) = (zip_add64(t[0], t[1]), zip_add64(t[2], t[3]));
    let w = _mm256_add_epi32(_mm256_permute2x128_si256(u01, u23, 0x20), _mm256_permute2x128_si256(u01, u23, 0x31));
    let ydd = _mm256_set_m128(_mm_unpackhi_ps(yd, yd), _mm_unpacklo_ps(yd, yd));
    let dd = _mm256_blend_ps(_mm256_set1_ps(d), _mm256_set1_ps(-dmin), 0b1010_1010);
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(w), _mm256_mul_ps(ydd, dd), acc)
}

/// The four dot products from a [`tail4_min`] accumulator.
#[inline(always)]
unsafe fn finish4_min(acc: __m256) -> [f32; 4] {
    let h = _mm256_hadd_ps(acc, acc); // [S0+M0, S1+M1, .., .. | S2+M2, S3+M3, .., ..]
    let (lo, hi) = (_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), _mm_movelh_ps(lo, hi));
    out
}

/// The super-block tail of a four-token pass for formats without minimums
/// (Q3_K, Q6_K): the four tokens' integer sums `t[n]` are reduced across
/// lanes together, then scaled by `d * y_n` in one multiply-add.
#[inline(always)]
unsafe fn tail4(acc: __m128, t: &[__m256i], d: f32, yd: __m128) -> __m128 {
    let (u01, u23) = (zip_add32(t[0], t[1]), zip_add32(t[2], t[3]));
    let v = zip_add64(u01, u23); // [T0 T1 T2 T3 | T0 T1 T2 T3], each half its lanes' part
    let w = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_fmadd_ps(_mm_cvtepi32_ps(w), _mm_mul_ps(yd, _mm_set1_ps(d)), acc)
}

/// `N` results from a four-token accumulator (only called with `N == 4`).
#[inline(always)]
unsafe fn out4<const N: usize>(v: [f32; 4]) -> [f32; N] {
    let mut out = [0.0f32; N];
    out.copy_from_slice(&v[..N]);
    out
}

/// `sumi[n] - (sum_g sc_g * bsum_g) << SHIFT` for every activation row `n`:
/// removes an offset of `1 << SHIFT` stored in every value (Q3_K: 4, Q6_K: 32).
#[inline(always)]
unsafe fn remove_offset<const N: usize, const SHIFT: i32>(
    mut sumi: [__m256i; N],
    sc16: __m256i,
    a: &[&[BlockQ8K]; N],
    i: usize,
) -> [__m256i; N] {
    for n in 0..N {
        sumi[n] = _mm256_sub_epi32(sumi[n], _mm256_slli_epi32::<SHIFT>(_mm256_madd_epi16(sc16, bsums(&a[n][i]))));
    }
    sumi
}

/// Block `i`'s integer sums `t[n]` of a one-scale format (Q3_K, Q6_K) times
/// `d * y_n`, into the accumulators: all four tokens at once ([`tail4`])
/// when `FUSE` and `N == 4`, else per token.
#[inline(always)]
unsafe fn add_scaled<const N: usize, const FUSE: bool>(
    acc: &mut [__m256; N],
    acc4: &mut __m128,
    t: &[__m256i; N],
    d: f32,
    a: &[&[BlockQ8K]; N],
    i: usize,
) {
    if FUSE && N == 4 {
        *acc4 = tail4(*acc4, t, d, act_scales4(a, i));
        return;
    }
    for n in 0..N {
        acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(a[n][i].d * d), _mm256_cvtepi32_ps(t[n]), acc[n]);
    }
}

/// The `N` dot products from [`add_scaled`]'s accumulators.
#[inline(always)]
unsafe fn finish_scaled<const N: usize, const FUSE: bool>(acc: [__m256; N], acc4: __m128) -> [f32; N] {
    if FUSE && N == 4 {
        return out4(split4(acc4));
    }
    hsums(acc)
}

/// The four lanes of `v`.
#[inline(always)]
unsafe fn split4(v: __m128) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), v);
    out
}

/// A Q2_K block's 16 minimums (the high nibbles of its 16 scale bytes
/// `packed`) as i16.
#[inline(always)]
pub(super) unsafe fn q2_mins(packed: __m128i) -> __m256i {
    _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F)))
}

/// A Q2_K block's 16 minimums (as i16) against the group sums of each of the
/// four tokens' activations, for [`tail4_min`].
#[inline(always)]
unsafe fn q2_mins4<const N: usize>(mins: __m256i, a: &[&[BlockQ8K]; N], i: usize) -> [__m256i; 4] {
    [
        _mm256_madd_epi16(mins, bsums(&a[0][i])),
        _mm256_madd_epi16(mins, bsums(&a[1][i])),
        _mm256_madd_epi16(mins, bsums(&a[2][i])),
        _mm256_madd_epi16(mins, bsums(&a[3][i])),
    ]
}

#[inline(always)]
unsafe fn dot_q2_k<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    if N > 1 {
        return dot_q2_k_table::<V, N>(w, a);
    }
    let mut out = [0.0; N];
    out[0] = dot_q2_k_one::<V>(w, a[0]);
    out
}

/// `vpshufb` masks of [`dot_q2_k_one`], read from memory by [`pick_i16`]:
/// mask `r < 8` widens scale byte `2r` over the low 128-bit lane and byte
/// `2r + 1` over the high one (the groups of register `r`); mask 8 widens
/// bytes 0..8 into the low lane and 8..16 into the high one (the 16 groups in
/// order). Index `0x80` zeroes the high byte of each 16-bit lane.
static Q2_ONE_MASKS: Aligned<[[u8; 32]; 9]> = Aligned({
    let mut m = [[0x80u8; 32]; 9];
    let mut b = 0;
    while b < 32 {
        let lane = b / 16;
        if b % 2 == 0 {
            let mut r = 0;
            while r < 8 {
                m[r][b] = (2 * r + lane) as u8;
                r += 1;
            }
            m[8][b] = (8 * lane + (b % 16) / 2) as u8;
        }
        b += 1;
    }
    m
});

/// [`Q2_ONE_MASKS`] behind an empty `asm!` that is not `pure`: LLVM can
/// neither see the constants (it would rewrite the `vpshufb`s, as in
/// [`scale_i16`]) nor hoist the mask loads out of the block loop (nine masks
/// in registers spill the loop's own values).
#[inline(always)]
#[allow(clippy::pointers_in_nomem_asm_block)] // the asm only hides the pointer's value; it reads nothing
unsafe fn q2_one_masks() -> *const [u8; 32] {
    let mut masks = Q2_ONE_MASKS.0.as_ptr();
    std::arch::asm!("/* {0} */", inout(reg) masks, options(nomem, nostack, preserves_flags));
    masks
}

/// Bytes of `v` (the same 16 in both 128-bit lanes) widened to i16 lanes as
/// mask `k` of `masks` picks them (one `vpshufb`, its mask from memory).
#[inline(always)]
unsafe fn pick_i16(v: __m256i, masks: *const [u8; 32], k: usize) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_loadu_si256(masks.add(k).cast()))
}

/// Q2_K with one activation row (decode). On Zen 3 this kernel is bound by its
/// instructions (as fast from L2 as from memory), so it spends as few as it
/// can: every integer is 16 times the block's sum, which leaves the 2-bit
/// values where a mask finds them.
/// - Value `j` of each byte is taken as `v * 4^j` for `j < 3` (one AND, no
///   shift) and as `v * 16` for `j = 3` (one shift by 2, one AND); registers
///   with `v`, `4v`, `16v` meet the group scales times 16, 4, 1, all widened
///   straight from the 16 scale bytes broadcast to both lanes (one `vpshufb`
///   each, no per-block widening). Products stay in range: `vpmaddubsw` pairs
///   at most `2 * 48 * 127`.
/// - Minimums times 16 are the scale bytes' high nibbles in place (one AND).
/// - The scales' sums and the minimums' sums are interleaved into one
///   register (unpack, add) and meet `[d, -dmin]` (the block's two f16s in one
///   32-bit broadcast) times the activations' `d` in one FMA.
///
/// Every i32 stays below 2^24 (at most `8 * 4 * 720 * 127` per lane, twice
/// that after the interleave), so its float is exact; the float sum is 16
/// times the true one in every operation, and the final `/ 16` is exact.
#[inline(always)]
unsafe fn dot_q2_k_one<const V: u8>(w: &[u8], y: &[BlockQ8K]) -> f32 {
    let x = as_blocks::<BlockQ2K>(w);
    debug_assert_eq!(y.len(), x.len());
    let mut acc = _mm256_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        prefetch_ahead((xb as *const BlockQ2K).cast(), 84);
        let masks = q2_one_masks();
        let packed = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.scales.as_ptr().cast()));
        let sc1 = _mm256_and_si256(packed, _mm256_set1_epi8(0x0F));
        // Below 16 in every byte: the 16-bit shifts carry nothing across bytes.
        let sc = [_mm256_slli_epi16(sc1, 4), _mm256_slli_epi16(sc1, 2), sc1, sc1];
        let mins16 = pick_i16(_mm256_and_si256(packed, _mm256_set1_epi8(0xF0u8 as i8)), masks, 8);
        let mut sums = Sums::<1>::new();
        for h in 0..2 {
            let q = load32(xb.qs.as_ptr().add(32 * h));
            let u = [
                _mm256_and_si256(q, _mm256_set1_epi8(0x03)),
                _mm256_and_si256(q, _mm256_set1_epi8(0x0C)),
                _mm256_and_si256(q, _mm256_set1_epi8(0x30)),
                _mm256_and_si256(_mm256_srli_epi16(q, 2), _mm256_set1_epi8(0x30)),
            ];
            for j in 0..4 {
                let r = 4 * h + j;
                sums.add::<V>(0, r, _mm256_maddubs_epi16(u[j], acts(yb, r)), pick_i16(sc[j], masks, r));
            }
        }
        let [sumi] = sums.done();
        let summ = _mm256_madd_epi16(mins16, bsums(yb));
        // [sumi, summ] lane pairs against [d, -dmin] * y.d.
        let both = _mm256_add_epi32(_mm256_unpacklo_epi32(sumi, summ), _mm256_unpackhi_epi32(sumi, summ));
        let dm = u32::from_le_bytes([xb.d.0[0], xb.d.0[1], xb.dmin.0[0], xb.dmin.0[1]]) ^ 0x8000_0000;
        let coef = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi32(dm as i32)), _mm256_set1_ps(yb.d));
        acc = _mm256_fmadd_ps(coef, _mm256_cvtepi32_ps(both), acc);
    }
    hsum_ps(acc) * (1.0 / 16.0)
}

/// Index bytes of [`q2_products`]' scale pattern for half `h` of a block: in
/// 128-bit lane `L`, 16-bit lanes `2k` and `2k + 1` take scale byte
/// `8h + 2k + L` (the group of register `4h + k` in that lane), high bytes
/// zero (index bit 7).
static Q2_PRODUCT_SCALES: Aligned<[[u8; 32]; 2]> = Aligned({
    let mut m = [[0u8; 32]; 2];
    let mut h = 0;
    while h < 2 {
        let mut b = 0;
        while b < 32 {
            let (lane, k) = (b / 16, (b % 16) / 4);
            m[h][b] = if b % 2 == 0 { (8 * h + 2 * k + lane) as u8 } else { 0x80 };
            b += 1;
        }
        h += 1;
    }
    m
});

/// The product table of half `h` of a Q2_K block (registers `4h..4h + 4`):
/// byte `4k + v` of lane `L` is `v * sc[8h + 2k + L]`, the 2-bit value `v`
/// times the scale of register `4h + k`'s group in that lane (at most 45).
/// `sc`: the 16 scales, in both halves. Bytes `4k`, `4k + 1` (and `4k + 2`,
/// `4k + 3`) share a scale, so one 16-bit multiply by the values `0x0100`
/// (`0x0302`) makes both without a carry between them.
#[inline(always)]
unsafe fn q2_products(sc: __m256i, h: usize) -> __m256i {
    let pattern = _mm256_shuffle_epi8(sc, _mm256_loadu_si256(Q2_PRODUCT_SCALES.0[h].as_ptr().cast()));
    _mm256_mullo_epi16(pattern, _mm256_set1_epi32(0x0302_0100))
}

/// `acc` plus two registers of unsigned bytes `w0`, `w1` (at most 45) times
/// activation registers `2p`, `2p + 1` of `y`: on [`MADD`](super::MADD) the two
/// `vpmaddubsw` pair sums share one widening `vpmaddwd` (each below
/// 2 * 45 * 128, both below `i16::MAX`); with VNNI one `vpdpbusd` each.
#[inline(always)]
unsafe fn dot_scaled_pair<const V: u8>(acc: __m256i, w0: __m256i, w1: __m256i, y: &BlockQ8K, p: usize) -> __m256i {
    if V == super::MADD {
        let pairs =
            _mm256_add_epi16(_mm256_maddubs_epi16(w0, acts(y, 2 * p)), _mm256_maddubs_epi16(w1, acts(y, 2 * p + 1)));
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    } else {
        dot_u8i8::<V>(dot_u8i8::<V>(acc, w0, acts(y, 2 * p)), w1, acts(y, 2 * p + 1))
    }
}

/// Q2_K with two to four activation rows: each register of 2-bit values
/// becomes value times group scale by a byte lookup ([`q2_products`]: one
/// `vpshufb` per register, for all the tokens), so the tokens' products need
/// no scale step: [`dot_scaled_pair`], as in the decoded tiles. ([`dot_q2_k_one`]
/// for one row multiplies by the scales per register: with one token the
/// lookup costs more than it saves.) The sum over a block is the same integer
/// as the decoded tiles', so the same products.
#[inline(always)]
unsafe fn dot_q2_k_table<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockQ2K>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let (mut acc, mut acc4) = ([_mm256_setzero_ps(); N], _mm256_setzero_ps());
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockQ2K).cast(), 84);
        let packed = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let sc = _mm256_broadcastsi128_si256(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
        let mins = q2_mins(packed);
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let table = q2_products(sc, h);
            let q = load32(xb.qs.as_ptr().add(32 * h));
            for j in [0, 2] {
                // bit pairs j, j + 1: registers 4h + j, 4h + j + 1, table slots j, j + 1
                let u0 = _mm256_shuffle_epi8(
                    table,
                    _mm256_or_si256(bits(q, 2 * j as i32, 3), _mm256_set1_epi8(4 * j as i8)),
                );
                let u1 = _mm256_shuffle_epi8(
                    table,
                    _mm256_or_si256(bits(q, 2 * j as i32 + 2, 3), _mm256_set1_epi8(4 * j as i8 + 4)),
                );
                for n in 0..N {
                    sumi[n] = dot_scaled_pair::<V>(sumi[n], u0, u1, &a[n][i], 2 * h + j / 2);
                }
            }
        }
        let (d, dmin) = (fp16(xb.d), fp16(xb.dmin));
        if N == 4 {
            acc4 = tail4_min(acc4, &sumi, &q2_mins4(mins, &a, i), d, dmin, act_scales4(&a, i));
            continue;
        }
        for n in 0..N {
            let y = &a[n][i];
            acc[n] = scale_acc(acc[n], y.d * d, sumi[n], y.d * dmin, _mm256_madd_epi16(mins, bsums(y)));
        }
    }
    finish_scaled_min::<N, true>(acc, acc4)
}

/// The decoded-tile prefill (see [`crate::kernels::table::Decoded`]): a
/// tile's weight rows are unpacked once, and every group of four activation
/// rows then meets each 32 bytes of them without unpacking. Module
/// `decoded::<isa>::<format>` holds `decode`, `x4`, `BLOCK_BYTES` and
/// `MIN_ACTS`.
///
/// - Q2_K ([`BlockQ2KScaled`]): value times group scale as a byte, so each
///   register meets a token in one `vpmaddubsw`, two registers sharing one
///   widening `vpmaddwd` (the packed kernel: a `vpmaddwd` with the scales per
///   register and token).
/// - Q3_K ([`BlockQ3KUnpacked`]): the 3-bit values as bytes and the scales
///   ready as i16; the scales stay a `vpmaddwd` per register and token (value
///   times scale can reach 128).
///
/// Q4_K and Q6_K are not decoded: their values take two to four instructions
/// per register to unpack, and unpacked tiles measured about as fast (Q4_K
/// 0.98x at 32 rows, 1.03x at 128; Q6_K 1.01x, 1.08x).
pub(crate) mod decoded {
    macro_rules! decoded {
        ($($m:ident, $features:literal, $v:ident;)*) => {$(
            pub(crate) mod $m {
                // Minimum tile rows measured on Zen 3 (one thread, 4096 x 2048
                // weights), decoded vs packed four-row kernel: Q2_K 0.92x at 8
                // rows, 1.02x at 16, 1.12x at 32, 1.18x at 128; Q3_K 0.97x at
                // 16, 1.03x at 32, 1.16x at 128.
                decoded!(@format $features, $v, q2_k, BlockQ2KScaled, decode_q2_k, dot_q2_k_scaled, 32);
                decoded!(@format $features, $v, q3_k, BlockQ3KUnpacked, decode_q3_k, dot_q3_k_unpacked, 32);
            }
        )*};
        (@format $features:literal, $v:ident, $name:ident, $dec:ident, $decode:ident, $dot:ident, $min:expr) => {
            pub(crate) mod $name {
                use super::super::super::super::$v as V;
                use super::super::super::{$decode, $dot, $dec};
                use crate::kernels::table::{decoded_blocks, decoded_blocks_mut};
                use crate::quant::{as_blocks, BlockQ8K};
                pub(crate) const BLOCK_BYTES: usize = size_of::<$dec>();
                pub(crate) const MIN_ACTS: usize = $min;
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn decode(w: &[u8], out: &mut [u8]) {
                    $decode(as_blocks(w), decoded_blocks_mut(out))
                }
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn x4(w: &[u8], row_bytes: usize, a: [&[BlockQ8K]; 4], out: [&mut [f32]; 4]) {
                    super::super::super::super::rows4(w, row_bytes, out, |row| $dot::<V>(decoded_blocks(row), a))
                }
            }
        };
    }
    decoded! {
        avx2, "avx2,fma,f16c", MADD;
        avxvnni, "avx2,fma,f16c,avxvnni", VEX;
        avx512vnni, "avx2,fma,f16c,avx512vnni,avx512vl", EVEX;
    }
}

/// A Q2_K block decoded for [`decoded`]: the same numbers, laid out for use.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct BlockQ2KScaled {
    d: f32,
    dmin: f32,
    /// The 16 group minimums as i16, for `vpmaddwd` with the group sums.
    mins: [i16; 16],
    /// Value `i` (0..4) times the scale of its group of 16 (0..16), in
    /// element order: at most 45, so `vpmaddubsw` pair sums stay below
    /// 2 * 45 * 128 and two of them below `i16::MAX`.
    qs: [u8; 256],
}
const _: () = assert!(size_of::<BlockQ2KScaled>() == 296 && align_of::<BlockQ2KScaled>() == 4);

/// Q2_K blocks into [`BlockQ2KScaled`]: each register of 32 values (the
/// four-row kernel's `bits`) times its groups' scales with one `vpmullw`
/// (values below 4 times scales below 16: no byte carries into the next).
#[inline(always)]
unsafe fn decode_q2_k(x: &[BlockQ2K], out: &mut [BlockQ2KScaled]) {
    assert_eq!(x.len(), out.len(), "decode: {} blocks into {}", x.len(), out.len());
    for (o, xb) in out.iter_mut().zip(x) {
        let packed = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let sc = scales_even_odd(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
        let mins = q2_mins(packed);
        _mm256_storeu_si256(o.mins.as_mut_ptr().cast(), mins);
        for h in 0..2 {
            let q = load32(xb.qs.as_ptr().add(32 * h));
            for j in 0..4 {
                let r = 4 * h + j;
                let v = _mm256_mullo_epi16(bits(q, 2 * j as i32, 3), scale_i16(sc, r));
                _mm256_storeu_si256(o.qs.as_mut_ptr().add(32 * r).cast(), v);
            }
        }
        (o.d, o.dmin) = (fp16(xb.d), fp16(xb.dmin));
    }
}

/// A decoded Q2_K row with four activation rows: the integers and the float
/// tail of the packed four-row body, so the same products to the bit.
#[inline(always)]
unsafe fn dot_q2_k_scaled<const V: u8>(x: &[BlockQ2KScaled], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc4 = _mm256_setzero_ps();
    for (i, xb) in x.iter().enumerate() {
        let mut sumi = [_mm256_setzero_si256(); 4];
        for p in 0..4 {
            let (w0, w1) = (load32(xb.qs.as_ptr().add(64 * p)), load32(xb.qs.as_ptr().add(64 * p + 32)));
            for n in 0..4 {
                sumi[n] = dot_scaled_pair::<V>(sumi[n], w0, w1, &a[n][i], p);
            }
        }
        let mins = _mm256_loadu_si256(xb.mins.as_ptr().cast());
        acc4 = tail4_min(acc4, &sumi, &q2_mins4(mins, &a, i), xb.d, xb.dmin, act_scales4(&a, i));
    }
    finish4_min(acc4)
}

/// The sixteen Q3_K group scales (6 bits, minus 32) as i8, in SIMD: low
/// nibbles from bytes 0..8 (groups 0..8) and their high nibbles (groups
/// 8..16); the top two bits of group `g` are bit pair `g / 4` of byte
/// `8 + g % 4`, shifted per 32-bit lane with `vpsrlvd`.
#[inline(always)]
pub(super) unsafe fn q3_scales(packed: &[u8; 12]) -> __m128i {
    let lo8 = _mm_loadl_epi64(packed.as_ptr().cast());
    let nib = _mm_set1_epi8(0x0F);
    let low = _mm_unpacklo_epi64(_mm_and_si128(lo8, nib), _mm_and_si128(_mm_srli_epi16(lo8, 4), nib));
    let top = _mm_set1_epi32(i32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]));
    let top = _mm_and_si128(_mm_srlv_epi32(top, _mm_set_epi32(6, 4, 2, 0)), _mm_set1_epi8(3));
    _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(top, 4)), _mm_set1_epi8(32))
}

/// Bit `r` of every byte of `hm`, moved to bit 2 (value 4), in two or three ops.
#[inline(always)]
unsafe fn bit_r_as_4(hm: __m256i, r: usize) -> __m256i {
    let four = _mm256_set1_epi8(4);
    match r {
        0 => _mm256_and_si256(_mm256_slli_epi16(hm, 2), four),
        1 => _mm256_and_si256(_mm256_slli_epi16(hm, 1), four),
        2 => _mm256_and_si256(hm, four),
        3 => _mm256_and_si256(_mm256_srli_epi16(hm, 1), four),
        4 => _mm256_and_si256(_mm256_srli_epi16(hm, 2), four),
        5 => _mm256_and_si256(_mm256_srli_epi16(hm, 3), four),
        6 => _mm256_and_si256(_mm256_srli_epi16(hm, 4), four),
        _ => _mm256_and_si256(_mm256_srli_epi16(hm, 5), four),
    }
}

#[inline(always)]
unsafe fn dot_q3_k<const V: u8, const N: usize, const FUSE: bool>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockQ3K>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let (mut acc, mut acc4) = ([_mm256_setzero_ps(); N], _mm_setzero_ps());
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockQ3K).cast(), 110);
        let sc8 = q3_scales(&xb.scales);
        let sc = scales_even_odd(sc8);
        let hm = load32(xb.hmask.as_ptr());
        let mut sums = Sums::<N>::new();
        for h in 0..2 {
            let q = load32(xb.qs.as_ptr().add(32 * h));
            for j in 0..4 {
                let r = 4 * h + j;
                // low 2 bits | high bit << 2: q + 4, in 0..8
                let u = _mm256_or_si256(bits(q, 2 * j as i32, 3), bit_r_as_4(hm, r));
                let s = scale_i16(sc, r);
                for (n, an) in a.iter().enumerate() {
                    sums.add::<V>(n, r, _mm256_maddubs_epi16(u, acts(&an[i], r)), s);
                }
            }
        }
        let sumi = sums.done();
        // Remove the +4 offset of the values: 4 * sum_g sc_g * bsum_g.
        let t = remove_offset::<N, 2>(sumi, _mm256_cvtepi8_epi16(sc8), &a, i);
        add_scaled::<N, FUSE>(&mut acc, &mut acc4, &t, fp16(xb.d), &a, i);
    }
    finish_scaled::<N, FUSE>(acc, acc4)
}

/// A Q3_K block unpacked for [`decoded`].
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct BlockQ3KUnpacked {
    d: f32,
    /// The 16 group scales as i16: even groups then odd (for [`scale_i16`]),
    /// and in group order (for the offset against the group sums).
    sc_even_odd: [i16; 16],
    sc: [i16; 16],
    /// Value `i` plus 4 (0..8), in element order.
    qs: [u8; 256],
}
const _: () = assert!(size_of::<BlockQ3KUnpacked>() == 324 && align_of::<BlockQ3KUnpacked>() == 4);

/// Q3_K blocks into [`BlockQ3KUnpacked`] (the packed kernel's unpacking).
#[inline(always)]
unsafe fn decode_q3_k(x: &[BlockQ3K], out: &mut [BlockQ3KUnpacked]) {
    assert_eq!(x.len(), out.len(), "decode: {} blocks into {}", x.len(), out.len());
    for (o, xb) in out.iter_mut().zip(x) {
        let sc8 = q3_scales(&xb.scales);
        _mm256_storeu_si256(o.sc_even_odd.as_mut_ptr().cast(), scales_even_odd(sc8));
        _mm256_storeu_si256(o.sc.as_mut_ptr().cast(), _mm256_cvtepi8_epi16(sc8));
        for (r, v) in q3_k_values(xb).into_iter().enumerate() {
            _mm256_storeu_si256(o.qs.as_mut_ptr().add(32 * r).cast(), v);
        }
        o.d = fp16(xb.d);
    }
}

/// A Q3_K block's values plus 4 (0..8), in element order: register `r`
/// holds values `32r..32r + 32`.
#[inline(always)]
pub(super) unsafe fn q3_k_values(xb: &BlockQ3K) -> [__m256i; 8] {
    let hm = load32(xb.hmask.as_ptr());
    let mut out = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let q = load32(xb.qs.as_ptr().add(32 * h));
        for j in 0..4 {
            let r = 4 * h + j;
            out[r] = _mm256_or_si256(bits(q, 2 * j as i32, 3), bit_r_as_4(hm, r));
        }
    }
    out
}

/// An unpacked Q3_K row with four activation rows: the packed four-row
/// body's integers and tail, so the same products to the bit.
#[inline(always)]
unsafe fn dot_q3_k_unpacked<const V: u8>(x: &[BlockQ3KUnpacked], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc4 = _mm_setzero_ps();
    for (i, xb) in x.iter().enumerate() {
        let sc = _mm256_loadu_si256(xb.sc_even_odd.as_ptr().cast());
        let mut sumi = [_mm256_setzero_si256(); 4];
        for r in 0..8 {
            let (u, s) = (load32(xb.qs.as_ptr().add(32 * r)), scale_i16(sc, r));
            for n in 0..4 {
                sumi[n] = dot_i16::<V>(sumi[n], _mm256_maddubs_epi16(u, acts(&a[n][i], r)), s);
            }
        }
        let t = remove_offset::<4, 2>(sumi, _mm256_loadu_si256(xb.sc.as_ptr().cast()), &a, i);
        acc4 = tail4(acc4, &t, xb.d, act_scales4(&a, i));
    }
    split4(acc4)
}

/// The 8 (scale, min) pairs of a Q4_K/Q5_K block: scales as i16 in both
/// halves (for [`scale_i16`]), each min twice as i16 (for [`mins_dot_bsums`]).
#[inline(always)]
unsafe fn scales_mins(packed: &[u8; 12]) -> (__m256i, __m256i) {
    let (scales, mins) = scales_mins_k4(packed);
    let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(scales.as_ptr().cast())));
    let m = _mm_loadl_epi64(mins.as_ptr().cast());
    (sc, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)))
}

/// `min_g * (bsum_2g + bsum_2g+1)` for the 8 groups of 32, one per i32 lane:
/// each min twice meets the activations' 16 group sums of 16 in one
/// `vpmaddwd` (no horizontal add).
#[inline(always)]
unsafe fn mins_dot_bsums(mins: __m256i, y: &BlockQ8K) -> __m256i {
    _mm256_madd_epi16(mins, bsums(y))
}

/// Block `i`'s scaled sums `sumi[n]` of a Q4_K/Q5_K row times `d * y_n`,
/// minus its minimums (met with the activations' pair sums) times `dmin *
/// y_n`, into the accumulators: all four tokens at once ([`tail4_min`]) when
/// `FUSE` and `N == 4`, else per token.
#[inline(always)]
unsafe fn add_scaled_k4<const N: usize, const FUSE: bool>(
    acc: &mut [__m256; N],
    acc4: &mut __m256,
    sumi: &[__m256i; N],
    mins: __m256i,
    (d, dmin): (f32, f32),
    a: &[&[BlockQ8K]; N],
    i: usize,
) {
    if FUSE && N == 4 {
        *acc4 = tail4_k4(*acc4, sumi, mins, (d, dmin), a, i);
        return;
    }
    for n in 0..N {
        let y = &a[n][i];
        acc[n] = scale_acc(acc[n], y.d * d, sumi[n], y.d * dmin, mins_dot_bsums(mins, y));
    }
}

/// [`add_scaled_k4`] for four tokens: their minimums against the
/// activations' pair sums, then [`tail4_min`].
#[inline(always)]
unsafe fn tail4_k4<const N: usize>(
    acc4: __m256,
    sumi: &[__m256i],
    mins: __m256i,
    (d, dmin): (f32, f32),
    a: &[&[BlockQ8K]; N],
    i: usize,
) -> __m256 {
    let m = [
        mins_dot_bsums(mins, &a[0][i]),
        mins_dot_bsums(mins, &a[1][i]),
        mins_dot_bsums(mins, &a[2][i]),
        mins_dot_bsums(mins, &a[3][i]),
    ];
    tail4_min(acc4, sumi, &m, d, dmin, act_scales4(a, i))
}

/// The `N` dot products from the accumulators of [`add_scaled_k4`] (or of
/// the same pair of tails in Q2_K).
#[inline(always)]
unsafe fn finish_scaled_min<const N: usize, const FUSE: bool>(acc: [__m256; N], acc4: __m256) -> [f32; N] {
    if FUSE && N == 4 {
        return out4(finish4_min(acc4));
    }
    hsums(acc)
}

#[inline(always)]
unsafe fn dot_q4_k<const V: u8, const N: usize, const FUSE: bool>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockQ4K>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let (mut acc, mut acc4) = ([_mm256_setzero_ps(); N], _mm256_setzero_ps());
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockQ4K).cast(), 144);
        let (sc, mins) = scales_mins(&xb.scales);
        let mut sums = Sums::<N>::new();
        for c in 0..4 {
            let q = load32(xb.qs.as_ptr().add(32 * c));
            // low nibbles: values 64c..64c+32 (group 2c), high nibbles: the next 32
            let (lo, hi) = (bits(q, 0, 0x0F), bits(q, 4, 0x0F));
            let (s_lo, s_hi) = (scale_i16(sc, 2 * c), scale_i16(sc, 2 * c + 1));
            for (n, an) in a.iter().enumerate() {
                let y = &an[i];
                sums.add::<V>(n, 2 * c, _mm256_maddubs_epi16(lo, acts(y, 2 * c)), s_lo);
                sums.add::<V>(n, 2 * c + 1, _mm256_maddubs_epi16(hi, acts(y, 2 * c + 1)), s_hi);
            }
        }
        let sumi = sums.done();
        add_scaled_k4::<N, FUSE>(&mut acc, &mut acc4, &sumi, mins, (fp16(xb.d), fp16(xb.dmin)), &a, i);
    }
    finish_scaled_min::<N, FUSE>(acc, acc4)
}

#[inline(always)]
unsafe fn dot_q5_k<const V: u8, const N: usize, const FUSE: bool>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockQ5K>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let (mut acc, mut acc4) = ([_mm256_setzero_ps(); N], _mm256_setzero_ps());
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockQ5K).cast(), 176);
        let (sc, mins) = scales_mins(&xb.scales);
        let qh = load32(xb.qh.as_ptr());
        let mut sums = Sums::<N>::new();
        for c in 0..4 {
            let q = load32(xb.qs.as_ptr().add(32 * c));
            // nibble | fifth bit (bit 2c for the low nibbles, 2c+1 for the high) << 4
            let lo = _mm256_or_si256(bits(q, 0, 0x0F), _mm256_slli_epi16(bits(qh, 2 * c as i32, 1), 4));
            let hi = _mm256_or_si256(bits(q, 4, 0x0F), _mm256_slli_epi16(bits(qh, 2 * c as i32 + 1, 1), 4));
            let (s_lo, s_hi) = (scale_i16(sc, 2 * c), scale_i16(sc, 2 * c + 1));
            for (n, an) in a.iter().enumerate() {
                let y = &an[i];
                sums.add::<V>(n, 2 * c, _mm256_maddubs_epi16(lo, acts(y, 2 * c)), s_lo);
                sums.add::<V>(n, 2 * c + 1, _mm256_maddubs_epi16(hi, acts(y, 2 * c + 1)), s_hi);
            }
        }
        let sumi = sums.done();
        add_scaled_k4::<N, FUSE>(&mut acc, &mut acc4, &sumi, mins, (fp16(xb.d), fp16(xb.dmin)), &a, i);
    }
    finish_scaled_min::<N, FUSE>(acc, acc4)
}

#[inline(always)]
unsafe fn dot_q6_k<const V: u8, const N: usize, const FUSE: bool>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<BlockQ6K>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let (mut acc, mut acc4) = ([_mm256_setzero_ps(); N], _mm_setzero_ps());
    let m30 = _mm256_set1_epi8(0x30);
    for (i, xb) in x.iter().enumerate() {
        prefetch_ahead((xb as *const BlockQ6K).cast(), 210);
        let sc8 = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let sc = scales_even_odd(sc8);
        let mut sums = Sums::<N>::new();
        for h in 0..2 {
            let qh = load32(xb.qh.as_ptr().add(32 * h));
            let ql0 = load32(xb.ql.as_ptr().add(64 * h));
            let ql1 = load32(xb.ql.as_ptr().add(64 * h + 32));
            // nibble | 2 high bits << 4: q + 32, in 0..64
            let u = [
                _mm256_or_si256(bits(ql0, 0, 0x0F), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(bits(ql1, 0, 0x0F), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                _mm256_or_si256(bits(ql0, 4, 0x0F), _mm256_and_si256(qh, m30)),
                _mm256_or_si256(bits(ql1, 4, 0x0F), bits(qh, 2, 0x30)),
            ];
            for (t, ut) in u.into_iter().enumerate() {
                let r = 4 * h + t;
                let s = scale_i16(sc, r);
                for (n, an) in a.iter().enumerate() {
                    sums.add::<V>(n, r, _mm256_maddubs_epi16(ut, acts(&an[i], r)), s);
                }
            }
        }
        let sumi = sums.done();
        // Remove the +32 offset of the values: 32 * sum_g sc_g * bsum_g.
        let t = remove_offset::<N, 5>(sumi, _mm256_cvtepi8_epi16(sc8), &a, i);
        add_scaled::<N, FUSE>(&mut acc, &mut acc4, &t, fp16(xb.d), &a, i);
    }
    finish_scaled::<N, FUSE>(acc, acc4)
}
