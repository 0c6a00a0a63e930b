//! The loaded model that runs a [`Network`]: the mapped file, the network,
//! its tokenizer and chat template, the device that computes its passes and
//! the memory policy that holds its weights (mapped, or a budget's
//! resident set and expert cache).

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::budget::{check_session, expert_stacks, resident_ranges, MemoryPlan, MemoryUsage};
use super::cache::{KvType, Logits};
use super::cpu::Cpu;
use super::expert_cache::ExpertCache;
use super::gpu_backend::{BackendCounters, GpuBackend};
use super::identity::ModelIdentity;
use super::mtp::{HeadOut, MtpState};
use super::network::{foreign_state, Network};
use super::pass::{Backend, Observer, Pass};
use super::state::{Metered, Meters, State};
use super::weights::ExpertCopies;
use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::gguf::{Arch, GgufFile, Source, Summary};
use crate::gpu::{AdapterInfo, Gpu, GpuOptions};
use crate::structured::Grammars;
use crate::threads::ThreadPool;
use crate::tokenizer::Tokenizer;

/// How to load a model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The most memory the model and one session may use, in bytes; 0 = no
    /// budget (the file is mapped and the OS pages it). See [`MemoryPlan`].
    pub memory_budget: u64,
    /// The device that computes the passes.
    pub backend: BackendKind,
    /// A Jinja chat template used instead of the file's (files without one,
    /// or with one that does not compile). Compiled at load: a template that
    /// does not compile is [`Error::Template`].
    pub chat_template: Option<String>,
}

/// Which device computes a model's passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU, until a measurement on a device shows the GPU ahead there
    /// (today's GPU backend is the correct foundation, not yet the fast one).
    #[default]
    Auto,
    Cpu,
    /// The GPU backend ([`GpuBackend`]: matrix products on the device). No
    /// GPU, or a build without the `gpu` feature, is
    /// [`Error::GpuUnavailable`] at load; it does not run under a memory
    /// budget yet ([`Error::InvalidArgument`]).
    Gpu,
}

impl BackendKind {
    /// `auto`, `cpu` or `gpu`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Gpu => "gpu",
        }
    }

    /// `auto`, `cpu` or `gpu`.
    pub fn from_name(name: &str) -> Option<BackendKind> {
        match name {
            "auto" => Some(BackendKind::Auto),
            "cpu" => Some(BackendKind::Cpu),
            "gpu" => Some(BackendKind::Gpu),
            _ => None,
        }
    }
}

/// The backend a model was loaded with.
enum Device {
    Cpu,
    Gpu(Box<GpuBackend>),
}

impl Device {
    fn backend(&self) -> &dyn Backend {
        match self {
            Device::Cpu => &Cpu,
            Device::Gpu(g) => g.as_ref(),
        }
    }
}

/// Whether a mapped model's passes tell the OS which expert slabs come next
/// (`MADV_WILLNEED`). Worth it only while the mapping faults: when the file
/// does not fit in memory, a cold expert is then read in a few large
/// requests instead of fault by fault; when it is resident, the advice is
/// ~1,000 system calls a token for nothing (measured 4-10 % of decode). So
/// the process's page faults since the last pass decide: more than
/// [`FaultWatch::FAULTS`], and the next [`FaultWatch::PASSES`] passes advise.
#[derive(Default)]
struct FaultWatch {
    last: std::sync::atomic::AtomicU64,
    left: std::sync::atomic::AtomicU32,
}

impl FaultWatch {
    const FAULTS: u64 = 256;
    const PASSES: u32 = 64;

    fn advise(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let now = page_faults();
        let before = self.last.swap(now, Relaxed);
        if now.saturating_sub(before) > Self::FAULTS {
            self.left.store(Self::PASSES, Relaxed);
            return true;
        }
        self.left.fetch_update(Relaxed, Relaxed, |l| l.checked_sub(1)).is_ok()
    }
}

/// Page faults of the process so far (minor and major).
#[cfg(unix)]
fn page_faults() -> u64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: initialised by the successful call (and zeroed before).
    let u = unsafe { u.assume_init() };
    (u.ru_minflt.max(0) + u.ru_majflt.max(0)) as u64
}

#[cfg(not(unix))]
fn page_faults() -> u64 {
    0
}

/// A model under a memory budget: its plan, the weights it keeps in memory
/// and its expert cache. A pass holds the budget it started with; a new
/// budget replaces it (sharing the weights and the cache, resized), and the
/// memory of one dropped goes back when its last pass ends.
struct Budget {
    bytes: u64,
    plan: MemoryPlan,
    /// Every weight but the routed experts, read into memory the model owns
    /// (at the file's offsets; see [`Source::resident_copy`]).
    resident: Arc<Source>,
    cache: Option<Arc<ExpertCache>>,
}

impl Budget {
    /// Read `file`'s resident weights and make the expert cache `plan` sizes.
    fn build(file: &GgufFile, net: &dyn Network, bytes: u64, plan: MemoryPlan) -> Result<Budget> {
        let needs_file =
            || Error::InvalidArgument("a memory budget needs a model opened from a file, not a buffer".into());
        // A budget reads from the file: a model already in memory has nothing to budget.
        let direct = file.source().direct()?.ok_or_else(needs_file)?;
        let resident = file.source().resident_copy(&resident_ranges(file, net))?.ok_or_else(needs_file)?;
        let stacks = expert_stacks(net);
        let cache = if stacks.is_empty() {
            None
        } else {
            Some(Arc::new(ExpertCache::new(direct, &stacks, plan.cache_slots as usize)?))
        };
        Ok(Budget { bytes, plan, resident: Arc::new(resident), cache })
    }
}

/// A loaded model: the mapped file, its network, tokenizer and chat template.
/// Immutable, shared by any number of sequences.
pub struct Model {
    file: Arc<GgufFile>,
    net: Box<dyn Network>,
    summary: Summary,
    /// Computed at load: what a session snapshot records of this file.
    identity: ModelIdentity,
    tokenizer: Arc<Tokenizer>,
    /// The constraint engine over the vocabulary, built on first use.
    grammars: OnceLock<std::result::Result<Arc<Grammars>, String>>,
    /// The file's template (the architecture's turn format when it has
    /// none), or why it does not compile.
    template: std::result::Result<ChatTemplate, String>,
    /// The memory budget now (`None`: the file's own bytes, mapped).
    budget: Mutex<Option<Arc<Budget>>>,
    /// The routed experts interleaved ([`ExpertCopies`]) while the model
    /// runs from its mapping; dropped for good when it moves under a budget.
    copies: Mutex<Option<Arc<ExpertCopies>>>,
    /// One budget change at a time.
    budget_change: Mutex<()>,
    /// What the states this model made hold.
    meters: Arc<Meters>,
    faults: FaultWatch,
    device: Device,
}

impl Model {
    /// Map and validate a GGUF file and build its network (no weights are copied).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    /// [`load`](Self::load) with options (a memory budget).
    pub fn load_with(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model> {
        Self::from_gguf_with(GgufFile::open(path)?, opts)
    }

    pub fn from_gguf(file: GgufFile) -> Result<Model> {
        Self::from_gguf_with(file, &LoadOptions::default())
    }

    /// Build the model of an opened file. With a memory budget, the weights
    /// every token reads are read into owned memory and the routed experts
    /// get a cache sized to what the budget leaves (a budget below the
    /// model's minimum is refused with [`Error::OutOfMemory`]); the file
    /// stays mapped, untouched, for [`set_memory_budget`](Self::set_memory_budget)`(0)`.
    pub fn from_gguf_with(mut file: GgufFile, opts: &LoadOptions) -> Result<Model> {
        let summary = Summary::of(&file)?;
        // Q4_K, Q6_K and Q8_0 matrices interleaved by four where the CPU path
        // decodes that layout (NEON with `sdot`) and the copies fit; the GPU
        // backend reads the file's layout. `POCKET_INTERLEAVE=0` keeps the
        // file's (for comparisons).
        let interleave_off = std::env::var("POCKET_INTERLEAVE").is_ok_and(|v| v == "0");
        file.set_interleave(
            opts.backend != BackendKind::Gpu
                && !interleave_off
                && crate::kernels::interleaves(crate::quant::GgmlType::Q4K)
                && interleaved_copies_fit(&file, false),
        );
        let net = super::network_for(&file)?;
        // The routed experts too, for a model that runs from its mapping
        // (under a budget the expert cache reads the file's layout).
        let copies = (file.interleave() && opts.memory_budget == 0 && interleaved_copies_fit(&file, true)).then(|| {
            let stacks = net.experts();
            ExpertCopies::build(file.source().bytes(), stacks.iter().map(|(_, x)| *x))
        });
        let copies = copies.filter(|c| c.bytes() > 0).map(Arc::new);
        if file.interleaved_bytes() > 0 || copies.is_some() {
            // The interleaved tensors' pages of the mapping are not read again.
            file.source().release();
        }
        let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
        let template = match &opts.chat_template {
            Some(source) => Ok(ChatTemplate::with_texts_of(source, &tokenizer)?),
            None => ChatTemplate::for_model(&file, &tokenizer).map_err(|e| e.to_string()),
        };
        let identity = ModelIdentity::of(&file);
        let budget = match opts.memory_budget {
            0 => None,
            bytes => {
                let plan = MemoryPlan::new(&file, net.as_ref(), bytes, summary.context_length);
                if bytes < plan.minimum_budget_bytes {
                    return Err(plan.refuse(bytes));
                }
                Some(Arc::new(Budget::build(&file, net.as_ref(), bytes, plan)?))
            }
        };
        let device = match opts.backend {
            BackendKind::Auto => {
                log::info!("backend auto: the CPU (no device measurement shows the GPU backend ahead yet)");
                Device::Cpu
            }
            BackendKind::Cpu => Device::Cpu,
            BackendKind::Gpu if budget.is_some() => {
                return Err(Error::InvalidArgument("the GPU backend does not run under a memory budget yet".into()))
            }
            BackendKind::Gpu => {
                let gpu = Gpu::new(&GpuOptions::from_env())?;
                let bytes = file.source().bytes();
                let mut backend = GpuBackend::new(gpu, bytes);
                match file.source().direct() {
                    Ok(Some(direct)) => backend = backend.reading_from(direct),
                    Ok(None) => {}
                    Err(e) => log::warn!("gpu: weights copied from the mapping (the file cannot be reopened: {e})"),
                }
                // The weights go up now: the expert stacks whole, the rest
                // by recording a decode over a one-position state.
                let stacks: Vec<_> = net.experts().iter().map(|(_, x)| x.all.view(bytes)).collect();
                let kinds = net.layer_kinds();
                let layers = kinds.into_iter().map(|k| k.new_state(1, KvType::F16)).collect::<Result<_>>()?;
                let state = State::new(layers, 1);
                backend.upload_weights(&stacks, |g| g.warm_up(net.as_ref(), bytes, &state));
                Device::Gpu(Box::new(backend))
            }
        };
        let faults = FaultWatch::default();
        faults.left.store(FaultWatch::PASSES, std::sync::atomic::Ordering::Relaxed); // a fresh mapping is cold
        Ok(Model {
            file: Arc::new(file),
            net,
            summary,
            identity,
            tokenizer,
            grammars: OnceLock::new(),
            template,
            budget: Mutex::new(budget),
            copies: Mutex::new(copies),
            budget_change: Mutex::new(()),
            meters: Arc::default(),
            faults,
            device,
        })
    }

    /// The budget now.
    fn current_budget(&self) -> Option<Arc<Budget>> {
        lock(&self.budget).clone()
    }

    /// Change the memory budget while the model runs, from any thread: the
    /// next pass of every session (so between two tokens of a running
    /// generation) runs under it, and its outputs are the same as before.
    ///
    /// - From one budget to another, the expert cache shrinks (the least
    ///   recently used experts are dropped and their memory goes back to the
    ///   OS before this returns: it waits for a pass holding them to end the
    ///   layer it computes) or grows (new slots, filled as passes need them).
    /// - A model loaded without a budget takes one: its resident weights are
    ///   read into owned memory (while passes go on over the mapping) and an
    ///   expert cache made; the mapping's pages are let go.
    /// - `0` returns to the mapping: the resident weights and the cache are
    ///   freed when the last pass using them ends.
    ///
    /// A budget below the model's minimum ([`MemoryPlan::minimum_budget_bytes`])
    /// is [`Error::InvalidArgument`] stating it, and nothing changes; so is a
    /// budget for a model on the GPU backend, or read from a buffer. The
    /// sessions already open keep their context even when the new budget is
    /// smaller than they need (a new session is checked against it).
    pub fn set_memory_budget(&self, bytes: u64) -> Result<()> {
        let _one = lock(&self.budget_change);
        let current = self.current_budget();
        if bytes == 0 {
            if current.is_some() {
                *lock(&self.budget) = None;
                // The mapping is cold again: advise it as at load.
                self.faults.left.store(FaultWatch::PASSES, std::sync::atomic::Ordering::Relaxed);
                log::info!("memory budget removed: the model runs from the mapped file");
            }
            return Ok(());
        }
        if let Device::Gpu(_) = self.device {
            return Err(Error::InvalidArgument("the GPU backend does not run under a memory budget yet".into()));
        }
        let plan = self.memory_plan(bytes);
        if bytes < plan.minimum_budget_bytes {
            return Err(Error::InvalidArgument(plan.below_minimum(bytes)));
        }
        let next = match &current {
            Some(b) => {
                if let Some(cache) = &b.cache {
                    cache.resize(plan.cache_slots as usize)?;
                }
                Budget { bytes, plan, resident: Arc::clone(&b.resident), cache: b.cache.clone() }
            }
            None => Budget::build(&self.file, self.net.as_ref(), bytes, plan)?,
        };
        *lock(&self.budget) = Some(Arc::new(next));
        if lock(&self.copies).take().is_some() {
            // The passes now read the experts through the cache: the
            // interleaved copies go (with the last pass that holds them) and
            // are not made again when the budget is lifted.
            log::info!("memory budget: the routed experts' interleaved copies released");
        }
        if current.is_none() {
            // Passes from now on read owned memory: the mapping's pages can go.
            self.file.source().release();
        }
        log::info!("memory budget {bytes} bytes: {} expert cache slots ({} bytes)", plan.cache_slots, plan.cache_bytes);
        Ok(())
    }

    /// The memory the model holds now: resident weights, expert cache, and
    /// the KV caches and scratch of the sessions it serves.
    pub fn memory_usage(&self) -> MemoryUsage {
        let (kv, scratch) = self.meters.read();
        let (resident, cache) = match self.current_budget() {
            Some(b) => (b.resident.resident_bytes(), b.cache.as_ref().map_or(0, |c| c.bytes())),
            None => (self.file.source().resident_bytes(), 0),
        };
        // The interleaved copies of matrices (and of the experts, without a
        // budget), held beside the file's bytes.
        let resident = resident + self.file.interleaved_bytes() + self.expert_copies_bytes();
        MemoryUsage {
            resident_weights_bytes: resident,
            expert_cache_bytes: cache,
            kv_cache_bytes: kv,
            scratch_bytes: scratch,
        }
    }

    /// Bytes of the routed experts' interleaved copies ([`ExpertCopies`]):
    /// made at load without a budget where the CPU path decodes the layout
    /// and they fit, gone for good once a budget is set.
    pub fn expert_copies_bytes(&self) -> u64 {
        lock(&self.copies).as_ref().map_or(0, |c| c.bytes())
    }

    /// How `budget` bytes would divide for this model (see [`MemoryPlan`]).
    pub fn memory_plan(&self, budget: u64) -> MemoryPlan {
        MemoryPlan::new(&self.file, self.net.as_ref(), budget, self.summary.context_length)
    }

    /// `cpu` or `gpu`: the backend the passes run on.
    pub fn backend_name(&self) -> &'static str {
        self.device.backend().name()
    }

    /// The backend the passes run on: [`BackendKind::Cpu`] or
    /// [`BackendKind::Gpu`], never `Auto` (resolved at load).
    pub fn backend(&self) -> BackendKind {
        match &self.device {
            Device::Cpu => BackendKind::Cpu,
            Device::Gpu(_) => BackendKind::Gpu,
        }
    }

    /// The GPU adapter, when the model runs on the GPU.
    pub fn adapter(&self) -> Option<&AdapterInfo> {
        match &self.device {
            Device::Gpu(g) => Some(g.adapter()),
            Device::Cpu => None,
        }
    }

    /// Where the matrix products ran since load (the GPU backend only).
    pub fn backend_counters(&self) -> Option<BackendCounters> {
        match &self.device {
            Device::Gpu(g) => Some(g.counters()),
            Device::Cpu => None,
        }
    }

    /// The memory budget now (0 = none): the one it was loaded with, or
    /// the last [`set_memory_budget`](Self::set_memory_budget).
    pub fn memory_budget(&self) -> u64 {
        self.current_budget().map_or(0, |b| b.bytes)
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The constraint engine over this model's vocabulary (built on first
    /// use, then shared by every session).
    pub fn grammars(&self) -> Result<Arc<Grammars>> {
        self.grammars
            .get_or_init(|| Grammars::new(self.tokenizer.clone()).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::InvalidArgument)
    }

    /// The chat template; an error when the file's template does not compile.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().map_err(|e| Error::Template { reason: e.clone() })
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// The file's identity (size and header hash), which session snapshots record.
    pub fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    pub fn arch(&self) -> Arch {
        self.net.arch()
    }

    pub fn n_vocab(&self) -> usize {
        self.net.trunk().n_vocab
    }

    /// For each routed-expert tensor: its layer and the file byte range of
    /// each expert's slab.
    pub fn expert_slabs(&self) -> Vec<(usize, Vec<std::ops::Range<usize>>)> {
        self.net.experts().into_iter().map(|(il, x)| (il, (0..x.n_expert).map(|e| x.slab_range(e)).collect())).collect()
    }

    /// A fresh state holding up to `n_ctx` positions.
    pub fn new_state(&self, n_ctx: usize, kv: KvType) -> Result<State> {
        if n_ctx == 0 {
            return Err(Error::InvalidArgument("context length must be positive".into()));
        }
        let kinds = self.net.layer_kinds();
        if let Some(b) = self.current_budget() {
            let bytes: usize = kinds.iter().map(|k| k.state_bytes(n_ctx, kv)).sum();
            check_session(&b.plan, b.bytes, bytes as u64)?;
        }
        let layers = kinds.into_iter().map(|k| k.new_state(n_ctx, kv)).collect::<Result<_>>()?;
        let mut state = State::new(layers, n_ctx);
        state.meter = Some(Metered::new(Arc::clone(&self.meters)));
        state.measure();
        Ok(state)
    }

    /// Evaluate `tokens` after the state's current contents: embed them, run
    /// the layers, and leave the logits `want` asks for in the state.
    pub fn forward(&self, pool: &ThreadPool, state: &mut State, tokens: &[u32], want: Logits) -> Result<()> {
        self.forward_observed(pool, state, tokens, want, None)
    }

    /// [`forward`](Self::forward), showing `observer` the input of every
    /// weight product (how `pocket imatrix` collects its statistics).
    pub fn forward_observed(
        &self,
        pool: &ThreadPool,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
        observer: Option<&dyn Observer>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        if state.n_past + tokens.len() > state.n_ctx {
            return Err(Error::ContextFull { n_ctx: state.n_ctx });
        }
        let n_vocab = self.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::InvalidArgument(format!("token id {bad} is outside the vocabulary of {n_vocab}")));
        }
        if state.layers.len() != self.net.n_layer() {
            return Err(foreign_state());
        }
        state.clock += 1;
        let (start, end) = (state.n_past, state.n_past + tokens.len());
        state.stamps[start..end].fill(state.clock);

        // The budget this pass runs under, held to its end.
        let budget = self.current_budget();
        let experts = budget.as_ref().and_then(|b| b.cache.as_deref());
        let source = budget.as_ref().map_or(self.file.source(), |b| &b.resident);
        let map = (source.is_mapped() && self.faults.advise()).then_some(source);
        let copies = if budget.is_none() { lock(&self.copies).clone() } else { None };
        let pass = Pass {
            file: source.bytes(),
            pool,
            backend: self.device.backend(),
            experts,
            map,
            copies: copies.as_deref(),
            pos0: start,
            n: tokens.len(),
            observer,
        };
        if let (Device::Gpu(g), [token], None, None, None) =
            (&self.device, tokens, observer, &state.trace, &state.hidden)
        {
            // One decoded token: one submission, when the network records.
            if g.decode(self.net.as_ref(), source.bytes(), state, *token, want)? {
                state.n_past = end;
                state.measure();
                return Ok(());
            }
        }
        let trunk = self.net.trunk();
        let s = &mut state.scratch;
        self.net.embed(&pass, self.file.source().bytes(), tokens, s);
        let run = self.net.layers(&pass, &mut state.layers, s, state.trace.as_mut());
        state.measure();
        run?;
        if let Some(hidden) = state.hidden.as_mut() {
            // The final norm of every token (what the head reads), for a multi-token-prediction layer.
            let rows = tokens.len() * trunk.n_embd;
            trunk.norm.forward(&state.scratch.x[..rows], super::scratch::take(hidden, rows));
        }
        state.logit_rows = trunk.logits(&pass, &mut state.scratch, want, &mut state.logits);
        state.n_past = end;
        state.measure();
        Ok(())
    }
}

/// The multi-token-prediction layer (drafting; see `mtp.rs`).
impl Model {
    /// Whether the file has a usable multi-token-prediction layer; an
    /// error says why one it has cannot be used.
    pub fn has_mtp(&self) -> Result<bool> {
        Ok(self.net.mtp()?.is_some())
    }

    /// Width of the residual stream (of [`State::hidden`]'s rows).
    pub fn n_embd(&self) -> usize {
        self.net.trunk().n_embd
    }

    /// A fresh state of the multi-token-prediction layer for `n_ctx` positions.
    pub fn new_mtp_state(&self, n_ctx: usize, kv: KvType) -> Result<MtpState> {
        let mtp = self.net.mtp()?.ok_or_else(no_mtp)?;
        Ok(MtpState::new(mtp.attn_params().new_cache(kv, n_ctx)?))
    }

    /// Run the multi-token-prediction layer over `tokens` paired with the
    /// hidden states `h` (`[n][n_embd]`: row t the trunk's final-normed
    /// state, or the layer's own output, of the position before token t), at
    /// the positions after `st`'s; with `want_logits`, the last token's
    /// logits (of the tokens [`MtpState::set_head_rows`] and
    /// [`MtpState::set_head_extra`] say). On the CPU; under a memory budget
    /// as the trunk runs: weights from the resident copy, experts through
    /// the expert cache.
    pub fn mtp_forward(
        &self,
        pool: &ThreadPool,
        st: &mut MtpState,
        tokens: &[u32],
        h: &[f32],
        want_logits: bool,
    ) -> Result<()> {
        let mtp = self.net.mtp()?.ok_or_else(no_mtp)?;
        let trunk = self.net.trunk();
        if tokens.is_empty() || h.len() != tokens.len() * trunk.n_embd {
            return Err(Error::InvalidArgument(format!(
                "mtp: {} tokens need {} hidden values, got {}",
                tokens.len(),
                tokens.len() * trunk.n_embd,
                h.len()
            )));
        }
        if st.n_past + tokens.len() > st.cache.capacity {
            return Err(Error::ContextFull { n_ctx: st.cache.capacity });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= trunk.n_vocab) {
            return Err(Error::InvalidArgument(format!("token id {bad} is outside the vocabulary")));
        }
        let budget = self.current_budget();
        let experts = budget.as_ref().and_then(|b| b.cache.as_deref());
        let source = budget.as_ref().map_or(self.file.source(), |b| &b.resident);
        let map = (source.is_mapped() && self.faults.advise()).then_some(source);
        let copies = if budget.is_none() { lock(&self.copies).clone() } else { None };
        let pass = Pass {
            file: source.bytes(),
            pool,
            backend: &Cpu,
            experts,
            map,
            copies: copies.as_deref(),
            pos0: st.n_past,
            n: tokens.len(),
            observer: None,
        };
        let MtpState { cache, scratch, cat, hidden, logits, head_rows, head_extra, scored, .. } = st;
        let logits = want_logits.then_some(HeadOut { logits, rows: *head_rows, extra: head_extra, scored });
        mtp.forward(&pass, trunk, cache, scratch, cat, tokens, h, hidden, logits)?;
        st.n_past += tokens.len();
        Ok(())
    }
}

fn no_mtp() -> Error {
    Error::InvalidArgument("this file has no multi-token-prediction layer".into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the interleaved copies a load would make fit the machine: the
/// bytes of the Q4_K, Q6_K and Q8_0 matrices (and, `with_experts`, expert
/// stacks: an upper bound of what the loader lays out) at most a quarter of
/// its memory. Above that the file's layout stays: mapped pages the OS can
/// evict and read again, where the copy of a large model would be memory it
/// cannot reclaim (on iOS, footprint that gets the app killed). Unknown
/// memory: the copies are made.
fn interleaved_copies_fit(file: &GgufFile, with_experts: bool) -> bool {
    let dims = if with_experts { 3 } else { 2 };
    let bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| (2..=dims).contains(&t.n_dims) && crate::quant::x4::has_layout(t.ty))
        .filter(|t| !t.name.contains("token_embd"))
        .map(|t| t.size)
        .sum();
    physical_memory().is_none_or(|m| bytes <= m / 4)
}

/// The machine's physical memory in bytes, where the OS says.
fn physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf reads system constants; no memory is passed.
        let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        if pages > 0 && size > 0 {
            return Some(pages as u64 * size as u64);
        }
    }
    None
}
