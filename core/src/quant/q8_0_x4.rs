//! Q8_0 rows interleaved by four: a block holds the same 32 columns of four
//! rows, so that one 16-byte register holds the same four weights of each
//! row and an `sdot` by element meets them with the same four activations
//! (a lane per row). Never stored in a file: made from four Q8_0 rows
//! ([`X4Block::interleave`]) and back ([`X4Block::deinterleave`], exactly the blocks it was
//! made from).
//!
//! A block holds block `b` of four rows: `d`, the rows' f16 scales, row by
//! row; `qs[16w + 4r + t]` = value `4w + t` of row `r` (`w` in 0..8).
//! 136 bytes for four rows' 136.

use super::x4::X4Block;
use super::{BlockQ8_0, F16Bytes, FileBlock};
use std::mem::size_of;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8_0x4 {
    pub d: [F16Bytes; 4],
    pub qs: [i8; 128],
}
const _: () = assert!(size_of::<BlockQ8_0x4>() == 4 * size_of::<BlockQ8_0>());
// SAFETY: repr(C), byte arrays only: alignment 1, no padding, any bit pattern.
unsafe impl FileBlock for BlockQ8_0x4 {}

/// Bytes of four rows of `blocks` Q8_0 blocks, interleaved.
pub const fn bytes_for(blocks: usize) -> usize {
    blocks * size_of::<BlockQ8_0x4>()
}

impl X4Block for BlockQ8_0x4 {
    type Plain = BlockQ8_0;

    /// Block `b` of four rows, interleaved.
    fn interleave(rows: [&BlockQ8_0; 4]) -> BlockQ8_0x4 {
        let mut x = BlockQ8_0x4 { d: rows.map(|x| x.d), qs: [0; 128] };
        for w in 0..8 {
            for (r, row) in rows.iter().enumerate() {
                x.qs[16 * w + 4 * r..16 * w + 4 * r + 4].copy_from_slice(&row.qs[4 * w..4 * w + 4]);
            }
        }
        x
    }

    /// The four Q8_0 blocks `x` was made from.
    fn deinterleave(&self) -> [BlockQ8_0; 4] {
        let x = self;
        std::array::from_fn(|r| {
            let mut b = BlockQ8_0 { d: x.d[r], qs: [0; 32] };
            for w in 0..8 {
                b.qs[4 * w..4 * w + 4].copy_from_slice(&x.qs[16 * w + 4 * r..16 * w + 4 * r + 4]);
            }
            b
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
        let mut rng = Rng::new(7);
        let rb = 3 * size_of::<BlockQ8_0>();
        let w = random_weights(GgmlType::Q8_0, 4, 96, &mut rng);
        let rows: [&[u8]; 4] = std::array::from_fn(|r| &w[r * rb..(r + 1) * rb]);
        let mut x = vec![0u8; bytes_for(3)];
        super::super::x4::interleave_rows_of::<BlockQ8_0x4>(rows, &mut x);
        let mut back = vec![0u8; 4 * rb];
        let mut parts = back.chunks_exact_mut(rb);
        super::super::x4::deinterleave_rows_of::<BlockQ8_0x4>(&x, [(); 4].map(|_| parts.next().expect("four rows")));
        assert_eq!(back, w);
        // Value 4w + t of row r at 16w + 4r + t.
        let xb = &as_blocks::<BlockQ8_0x4>(&x)[2];
        assert_eq!(xb.qs[16 * 5 + 4 * 3 + 1], as_blocks::<BlockQ8_0>(rows[3])[2].qs[4 * 5 + 1]);
    }
}
