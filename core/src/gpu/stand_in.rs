//! The GPU API in a build without the `gpu` feature: the same types and
//! signatures, whose constructors answer that the backend is not built, so
//! callers need no `cfg`.

use super::{AdapterInfo, AttnShape, DeltaShape, GpuCounters, GpuOptions};
use crate::quant::GgmlType;
use crate::{Error, Result};

fn not_built() -> Error {
    Error::GpuUnavailable("this build of Pocket has no GPU backend (cargo feature `gpu`)".into())
}

/// Stand-in for the GPU device: [`Gpu::new`] always fails.
#[derive(Clone)]
pub struct Gpu {
    never: std::convert::Infallible,
}

impl Gpu {
    pub fn new(_opts: &GpuOptions) -> Result<Gpu> {
        Err(not_built())
    }

    pub fn info(&self) -> &AdapterInfo {
        match self.never {}
    }

    pub fn max_binding_bytes(&self) -> u64 {
        match self.never {}
    }

    pub fn kernels(&self) -> super::KernelVariant {
        match self.never {}
    }

    pub fn counters(&self) -> GpuCounters {
        match self.never {}
    }
}

/// Stand-in for a matrix on the GPU: no value of it can exist.
pub struct GpuMatrix {
    never: std::convert::Infallible,
}

impl GpuMatrix {
    pub fn upload(gpu: &Gpu, _ty: GgmlType, _rows: usize, _cols: usize, _bytes: &[u8]) -> Result<GpuMatrix> {
        match gpu.never {}
    }

    pub fn upload_with(
        gpu: &Gpu,
        _ty: GgmlType,
        _rows: usize,
        _cols: usize,
        _len: usize,
        _read: super::ReadBytes<'_>,
    ) -> Result<GpuMatrix> {
        match gpu.never {}
    }

    pub fn ty(&self) -> GgmlType {
        match self.never {}
    }

    pub fn rows(&self) -> usize {
        match self.never {}
    }

    pub fn cols(&self) -> usize {
        match self.never {}
    }

    pub fn bindings(&self) -> usize {
        match self.never {}
    }

    pub fn matvec(&self, _x: &[f32]) -> Result<Vec<f32>> {
        match self.never {}
    }

    pub fn matmul(&self, _x: &[f32], _n: usize, _out: &mut Vec<f32>) -> Result<()> {
        match self.never {}
    }
}

/// Stand-in for one product of a batch.
pub struct RowsJob<'a> {
    pub matrix: &'a GpuMatrix,
    pub input: usize,
    pub rows: &'a [usize],
    pub w_rows: std::ops::Range<usize>,
}

/// Stand-in for batches of products over chosen rows: no value of it can exist.
pub struct GpuBatch {
    never: std::convert::Infallible,
}

impl GpuBatch {
    pub fn new(gpu: &Gpu) -> GpuBatch {
        match gpu.never {}
    }

    pub fn run(&self, _inputs: &[(&[f32], usize)], _jobs: &[RowsJob<'_>], _out: &mut Vec<f32>) -> Result<()> {
        match self.never {}
    }
}

/// Stand-in for a KV cache on the device: no value of it can exist.
pub struct KvMirror {
    never: std::convert::Infallible,
}

impl KvMirror {
    pub fn new(gpu: &Gpu, _f16: bool, _heads: usize, _hd: usize, _hdv: usize, _capacity: usize) -> Result<KvMirror> {
        match gpu.never {}
    }

    pub fn write(&self, _k: &[u8], _v: &[u8], _pos: std::ops::Range<usize>) -> Result<()> {
        match self.never {}
    }
}

/// Stand-in for the attention kernel: no value of it can exist.
pub struct GpuAttention {
    never: std::convert::Infallible,
}

impl GpuAttention {
    pub fn new(gpu: &Gpu) -> Result<GpuAttention> {
        match gpu.never {}
    }

    pub fn attend(&self, _kv: &KvMirror, _s: &AttnShape, _q: &[f32], _out: &mut Vec<f32>) -> Result<()> {
        match self.never {}
    }
}

/// Stand-in for the delta-rule kernel: no value of it can exist.
pub struct GpuDeltaRule {
    never: std::convert::Infallible,
}

impl GpuDeltaRule {
    pub fn new(gpu: &Gpu) -> Result<GpuDeltaRule> {
        match gpu.never {}
    }

    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        _s: &DeltaShape,
        _state: &GpuState,
        _qkv: &[f32],
        _g: &[f32],
        _beta: &[f32],
        _out: &mut [f32],
    ) -> Result<()> {
        match self.never {}
    }
}

/// Stand-in for a recurrent state on the GPU: no value of it can exist.
pub struct GpuState {
    never: std::convert::Infallible,
}

impl GpuState {
    pub fn new(gpu: &Gpu, _len: usize) -> Result<GpuState> {
        match gpu.never {}
    }

    pub fn len(&self) -> usize {
        match self.never {}
    }

    pub fn is_empty(&self) -> bool {
        match self.never {}
    }

    pub fn write(&self, _values: &[f32]) -> Result<()> {
        match self.never {}
    }

    pub fn read(&self, _out: &mut [f32]) -> Result<()> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_the_feature_the_device_is_unavailable() {
        let e = super::Gpu::new(&Default::default()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("no GPU backend"), "{e}");
    }
}
