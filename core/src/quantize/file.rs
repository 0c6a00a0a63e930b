//! Quantising a whole GGUF file: the plan (each tensor's type, checked
//! before anything is written) and the streaming conversion.
//!
//! The output is written tensor by tensor, each in slabs of rows that the
//! threads quantise in parallel (every row of a slab dequantised from the
//! input and quantised by one thread), so memory stays at a few slabs
//! whatever the model's size. It goes to `OUT.part` and is renamed to `OUT`
//! only when complete: a failure leaves no output file behind.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use super::imatrix::Imatrix;
use super::mix::{ggml_dims, tensor_order, tensor_requires_imatrix, Category, FileType, Mixer, ModelShape};
use super::{can_quantize, quantize_rows};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, GgufWriter, TensorInfo, Value};
use crate::kernels::row_dequantizer;
use crate::quant::GgmlType;

/// `general.quantization_version` of the blocks written (ggml's `GGML_QNT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2;

/// Output bytes per slab of rows (the input of a slab is dequantised row by row).
const SLAB_BYTES: usize = 16 << 20;
/// Rows a thread takes at a time.
const ROWS_PER_TASK: usize = 16;

/// How to quantise a file.
#[derive(Clone, Debug)]
pub struct Options<'a> {
    pub ftype: FileType,
    /// The importance matrix, and the name of its file (recorded in the output's metadata).
    pub imatrix: Option<(&'a Imatrix, String)>,
    /// Convert tensors that are already quantised (their error adds up).
    pub allow_requantize: bool,
    pub threads: usize,
}

/// One tensor's fate.
#[derive(Clone, Debug)]
pub struct Planned {
    pub name: String,
    /// Shape, innermost first.
    pub dims: Vec<u64>,
    pub from: GgmlType,
    pub to: GgmlType,
    /// Whether its importance vector was found (always false when copied).
    pub weighted: bool,
}

impl Planned {
    pub fn converted(&self) -> bool {
        self.from != self.to
    }

    fn rows(&self) -> usize {
        self.dims.get(1..).map_or(1, |d| d.iter().product::<u64>()) as usize
    }

    pub fn bytes(&self, ty: GgmlType) -> u64 {
        ty.row_bytes(self.dims[0]).unwrap_or(0) * self.rows() as u64
    }
}

/// What a finished run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub tensors: usize,
    pub converted: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Values in all tensors (bits per weight = 8 bytes_out / weights).
    pub weights: u64,
    /// Tensors whose rows did not fit the preset's blocks (given a wider-block type).
    pub fallbacks: usize,
}

impl Report {
    /// What carrying out `planned` does (with the plan's fallback count).
    pub fn of(planned: &[Planned], fallbacks: usize) -> Report {
        Report {
            tensors: planned.len(),
            converted: planned.iter().filter(|p| p.converted()).count(),
            bytes_in: planned.iter().map(|p| p.bytes(p.from)).sum(),
            bytes_out: planned.iter().map(|p| p.bytes(p.to)).sum(),
            weights: planned.iter().map(|p| p.dims.iter().product::<u64>()).sum(),
            fallbacks,
        }
    }
}

/// The facts of the model that the mix depends on.
pub fn model_shape(f: &GgufFile) -> Result<ModelShape> {
    let arch = f.architecture()?.unwrap_or_default().to_string();
    let first = |key: &str| -> Option<u64> {
        match f.get(&format!("{arch}.{key}"))? {
            Value::Array(a) => a.to_i64_vec()?.first().and_then(|&v| u64::try_from(v).ok()),
            v => v.as_u64(),
        }
    };
    let n_layer = first("block_count").unwrap_or(0) as usize;
    let n_head = first("attention.head_count").unwrap_or(0);
    let n_head_kv = first("attention.head_count_kv").unwrap_or(n_head);
    Ok(ModelShape {
        is_70b: arch == "llama" && n_layer == 80,
        n_gqa: n_head.checked_div(n_head_kv).unwrap_or(0) as usize,
        n_expert: first("expert_count").unwrap_or(0) as usize,
        n_layer,
        arch,
    })
}

/// Every tensor of `input`, in llama.cpp's order, with the type it gets;
/// every check done: the errors of a run come from here, before a byte is
/// written.
pub fn plan(input: &GgufFile, opts: &Options) -> Result<(Vec<Planned>, usize)> {
    let invalid = |why: String| Err(Error::InvalidArgument(why));
    let mut tensors: Vec<&TensorInfo> = input.tensors().iter().collect();
    tensors.sort_by(|a, b| tensor_order(&a.name, &b.name));
    let shape = model_shape(input)?;
    let mut mixer = Mixer::new(opts.ftype, shape, opts.imatrix.is_some(), tensors.iter().map(|t| t.name.as_str()));
    let imatrix = opts.imatrix.as_ref().map(|(m, _)| *m);
    let mut planned = Vec::with_capacity(tensors.len());
    let mut any_weighted = false;
    for t in tensors {
        // llama-quantize writes a [n, 1] vector as [n].
        let dims = ggml_dims(t.shape()).to_vec();
        let to = mixer.choose(&t.name, &dims, t.ty);
        let mut p = Planned { name: t.name.clone(), dims, from: t.ty, to, weighted: false };
        if p.converted() {
            if !can_quantize(to) {
                return invalid(format!("{}: Pocket cannot make {to} blocks", p.name));
            }
            if row_dequantizer(p.from).is_none() {
                return invalid(format!("{}: Pocket cannot read {} blocks", p.name, p.from));
            }
            if !matches!(p.from, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) && !opts.allow_requantize {
                return invalid(format!(
                    "{} is already {} (quantising it again adds the errors of both): pass --allow-requantize",
                    p.name, p.from
                ));
            }
            if let Some(m) = imatrix {
                if let Some(e) = m.entries.get(&p.name) {
                    let want = p.dims[0] as usize * p.dims.get(2).map_or(1, |&d| d as usize);
                    if e.sums.len() == want {
                        p.weighted = true;
                    } else if Category::of(&p.name) != Category::TokenEmbd {
                        return Err(Error::Imatrix(format!(
                            "{} has {} values for {} in this model: made for another model?",
                            p.name,
                            e.sums.len(),
                            want
                        )));
                    }
                }
            }
            if !p.weighted && tensor_requires_imatrix(&p.name, to, opts.ftype) {
                return invalid(match imatrix {
                    None => format!(
                        "{} makes {} {to}, which needs an importance matrix: pass --imatrix (pocket imatrix makes one)",
                        opts.ftype.name(),
                        p.name
                    ),
                    Some(_) => format!("the importance matrix has no entry for {} ({to} needs one)", p.name),
                });
            }
            any_weighted |= p.weighted;
        }
        planned.push(p);
    }
    if let Some(m) = imatrix {
        if let Some(stray) = m.entries.keys().find(|n| input.tensor(n).is_none()) {
            return Err(Error::Imatrix(format!("{stray} is not a tensor of this model: made for another model?")));
        }
        if !any_weighted && planned.iter().any(Planned::converted) {
            return Err(Error::Imatrix("no entry for any tensor being quantised".into()));
        }
    }
    Ok((planned, mixer.n_fallback))
}

/// The output's metadata: the input's, with the file type, the quantisation
/// version and the importance matrix's provenance set.
fn metadata(input: &GgufFile, opts: &Options) -> Vec<(String, Value)> {
    let ours = |k: &str| {
        matches!(k, "general.file_type" | "general.quantization_version")
            || k.starts_with("split.")
            || k.starts_with("quantize.imatrix.")
    };
    let mut kvs: Vec<(String, Value)> =
        input.metadata().filter(|(k, _)| !ours(k)).map(|(k, v)| (k.to_string(), v.clone())).collect();
    kvs.push(("general.quantization_version".into(), Value::U32(QUANTIZATION_VERSION)));
    kvs.push(("general.file_type".into(), Value::U32(opts.ftype.id())));
    if let Some((m, file)) = &opts.imatrix {
        kvs.push(("quantize.imatrix.file".into(), Value::String(file.clone())));
        if let Some(d) = m.datasets.first() {
            kvs.push(("quantize.imatrix.dataset".into(), Value::String(d.clone())));
        }
        kvs.push(("quantize.imatrix.entries_count".into(), Value::U32(m.entries.len() as u32)));
        if m.chunk_count > 0 {
            kvs.push(("quantize.imatrix.chunks_count".into(), Value::U32(m.chunk_count)));
        }
    }
    kvs
}

/// Quantise `input` into `output` as `opts` says; `progress(i, n, tensor)`
/// is called as each tensor starts.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(usize, usize, &Planned),
) -> Result<Report> {
    quantize_file_with(input, output, opts, &mut |p| p.to, progress)
}

/// [`quantize_file`] with a mix of one's own: each tensor the preset
/// converts gets the type `retype(planned)` names instead of the preset's
/// (`planned.to`), checked as the plan checks its own (a type Pocket makes,
/// whole blocks per row, an importance matrix where the type needs one).
/// The tests make files of many formats with it.
pub fn quantize_file_with(
    input: &Path,
    output: &Path,
    opts: &Options,
    retype: &mut dyn FnMut(&Planned) -> GgmlType,
    progress: &mut dyn FnMut(usize, usize, &Planned),
) -> Result<Report> {
    let src = GgufFile::open(input)?;
    let (mut planned, fallbacks) = plan(&src, opts)?;
    for p in planned.iter_mut().filter(|p| p.converted()) {
        let to = retype(p);
        if to == p.to {
            continue;
        }
        if !can_quantize(to) || to.row_bytes(p.dims[0]).is_none() {
            return Err(Error::InvalidArgument(format!("{}: Pocket cannot make {to} rows of {}", p.name, p.dims[0])));
        }
        if !p.weighted && super::requires_imatrix(to) {
            return Err(Error::InvalidArgument(format!("{}: {to} needs an importance matrix", p.name)));
        }
        p.to = to;
    }
    let mut w = GgufWriter::new();
    for (k, v) in metadata(&src, opts) {
        w.kv(&k, v);
    }
    for p in &planned {
        w.tensor(&p.name, p.to, &p.dims);
    }
    let part = {
        let mut s = output.as_os_str().to_owned();
        s.push(".part");
        std::path::PathBuf::from(s)
    };
    match write_tensors(&src, &w, &planned, opts, &part, progress) {
        Ok(()) => {
            std::fs::rename(&part, output)?;
            Ok(Report::of(&planned, fallbacks))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

fn write_tensors(
    src: &GgufFile,
    w: &GgufWriter,
    planned: &[Planned],
    opts: &Options,
    part: &Path,
    progress: &mut dyn FnMut(usize, usize, &Planned),
) -> Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(part)?);
    out.write_all(&w.header())?;
    for (i, p) in planned.iter().enumerate() {
        progress(i, planned.len(), p);
        let t = src.tensor(&p.name).ok_or_else(|| Error::MissingTensor(p.name.clone()))?;
        let data = src.tensor_data(t);
        let weights = match &opts.imatrix {
            Some((m, _)) if p.weighted => m.weights(&p.name),
            _ => None,
        };
        let n = if p.converted() {
            convert(data, p, weights.as_deref(), opts.threads.max(1), &mut out)?
        } else {
            out.write_all(data)?;
            data.len() as u64
        };
        // Every tensor padded to the alignment, the last too, as llama-quantize writes.
        out.write_all(&vec![0u8; (n.div_ceil(w.alignment) * w.alignment - n) as usize])?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

/// Convert one tensor, slab by slab; returns the bytes written.
fn convert(data: &[u8], p: &Planned, weights: Option<&[f32]>, threads: usize, out: &mut impl Write) -> Result<u64> {
    let cols = p.dims[0] as usize;
    let rows = p.rows();
    let rows_per_mat = p.dims.get(1).map_or(1, |&d| d as usize);
    let (in_row, out_row) = (data.len() / rows, p.to.row_bytes(cols as u64).unwrap_or(0) as usize);
    let dequantize =
        row_dequantizer(p.from).ok_or_else(|| Error::InvalidArgument(format!("cannot read {}", p.from)))?;
    let slab_rows = (SLAB_BYTES / out_row.max(1)).clamp(ROWS_PER_TASK, rows.max(ROWS_PER_TASK));
    let mut slab = vec![0u8; slab_rows.min(rows) * out_row];
    let mut first = 0;
    while first < rows {
        let n = slab_rows.min(rows - first);
        let dst = &mut slab[..n * out_row];
        // Tasks never cross a matrix (an expert), whose importance vector
        // differs; each owns its rows of the slab.
        let mut tasks = Vec::new();
        let (mut r, mut rest) = (first, &mut *dst);
        while r < first + n {
            let end = (r + ROWS_PER_TASK).min(first + n).min((r / rows_per_mat + 1) * rows_per_mat);
            let (y, tail) = std::mem::take(&mut rest).split_at_mut((end - r) * out_row);
            tasks.push((r..end, y));
            (r, rest) = (end, tail);
        }
        let n_tasks = tasks.len();
        let tasks = Mutex::new(tasks.into_iter());
        let failure = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..threads.min(n_tasks) {
                s.spawn(|| {
                    let mut x = vec![0f32; ROWS_PER_TASK * cols];
                    loop {
                        let Some((rows, y)) = tasks.lock().unwrap_or_else(|e| e.into_inner()).next() else { break };
                        let k = rows.len();
                        for (j, row) in rows.clone().enumerate() {
                            dequantize(&data[row * in_row..(row + 1) * in_row], &mut x[j * cols..(j + 1) * cols]);
                        }
                        let mat = rows.start / rows_per_mat;
                        let w = weights.map(|w| &w[mat * cols..(mat + 1) * cols]);
                        if let Err(e) = quantize_rows(p.to, &x[..k * cols], cols, w, y) {
                            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        out.write_all(dst)?;
        first += n;
    }
    Ok((rows * out_row) as u64)
}
