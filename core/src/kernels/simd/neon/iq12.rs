//! NEON dot products of the IQ1 / IQ2 formats (IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ1_S, IQ1_M) with Q8_K activations, one weight row against one to four
//! activation rows.
//!
//! One body serves all five: each format gives, per chunk of 32 weights, the
//! signed weights as two registers of int8 lanes ([`IqBlock::chunk`], from
//! whole words of the block), and per super-block all its scales `2s + 1`
//! as i32 lanes ([`IqBlock::scales`], one vector computation); the body
//! dots the weights with the activations (`sdot`, or widening multiplies on
//! plain NEON) and multiply-accumulates the lanes with the scale's lane
//! (`mla` by element) — once per chunk where both groups of 16 share a scale
//! (IQ2_XXS, IQ1_S). The eight chunks are written out so each lane is a
//! constant. A chunk is unpacked once for every activation row, so prefill
//! pays the grid lookups once per four tokens. Grid rows are 8 bytes: two
//! table loads make a register. IQ2 weights are grid magnitudes (<= 43)
//! times +-1 signs; IQ1 weights are `8 * grid + delta` (|v| <= 9). The
//! integers are the scalar twin's exactly; per block `d * d_y * sum`, and
//! 1/8 at the end (see `quant::iq`).

use super::{acts_paths, aux_scales, dot16, fp16, ksigns32, ld_s8, mla_lane, odd, opaque, widen16, word};
use crate::quant::iq::{KSIGN_BYTES, SIGN_BYTES};
use crate::quant::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use crate::quant::{as_blocks, iq1_m, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockQ8K, FileBlock};
use std::arch::aarch64::*;

acts_paths! {
    iq2_xxs = dot_iq2_xxs(BlockQ8K);
    iq2_xs = dot_iq2_xs(BlockQ8K);
    iq2_s = dot_iq2_s(BlockQ8K);
    iq1_s = dot_iq1_s(BlockQ8K);
    iq1_m = dot_iq1_m(BlockQ8K);
}

/// A block of one of the formats, as the common body sees it.
trait IqBlock: FileBlock {
    /// Whether the two groups of 16 in a chunk of 32 always share their scale.
    const SHARED: bool;
    /// The super-block scale.
    unsafe fn d(&self) -> f32;
    /// The scales `2s + 1` as i32 lanes: where [`Self::SHARED`], chunk `c`'s
    /// in lane `c % 4` of register `c / 4` (the last two registers unused);
    /// else group `g`'s (weights `16g..16g + 16`) in lane `g % 4` of
    /// register `g / 4`.
    unsafe fn scales(&self) -> [int32x4_t; 4];
    /// Weights `32c..32c + 32` as int8 lanes, in two registers of 16.
    unsafe fn chunk(&self, c: usize) -> [int8x16_t; 2];
}

/// Two 8-byte table rows, the first in the low half.
#[inline(always)]
unsafe fn rows2(lo: u64, hi: u64) -> int8x16_t {
    vcombine_s8(vcreate_s8(lo), vcreate_s8(hi))
}

/// Sixteen 4-bit scales, two to a byte (the low nibble first), as `2s + 1`.
#[inline(always)]
unsafe fn nibble_scales(b: &[u8; 8]) -> [int32x4_t; 4] {
    let v = vld1_u8(b.as_ptr());
    let (lo, hi) = (vand_u8(v, vdup_n_u8(0xF)), vshr_n_u8::<4>(v));
    widen16(vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi))).map(|v| odd(v))
}

/// IQ2 weights: grid magnitudes times the +-1 sign bytes.
#[inline(always)]
unsafe fn iq2_weights(grid: int8x16_t, signs: int8x16_t) -> int8x16_t {
    vmulq_s8(grid, signs)
}

/// IQ1 weights: `8 * grid + delta` (grid -1, 0 or +1; delta +-1 per byte).
#[inline(always)]
unsafe fn iq1_weights(grid: int8x16_t, delta: int8x16_t) -> int8x16_t {
    vaddq_s8(vshlq_n_s8::<3>(grid), delta)
}

/// A row's delta (+-1, from its sign bit) in all 8 of its bytes.
#[inline(always)]
fn splat(negative: bool) -> u64 {
    if negative {
        u64::MAX
    } else {
        0x0101_0101_0101_0101
    }
}

impl IqBlock for BlockIQ2XXS {
    const SHARED: bool = true;
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> [int32x4_t; 4] {
        // Each chunk's second word (the odd words).
        let q = vld1q_u8_x4(self.qs.as_ptr());
        let u = |v: uint8x16_t| vreinterpretq_u32_u8(v);
        let zero = vdupq_n_s32(0);
        [aux_scales(vuzp2q_u32(u(q.0), u(q.1))), aux_scales(vuzp2q_u32(u(q.2), u(q.3))), zero, zero]
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> [int8x16_t; 2] {
        // 4 grid indices, then 4 seven-bit sign patterns (and the scale).
        let (idx, aux) = (word(&self.qs, 8 * c), word(&self.qs, 8 * c + 4));
        let grid = |k: u32| IQ2XXS_GRID[(idx >> (8 * k)) as u8 as usize];
        let [s0, s1] = ksigns32(aux);
        [iq2_weights(rows2(grid(0), grid(1)), s0), iq2_weights(rows2(grid(2), grid(3)), s1)]
    }
}

impl IqBlock for BlockIQ2XS {
    const SHARED: bool = false;
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> [int32x4_t; 4] {
        nibble_scales(&self.scales)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> [int8x16_t; 2] {
        // Four rows of 16 bits: a 9-bit grid index, a 7-bit sign pattern.
        let (q0, q1) = (word(&self.qs, 8 * c), word(&self.qs, 8 * c + 4));
        let grid = |q: u32| IQ2XS_GRID[(q & 511) as usize];
        let sign = |q: u32| KSIGN_BYTES[(q >> 9 & 127) as usize];
        let w0 = iq2_weights(rows2(grid(q0), grid(q0 >> 16)), rows2(sign(q0), sign(q0 >> 16)));
        let w1 = iq2_weights(rows2(grid(q1), grid(q1 >> 16)), rows2(sign(q1), sign(q1 >> 16)));
        [w0, w1]
    }
}

impl IqBlock for BlockIQ2S {
    const SHARED: bool = false;
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> [int32x4_t; 4] {
        nibble_scales(&self.scales)
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> [int8x16_t; 2] {
        // Four rows: low index bytes, 2 high index bits each in `qh[c]`, sign bytes.
        let (lo, signs, hi) = (word(&self.qs, 4 * c), word(&self.qs, 32 + 4 * c), self.qh[c] as u32);
        let grid = |k: u32| IQ2S_GRID[((lo >> (8 * k) & 255) | (hi >> (2 * k) & 3) << 8) as usize];
        let sign = |k: u32| SIGN_BYTES[(signs >> (8 * k)) as u8 as usize];
        let w0 = iq2_weights(rows2(grid(0), grid(1)), rows2(sign(0), sign(1)));
        let w1 = iq2_weights(rows2(grid(2), grid(3)), rows2(sign(2), sign(3)));
        [w0, w1]
    }
}

impl IqBlock for BlockIQ1S {
    const SHARED: bool = true;
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        fp16(self.d)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> [int32x4_t; 4] {
        // Bits 12..15 of each group's word.
        let h = vreinterpretq_u16_u8(vld1q_u8(self.qh.as_ptr()));
        let s = vandq_u16(vshrq_n_u16::<12>(h), vdupq_n_u16(7));
        let zero = vdupq_n_s32(0);
        [odd(vmovl_u16(vget_low_u16(s))), odd(vmovl_high_u16(s)), zero, zero]
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> [int8x16_t; 2] {
        // Four rows: low index bytes; the group's word holds 3 high bits
        // per row, the scale and the delta's sign.
        let lo = word(&self.qs, 4 * c);
        let h = u16::from_le_bytes([self.qh[2 * c], self.qh[2 * c + 1]]) as u32;
        let grid = |k: u32| IQ1S_GRID[((lo >> (8 * k) & 255) | (h >> (3 * k) & 7) << 8) as usize];
        let delta = vdupq_n_s8(if h & 0x8000 != 0 { -1 } else { 1 });
        [iq1_weights(rows2(grid(0), grid(1)), delta), iq1_weights(rows2(grid(2), grid(3)), delta)]
    }
}

impl IqBlock for BlockIQ1M {
    const SHARED: bool = false;
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        iq1_m::d(self)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> [int32x4_t; 4] {
        // Four 16-bit words, each with four 3-bit scales from bit 0.
        let w = vmovl_u16(vreinterpret_u16_u8(vld1_u8(self.scales.as_ptr())));
        let shifts = vld1q_s32([0, -3, -6, -9].as_ptr());
        let at = |v: uint32x4_t| odd(vandq_u32(vshlq_u32(v, shifts), vdupq_n_u32(7)));
        [
            at(vdupq_laneq_u32::<0>(w)),
            at(vdupq_laneq_u32::<1>(w)),
            at(vdupq_laneq_u32::<2>(w)),
            at(vdupq_laneq_u32::<3>(w)),
        ]
    }
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> [int8x16_t; 2] {
        // Four rows: low index bytes, a nibble each in `qh` (3 high bits and
        // the delta's sign).
        let lo = word(&self.qs, 4 * c);
        let h = u16::from_le_bytes([self.qh[2 * c], self.qh[2 * c + 1]]) as u32;
        let grid = |k: u32| IQ1S_GRID[((lo >> (8 * k) & 255) | (h >> (4 * k) & 7) << 8) as usize];
        let delta = |k: u32| splat(h >> (4 * k + 3) & 1 != 0);
        let w0 = iq1_weights(rows2(grid(0), grid(1)), rows2(delta(0), delta(1)));
        let w1 = iq1_weights(rows2(grid(2), grid(3)), rows2(delta(2), delta(3)));
        [w0, w1]
    }
}

/// Chunk `C` of a block with `N` activation rows (`y`: their blocks'
/// values), into the integer sums.
#[inline(always)]
unsafe fn chunk_step<B: IqBlock, const D: bool, const N: usize, const C: usize>(
    xb: &B,
    sc: &[int32x4_t; 4],
    y: [*const i8; N],
    sumi: &mut [int32x4_t; N],
) {
    let [w0, w1] = xb.chunk(C);
    let zero = vdupq_n_s32(0);
    for n in 0..N {
        let (y0, y1) = (ld_s8(y[n].add(32 * C).cast()), ld_s8(y[n].add(32 * C + 16).cast()));
        if B::SHARED {
            let p = dot16::<D>(dot16::<D>(zero, w0, y0), w1, y1);
            sumi[n] = mla_lane(sumi[n], p, sc[C / 4], C % 4);
        } else {
            let (g0, g1) = (2 * C, 2 * C + 1);
            sumi[n] = mla_lane(sumi[n], dot16::<D>(zero, w0, y0), sc[g0 / 4], g0 % 4);
            sumi[n] = mla_lane(sumi[n], dot16::<D>(zero, w1, y1), sc[g1 / 4], g1 % 4);
        }
    }
}

/// The common body: one weight row with `N` activation rows.
#[inline(always)]
unsafe fn dot_iq<B: IqBlock, const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let x = as_blocks::<B>(w);
    debug_assert!(a.iter().all(|r| r.len() == x.len()));
    let mut sum = [0.0f32; N];
    for (i, xb) in x.iter().enumerate() {
        let sc = xb.scales().map(|v| opaque(v));
        let y: [*const i8; N] = std::array::from_fn(|n| a[n].get_unchecked(i).qs.as_ptr());
        let mut sumi = [vdupq_n_s32(0); N];
        // The eight chunks written out, so that each one's scale lane is a constant.
        chunk_step::<B, D, N, 0>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 1>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 2>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 3>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 4>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 5>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 6>(xb, &sc, y, &mut sumi);
        chunk_step::<B, D, N, 7>(xb, &sc, y, &mut sumi);
        let d = xb.d();
        for n in 0..N {
            sum[n] += d * a[n].get_unchecked(i).d * vaddvq_s32(sumi[n]) as f32;
        }
    }
    sum.map(|s| 0.125 * s)
}

#[inline(always)]
unsafe fn dot_iq2_xxs<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ2XXS, D, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq2_xs<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ2XS, D, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq2_s<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ2S, D, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq1_s<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ1S, D, N>(w, a)
}

#[inline(always)]
unsafe fn dot_iq1_m<const D: bool, const N: usize>(w: &[u8], a: [&[BlockQ8K]; N]) -> [f32; N] {
    dot_iq::<BlockIQ1M, D, N>(w, a)
}
