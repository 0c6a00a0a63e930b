//! Q4_K rows interleaved by four: the layout a four-row decode kernel reads
//! without transposing anything per block. Never stored in a file: made from
//! four Q4_K rows (block by block, [`X4Block::interleave`]) and back ([`X4Block::deinterleave`],
//! exactly the blocks it was made from).
//!
//! A block holds super-block `b` of four rows:
//! - `d`, `dmin`: the rows' f16 scales, row by row;
//! - `steps`: the 6-bit group scales as the steps of two chains (summation by
//!   parts): the even groups (the low nibbles: 0, 2, 4, 6) and the odd ones
//!   (the high nibbles), `s_g - s_(g+2)` with `s_8 = s_9 = 0`, in the order a
//!   kernel takes them: for `i` in 0..4, group `2i`'s step of rows 0..4 then
//!   group `2i + 1`'s (bytes `8i..8i + 4`, `8i + 4..8i + 8`);
//! - `mins`: the 6-bit group minimums, group-major (`mins[4g + r]`);
//! - `qs`: each row's 128 bytes of nibbles in words of four bytes, the four
//!   rows' words side by side: `qs[64j + 16w + 4r + t]` is byte `16j + 4w + t`
//!   of row `r`. One 16-byte register then holds the same four weights of
//!   each row, which an `sdot` by element meets with the same four
//!   activations: its four lanes are the four rows' sums.
//!
//! 592 bytes for four rows' 576 (the scales decoded: 2.8 % more to read).

use super::x4::X4Block;
use super::{scales_mins_k4, BlockQ4K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4Kx4 {
    pub d: [F16Bytes; 4],
    pub dmin: [F16Bytes; 4],
    pub steps: [i8; 32],
    pub mins: [u8; 32],
    pub qs: [u8; 512],
}
const _: () = assert!(size_of::<BlockQ4Kx4>() == 592);
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ4Kx4 {}

/// Bytes of four rows of `blocks` Q4_K super-blocks, interleaved.
pub const fn bytes_for(blocks: usize) -> usize {
    blocks * size_of::<BlockQ4Kx4>()
}

impl X4Block for BlockQ4Kx4 {
    type Plain = BlockQ4K;

    /// Super-block `b` of four rows, interleaved.
    fn interleave(rows: [&BlockQ4K; 4]) -> BlockQ4Kx4 {
        let sm = rows.map(|x| scales_mins_k4(&x.scales));
        let s = |r: usize, g: usize| if g < 8 { sm[r].0[g] as i8 } else { 0 };
        let mut x = BlockQ4Kx4 {
            d: rows.map(|x| x.d),
            dmin: rows.map(|x| x.dmin),
            steps: [0; 32],
            mins: [0; 32],
            qs: [0; 512],
        };
        for i in 0..4 {
            for r in 0..4 {
                // Within 63 - 0 either way: an i8.
                x.steps[8 * i + r] = s(r, 2 * i) - s(r, 2 * i + 2);
                x.steps[8 * i + 4 + r] = s(r, 2 * i + 1) - s(r, 2 * i + 3);
            }
        }
        for (r, (_, mins)) in sm.iter().enumerate() {
            for (g, &m) in mins.iter().enumerate() {
                x.mins[4 * g + r] = m;
            }
        }
        for j in 0..8 {
            for w in 0..4 {
                for (r, row) in rows.iter().enumerate() {
                    let at = 64 * j + 16 * w + 4 * r;
                    x.qs[at..at + 4].copy_from_slice(&row.qs[16 * j + 4 * w..16 * j + 4 * w + 4]);
                }
            }
        }
        x
    }

    /// The four Q4_K blocks `x` was made from.
    fn deinterleave(&self) -> [BlockQ4K; 4] {
        let x = self;
        std::array::from_fn(|r| {
            // The scales back from the chains' steps, the last group first.
            let mut sc = [0u8; 8];
            for g in (0..8).rev() {
                let next = if g + 2 < 8 { sc[g + 2] as i8 } else { 0 };
                sc[g] = (x.steps[8 * (g / 2) + 4 * (g % 2) + r] + next) as u8;
            }
            let mins: [u8; 8] = std::array::from_fn(|g| x.mins[4 * g + r]);
            let mut qs = [0u8; QK_K / 2];
            for j in 0..8 {
                for w in 0..4 {
                    let at = 64 * j + 16 * w + 4 * r;
                    qs[16 * j + 4 * w..16 * j + 4 * w + 4].copy_from_slice(&x.qs[at..at + 4]);
                }
            }
            BlockQ4K { d: x.d[r], dmin: x.dmin[r], scales: pack_scales_mins(&sc, &mins), qs }
        })
    }
}

/// Eight 6-bit scales and minimums packed as a Q4_K/Q5_K block holds them
/// (the inverse of [`super::scale_min_k4`]).
fn pack_scales_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | (sc[j + 4] >> 4) << 6;
        q[j + 4] = (m[j] & 63) | (m[j + 4] >> 4) << 6;
        q[j + 8] = (sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4;
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{random_weights, Rng};
    use crate::quant::{as_blocks, GgmlType};

    #[test]
    fn interleave_round_trips_every_block() {
        let mut rng = Rng::new(5);
        let w = random_weights(GgmlType::Q4K, 4, 3 * QK_K, &mut rng);
        let rows: [&[u8]; 4] = std::array::from_fn(|r| &w[r * 3 * 144..(r + 1) * 3 * 144]);
        let mut x = vec![0u8; bytes_for(3)];
        super::super::x4::interleave_rows_of::<BlockQ4Kx4>(rows, &mut x);
        for (b, xb) in as_blocks::<BlockQ4Kx4>(&x).iter().enumerate() {
            for (r, back) in xb.deinterleave().iter().enumerate() {
                let orig = &as_blocks::<BlockQ4K>(rows[r])[b];
                assert_eq!(back.d.0, orig.d.0);
                assert_eq!(back.dmin.0, orig.dmin.0);
                assert_eq!(scales_mins_k4(&back.scales), scales_mins_k4(&orig.scales), "block {b} row {r}");
                assert_eq!(back.scales, orig.scales, "block {b} row {r}: packed scales");
                assert_eq!(back.qs, orig.qs);
            }
        }
    }
}
