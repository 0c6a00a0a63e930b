//! The point sets ("grids") of the IQ1/IQ2/IQ3 formats in the form their
//! quantisers search them, and llama.cpp's neighbour lists for the points
//! that are not in a set (`iq2xs_init_impl`, `iq3xs_init_impl`).
//!
//! A point is `D` levels (`0..=top`: 3 levels for IQ1/IQ2, 8 for IQ3),
//! derived from the dequantisation grids of [`crate::quant`] by ranking each
//! grid's distinct values; the key of a point packs its levels, `bits` per
//! level, level `i` at bits `bits * i`. Every key whose levels are in range
//! but that is not a grid point lists its nearest grid points: all points
//! within the `rings` smallest distinct squared distances, ordered by
//! (distance, index) as llama.cpp's `qsort` leaves them. The tables are built
//! once per format, on first use.

use crate::quant::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use crate::quant::{iq3_s, iq3_xxs};
use std::sync::OnceLock;

/// Odd levels: the magnitude `2l + 1` that level `l` of an IQ2/IQ3 point
/// stands for, in units of the scale.
pub(super) const ODD: [f32; 8] = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0];

#[derive(Clone, Copy)]
enum Slot {
    /// The key is grid point `i`.
    Point(u16),
    /// The key is off the grid: its neighbours are `neighbours[start..end]`.
    Near { start: u32, end: u32 },
}

pub(super) struct Lattice<const D: usize> {
    points: Vec<[u8; D]>,
    bits: u32,
    top: u8,
    slots: Vec<Slot>,
    neighbours: Vec<u16>,
}

impl<const D: usize> Lattice<D> {
    /// The lattice of a dequantisation grid (`D` bytes a point), with
    /// neighbour lists `rings` distances deep.
    fn new(grid: impl Iterator<Item = [u8; D]>, bits: u32, rings: usize) -> Lattice<D> {
        let raw: Vec<[u8; D]> = grid.collect();
        // Rank the distinct values (signed: IQ1's are -1, 0, 1) as levels.
        let mut values: Vec<i8> = raw.iter().flatten().map(|&b| b as i8).collect();
        values.sort_unstable();
        values.dedup();
        let level = |b: u8| values.binary_search(&(b as i8)).unwrap() as u8;
        let points: Vec<[u8; D]> = raw.iter().map(|p| p.map(level)).collect();
        let top = (values.len() - 1) as u8;

        let mut lattice = Lattice { points, bits, top, slots: Vec::new(), neighbours: Vec::new() };
        let mut slots = vec![Slot::Near { start: 0, end: 0 }; 1 << (bits * D as u32)];
        for (i, p) in lattice.points.iter().enumerate() {
            slots[lattice.key(p)] = Slot::Point(i as u16);
        }
        let mut dist = vec![0u32; lattice.points.len()];
        let mut near: Vec<u16> = Vec::new();
        for (key, slot) in slots.iter_mut().enumerate() {
            let pos: [u8; D] = std::array::from_fn(|i| ((key >> (bits as usize * i)) & ((1 << bits) - 1)) as u8);
            if matches!(slot, Slot::Point(_)) || pos.iter().any(|&l| l > top) {
                continue;
            }
            for (d, p) in dist.iter_mut().zip(&lattice.points) {
                *d = p.iter().zip(&pos).map(|(&a, &b)| (a as i32 - b as i32).pow(2) as u32).sum();
            }
            // The `rings` smallest distinct distances.
            let mut radii: Vec<u32> = Vec::with_capacity(rings + 1);
            for &d in &dist {
                if let Err(at) = radii.binary_search(&d) {
                    if at < rings {
                        radii.insert(at, d);
                        radii.truncate(rings);
                    }
                }
            }
            let radius = *radii.last().unwrap();
            near.clear();
            near.extend((0..dist.len() as u16).filter(|&j| dist[j as usize] <= radius));
            near.sort_by_key(|&j| dist[j as usize]); // stable: ties stay by index
            let start = lattice.neighbours.len() as u32;
            lattice.neighbours.extend_from_slice(&near);
            *slot = Slot::Near { start, end: lattice.neighbours.len() as u32 };
        }
        lattice.slots = slots;
        lattice
    }

    fn key(&self, levels: &[u8]) -> usize {
        levels.iter().enumerate().map(|(i, &l)| (l as usize) << (self.bits as usize * i)).sum()
    }

    /// The highest level (2 for IQ1/IQ2, 7 for IQ3).
    pub(super) fn top_level(&self) -> u8 {
        self.top
    }

    pub(super) fn levels(&self, index: u16) -> &[u8; D] {
        &self.points[index as usize]
    }

    /// The grid index of `levels`, or the nearest grid points' indices.
    pub(super) fn find(&self, levels: &[u8]) -> Result<u16, &[u16]> {
        match self.slots[self.key(levels)] {
            Slot::Point(i) => Ok(i),
            Slot::Near { start, end } => Err(&self.neighbours[start as usize..end as usize]),
        }
    }

    /// Of `candidates`, the point whose values `scale * value[level]` are
    /// nearest `x` by the `w`-weighted squared distance (first of equals);
    /// llama.cpp's `iq*_find_best_neighbour`. If no distance is below
    /// `f32::MAX` (overflow), the whole grid is searched, then the first
    /// candidate taken: there llama.cpp aborts (IQ2/IQ3) or reads past its
    /// 8 weights (IQ1), so no byte-equal answer exists.
    pub(super) fn closest(&self, candidates: &[u16], x: &[f32], w: &[f32], scale: f32, value: &[f32]) -> u16 {
        let distance = |j: u16| {
            let mut d2 = 0.0f32;
            for ((&l, &xi), &wi) in self.points[j as usize].iter().zip(x).zip(w) {
                let diff = scale * value[l as usize] - xi;
                d2 += wi * diff * diff;
            }
            d2
        };
        let nearest = |it: &mut dyn Iterator<Item = u16>| {
            let mut best = (f32::MAX, None);
            for j in it {
                let d2 = distance(j);
                if d2 < best.0 {
                    best = (d2, Some(j));
                }
            }
            best.1
        };
        nearest(&mut candidates.iter().copied())
            .or_else(|| nearest(&mut (0..self.points.len() as u16)))
            .unwrap_or(candidates[0])
    }

    /// Put the point with odd `levels` (magnitudes `xval` at `scale`) on the
    /// grid: unchanged if it is a grid point, else moved to its nearest
    /// listed neighbour. Returns the grid index and whether it moved.
    pub(super) fn place(&self, levels: &mut [u8], xval: &[f32], w: &[f32], scale: f32) -> (u16, bool) {
        match self.find(levels) {
            Ok(i) => (i, false),
            Err(near) => {
                let i = self.closest(near, xval, w, scale, &ODD);
                levels.copy_from_slice(self.levels(i));
                (i, true)
            }
        }
    }
}

fn lazy<const D: usize>(cell: &'static OnceLock<Lattice<D>>, build: fn() -> Lattice<D>) -> &'static Lattice<D> {
    cell.get_or_init(build)
}

/// IQ2_XXS: 256 points, neighbours 2 distances deep.
pub(super) fn iq2_xxs() -> &'static Lattice<8> {
    static CELL: OnceLock<Lattice<8>> = OnceLock::new();
    lazy(&CELL, || Lattice::new(IQ2XXS_GRID.iter().map(|g| g.to_le_bytes()), 2, 2))
}

/// IQ2_XS: 512 points, 2 deep.
pub(super) fn iq2_xs() -> &'static Lattice<8> {
    static CELL: OnceLock<Lattice<8>> = OnceLock::new();
    lazy(&CELL, || Lattice::new(IQ2XS_GRID.iter().map(|g| g.to_le_bytes()), 2, 2))
}

/// IQ2_S: 1024 points, 1 deep.
pub(super) fn iq2_s() -> &'static Lattice<8> {
    static CELL: OnceLock<Lattice<8>> = OnceLock::new();
    lazy(&CELL, || Lattice::new(IQ2S_GRID.iter().map(|g| g.to_le_bytes()), 2, 1))
}

/// IQ1_S and IQ1_M: 2048 points of -1/0/+1 (levels 0, 1, 2), 3 deep.
pub(super) fn iq1() -> &'static Lattice<8> {
    static CELL: OnceLock<Lattice<8>> = OnceLock::new();
    lazy(&CELL, || Lattice::new(IQ1S_GRID.iter().map(|g| g.to_le_bytes()), 2, 3))
}

/// IQ3_XXS: 256 points of 4, 3 bits a level, 2 deep.
pub(super) fn iq3_xxs() -> &'static Lattice<4> {
    static CELL: OnceLock<Lattice<4>> = OnceLock::new();
    lazy(&CELL, || Lattice::new(iq3_xxs::GRID.iter().map(|g| g.to_le_bytes()), 3, 2))
}

/// IQ3_S: 512 points of 4, 3 deep.
pub(super) fn iq3_s() -> &'static Lattice<4> {
    static CELL: OnceLock<Lattice<4>> = OnceLock::new();
    lazy(&CELL, || Lattice::new(iq3_s::GRID.iter().map(|g| g.to_le_bytes()), 3, 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of the points in order, as llama.cpp's `kgrid_*` tables
    /// list them: first entries, last entries and a position-weighted sum
    /// of all (from ggml-quants.c at the pinned commit).
    fn check<const D: usize>(l: &Lattice<D>, first: [usize; 6], last: [usize; 2], weighted: u64) {
        let keys: Vec<usize> = l.points.iter().map(|p| l.key(p)).collect();
        assert_eq!(keys[..6], first);
        assert_eq!(keys[keys.len() - 2..], last);
        assert_eq!(keys.iter().enumerate().map(|(i, &k)| (i as u64 + 1) * k as u64).sum::<u64>(), weighted);
    }

    #[test]
    fn lattices_are_llama_cpps_kgrids() {
        check(iq2_xxs(), [0, 2, 5, 8, 10, 17], [43088, 43268], 711230818);
        check(iq2_xs(), [0, 2, 5, 8, 10, 17], [43665, 43690], 3063311876);
        check(iq2_s(), [0, 2, 5, 8, 10, 17], [43656, 43690], 12275367849);
        check(iq1(), [0, 2, 5, 8, 10, 17], [43688, 43690], 61384112667);
        check(iq3_xxs(), [0, 2, 4, 9, 11, 15], [3924, 3992], 71784388);
        check(iq3_s(), [0, 1, 2, 5, 7, 8], [3993, 4032], 282122336);
    }

    fn dist(p: &[u8; 8], q: &[u8; 8]) -> i32 {
        p.iter().zip(q).map(|(&a, &b)| (a as i32 - b as i32).pow(2)).sum()
    }

    #[test]
    fn neighbours_are_the_nearest_rings() {
        // An off-grid key of IQ2_S lists exactly the points at its smallest
        // distance, in index order.
        let l = iq2_s();
        let levels = [1u8, 1, 1, 1, 1, 1, 1, 0];
        let near = l.find(&levels).unwrap_err();
        let best = l.points.iter().map(|p| dist(p, &levels)).min().unwrap();
        let want: Vec<u16> = (0..l.points.len() as u16).filter(|&i| dist(l.levels(i), &levels) == best).collect();
        assert_eq!(near, &want[..]);
        // IQ1's lists reach 3 distances, nearest first, ties by index.
        let l = iq1();
        let mut off = 0;
        for key in (0..1usize << 16).step_by(97) {
            let levels: [u8; 8] = std::array::from_fn(|i| (key >> (2 * i) & 3) as u8);
            if levels.iter().any(|&v| v > 2) {
                continue;
            }
            let Err(near) = l.find(&levels) else { continue };
            off += 1;
            let d: Vec<(i32, u16)> = near.iter().map(|&i| (dist(l.levels(i), &levels), i)).collect();
            assert!(d.windows(2).all(|w| w[0] < w[1]));
            let mut radii: Vec<i32> = d.iter().map(|p| p.0).collect();
            radii.dedup();
            assert_eq!(radii.len(), 3);
            let outside = (0..l.points.len() as u16).filter(|i| !near.contains(i));
            assert!(outside.map(|i| dist(l.levels(i), &levels)).all(|r| r > radii[2]));
        }
        assert!(off > 0);
    }
}
