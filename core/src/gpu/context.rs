//! The device: a headless wgpu adapter and device, its limits, the compiled
//! kernels, and the few helpers every upload and dispatch shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::counters::{GpuCounters, Tally};
use super::info::{AdapterInfo, GpuLimits, KernelVariant};
use super::{shaders, GpuOptions};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Storage bindings the attention kernel takes with `shader-f16` (keys and
/// values bound twice); an adapter that allows fewer runs the portable kernels.
const F16_STORAGE_BINDINGS: u32 = 7;

/// One headless GPU device and its queue. Clones share the device.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<Inner>,
}

/// The entry points of `shaders/matvec.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum MatvecEntry {
    /// Every row of the matrix over every token (`main`).
    All,
    /// Over chosen tokens (`main_rows`).
    Rows,
    /// The experts a device-side router chose (`main_experts`).
    Experts,
    /// A GLU's gate and up products and its activation, one token
    /// (`main_glu` of `shaders/matvec_glu.wgsl`).
    Glu,
    /// The same over the experts a device-side router chose (`main_experts_glu`).
    ExpertsGlu,
}

struct Inner {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: AdapterInfo,
    /// The most bytes one storage binding may hold here: the device's limit,
    /// or less when [`GpuOptions::max_binding_bytes`] says so.
    max_binding: u64,
    /// The most workgroups per dispatch dimension (the device's, or fewer).
    max_groups: u32,
    /// See [`GpuOptions::attention_chunk`].
    attention_chunk: usize,
    /// The bind group layout every matrix kernel shares: weights, x, y, params.
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    /// The products over chosen rows add their job (uniform) and row list.
    rows_layout: wgpu::BindGroupLayout,
    rows_pipeline_layout: wgpu::PipelineLayout,
    /// The fused gate and up products add the up matrix (7, and 8 as f16 values).
    glu_layout: wgpu::BindGroupLayout,
    glu_pipeline_layout: wgpu::PipelineLayout,
    /// Offsets of uniform bindings into one buffer are multiples of this.
    uniform_align: u64,
    /// Matrix-vector pipelines, compiled on first use per format, and
    /// whether they take chosen rows.
    matvec: Mutex<HashMap<(GgmlType, MatvecEntry), Arc<wgpu::ComputePipeline>>>,
    /// What the device has been asked to do since it was opened.
    tally: Tally,
}

impl Gpu {
    /// Open the best adapter Vulkan or Metal offers, headless. No adapter, or
    /// a driver that refuses a device, is [`Error::GpuUnavailable`] with the
    /// driver's message, never a panic.
    pub fn new(opts: &GpuOptions) -> Result<Gpu> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL;
        // No validation layers: they are a debugging aid, slow, and often absent.
        desc.flags = wgpu::InstanceFlags::empty();
        let instance = wgpu::Instance::new(desc);
        let options = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            // The adapter's real limits, not rounded down to a bucket.
            apply_limit_buckets: false,
        };
        let adapter = pollster::block_on(instance.request_adapter(&options))
            .map_err(|e| Error::GpuUnavailable(format!("no Vulkan or Metal adapter: {e}")))?;
        // The kernels' form, once: each capability where the adapter has it
        // and the caller did not turn it off. The f16 kernels bind their
        // f16 data twice (attention: 7 storage bindings).
        let offered = adapter.features();
        let kernels = KernelVariant {
            f16: offered.contains(wgpu::Features::SHADER_F16)
                && adapter.limits().max_storage_buffers_per_shader_stage >= F16_STORAGE_BINDINGS
                && !opts.no_f16,
            subgroups: offered.contains(wgpu::Features::SUBGROUP) && !opts.no_subgroups,
        };
        let mut features = wgpu::Features::empty();
        features.set(wgpu::Features::SHADER_F16, kernels.f16);
        features.set(wgpu::Features::SUBGROUP, kernels.subgroups);
        let info = describe(&adapter, kernels);
        // Ask for everything the adapter offers: the storage binding size in
        // particular decides how large matrices are split.
        let limits = adapter.limits();
        let request = wgpu::DeviceDescriptor {
            label: Some("pocket"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&request))
            .map_err(|e| Error::GpuUnavailable(format!("{} ({}): {e}", info.name, info.driver)))?;
        // Errors outside an error scope must not panic (wgpu's default).
        device.on_uncaptured_error(Arc::new(|e| log::error!("gpu: {e}")));

        let mut max_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        if let Some(cap) = opts.max_binding_bytes {
            max_binding = max_binding.min(cap);
        }
        // Offsets inside a binding are u32 in the kernels, and bindings are whole words.
        max_binding = max_binding.min(u32::MAX as u64) & !3;
        if max_binding < 4 {
            return Err(Error::InvalidArgument(format!("a GPU binding limit of {max_binding} bytes is too small")));
        }

        let max_groups = limits
            .max_compute_workgroups_per_dimension
            .min(opts.max_workgroups_per_dimension.unwrap_or(u32::MAX))
            .max(1);

        let mut matvec_entries =
            vec![storage_entry(0, true), storage_entry(1, true), storage_entry(2, false), uniform_entry(3)];
        if kernels.f16 {
            // The weights again, as f16 values (`shaders/weights_f16.wgsl`).
            matvec_entries.push(storage_entry(6, true));
        }
        let (layout, pipeline_layout) = layouts(&device, "pocket matvec", &matvec_entries);
        let mut rows_entries = matvec_entries.clone();
        rows_entries.extend([uniform_entry(4), storage_entry(5, true)]);
        let (rows_layout, rows_pipeline_layout) = layouts(&device, "pocket matvec rows", &rows_entries);
        let mut glu_entries = rows_entries.clone();
        glu_entries.push(storage_entry(7, true));
        if kernels.f16 {
            glu_entries.push(storage_entry(8, true));
        }
        let (glu_layout, glu_pipeline_layout) = layouts(&device, "pocket matvec glu", &glu_entries);
        let inner = Inner {
            device,
            queue,
            info,
            max_binding,
            max_groups,
            attention_chunk: opts.attention_chunk.unwrap_or(super::ATTENTION_CHUNK).max(1),
            layout,
            pipeline_layout,
            rows_layout,
            rows_pipeline_layout,
            glu_layout,
            glu_pipeline_layout,
            uniform_align: u64::from(limits.min_uniform_buffer_offset_alignment.max(16)),
            matvec: Mutex::default(),
            tally: Tally::default(),
        };
        Ok(Gpu { inner: Arc::new(inner) })
    }

    /// Whether `other` is this device (a clone of the same [`Gpu`]).
    pub(super) fn same_device(&self, other: &Gpu) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The adapter this device runs on.
    pub fn info(&self) -> &AdapterInfo {
        &self.inner.info
    }

    /// The form of the kernels this device runs.
    pub fn kernels(&self) -> KernelVariant {
        self.inner.info.kernels
    }

    /// The most bytes one storage binding holds (see [`GpuOptions`]).
    pub fn max_binding_bytes(&self) -> u64 {
        self.inner.max_binding
    }

    /// Submissions, dispatches, buffers and bytes moved since the device
    /// was opened.
    pub fn counters(&self) -> GpuCounters {
        self.inner.tally.snapshot()
    }

    pub(super) fn tally(&self) -> &Tally {
        &self.inner.tally
    }

    /// The most workgroups one dispatch may have along each dimension.
    pub(super) fn max_groups(&self) -> usize {
        self.inner.max_groups as usize
    }

    /// Workgroups per head of a decoded token's attention over `positions`
    /// (at most; see [`GpuOptions::attention_chunk`]): 1 is one workgroup.
    pub(super) fn attention_chunks(&self, positions: usize) -> usize {
        (positions / self.inner.attention_chunk).clamp(1, super::MAX_ATTENTION_CHUNKS)
    }

    pub(super) fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    pub(super) fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    pub(super) fn layout(&self) -> &wgpu::BindGroupLayout {
        &self.inner.layout
    }

    /// The layout of the products over chosen rows (`main_rows`).
    pub(super) fn rows_layout(&self) -> &wgpu::BindGroupLayout {
        &self.inner.rows_layout
    }

    /// The fused gate and up products' bind group layout: the rows layout
    /// and the up matrix.
    pub(super) fn glu_layout(&self) -> &wgpu::BindGroupLayout {
        &self.inner.glu_layout
    }

    /// The bind group entries of a matrix product: weights, x, y, params
    /// (and the weights again as f16 values for the f16 kernels).
    pub(super) fn matvec_entries<'a>(
        &self,
        weights: &'a wgpu::Buffer,
        x: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
        params: &'a wgpu::Buffer,
    ) -> Vec<wgpu::BindGroupEntry<'a>> {
        let mut entries = vec![
            wgpu::BindGroupEntry { binding: 0, resource: weights.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: x.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 2, resource: y.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 3, resource: params.as_entire_binding() },
        ];
        if self.kernels().f16 {
            entries.push(wgpu::BindGroupEntry { binding: 6, resource: weights.as_entire_binding() });
        }
        entries
    }

    /// Offsets of uniform bindings are multiples of this (at least 16).
    pub(super) fn uniform_align(&self) -> u64 {
        self.inner.uniform_align
    }

    /// The matrix-vector pipeline for weights of type `ty` and the entry
    /// point `entry`, compiled once.
    pub(super) fn matvec_pipeline(&self, ty: GgmlType, entry: MatvecEntry) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut cache = self.inner.matvec.lock().map_err(|_| Error::Gpu("pipeline cache poisoned".into()))?;
        if let Some(p) = cache.get(&(ty, entry)) {
            return Ok(p.clone());
        }
        let (layout, entry_name) = match entry {
            MatvecEntry::All => (&self.inner.pipeline_layout, "main"),
            MatvecEntry::Rows => (&self.inner.rows_pipeline_layout, "main_rows"),
            MatvecEntry::Experts => (&self.inner.rows_pipeline_layout, "main_experts"),
            MatvecEntry::Glu => (&self.inner.glu_pipeline_layout, "main_glu"),
            MatvecEntry::ExpertsGlu => (&self.inner.glu_pipeline_layout, "main_experts_glu"),
        };
        let source = match entry {
            MatvecEntry::Glu | MatvecEntry::ExpertsGlu => shaders::matvec_glu(ty, self.kernels()),
            _ => shaders::matvec(ty, self.kernels()),
        }
        .ok_or_else(|| Error::InvalidArgument(format!("the GPU has no kernel for {ty}")))?;
        let device = &self.inner.device;
        let pipeline = self.scoped(&format!("compiling the {ty} kernel"), || {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(ty.name()),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(ty.name()),
                layout: Some(layout),
                module: &module,
                entry_point: Some(entry_name),
                compilation_options: Default::default(),
                cache: None,
            })
        })?;
        let pipeline = Arc::new(pipeline);
        cache.insert((ty, entry), pipeline.clone());
        Ok(pipeline)
    }

    /// Run `f`, turning the validation and out-of-memory errors it raises on
    /// this thread into [`Error::Gpu`] (wgpu reports them asynchronously).
    pub(super) fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        let device = &self.inner.device;
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let out = f();
        let oom = pollster::block_on(memory.pop());
        let invalid = pollster::block_on(validation.pop());
        match oom.or(invalid) {
            Some(wgpu::Error::OutOfMemory { .. }) => Err(Error::OutOfMemory(format!("GPU memory while {what}"))),
            Some(e) => Err(Error::Gpu(format!("{what}: {e}"))),
            None => Ok(out),
        }
    }

    /// Wait for the queue, then copy `bytes` bytes of the mappable `buffer` out.
    pub(super) fn read_f32(&self, buffer: &wgpu::Buffer, bytes: u64, out: &mut Vec<f32>) -> Result<()> {
        let slice = buffer.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.inner
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))?;
        rx.recv()
            .map_err(|_| Error::Gpu("the readback was dropped".into()))?
            .map_err(|e| Error::Gpu(format!("mapping the readback: {e}")))?;
        {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("reading back: {e}")))?;
            out.clear();
            out.extend(view.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        }
        buffer.unmap();
        self.inner.tally.read_back(bytes);
        Ok(())
    }
}

impl Gpu {
    /// An unmapped buffer (not counted: callers tally what they make).
    pub(super) fn buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        })
    }

    /// The compute pipeline of `wgsl`'s `main` over one bind group of
    /// `entries`, and that group's layout.
    pub(super) fn compute_pipeline(
        &self,
        label: &str,
        entries: &[wgpu::BindGroupLayoutEntry],
        wgsl: String,
    ) -> (wgpu::BindGroupLayout, wgpu::ComputePipeline) {
        let (layout, mut pipelines) = self.compute_pipelines(label, entries, wgsl, &["main"]);
        (layout, pipelines.remove(0))
    }

    /// One pipeline per entry point `names` of `wgsl`, all over one bind
    /// group layout of `entries`.
    pub(super) fn compute_pipelines(
        &self,
        label: &str,
        entries: &[wgpu::BindGroupLayoutEntry],
        wgsl: String,
        names: &[&str],
    ) -> (wgpu::BindGroupLayout, Vec<wgpu::ComputePipeline>) {
        let device = self.device();
        let (layout, pipeline_layout) = layouts(device, label, entries);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
        let pipelines = names
            .iter()
            .map(|&name| {
                device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(label),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(name),
                    compilation_options: Default::default(),
                    cache: None,
                })
            })
            .collect();
        (layout, pipelines)
    }
}

/// A bind group layout of `entries` and the pipeline layout of it alone.
fn layouts(
    device: &wgpu::Device,
    label: &str,
    entries: &[wgpu::BindGroupLayoutEntry],
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(label),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    (layout, pipeline_layout)
}

pub(super) fn uniform_entry(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

pub(super) fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// wgpu's adapter description as plain data.
fn describe(adapter: &wgpu::Adapter, kernels: KernelVariant) -> AdapterInfo {
    let i = adapter.get_info();
    let f = adapter.features();
    let l = adapter.limits();
    let device_type = match i.device_type {
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Other => "other",
    };
    AdapterInfo {
        name: i.name,
        driver: i.driver,
        driver_info: i.driver_info,
        backend: i.backend.to_string(),
        device_type: device_type.to_string(),
        vendor: i.vendor,
        device: i.device,
        shader_f16: f.contains(wgpu::Features::SHADER_F16),
        subgroups: f.contains(wgpu::Features::SUBGROUP),
        subgroup_min_size: i.subgroup_min_size,
        subgroup_max_size: i.subgroup_max_size,
        features: f.iter_names().map(|(name, _)| name.to_string()).collect(),
        limits: GpuLimits {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size_x: l.max_compute_workgroup_size_x,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
        },
        kernels,
    }
}
