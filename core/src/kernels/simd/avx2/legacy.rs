//! AVX2 dot products of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
//! with Q8_0 / Q8_1 activations. One 256-bit register holds a block; two
//! blocks per iteration keep two FMA chains in flight.

use super::{dot_u8i8, exact_paths, fp16, fp16_x8, hsum_ps, load32, paths, prefetch_ahead};
use crate::quant::{as_blocks, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_0F, BlockQ8_1F};
use std::arch::x86_64::*;

paths! {
    q4_0 = dot_q4_0(BlockQ8_0F);
    q4_1 = dot_q4_1(BlockQ8_1F);
    q5_0 = dot_q5_0(BlockQ8_0F);
    q5_1 = dot_q5_1(BlockQ8_1F);
    q8_0 = dot_q8_0(BlockQ8_0F);
}

// Every body sums each activation row exactly as with one row (see
// [`dot_signed`], [`dot_unsigned`]): all are exact kernels too, eight
// activation rows a pass on AVX-512 (a verify pass of up to seven drafts
// reads the weights once).
exact_paths! {
    wide = 8;
    q4_0 = dot_q4_0(BlockQ8_0F);
    q4_1 = dot_q4_1(BlockQ8_1F);
    q5_0 = dot_q5_0(BlockQ8_0F);
    q5_1 = dot_q5_1(BlockQ8_1F);
    q8_0 = dot_q8_0(BlockQ8_0F);
}

/// The decoded-rows prefill (see [`crate::kernels::table::Decoded`]):
/// module `decoded::<isa>::<format>` holds `decode` (a Q4_0 or Q5_0 row into
/// [`BlockQ8_0F`] blocks) and `x4` (a decoded row with four activation rows).
pub(crate) mod decoded {
    macro_rules! decoded {
        ($($m:ident, $features:literal, $v:ident;)*) => {$(
            pub(crate) mod $m {
                decoded!(@format $features, $v, q4_0, BlockQ4_0);
                decoded!(@format $features, $v, q5_0, BlockQ5_0);
            }
        )*};
        (@format $features:literal, $v:ident, $name:ident, $block:ident) => {
            pub(crate) mod $name {
                use super::super::super::super::$v as V;
                use crate::kernels::table::{decoded_blocks, decoded_blocks_mut};
                use crate::quant::{as_blocks, $block, BlockQ8_0F};
                pub(crate) const BLOCK_BYTES: usize = size_of::<BlockQ8_0F>();
                pub(crate) const MIN_ACTS: usize = 8;
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn decode(w: &[u8], out: &mut [u8]) {
                    super::super::super::decode::<$block>(as_blocks(w), decoded_blocks_mut(out))
                }
                #[target_feature(enable = $features)]
pub(crate) unsafe fn x4(w: &[u8], row_bytes: usize, a: [&[BlockQ8_0F]; 4], out: [&mut [f32]; 4]) {
                    super::super::super::super::rows4(w, row_bytes, out, |row| {
                        super::super::super::dot_signed::<BlockQ8_0F, V, 4>(decoded_blocks(row), a)
                    })
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

type F16 = crate::quant::F16Bytes;

/// Blocks of a signed format into int8 blocks with f32 scales (the same values).
#[inline(always)]
unsafe fn decode<B: Signed32>(x: &[B], out: &mut [BlockQ8_0F]) {
    assert_eq!(x.len(), out.len(), "decode: {} blocks into {}", x.len(), out.len());
    for (o, b) in out.iter_mut().zip(x) {
        o.d = _mm256_cvtss_f32(b.scale_x8());
        _mm256_storeu_si256(o.qs.as_mut_ptr().cast(), b.values());
    }
}

/// 16 bytes of nibbles -> 32 bytes: low nibbles (values 0..16) then high ones.
/// (The 16 bytes go to both halves in the load; one variable shift moves the
/// high half's nibbles down.)
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr().cast()));
    _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F))
}

/// Bit `i % 8` in byte `i` of every 8: the bit each byte of [`bits_in_bytes`] keeps.
const BYTE_BITS: i64 = 0x8040_2010_0804_0201_u64 as i64;

/// Byte `i` of `qh` in bytes `8i..8i + 8`, each ANDed with its own bit
/// (`1 << i % 8`): nonzero where bit `i` of the 32 is set.
#[inline(always)]
unsafe fn bits_in_bytes(qh: [u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(qh));
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    _mm256_and_si256(spread, _mm256_set1_epi64x(BYTE_BITS))
}

/// The 32 bits of `qh` spread to one byte each: 0xFF where the bit is set.
#[inline(always)]
unsafe fn bits_to_bytes(qh: [u8; 4]) -> __m256i {
    let b = bits_in_bytes(qh);
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(BYTE_BITS))
}

/// The 32 bits of `qh` spread to one byte each: 0xFF where the bit is clear.
#[inline(always)]
unsafe fn clear_bits_to_bytes(qh: [u8; 4]) -> __m256i {
    _mm256_cmpeq_epi8(bits_in_bytes(qh), _mm256_setzero_si256())
}

/// `*p` in all eight lanes, loaded by `vbroadcastss` (a pure load). Written
/// in `asm!` so that LLVM keeps the product with it in vector form
/// (`vmulps`) instead of `vmulss` + a register broadcast: one shuffle less
/// per block and activation row.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn broadcast_load(p: &f32) -> __m256 {
    let v: __m256;
    std::arch::asm!("vbroadcastss {v}, dword ptr [{p}]", p = in(reg) p, v = lateout(ymm_reg) v,
        options(pure, readonly, nostack, preserves_flags));
    v
}

// The per-format parts are trait methods, not closures: a closure defined in
// these generic bodies would be compiled without the wrappers' target
// features, and the intrinsics inside it would become function calls.

/// A block with one scale, unpacked to 32 signed bytes.
pub(super) trait Signed32 {
    /// The scale in all eight lanes (the f16 ones broadcast, then converted once).
    unsafe fn scale_x8(&self) -> __m256;
    unsafe fn values(&self) -> __m256i;
}

impl Signed32 for BlockQ8_0 {
    #[inline(always)]
    unsafe fn scale_x8(&self) -> __m256 {
        fp16_x8(self.d)
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        load32(self.qs.as_ptr().cast())
    }
}

impl Signed32 for BlockQ8_0F {
    #[inline(always)]
    unsafe fn scale_x8(&self) -> __m256 {
        _mm256_set1_ps(self.d)
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        load32(self.qs.as_ptr().cast())
    }
}

impl Signed32 for BlockQ4_0 {
    #[inline(always)]
    unsafe fn scale_x8(&self) -> __m256 {
        fp16_x8(self.d)
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // nibble - 8
        _mm256_sub_epi8(nibbles(&self.qs), _mm256_set1_epi8(8))
    }
}

impl Signed32 for BlockQ5_0 {
    #[inline(always)]
    unsafe fn scale_x8(&self) -> __m256 {
        fp16_x8(self.d)
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // q - 16 = nibble where the fifth bit is set, nibble | 0xF0 (nibble - 16) where it is clear.
        _mm256_or_si256(nibbles(&self.qs), _mm256_and_si256(clear_bits_to_bytes(self.qh), _mm256_set1_epi8(-16)))
    }
}

/// A block with a scale and a minimum, unpacked to 32 unsigned bytes.
trait Unsigned32 {
    fn scale_min(&self) -> (F16, F16);
    unsafe fn values(&self) -> __m256i;
}

impl Unsigned32 for BlockQ4_1 {
    #[inline(always)]
    fn scale_min(&self) -> (F16, F16) {
        (self.d, self.m)
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        nibbles(&self.qs)
    }
}

impl Unsigned32 for BlockQ5_1 {
    #[inline(always)]
    fn scale_min(&self) -> (F16, F16) {
        (self.d, self.m)
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // nibble + 16 * fifth bit
        _mm256_or_si256(nibbles(&self.qs), _mm256_and_si256(bits_to_bytes(self.qh), _mm256_set1_epi8(0x10)))
    }
}

/// Block `i` of a signed format against the `N` activation rows (each at
/// least `i + 1` blocks long), into `acc`.
#[inline(always)]
unsafe fn signed_step<B: Signed32, const V: u8, const N: usize>(
    xb: &B,
    a: &[&[BlockQ8_0F]; N],
    i: usize,
    acc: &mut [__m256; N],
) {
    let xs = xb.values();
    // |x| as unsigned, and the sign of x moved onto each activation row.
    let ax = _mm256_sign_epi8(xs, xs);
    let d = xb.scale_x8();
    for n in 0..N {
        let y = a[n].get_unchecked(i);
        let sy = _mm256_sign_epi8(load32(y.qs.as_ptr().cast()), xs);
        let s = dot_u8i8::<V>(_mm256_setzero_si256(), ax, sy);
        // Both scales are f16 values: their f32 product is exact.
        let dd = _mm256_mul_ps(d, broadcast_load(&y.d));
        acc[n] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc[n]);
    }
}

/// Dot products of one row of a signed format with `N` activation rows; two
/// accumulator sets keep two FMA chains in flight. (Four rows would not need
/// them for speed, but every `N` must sum in the same order: the multi-row
/// prefill and the one-row decode give bit-identical results.)
#[inline(always)]
unsafe fn dot_signed<B: Signed32, const V: u8, const N: usize>(x: &[B], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let a = a.map(|r| &r[..x.len()]);
    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    let mut i = 0;
    while i + 1 < x.len() {
        // One line ahead per pair of blocks (18 to 34 bytes each).
        prefetch_ahead((&x[i] as *const B).cast(), 1);
        signed_step::<B, V, N>(&x[i], &a, i, &mut acc0);
        signed_step::<B, V, N>(&x[i + 1], &a, i + 1, &mut acc1);
        i += 2;
    }
    if i < x.len() {
        signed_step::<B, V, N>(&x[i], &a, i, &mut acc0);
    }
    let mut out = [0.0f32; N];
    for n in 0..N {
        out[n] = hsum_ps(_mm256_add_ps(acc0[n], acc1[n]));
    }
    out
}

#[inline(always)]
unsafe fn dot_q8_0<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_signed::<BlockQ8_0, V, N>(as_blocks(w), a)
}

#[inline(always)]
unsafe fn dot_q4_0<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_signed::<BlockQ4_0, V, N>(as_blocks(w), a)
}

#[inline(always)]
unsafe fn dot_q5_0<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_0F]; N]) -> [f32; N] {
    dot_signed::<BlockQ5_0, V, N>(as_blocks(w), a)
}

/// Block `i` of a scale-and-minimum format against the `N` activation rows
/// (each at least `i + 1` blocks long), into `acc` and `acc_m`.
#[inline(always)]
unsafe fn unsigned_step<B: Unsigned32, const V: u8, const N: usize>(
    xb: &B,
    a: &[&[BlockQ8_1F]; N],
    i: usize,
    acc: &mut [__m256; N],
    acc_m: &mut [f32; N],
) {
    let (d, m) = xb.scale_min();
    let (d, m) = (fp16(d), fp16(m));
    let d8 = _mm256_set1_ps(d);
    let u = xb.values();
    for n in 0..N {
        let y = a[n].get_unchecked(i);
        let s = dot_u8i8::<V>(_mm256_setzero_si256(), u, load32(y.qs.as_ptr().cast()));
        // d * y.d in every lane, as the scalar product broadcast (the same
        // f32 product), with the activation's scale broadcast as it loads.
        acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d8, broadcast_load(&y.d)), _mm256_cvtepi32_ps(s), acc[n]);
        // The minimum meets the activation sum, precomputed in the Q8_1 block.
        acc_m[n] += m * y.s;
    }
}

/// Dot products of one row of a scale-and-minimum format with `N` Q8_1
/// activation rows: one multiply-add chain per activation row, blocks in
/// order, so every `N` gives each row's one-row result.
#[inline(always)]
unsafe fn dot_unsigned<B: Unsigned32, const V: u8, const N: usize>(x: &[B], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let a = a.map(|r| &r[..x.len()]);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [0.0f32; N];
    let mut i = 0;
    while i + 1 < x.len() {
        prefetch_ahead((&x[i] as *const B).cast(), 1);
        unsigned_step::<B, V, N>(&x[i], &a, i, &mut acc, &mut acc_m);
        unsigned_step::<B, V, N>(&x[i + 1], &a, i + 1, &mut acc, &mut acc_m);
        i += 2;
    }
    if i < x.len() {
        unsigned_step::<B, V, N>(&x[i], &a, i, &mut acc, &mut acc_m);
    }
    let mut out = [0.0f32; N];
    for n in 0..N {
        out[n] = hsum_ps(acc[n]) + acc_m[n];
    }
    out
}

#[inline(always)]
unsafe fn dot_q4_1<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    dot_unsigned::<BlockQ4_1, V, N>(as_blocks(w), a)
}

#[inline(always)]
unsafe fn dot_q5_1<const V: u8, const N: usize>(w: &[u8], a: [&[BlockQ8_1F]; N]) -> [f32; N] {
    dot_unsigned::<BlockQ5_1, V, N>(as_blocks(w), a)
}
