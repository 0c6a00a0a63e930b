//! What an adapter is and what it can do, as plain data (no wgpu types), so
//! the CLI and the bindings can print it whether or not the backend is built.

/// The adapter a [`Gpu`](super::Gpu) runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterInfo {
    /// The device's name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `Apple M2`).
    pub name: String,
    /// The driver's name and version text, as the API reports them.
    pub driver: String,
    pub driver_info: String,
    /// `vulkan` or `metal`.
    pub backend: String,
    /// `cpu`, `integrated`, `discrete`, `virtual` or `other`.
    pub device_type: String,
    /// PCI-style vendor and device ids (0 where the API has none).
    pub vendor: u32,
    pub device: u32,
    /// WGSL `f16` (`enable f16;`) is available.
    pub shader_f16: bool,
    /// Subgroup operations are available.
    pub subgroups: bool,
    /// The range of subgroup sizes the adapter may use.
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// Every optional feature the adapter offers, as wgpu names them.
    pub features: Vec<String>,
    pub limits: GpuLimits,
    /// The kernels this device was opened with: what of `shader_f16` and
    /// `subgroups` they use (less than the adapter offers when
    /// [`GpuOptions`](super::GpuOptions) says so).
    pub kernels: KernelVariant,
}

/// Which optional capabilities a device's kernels use, chosen once when the
/// device is opened: each where the adapter offers it (and the caller does
/// not turn it off), else the portable form.
///
/// - `f16`: f16 values (block scales, F16 weights, an f16 KV cache) are
///   widened by the hardware's f16 type (`enable f16;`); subnormals stay
///   integer arithmetic, so a device that flushes them changes no value.
///   Without it, integer arithmetic throughout (`shaders/half.wgsl`).
/// - `subgroups`: the workgroup sums and maxima of the matrix products and
///   attention reduce each subgroup with `subgroupAdd` / `subgroupMax`, then
///   the subgroups' results in workgroup memory. Without it, a tree over
///   workgroup memory with a barrier per level.
///
/// All arithmetic is f32 in both forms; results differ only in the order of
/// the sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelVariant {
    pub f16: bool,
    pub subgroups: bool,
}

impl KernelVariant {
    /// The portable form: neither capability.
    pub const PORTABLE: KernelVariant = KernelVariant { f16: false, subgroups: false };

    /// `f16+subgroups`, `f16`, `subgroups` or `portable`.
    pub fn name(self) -> &'static str {
        match (self.f16, self.subgroups) {
            (true, true) => "f16+subgroups",
            (true, false) => "f16",
            (false, true) => "subgroups",
            (false, false) => "portable",
        }
    }
}

/// The adapter limits that decide how Pocket's kernels are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLimits {
    /// Largest range of one storage buffer a shader may bind: a matrix
    /// larger than this is split over several bindings.
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub min_storage_buffer_offset_alignment: u32,
}

impl GpuLimits {
    /// (name, value) pairs in a fixed order, for printing.
    pub fn entries(&self) -> [(&'static str, u64); 8] {
        [
            ("max_storage_buffer_binding_size", self.max_storage_buffer_binding_size),
            ("max_buffer_size", self.max_buffer_size),
            ("max_storage_buffers_per_shader_stage", self.max_storage_buffers_per_shader_stage as u64),
            ("max_compute_workgroup_storage_size", self.max_compute_workgroup_storage_size as u64),
            ("max_compute_invocations_per_workgroup", self.max_compute_invocations_per_workgroup as u64),
            ("max_compute_workgroup_size_x", self.max_compute_workgroup_size_x as u64),
            ("max_compute_workgroups_per_dimension", self.max_compute_workgroups_per_dimension as u64),
            ("min_storage_buffer_offset_alignment", self.min_storage_buffer_offset_alignment as u64),
        ]
    }
}
