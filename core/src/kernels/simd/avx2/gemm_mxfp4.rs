//! Prefill as a GEMM for MXFP4 (gpt-oss's experts) on AVX-512 VNNI: the
//! Q4_0 panels of [`super::gemm`] with MXFP4's values. A block's 32 indices
//! go through the E2M1 table (doubled: -12..12) to int8 and plus 12 to
//! unsigned bytes, so `vpdpbusd` meets them with the Q8_0 activations and
//! 12 times the activations' sum comes off; the scale is the block's E8M0
//! exponent, halved for the doubled table. The integer sums are the scalar
//! twin's; the f32 sums run per block, within the tests' tolerance.

use super::gemm::{decode_legacy, legacy_dot, ACTS, HEIGHT, LEGACY_BLOCK_BYTES, LEGACY_MIN_ACTS};
use super::legacy::Signed32;
use crate::kernels::table::{Kernels, Panels};
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4};
use crate::quant::{BlockMXFP4, BlockQ8_0F};
use std::arch::x86_64::*;

/// The table's values are at least -12: this offset makes them unsigned.
const OFF: i8 = 12;
const _: () = assert!(KVALUES_MXFP4[15] == -OFF);

impl Signed32 for BlockMXFP4 {
    #[inline(always)]
    unsafe fn scale_x8(&self) -> __m256 {
        _mm256_set1_ps(e8m0_to_f32_half(self.e))
    }

    /// The 32 values as int8, the low nibbles' first (as Q4_0's).
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr().cast()));
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(self.qs.as_ptr().cast()));
        // Low nibbles in the low half, high nibbles (shifted down 4) in the high half.
        let idx = _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
        _mm256_shuffle_epi8(table, idx)
    }
}

/// 16 MXFP4 weight rows into panel blocks: the values plus 12, the scales as f32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_mxfp4(rows: &[&[u8]], out: &mut [u8]) {
    decode_legacy::<BlockMXFP4, OFF>(rows, out)
}

/// `a.len()` tokens (at most [`ACTS`]) against one decoded MXFP4 panel: `out[stride t + r]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn mxfp4(dec: &[u8], a: &[&[BlockQ8_0F]], out: *mut f32, stride: usize) {
    const O: i32 = OFF as i32;
    match a.len() {
        1 => legacy_dot::<1, O>(dec, a, out, stride),
        2 => legacy_dot::<2, O>(dec, a, out, stride),
        3 => legacy_dot::<3, O>(dec, a, out, stride),
        4 => legacy_dot::<4, O>(dec, a, out, stride),
        5 => legacy_dot::<5, O>(dec, a, out, stride),
        6 => legacy_dot::<6, O>(dec, a, out, stride),
        7 => legacy_dot::<7, O>(dec, a, out, stride),
        _ => legacy_dot::<8, O>(dec, a, out, stride),
    }
}

/// MXFP4's panels, for the AVX-512 VNNI table (decoded from as many tokens
/// as Q4_0's: the table lookup costs about what Q4_0's subtraction does).
pub(crate) fn install(k: &mut Kernels) {
    k.mxfp4.panels = Some(Panels {
        height: HEIGHT,
        block_bytes: LEGACY_BLOCK_BYTES,
        min_acts: LEGACY_MIN_ACTS,
        acts: ACTS,
        decode: decode_mxfp4,
        dot: mxfp4,
    });
}
