//! Split models: the shards `llama-gguf-split` writes, read as one model.
//!
//! A split model is a set of GGUF files `PREFIX-00001-of-0000N.gguf` to
//! `PREFIX-0000N-of-0000N.gguf`. Each holds `split.no` (its place, from 0),
//! `split.count` (N) and `split.tensors.count` (the tensors of the whole
//! set); the first holds the model's metadata and each holds the tensor
//! index and data of its own tensors. The set is checked as a whole before
//! anything is mapped: every shard present once, all of the same split, the
//! tensors adding up, no tensor twice, each file valid on its own (a tensor
//! running past its file's end included). Whatever is wrong is
//! [`Error::Split`] naming the shard at fault.

use std::collections::HashMap;
use std::path::Path;

use super::parse::{self, Parsed};
use super::{GgufFile, Source};
use crate::error::{Error, Result, ShardProblem};

pub use super::split_write::{merge, parse_size, plan_split, split, SplitLimit, SplitOptions};

/// Key of a shard's place in its set, from 0 (`u16` as `llama-gguf-split` writes it).
pub const SPLIT_NO: &str = "split.no";
/// Key of the number of files of the set (`u16`).
pub const SPLIT_COUNT: &str = "split.count";
/// Key of the number of tensors of the whole set (`i32`).
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The name `llama-gguf-split` gives shard `no` (from 0) of `count`:
/// `PREFIX-0000k-of-0000N.gguf`, with k = `no + 1`.
pub fn shard_path(prefix: &str, no: u64, count: u64) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", no + 1, count)
}

/// The prefix of the path of shard `no` (from 0) of `count`, when the path
/// is named as [`shard_path`] names it (and the prefix is not empty).
pub fn shard_prefix(path: &str, no: u64, count: u64) -> Option<&str> {
    path.strip_suffix(&format!("-{:05}-of-{:05}.gguf", no + 1, count)).filter(|p| !p.is_empty())
}

/// How a descriptor range is named in errors and in [`super::Shard::name`].
pub fn fd_name(fd: i32, offset: u64, len: u64) -> String {
    format!("fd {fd} at {offset}+{len}")
}

/// An error of the shard `name`.
fn at(name: &str, problem: ShardProblem) -> Error {
    Error::Split { shard: name.to_string(), problem }
}

/// The file's own error, as the error of the shard `name`.
fn invalid(name: &str) -> impl FnOnce(Error) -> Error + '_ {
    move |e| at(name, ShardProblem::Invalid(Box::new(e)))
}

/// One file of a set, parsed.
struct Opened {
    name: String,
    source: Source,
    parsed: Parsed,
}

impl Opened {
    fn new(name: String, source: Source) -> Result<Opened> {
        let parsed = parse::parse(source.bytes())?;
        Ok(Opened { name, source, parsed })
    }

    /// An unsigned integer key (of any width) of this file.
    fn key(&self, key: &str) -> Result<Option<u64>> {
        let Some((_, v)) = self.parsed.metadata.iter().find(|(k, _)| k == key) else { return Ok(None) };
        v.as_u64().map(Some).ok_or_else(|| Error::WrongValueType {
            key: key.to_string(),
            expected: "unsigned integer",
            found: v.value_type().name(),
        })
    }

    /// `(split.no, split.count)`, when the file has both.
    fn place(&self) -> Result<Option<(u64, u64)>> {
        Ok(match (self.key(SPLIT_NO)?, self.key(SPLIT_COUNT)?) {
            (Some(no), Some(count)) => Some((no, count)),
            _ => None,
        })
    }
}

/// The other shards' paths of the split model whose first shard is
/// `first` (`None` for a file that is not split).
fn siblings(path: &Path, first: &Opened) -> Result<Option<Vec<String>>> {
    let count = first.key(SPLIT_COUNT)?.unwrap_or(0);
    if count <= 1 {
        return Ok(None);
    }
    let name = &first.name;
    let no = first.key(SPLIT_NO)?.ok_or_else(|| invalid(name)(Error::MissingKey(SPLIT_NO.into())))?;
    if no != 0 {
        return Err(at(name, ShardProblem::NotFirst { no, count }));
    }
    let expected = shard_path("", 0, count);
    let prefix = path
        .to_str()
        .and_then(|p| shard_prefix(p, 0, count))
        .ok_or_else(|| at(name, ShardProblem::BadName { expected }))?;
    Ok(Some((1..count).map(|k| shard_path(prefix, k, count)).collect()))
}

/// A file by path, or the split model whose first shard it is (see [`GgufFile::open`]).
pub(super) fn open(path: &Path) -> Result<GgufFile> {
    let first = Opened::new(path.display().to_string(), Source::open(path)?)?;
    let Some(others) = siblings(path, &first)? else { return join(vec![first], true) };
    let count = others.len() as u64 + 1;
    let mut parts = vec![first];
    for (k, p) in (1..).zip(others) {
        let source = match Source::open(Path::new(&p)) {
            Ok(s) => s,
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(at(&p, ShardProblem::Missing { no: k, count }))
            }
            Err(e) => return Err(invalid(&p)(e)),
        };
        parts.push(Opened::new(p.clone(), source).map_err(invalid(&p))?);
    }
    join(parts, true)
}

/// The paths of the files of the model at `path`: itself, and when it is
/// the first shard of a split model, the other shards' paths after it
/// (whether they exist is not checked). Reads only `path`'s header.
pub fn shard_paths(path: &Path) -> Result<Vec<std::path::PathBuf>> {
    let first = Opened::new(path.display().to_string(), Source::open(path)?)?;
    let others = siblings(path, &first)?.unwrap_or_default();
    Ok(std::iter::once(path.to_path_buf()).chain(others.into_iter().map(Into::into)).collect())
}

/// A split model from named sources (see [`GgufFile::from_sources`]).
pub(super) fn from_sources(sources: Vec<(String, Source)>) -> Result<GgufFile> {
    let n = sources.len();
    let parts = sources
        .into_iter()
        .map(|(name, source)| {
            let opened = Opened::new(name.clone(), source);
            if n == 1 {
                opened
            } else {
                opened.map_err(invalid(&name))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    join(parts, false)
}

/// A split model from its shards' paths, in any order (see [`GgufFile::open_parts`]).
pub(super) fn open_parts<P: AsRef<Path>>(paths: &[P]) -> Result<GgufFile> {
    let parts = paths
        .iter()
        .map(|p| {
            let name = p.as_ref().display().to_string();
            let opened = Source::open(p.as_ref()).and_then(|s| Opened::new(name.clone(), s));
            if paths.len() == 1 {
                opened
            } else {
                opened.map_err(invalid(&name))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    join(parts, false)
}

/// A split model from its shards' descriptor ranges, in any order (see [`GgufFile::open_fd_parts`]).
#[cfg(unix)]
pub(super) fn open_fd_parts(ranges: &[(std::os::fd::RawFd, u64, u64)]) -> Result<GgufFile> {
    let parts = ranges
        .iter()
        .map(|&(fd, offset, len)| {
            let name = fd_name(fd, offset, len);
            let opened = Source::open_fd(fd, offset, len).and_then(|s| Opened::new(name.clone(), s));
            if ranges.len() == 1 {
                opened
            } else {
                opened.map_err(invalid(&name))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    join(parts, false)
}

/// Check a set of parsed files and join them into one model. `in_order`:
/// the files were found by name, so each one's `split.no` must be its place;
/// otherwise they may come in any order.
fn join(mut parts: Vec<Opened>, in_order: bool) -> Result<GgufFile> {
    if parts.is_empty() {
        return Err(Error::InvalidArgument("no model files given".into()));
    }
    let single = parts.len() == 1 && parts[0].key(SPLIT_COUNT)?.unwrap_or(0) <= 1;
    if !single {
        parts = check_set(parts, in_order)?;
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, p) in parts.iter().enumerate() {
        for t in &p.parsed.tensors {
            if seen.insert(&t.name, i).is_some() {
                return Err(invalid(&p.name)(Error::DuplicateTensor(t.name.clone())));
            }
        }
    }
    if !single {
        if let Some(expected) = parts[0].key(SPLIT_TENSORS_COUNT).map_err(invalid(&parts[0].name))? {
            let found = seen.len() as u64;
            if found != expected {
                return Err(at(&parts[0].name, ShardProblem::TensorTotal { found, expected }));
            }
        }
    }
    let mut sources = Vec::with_capacity(parts.len());
    let mut files = Vec::with_capacity(parts.len());
    for p in parts {
        files.push((p.name, p.source.bytes().len() as u64, p.parsed));
        sources.push(p.source);
    }
    let (source, ats) = Source::join(sources)?;
    let files = files.into_iter().zip(ats).map(|((name, len, parsed), at)| (name, at, len, parsed)).collect();
    Ok(GgufFile::assemble(source, files))
}

/// The files of a split set in `split.no` order, once every one is there
/// exactly once and all agree on the set.
fn check_set(parts: Vec<Opened>, in_order: bool) -> Result<Vec<Opened>> {
    let mut places = Vec::with_capacity(parts.len());
    for p in &parts {
        let place = p.place().map_err(invalid(&p.name))?;
        places.push(place.ok_or_else(|| at(&p.name, ShardProblem::NotAShard))?);
    }
    // The set is the one its first shard (else the first file given) describes.
    let lead = places.iter().position(|&(no, _)| no == 0).unwrap_or(0);
    let count = places[lead].1;
    let tensors = parts[lead].key(SPLIT_TENSORS_COUNT).map_err(invalid(&parts[lead].name))?;
    for (i, (p, &(no, c))) in parts.iter().zip(&places).enumerate() {
        if c != count {
            return Err(at(&p.name, ShardProblem::CountMismatch { found: c, expected: count }));
        }
        if in_order && no != i as u64 {
            return Err(at(&p.name, ShardProblem::WrongIndex { found: no, expected: i as u64 }));
        }
        if no >= count {
            return Err(at(&p.name, ShardProblem::Extra { no, count }));
        }
        let t = p.key(SPLIT_TENSORS_COUNT).map_err(invalid(&p.name))?;
        if let (Some(found), Some(expected)) = (t, tensors) {
            if found != expected {
                return Err(at(&p.name, ShardProblem::TensorCountMismatch { found, expected }));
            }
        }
    }
    let mut sorted: Vec<(u64, Opened)> = places.into_iter().map(|(no, _)| no).zip(parts).collect();
    sorted.sort_by_key(|(no, _)| *no);
    for w in sorted.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(at(&w[1].1.name, ShardProblem::Duplicate { no: w[0].0, other: w[0].1.name.clone() }));
        }
    }
    // Distinct places below `count`: the first place not filled is missing.
    if let Some(no) = (0..count)
        .zip(sorted.iter().map(|(no, _)| *no).chain(std::iter::once(u64::MAX)))
        .find(|(k, no)| k != no)
        .map(|(k, _)| k)
    {
        // Named as llama-gguf-split would have named it, when the first shard's name says how.
        let prefix = sorted.first().filter(|(n, _)| *n == 0).and_then(|(_, p)| shard_prefix(&p.name, 0, count));
        let name = match prefix {
            Some(prefix) => format!("{} (not given)", shard_path(prefix, no, count)),
            None => format!("{} of {count} (not given)", no + 1),
        };
        return Err(at(&name, ShardProblem::Missing { no, count }));
    }
    let out: Vec<Opened> = sorted.into_iter().map(|(_, p)| p).collect();
    Ok(out)
}
