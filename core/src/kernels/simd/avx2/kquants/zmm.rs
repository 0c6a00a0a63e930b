//! Four-token K-quant kernels on 512-bit registers (AVX-512 F + BW + VNNI):
//! the prefill bodies of the `avx512vnni` path.
//!
//! Each register holds two of the 256-bit kernels' registers side by side,
//! chosen so that their activations are 64 contiguous bytes of the Q8_K
//! block (one load): the same 32 packed weight bytes are broadcast to both
//! halves and shifted by a different amount in each (`vpsrlvw`), and the
//! group scales come from one word permute (`vpermw`). So every unpacking,
//! scale and multiply instruction does the work of two, and the block ends
//! in the 256-bit kernels' tails after one fold of the sums. The integers are
//! the 256-bit kernels' (and the scalar twin's), only summed in another order.

use super::{
    act_scales4, finish4_min, out4, q2_mins, q2_mins4, q3_scales, remove_offset, scales_mins, split4, tail4, tail4_k4,
    tail4_min, Aligned, BlockQ2KScaled,
};
use crate::kernels::simd::avx2::{fp16, load32, prefetch_ahead, rows4};
use crate::kernels::table::decoded_blocks;
use crate::quant::{as_blocks, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

/// The CPU features of these kernels (with the 256-bit path's).
macro_rules! zmm_fn {
    ($(#[$m:meta])* fn $name:ident $args:tt -> $ret:ty $body:block) => {
        $(#[$m])*
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $name $args -> $ret $body
    };
}

/// `[a; 16 words] | [b; 16 words]`: per-half shift counts.
#[inline(always)]
unsafe fn halves(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b))
}

/// 32 bytes from `p` in both halves.
#[inline(always)]
unsafe fn both(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(load32(p))
}

/// Activations `32r..32r + 64` of a Q8_K block.
#[inline(always)]
unsafe fn acts64(y: &BlockQ8K, r: usize) -> __m512i {
    _mm512_loadu_si512(y.qs.as_ptr().add(32 * r).cast())
}

/// Word-permute indices: word `k` of the result takes scale `first + k /
/// width` (`width` result words per group: 8 for one group per 128-bit lane,
/// 16 for one per 256-bit half).
static GROUP_IDX: Aligned<[[u16; 32]; 12]> = Aligned({
    let mut t = [[0u16; 32]; 12];
    let mut i = 0;
    while i < 12 {
        // i < 8: 16-value groups, first group 2i (registers i, i + 1);
        // i >= 8: 32-value groups (Q4_K), first group 2(i - 8).
        let (first, width) = if i < 8 { (2 * i, 8) } else { (2 * (i - 8), 16) };
        let mut k = 0;
        while k < 32 {
            t[i][k] = (first + k / width) as u16;
            k += 1;
        }
        i += 1;
    }
    t
});

/// For 16-value groups: the scales of registers `r` and `r + 1` (groups
/// `2r..2r + 4`), one group per 128-bit lane, each scale over its lane's 8 words.
#[inline(always)]
unsafe fn scales16(sc: __m512i, r: usize) -> __m512i {
    _mm512_permutexvar_epi16(_mm512_loadu_si512(GROUP_IDX.0[r].as_ptr().cast()), sc)
}

/// For 32-value groups: groups `2c` and `2c + 1` over the two halves.
#[inline(always)]
unsafe fn scales32(sc: __m512i, c: usize) -> __m512i {
    _mm512_permutexvar_epi16(_mm512_loadu_si512(GROUP_IDX.0[8 + c].as_ptr().cast()), sc)
}

/// `acc + (u8 u * i8 y pair sums) * scale words` (never saturates: see the
/// 256-bit kernels). The `vpdpwssd` is written out: LLVM otherwise splits it
/// into `vpmaddwd` + `vpaddd`, and at 512 bits every vector instruction
/// competes for the same two ports. (Its own features for the `asm!`
/// registers; inlined into the kernels, which have them all.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn madd(acc: __m512i, u: __m512i, y: __m512i, s: __m512i) -> __m512i {
    let mut acc = acc;
    let pairs = _mm512_maddubs_epi16(u, y);
    std::arch::asm!(
        "vpdpwssd {acc}, {pairs}, {s}",
        acc = inout(zmm_reg) acc,
        pairs = in(zmm_reg) pairs,
        s = in(zmm_reg) s,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// The four tokens' 512-bit sums folded to 256 bits for the tails.
#[inline(always)]
unsafe fn fold(s: [__m512i; 4]) -> [__m256i; 4] {
    let mut out = [_mm256_setzero_si256(); 4];
    for n in 0..4 {
        out[n] = _mm256_add_epi32(_mm512_castsi512_si256(s[n]), _mm512_extracti64x4_epi64::<1>(s[n]));
    }
    out
}

/// The three-token kernels: the four-token body with the last row twice.
macro_rules! three {
    ($name:ident, $four:ident) => {
        zmm_fn! {
            fn $name(w: &[u8], a: [&[BlockQ8K]; 3]) -> [f32; 3] {
                let v = $four(w, [a[0], a[1], a[2], a[2]]);
                [v[0], v[1], v[2]]
            }
        }
    };
}

/// A Q2_K block's product table: byte `16L + 4s + k` is `k * sc[4s + L]`,
/// the 2-bit value `k` times the scale of group `4s + L` (at most 45). The
/// register pair from register `r = 2s` (see [`q2_k_x4`]) holds group
/// `2r + L = 4s + L` in its 128-bit lane `L`, so its lookup index is the
/// value plus `4s`.
#[inline(always)]
unsafe fn q2_table(sc: __m128i) -> __m512i {
    // g[16L + 4s + k] = sc[4s + L]
    static PICK: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut p = 0;
        while p < 64 {
            let (lane, slot) = (p / 16, (p % 16) / 4);
            t[p] = (4 * slot + lane) as u8;
            p += 1;
        }
        t
    };
    static ODD: [u8; 16] = [0, 0xFF, 0, 0xFF, 0, 0xFF, 0, 0xFF, 0, 0xFF, 0, 0xFF, 0, 0xFF, 0, 0xFF];
    static TWO_UP: [u8; 16] = [0, 0, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF];
    let g = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(sc), _mm512_loadu_si512(PICK.as_ptr().cast()));
    let odd = _mm512_broadcast_i32x4(_mm_loadu_si128(ODD.as_ptr().cast()));
    let two_up = _mm512_broadcast_i32x4(_mm_loadu_si128(TWO_UP.as_ptr().cast()));
    // k * g = (k odd ? g : 0) + (k >= 2 ? 2g : 0)
    _mm512_add_epi8(_mm512_and_si512(g, odd), _mm512_and_si512(_mm512_add_epi8(g, g), two_up))
}

/// `acc + sums of 4 adjacent u8 u * i8 y products` (`vpdpbusd`, never saturates).
#[inline(always)]
unsafe fn dot4(acc: __m512i, u: __m512i, y: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, u, y)
}

/// A Q2_K block's 256 values, each times its group's scale ([`q2_table`]),
/// in order: register `p` holds values `64p..64p + 64`. (`packed`: the
/// block's 16 scale bytes.)
#[inline(always)]
pub(crate) unsafe fn q2_k_scaled(xb: &BlockQ2K, packed: __m128i) -> [__m512i; 4] {
    let table = q2_table(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
    let three = _mm512_set1_epi8(3);
    let mut u = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let q = both(xb.qs.as_ptr().add(32 * h));
        for j in [0, 2] {
            // bit pairs j and j + 1: registers r and r + 1 of the 256-bit
            // kernels, groups 2r + L in lane L, which the table holds in slot r / 2
            let r = 4 * h + j;
            let v = _mm512_and_si512(_mm512_srlv_epi16(q, halves(2 * j as i16, 2 * j as i16 + 2)), three);
            u[r / 2] = _mm512_shuffle_epi8(table, _mm512_or_si512(v, _mm512_set1_epi8(2 * r as i8)));
        }
    }
    u
}

zmm_fn! {
    /// Q2_K: each 2-bit value is replaced by itself times its group's scale
    /// (a byte table lookup, [`q2_table`]), so every register meets each
    /// token's activations in one `vpdpbusd` with no scale step: the sum
    /// over the block is `sum_g sc_g * sum q * y`, the same integer.
    fn q2_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
        let x = as_blocks::<BlockQ2K>(w);
        debug_assert!(a.iter().all(|r| r.len() == x.len()));
        let mut acc4 = _mm256_setzero_ps();
        for (i, xb) in x.iter().enumerate() {
            prefetch_ahead((xb as *const BlockQ2K).cast(), 84);
            let packed = _mm_loadu_si128(xb.scales.as_ptr().cast());
            let mut sumi = [_mm512_setzero_si512(); 4];
            for (p, u) in q2_k_scaled(xb, packed).into_iter().enumerate() {
                for n in 0..4 {
                    sumi[n] = dot4(sumi[n], u, acts64(&a[n][i], 2 * p));
                }
            }
            let m = q2_mins4(q2_mins(packed), &a, i);
            acc4 = tail4_min(acc4, &fold(sumi), &m, fp16(xb.d), fp16(xb.dmin), act_scales4(&a, i));
        }
        out4(finish4_min(acc4))
    }
}
three!(q2_k_x3, q2_k_x4);

zmm_fn! {
    /// Decoded Q2_K tiles (see [`super::decoded`]) on 512-bit registers:
    /// each 64 bytes of value-times-scale meet a token in one `vpdpbusd`,
    /// then the 256-bit decoded kernel's fold and tail, so the same integers
    /// and the same products to the bit.
    fn q2_k_scaled_x4(w: &[u8], row_bytes: usize, a: [&[BlockQ8K]; 4], out: [&mut [f32]; 4]) -> () {
        rows4(w, row_bytes, out, |row| q2_k_scaled_row(decoded_blocks(row), a))
    }
}

#[inline(always)]
unsafe fn q2_k_scaled_row(x: &[BlockQ2KScaled], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut acc4 = _mm256_setzero_ps();
    for (i, xb) in x.iter().enumerate() {
        let mut sumi = [_mm512_setzero_si512(); 4];
        for p in 0..4 {
            let u = _mm512_loadu_si512(xb.qs.as_ptr().add(64 * p).cast());
            for n in 0..4 {
                sumi[n] = dot4(sumi[n], u, acts64(&a[n][i], 2 * p));
            }
        }
        let mins = _mm256_loadu_si256(xb.mins.as_ptr().cast());
        acc4 = tail4_min(acc4, &fold(sumi), &q2_mins4(mins, &a, i), xb.d, xb.dmin, act_scales4(&a, i));
    }
    finish4_min(acc4)
}

/// A Q3_K block's 256 values as `q + 4` (0..8), in order: register `p`
/// holds values `64p..64p + 64`.
#[inline(always)]
pub(crate) unsafe fn q3_k_values(xb: &BlockQ3K) -> [__m512i; 4] {
    let (three, four) = (_mm512_set1_epi8(3), _mm512_set1_epi8(4));
    let hm = both(xb.hmask.as_ptr());
    let mut u = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let q = both(xb.qs.as_ptr().add(32 * h));
        for j in [0, 2] {
            let r = 4 * h + j;
            let low = _mm512_and_si512(_mm512_srlv_epi16(q, halves(2 * j as i16, 2 * j as i16 + 2)), three);
            // bit r (r + 1) of every hmask byte to bit 2 (value 4), per half
            let high = if r == 0 {
                _mm512_sllv_epi16(hm, halves(2, 1))
            } else {
                _mm512_srlv_epi16(hm, halves(r as i16 - 2, r as i16 - 1))
            };
            u[r / 2] = _mm512_or_si512(low, _mm512_and_si512(high, four));
        }
    }
    u
}

zmm_fn! {
    fn q3_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
        let x = as_blocks::<BlockQ3K>(w);
        debug_assert!(a.iter().all(|r| r.len() == x.len()));
        let mut acc4 = _mm_setzero_ps();
        for (i, xb) in x.iter().enumerate() {
            prefetch_ahead((xb as *const BlockQ3K).cast(), 110);
            let sc8 = q3_scales(&xb.scales);
            let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
            let mut sumi = [_mm512_setzero_si512(); 4];
            for (p, u) in q3_k_values(xb).into_iter().enumerate() {
                let s = scales16(sc, 2 * p);
                for n in 0..4 {
                    sumi[n] = madd(sumi[n], u, acts64(&a[n][i], 2 * p), s);
                }
            }
            let t = remove_offset::<4, 2>(fold(sumi), _mm256_cvtepi8_epi16(sc8), &a, i);
            acc4 = tail4(acc4, &t, fp16(xb.d), act_scales4(&a, i));
        }
        split4(acc4)
    }
}
three!(q3_k_x3, q3_k_x4);

zmm_fn! {
    fn q4_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
        let x = as_blocks::<BlockQ4K>(w);
        debug_assert!(a.iter().all(|r| r.len() == x.len()));
        let mut acc4 = _mm256_setzero_ps();
        let (nib, shifts) = (_mm512_set1_epi8(0x0F), halves(0, 4));
        for (i, xb) in x.iter().enumerate() {
            prefetch_ahead((xb as *const BlockQ4K).cast(), 144);
            let (sc, mins) = scales_mins(&xb.scales);
            let sc = _mm512_castsi256_si512(sc);
            let mut sumi = [_mm512_setzero_si512(); 4];
            for c in 0..4 {
                // low nibbles (values 64c..64c + 32) | high nibbles (the next 32)
                let u = _mm512_and_si512(_mm512_srlv_epi16(both(xb.qs.as_ptr().add(32 * c)), shifts), nib);
                let s = scales32(sc, c);
                for n in 0..4 {
                    sumi[n] = madd(sumi[n], u, acts64(&a[n][i], 2 * c), s);
                }
            }
            acc4 = tail4_k4(acc4, &fold(sumi), mins, (fp16(xb.d), fp16(xb.dmin)), &a, i);
        }
        out4(finish4_min(acc4))
    }
}
three!(q4_k_x3, q4_k_x4);

zmm_fn! {
    fn q6_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
        let x = as_blocks::<BlockQ6K>(w);
        debug_assert!(a.iter().all(|r| r.len() == x.len()));
        let mut acc4 = _mm_setzero_ps();
        let (nib, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        for (i, xb) in x.iter().enumerate() {
            prefetch_ahead((xb as *const BlockQ6K).cast(), 210);
            let sc8 = _mm_loadu_si128(xb.scales.as_ptr().cast());
            let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
            let mut sumi = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                // ql bytes 64h..64h + 64: registers 4h, 4h + 1 (low nibbles), 4h + 2, 4h + 3 (high)
                let ql = _mm512_loadu_si512(xb.ql.as_ptr().add(64 * h).cast());
                let qh = both(xb.qh.as_ptr().add(32 * h));
                // nibble | 2 high bits << 4: q + 32, in 0..64
                let u = [
                    _mm512_or_si512(_mm512_and_si512(ql, nib), _mm512_and_si512(_mm512_sllv_epi16(qh, halves(4, 2)), m30)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nib),
                        _mm512_and_si512(_mm512_srlv_epi16(qh, halves(0, 2)), m30),
                    ),
                ];
                for (p, up) in u.into_iter().enumerate() {
                    let r = 4 * h + 2 * p;
                    let s = scales16(sc, r);
                    for n in 0..4 {
                        sumi[n] = madd(sumi[n], up, acts64(&a[n][i], r), s);
                    }
                }
            }
            let t = remove_offset::<4, 5>(fold(sumi), _mm256_cvtepi8_epi16(sc8), &a, i);
            acc4 = tail4(acc4, &t, fp16(xb.d), act_scales4(&a, i));
        }
        split4(acc4)
    }
}
three!(q6_k_x3, q6_k_x4);

/// Put the 512-bit kernels into the `avx512vnni` table's K-quant prefill entries.
pub(crate) fn install(k: &mut crate::kernels::table::Kernels) {
    use super::decoded::avx512vnni::q2_k as q2_k_decoded;
    use crate::kernels::table::{Acts3, Acts4, Decoded, Dot, Multi};
    fn set(d: &mut Dot<BlockQ8K>, three: Acts3<BlockQ8K>, four: Acts4<BlockQ8K>, decoded: Option<Decoded<BlockQ8K>>) {
        if let Multi::Acts(acts) = &mut d.multi {
            acts.three = three;
            acts.four = four;
            acts.decoded = decoded;
        }
    }
    // Q2_K tiles are decoded once from the 256-bit tiles' threshold (32
    // activation rows; not re-measured on AVX-512) and run on 512-bit
    // registers; Q3_K keeps its 512-bit packed kernel for every tile.
    let q2_k_tiles = Decoded {
        block_bytes: q2_k_decoded::BLOCK_BYTES,
        min_acts: q2_k_decoded::MIN_ACTS,
        decode: q2_k_decoded::decode,
        four: q2_k_scaled_x4,
    };
    set(&mut k.q2_k, q2_k_x3, q2_k_x4, Some(q2_k_tiles));
    set(&mut k.q3_k, q3_k_x3, q3_k_x4, None);
    set(&mut k.q4_k, q4_k_x3, q4_k_x4, None);
    set(&mut k.q6_k, q6_k_x3, q6_k_x4, None);
}
