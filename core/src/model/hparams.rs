//! Reading hyper-parameters through the key table, with typed errors.

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Key};

/// Metadata of one architecture: keys resolve with its prefix.
pub struct Meta<'a> {
    pub file: &'a GgufFile,
    pub arch: &'a str,
}

/// Hyper-parameters larger than this are rejected as corrupt (no real model
/// comes near; it keeps products of them far from overflow).
const MAX_DIM: usize = 1 << 24;

impl<'a> Meta<'a> {
    pub fn new(file: &'a GgufFile, arch: &'a str) -> Self {
        Meta { file, arch }
    }

    pub fn key(&self, k: Key) -> String {
        k.for_arch(self.arch)
    }

    pub fn bad(&self, k: Key, reason: impl Into<String>) -> Error {
        Error::InvalidHyperparameter { key: self.key(k), reason: reason.into() }
    }

    /// A required positive integer.
    pub fn usize(&self, k: Key) -> Result<usize> {
        let name = self.key(k);
        let v = self.file.get_u64(&name)?.ok_or(Error::MissingKey(name))?;
        self.check(k, v)
    }

    /// An optional non-negative integer with a default.
    pub fn usize_or(&self, k: Key, default: usize) -> Result<usize> {
        match self.file.get_u64(&self.key(k))? {
            None => Ok(default),
            Some(v) => self.check(k, v),
        }
    }

    fn check(&self, k: Key, v: u64) -> Result<usize> {
        if v as usize > MAX_DIM || v > MAX_DIM as u64 {
            return Err(self.bad(k, format!("{v} is out of range")));
        }
        Ok(v as usize)
    }

    /// A required positive integer that must also be non-zero.
    pub fn nonzero(&self, k: Key) -> Result<usize> {
        let v = self.usize(k)?;
        if v == 0 {
            return Err(self.bad(k, "must be positive"));
        }
        Ok(v)
    }

    pub fn f32_or(&self, k: Key, default: f32) -> Result<f32> {
        let v = self.file.get_f32(&self.key(k))?.unwrap_or(default);
        if !v.is_finite() {
            return Err(self.bad(k, format!("{v} is not finite")));
        }
        Ok(v)
    }

    pub fn bool_or(&self, k: Key, default: bool) -> Result<bool> {
        Ok(self.file.get_bool(&self.key(k))?.unwrap_or(default))
    }

    /// An integer array, if present.
    pub fn ints(&self, k: Key) -> Result<Option<Vec<i64>>> {
        let name = self.key(k);
        match self.file.get_array(&name)? {
            None => Ok(None),
            Some(a) => a.to_i64_vec().map(Some).ok_or_else(|| self.bad(k, "expected an integer array")),
        }
    }

    /// One value per layer: an integer array of `n_layer` values, or a
    /// scalar for every layer, or `default` when absent (none: required).
    pub fn per_layer(&self, k: Key, n_layer: usize, default: Option<usize>) -> Result<Vec<usize>> {
        let name = self.key(k);
        match self.file.get_array(&name) {
            Ok(Some(a)) => {
                let v = a.to_i64_vec().ok_or_else(|| self.bad(k, "expected an integer array"))?;
                self.ensure(k, v.len() == n_layer, format!("has {} values for {n_layer} layers", v.len()))?;
                v.into_iter()
                    .map(|x| {
                        usize::try_from(x).ok().filter(|&x| x <= MAX_DIM).ok_or_else(|| self.bad(k, format!("{x}")))
                    })
                    .collect()
            }
            Ok(None) => default.map(|d| vec![d; n_layer]).ok_or(Error::MissingKey(name)),
            // Not an array: a scalar for every layer.
            Err(_) => Ok(vec![self.usize(k)?; n_layer]),
        }
    }

    /// A bool array, if present.
    pub fn bools(&self, k: Key) -> Result<Option<Vec<bool>>> {
        let name = self.key(k);
        match self.file.get_array(&name)? {
            None => Ok(None),
            Some(crate::gguf::Array::Bool(v)) => Ok(Some(v.clone())),
            Some(_) => Err(self.bad(k, "expected a bool array")),
        }
    }

    /// Which of `n_layer` layers use the sliding window, as llama.cpp's
    /// `load_swa_pattern` reads it: a per-layer bool array, else a period
    /// `sliding_window_pattern` (`default_period` when absent) in which every
    /// layer but the last slides (0: every layer).
    pub fn swa_layers(&self, n_layer: usize, default_period: usize) -> Result<Vec<bool>> {
        if let Ok(Some(p)) = self.bools(Key::SlidingWindowPattern) {
            self.ensure(Key::SlidingWindowPattern, p.len() >= n_layer, "shorter than block_count")?;
            return Ok(p[..n_layer].to_vec());
        }
        let period = self.usize_or(Key::SlidingWindowPattern, default_period)?;
        Ok((0..n_layer).map(|il| period == 0 || il % period < period - 1).collect())
    }

    /// The linear RoPE frequency scale (`1 / factor`). Other scaling types
    /// (YaRN, LongRoPE) are not implemented: such a file is refused rather
    /// than run with wrong positions.
    pub fn rope_freq_scale(&self) -> Result<f32> {
        match self.file.get_str(&self.key(Key::RopeScalingType))? {
            None | Some("none") | Some("linear") => {}
            Some(other) => {
                return Err(Error::InvalidHyperparameter {
                    key: self.key(Key::RopeScalingType),
                    reason: format!("RoPE scaling '{other}' is not supported"),
                })
            }
        }
        let factor = self.f32_or(Key::RopeScalingFactor, self.f32_or(Key::RopeScaleLinear, 0.0)?)?;
        Ok(if factor == 0.0 { 1.0 } else { 1.0 / factor })
    }

    /// Require `cond`, else an error naming the key.
    pub fn ensure(&self, k: Key, cond: bool, reason: impl Into<String>) -> Result<()> {
        if cond {
            Ok(())
        } else {
            Err(self.bad(k, reason))
        }
    }
}
