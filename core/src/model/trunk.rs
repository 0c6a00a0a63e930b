//! What every architecture shares around its layers: the token embedding,
//! the final norm and the output head (tied to the embedding when the file
//! has no `output.weight`), and the vocabulary size they define.

use super::blocks::norm::RmsNorm;
use super::cache::Logits;
use super::pass::Pass;
use super::scratch::take;
use super::state::Scratch;
use super::weights::{Loader, Matrix};
use crate::error::{Error, Result};
use crate::gguf::TensorKind;
use crate::kernels::ops;

/// Embedding in, logits out.
pub struct Trunk {
    pub n_embd: usize,
    pub n_vocab: usize,
    /// `[n_vocab, n_embd]`.
    pub token_embd: Matrix,
    /// Multiply embeddings by this (Gemma: sqrt(n_embd)).
    pub embed_scale: Option<f32>,
    /// `[n_embd]`.
    pub norm: RmsNorm,
    /// `[n_vocab, n_embd]`: `output.weight`, or the embedding table (tied).
    pub output: Matrix,
    /// Final logit soft-capping `cap * tanh(logit / cap)` (Gemma 2 style).
    pub softcap: Option<f32>,
    /// Multiply the logits by this (Granite: 1 / `logit_scale`).
    pub logit_mul: Option<f32>,
}

impl Trunk {
    /// The embedding, final norm (with `eps`) and output head of a model of width `n_embd`.
    pub fn load(ld: &Loader, n_embd: usize, eps: f32) -> Result<Trunk> {
        Trunk::load_with_norm(ld, n_embd, eps, TensorKind::OutputNorm)
    }

    /// [`load`](Self::load) with the final norm of another name (LFM2's
    /// `token_embd_norm`).
    pub fn load_with_norm(ld: &Loader, n_embd: usize, eps: f32, norm: TensorKind) -> Result<Trunk> {
        let embd_name = TensorKind::TokenEmbd.weight(0);
        let n_vocab = ld.file.tensor(&embd_name).ok_or(Error::MissingTensor(embd_name))?.dims[1] as usize;
        let token_embd = ld.matrix(TensorKind::TokenEmbd, 0, n_vocab, n_embd)?;
        let output = ld.matrix_opt(TensorKind::Output, 0, n_vocab, n_embd)?.unwrap_or_else(|| token_embd.clone());
        Ok(Trunk {
            n_embd,
            n_vocab,
            norm: RmsNorm::load(ld, norm, 0, n_embd, eps)?,
            token_embd,
            embed_scale: None,
            output,
            softcap: None,
            logit_mul: None,
        })
    }

    /// `x = the tokens' embedding rows` (`[n][n_embd]`), scaled where the architecture says.
    pub fn embed(&self, pass: &Pass, tokens: &[u32], x: &mut [f32]) {
        let e = self.n_embd;
        for (&tok, row) in tokens.iter().zip(x.chunks_exact_mut(e)) {
            self.embed_row(pass.file, tok, row);
        }
    }

    /// `x = token's embedding row` (`[n_embd]`), scaled where the architecture says.
    pub fn embed_row(&self, file: &[u8], token: u32, x: &mut [f32]) {
        self.token_embd.row_f32(file, token as usize, x);
        if let Some(s) = self.embed_scale {
            ops::scale(x, s);
        }
    }

    /// `logits = Output · RMSNorm(x)` for the rows `want` asks for, from the
    /// residual stream `s.x`; returns how many rows were written.
    pub fn logits(&self, pass: &Pass, s: &mut Scratch, want: Logits, logits: &mut Vec<f32>) -> usize {
        let (n, e) = (pass.n, self.n_embd);
        let first = match want {
            Logits::All => 0,
            Logits::Last => n - 1,
            Logits::None => return 0,
        };
        let rows = n - first;
        let xn = take(&mut s.xn, rows * e);
        self.norm.forward(&s.x[first * e..n * e], xn);
        let out = take(logits, rows * self.n_vocab);
        pass.project(&self.output, &mut s.head, xn, out);
        if let Some(m) = self.logit_mul {
            ops::scale(out, m);
        }
        if let Some(cap) = self.softcap {
            out.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        rows
    }
}
