//! `matmul_batch` equals the products one by one, whatever their types.

mod common;

use pocket_core::gguf::GgufFile;
use pocket_core::kernels::{self, MatJob, QActs, QMatrix};
use pocket_core::threads::ThreadPool;

#[test]
fn batched_products_equal_single_ones() {
    let g = GgufFile::open(common::fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf")).unwrap();
    let mat = |name: &str| {
        let t = g.tensor(name).unwrap();
        let rows = (t.n_elements() / t.dims[0]) as usize;
        QMatrix::new(t.ty, g.tensor_data(t), rows, t.dims[0] as usize).unwrap()
    };
    // Q4_K, Q8_0, Q6_K and one expert slab of a stacked tensor.
    let ws = [
        mat("blk.0.attn_q.weight"),
        mat("blk.0.attn_k.weight"),
        mat("output.weight"),
        mat("blk.0.ffn_gate_exps.weight").rows_slice(256 * 3, 256),
    ];
    let (n, k) = (5, 256);
    let x: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
    let mut acts = Vec::new();
    for w in &ws {
        let mut a = QActs::new();
        a.quantize(w.ty, &x, n, k);
        acts.push(a);
    }
    let rows = [4usize, 1, 3];
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        let mut single: Vec<Vec<f32>> = Vec::new();
        for (i, w) in ws.iter().enumerate() {
            let m = if i == 3 { rows.len() } else { n };
            let mut out = vec![0f32; m * w.rows];
            if i == 3 {
                kernels::matmul_rows(&pool, w, &acts[i], &rows, &mut out);
            } else {
                kernels::matmul(&pool, w, &acts[i], &mut out);
            }
            single.push(out);
        }
        let mut outs: Vec<Vec<f32>> = single.iter().map(|o| vec![f32::NAN; o.len()]).collect();
        {
            let mut jobs: Vec<MatJob> = ws
                .iter()
                .zip(&acts)
                .zip(outs.iter_mut())
                .enumerate()
                .map(|(i, ((w, x), out))| MatJob { w: *w, x, rows: (i == 3).then_some(&rows[..]), out })
                .collect();
            kernels::matmul_batch(&pool, &mut jobs);
        }
        assert_eq!(outs, single, "{threads} threads");
    }
}
