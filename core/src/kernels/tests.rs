//! Every SIMD path against its scalar twin, and the matmul driver against
//! plain per-row dot products.
//!
//! Integer accumulations are exact in every path; only the order of the f32
//! sums over blocks differs, so results must agree within 1e-5 of the sum of
//! the magnitudes of the terms (`mag`), which is the relative tolerance that
//! stays meaningful when a dot product cancels to near zero.

use super::table::{Dot, Exact, ExactDot, Isa, Kernels, Multi, Panels, RowDot};
use super::testing::{make_valid, random_weights, Rng};
use super::*;
use crate::threads::ThreadPool;
use half::f16;

const TYPES: [GgmlType; 25] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
    GgmlType::IQ4NL,
    GgmlType::MXFP4,
    GgmlType::IQ4XS,
    GgmlType::IQ3XXS,
    GgmlType::IQ3S,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

fn paths() -> impl Iterator<Item = &'static Kernels> {
    available_isas().into_iter().filter_map(Kernels::for_isa)
}

fn simd_paths() -> impl Iterator<Item = &'static Kernels> {
    paths().filter(|k| k.isa() != Isa::Scalar)
}

fn scalar() -> &'static Kernels {
    Kernels::for_isa(Isa::Scalar).expect("scalar path")
}

/// Columns for `nb` blocks of `ty` (floats get odd lengths to exercise tails).
fn cols_for(ty: GgmlType, nb: usize) -> usize {
    if ty.block_size() == 1 {
        nb * 37
    } else {
        nb * ty.block_size()
    }
}

/// `sum |w_i * x_i|` of one row, for tolerances.
fn magnitude(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut wf = vec![0.0; x.len()];
    dequantize_row(ty, row, &mut wf);
    wf.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-20
}

fn close(got: f32, want: f32, mag: f32) -> bool {
    (got - want).abs() <= 1e-5 * mag
}

/// One weight row dotted with activation row `j` on a path, through the table.
fn dot_on(k: &Kernels, ty: GgmlType, row: &[u8], acts: &QActs, j: usize) -> f32 {
    let kk = acts.k();
    // SAFETY: `k` came from `for_isa`, so the CPU has its features.
    unsafe {
        match k.row_dot(ty).expect("supported") {
            RowDot::Q8_0(d) => (d.one)(row, &acts.q8_0[j * kk / 32..(j + 1) * kk / 32]),
            RowDot::Q8_1(d) => (d.one)(row, &acts.q8_1[j * kk / 32..(j + 1) * kk / 32]),
            RowDot::Q8K(d) => (d.one)(row, &acts.q8k[j * kk / 256..(j + 1) * kk / 256]),
            RowDot::F32(d) => (d.one)(row, &acts.f32[j * kk..(j + 1) * kk]),
        }
    }
}

/// Weight rows `w` (whole rows of `row_bytes`) with activation row `j` by
/// the path's rows kernel, as a decode tile over `w` computes them (the
/// one-row kernel per row where the type has no rows kernel).
fn rows_on(k: &Kernels, ty: GgmlType, w: &[u8], row_bytes: usize, acts: &QActs, j: usize) -> Vec<f32> {
    fn run<B>(d: Dot<B>, w: &[u8], row_bytes: usize, a: &[B]) -> Vec<f32> {
        let mut out = vec![0f32; w.len() / row_bytes];
        // SAFETY: `d` came from `for_isa`, so the CPU has its features; whole rows.
        unsafe {
            match d.rows {
                Some(rows) => rows(w, row_bytes, a, &mut out),
                None => out.iter_mut().zip(w.chunks_exact(row_bytes)).for_each(|(o, r)| *o = (d.one)(r, a)),
            }
        }
        out
    }
    let kk = acts.k();
    match k.row_dot(ty).expect("supported") {
        RowDot::Q8_0(d) => run(d, w, row_bytes, &acts.q8_0[j * kk / 32..(j + 1) * kk / 32]),
        RowDot::Q8_1(d) => run(d, w, row_bytes, &acts.q8_1[j * kk / 32..(j + 1) * kk / 32]),
        RowDot::Q8K(d) => run(d, w, row_bytes, &acts.q8k[j * kk / 256..(j + 1) * kk / 256]),
        RowDot::F32(d) => run(d, w, row_bytes, &acts.f32[j * kk..(j + 1) * kk]),
    }
}

#[test]
fn show_isa() {
    eprintln!("kernels: selected path {} (available: {:?})", isa(), available_isas());
}

#[test]
fn simd_dots_equal_scalar_twins() {
    let mut rng = Rng::new(11);
    for k in simd_paths() {
        for ty in TYPES {
            for nb in [1, 2, 3, 5, 8, 13] {
                let cols = cols_for(ty, nb);
                let w = random_weights(ty, 3, cols, &mut rng);
                let x = rng.vec(2 * cols, 1.0);
                let mut acts = QActs::new();
                acts.quantize(ty, &x, 2, cols);
                let m = QMatrix::new(ty, &w, 3, cols).expect("matrix");
                for r in 0..3 {
                    for j in 0..2 {
                        let want = dot_on(scalar(), ty, m.row(r), &acts, j);
                        let got = dot_on(k, ty, m.row(r), &acts, j);
                        let mag = magnitude(ty, m.row(r), &x[j * cols..(j + 1) * cols]);
                        assert!(close(got, want, mag), "{} {ty} nb={nb} row {r}: {got} vs scalar {want}", k.isa());
                    }
                }
            }
        }
    }
}

/// The products of a multi-row kernel on weight rows 0..2 and activation rows
/// 0..4 (for several-activation kernels: by fours, threes and twos), as
/// `(weight row, activation row, value)`; empty if the path has none.
fn multi_products<B>(dot: Dot<B>, m: &QMatrix, acts: &[B], per_row: usize) -> Vec<(usize, usize, f32)> {
    let mut out = multi_only(dot.multi, m, acts, per_row);
    if let Some(p) = dot.panels {
        out.extend(panel_products(p, m, acts, per_row));
    }
    out
}

/// The products of a path's panel GEMM: rows 0 and 1 alternating as one
/// panel, with one to `p.acts` of activation rows 0..4.
fn panel_products<B>(p: Panels<B>, m: &QMatrix, acts: &[B], per_row: usize) -> Vec<(usize, usize, f32)> {
    let a = |j: usize| &acts[j * per_row..(j + 1) * per_row];
    let rows: Vec<usize> = (0..p.height).map(|k| (k / 2 + k) % 2).collect();
    let mut buf = Vec::new();
    let d = crate::kernels::table::decoded_buffer(&mut buf, per_row * p.block_bytes);
    let w: Vec<&[u8]> = rows.iter().map(|&r| m.row(r)).collect();
    let mut out = vec![];
    // SAFETY: the kernels come from a path this CPU has; whole blocks.
    unsafe {
        (p.decode)(&w, d);
        for n in 1..=p.acts {
            let acts: Vec<&[B]> = (0..n).map(|t| a((t + n) % 4)).collect();
            // Rows of the output longer than the panel (as in a product's
            // output): the kernel must write its `height` values of each and
            // nothing else.
            let stride = p.height + 3;
            let mut v = vec![f32::NAN; n * stride];
            (p.dot)(d, &acts, v.as_mut_ptr(), stride);
            for (t, o) in v.chunks_exact(stride).enumerate() {
                out.extend(rows.iter().zip(o).map(|(&r, &x)| (r, (t + n) % 4, x)));
                assert!(o[p.height..].iter().all(|x| x.is_nan()), "a panel kernel wrote past its {} rows", p.height);
            }
        }
    }
    out
}

fn multi_only<B>(multi: Multi<B>, m: &QMatrix, acts: &[B], per_row: usize) -> Vec<(usize, usize, f32)> {
    let a = |j: usize| &acts[j * per_row..(j + 1) * per_row];
    // SAFETY: the kernels come from a path this CPU has.
    unsafe {
        match multi {
            Multi::None => vec![],
            Multi::Tile2x2(t) => {
                let v = t(m.row(0), m.row(1), a(2), a(3));
                vec![(0, 2, v[0]), (0, 3, v[1]), (1, 2, v[2]), (1, 3, v[3])]
            }
            Multi::Acts(k) => {
                let mut out = vec![];
                for r in 0..2 {
                    let w = m.row(r);
                    let four = (k.four)(w, [a(0), a(1), a(2), a(3)]);
                    out.extend(four.into_iter().enumerate().map(|(j, v)| (r, j, v)));
                    let three = (k.three)(w, [a(1), a(2), a(3)]);
                    out.extend(three.into_iter().enumerate().map(|(j, v)| (r, j + 1, v)));
                    let two = (k.two)(w, [a(2), a(0)]);
                    out.extend([(r, 2, two[0]), (r, 0, two[1])]);
                    if let Some(dec) = k.decoded {
                        // The same products to the bit from the decoded row.
                        let mut buf = Vec::new();
                        let d = crate::kernels::table::decoded_buffer(&mut buf, per_row * dec.block_bytes);
                        (dec.decode)(w, d);
                        let mut v = [0f32; 4];
                        let out = v.each_mut().map(std::slice::from_mut);
                        (dec.four)(d, per_row * dec.block_bytes, [a(0), a(1), a(2), a(3)], out);
                        assert_eq!(v.map(f32::to_bits), four.map(f32::to_bits), "decoded row {r}");
                    }
                }
                out
            }
        }
    }
}

#[test]
fn multi_row_kernels_equal_scalar_twins() {
    let mut rng = Rng::new(12);
    for k in simd_paths() {
        for ty in TYPES {
            for nb in [1, 2, 3, 8] {
                let cols = cols_for(ty, nb);
                let w = random_weights(ty, 2, cols, &mut rng);
                let m = QMatrix::new(ty, &w, 2, cols).expect("matrix");
                let x = rng.vec(4 * cols, 1.0);
                let mut acts = QActs::new();
                acts.quantize(ty, &x, 4, cols);
                let got = match k.row_dot(ty).expect("supported") {
                    RowDot::Q8_0(d) => multi_products(d, &m, &acts.q8_0, cols / 32),
                    RowDot::Q8_1(d) => multi_products(d, &m, &acts.q8_1, cols / 32),
                    RowDot::Q8K(d) => multi_products(d, &m, &acts.q8k, cols / 256),
                    RowDot::F32(d) => multi_products(d, &m, &acts.f32, cols),
                };
                for (r, j, g) in got {
                    let want = dot_on(scalar(), ty, m.row(r), &acts, j);
                    let mag = magnitude(ty, m.row(r), &x[j * cols..(j + 1) * cols]);
                    assert!(close(g, want, mag), "{} {ty} nb={nb} multi ({r},{j}): {g} vs scalar {want}", k.isa());
                }
            }
        }
    }
}

/// Blocks of one repeated byte (every value and scale at its largest, its
/// smallest, or alternating bit patterns) with activations at +-127: where
/// unsigned-times-signed products and their pair sums come closest to the
/// limits of their lanes. Every kernel of every path against the scalar twin.
#[test]
fn kernels_at_the_extremes_equal_scalar_twins() {
    let mut rng = Rng::new(29);
    for k in simd_paths() {
        for ty in TYPES.into_iter().filter(|t| t.block_size() > 1) {
            let cols = cols_for(ty, 2);
            for fill in [0x00u8, 0xFF, 0xAA, 0x55, 0x0F, 0xF0] {
                let mut w = vec![fill; 2 * ty.row_bytes(cols as u64).expect("whole blocks") as usize];
                make_valid(ty, &mut w, &mut rng);
                let m = QMatrix::new(ty, &w, 2, cols).expect("matrix");
                let x: Vec<f32> = (0..4 * cols)
                    .map(|i| match i / cols {
                        0 => 1.0,
                        1 => -1.0,
                        2 => {
                            if i % 2 == 0 {
                                1.0
                            } else {
                                -1.0
                            }
                        }
                        _ => {
                            if (i / 3) % 2 == 0 {
                                -1.0
                            } else {
                                1.0
                            }
                        }
                    })
                    .collect();
                let mut acts = QActs::new();
                acts.quantize(ty, &x, 4, cols);
                let (multi, rows) = match k.row_dot(ty).expect("supported") {
                    RowDot::Q8_0(d) => {
                        (multi_products(d, &m, &acts.q8_0, cols / 32), rows_products(d, &m, &acts.q8_0, cols / 32))
                    }
                    RowDot::Q8_1(d) => {
                        (multi_products(d, &m, &acts.q8_1, cols / 32), rows_products(d, &m, &acts.q8_1, cols / 32))
                    }
                    RowDot::Q8K(d) => {
                        (multi_products(d, &m, &acts.q8k, cols / 256), rows_products(d, &m, &acts.q8k, cols / 256))
                    }
                    RowDot::F32(_) => unreachable!("quantised types only"),
                };
                let rows = rows.into_iter().flatten().enumerate().map(|(r, g)| (r, 0, g));
                for (r, j, g) in multi.into_iter().chain(rows) {
                    let want = dot_on(scalar(), ty, m.row(r), &acts, j);
                    let mag = magnitude(ty, m.row(r), &x[j * cols..(j + 1) * cols]);
                    assert!(close(g, want, mag), "{} {ty} fill {fill:#04x} ({r},{j}): {g} vs scalar {want}", k.isa());
                    let one = dot_on(k, ty, m.row(r), &acts, j);
                    assert!(
                        close(one, want, mag),
                        "{} {ty} fill {fill:#04x} one ({r},{j}): {one} vs scalar {want}",
                        k.isa()
                    );
                }
            }
        }
    }
}

/// The rows kernel of a path (if any) on all rows of `m` with activation row 0.
fn rows_products<B>(dot: super::table::Dot<B>, m: &QMatrix, acts: &[B], per_row: usize) -> Option<Vec<f32>> {
    let mut out = vec![f32::NAN; m.rows];
    // SAFETY: the kernels come from a path this CPU has.
    unsafe { (dot.rows?)(m.data, m.row_bytes(), &acts[..per_row], &mut out) };
    Some(out)
}

/// A row's product by the rows kernel does not depend on where the row
/// falls: in one of the kernel's groups of rows or in the rest (taken one by
/// one), it is the same to the bit. (A head over the first tokens of the
/// vocabulary, a slab, a tile: any row count gives each row what the whole
/// matrix gives it.) Every x86 path; on NEON Q8_0 and Q6_K (the formats the
/// loader interleaves, whose interleaved kernels must meet the rows
/// kernels' bits too) only: the NEON multi-row bodies of the other formats
/// sum in another order than their one-row kernels (within rounding of each
/// other, see [`rows_kernels_equal_scalar_twins`]) — a known gap.
#[test]
fn rows_kernels_give_a_row_the_same_bits_in_a_group_or_alone() {
    let mut rng = Rng::new(19);
    let mut differ = Vec::new();
    for k in simd_paths() {
        let neon = matches!(k.isa(), Isa::Neon | Isa::Dotprod | Isa::I8mm);
        for ty in TYPES.into_iter().filter(|&ty| !neon || matches!(ty, GgmlType::Q8_0 | GgmlType::Q6K)) {
            let cols = cols_for(ty, 3);
            let w = random_weights(ty, 9, cols, &mut rng);
            let rb = w.len() / 9;
            let x = rng.vec(cols, 1.0);
            let mut acts = QActs::new();
            acts.quantize(ty, &x, 1, cols);
            let all = rows_on(k, ty, &w, rb, &acts, 0);
            for r in 0..9 {
                let alone = rows_on(k, ty, &w[r * rb..(r + 1) * rb], rb, &acts, 0)[0];
                if alone.to_bits() != all[r].to_bits() {
                    differ.push(format!("{} {ty} row {r}: {alone} alone, {} in the group", k.isa(), all[r]));
                }
            }
        }
    }
    assert!(differ.is_empty(), "{differ:#?}");
}

#[test]
fn rows_kernels_equal_scalar_twins() {
    let mut rng = Rng::new(17);
    for k in simd_paths() {
        for ty in TYPES {
            for (rows, nb) in [(1, 1), (5, 2), (9, 3)] {
                let cols = cols_for(ty, nb);
                let w = random_weights(ty, rows, cols, &mut rng);
                let m = QMatrix::new(ty, &w, rows, cols).expect("matrix");
                let x = rng.vec(cols, 1.0);
                let mut acts = QActs::new();
                acts.quantize(ty, &x, 1, cols);
                let got = match k.row_dot(ty).expect("supported") {
                    RowDot::Q8_0(d) => rows_products(d, &m, &acts.q8_0, cols / 32),
                    RowDot::Q8_1(d) => rows_products(d, &m, &acts.q8_1, cols / 32),
                    RowDot::Q8K(d) => rows_products(d, &m, &acts.q8k, cols / 256),
                    RowDot::F32(d) => rows_products(d, &m, &acts.f32, cols),
                };
                for (r, g) in got.into_iter().flatten().enumerate() {
                    let want = dot_on(scalar(), ty, m.row(r), &acts, 0);
                    let mag = magnitude(ty, m.row(r), &x);
                    assert!(close(g, want, mag), "{} {ty} rows kernel, row {r}: {g} vs scalar {want}", k.isa());
                }
            }
        }
    }
}

/// The NEON rows kernel of MXFP4 (four rows at a time, lane by lane the
/// scalar twin's arithmetic) equals it to the bit, in the groups of four
/// (9 rows: two groups and a one-row tail, which takes the one-row kernel and
/// is only held to the tolerance above).
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_mxfp4_rows_kernel_equals_the_scalar_twin_to_the_bit() {
    let mut rng = Rng::new(53);
    let ty = GgmlType::MXFP4;
    for k in simd_paths() {
        for nb in [1, 2, 7, 90] {
            let (rows, cols) = (9, cols_for(ty, nb));
            let w = random_weights(ty, rows, cols, &mut rng);
            let m = QMatrix::new(ty, &w, rows, cols).expect("matrix");
            let x = rng.vec(cols, 1.0);
            let mut acts = QActs::new();
            acts.quantize(ty, &x, 1, cols);
            let RowDot::Q8_0(d) = k.row_dot(ty).expect("supported") else { panic!("{ty}: Q8_0 activations") };
            let got = rows_products(d, &m, &acts.q8_0, cols / 32).expect("a rows kernel");
            for (r, g) in got.into_iter().enumerate().take(8) {
                let want = dot_on(scalar(), ty, m.row(r), &acts, 0);
                assert_eq!(g.to_bits(), want.to_bits(), "{} {ty} nb={nb} row {r}: {g} vs scalar {want}", k.isa());
            }
        }
    }
}

#[test]
fn matmul_equals_per_row_dots() {
    let mut rng = Rng::new(13);
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    let paths: Vec<&Kernels> = paths().collect();
    for ty in TYPES {
        // Odd row counts; one matrix large enough to be split over threads.
        for (rows, nb) in [(1, 1), (7, 3), (33, 2), (130, 8)] {
            let cols = cols_for(ty, nb);
            let w = random_weights(ty, rows, cols, &mut rng);
            let m = QMatrix::new(ty, &w, rows, cols).expect("matrix");
            // The rows dequantised once: the tolerance of every output needs them
            // (per output, per path and per pool, this test took minutes under qemu).
            let mut wf = vec![0.0; rows * cols];
            for (r, out) in wf.chunks_exact_mut(cols).enumerate() {
                dequantize_row(ty, m.row(r), out);
            }
            // 5 on: tiles with enough activation rows for Q4_0 / Q5_0
            // panels (AVX-512) and decoded rows; 9 on: K-quant panels
            // (AVX-512; NEON from 4); 33 (one thread): decoded Q2_K rows.
            for n in [1, 2, 3, 5, 9, 16, 17, 33] {
                let x = rng.vec(n * cols, 1.0);
                let mut acts = QActs::new();
                acts.quantize(ty, &x, n, cols);
                let mags: Vec<f32> = (0..n)
                    .flat_map(|j| (0..rows).map(move |r| (r, j)))
                    .map(|(r, j)| {
                        let (wr, xj) = (&wf[r * cols..(r + 1) * cols], &x[j * cols..(j + 1) * cols]);
                        wr.iter().zip(xj).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-20
                    })
                    .collect();
                for &k in &paths {
                    let want: Vec<f32> = (0..n)
                        .flat_map(|j| (0..rows).map(move |r| (r, j)))
                        .map(|(r, j)| dot_on(k, ty, m.row(r), &acts, j))
                        .collect();
                    for pool in &pools {
                        let mut out = vec![f32::NAN; n * rows];
                        k.matmul(pool, &m, &acts, &mut out);
                        for (i, ((&g, &w), &mag)) in out.iter().zip(&want).zip(&mags).enumerate() {
                            let (j, r) = (i / rows, i % rows);
                            assert!(
                                close(g, w, mag),
                                "{} {ty} {rows}x{cols} n={n} threads={}: out[{j}][{r}] = {g}, dot {w}",
                                k.isa(),
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_rows_picks_activation_rows() {
    let mut rng = Rng::new(14);
    let pool = ThreadPool::new(3);
    for k in paths() {
        for ty in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::F16] {
            let (rows, cols, n) = (65, cols_for(ty, 4), 7);
            let w = random_weights(ty, rows, cols, &mut rng);
            let m = QMatrix::new(ty, &w, rows, cols).expect("matrix");
            let x = rng.vec(n * cols, 1.0);
            let mut acts = QActs::new();
            acts.quantize(ty, &x, n, cols);
            let mut all = vec![0.0; n * rows];
            k.matmul(&pool, &m, &acts, &mut all);
            let pick = [6, 0, 3, 3, 5];
            let mut out = vec![f32::NAN; pick.len() * rows];
            k.matmul_rows(&pool, &m, &acts, &pick, &mut out);
            for (j, &i) in pick.iter().enumerate() {
                for r in 0..rows {
                    let mag = magnitude(ty, m.row(r), &x[i * cols..(i + 1) * cols]);
                    assert!(close(out[j * rows + r], all[i * rows + r], mag), "{} {ty} pick {j} row {r}", k.isa());
                }
            }
            // A slab of rows is a matrix of its own.
            let slab = m.rows_slice(10, 20);
            let mut part = vec![0.0; n * 20];
            k.matmul(&pool, &slab, &acts, &mut part);
            for j in 0..n {
                for r in 0..20 {
                    let mag = magnitude(ty, m.row(10 + r), &x[j * cols..(j + 1) * cols]);
                    assert!(close(part[j * 20 + r], all[j * rows + 10 + r], mag), "{} {ty} slab", k.isa());
                }
            }
        }
    }
}

#[test]
fn top_level_api_runs_on_the_selected_path() {
    let mut rng = Rng::new(15);
    let pool = ThreadPool::new(2);
    let (rows, cols) = (40, 512);
    let w = random_weights(GgmlType::Q4K, rows, cols, &mut rng);
    let m = QMatrix::new(GgmlType::Q4K, &w, rows, cols).expect("matrix");
    let x = rng.vec(3 * cols, 1.0);
    let mut a = vec![0.0; 3 * rows];
    let mut b = vec![0.0; 3 * rows];
    matmul_f32(&pool, &m, &x, 3, &mut a);
    let mut acts = QActs::new();
    acts.quantize(GgmlType::Q4K, &x, 3, cols);
    assert_eq!((acts.n(), acts.k()), (3, cols));
    Kernels::selected().matmul(&pool, &m, &acts, &mut b);
    assert_eq!(a, b);
    // One activation row alone runs another kernel than three together (the
    // multi-token kernels reduce in another order): equal to rounding.
    matmul_rows(&pool, &m, &acts, &[2], &mut b[..rows]);
    for r in 0..rows {
        let mag = magnitude(GgmlType::Q4K, m.row(r), &x[2 * cols..]);
        assert!(close(b[r], a[2 * rows + r], mag), "row {r}: {} vs {}", b[r], a[2 * rows + r]);
    }
}

#[test]
fn matrix_shapes_are_checked() {
    let data = vec![0u8; 2 * 144];
    assert!(QMatrix::new(GgmlType::Q4K, &data, 2, 256).is_ok());
    assert!(QMatrix::new(GgmlType::Q4K, &data, 2, 200).is_err());
    assert!(QMatrix::new(GgmlType::Q4K, &data, 3, 256).is_err());
    assert!(QMatrix::new(GgmlType::TQ1_0, &data[..54], 1, 256).is_ok());
    assert!(QMatrix::new(GgmlType::NVFP4, &data[..36], 1, 64).is_err());
    assert!(supports(GgmlType::Q6K) && !supports(GgmlType::Q8K) && !supports(GgmlType::NVFP4));
}

#[test]
#[should_panic(expected = "activations quantised as")]
fn mismatched_activations_panic() {
    let data = vec![0u8; 144];
    let m = QMatrix::new(GgmlType::Q4K, &data, 1, 256).expect("matrix");
    let mut acts = QActs::new();
    acts.quantize(GgmlType::Q8_0, &[0.5; 256], 1, 256);
    matmul(&ThreadPool::new(1), &m, &acts, &mut [0.0]);
}

#[test]
fn silu_equals_scalar_twin() {
    let mut rng = Rng::new(29);
    // The extremes both first (vector lanes) and last (the scalar tail).
    let extremes =
        [0.0, -0.0, 1e-30, -1e-30, 87.5, -87.5, 90.0, -90.0, 200.0, -200.0, 3.0e38, -3.0e38, -2e4, -1e4, f32::NAN];
    let mut x = extremes.to_vec();
    x.extend(rng.vec(1001, 12.0));
    x.extend(extremes);
    for k in simd_paths() {
        let (mut a, mut b) = (x.clone(), x.clone());
        // SAFETY: the path comes from `for_isa`, so the CPU has its features.
        unsafe {
            (k.silu)(&mut a);
            (scalar().silu)(&mut b);
        }
        for ((&g, &w), &v) in a.iter().zip(&b).zip(&x) {
            let close = (g - w).abs() <= 1e-6 * w.abs() + 1e-30 || (g.is_nan() && w.is_nan());
            assert!(close, "{} silu({v}) = {g}, scalar {w}", k.isa());
        }
    }
}

#[test]
fn state_kernels_equal_scalar_twins() {
    let mut rng = Rng::new(23);
    for k in simd_paths() {
        // Column counts around the block sizes (NEON: 32, updates 64 then 32;
        // AVX2: 32), odd rows.
        for (rows, dv) in
            [(1, 1), (2, 0), (3, 7), (5, 16), (7, 33), (9, 48), (3, 31), (5, 64), (3, 96), (16, 128), (4, 130)]
        {
            let s = rng.vec(rows * dv, 1.0);
            let (kk, q, d) = (rng.vec(rows, 1.0), rng.vec(rows, 1.0), rng.vec(dv, 1.0));
            let (mut u1, mut o1) = (vec![f32::NAN; dv], vec![f32::NAN; dv]);
            let (mut u2, mut o2) = (vec![0.0; dv], vec![0.0; dv]);
            let (mut s1, mut s2) = (s.clone(), s.clone());
            // SAFETY: `k` came from `for_isa`.
            unsafe {
                (k.state_read)(&s, &kk, &q, &mut u1, &mut o1);
                (scalar().state_read)(&s, &kk, &q, &mut u2, &mut o2);
                (k.state_update)(&mut s1, 0.9, &kk, &d);
                (scalar().state_update)(&mut s2, 0.9, &kk, &d);
            }
            for c in 0..dv {
                let mag: f32 =
                    (0..rows).map(|r| (s[r * dv + c] * kk[r]).abs() + (s[r * dv + c] * q[r]).abs()).sum::<f32>()
                        + 1e-20;
                assert!(
                    close(u1[c], u2[c], mag) && close(o1[c], o2[c], mag),
                    "{} state_read {rows}x{dv} col {c}",
                    k.isa()
                );
            }
            for (i, (a, b)) in s1.iter().zip(&s2).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{} state_update {rows}x{dv} at {i}: {a} vs {b}",
                    k.isa()
                );
            }
        }
    }
}

#[test]
fn ssm_scan_equals_its_scalar_twin_and_plain_math() {
    // State widths around the sixteen lanes (Granite: 128), odd row counts.
    let mut rng = Rng::new(37);
    for (rows, ds) in [(1, 1), (3, 0), (2, 15), (5, 16), (7, 17), (4, 33), (9, 64), (8, 128), (3, 130)] {
        let s = rng.vec(rows * ds, 1.0);
        let (x, b, c) = (rng.vec(rows, 1.0), rng.vec(ds, 1.0), rng.vec(ds, 1.0));
        let (decay, dt) = (0.93, 0.41);
        let mut want_s = s.clone();
        let mut want_y = vec![f32::NAN; rows];
        scalar::ssm_scan(&mut want_s, decay, dt, &x, &b, &c, &mut want_y);
        // The twin against plain math in f64.
        for i in 0..rows {
            let mut dot = 0.0f64;
            for j in 0..ds {
                let v = f64::from(s[i * ds + j]) * f64::from(decay) + f64::from(b[j]) * f64::from(x[i] * dt);
                assert!((f64::from(want_s[i * ds + j]) - v).abs() <= 1e-6 * (1.0 + v.abs()), "state {rows}x{ds}");
                dot += v * f64::from(c[j]);
            }
            assert!((f64::from(want_y[i]) - dot).abs() <= 1e-5 * (1.0 + ds as f64), "y {rows}x{ds} row {i}");
        }
        for k in simd_paths() {
            let (mut got_s, mut got_y) = (s.clone(), vec![f32::NAN; rows]);
            // SAFETY: `k` came from `for_isa`; the sizes are the contract's.
            unsafe { (k.ssm_scan)(&mut got_s, decay, dt, &x, &b, &c, &mut got_y) };
            // The twin's lanes and order: equal to the bit.
            assert!(
                got_s.iter().zip(&want_s).all(|(g, w)| g.to_bits() == w.to_bits()),
                "{} state {rows}x{ds}",
                k.isa()
            );
            assert!(got_y.iter().zip(&want_y).all(|(g, w)| g.to_bits() == w.to_bits()), "{} y {rows}x{ds}", k.isa());
        }
    }
}

#[test]
fn f32_helpers_equal_scalar_twins() {
    let mut rng = Rng::new(16);
    for k in simd_paths() {
        for n in [1, 3, 7, 8, 9, 15, 16, 17, 31, 64, 67, 130] {
            let a = rng.vec(n, 1.0);
            let b = rng.vec(n, 1.0);
            let mag: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum::<f32>() + 1e-20;
            // SAFETY: `k` came from `for_isa`.
            unsafe {
                let (g, w) = ((k.dot_f32)(&a, &b), (scalar().dot_f32)(&a, &b));
                assert!(close(g, w, mag), "{} dot_f32 n={n}: {g} vs {w}", k.isa());
                let (mut o1, mut o2) = (b.clone(), b.clone());
                (k.axpy_f32)(&mut o1, 0.37, &a);
                (scalar().axpy_f32)(&mut o2, 0.37, &a);
                assert!(o1.iter().zip(&o2).all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + y.abs())), "axpy_f32 n={n}");
            }
        }
    }
}

#[test]
fn q8_k_quantisers_equal_the_scalar_one_to_the_bit() {
    let mut rng = Rng::new(23);
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-30, 1e-3, 1.0, 7.5, 1e6] {
        blocks.push(rng.vec(QK_K, scale));
    }
    // Ties: the largest magnitude -127 gives a scale of 1, so the halves
    // round to even; both signs reaching the largest magnitude (the first
    // wins); zeros, with a negative zero; NaNs beside finite values.
    let mut ties: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 128.0) / 2.0).collect();
    ties[0] = -127.0;
    blocks.push(ties);
    let mut both = rng.vec(QK_K, 1.0);
    (both[5], both[9]) = (2.0, -2.0);
    blocks.push(both.clone());
    (both[5], both[9]) = (-2.0, 2.0);
    blocks.push(both);
    let mut zeros = vec![0.0f32; QK_K];
    zeros[3] = -0.0;
    blocks.push(zeros);
    let mut nans = rng.vec(QK_K, 3.0);
    (nans[0], nans[100]) = (f32::NAN, f32::NAN);
    blocks.push(nans);
    let x: Vec<f32> = blocks.concat();
    let nb = x.len() / QK_K;
    let want = {
        let mut y = vec![BlockQ8K::default(); nb];
        quant::q8_k::quantize_row_q8_k(&x, &mut y);
        y
    };
    for k in simd_paths() {
        let mut got = vec![BlockQ8K::default(); nb];
        // SAFETY: `k` came from `for_isa`; `x` holds `nb` blocks.
        unsafe { (k.quantize_q8k)(&x, &mut got) };
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.d.to_bits(), w.d.to_bits(), "{} block {b}: d", k.isa());
            assert_eq!(g.qs, w.qs, "{} block {b}: qs", k.isa());
            assert_eq!(g.bsums, w.bsums, "{} block {b}: bsums", k.isa());
        }
    }
}

#[test]
fn attention_kernels_equal_scalar_twins() {
    // Every head count around the kernels' passes of four, head sizes with and
    // without tails, one position and several.
    let mut rng = Rng::new(17);
    for k in simd_paths() {
        for heads in 1..=9 {
            for d in [1, 7, 8, 16, 24, 33, 64, 128] {
                for n in [1, 2, 5, 19] {
                    let q = rng.vec(heads * d, 1.0);
                    let kv: Vec<f16> = rng.vec(n * d, 1.0).iter().map(|&v| f16::from_f32(v)).collect();
                    let (mut got, mut want) = (vec![0.0; heads * n], vec![0.0; heads * n]);
                    // SAFETY: `k` came from `for_isa`.
                    unsafe {
                        (k.scores_f16)(&q, heads, &kv, &mut got);
                        (scalar().scores_f16)(&q, heads, &kv, &mut want);
                    }
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let (h, j) = (i / n, i % n);
                        let mag: f32 =
                            (0..d).map(|t| (q[h * d + t] * kv[j * d + t].to_f32()).abs()).sum::<f32>() + 1e-20;
                        assert!(close(*g, *w, mag), "{} scores heads={heads} d={d} n={n} at {i}: {g} vs {w}", k.isa());
                    }
                    let wts = rng.vec(heads * n, 1.0);
                    let (mut got, mut want) = (vec![f32::NAN; heads * d], vec![f32::NAN; heads * d]);
                    // SAFETY: as above.
                    unsafe {
                        (k.mix_f16)(&wts, heads, &kv, &mut got);
                        (scalar().mix_f16)(&wts, heads, &kv, &mut want);
                    }
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let (h, c) = (i / d, i % d);
                        let mag: f32 =
                            (0..n).map(|j| (wts[h * n + j] * kv[j * d + c].to_f32()).abs()).sum::<f32>() + 1e-20;
                        assert!(close(*g, *w, mag), "{} mix heads={heads} d={d} n={n} at {i}: {g} vs {w}", k.isa());
                    }
                }
            }
        }
    }
}

/// Queries, keys, values and the rows' key ranges of one `attend_f16` call.
type AttendCase = (Vec<f32>, Vec<f16>, Vec<f16>, Vec<(usize, usize)>);

/// Random `attend_f16` inputs: `rows` queries of `d`, `n` positions of keys
/// and values, each row's range inside `0..n` (some a single key, some all).
fn attend_case(rng: &mut Rng, rows: usize, d: usize, dv: usize, n: usize) -> AttendCase {
    let q = rng.vec(rows * d, 2.0);
    let k: Vec<f16> = rng.vec(n * d, 1.0).iter().map(|&v| f16::from_f32(v)).collect();
    let v: Vec<f16> = rng.vec(n * dv, 1.0).iter().map(|&v| f16::from_f32(v)).collect();
    let ranges = (0..rows)
        .map(|r| match r % 3 {
            0 => (0, n),
            1 => {
                let lo = rng.below(n);
                (lo, lo + 1 + rng.below(n - lo))
            }
            _ => (n - 1 - rng.below(n), n),
        })
        .collect();
    (q, k, v, ranges)
}

#[test]
fn tiled_attention_equals_its_scalar_twin() {
    // Row counts up to the register's sixteen lanes, head sizes with and
    // without tails of 16 and 32, positions around the kernels' blocks of 8.
    let mut rng = Rng::new(29);
    for k in paths() {
        let Some(kernel) = k.attend_f16 else { continue };
        for rows in [1, 3, 8, 9, 16] {
            for (d, dv) in [(1, 1), (7, 5), (16, 16), (33, 40), (64, 64), (256, 256)] {
                for (n, sunk) in [(1, false), (2, true), (8, false), (9, true), (23, false), (23, true)] {
                    let (q, kv_k, kv_v, ranges) = attend_case(&mut rng, rows, d, dv, n);
                    // Sinks (gpt-oss): some far below the scores, some above.
                    let sink_rows = rng.vec(rows, 4.0);
                    let sinks = sunk.then_some(&sink_rows[..]);
                    let a = ops::AttendRows { q: &q, d, k: &kv_k, v: &kv_v, dv, ranges: &ranges, scale: 0.3, sinks };
                    let mut scratch = vec![f32::NAN; ops::attend_f16_scratch(d, n)];
                    let (mut got, mut want) = (vec![f32::NAN; rows * dv], vec![f32::NAN; rows * dv]);
                    // SAFETY: `k` came from `for_isa`; the sizes are the contract's.
                    unsafe {
                        kernel(&a, &mut got, &mut scratch);
                        scalar::attend_f16(&a, &mut want, &mut scratch);
                    }
                    // Lane for lane the twin's operations: equal to the bit.
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g == w,
                            "{} rows={rows} d={d} dv={dv} n={n} sinks={sunk} row {} col {}: {g} vs {w}",
                            k.isa(),
                            i / dv,
                            i % dv
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_exp_is_within_four_ulp_of_libm() {
    let mut x = -87.0f32;
    while x <= 0.0 {
        let (got, want) = (scalar::exp_attend(x), x.exp());
        assert!((got - want).abs() <= 4.0 * f32::EPSILON * want, "exp({x}): {got} vs {want}");
        x += 0.001_37;
    }
    assert_eq!(scalar::exp_attend(0.0), 1.0);
    assert!(scalar::exp_attend(-1000.0) < 1e-37);
}

#[test]
fn tiled_attention_is_scores_softmax_and_mix() {
    // The scalar twin against the per-token path it replaces in prefill.
    let mut rng = Rng::new(31);
    let (rows, d, dv, n) = (5, 24, 16, 13);
    let (q, k, v, ranges) = attend_case(&mut rng, rows, d, dv, n);
    // Without sinks, and with a sink per row (one more logit in the
    // denominator, mixing nothing: gpt-oss's).
    let sink_rows = [-30.0, 0.5, 2.0, -1.0, 6.0];
    for sinks in [None, Some(&sink_rows[..])] {
        let a = ops::AttendRows { q: &q, d, k: &k, v: &v, dv, ranges: &ranges, scale: 0.25, sinks };
        let mut got = vec![0.0; rows * dv];
        ops::attend_f16(&a, &mut got, &mut vec![0.0; ops::attend_f16_scratch(d, n)]);
        for (r, &(lo, hi)) in ranges.iter().enumerate() {
            // The softmax over the scores and the sink, the sink's share dropped.
            let mut s = vec![0.0; hi - lo];
            ops::scores_f16(&q[r * d..][..d], 1, &k[lo * d..hi * d], &mut s);
            ops::scale(&mut s, 0.25);
            s.extend(sinks.map(|s| s[r]));
            ops::softmax(&mut s);
            s.truncate(hi - lo);
            s.iter_mut().for_each(|w| *w = f16::from_f32(*w).to_f32());
            let mut want = vec![0.0; dv];
            ops::mix_f16(&s, 1, &v[lo * dv..hi * dv], &mut want);
            for (c, (g, w)) in got[r * dv..][..dv].iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 2e-3, "sinks {} row {r} col {c}: {g} vs {w}", sinks.is_some());
            }
        }
    }
}

#[test]
fn float_multi_row_kernels_equal_the_one_row_kernel_to_the_bit() {
    // Prefill (several activation rows per pass) and decode (one) must give
    // the same products for float weights: an F32 model's batch and
    // token-by-token logits are compared tightly (tests/model_logits.rs).
    let mut rng = Rng::new(21);
    for k in paths() {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let Some(RowDot::F32(dot)) = k.row_dot(ty) else { panic!("{ty} has float kernels") };
            let Multi::Acts(multi) = dot.multi else { continue };
            for cols in [7, 8, 40, 64, 100, 2048] {
                let w = random_weights(ty, 1, cols, &mut rng);
                let x: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(cols, 1.0)).collect();
                // SAFETY: a path this CPU has; lengths match.
                unsafe {
                    let one: Vec<u32> = x.iter().map(|r| (dot.one)(&w, r).to_bits()).collect();
                    let four = (multi.four)(&w, [&x[0], &x[1], &x[2], &x[3]]).map(f32::to_bits);
                    let three = (multi.three)(&w, [&x[0], &x[1], &x[2]]).map(f32::to_bits);
                    let two = (multi.two)(&w, [&x[0], &x[1]]).map(f32::to_bits);
                    assert_eq!(four.to_vec(), one, "{} {ty} x4, {cols} columns", k.isa());
                    assert_eq!(three.to_vec(), one[..3], "{} {ty} x3, {cols} columns", k.isa());
                    assert_eq!(two.to_vec(), one[..2], "{} {ty} x2, {cols} columns", k.isa());
                }
            }
        }
    }
}

/// The products of exact kernels on the weight rows of `m` from row 2 on
/// (an odd count) with one to `e.acts` of the activation rows, as `(weight
/// row, activation row, value)`; each call must write its rows' outputs and
/// nothing else.
fn exact_products<B>(e: Exact<B>, m: &QMatrix, acts: &[B], per_row: usize) -> Vec<(usize, usize, f32)> {
    let a = |j: usize| &acts[j * per_row..(j + 1) * per_row];
    let n_acts = acts.len() / per_row;
    let (r0, rows) = (2, m.rows - 2);
    let w = &m.data[r0 * m.row_bytes()..];
    let mut out = vec![];
    for n in 1..=e.acts {
        // Activation rows in another order each time: `t` takes row `js[t]`.
        let js: Vec<usize> = (0..n).map(|t| (3 * t + n) % n_acts).collect();
        let x: Vec<&[B]> = js.iter().map(|&j| a(j)).collect();
        let stride = rows + 3;
        let mut v = vec![f32::NAN; n * stride];
        // SAFETY: a path this CPU has; whole rows of whole blocks, matching activations.
        unsafe { (e.rows)(w, m.row_bytes(), &x, v.as_mut_ptr(), stride) };
        for (t, o) in v.chunks_exact(stride).enumerate() {
            out.extend(o[..rows].iter().enumerate().map(|(r, &g)| (r0 + r, js[t], g)));
            assert!(o[rows..].iter().all(|g| g.is_nan()), "an exact kernel wrote past its {rows} rows");
        }
    }
    out
}

#[test]
fn exact_kernels_equal_the_one_row_kernel_to_the_bit() {
    // Speculative verification batches the drafted tokens through these:
    // its logits must be decoding's to the bit (see `table::Exact`).
    let mut rng = Rng::new(23);
    let mut exact_types = Vec::new();
    for k in paths() {
        for ty in TYPES {
            let Some(exact) = k.exact_dot(ty) else { continue };
            exact_types.push((k.isa(), ty));
            for nb in [1, 2, 3, 5] {
                // From row 2 on, 7 rows: a rows kernel's groups of four or
                // two and a remainder.
                let (cols, rows, n) = (cols_for(ty, nb), 9, 7);
                let w = random_weights(ty, rows, cols, &mut rng);
                let m = QMatrix::new(ty, &w, rows, cols).expect("matrix");
                let mut acts = QActs::new();
                acts.quantize(ty, &rng.vec(n * cols, 1.0), n, cols);
                let got = match exact {
                    ExactDot::Q8_0(e) => exact_products(e, &m, &acts.q8_0, cols / 32),
                    ExactDot::Q8_1(e) => exact_products(e, &m, &acts.q8_1, cols / 32),
                    ExactDot::Q8K(e) => exact_products(e, &m, &acts.q8k, cols / 256),
                };
                assert!(!got.is_empty());
                // Decoding computes these rows as one tile: the rows kernel
                // over the same slice (on x86 every row as the one-row kernel).
                let rb = m.row_bytes();
                let decoded: Vec<Vec<f32>> = (0..n).map(|j| rows_on(k, ty, &m.data[2 * rb..], rb, &acts, j)).collect();
                for (r, j, g) in got {
                    let want = decoded[j][r - 2];
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{} {ty} nb={nb} ({r},{j}): {g} vs decoding's {want}",
                        k.isa()
                    );
                }
            }
        }
    }
    eprintln!("exact kernels: {exact_types:?}");
    // The formats of the small models speculation serves, on every SIMD path.
    for k in simd_paths() {
        for ty in [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K] {
            assert!(exact_types.contains(&(k.isa(), ty)), "{} has no exact {ty} kernel", k.isa());
        }
    }
}

#[test]
fn one_row_mode_products_equal_decoding_to_the_bit() {
    // A verify pass (the pool in one-row mode) against each of its rows as
    // a decode step (a product of one activation row), through the driver
    // and the pool: types with exact kernels and without (Q2_K, F16), row
    // counts that leave a remainder, and every path.
    let mut rng = Rng::new(29);
    let pool = ThreadPool::new(2);
    for k in paths() {
        for ty in
            [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q2K, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16]
        {
            let (rows, cols) = (301, 512);
            let w = random_weights(ty, rows, cols, &mut rng);
            let m = QMatrix::new(ty, &w, rows, cols).expect("matrix");
            for n in [2, 5, 9] {
                let x = rng.vec(n * cols, 1.0);
                let mut acts = QActs::new();
                acts.quantize(ty, &x, n, cols);
                let mut batch = vec![0f32; n * rows];
                pool.set_one_row(true);
                k.matmul(&pool, &m, &acts, &mut batch);
                pool.set_one_row(false);
                for (j, got) in batch.chunks_exact(rows).enumerate() {
                    let mut one = QActs::new();
                    one.quantize(ty, &x[j * cols..(j + 1) * cols], 1, cols);
                    let mut want = vec![0f32; rows];
                    k.matmul(&pool, &m, &one, &mut want);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(got), bits(&want), "{} {ty}: row {j} of {n}", k.isa());
                }
            }
        }
    }
}

/// `QActs::dequantize` gives the values the dot products use: the f32 dot of
/// the dequantised weights with them is the CPU product, up to rounding.
#[test]
fn dequantized_activations_are_what_the_products_see() {
    let mut rng = Rng::new(77);
    let pool = ThreadPool::new(1);
    let (rows, n) = (5, 2);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16] {
        let cols = 512;
        let w = random_weights(ty, rows, cols, &mut rng);
        let m = QMatrix::new(ty, &w, rows, cols).unwrap();
        let x = rng.vec(n * cols, 1.0);
        let mut acts = QActs::new();
        acts.quantize(ty, &x, n, cols);
        let mut got = vec![0f32; n * rows];
        matmul(&pool, &m, &acts, &mut got);
        let mut xq = Vec::new();
        acts.dequantize(&mut xq);
        assert_eq!(xq.len(), n * cols, "{ty}");
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(ty, m.row(r), &mut row);
            for t in 0..n {
                let xt = &xq[t * cols..(t + 1) * cols];
                let want: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = row.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let g = got[t * rows + r] as f64;
                assert!((g - want).abs() <= 1e-5 * scale + 1e-7, "{ty} row {r} token {t}: {g} vs {want}");
            }
        }
    }
}

/// A path's F32 rows kernel gives each row the bits its one-row kernel
/// gives it (decode takes the rows kernel, a verify pass the one-row one:
/// greedy output must not depend on which).
#[test]
fn f32_rows_kernels_equal_one_row_kernels_to_the_bit() {
    let mut rng = Rng::new(23);
    for k in simd_paths() {
        let Some(RowDot::F32(d)) = k.row_dot(GgmlType::F32) else { continue };
        let Some(rows_fn) = d.rows else { continue };
        for cols in [1, 7, 8, 15, 16, 23, 100, 2048] {
            for rows in 1..6 {
                let w: Vec<f32> = rng.vec(rows * cols, 1.0);
                let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
                let x = rng.vec(cols, 1.0);
                let mut got = vec![f32::NAN; rows];
                // SAFETY: kernels of a path this CPU has; whole rows.
                unsafe { rows_fn(&bytes, 4 * cols, &x, &mut got) };
                for (r, g) in got.iter().enumerate() {
                    // SAFETY: as above.
                    let want = unsafe { (d.one)(&bytes[r * 4 * cols..(r + 1) * 4 * cols], &x) };
                    assert_eq!(g.to_bits(), want.to_bits(), "{} F32 {rows}x{cols} row {r}", k.isa());
                }
            }
        }
    }
}

/// The interleaved kernels on four rows equal the path's rows kernels on the
/// same rows laid out plainly, to the bit (the same integers, the same float
/// operations per row: mapped experts, interleaved at load, and the expert
/// cache's, in the file's layout, give the same products); all the scalar
/// twin within rounding.
#[test]
fn x4_kernels_equal_the_rows_kernels() {
    use crate::quant::{q8_0_x4, x4};
    let mut rng = Rng::new(29);
    let mut ran = 0;
    for k in simd_paths() {
        for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0] {
            if !k.has_x4(ty) {
                continue;
            }
            for nb in [1, 2, 3, 8] {
                let cols = cols_for(ty, nb);
                let w = random_weights(ty, 4, cols, &mut rng);
                let rb = w.len() / 4;
                let x = rng.vec(cols, 1.0);
                let mut acts = QActs::new();
                acts.quantize(ty, &x, 1, cols);
                let mut packed = vec![0u8; x4::group_bytes(ty, cols)];
                x4::interleave_rows(ty, std::array::from_fn(|r| &w[r * rb..(r + 1) * rb]), &mut packed);
                let mut got = [f32::NAN; 4];
                // SAFETY: kernels of a path this CPU has; whole blocks.
                let twin = unsafe {
                    if ty == GgmlType::Q8_0 {
                        (k.x4_q8_0().expect("kernel"))(&packed, packed.len(), &acts.q8_0, &mut got);
                        x4::vec_dot_of::<q8_0_x4::BlockQ8_0x4, _>(&packed, &acts.q8_0, crate::quant::q8_0::vec_dot)
                    } else {
                        (k.x4(ty).expect("kernel"))(&packed, packed.len(), &acts.q8k, &mut got);
                        x4::vec_dot(ty, &packed, &acts.q8k)
                    }
                };
                let want = rows_on(k, ty, &w, rb, &acts, 0);
                for r in 0..4 {
                    let mag = magnitude(ty, &w[r * rb..(r + 1) * rb], &x);
                    let what =
                        format!("{} {ty} nb={nb} row {r}: {} vs rows {} / twin {}", k.isa(), got[r], want[r], twin[r]);
                    assert_eq!(got[r].to_bits(), want[r].to_bits(), "{what}");
                    assert!(close(got[r], want[r], mag) && close(got[r], twin[r], mag), "{what}");
                }
                ran += 1;
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        assert!(ran >= 12, "a dot-product path without the interleaved Q4_K, Q6_K and Q8_0 kernels");
    }
    let _ = ran;
}

/// Q4_K, Q6_K and Q8_0 matrices interleaved by four, through the driver and the
/// pool, on every path (those without the interleaved kernel lay every tile
/// out again): decode gives the products the path's rows kernel gives the
/// rows laid out plainly, to the bit (see
/// [`x4_kernels_equal_the_rows_kernels`]); a verify pass (one-row mode) gives each row what decoding it
/// alone gives, to the bit; a prompt (panels, multi-row kernels) what the
/// plain rows give, within rounding.
#[test]
fn interleaved_products_equal_plain_rows() {
    // The last four: an attention layer's and a shared expert's shapes (Q8_0 only).
    const SHAPES: [(usize, usize); 7] =
        [(4, 256), (36, 512), (300, 2048), (384, 256), (128, 256), (256, 384), (256, 192)];
    let mut rng = Rng::new(31);
    let pool = ThreadPool::new(2);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for k in paths() {
        for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0] {
            for (rows, cols) in SHAPES.into_iter().filter(|&(_, cols)| cols % ty.block_size() == 0) {
                let w = random_weights(ty, rows, cols, &mut rng);
                let plain = QMatrix::new(ty, &w, rows, cols).expect("matrix");
                let (rb, gb) = (plain.row_bytes(), crate::quant::x4::group_bytes(ty, cols));
                let mut packed = vec![0u8; rows / 4 * gb];
                for (g, out) in packed.chunks_exact_mut(gb).enumerate() {
                    let r = |i: usize| &w[(4 * g + i) * rb..(4 * g + i + 1) * rb];
                    crate::quant::x4::interleave_rows(ty, [r(0), r(1), r(2), r(3)], out);
                }
                let x4 = QMatrix::x4(ty, &packed, rows, cols).expect("interleaved matrix");
                let decode = |x: &[f32]| {
                    let mut acts = QActs::new();
                    acts.quantize(ty, x, 1, cols);
                    let mut got = vec![0f32; rows];
                    k.matmul(&pool, &x4, &acts, &mut got);
                    (acts, got)
                };
                // The rows kernel on plain rows `p` (`x`: the activations' floats).
                let rows_kernel = |p: &[u8], acts: &QActs, x: &[f32], got: &[f32], what: &str| {
                    let want = rows_on(k, ty, p, rb, acts, 0);
                    assert_eq!(bits(got), bits(&want), "{} {ty} {rows}x{cols}: {what}", k.isa());
                    for (r, (g, w_)) in got.iter().zip(&want).enumerate() {
                        let mag = magnitude(ty, &p[r * rb..(r + 1) * rb], x);
                        assert!(close(*g, *w_, mag), "{} {ty} {rows}x{cols}: {what} [{r}] {g} vs {w_}", k.isa());
                    }
                };
                // Decode against the rows kernel on the plain rows.
                let x = rng.vec(cols, 1.0);
                let (acts, got) = decode(&x);
                rows_kernel(&w, &acts, &x, &got, "decode");
                for n in [2, 5, 16, 17, 37] {
                    let x = rng.vec(n * cols, 1.0);
                    let mut acts = QActs::new();
                    acts.quantize(ty, &x, n, cols);
                    // A verify pass: each row as decoding it alone.
                    let mut batch = vec![0f32; n * rows];
                    pool.set_one_row(true);
                    k.matmul(&pool, &x4, &acts, &mut batch);
                    pool.set_one_row(false);
                    for (j, got) in batch.chunks_exact(rows).enumerate() {
                        let (_, want) = decode(&x[j * cols..(j + 1) * cols]);
                        assert_eq!(bits(got), bits(&want), "{} {ty} {rows}x{cols}: verify row {j} of {n}", k.isa());
                    }
                    // A prompt, against the plain rows.
                    let (mut want, mut got) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                    k.matmul(&pool, &plain, &acts, &mut want);
                    k.matmul(&pool, &x4, &acts, &mut got);
                    for (i, (g, w_)) in got.iter().zip(&want).enumerate() {
                        let (j, r) = (i / rows, i % rows);
                        let mag = magnitude(ty, plain.row(r), &x[j * cols..(j + 1) * cols]);
                        assert!(
                            close(*g, *w_, mag),
                            "{} {ty} {rows}x{cols}, {n} rows: [{j}][{r}] {g} vs {w_}",
                            k.isa()
                        );
                    }
                }
                // A slab of whole groups, as an expert's.
                if rows > 4 {
                    let (s, p) = (x4.rows_slice(4, rows - 4), plain.rows_slice(4, rows - 4));
                    let x = rng.vec(cols, 1.0);
                    let mut acts = QActs::new();
                    acts.quantize(ty, &x, 1, cols);
                    let mut got = vec![0f32; s.rows];
                    k.matmul(&pool, &s, &acts, &mut got);
                    rows_kernel(p.data, &acts, &x, &got, "slab");
                }
            }
        }
    }
}
