//! Every GPU kernel against the CPU reference: the weights dequantised with
//! `crate::quant` and multiplied in f64, on random valid blocks of every
//! format, odd row counts and odd lengths, one and several tokens, with and
//! without a matrix split over bindings.
//!
//! The tests of the kernels run every form of them the adapter can run
//! ([`KernelVariant`]: with and without `shader-f16`, with and without
//! subgroups; lavapipe has both).
//!
//! Without an adapter the tests print why and pass; `POCKET_REQUIRE_GPU=1`
//! (set by `scripts/test.sh`, which installs lavapipe) makes that a failure.

use super::{with_block_sums, Gpu, GpuBatch, GpuMatrix, GpuOptions, KernelVariant, RowsJob, FORMATS};
use crate::kernels::testing::{random_weights, Rng};
use crate::kernels::{self};
use crate::quant::GgmlType;
use crate::Error;

/// The device, or `None` (printing why) when there is none and none is required.
pub(super) fn device(opts: &GpuOptions) -> Option<Gpu> {
    match Gpu::new(opts) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var("POCKET_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("POCKET_REQUIRE_GPU=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipping the GPU test: {e}");
            None
        }
    }
}

/// A device per form of the kernels the adapter can run (each of
/// `shader-f16` and subgroups on and off where offered), or none.
pub(super) fn variants(base: &GpuOptions) -> Vec<Gpu> {
    let mut seen = Vec::new();
    let mut gpus = Vec::new();
    for (no_f16, no_subgroups) in [(false, false), (true, false), (false, true), (true, true)] {
        let Some(gpu) = device(&GpuOptions { no_f16, no_subgroups, ..base.clone() }) else { return Vec::new() };
        if !seen.contains(&gpu.kernels()) {
            seen.push(gpu.kernels());
            gpus.push(gpu);
        }
    }
    gpus
}

/// Columns of a test matrix: a few blocks, odd where the format allows.
fn test_cols(ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => 67,
        32 => 7 * 32,
        b => 3 * b,
    }
}

/// `W · x[t]` in f64 from the CPU's dequantisation, and per output the sum
/// of |w·x| terms (the scale of the rounding error f32 sums may make).
pub(super) fn reference(ty: GgmlType, rows: usize, cols: usize, w: &[u8], x: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let row_bytes = w.len() / rows;
    let mut deq = vec![0f32; cols];
    let (mut want, mut scale) = (vec![0f64; n * rows], vec![0f64; n * rows]);
    for r in 0..rows {
        kernels::dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut deq);
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            want[t * rows + r] = deq.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
            scale[t * rows + r] = deq.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        }
    }
    (want, scale)
}

pub(super) fn assert_close(what: &str, got: &[f32], want: &[f64], scale: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let tol = 3e-5 * s + 1e-7;
        assert!((g as f64 - w).abs() <= tol, "{what}: output {i}: gpu {g} vs cpu {w} (tolerance {tol:e})");
    }
}

#[test]
fn every_format_matches_the_cpu_reference() {
    for gpu in variants(&GpuOptions::default()) {
        every_format_matches_the_cpu_reference_on(&gpu);
    }
}

fn every_format_matches_the_cpu_reference_on(gpu: &Gpu) {
    let mut rng = Rng::new(24);
    let rows = 37;
    let v = gpu.kernels().name();
    for ty in FORMATS {
        let cols = test_cols(ty);
        let w = random_weights(ty, rows, cols, &mut rng);
        let m = GpuMatrix::upload(gpu, ty, rows, cols, &w).unwrap_or_else(|e| panic!("{ty} ({v}): {e}"));
        assert_eq!(m.bindings(), 1, "{ty}");
        for n in [1, 3] {
            let x = rng.vec(n * cols, 1.0);
            let mut got = Vec::new();
            m.matmul(&with_block_sums(ty, &x), n, &mut got).unwrap_or_else(|e| panic!("{ty} ({v}): {e}"));
            let (want, scale) = reference(ty, rows, cols, &w, &x, n);
            assert_close(&format!("{ty} {rows}x{cols}, {n} tokens ({v})"), &got, &want, &scale);
        }
        // matvec is the one-token product.
        let x = rng.vec(cols, 1.0);
        let (want, scale) = reference(ty, rows, cols, &w, &x, 1);
        assert_close(&format!("{ty} matvec ({v})"), &m.matvec(&with_block_sums(ty, &x)).unwrap(), &want, &scale);
    }
}

/// A job of the test below: matrix, its bytes, its rows, input, chosen rows.
type Pick<'a> = (&'a GpuMatrix, &'a [u8], usize, usize, &'a [usize]);

/// Products over chosen rows (a MoE layer's experts over their tokens): for
/// every format, two matrices of odd sizes over shared inputs, rows repeated
/// and out of order, an empty job among them, all in one submission.
#[test]
fn products_over_chosen_rows_match_the_cpu_reference() {
    for gpu in variants(&GpuOptions::default()) {
        products_over_chosen_rows_match_the_cpu_reference_on(&gpu);
    }
}

fn products_over_chosen_rows_match_the_cpu_reference_on(gpu: &Gpu) {
    let mut rng = Rng::new(25);
    let batch = GpuBatch::new(gpu);
    for ty in FORMATS {
        let cols = test_cols(ty);
        let (n, rows_a, rows_b) = (5, 37, 11);
        let wa = random_weights(ty, rows_a, cols, &mut rng);
        let wb = random_weights(ty, rows_b, cols, &mut rng);
        let a = GpuMatrix::upload(gpu, ty, rows_a, cols, &wa).unwrap();
        let b = GpuMatrix::upload(gpu, ty, rows_b, cols, &wb).unwrap();
        let x0 = rng.vec(n * cols, 1.0);
        let x1 = rng.vec(3 * cols, 1.0);
        let picks: [Pick; 4] = [
            (&a, &wa, rows_a, 0, &[4, 0, 2]),
            (&b, &wb, rows_b, 0, &[]),
            (&b, &wb, rows_b, 1, &[2, 2, 0, 1]),
            (&a, &wa, rows_a, 1, &[1]),
        ];
        let (d0, d1) = (with_block_sums(ty, &x0), with_block_sums(ty, &x1));
        let inputs = [(&d0[..], a.act_cols()), (&d1[..], a.act_cols())];
        let raw = [&x0, &x1];
        let jobs: Vec<RowsJob> = picks
            .iter()
            .map(|&(m, _, _, input, rows)| RowsJob { matrix: m, input, rows, w_rows: 0..m.rows() })
            .collect();
        let before = gpu.counters();
        let mut got = Vec::new();
        batch.run(&inputs, &jobs, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let d = gpu.counters() - before;
        assert_eq!((d.submissions, d.readbacks, d.dispatches), (1, 1, 3), "{ty}");
        let mut at = 0;
        for (j, &(_, w, rows, input, picked)) in picks.iter().enumerate() {
            let x: Vec<f32> = picked.iter().flat_map(|&r| raw[input][r * cols..(r + 1) * cols].to_vec()).collect();
            let (want, scale) = reference(ty, rows, cols, w, &x, picked.len());
            let len = picked.len() * rows;
            assert_close(&format!("{ty} job {j}"), &got[at..at + len], &want, &scale);
            at += len;
        }
        assert_eq!(at, got.len(), "{ty}");
    }
}

#[test]
fn products_over_chosen_rows_split_over_bindings_and_refuse_bad_jobs() {
    let Some(split) = device(&GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }) else { return };
    let mut rng = Rng::new(26);
    let (ty, rows) = (GgmlType::Q6K, 37);
    let cols = test_cols(ty);
    let w = random_weights(ty, rows, cols, &mut rng);
    let m = GpuMatrix::upload(&split, ty, rows, cols, &w).unwrap();
    assert!(m.bindings() > 1);
    // One row of activations (3 KiB: more would not fit a binding).
    let x = rng.vec(cols, 1.0);
    let batch = GpuBatch::new(&split);
    let mut got = Vec::new();
    let picked = [0, 0, 0];
    batch
        .run(&[(&x, cols)], &[RowsJob { matrix: &m, input: 0, rows: &picked, w_rows: 0..m.rows() }], &mut got)
        .unwrap();
    let xs: Vec<f32> = picked.iter().flat_map(|&r| x[r * cols..(r + 1) * cols].to_vec()).collect();
    let (want, scale) = reference(ty, rows, cols, &w, &xs, 3);
    assert_close("Q6_K over chosen rows, split", &got, &want, &scale);
    // A row past the input, a missing input, a matrix of the wrong width or
    // of another device: refused before anything runs.
    let bad = |input, rows: &[usize], x: &[f32], cols| {
        let r = batch.run(&[(x, cols)], &[RowsJob { matrix: &m, input, rows, w_rows: 0..m.rows() }], &mut Vec::new());
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    };
    bad(0, &[1], &x, cols);
    bad(1, &[0], &x, cols);
    bad(0, &[0], &x[..cols - 32], cols - 32);
    let Some(other) = device(&GpuOptions::default()) else { return };
    let r = GpuBatch::new(&other).run(
        &[(&x, cols)],
        &[RowsJob { matrix: &m, input: 0, rows: &[0], w_rows: 0..m.rows() }],
        &mut got,
    );
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

#[test]
fn a_matrix_split_over_bindings_gives_the_same_products() {
    let Some(whole) = device(&GpuOptions::default()) else { return };
    // 4 KiB bindings: a few rows each (a chunk's byte length not a whole
    // word for F16 and Q8_0), and the activations of one token at a time.
    let Some(split) = device(&GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }) else { return };
    let mut rng = Rng::new(16);
    let rows = 37;
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::F16] {
        let cols = test_cols(ty);
        let w = random_weights(ty, rows, cols, &mut rng);
        let a = GpuMatrix::upload(&whole, ty, rows, cols, &w).unwrap();
        let b = GpuMatrix::upload(&split, ty, rows, cols, &w).unwrap();
        assert!(b.bindings() > 1, "{ty}: {} binding(s)", b.bindings());
        let n = 3;
        let x = rng.vec(n * cols, 1.0);
        let (mut ya, mut yb) = (Vec::new(), Vec::new());
        a.matmul(&x, n, &mut ya).unwrap();
        b.matmul(&x, n, &mut yb).unwrap();
        // Each row is computed the same way whichever binding holds it.
        assert_eq!(ya, yb, "{ty}: split over {} bindings", b.bindings());
        let (want, scale) = reference(ty, rows, cols, &w, &x, n);
        assert_close(&format!("{ty} split"), &yb, &want, &scale);
    }
}

#[test]
fn rows_past_the_grid_limit_and_token_batches_give_the_same_products() {
    let Some(whole) = device(&GpuOptions::default()) else { return };
    // At most 7 workgroups per dimension: 37 rows take a 7 x 6 grid (the
    // last rows of the y grid idle), 10 tokens go in batches of 7 and 3.
    let small = GpuOptions { max_workgroups_per_dimension: Some(7), ..Default::default() };
    let Some(grid) = device(&small) else { return };
    let mut rng = Rng::new(7);
    let (ty, rows, n) = (GgmlType::Q5K, 37, 10);
    let cols = test_cols(ty);
    let w = random_weights(ty, rows, cols, &mut rng);
    let a = GpuMatrix::upload(&whole, ty, rows, cols, &w).unwrap();
    let b = GpuMatrix::upload(&grid, ty, rows, cols, &w).unwrap();
    let x = rng.vec(n * cols, 1.0);
    let (mut ya, mut yb) = (Vec::new(), Vec::new());
    a.matmul(&x, n, &mut ya).unwrap();
    b.matmul(&x, n, &mut yb).unwrap();
    assert_eq!(ya, yb);
    let (want, scale) = reference(ty, rows, cols, &w, &x, n);
    assert_close("Q5_K on a 7 x 6 grid", &yb, &want, &scale);
}

/// Every f16 bit pattern decodes exactly (subnormals, infinities, NaN): a
/// 65,536 x 1 F16 matrix times [1] is the list of all values, and its rows
/// run past the 65,535 workgroups of one grid dimension.
#[test]
fn every_f16_value_decodes_exactly() {
    // With and without `shader-f16` (the subgroups do not matter here).
    let mut forms = vec![GpuOptions { no_subgroups: true, ..Default::default() }, GpuOptions::portable()];
    forms.dedup_by_key(|o| device(o).map(|g| g.kernels()));
    for opts in forms {
        let Some(gpu) = device(&opts) else { return };
        let v = gpu.kernels().name();
        let w: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let m = GpuMatrix::upload(&gpu, GgmlType::F16, 1 << 16, 1, &w).unwrap();
        let got = m.matvec(&[1.0]).unwrap();
        for (h, g) in (0..=u16::MAX).zip(got) {
            let want = half::f16::from_bits(h).to_f32();
            // Zeros lose their sign in the workgroup sum (0 + -0 = 0).
            assert!(g == want || (g.is_nan() && want.is_nan()), "{h:#06x} ({v}): gpu {g} vs {want}");
        }
    }
}

/// Every module of every form parses and validates in naga and translates
/// to MSL (the Metal backend's input, which no machine here runs) and
/// SPIR-V: validated with exactly the capabilities its form uses, and a
/// form that uses `shader-f16` or subgroups fails validation without them
/// (so it really uses them, and the portable form needs neither).
#[test]
fn every_module_translates_to_msl_and_spirv() {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    for (f16, subgroups) in [(false, false), (true, false), (false, true), (true, true)] {
        let v = KernelVariant { f16, subgroups };
        let mut caps = Capabilities::empty();
        caps.set(Capabilities::SHADER_FLOAT16, f16);
        caps.set(Capabilities::SUBGROUP, subgroups);
        for (ty, source) in super::shaders::all(v) {
            let what = format!("{ty} ({})", v.name());
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            let info = Validator::new(ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            // The delta rule and the KV store have no reductions and no f16
            // (one form for all), the graph's operations no f16.
            let one_form = ty == "delta rule" || ty == "kv store" || ty == "graph" && !subgroups;
            if v != KernelVariant::PORTABLE && !one_form {
                let bare = Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&module);
                assert!(bare.is_err(), "{what} validates without its capabilities");
            }
            let msl_options = naga::back::msl::Options { lang_version: (2, 0), ..Default::default() };
            let (msl, _) = naga::back::msl::write_string(&module, &info, &msl_options, &Default::default())
                .unwrap_or_else(|e| panic!("{what} to MSL: {e}"));
            assert!(msl.contains("kernel void"), "{what}: no compute kernel in the MSL");
            let spv = naga::back::spv::write_vec(&module, &info, &Default::default(), None)
                .unwrap_or_else(|e| panic!("{what} to SPIR-V: {e}"));
            assert_eq!(spv.first(), Some(&0x0723_0203), "{what}: SPIR-V magic");
        }
    }
}

#[test]
fn wrong_shapes_and_formats_are_errors() {
    let Some(gpu) = device(&GpuOptions::default()) else { return };
    let w = vec![0u8; 2 * 144];
    assert!(matches!(GpuMatrix::upload(&gpu, GgmlType::Q4K, 2, 256, &w[1..]), Err(Error::InvalidArgument(_))));
    assert!(matches!(GpuMatrix::upload(&gpu, GgmlType::Q4K, 2, 100, &w), Err(Error::InvalidArgument(_))));
    assert!(matches!(GpuMatrix::upload(&gpu, GgmlType::Q8K, 1, 256, &[0; 292]), Err(Error::InvalidArgument(_))));
    let m = GpuMatrix::upload(&gpu, GgmlType::Q4K, 2, 256, &w).unwrap();
    assert!(matches!(m.matvec(&[0.0; 255]), Err(Error::InvalidArgument(_))));
    assert!(matches!(m.matmul(&[], 0, &mut Vec::new()), Err(Error::InvalidArgument(_))));
    // A row larger than the binding cannot be split.
    let Some(tiny) = device(&GpuOptions { max_binding_bytes: Some(64), ..Default::default() }) else { return };
    assert!(matches!(GpuMatrix::upload(&tiny, GgmlType::Q4K, 2, 256, &w), Err(Error::InvalidArgument(_))));
}

/// Weights handed over in pieces (as positional reads of the file deliver
/// them, straight into the mapped device buffers) give exactly the
/// products of weights copied from memory, split over bindings; a read
/// that delivers too few or too many bytes, or fails, is an error.
#[test]
fn weights_read_in_pieces_equal_weights_copied_from_memory() {
    let Some(gpu) = device(&GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }) else { return };
    let mut rng = Rng::new(33);
    let (ty, rows, cols) = (GgmlType::Q6K, 37usize, 512usize);
    let w = random_weights(ty, rows, cols, &mut rng);
    let x = rng.vec(cols, 1.0);
    let copied = GpuMatrix::upload(&gpu, ty, rows, cols, &w).unwrap();
    let mut pieces = 0;
    let read = GpuMatrix::upload_with(&gpu, ty, rows, cols, w.len(), &mut |off, len, put| {
        for piece in w[off..off + len].chunks(333) {
            put(piece);
            pieces += 1;
        }
        Ok(())
    })
    .unwrap();
    assert!(read.bindings() > 1 && pieces > read.bindings());
    assert_eq!(read.matvec(&x).unwrap(), copied.matvec(&x).unwrap());
    let short = GpuMatrix::upload_with(&gpu, ty, rows, cols, w.len(), &mut |off, len, put| {
        put(&w[off..off + len - 1]);
        Ok(())
    });
    assert!(matches!(short, Err(Error::InvalidArgument(_))), "a short read");
    let long = GpuMatrix::upload_with(&gpu, ty, rows, cols, w.len(), &mut |off, len, put| {
        put(&w[off..off + len]);
        put(&[0]);
        Ok(())
    });
    assert!(matches!(long, Err(Error::InvalidArgument(_))), "a long read");
    let failed = GpuMatrix::upload_with(&gpu, ty, rows, cols, w.len(), &mut |_, _, _| {
        Err(Error::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "truncated")))
    });
    assert!(matches!(failed, Err(Error::Io(_))), "a failed read");
}

#[test]
fn the_adapter_describes_itself() {
    let Some(gpu) = device(&GpuOptions::default()) else { return };
    let info = gpu.info();
    assert!(!info.name.is_empty());
    assert!(info.backend == "vulkan" || info.backend == "metal", "{}", info.backend);
    assert!(info.limits.max_storage_buffer_binding_size >= 16 << 20, "{:?}", info.limits);
    assert_eq!(gpu.max_binding_bytes() % 4, 0);
    // The kernels use what the adapter offers, unless told not to.
    eprintln!("{}: kernels {}", info.name, info.kernels.name());
    assert_eq!(info.kernels, KernelVariant { f16: info.shader_f16, subgroups: info.subgroups });
    assert_eq!(gpu.kernels(), info.kernels);
    let Some(portable) = device(&GpuOptions::portable()) else { return };
    assert_eq!(portable.kernels(), KernelVariant::PORTABLE);
    let Some(no_f16) = device(&GpuOptions { no_f16: true, ..Default::default() }) else { return };
    assert_eq!(no_f16.kernels(), KernelVariant { f16: false, subgroups: info.subgroups });
}

/// `round_to_half` (`shaders/half.wgsl`: the f16 rounding of an f16 KV
/// cache's queries and attention weights) gives what the CPU's conversion to
/// f16 and back gives, bit for bit: on every f16 value, the midpoints
/// between neighbours (ties go to even), one f32 step either side of them,
/// the overflow threshold and random values.
#[test]
fn rounding_to_f16_matches_the_cpu() {
    let Some(gpu) = device(&GpuOptions::default()) else { return };
    let mut xs = Vec::new();
    for h in 0..0x7c00u16 {
        let (a, b) = (half::f16::from_bits(h).to_f32(), half::f16::from_bits(h + 1).to_f32());
        let mid = (a as f64 + b as f64) / 2.0;
        let mid = mid as f32;
        for x in [a, mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)] {
            xs.extend([x, -x]);
        }
    }
    xs.extend([65504.0, 65519.99, 65520.0, 1e6, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0]);
    let mut rng = Rng::new(27);
    xs.extend((0..4096).map(|_| rng.signed() * 10f32.powi(rng.below(12) as i32 - 8)));
    // f32 subnormals may be flushed on the device; they are not the question here.
    xs.retain(|x| *x == 0.0 || x.is_infinite() || x.is_normal());

    let source = format!(
        "@group(0) @binding(0) var<storage, read> xs: array<f32>;
         @group(0) @binding(1) var<storage, read_write> ys: array<f32>;
         @compute @workgroup_size(64)
         fn main(@builtin(global_invocation_id) id: vec3<u32>) {{
             if (id.x < arrayLength(&xs)) {{
                 ys[id.x] = round_to_half(xs[id.x]);
             }}
         }}
         {}",
        include_str!("shaders/round_half.wgsl")
    );
    let device = gpu.device();
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("round to half"),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("round to half"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    use wgpu::util::DeviceExt;
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    let input = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: &bytes,
        usage: wgpu::BufferUsages::STORAGE,
    });
    let size = bytes.len() as u64;
    let buffer =
        |usage| device.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
    let output = buffer(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC);
    let readback = buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: input.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: output.as_entire_binding() },
        ],
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(xs.len().div_ceil(64) as u32, 1, 1);
    }
    enc.copy_buffer_to_buffer(&output, 0, &readback, 0, size);
    gpu.queue().submit([enc.finish()]);
    let mut got = Vec::new();
    gpu.read_f32(&readback, size, &mut got).unwrap();
    for (x, g) in xs.iter().zip(&got) {
        let want = half::f16::from_f32(*x).to_f32();
        assert_eq!(g.to_bits(), want.to_bits(), "{x:e} ({:#010x}): gpu {g:e} vs cpu {want:e}", x.to_bits());
    }
}
