//! `PocketModel`: a loaded model file that any number of sessions share.

use std::fs::File;
use std::sync::Arc;

use pocket_core::gguf::GgufFile;
use pocket_core::model::{BackendKind, Model};

use crate::error::{guard, PocketError};
use crate::session::{PocketSession, SessionOptions};

/// How a model is loaded. Every field has a default.
#[derive(uniffi::Record)]
pub struct LoadOptions {
    /// Worker threads of sessions whose `SessionOptions.threads` is 0; 0 = the performance cores (else every core).
    #[uniffi(default = 0)]
    pub threads: u32,
    /// Map the file (the default: loads in milliseconds, weights stay in the
    /// page cache and untouched experts never leave flash). False reads the
    /// whole file into memory instead.
    #[uniffi(default = true)]
    pub use_mmap: bool,
    /// Told how far loading has come (0.0 to 1.0).
    #[uniffi(default = None)]
    pub progress: Option<Arc<dyn LoadProgressListener>>,
    /// The most memory the model and one session may use, in bytes; 0 = no
    /// budget (the file is mapped and the OS pages it, as today). With a
    /// budget, the weights every token reads are kept in memory and the
    /// routed experts are served from a cache sized to the rest (see
    /// `memoryPlan`); a budget below the model's minimum is refused with
    /// `PocketError.OutOfMemory` stating the minimum. `useMmap` is ignored
    /// under a budget. Pick it from what the OS gives the app: on iOS
    /// `os_proc_available_memory()`, on Android `ActivityManager.MemoryInfo`
    /// (`availMem` less a margin for the app itself).
    #[uniffi(default = 0)]
    pub memory_budget_bytes: u64,
    /// The device that computes the model's passes; `None` (the default)
    /// is `Backend.Auto`. (An optional field because UniFFI records cannot
    /// default to an enum variant.)
    #[uniffi(default = None)]
    pub backend: Option<Backend>,
    /// A Jinja chat template used instead of the file's (for files without
    /// one, or with one that does not compile, or to change how tools and
    /// thinking are rendered). Compiled at load: a template that does not
    /// compile is `PocketError.InvalidArgument`.
    #[uniffi(default = None)]
    pub chat_template: Option<String>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 0,
            use_mmap: true,
            progress: None,
            memory_budget_bytes: 0,
            backend: None,
            chat_template: None,
        }
    }
}

/// Which device computes a model's passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum Backend {
    /// Pocket chooses: today always the CPU (the GPU backend is correct but
    /// not yet faster than the CPU on any device measured); the choice is
    /// logged, and `ModelInfo.backend` says which it took.
    Auto,
    /// The CPU (NEON / AVX2 kernels).
    Cpu,
    /// The GPU (Metal on Apple, Vulkan on Android and Linux): matrix
    /// products, attention and the delta rule run on the device, the
    /// per-row arithmetic on the CPU. No GPU, a driver that refuses a device,
    /// or a library built without the GPU backend is
    /// `PocketError.UnsupportedModel` with the driver's message; it does not
    /// run under a memory budget yet (`InvalidArgument`).
    Gpu,
}

impl From<Backend> for BackendKind {
    fn from(b: Backend) -> BackendKind {
        match b {
            Backend::Auto => BackendKind::Auto,
            Backend::Cpu => BackendKind::Cpu,
            Backend::Gpu => BackendKind::Gpu,
        }
    }
}

/// The GPU a model runs on, as its driver names it.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct GpuAdapter {
    /// The device ("Apple A17 Pro", "Adreno (TM) 750", "llvmpipe (LLVM 15.0.6, 256 bits)").
    pub name: String,
    /// The driver's name ("llvmpipe", "Qualcomm Technologies Inc. Adreno Vulkan Driver"; may be "").
    pub driver: String,
    /// The driver's version text ("Mesa 22.3.6 (LLVM 15.0.6)"; may be "").
    pub driver_info: String,
    /// The graphics API: "vulkan" or "metal".
    pub api: String,
    /// The form of the kernels it runs: "f16+subgroups", "f16", "subgroups"
    /// or "portable" (what the adapter offers, or forced by
    /// `POCKET_GPU_KERNELS=portable`).
    pub kernels: String,
}

/// How a memory budget divides for a model (all in bytes).
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct MemoryPlan {
    /// The model file.
    pub file_bytes: u64,
    /// Kept in memory under a budget: every weight but the routed experts.
    pub resident_bytes: u64,
    /// The routed experts in the file.
    pub expert_bytes: u64,
    /// Less than this is refused: resident weights, one token's experts, one session.
    pub minimum_budget_bytes: u64,
    /// What the budget leaves for the expert cache (0 without a budget or below the minimum).
    pub cache_bytes: u64,
    /// One session at the default context (KV cache, recurrent state, scratch).
    pub session_bytes: u64,
}

impl From<pocket_core::model::MemoryPlan> for MemoryPlan {
    fn from(p: pocket_core::model::MemoryPlan) -> Self {
        MemoryPlan {
            file_bytes: p.file_bytes,
            resident_bytes: p.resident_bytes,
            expert_bytes: p.expert_bytes,
            minimum_budget_bytes: p.minimum_budget_bytes,
            cache_bytes: p.cache_bytes,
            session_bytes: p.session_bytes,
        }
    }
}

/// The memory a loaded model holds now (all in bytes): see
/// `PocketModel.memoryUsage`.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct MemoryUsage {
    /// Weights in memory. Under a budget: every weight but the routed
    /// experts, in memory the model owns. Without one: the pages of the
    /// mapped file in memory now (page cache the OS may take back), or the
    /// whole file when it was read into memory (`useMmap = false`).
    pub resident_weights_bytes: u64,
    /// The expert cache's slots that hold or have held an expert (0 without
    /// a budget).
    pub expert_cache_bytes: u64,
    /// KV caches and recurrent state of the model's open sessions.
    pub kv_cache_bytes: u64,
    /// Their forward passes' buffers and last logits.
    pub scratch_bytes: u64,
}

impl From<pocket_core::model::MemoryUsage> for MemoryUsage {
    fn from(u: pocket_core::model::MemoryUsage) -> Self {
        MemoryUsage {
            resident_weights_bytes: u.resident_weights_bytes,
            expert_cache_bytes: u.expert_cache_bytes,
            kv_cache_bytes: u.kv_cache_bytes,
            scratch_bytes: u.scratch_bytes,
        }
    }
}

/// How `budget_bytes` would divide for the model at `path`, read from its
/// header and tensor table without loading the weights (Swift and Kotlin:
/// also `PocketModel.memoryPlan(path:budgetBytes:)`). Choose a budget at or
/// above `minimumBudgetBytes`; the more `cacheBytes`, the fewer experts are
/// read from storage per token.
#[uniffi::export]
pub fn plan_memory(path: String, budget_bytes: u64) -> Result<MemoryPlan, PocketError> {
    guard(|| Ok(Model::load(&path)?.memory_plan(budget_bytes).into()))
}

/// Receives load progress, on the loading thread.
#[uniffi::export(with_foreign)]
pub trait LoadProgressListener: Send + Sync {
    /// `fraction` runs from 0.0 to 1.0 (reached once the model is ready).
    fn on_progress(&self, fraction: f32) -> Result<(), PocketError>;
}

/// What a model file holds.
#[derive(Clone, Debug, PartialEq, uniffi::Record)]
pub struct ModelInfo {
    /// `general.architecture`, e.g. "qwen35moe", "gemma3".
    pub architecture: String,
    /// `general.name`, or "" when the file has none.
    pub name: String,
    pub parameter_count: u64,
    pub file_bytes: u64,
    /// Training context in tokens (0 when the file does not say).
    pub context_length: u32,
    /// Routed experts per layer (0 for a dense model).
    pub expert_count: u32,
    /// Experts used per token (0 for a dense model).
    pub expert_used_count: u32,
    /// The file type as llama.cpp names it ("Q4_K_M"), else the dominant tensor type.
    pub quantization: String,
    pub has_chat_template: bool,
    /// The device the passes run on: `Cpu` or `Gpu`, never `Auto` (resolved at load).
    pub backend: Backend,
    /// The GPU, when `backend` is `Gpu`; `None` on the CPU.
    pub adapter: Option<GpuAdapter>,
}

/// One file of a split model given as a descriptor range (`PocketModel.loadPartsFromFds`).
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct FilePart {
    /// An open descriptor of the file holding the shard (duplicated, not taken over).
    pub fd: i32,
    /// Where the shard starts in the file.
    pub offset: u64,
    /// The shard's length in bytes.
    pub length: u64,
}

/// A loaded model. Immutable and thread-safe: many sessions may share it.
#[derive(uniffi::Object)]
pub struct PocketModel {
    model: Arc<Model>,
    threads: u32,
}

#[uniffi::export]
impl PocketModel {
    /// Load a GGUF file: map it, validate every tensor, build the network.
    /// The first shard of a split model (`PREFIX-00001-of-0000N.gguf`, as
    /// `llama-gguf-split` writes them) loads the whole model, its other
    /// shards found beside it.
    #[uniffi::constructor]
    pub fn load(path: String, options: LoadOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            crate::logging::init();
            let progress = Progress(options.progress.as_deref());
            progress.report(0.0);
            let file = if options.use_mmap || options.memory_budget_bytes > 0 {
                GgufFile::open(&path)?
            } else {
                // The first shard of a split model reads every shard.
                let paths = pocket_core::gguf::split::shard_paths(std::path::Path::new(&path))?;
                if paths.len() > 1 {
                    let mut files = Vec::with_capacity(paths.len());
                    for p in paths {
                        let name = p.display().to_string();
                        let f = File::open(&p).map_err(|e| shard_error(&name, pocket_core::Error::Io(e)))?;
                        let len = f.metadata().map_err(|e| shard_error(&name, pocket_core::Error::Io(e)))?.len();
                        files.push((name, f, 0, len));
                    }
                    read_parts(files, &progress)?
                } else {
                    let f = File::open(&path).map_err(pocket_core::Error::Io)?;
                    let len = f.metadata().map_err(pocket_core::Error::Io)?.len();
                    GgufFile::from_bytes(read_range(&f, 0, len, &progress)?)?
                }
            };
            log::info!("loading {path}");
            Self::build(file, &options, &progress)
        })
    }

    /// Load `length` bytes starting at `offset` of an open file descriptor,
    /// e.g. an uncompressed asset inside an APK (`AssetFileDescriptor`). The
    /// descriptor is duplicated, not taken over: the caller may close it after
    /// this returns.
    #[uniffi::constructor]
    pub fn load_from_fd(fd: i32, offset: u64, length: u64, options: LoadOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            crate::logging::init();
            let progress = Progress(options.progress.as_deref());
            progress.report(0.0);
            let file = open_fd(fd, offset, length, options.use_mmap || options.memory_budget_bytes > 0, &progress)?;
            log::info!("loading fd {fd} at {offset}+{length}");
            Self::build(file, &options, &progress)
        })
    }

    /// Load a model split into several GGUF files (`llama-gguf-split`
    /// shards, `PREFIX-0000k-of-0000N.gguf`) from their paths, in any
    /// order. (`load` of the first shard's path finds the others beside it;
    /// this is for shards kept apart, e.g. in several folders.) A missing,
    /// extra, duplicated or mismatched shard is `PocketError.InvalidModel`
    /// (`Io` when a file cannot be read) whose reason names the shard.
    #[uniffi::constructor]
    pub fn load_parts(paths: Vec<String>, options: LoadOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            crate::logging::init();
            let progress = Progress(options.progress.as_deref());
            progress.report(0.0);
            let file = if options.use_mmap || options.memory_budget_bytes > 0 {
                GgufFile::open_parts(&paths)?
            } else {
                let mut files = Vec::with_capacity(paths.len());
                for p in &paths {
                    let f = File::open(p).map_err(|e| shard_error(p, pocket_core::Error::Io(e)))?;
                    let len = f.metadata().map_err(|e| shard_error(p, pocket_core::Error::Io(e)))?.len();
                    files.push((p.clone(), f, 0, len));
                }
                read_parts(files, &progress)?
            };
            log::info!("loading {} shards: {}", paths.len(), paths.join(", "));
            Self::build(file, &options, &progress)
        })
    }

    /// Load a split model from its shards' descriptor ranges, in any order:
    /// e.g. each shard an uncompressed asset of its own asset pack
    /// (`AssetFileDescriptor`). The descriptors are duplicated, not taken
    /// over: the caller may close them after this returns. Errors as `loadParts`.
    #[uniffi::constructor]
    pub fn load_parts_from_fds(parts: Vec<FilePart>, options: LoadOptions) -> Result<Arc<Self>, PocketError> {
        guard(|| {
            crate::logging::init();
            let progress = Progress(options.progress.as_deref());
            progress.report(0.0);
            let file = open_fd_parts(&parts, options.use_mmap || options.memory_budget_bytes > 0, &progress)?;
            log::info!("loading {} shards from descriptors", parts.len());
            Self::build(file, &options, &progress)
        })
    }

    /// Architecture, size, experts, quantisation and context of the file,
    /// and the device it runs on.
    pub fn info(&self) -> ModelInfo {
        let s = self.model.summary();
        let small = |v: Option<u64>| v.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        ModelInfo {
            architecture: s.architecture.clone(),
            name: s.name.clone().unwrap_or_default(),
            parameter_count: s.parameter_count,
            file_bytes: s.file_bytes,
            context_length: small(s.context_length),
            expert_count: small(s.expert_count),
            expert_used_count: small(s.expert_used_count),
            quantization: s.quantization.clone(),
            has_chat_template: s.has_chat_template,
            backend: match self.model.backend() {
                BackendKind::Gpu => Backend::Gpu,
                BackendKind::Auto | BackendKind::Cpu => Backend::Cpu,
            },
            adapter: self.model.adapter().map(|a| GpuAdapter {
                name: a.name.clone(),
                driver: a.driver.clone(),
                driver_info: a.driver_info.clone(),
                api: a.backend.clone(),
                kernels: a.kernels.name().to_string(),
            }),
        }
    }

    /// How `budget_bytes` would divide for this model.
    pub fn memory_plan(&self, budget_bytes: u64) -> MemoryPlan {
        self.model.memory_plan(budget_bytes).into()
    }

    /// The memory budget now (0 = none): the one it was loaded with, or
    /// the last `setMemoryBudget`.
    pub fn memory_budget_bytes(&self) -> u64 {
        self.model.memory_budget()
    }

    /// Change the memory budget while the model runs, from any thread (an
    /// OS memory warning's handler, say): every session's next token is
    /// computed under it, and the answer is the same as it would have been.
    /// A smaller budget drops the least recently used experts from the cache
    /// and gives their memory back before this returns (it may wait for a
    /// running token to finish the layer it computes); a larger one lets the
    /// cache grow. A model loaded without a budget takes one (its resident
    /// weights are read into memory first: a while for a large model, so
    /// call this off the main thread), and `0` returns it to the mapped file.
    /// Below the model's minimum (`memoryPlan(..).minimumBudgetBytes`) it is
    /// `PocketError.InvalidArgument` stating the minimum, and nothing
    /// changes; so it is for a model on the GPU backend. Open sessions keep
    /// their context; `memoryUsage` shows the result.
    pub fn set_memory_budget(&self, budget_bytes: u64) -> Result<(), PocketError> {
        guard(|| Ok(self.model.set_memory_budget(budget_bytes)?))
    }

    /// The memory the model holds now: resident weights, expert cache, and
    /// its sessions' KV caches and scratch.
    pub fn memory_usage(&self) -> MemoryUsage {
        self.model.memory_usage().into()
    }

    /// A new session on this model (the same as the `PocketSession` constructor).
    pub fn session(self: Arc<Self>, options: SessionOptions) -> Result<Arc<PocketSession>, PocketError> {
        PocketSession::new(self, options)
    }
}

impl PocketModel {
    fn build(file: GgufFile, options: &LoadOptions, progress: &Progress) -> Result<Arc<Self>, PocketError> {
        let opts = pocket_core::model::LoadOptions {
            memory_budget: options.memory_budget_bytes,
            backend: options.backend.unwrap_or(Backend::Auto).into(),
            chat_template: options.chat_template.clone(),
        };
        let model = Model::from_gguf_with(file, &opts).map_err(|e| match e {
            // The caller's own template does not compile: their argument, not the file.
            pocket_core::Error::Template { .. } if options.chat_template.is_some() => {
                PocketError::invalid_argument(format!("chat_template: {e}"))
            }
            e => PocketError::from(e),
        })?;
        progress.report(1.0);
        Ok(Arc::new(PocketModel { model: Arc::new(model), threads: options.threads }))
    }

    pub(crate) fn core(&self) -> &Arc<Model> {
        &self.model
    }

    /// Threads for sessions that leave the choice to the model.
    pub(crate) fn default_threads(&self) -> u32 {
        self.threads
    }
}

/// Forwards progress to an optional listener; a failing listener is logged, not fatal.
struct Progress<'a>(Option<&'a dyn LoadProgressListener>);

impl Progress<'_> {
    fn report(&self, fraction: f32) {
        if let Some(l) = self.0 {
            if let Err(e) = l.on_progress(fraction) {
                log::warn!("load progress listener failed: {e}");
            }
        }
    }
}

#[cfg(unix)]
fn open_fd(fd: i32, offset: u64, length: u64, use_mmap: bool, progress: &Progress) -> Result<GgufFile, PocketError> {
    use std::os::fd::BorrowedFd;
    if fd < 0 {
        return Err(PocketError::invalid_argument(format!("file descriptor {fd}")));
    }
    if use_mmap {
        return Ok(GgufFile::open_fd(fd, offset, length)?);
    }
    // SAFETY: the caller promises `fd` is open for the duration of this call;
    // it is duplicated here and the caller's descriptor is never closed.
    let file = File::from(unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().map_err(pocket_core::Error::Io)?);
    Ok(GgufFile::from_bytes(read_range(&file, offset, length, progress)?)?)
}

#[cfg(not(unix))]
fn open_fd(_: i32, _: u64, _: u64, _: bool, _: &Progress) -> Result<GgufFile, PocketError> {
    Err(PocketError::invalid_argument("loading from a file descriptor needs a Unix platform"))
}

#[cfg(unix)]
fn open_fd_parts(parts: &[FilePart], use_mmap: bool, progress: &Progress) -> Result<GgufFile, PocketError> {
    use std::os::fd::BorrowedFd;
    if let Some(p) = parts.iter().find(|p| p.fd < 0) {
        return Err(PocketError::invalid_argument(format!("file descriptor {}", p.fd)));
    }
    if use_mmap {
        let ranges: Vec<_> = parts.iter().map(|p| (p.fd, p.offset, p.length)).collect();
        return Ok(GgufFile::open_fd_parts(&ranges)?);
    }
    let mut files = Vec::with_capacity(parts.len());
    for p in parts {
        let name = pocket_core::gguf::split::fd_name(p.fd, p.offset, p.length);
        // SAFETY: the caller promises each `fd` is open for the duration of this call;
        // it is duplicated here and the caller's descriptor is never closed.
        let dup = unsafe { BorrowedFd::borrow_raw(p.fd) }.try_clone_to_owned();
        let file = File::from(dup.map_err(|e| shard_error(&name, pocket_core::Error::Io(e)))?);
        files.push((name, file, p.offset, p.length));
    }
    read_parts(files, progress)
}

#[cfg(not(unix))]
fn open_fd_parts(_: &[FilePart], _: bool, _: &Progress) -> Result<GgufFile, PocketError> {
    Err(PocketError::invalid_argument("loading from file descriptors needs a Unix platform"))
}

/// An error of the shard `name` (when several files are read).
fn shard_error(name: &str, e: pocket_core::Error) -> PocketError {
    pocket_core::Error::Split { shard: name.to_string(), problem: pocket_core::ShardProblem::Invalid(Box::new(e)) }
        .into()
}

/// Read each `(name, file, offset, len)` into memory (progress up to 0.9
/// over all of them) and open them as one split model.
fn read_parts(files: Vec<(String, File, u64, u64)>, progress: &Progress) -> Result<GgufFile, PocketError> {
    let total: u64 = files.iter().map(|f| f.3).sum::<u64>().max(1);
    let mut done = 0u64;
    let mut sources = Vec::with_capacity(files.len());
    for (name, file, offset, len) in &files {
        let part = Progress(None);
        let bytes = read_range(file, *offset, *len, &part).map_err(|e| match e {
            PocketError::Io { reason } => PocketError::Io { reason: format!("shard {name}: {reason}") },
            e => e,
        })?;
        done += len;
        progress.report(0.9 * (done as f32 / total as f32));
        sources.push((name.clone(), pocket_core::gguf::Source::from_vec(bytes)));
    }
    Ok(GgufFile::from_sources(sources)?)
}

/// Read `len` bytes at `offset` into memory, reporting progress up to 0.9.
fn read_range(file: &File, offset: u64, len: u64, progress: &Progress) -> Result<Vec<u8>, PocketError> {
    const CHUNK: usize = 16 << 20;
    let file_len = file.metadata().map_err(pocket_core::Error::Io)?.len();
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(pocket_core::Error::RangeOutsideFile { offset, len, file_len }.into());
    }
    let n = usize::try_from(len)
        .map_err(|_| PocketError::OutOfMemory { reason: format!("{len} bytes exceed the address space") })?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|_| PocketError::OutOfMemory { reason: format!("cannot allocate {len} bytes to read the model") })?;
    buf.resize(n, 0);
    for (i, chunk) in buf.chunks_mut(CHUNK).enumerate() {
        read_exact_at(file, chunk, offset + (i * CHUNK) as u64).map_err(pocket_core::Error::Io)?;
        progress.report(0.9 * ((i * CHUNK + chunk.len()) as f32 / n as f32));
    }
    Ok(buf)
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(not(unix))]
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(buf)
}
