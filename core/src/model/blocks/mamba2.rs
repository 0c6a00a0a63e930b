//! Mamba2 (a selective state-space layer), as Granite 4.0-H's recurrent
//! layers store it in GGUF.
//!
//! Per token: project x to z | xBC | dt (one matrix); run a short causal
//! depthwise conv (kernel d_conv, with a bias) over xBC, then SiLU; xBC then
//! splits into x (n_head heads of head_dim), B and C (n_group groups of
//! d_state each). For every head h, in group g = h / (n_head / n_group),
//! with state S (head_dim x d_state):
//!
//! ```text
//!   dt <- softplus(dt + dt_bias)
//!   S  <- exp(dt A) S + dt x B_g^T       (A = -exp(A_log), as the converter stores it)
//!   y   = S C_g + D x
//! ```
//!
//! and the output is RMSNorm(y * SiLU(z)) per group of d_inner / n_group
//! channels, projected back to n_embd. The state (the conv window and S) is
//! a [`DeltaState`]'s two buffers: checkpoints and snapshots take it as
//! they take DeltaNet's.

use super::super::hparams::Meta;
use super::super::pass::{HostBlock, Pass};
use super::super::scratch::{take, SharedMut};
use super::super::ssm::Ssm;
use super::super::weights::{Loader, Matrix};
use super::deltanet::{taps_major, DeltaState};
use crate::error::Result;
use crate::gguf::{Key, TensorKind};
use crate::kernels::{ops, QActs};
use crate::threads::{Pieces, ThreadPool};

/// Floats of one layer's scan state above which a file is refused as corrupt
/// (Granite 4.0-H-Small holds 1M; this is 256 MiB).
const MAX_STATE_FLOATS: usize = 1 << 26;

/// Shape of a Mamba2 layer.
#[derive(Clone, Copy, Debug)]
pub struct Mamba2Params {
    /// Channels of x (and of z and y): n_head * head_dim.
    pub d_inner: usize,
    /// Size of B, C and each row of S.
    pub d_state: usize,
    /// Groups of B and C, each shared by n_head / n_group heads.
    pub n_group: usize,
    pub n_head: usize,
    /// Conv kernel width (4).
    pub d_conv: usize,
    /// Epsilon of the gated group RMSNorm.
    pub eps: f32,
}

impl Mamba2Params {
    /// The `ssm.*` keys of `m`, checked against each other.
    pub fn read(m: &Meta, eps: f32) -> Result<Mamba2Params> {
        let d_inner = m.nonzero(Key::SsmInnerSize)?;
        let d_state = m.nonzero(Key::SsmStateSize)?;
        let n_group = m.nonzero(Key::SsmGroupCount)?;
        let n_head = m.nonzero(Key::SsmTimeStepRank)?;
        let d_conv = m.nonzero(Key::SsmConvKernel)?;
        m.ensure(Key::SsmConvKernel, (2..=16).contains(&d_conv), "must be 2..16")?;
        m.ensure(Key::SsmTimeStepRank, d_inner % n_head == 0, "heads must split inner_size evenly")?;
        m.ensure(Key::SsmGroupCount, n_head % n_group == 0, "groups must split the heads evenly")?;
        m.ensure(Key::SsmStateSize, d_inner * d_state <= MAX_STATE_FLOATS, "state too large")?;
        Ok(Mamba2Params { d_inner, d_state, n_group, n_head, d_conv, eps })
    }

    pub fn head_dim(&self) -> usize {
        self.d_inner / self.n_head
    }

    /// Channels of xBC, which pass through the conv.
    pub fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.n_group * self.d_state
    }

    /// Rows of the input projection: z | xBC | dt.
    pub fn in_dim(&self) -> usize {
        self.d_inner + self.conv_dim() + self.n_head
    }

    /// Floats of the conv window (`[d_conv-1][conv_dim]`) and of S (`[n_head][head_dim][d_state]`).
    pub fn state_floats(&self) -> (usize, usize) {
        ((self.d_conv - 1) * self.conv_dim(), self.d_inner * self.d_state)
    }

    /// Whether `st` is a state of this shape (not another model's).
    pub fn fits(&self, st: &DeltaState) -> bool {
        self.state_floats() == (st.conv.len(), st.ssm.len())
    }

    /// A fresh (zero) state of one sequence.
    pub fn new_state(&self) -> DeltaState {
        let (conv, ssm) = self.state_floats();
        DeltaState { conv: Ssm::new(conv), ssm: Ssm::new(ssm) }
    }
}

/// One Mamba2 layer. Shapes (rows x cols): in `[in_dim, n_embd]`, conv
/// `[d_conv][conv_dim]` (tap-major: transposed from the file's
/// `[conv_dim][d_conv]`), conv bias `[conv_dim]`, dt_bias/a/d `[n_head]`,
/// norm `[d_inner]` (the file's `[d_inner / n_group, n_group]`, group after
/// group), out `[n_embd, d_inner]`.
pub struct Mamba2 {
    pub p: Mamba2Params,
    pub in_proj: Matrix,
    pub conv: Vec<f32>,
    pub conv_bias: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: Matrix,
}

impl Mamba2 {
    /// Layer `il`'s tensors; a file without a conv bias gets zeros (llama.cpp's loader allows it).
    pub fn load(ld: &Loader, il: usize, n_embd: usize, p: Mamba2Params) -> Result<Mamba2> {
        let (cd, nh) = (p.conv_dim(), p.n_head as u64);
        let conv = ld.vector_shaped(&TensorKind::SsmConv1d.weight(il), &[p.d_conv as u64, cd as u64])?;
        Ok(Mamba2 {
            in_proj: ld.matrix(TensorKind::SsmIn, il, p.in_dim(), n_embd)?,
            conv: taps_major(&conv, p.d_conv),
            conv_bias: ld.bias_opt(TensorKind::SsmConv1d, il, cd)?.unwrap_or_else(|| vec![0.0; cd]),
            dt_bias: ld.vector_shaped(&TensorKind::SsmDt.bias(il), &[nh])?,
            a: ld.vector_shaped(&TensorKind::SsmA.weight(il), &[1, nh])?,
            d: ld.vector_shaped(&TensorKind::SsmD.weight(il), &[1, nh])?,
            norm: ld
                .vector_shaped(&TensorKind::SsmNorm.weight(il), &[(p.d_inner / p.n_group) as u64, p.n_group as u64])?,
            out: ld.matrix(TensorKind::SsmOut, il, n_embd, p.d_inner)?,
            p,
        })
    }
}

/// What a Mamba2 layer reuses from pass to pass.
#[derive(Default)]
pub struct Mamba2Scratch {
    /// z | xBC | dt of every token, `[n][in_dim]`.
    zxbcdt: Vec<f32>,
    /// xBC after the conv and SiLU, `[n][conv_dim]`.
    xbc: Vec<f32>,
    /// softplus(dt + dt_bias), `[n][n_head]`.
    dt: Vec<f32>,
    /// The heads' outputs, `[n][d_inner]`.
    y: Vec<f32>,
    input: QActs,
    heads: QActs,
}

impl Mamba2Scratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        heap(&self.zxbcdt)
            + heap(&self.xbc)
            + heap(&self.dt)
            + heap(&self.y)
            + self.input.heap_bytes()
            + self.heads.heap_bytes()
    }
}

impl Mamba2 {
    /// `out = Mamba2(x)` for the pass's tokens (`[n][n_embd]` each); the
    /// state advances by `n` tokens. The scan runs on the CPU whatever the
    /// backend (the products go to the backend); it fails only when the
    /// state, newer on a device, cannot be read back.
    pub fn forward(
        &self,
        pass: &Pass,
        st: &mut DeltaState,
        s: &mut Mamba2Scratch,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let (p, n) = (&self.p, pass.n);
        let (di, cd, nh, in_dim) = (p.d_inner, p.conv_dim(), p.n_head, p.in_dim());

        pass.backend.on_host(HostBlock::Mamba2);
        // Input projection: z [d_inner] | xBC [conv_dim] | dt [n_head] per token.
        let zxbcdt = take(&mut s.zxbcdt, n * in_dim);
        pass.project(&self.in_proj, &mut s.input, x, zxbcdt);

        // Causal depthwise conv over [state window | new xBC], plus bias, then SiLU.
        let xbc = take(&mut s.xbc, n * cd);
        let window = st.conv.host_mut()?;
        causal_conv(&self.conv, &self.conv_bias, window, zxbcdt, di, xbc);

        // dt = softplus(dt + dt_bias)
        let dt = take(&mut s.dt, n * nh);
        for (row, zrow) in dt.chunks_exact_mut(nh).zip(zxbcdt.chunks_exact(in_dim)) {
            for ((d, &raw), &bias) in row.iter_mut().zip(&zrow[di + cd..]).zip(&self.dt_bias) {
                *d = softplus(raw + bias);
            }
        }

        // The selective scan, head by head: y = S C after S <- exp(dt A) S + dt x B^T.
        let y = take(&mut s.y, n * di);
        scan(pass.pool, p, &self.a, xbc, dt, st.ssm.host_mut()?, y);

        // y += D x; y *= SiLU(z); RMSNorm per group.
        let (hd, gs) = (p.head_dim(), di / p.n_group);
        for ((yt, xt), zt) in y.chunks_exact_mut(di).zip(xbc.chunks_exact(cd)).zip(zxbcdt.chunks_exact_mut(in_dim)) {
            for ((yh, xh), &d) in yt.chunks_exact_mut(hd).zip(xt[..di].chunks_exact(hd)).zip(&self.d) {
                yh.iter_mut().zip(xh).for_each(|(y, &x)| *y += x * d);
            }
            let z = &mut zt[..di];
            ops::silu(z);
            ops::mul(yt, z);
            for (yg, wg) in yt.chunks_exact_mut(gs).zip(self.norm.chunks_exact(gs)) {
                ops::rms_norm_inplace(yg, Some(wg), p.eps);
            }
        }

        // Output projection.
        pass.project(&self.out, &mut s.heads, y, out);
        Ok(())
    }
}

/// `out[t] = SiLU(bias + sum_j taps[j] * input[t + j - (d_conv - 1)])` per
/// channel, where the inputs are xBC of each token (at `offset` in each row
/// of `rows`) preceded by the `d_conv - 1` of `window` (oldest first); the
/// window then holds the last `d_conv - 1` inputs.
fn causal_conv(taps: &[f32], bias: &[f32], window: &mut [f32], rows: &[f32], offset: usize, out: &mut [f32]) {
    let cd = bias.len();
    let (hist, n) = (window.len() / cd, out.len() / cd);
    let row_len = rows.len() / n;
    let at = |i: usize| -> &[f32] { &rows[(i - hist) * row_len + offset..][..cd] };
    for t in 0..n {
        let o = &mut out[t * cd..(t + 1) * cd];
        o.fill(0.0);
        for (j, w) in taps.chunks_exact(cd).enumerate() {
            let i = t + j;
            let x = if i < hist { &window[i * cd..(i + 1) * cd] } else { at(i) };
            o.iter_mut().zip(x).zip(w).for_each(|((o, &x), &k)| *o += x * k);
        }
        ops::add(o, bias);
        ops::silu(o);
    }
    // Shift the window by n and copy the newest inputs in.
    let keep = hist.saturating_sub(n);
    window.copy_within((hist - keep) * cd..hist * cd, 0);
    for (slot, i) in (keep..hist).zip(hist + n - (hist - keep)..hist + n) {
        window[slot * cd..(slot + 1) * cd].copy_from_slice(at(i));
    }
}

/// The selective scan of every head over the pass's tokens (`xbc`:
/// `[n][conv_dim]` after the conv, `dt`: `[n][n_head]` after the softplus),
/// advancing `state` (`[n_head][head_dim][d_state]`) and writing `y`
/// (`[n][d_inner]`). Heads are independent: threads claim them one at a time.
fn scan(pool: &ThreadPool, p: &Mamba2Params, a: &[f32], xbc: &[f32], dt: &[f32], state: &mut [f32], y: &mut [f32]) {
    let (di, ds, cd, nh, hd) = (p.d_inner, p.d_state, p.conv_dim(), p.n_head, p.head_dim());
    let heads_per_group = nh / p.n_group;
    let n = dt.len() / nh;
    let heads = Pieces::new(nh);
    let (state, y_out) = (SharedMut::new(state), SharedMut::new(y));
    pool.run(&|_, _| {
        for h in heads.iter() {
            let g = h / heads_per_group;
            // SAFETY: each head's state rows and output columns belong to the thread that claimed it.
            let sh = unsafe { state.slice(h * hd * ds, hd * ds) };
            for t in 0..n {
                let row = &xbc[t * cd..(t + 1) * cd];
                let x = &row[h * hd..(h + 1) * hd];
                let b = &row[di + g * ds..di + (g + 1) * ds];
                let c = &row[di + (p.n_group + g) * ds..di + (p.n_group + g + 1) * ds];
                let dt = dt[t * nh + h];
                let decay = (dt * a[h]).exp();
                let yh = unsafe { y_out.slice(t * di + h * hd, hd) };
                ops::ssm_scan(sh, decay, dt, x, b, c, yh);
            }
        }
    });
}

/// `log(1 + e^x)`, linear above 20 (as ggml's `ggml_compute_softplus_f32`).
#[inline]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}
