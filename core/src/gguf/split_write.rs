//! Writing split models: `pocket split` and `pocket merge`, byte for byte
//! what `llama-gguf-split --split` and `--merge` write (llama.cpp's
//! tools/gguf-split/gguf-split.cpp and ggml's gguf writer):
//!
//! - every file is GGUF v3, 32-byte aligned (ggml's default alignment: the
//!   header padded to it, every tensor's data padded to it, the last too);
//! - a tensor's rank is written without its trailing dimensions of 1
//!   (`ggml_n_dims`);
//! - `split`: the first shard holds every metadata pair of the input in its
//!   order, less any `split.*` key, then `split.no` (u16), `split.tensors.count`
//!   (i32) and `split.count` (u16); the other shards hold only those three.
//!   Tensors keep the input's order. `--max-tensors N` starts a new shard at
//!   every N-th tensor; `--max-size` starts one when the shard's tensors,
//!   each counted padded to 32 bytes (not the header), would exceed it;
//! - `merge`: the first shard's metadata with `split.count` moved last and
//!   set to 0 (so the output is not taken for a shard), every shard's
//!   tensors in order.
//!
//! A model whose `general.alignment` is not 32 is refused: llama-gguf-split
//! would keep the key but write 32-byte offsets, a file no reader accepts.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::split::{shard_path, shard_prefix, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};
use super::{GgufFile, GgufWriter, TensorInfo, Value};
use crate::error::{Error, Result};

/// ggml's alignment, which llama-gguf-split writes whatever the input says.
const ALIGN: u64 = 32;

/// Where a split starts a new shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitLimit {
    /// At most this many tensors a shard (`--split-max-tensors`).
    Tensors(usize),
    /// At most this many bytes of tensor data a shard, each tensor counted
    /// padded to 32 bytes, the header not counted (`--split-max-size`).
    Bytes(u64),
}

/// How to split a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitOptions {
    pub limit: SplitLimit,
    /// The first shard holds the metadata only (`--no-tensor-first-split`).
    pub no_tensor_first_split: bool,
}

/// A size as llama-gguf-split reads `--split-max-size`: a positive whole
/// number followed by `M` (10^6 bytes) or `G` (10^9 bytes).
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| Error::InvalidArgument(format!("size '{s}': {why}"));
    let (digits, unit) = match s.as_bytes().last() {
        Some(b'M') => (&s[..s.len() - 1], 1_000_000u64),
        Some(b'G') => (&s[..s.len() - 1], 1_000_000_000u64),
        _ => return Err(bad("the unit must be M (megabytes) or G (gigabytes), as in 100M or 2G")),
    };
    let n: u64 = digits.parse().map_err(|_| bad("expected a whole number before the unit"))?;
    if n == 0 {
        return Err(bad("the size must be positive"));
    }
    n.checked_mul(unit).ok_or_else(|| bad("too large"))
}

/// Bytes a tensor takes in a shard's data section.
fn padded(t: &TensorInfo) -> u64 {
    t.size.next_multiple_of(ALIGN)
}

/// The tensors (indices into `input.tensors()`) of each shard a split would write.
pub fn plan_split(input: &GgufFile, opts: &SplitOptions) -> Result<Vec<Vec<usize>>> {
    let tensors = input.tensors();
    let n = tensors.len();
    if let SplitLimit::Tensors(0) = opts.limit {
        return Err(Error::InvalidArgument("at most 0 tensors a shard: the limit must be positive".into()));
    }
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    if opts.no_tensor_first_split {
        shards.push(Vec::new());
    }
    let mut size = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let next = size + padded(t);
        let new = match opts.limit {
            SplitLimit::Bytes(max) => next > max,
            SplitLimit::Tensors(k) => i > 0 && i < n && i % k == 0,
        };
        if new {
            if shards.last().is_some_and(Vec::is_empty) {
                return Err(Error::InvalidArgument(format!(
                    "tensor '{}' ({} bytes) alone exceeds the size limit: a shard would hold no tensor",
                    t.name, t.size
                )));
            }
            shards.push(Vec::new());
            size = padded(t);
        } else {
            size = next;
        }
        shards.last_mut().expect("a shard").push(i);
    }
    if shards.len() > u16::MAX as usize {
        return Err(Error::InvalidArgument(format!("{} shards: split.count holds at most 65535", shards.len())));
    }
    Ok(shards)
}

/// The refusal of a model llama-gguf-split would write wrongly.
fn check_alignment(input: &GgufFile) -> Result<()> {
    match input.get("general.alignment") {
        None | Some(Value::U32(32)) => Ok(()),
        Some(v) => Err(Error::InvalidArgument(format!(
            "general.alignment is {v}: llama-gguf-split writes 32-byte alignment whatever the file says \
             (its output would not load), so Pocket does not split or merge this file"
        ))),
    }
}

/// A header as ggml writes it: `kvs`, then `tensors` with their offsets in a
/// 32-byte aligned data section.
fn header<'a>(kvs: impl IntoIterator<Item = (&'a str, Value)>, tensors: &[&TensorInfo]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.kv(k, v);
    }
    w.version = 3;
    w.alignment = ALIGN;
    for t in tensors {
        // ggml_n_dims: trailing dimensions of 1 are not written (at least one is).
        let n_dims = t.dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        w.tensor(&t.name, t.ty, &t.dims[..n_dims]);
    }
    w.header()
}

/// Write `tensors`' data (each padded to 32 bytes) after `header` into `path`,
/// through `path.part` renamed once complete.
fn write_file(path: &Path, header: &[u8], input: &GgufFile, tensors: &[&TensorInfo]) -> Result<()> {
    let part = {
        let mut s = path.as_os_str().to_owned();
        s.push(".part");
        PathBuf::from(s)
    };
    let write = || -> Result<()> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&part)?);
        out.write_all(header)?;
        let zeros = [0u8; ALIGN as usize];
        for t in tensors {
            out.write_all(input.tensor_data(t))?;
            out.write_all(&zeros[..(padded(t) - t.size) as usize])?;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(())
    };
    match write() {
        Ok(()) => Ok(std::fs::rename(&part, path)?),
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

/// Split `input` into shards named `PREFIX-0000k-of-0000N.gguf`, as
/// `llama-gguf-split --split` does. `written(path, tensors)` is called as
/// each shard is complete. Returns the shards' paths.
pub fn split(
    input: &GgufFile,
    prefix: &str,
    opts: &SplitOptions,
    written: &mut dyn FnMut(&Path, usize),
) -> Result<Vec<PathBuf>> {
    check_alignment(input)?;
    let plan = plan_split(input, opts)?;
    let count = plan.len() as u64;
    let all = input.tensors();
    let total = i32::try_from(all.len())
        .map_err(|_| Error::InvalidArgument(format!("{} tensors: split.tensors.count holds an i32", all.len())))?;
    let mut paths = Vec::with_capacity(plan.len());
    for (no, idx) in plan.iter().enumerate() {
        let meta: Vec<(&str, Value)> = if no == 0 {
            input
                .metadata()
                .filter(|(k, _)| ![SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT].contains(k))
                .map(|(k, v)| (k, v.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let keys = [
            (SPLIT_NO, Value::U16(no as u16)),
            (SPLIT_TENSORS_COUNT, Value::I32(total)),
            (SPLIT_COUNT, Value::U16(count as u16)),
        ];
        let tensors: Vec<&TensorInfo> = idx.iter().map(|&i| &all[i]).collect();
        let head = header(meta.into_iter().chain(keys), &tensors);
        let path = PathBuf::from(shard_path(prefix, no as u64, count));
        write_file(&path, &head, input, &tensors)?;
        written(&path, tensors.len());
        paths.push(path);
    }
    Ok(paths)
}

/// Merge the split model whose first shard is `first` into one file `out`,
/// as `llama-gguf-split --merge` does (which refuses an `out` that exists).
pub fn merge(first: &Path, out: &Path) -> Result<()> {
    if out.exists() {
        return Err(Error::InvalidArgument(format!("{} exists: merge does not overwrite a file", out.display())));
    }
    // As llama-gguf-split: the first shard must say how many there are, and be named for it.
    let head = GgufFile::open_single(first)?;
    let count = match head.get_u64(SPLIT_COUNT)? {
        Some(c) if c >= 1 => c,
        Some(_) | None => {
            return Err(Error::InvalidArgument(format!(
                "{} is not the first shard of a split model (no split.count of at least 1)",
                first.display()
            )))
        }
    };
    if first.to_str().and_then(|p| shard_prefix(p, 0, count)).is_none() {
        return Err(Error::InvalidArgument(format!(
            "{}: the first shard's name must end in '{}'",
            first.display(),
            shard_path("", 0, count)
        )));
    }
    drop(head);
    let model = GgufFile::open(first)?;
    check_alignment(&model)?;
    let meta = model
        .metadata()
        .filter(|(k, _)| *k != SPLIT_COUNT)
        .map(|(k, v)| (k, v.clone()))
        .chain(std::iter::once((SPLIT_COUNT, Value::U16(0))));
    let tensors: Vec<&TensorInfo> = model.tensors().iter().collect();
    write_file(out, &header(meta, &tensors), &model, &tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_llama_gguf_split_reads_them() {
        assert_eq!(parse_size("100M").unwrap(), 100_000_000);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        for bad in ["", "100", "100K", "0M", "-1G", "1.5G", "M", "10 M"] {
            assert!(matches!(parse_size(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }
}
