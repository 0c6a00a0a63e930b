//! The matmul driver: splits `weights x activations` into tiles and runs the
//! table's dot products on them over the thread pool.
//!
//! A tile is a range of weight rows times a range of activation rows. Tiles
//! are handed out dynamically (an atomic counter), so a slow or busy core does
//! not hold the others up. Inside a tile, a few weight rows are dotted with a
//! group of activation rows while both stay in L1/L2, so prefill reads each
//! weight byte from memory once; where the path has a 2x2 kernel (`smmla`),
//! pairs of weight rows meet pairs of activation rows in registers.

use super::table::{decoded_buffer, Acts, Decoded, Dot, Exact, ExactDot, Kernels, Multi, Panels, RowDot, Rows, X4Rows};
use super::{ActFormat, Layout, QActs, QMatrix};
use crate::quant::GgmlType;
use crate::threads::ThreadPool;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Below this much work (weight bytes x activation rows) the caller does it
/// alone: waking the pool would cost more than it saves.
const SMALL_WORK: usize = 64 << 10;
/// Weight bytes per tile: a chunk that stays in L1/L2 while activations pass.
const TILE_WEIGHT_BYTES: usize = 16 << 10;
/// Weight bytes per tile when every weight row is used in one pass (decode):
/// enough that handing tiles out costs nothing (measured on a 178 MB Q8_0
/// head, 2 threads: 12.5-14 GB/s with 16 KiB tiles, 16.4-19 with 256 KiB).
const ONE_PASS_TILE_BYTES: usize = 256 << 10;
/// Activation rows per pass over a tile's weight rows.
const ACT_GROUP: usize = 32;
/// Up to this many activation rows meet interleaved rows of type `ty` by the
/// interleaved kernel, one row after another, rather than through the rows
/// laid out plainly again: that costs about as much as seven rows' products
/// for Q4_K and Q8_0 (mostly copies), several times more for Q6_K (every
/// value unpacked and packed again). Measured on mid Q4_K_M's 16-token
/// prompt: Q6_K at 32 saves 2.5 % of the run against 8; Q4_K at 16 or 32
/// costs 4 % more than at 8.
fn x4_acts(ty: GgmlType) -> usize {
    if ty == GgmlType::Q6K {
        32
    } else {
        8
    }
}
/// Up to this many activation rows meet an expert's interleaved copy where
/// the mapped file's rows could go through the panels instead (nothing laid
/// out again). Measured on mid Q4_K_M's prompts, marginal instructions a
/// token at `-p 16` / `-p 64` (qemu): the experts' file rows from 4
/// activation rows on, 50.4 / 29.2 M; the copy up to 8 (Q4_K) and 32 (Q6_K)
/// rows, 44.3 / 33.0 M; up to 6 both, 44.5 / 30.5 M; **up to 8 and 4, 45.0 /
/// 30.2 M**; no copies, 45.1 / 29.1 M.
pub fn expert_x4_acts(ty: GgmlType) -> usize {
    if ty == GgmlType::Q6K {
        4
    } else {
        8
    }
}

/// Aim for at least this many tiles per thread, for balance.
const TILES_PER_THREAD: usize = 4;

thread_local! {
    /// Each thread's buffer of decoded weight rows (grown once, then reused).
    static DECODED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// Each thread's buffer of interleaved rows laid out plainly again.
    static PLAIN: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

impl Kernels {
    /// [`super::matmul`] on this path.
    pub fn matmul(&self, pool: &ThreadPool, w: &QMatrix, x: &QActs, out: &mut [f32]) {
        self.run(pool, w, x, None, out)
    }

    /// [`super::matmul_rows`] on this path.
    pub fn matmul_rows(&self, pool: &ThreadPool, w: &QMatrix, x: &QActs, rows: &[usize], out: &mut [f32]) {
        self.run(pool, w, x, Some(rows), out)
    }

    /// Several products in one pass over the pool: their tiles share one
    /// counter, so the threads meet once instead of once per product (the
    /// experts of a MoE layer during decode).
    pub fn matmul_batch(&self, pool: &ThreadPool, jobs: &mut [super::MatJob<'_>]) {
        let work_bytes: usize = jobs.iter().map(|j| j.w.data.len() * j.rows.map_or(j.x.n, <[usize]>::len)).sum();
        let mut runners: Vec<Box<dyn Runner + '_>> = Vec::with_capacity(jobs.len());
        for j in jobs.iter_mut() {
            if let Some(r) = self.runner(pool, &j.w, j.x, j.rows, &mut *j.out) {
                runners.push(r);
            }
        }
        drive(pool, &runners, work_bytes);
    }

    /// A product ready to run tile by tile (`None` when it is empty).
    fn runner<'a>(
        &self,
        pool: &ThreadPool,
        w: &'a QMatrix<'a>,
        x: &'a QActs,
        rows: Option<&'a [usize]>,
        out: &'a mut [f32],
    ) -> Option<Box<dyn Runner + 'a>> {
        let n = self.check(w, x, rows, out);
        if n == 0 || w.rows == 0 {
            return None;
        }
        let threads = pool.n_threads();
        // One-row mode: every product as decoding computes it, to the bit.
        let exact = if pool.one_row() { self.exact_dot(w.ty) } else { None };
        // Interleaved rows meet the interleaved kernel, one activation row
        // after another, in one-row mode and for few activation rows; else
        // every tile of the product lays its rows out plainly again.
        let by_x4 = w.layout == Layout::X4 && (pool.one_row() || n <= x4_acts(w.ty));
        let plan = if pool.one_row() {
            // The weight rows tiled as for one activation row; each tile runs
            // all the activation rows with the exact kernels where the type
            // has them, else one row at a time with the decode kernels.
            let acts_per_tile = if exact.is_some() { n } else { 1 };
            Plan { n, acts_per_tile, ..Plan::new(threads, w, 1, self.panel_rows(w, 1)) }
        } else {
            Plan::new(threads, w, n, self.panel_rows(w, n))
        };
        let out = Out(out.as_mut_ptr());
        let (k, row_bytes) = (x.k, w.row_bytes());
        Some(match (self.row_dot(w.ty).expect("a supported type has kernels"), exact) {
            (RowDot::Q8_0(dot), e) => {
                let exact = if let Some(ExactDot::Q8_0(e)) = e { Some(e) } else { None };
                let x4 = if by_x4 { self.x4_q8_0() } else { None };
                Box::new((plan, Job { x4, ..Job::new(w, row_bytes, &x.q8_0, k / 32, rows, dot, exact, out) }))
            }
            (RowDot::Q8_1(dot), e) => {
                let exact = if let Some(ExactDot::Q8_1(e)) = e { Some(e) } else { None };
                Box::new((plan, Job::new(w, row_bytes, &x.q8_1, k / 32, rows, dot, exact, out)))
            }
            (RowDot::Q8K(dot), e) => {
                let exact = if let Some(ExactDot::Q8K(e)) = e { Some(e) } else { None };
                let x4 = if by_x4 { self.x4(w.ty) } else { None };
                Box::new((plan, Job { x4, ..Job::new(w, row_bytes, &x.q8k, k / 256, rows, dot, exact, out) }))
            }
            (RowDot::F32(dot), _) => Box::new((plan, Job::new(w, row_bytes, &x.f32, k, rows, dot, None, out))),
        })
    }

    /// Whether `n` activation rows over `rows` weight rows of type `ty`, laid
    /// out as the file holds them, would go through the path's panels (not
    /// in one-row mode, where every row is decoded alone): where a matrix is
    /// held both ways (mapped, and interleaved), the file's rows then serve
    /// the product better than interleaved ones, which the driver would
    /// lay out again.
    pub fn takes_panels(&self, ty: GgmlType, rows: usize, n: usize) -> bool {
        self.panel_height(ty, rows, n).is_some()
    }

    /// The height of the path's panels for `n` activation rows over `rows`
    /// weight rows of type `ty`, where the product goes through them.
    fn panel_height(&self, ty: GgmlType, rows: usize, n: usize) -> Option<usize> {
        let (height, min_acts) = match self.row_dot(ty)? {
            RowDot::Q8_0(d) => d.panels.map(|p| (p.height, p.min_acts)),
            RowDot::Q8_1(d) => d.panels.map(|p| (p.height, p.min_acts)),
            RowDot::Q8K(d) => d.panels.map(|p| (p.height, p.min_acts)),
            RowDot::F32(d) => d.panels.map(|p| (p.height, p.min_acts)),
        }?;
        (n >= min_acts && rows >= height).then_some(height)
    }

    /// The rows of a decoded panel if `n` activation rows of a product over
    /// `w` would use the path's panels, else 1: tiles then hold whole panels.
    fn panel_rows(&self, w: &QMatrix, n: usize) -> usize {
        let rows = self.panel_height(w.ty, w.rows, n).unwrap_or(1);
        // Tiles of interleaved rows hold whole groups of four.
        if w.layout == Layout::X4 {
            rows * 4 / gcd(rows, 4)
        } else {
            rows
        }
    }

    /// Validate a product's operands; returns its activation row count.
    fn check(&self, w: &QMatrix, x: &QActs, rows: Option<&[usize]>, out: &[f32]) -> usize {
        let n = rows.map_or(x.n, <[usize]>::len);
        assert_eq!(x.k, w.cols, "matmul: activations have {} columns, weights {}", x.k, w.cols);
        assert!(out.len() >= n * w.rows, "matmul: output holds {} values, needs {}", out.len(), n * w.rows);
        let fmt = ActFormat::for_weights(w.ty);
        assert!(x.fmt == fmt, "matmul: activations quantised as {:?}, {} weights need {fmt:?}", x.fmt, w.ty);
        if let Some(rows) = rows {
            assert!(rows.iter().all(|&i| i < x.n), "matmul_rows: row index out of range (n = {})", x.n);
        }
        n
    }

    fn run(&self, pool: &ThreadPool, w: &QMatrix, x: &QActs, rows: Option<&[usize]>, out: &mut [f32]) {
        let work_bytes = w.data.len() * rows.map_or(x.n, <[usize]>::len);
        if let Some(r) = self.runner(pool, w, x, rows, out) {
            drive(pool, &[r], work_bytes);
        }
    }
}

/// Claim the next tile before running the current one (so that its weights
/// come from memory while this one computes) only while this many tiles per
/// thread are still unclaimed: a claimed tile waits for its thread, and near
/// the end another thread could have run it.
const CLAIM_AHEAD_SPARE: usize = 2;

/// Run every tile of `runners` (one counter for all: the threads meet once),
/// on the pool unless the work is small (`work_bytes`: weight bytes times
/// activation rows) or there is one tile. Each thread claims its next tile
/// while it still has one to run and hands the next one's weights to the
/// current tile to prefetch: a prompt's weights (every expert's, once) then
/// stream from memory during the products instead of stalling the decoding.
fn drive(pool: &ThreadPool, runners: &[Box<dyn Runner + '_>], work_bytes: usize) {
    let total: usize = runners.iter().map(|r| r.tiles()).sum();
    let threads = if work_bytes < SMALL_WORK || total <= 1 { 1 } else { pool.n_threads() };
    let next = AtomicUsize::new(0);
    let work = |_ith: usize, _nth: usize| {
        let claim = || next.fetch_add(1, Ordering::Relaxed);
        // Tile indices run through the jobs in order; a thread's claims only
        // grow, so its cursor (job, first tile of the job) only moves on.
        let (mut job, mut base) = (0usize, 0usize);
        let mut t = claim();
        while t < total {
            let ahead = (next.load(Ordering::Relaxed) + CLAIM_AHEAD_SPARE * threads < total).then(claim);
            locate(runners, t, &mut job, &mut base);
            let ahead_weights = match ahead {
                Some(u) if u < total => {
                    let (mut j, mut b) = (job, base);
                    locate(runners, u, &mut j, &mut b);
                    runners[j].weights(u - b)
                }
                _ => &[],
            };
            crate::threads::piece();
            runners[job].tile(t - base, ahead_weights);
            t = ahead.unwrap_or_else(claim);
        }
    };
    if threads == 1 {
        work(0, 1);
    } else {
        pool.run(&work);
    }
}

/// Move the cursor `(job, base)` (a job and its first tile) on to the job
/// holding tile `t`.
fn locate(runners: &[Box<dyn Runner + '_>], t: usize, job: &mut usize, base: &mut usize) {
    while t >= *base + runners[*job].tiles() {
        *base += runners[*job].tiles();
        *job += 1;
    }
}

/// The output, written through a raw pointer: every `(act row, weight row)`
/// element is written by exactly one tile.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: tiles write disjoint elements, and `run` returns only after all have finished.
unsafe impl Sync for Out {}
unsafe impl Send for Out {}

/// One matmul: weights, activations of block type `B`, kernels, output.
struct Job<'a, B: 'static> {
    w: &'a QMatrix<'a>,
    /// The bytes the tiles read weight rows from: `w`'s, or (interleaved
    /// rows laid out plainly for the kernels that take rows) a tile's rows,
    /// the first of them row `row0`.
    data: &'a [u8],
    row0: usize,
    /// The kernel of four interleaved rows with one activation row, where
    /// the rows are interleaved and the path has it.
    x4: Option<X4Rows<B>>,
    /// Bytes per weight row, and per group of four interleaved rows: nonzero
    /// where `data` holds rows interleaved by four ([`Layout::X4`]); both
    /// computed once (`QMatrix` looks the type up).
    row_bytes: usize,
    group_bytes: usize,
    acts: &'a [B],
    /// Blocks (or f32 values) per activation row.
    per_row: usize,
    rows: Option<&'a [usize]>,
    dot: Dot<B>,
    /// The exact kernels, in one-row mode where the type has them: then
    /// they run every tile.
    exact: Option<Exact<B>>,
    out: Out,
}

impl<'a, B: 'static> Job<'a, B> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        w: &'a QMatrix<'a>,
        row_bytes: usize,
        acts: &'a [B],
        per_row: usize,
        rows: Option<&'a [usize]>,
        dot: Dot<B>,
        exact: Option<Exact<B>>,
        out: Out,
    ) -> Self {
        let group_bytes = if w.layout == Layout::X4 { w.group_bytes() } else { 0 };
        Job { w, data: w.data, row0: 0, x4: None, row_bytes, group_bytes, acts, per_row, rows, dot, exact, out }
    }

    /// Weight row `r` (of rows laid out plainly).
    #[inline]
    fn wrow(&self, r: usize) -> &[u8] {
        let r = r - self.row0;
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Weight rows `r0..r1` (of rows laid out plainly).
    #[inline]
    fn wrows(&self, r0: usize, r1: usize) -> &[u8] {
        &self.data[(r0 - self.row0) * self.row_bytes..(r1 - self.row0) * self.row_bytes]
    }

    /// A tile of interleaved rows: four rows at a time by the interleaved
    /// kernel, one activation row after another (a verify pass's products
    /// are then its rows' decoded ones), where the product takes that way
    /// (`x4`: one-row mode, up to [`x4_acts`] activation rows); else the
    /// rows laid out plainly again, once per tile, for the kernels that take
    /// many activation rows (panels).
    fn interleaved_tile(&self, r0: usize, r1: usize, j0: usize, j1: usize, ahead: &[u8]) {
        if let Some(x4) = self.x4 {
            let gb = self.group_bytes;
            let w = &self.data[r0 / 4 * gb..r1 / 4 * gb];
            for j in j0..j1 {
                // SAFETY: a kernel of this CPU's path; whole groups of blocks
                // (tiles of interleaved rows hold whole groups); this tile
                // alone writes these outputs.
                unsafe { x4(w, gb, self.act(j), self.out_row(j, r0, r1)) };
            }
            return;
        }
        PLAIN.with_borrow_mut(|buf| {
            let plain = decoded_buffer(buf, (r1 - r0) * self.row_bytes);
            let gb = self.group_bytes;
            let groups = self.data[r0 / 4 * gb..r1 / 4 * gb].chunks_exact(gb);
            for (x, rows) in groups.zip(plain.chunks_exact_mut(4 * self.row_bytes)) {
                let mut r = rows.chunks_exact_mut(self.row_bytes);
                let four = std::array::from_fn(|_| r.next().expect("four rows a group"));
                crate::quant::x4::deinterleave_rows(self.w.ty, x, four);
            }
            let plain = Job { data: &*plain, row0: r0, group_bytes: 0, x4: None, ..*self };
            plain.tile(r0, r1, j0, j1, ahead);
        })
    }

    /// Activation row `j` of this product (`rows[j]` of the buffer, if given).
    fn act(&self, j: usize) -> &[B] {
        let i = self.rows.map_or(j, |r| r[j]);
        &self.acts[i * self.per_row..(i + 1) * self.per_row]
    }

    /// Where the output of activation row `j` and weight row `r` goes.
    fn out_at(&self, j: usize, r: usize) -> *mut f32 {
        self.out.0.wrapping_add(j * self.w.rows + r)
    }

    fn store(&self, j: usize, r: usize, v: f32) {
        // SAFETY: `j < n` and `r < rows` (tile bounds), `out` holds `n * rows`
        // values, and no other tile writes this element.
        unsafe { *self.out_at(j, r) = v }
    }

    /// Weight row `r` against activation rows `j..j + N`.
    fn store_n<const N: usize>(&self, j: usize, r: usize, v: [f32; N]) {
        for (i, vi) in v.into_iter().enumerate() {
            self.store(j + i, r, vi);
        }
    }

    /// The outputs of activation row `j` for weight rows `r0..r1`.
    #[allow(clippy::mut_from_ref)]
    fn out_row(&self, j: usize, r0: usize, r1: usize) -> &mut [f32] {
        // SAFETY: in bounds as for `store`; this tile alone writes these
        // elements, and the slice lives only for one kernel call.
        unsafe { std::slice::from_raw_parts_mut(self.out_at(j, r0), r1 - r0) }
    }

    /// Weight rows `r0..r1` times activation rows `j0..j1`; `ahead`: the
    /// weights of this thread's next tile, to prefetch (panel tiles in
    /// shares beside their products; other prompt tiles at their start, if
    /// the next tile is cache-sized, as a panel tile is).
    fn tile(&self, r0: usize, r1: usize, j0: usize, j1: usize, ahead: &[u8]) {
        if self.group_bytes != 0 {
            return self.interleaved_tile(r0, r1, j0, j1, ahead);
        }
        if let Some(e) = self.exact {
            return self.exact_tile(e, r0, r1, j0, j1);
        }
        if let Some(p) = self.dot.panels {
            if j1 - j0 >= p.min_acts && r1 - r0 >= p.height {
                return self.panels_tile(p, r0, r1, j0, j1, ahead);
            }
        }
        // In a prompt, the next tile may be a panel tile (another expert's,
        // where experts meet few tokens each), whose decoding would otherwise
        // wait on its weights: ask for them now, if they are a cache-sized
        // tile's (not a burst that would fill the memory queues). Not in
        // decode (one activation row): there the hardware prefetcher streams
        // the weights. (This tile's kernels prefetch their own weights.) 30B
        // geometry, 128 tokens spread over 128 experts: 3 of 3 alternating
        // runs faster, by 2-5 %.
        if j1 - j0 > 1 && ahead.len() <= 2 * TILE_WEIGHT_BYTES {
            Prefetch::new(ahead, 1).share();
        }
        match self.dot.multi {
            Multi::Acts(Acts { decoded: Some(dec), .. }) if j1 - j0 >= dec.min_acts => {
                DECODED.with_borrow_mut(|buf| {
                    // The tile's weight rows decoded once, for all its activation rows.
                    let row_bytes = self.per_row * dec.block_bytes;
                    let rows = decoded_buffer(buf, (r1 - r0) * row_bytes);
                    for (r, out) in (r0..r1).zip(rows.chunks_exact_mut(row_bytes)) {
                        // SAFETY: a kernel of this CPU's path; one block out per weight block.
                        unsafe { (dec.decode)(self.wrow(r), out) };
                    }
                    self.tile_with(r0, r1, j0, j1, Some((dec, &*rows)));
                })
            }
            // One rows-kernel call per activation row (decode, and every
            // format without a multi-row kernel), without the set-up of the
            // other paths.
            Multi::None => match self.dot.rows {
                Some(rows) if r1 - r0 > 1 => self.rows_tile(rows, r0, r1, j0, j1),
                _ => self.tile_with(r0, r1, j0, j1, None),
            },
            _ => self.tile_with(r0, r1, j0, j1, None),
        }
    }

    /// Weight rows `r0..r1` (at least a panel) times activation rows
    /// `j0..j1`: the rows decoded a panel at a time, once, then every panel
    /// with a few activation rows per call; rows left over (less than a
    /// panel) by the rows kernel. `ahead` (the next tile's weights) is
    /// prefetched a share before each product call.
    fn panels_tile(&self, p: Panels<B>, r0: usize, r1: usize, j0: usize, j1: usize, ahead: &[u8]) {
        const MAX_ROWS: usize = 16;
        const MAX_ACTS: usize = 8;
        assert!(p.height <= MAX_ROWS && p.acts <= MAX_ACTS, "panels of {}x{}", p.height, p.acts);
        let (h, n_panels) = (p.height, (r1 - r0) / p.height);
        let panel_bytes = self.per_row * p.block_bytes;
        DECODED.with_borrow_mut(|buf| {
            let dec = decoded_buffer(buf, n_panels * panel_bytes);
            for (i, d) in dec.chunks_exact_mut(panel_bytes).enumerate() {
                let rows: [&[u8]; MAX_ROWS] = std::array::from_fn(|k| self.wrow(r0 + h * i + k.min(h - 1)));
                // SAFETY: a kernel of this CPU's path; whole blocks in, one
                // decoded block out per `h` weight blocks.
                unsafe { (p.decode)(&rows[..h], d) };
            }
            // Passes of nearly equal size (12 tokens as 6 + 6, not 8 + 4): a
            // pass's tokens are its independent chains of multiply-adds, so a
            // pass of one or two tokens waits on their latency, and it streams
            // the whole decoded panel again for them.
            let passes = (j1 - j0).div_ceil(p.acts);
            let per_pass = (j1 - j0).div_ceil(passes);
            let mut prefetch = Prefetch::new(ahead, passes * n_panels);
            for j in (j0..j1).step_by(per_pass) {
                let je = (j + per_pass).min(j1);
                let acts: [&[B]; MAX_ACTS] = std::array::from_fn(|t| self.act((j + t).min(je - 1)));
                for (i, d) in dec.chunks_exact(panel_bytes).enumerate() {
                    prefetch.share();
                    // SAFETY: as above; activation rows match the weights
                    // (checked in `run`); the kernel writes the panel's `h`
                    // outputs of activation rows `j..je`, which this tile
                    // alone owns.
                    unsafe { (p.dot)(d, &acts[..je - j], self.out_at(j, r0 + h * i), self.w.rows) };
                }
            }
        });
        let rest = r0 + h * n_panels;
        if rest < r1 {
            self.tile_with(rest, r1, j0, j1, None);
        }
    }

    /// Weight rows `r0..r1` times activation rows `j0..j1` with the exact
    /// kernels, as many activation rows per pass over the weights as they
    /// take (the tile's weights stay in L2 for the passes after the first).
    fn exact_tile(&self, e: Exact<B>, r0: usize, r1: usize, j0: usize, j1: usize) {
        const MAX_ACTS: usize = 8;
        assert!(e.acts <= MAX_ACTS, "exact kernels of {} activation rows", e.acts);
        let w = self.wrows(r0, r1);
        // Passes of nearly equal size (9 rows as 3 + 3 + 3, not 4 + 4 + 1): a
        // pass of one row repeats the weights' unpacking for one product.
        let passes = (j1 - j0).div_ceil(e.acts);
        let per_pass = (j1 - j0).div_ceil(passes);
        for j in (j0..j1).step_by(per_pass) {
            let je = (j + per_pass).min(j1);
            let acts: [&[B]; MAX_ACTS] = std::array::from_fn(|t| self.act((j + t).min(je - 1)));
            // SAFETY: the table holds only kernels this CPU has; row and
            // activation lengths match (checked in `run`); the kernel writes
            // the outputs of weight rows `r0..r1` with activation rows
            // `j..je`, which this tile alone owns.
            unsafe { (e.rows)(w, self.row_bytes, &acts[..je - j], self.out_at(j, r0), self.w.rows) };
        }
    }

    /// Weight rows `r0..r1` (more than one) times activation rows `j0..j1`, the
    /// tile's rows in one call of the rows kernel per activation row.
    #[inline(always)]
    fn rows_tile(&self, rows: Rows<B>, r0: usize, r1: usize, j0: usize, j1: usize) {
        let w = self.wrows(r0, r1);
        for j in j0..j1 {
            // SAFETY: the table holds only kernels this CPU has; row and
            // activation lengths match (checked in `run`).
            unsafe { rows(w, self.row_bytes, self.act(j), self.out_row(j, r0, r1)) };
        }
    }

    /// [`Self::tile`], with the tile's weight rows decoded in `decoded` if given.
    #[inline(never)]
    fn tile_with(&self, r0: usize, r1: usize, j0: usize, j1: usize, decoded: Option<(Decoded<B>, &[u8])>) {
        let one = self.dot.one;
        // SAFETY (every kernel call below): the table holds only kernels this
        // CPU has; row and activation lengths match (checked in `run`).
        for jb in (j0..j1).step_by(ACT_GROUP) {
            let je = (jb + ACT_GROUP).min(j1);
            let mut j = jb;
            match self.dot.multi {
                Multi::Tile2x2(tile) => {
                    // Pairs of activation rows against pairs of weight rows.
                    while j + 1 < je {
                        let (a0, a1) = (self.act(j), self.act(j + 1));
                        let mut r = r0;
                        while r + 1 < r1 {
                            let t = unsafe { tile(self.wrow(r), self.wrow(r + 1), a0, a1) };
                            self.store(j, r, t[0]);
                            self.store(j + 1, r, t[1]);
                            self.store(j, r + 1, t[2]);
                            self.store(j + 1, r + 1, t[3]);
                            r += 2;
                        }
                        if r < r1 {
                            self.store(j, r, unsafe { one(self.wrow(r), a0) });
                            self.store(j + 1, r, unsafe { one(self.wrow(r), a1) });
                        }
                        j += 2;
                    }
                }
                Multi::Acts(k) => {
                    // Each weight row against four activation rows, then the
                    // two or three left (one left goes to the rows kernel).
                    while j + 3 < je {
                        let a = [self.act(j), self.act(j + 1), self.act(j + 2), self.act(j + 3)];
                        match decoded {
                            Some((dec, rows)) => {
                                let out = [0, 1, 2, 3].map(|n| self.out_row(j + n, r0, r1));
                                unsafe { (dec.four)(rows, self.per_row * dec.block_bytes, a, out) };
                            }
                            None => {
                                for r in r0..r1 {
                                    self.store_n(j, r, unsafe { (k.four)(self.wrow(r), a) });
                                }
                            }
                        }
                        j += 4;
                    }
                    if je - j == 3 {
                        let a = [self.act(j), self.act(j + 1), self.act(j + 2)];
                        for r in r0..r1 {
                            self.store_n(j, r, unsafe { (k.three)(self.wrow(r), a) });
                        }
                        j += 3;
                    } else if je - j == 2 {
                        let a = [self.act(j), self.act(j + 1)];
                        for r in r0..r1 {
                            self.store_n(j, r, unsafe { (k.two)(self.wrow(r), a) });
                        }
                        j += 2;
                    }
                }
                Multi::None => {}
            }
            match self.dot.rows {
                // The tile's rows in one call per remaining activation row.
                Some(rows) if r1 - r0 > 1 => self.rows_tile(rows, r0, r1, j, je),
                _ => {
                    for r in r0..r1 {
                        let row = self.wrow(r);
                        for jj in j..je {
                            self.store(jj, r, unsafe { one(row, self.act(jj)) });
                        }
                    }
                }
            }
        }
    }
}

/// A planned product, run tile by tile from any thread.
trait Runner: Sync {
    fn tiles(&self) -> usize;
    /// The weight bytes tile `t` reads (its rows, contiguous in the matrix).
    fn weights(&self, t: usize) -> &[u8];
    /// Run tile `t`; `ahead` is the weights of the tile this thread runs
    /// next (empty if not known yet), to prefetch meanwhile.
    fn tile(&self, t: usize, ahead: &[u8]);
}

impl<B: Sync + 'static> Runner for (Plan, Job<'_, B>) {
    fn tiles(&self) -> usize {
        self.0.n_tiles()
    }

    fn weights(&self, t: usize) -> &[u8] {
        let (r0, r1, _, _) = self.0.bounds(t);
        let j = &self.1;
        match j.group_bytes {
            0 => &j.w.data[r0 * j.row_bytes..r1 * j.row_bytes],
            gb => &j.w.data[r0 / 4 * gb..r1.div_ceil(4) * gb],
        }
    }

    fn tile(&self, t: usize, ahead: &[u8]) {
        let (r0, r1, j0, j1) = self.0.bounds(t);
        self.1.tile(r0, r1, j0, j1, ahead);
    }
}

/// Bytes prefetched into L2 in equal shares, one per step of a tile's
/// work: the memory system keeps a steady number of lines in flight
/// beside the products instead of a burst that fills its queues.
struct Prefetch {
    at: *const u8,
    end: *const u8,
    share: usize,
}

impl Prefetch {
    /// `bytes` in `steps` shares (from the line holding their first byte).
    fn new(bytes: &[u8], steps: usize) -> Prefetch {
        let range = bytes.as_ptr_range();
        let at = range.start.wrapping_sub(range.start as usize % 64);
        let lines = (range.end as usize - at as usize).div_ceil(64);
        Prefetch { at, end: range.end, share: 64 * lines.div_ceil(steps.max(1)) }
    }

    /// The next share (nothing once all are asked for).
    #[inline]
    fn share(&mut self) {
        let stop = self.at.wrapping_add(self.share).min(self.end);
        while self.at < stop {
            super::simd::prefetch_l2(self.at);
            self.at = self.at.wrapping_add(64);
        }
    }
}

/// How a product is cut into tiles.
struct Plan {
    n_rows: usize,
    rows_per_tile: usize,
    n: usize,
    acts_per_tile: usize,
}

impl Plan {
    fn n_tiles(&self) -> usize {
        self.n_rows.div_ceil(self.rows_per_tile) * self.n.div_ceil(self.acts_per_tile)
    }

    /// `panel`: tiles of weight rows are whole multiples of it (the rows a
    /// panel kernel decodes together; 1 without panels).
    fn new(n_threads: usize, w: &QMatrix, n: usize, panel: usize) -> Plan {
        let work = w.data.len().saturating_mul(n);
        let threads = if work < SMALL_WORK { 1 } else { n_threads };
        let want_tiles = threads * TILES_PER_THREAD;
        // Rows per tile: a cache-sized chunk, fewer if that leaves threads idle;
        // a multiple of four where possible, so that the four-row kernels and
        // the 2x2 tiles rarely meet a remainder (activation rows go by fours,
        // which suits both multi-row kernels).
        // With four activation rows or fewer the weights are read in one pass
        // (no activation group comes back for them): larger tiles, for the
        // hand-out and per-tile costs only.
        let tile_bytes = if n <= 4 { ONE_PASS_TILE_BYTES } else { TILE_WEIGHT_BYTES };
        let by_cache = (tile_bytes / w.row_bytes().max(1)).max(2);
        let by_balance = w.rows.div_ceil(want_tiles).max(1);
        let rows_per_tile = round_rows(by_cache.min(by_balance)).next_multiple_of(panel).min(w.rows).max(1);
        let row_tiles = w.rows.div_ceil(rows_per_tile);
        // Split activation rows too when there are few weight rows (a router
        // over a long prompt).
        let act_tiles = if row_tiles >= want_tiles { 1 } else { want_tiles.div_ceil(row_tiles).min(n) };
        let acts_per_tile = n.div_ceil(act_tiles).next_multiple_of(4).min(n).max(1);
        Plan { n_rows: w.rows, rows_per_tile, n, acts_per_tile }
    }

    /// Tile `t`'s weight rows `r0..r1` and activation rows `j0..j1`.
    fn bounds(&self, t: usize) -> (usize, usize, usize, usize) {
        let act_tiles = self.n.div_ceil(self.acts_per_tile);
        let (r0, j0) = (t / act_tiles * self.rows_per_tile, t % act_tiles * self.acts_per_tile);
        (r0, (r0 + self.rows_per_tile).min(self.n_rows), j0, (j0 + self.acts_per_tile).min(self.n))
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Up to a multiple of four from 3 on, else up to even.
fn round_rows(x: usize) -> usize {
    if x >= 3 {
        x.next_multiple_of(4)
    } else {
        x + (x & 1)
    }
}
