//! Q6_K rows interleaved by four: the layout a four-row decode kernel reads
//! without transposing or re-assembling anything per block. Never stored in a
//! file: made from four Q6_K rows (block by block, [`X4Block::interleave`]) and back
//! ([`X4Block::deinterleave`], exactly the blocks it was made from).
//!
//! A block holds super-block `b` of four rows:
//! - `d`: the rows' f16 scales, row by row;
//! - `scales`: the 16 signed group scales, group-major (`scales[4g + r]`);
//! - `qs`: the 6-bit values (0..64, the offset 32 not removed), group by
//!   group in 48 bytes: three 16-byte registers `A`, `B`, `C`. Register
//!   position `4r + t` of word `k` (0..4) is value `16g + 4k + t` of row `r`
//!   (the same four weights of each row, which an `sdot` by element meets
//!   with the same four activations, a lane per row); words 0, 1, 2 are the
//!   low six bits of `A`, `B`, `C`, and word 3's six bits are split over
//!   their top bit pairs (bits 0-1 in `A`, 2-3 in `B`, 4-5 in `C`). Each
//!   word then unpacks with one AND, and word 3 with two shift-and-inserts
//!   and a shift: 1.5 instructions a word, where the file's planes take
//!   nearly three.
//!
//! 840 bytes for four rows' 840: nothing more to read.

use super::x4::X4Block;
use super::{BlockQ6K, F16Bytes, FileBlock, QK_K};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ6Kx4 {
    pub d: [F16Bytes; 4],
    pub scales: [i8; 64],
    pub qs: [u8; 768],
}
const _: () = assert!(size_of::<BlockQ6Kx4>() == 4 * size_of::<BlockQ6K>());
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ6Kx4 {}

/// Bytes of four rows of `blocks` Q6_K super-blocks, interleaved.
pub const fn bytes_for(blocks: usize) -> usize {
    blocks * size_of::<BlockQ6Kx4>()
}

/// The 256 unsigned 6-bit values (0..64) of a block, in element order.
fn values(b: &BlockQ6K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b.ql[64 * h..64 * h + 64], &b.qh[32 * h..32 * h + 32]);
        for l in 0..32 {
            let y = &mut v[128 * h..];
            y[l] = (ql[l] & 0xF) | (qh[l] & 3) << 4;
            y[l + 32] = (ql[l + 32] & 0xF) | (qh[l] >> 2 & 3) << 4;
            y[l + 64] = (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4;
            y[l + 96] = (ql[l + 32] >> 4) | (qh[l] >> 6) << 4;
        }
    }
    v
}

impl X4Block for BlockQ6Kx4 {
    type Plain = BlockQ6K;

    /// Super-block `b` of four rows, interleaved.
    fn interleave(rows: [&BlockQ6K; 4]) -> BlockQ6Kx4 {
        let v = rows.map(values);
        let mut x = BlockQ6Kx4 { d: rows.map(|x| x.d), scales: [0; 64], qs: [0; 768] };
        for g in 0..16 {
            for (r, row) in rows.iter().enumerate() {
                x.scales[4 * g + r] = row.scales[g];
            }
            let regs = &mut x.qs[48 * g..48 * g + 48];
            for (r, v) in v.iter().enumerate() {
                for t in 0..4 {
                    let at = |k: usize| v[16 * g + 4 * k + t];
                    let w3 = at(3);
                    regs[4 * r + t] = at(0) | (w3 & 3) << 6;
                    regs[16 + 4 * r + t] = at(1) | (w3 >> 2 & 3) << 6;
                    regs[32 + 4 * r + t] = at(2) | (w3 >> 4) << 6;
                }
            }
        }
        x
    }

    /// The four Q6_K blocks `x` was made from.
    fn deinterleave(&self) -> [BlockQ6K; 4] {
        let x = self;
        std::array::from_fn(|r| {
            let mut v = [0u8; QK_K];
            for g in 0..16 {
                let regs = &x.qs[48 * g..48 * g + 48];
                for t in 0..4 {
                    let (a, b, c) = (regs[4 * r + t], regs[16 + 4 * r + t], regs[32 + 4 * r + t]);
                    v[16 * g + t] = a & 63;
                    v[16 * g + 4 + t] = b & 63;
                    v[16 * g + 8 + t] = c & 63;
                    v[16 * g + 12 + t] = a >> 6 | (b >> 6) << 2 | (c >> 6) << 4;
                }
            }
            let mut blk = BlockQ6K {
                ql: [0; QK_K / 2],
                qh: [0; QK_K / 4],
                scales: std::array::from_fn(|g| x.scales[4 * g + r]),
                d: x.d[r],
            };
            for h in 0..2 {
                let y = &v[128 * h..128 * h + 128];
                for l in 0..32 {
                    blk.ql[64 * h + l] = (y[l] & 0xF) | (y[l + 64] & 0xF) << 4;
                    blk.ql[64 * h + 32 + l] = (y[l + 32] & 0xF) | (y[l + 96] & 0xF) << 4;
                    blk.qh[32 * h + l] =
                        y[l] >> 4 | (y[l + 32] >> 4) << 2 | (y[l + 64] >> 4) << 4 | (y[l + 96] >> 4) << 6;
                }
            }
            blk
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{random_weights, Rng};
    use crate::quant::{as_blocks, GgmlType};

    #[test]
    fn interleave_round_trips_every_block() {
        let mut rng = Rng::new(6);
        let rb = 3 * size_of::<BlockQ6K>();
        let w = random_weights(GgmlType::Q6K, 4, 3 * QK_K, &mut rng);
        let rows: [&[u8]; 4] = std::array::from_fn(|r| &w[r * rb..(r + 1) * rb]);
        let mut x = vec![0u8; bytes_for(3)];
        super::super::x4::interleave_rows_of::<BlockQ6Kx4>(rows, &mut x);
        let mut back = vec![0u8; 4 * rb];
        let (b01, b23) = back.split_at_mut(2 * rb);
        let ((b0, b1), (b2, b3)) = (b01.split_at_mut(rb), b23.split_at_mut(rb));
        super::super::x4::deinterleave_rows_of::<BlockQ6Kx4>(&x, [b0, b1, b2, b3]);
        assert_eq!(back, w);
        // Word 3 of each group really is split over the top bit pairs.
        let orig = values(&as_blocks::<BlockQ6K>(rows[2])[1]);
        let xb = &as_blocks::<BlockQ6Kx4>(&x)[1];
        let (a, b, c) = (xb.qs[48 * 5 + 8 + 1], xb.qs[48 * 5 + 24 + 1], xb.qs[48 * 5 + 40 + 1]);
        assert_eq!(a >> 6 | (b >> 6) << 2 | (c >> 6) << 4, orig[16 * 5 + 12 + 1]);
        assert_eq!(a & 63, orig[16 * 5 + 1]);
    }
}
