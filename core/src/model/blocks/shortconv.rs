//! LFM2's gated short convolution: a causal depthwise convolution of a few
//! taps between two multiplicative gates, with a window of the last inputs
//! as per-sequence state.
//!
//! Per token, with `B | C | x = in_proj · h` (`[3][n_embd]`):
//!
//! ```text
//!   u_t = B_t * x_t                                  (the conv's input)
//!   y_t = Σ_j w_j * u_{t - (L-1) + j},  j = 0..L-1   (per channel; L = l_cache taps)
//!   out = out_proj · (C_t * y_t)
//! ```
//!
//! The `L - 1` inputs before the pass's first token come from the window
//! (zeros for a new sequence); afterwards it holds the last `L - 1` inputs.
//! The window lives in a [`DeltaState`] without a delta-rule part, so
//! checkpoints and snapshots treat it as every recurrent layer's state.

use super::super::pass::{HostBlock, Pass};
use super::super::scratch::take;
use super::super::ssm::Ssm;
use super::super::weights::{Loader, Matrix};
use super::deltanet::DeltaState;
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::{ops, QActs};

/// Shape of a short-conv layer.
#[derive(Clone, Copy, Debug)]
pub struct ShortConvParams {
    /// Channels (the model width).
    pub n_embd: usize,
    /// Taps of the convolution (`shortconv.l_cache`), at least 2.
    pub l_cache: usize,
}

impl ShortConvParams {
    /// Inputs the window keeps.
    pub fn history(&self) -> usize {
        self.l_cache - 1
    }

    /// Floats of state per sequence (the window).
    pub fn state_floats(&self) -> usize {
        self.history() * self.n_embd
    }

    /// A new sequence's state: a zero window (and no delta-rule state).
    pub fn new_state(&self) -> DeltaState {
        DeltaState { conv: Ssm::new(self.state_floats()), ssm: Ssm::new(0) }
    }
}

/// One short-conv layer. Shapes (rows x cols): in_proj `[3*n_embd, n_embd]`
/// (B, C, x in that order), conv `[l_cache][n_embd]` (tap-major: transposed
/// from the file's `[n_embd][l_cache]` at load), out_proj `[n_embd, n_embd]`.
pub struct ShortConv {
    pub p: ShortConvParams,
    pub in_proj: Matrix,
    pub conv: Vec<f32>,
    pub out_proj: Matrix,
}

/// What a short-conv layer reuses from pass to pass.
#[derive(Default)]
pub struct ShortConvScratch {
    /// `B | C | x` per token, `[n][3*n_embd]`.
    bcx: Vec<f32>,
    /// The conv's input `B * x` and its output, `[n][n_embd]` each.
    u: Vec<f32>,
    y: Vec<f32>,
    input: QActs,
    gated: QActs,
}

impl ShortConvScratch {
    /// Bytes of its buffers.
    pub fn heap_bytes(&self) -> usize {
        use super::super::scratch::heap;
        heap(&self.bcx) + heap(&self.u) + heap(&self.y) + self.input.heap_bytes() + self.gated.heap_bytes()
    }
}

impl ShortConv {
    /// Layer `il`'s tensors.
    pub fn load(ld: &Loader, il: usize, p: ShortConvParams) -> Result<ShortConv> {
        let (e, l) = (p.n_embd, p.l_cache);
        let name = TensorKind::ShortConvConv.weight(il);
        let w = ld.vector_shaped(&name, &[l as u64, e as u64])?;
        if !w.iter().all(|v| v.is_finite()) {
            return Err(Error::InvalidHyperparameter { key: name, reason: "taps must be finite".into() });
        }
        Ok(ShortConv {
            p,
            in_proj: ld.matrix(TensorKind::ShortConvInProj, il, 3 * e, e)?,
            conv: (0..l * e).map(|i| w[(i % e) * l + i / e]).collect(),
            out_proj: ld.matrix(TensorKind::ShortConvOutProj, il, e, e)?,
        })
    }

    /// `out = ShortConv(x)` for the pass's tokens (`[n][n_embd]` each); the
    /// window advances by `n` tokens. Fails only when the window, newer on a
    /// device, cannot be read back.
    pub fn forward(
        &self,
        pass: &Pass,
        st: &mut DeltaState,
        s: &mut ShortConvScratch,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let (n, e) = (pass.n, self.p.n_embd);
        if st.conv.len() != self.p.state_floats() || !st.ssm.is_empty() {
            return Err(Error::InvalidArgument("state does not belong to this model".into()));
        }
        pass.backend.on_host(HostBlock::ShortConv);
        // B | C | x = in_proj · h
        let bcx = take(&mut s.bcx, n * 3 * e);
        pass.project(&self.in_proj, &mut s.input, x, bcx);
        // u = B * x
        let u = take(&mut s.u, n * e);
        for (ut, row) in u.chunks_exact_mut(e).zip(bcx.chunks_exact(3 * e)) {
            ut.copy_from_slice(&row[..e]);
            ops::mul(ut, &row[2 * e..]);
        }
        // y = causal depthwise conv of u over [window | u]; the window moves on.
        let y = take(&mut s.y, n * e);
        let window = st.conv.host_mut()?;
        causal_conv(&self.conv, window, u, y, e);
        advance_window(window, u, e);
        // out = out_proj · (C * y)
        for (yt, row) in y.chunks_exact_mut(e).zip(bcx.chunks_exact(3 * e)) {
            ops::mul(yt, &row[e..2 * e]);
        }
        pass.project(&self.out_proj, &mut s.gated, y, out);
        Ok(())
    }
}

/// `y[t] = Σ_j taps[j] * input(t + j - hist)` per channel, where `input(i)`
/// is `u[i]` for `i >= 0` and the window's row `hist + i` before that
/// (`taps`: `[hist + 1][channels]`, `window`: `[hist][channels]`, `u`, `y`:
/// `[n][channels]`). Taps are summed in order, as ggml's `ssm_conv` does.
fn causal_conv(taps: &[f32], window: &[f32], u: &[f32], y: &mut [f32], channels: usize) {
    let hist = taps.len() / channels - 1;
    for (t, yt) in y.chunks_exact_mut(channels).enumerate() {
        yt.fill(0.0);
        for (j, w) in taps.chunks_exact(channels).enumerate() {
            let i = t + j;
            let src =
                if i < hist { &window[i * channels..][..channels] } else { &u[(i - hist) * channels..][..channels] };
            for ((o, &v), &k) in yt.iter_mut().zip(src).zip(w) {
                *o += v * k;
            }
        }
    }
}

/// The window after `u`: its last `hist` rows of `[window | u]`.
fn advance_window(window: &mut [f32], u: &[f32], channels: usize) {
    let (hist, n) = (window.len() / channels, u.len() / channels);
    let keep = hist.saturating_sub(n);
    window.copy_within((hist - keep) * channels.., 0);
    let fresh = hist - keep;
    window[keep * channels..].copy_from_slice(&u[(n - fresh) * channels..]);
}

#[cfg(test)]
mod tests {
    use super::{advance_window, causal_conv};

    /// Pseudo-random values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn conv_is_a_causal_filter_from_a_zero_window() {
        // 2 channels, 3 taps: y_t = w0 u_{t-2} + w1 u_{t-1} + w2 u_t.
        let taps = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
        let u = [1.0, -1.0, 2.0, -2.0, 4.0, -4.0];
        let mut y = [0.0; 6];
        causal_conv(&taps, &[0.0; 4], &u, &mut y, 2);
        assert_eq!(y, [3.0, -30.0, 2.0 + 6.0, -(20.0 + 60.0), 1.0 + 4.0 + 12.0, -(10.0 + 40.0 + 120.0)]);
    }

    /// A sequence run in pieces of every size (with the window carried
    /// between them) gives the outputs of one run over all of it.
    #[test]
    fn pieces_with_the_window_equal_one_run() {
        let (ch, n) = (5, 11);
        for l_cache in 2..=4 {
            let hist = l_cache - 1;
            let taps = values(l_cache * ch, l_cache as u32);
            let u = values(n * ch, 7);
            let mut whole = vec![0.0; n * ch];
            causal_conv(&taps, &vec![0.0; hist * ch], &u, &mut whole, ch);
            for piece in 1..=n {
                let mut window = vec![0.0; hist * ch];
                let mut got = Vec::new();
                for part in u.chunks(piece * ch) {
                    let mut y = vec![0.0; part.len()];
                    causal_conv(&taps, &window, part, &mut y, ch);
                    advance_window(&mut window, part, ch);
                    got.extend(y);
                }
                assert_eq!(got, whole, "l_cache {l_cache}, pieces of {piece}");
                assert_eq!(window, u[(n - hist) * ch..], "the window holds the last inputs");
            }
        }
    }
}
