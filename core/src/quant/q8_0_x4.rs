//! Q8_0 rows interleaved by four: a block holds the same 32 columns of four
//! rows, so that one 16-byte register holds the same four weights of each
//! row and an `sdot` by element meets them with the same four activations
//! (a lane per row). Never stored in a file: made from four Q8_0 rows
//! ([`interleave`]) and back ([`deinterleave`], exactly the blocks it was
//! made from).
//!
//! A block holds block `b` of four rows: `d`, the rows' f16 scales, row by
//! row; `qs[16w + 4r + t]` = value `4w + t` of row `r` (`w` in 0..8).
//! 136 bytes for four rows' 136.

use super::{as_blocks, block_bytes, BlockQ8_0, BlockQ8_0F, F16Bytes, FileBlock};
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

/// Block `b` of four rows, interleaved.
pub fn interleave(rows: [&BlockQ8_0; 4]) -> BlockQ8_0x4 {
    let mut x = BlockQ8_0x4 { d: rows.map(|x| x.d), qs: [0; 128] };
    for w in 0..8 {
        for (r, row) in rows.iter().enumerate() {
            x.qs[16 * w + 4 * r..16 * w + 4 * r + 4].copy_from_slice(&row.qs[4 * w..4 * w + 4]);
        }
    }
    x
}

/// The four Q8_0 blocks `x` was made from.
pub fn deinterleave(x: &BlockQ8_0x4) -> [BlockQ8_0; 4] {
    std::array::from_fn(|r| {
        let mut b = BlockQ8_0 { d: x.d[r], qs: [0; 32] };
        for w in 0..8 {
            b.qs[4 * w..4 * w + 4].copy_from_slice(&x.qs[16 * w + 4 * r..16 * w + 4 * r + 4]);
        }
        b
    })
}

/// Four rows (`rows`, each `blocks` Q8_0 blocks) into `out`
/// ([`bytes_for`]`(blocks)` bytes), block by block.
pub fn interleave_rows(rows: [&[u8]; 4], out: &mut [u8]) {
    let x = rows.map(as_blocks::<BlockQ8_0>);
    let n = x[0].len();
    assert!(x.iter().all(|r| r.len() == n) && out.len() == bytes_for(n), "interleave_rows: mismatched lengths");
    for (b, o) in out.chunks_exact_mut(size_of::<BlockQ8_0x4>()).enumerate() {
        o.copy_from_slice(block_bytes(&interleave(x.map(|r| &r[b]))));
    }
}

/// Four interleaved rows (`x`, [`bytes_for`]`(blocks)` bytes) back into
/// four rows laid out plainly (`rows`, each `blocks` Q8_0 blocks).
pub fn deinterleave_rows(x: &[u8], mut rows: [&mut [u8]; 4]) {
    let size = size_of::<BlockQ8_0>();
    for (b, xb) in as_blocks::<BlockQ8_0x4>(x).iter().enumerate() {
        for (row, blk) in rows.iter_mut().zip(deinterleave(xb)) {
            row[b * size..(b + 1) * size].copy_from_slice(block_bytes(&blk));
        }
    }
}

/// The products of four interleaved rows (`w`: their blocks) with one row of
/// Q8_0 activations, each row as [`super::q8_0::vec_dot`] forms it (the
/// scalar twin of the vector kernels).
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0F]) -> [f32; 4] {
    let x = as_blocks::<BlockQ8_0x4>(w);
    assert_eq!(x.len(), a.len(), "vec_dot: activations of another length");
    let mut rows = [const { Vec::new() }; 4];
    for xb in x {
        for (row, b) in rows.iter_mut().zip(deinterleave(xb)) {
            row.extend_from_slice(block_bytes(&b));
        }
    }
    rows.map(|row| super::q8_0::vec_dot(&row, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{random_weights, Rng};
    use crate::quant::GgmlType;

    #[test]
    fn interleave_round_trips_every_block() {
        let mut rng = Rng::new(7);
        let rb = 3 * size_of::<BlockQ8_0>();
        let w = random_weights(GgmlType::Q8_0, 4, 96, &mut rng);
        let rows: [&[u8]; 4] = std::array::from_fn(|r| &w[r * rb..(r + 1) * rb]);
        let mut x = vec![0u8; bytes_for(3)];
        interleave_rows(rows, &mut x);
        let mut back = vec![0u8; 4 * rb];
        let mut parts = back.chunks_exact_mut(rb);
        deinterleave_rows(&x, [(); 4].map(|_| parts.next().expect("four rows")));
        assert_eq!(back, w);
        // Value 4w + t of row r at 16w + 4r + t.
        let xb = &as_blocks::<BlockQ8_0x4>(&x)[2];
        assert_eq!(xb.qs[16 * 5 + 4 * 3 + 1], as_blocks::<BlockQ8_0>(rows[3])[2].qs[4 * 5 + 1]);
    }
}
