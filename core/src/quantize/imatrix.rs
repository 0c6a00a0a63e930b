//! The importance matrix: for every weight tensor (every expert of a stack),
//! the sum over the tokens it met of each input column's square, and how
//! many tokens that was. Divided, it is the per-column mean square
//! activation that the quantisers weight their error by.
//!
//! Files are llama.cpp's: the GGUF form `llama-imatrix` writes today
//! (`general.type = "imatrix"`, `imatrix.datasets`, `imatrix.chunk_count`,
//! `imatrix.chunk_size`; per tensor `NAME.in_sum2` = F32 `[cols, n_mat]` and
//! `NAME.counts` = F32 `[1, n_mat]`) is read and written; the legacy `.dat`
//! form (per tensor the means times the call count) is read. Both are
//! untrusted input: every length is checked before it is used.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::gguf::{Array, GgufFile, GgufWriter, StringArray, Value};
use crate::model::Observer;
use crate::quant::GgmlType;

/// One tensor's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Input columns of each matrix.
    pub cols: usize,
    /// `[n_mat][cols]`: sums of squares (legacy files: means times `counts[0]`).
    pub sums: Vec<f32>,
    /// Tokens summed over, per matrix (legacy files: one call count).
    pub counts: Vec<u64>,
}

impl Entry {
    /// Matrices in the tensor (experts of a stack; 1 for a plain matrix).
    pub fn n_mat(&self) -> usize {
        self.sums.len() / self.cols.max(1)
    }
}

/// An importance matrix, as a file holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    /// By weight tensor name.
    pub entries: BTreeMap<String, Entry>,
    /// The texts it was computed on.
    pub datasets: Vec<String>,
    /// Chunks of `chunk_size` tokens evaluated.
    pub chunk_count: u32,
    pub chunk_size: u32,
    /// Read from a legacy `.dat` file.
    pub legacy: bool,
}

fn bad(why: impl Into<String>) -> Error {
    Error::Imatrix(why.into())
}

impl Imatrix {
    /// Read a GGUF or legacy `.dat` importance matrix.
    pub fn read(path: impl AsRef<Path>) -> Result<Imatrix> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)?;
        if bytes.starts_with(b"GGUF") {
            Imatrix::from_gguf(&GgufFile::from_bytes(bytes)?)
        } else {
            Imatrix::from_legacy(&bytes)
        }
    }

    /// The statistics of a GGUF imatrix file.
    pub fn from_gguf(f: &GgufFile) -> Result<Imatrix> {
        match f.get_str("general.type")? {
            Some("imatrix") | None => {}
            Some(other) => return Err(bad(format!("a GGUF of type '{other}', not an importance matrix"))),
        }
        let mut m = Imatrix {
            chunk_count: f.get_u32("imatrix.chunk_count")?.unwrap_or(0),
            chunk_size: f.get_u32("imatrix.chunk_size")?.unwrap_or(0),
            ..Imatrix::default()
        };
        if let Some(Array::String(d)) = f.get_array("imatrix.datasets")? {
            m.datasets = d.iter().map(str::to_string).collect();
        }
        let floats = |name: &str| -> Result<Option<(Vec<f32>, [u64; 4])>> {
            let Some(t) = f.tensor(name) else { return Ok(None) };
            if t.ty != GgmlType::F32 {
                return Err(bad(format!("{name} is {}, not F32", t.ty)));
            }
            let data = f.tensor_data(t);
            Ok(Some((data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(), t.dims)))
        };
        for t in f.tensors() {
            let Some(name) = t.name.strip_suffix(".in_sum2") else { continue };
            let (sums, dims) = floats(&t.name)?.unwrap_or_default();
            let Some((counts, _)) = floats(&format!("{name}.counts"))? else {
                return Err(bad(format!("{name} has sums but no counts")));
            };
            let (cols, n_mat) = (dims[0] as usize, (dims[1] * dims[2] * dims[3]) as usize);
            if cols == 0 || counts.len() != n_mat {
                return Err(bad(format!("{name}: {} counts for {n_mat} matrices", counts.len())));
            }
            if let Some(c) = counts.iter().chain(&sums).find(|c| !(c.is_finite() && **c >= 0.0)) {
                return Err(bad(format!("{name} holds {c}")));
            }
            let counts = counts.iter().map(|&c| c.round() as u64).collect();
            m.entries.insert(name.to_string(), Entry { cols, sums, counts });
        }
        if f.tensors()
            .iter()
            .any(|t| t.name.ends_with(".counts") && !m.entries.contains_key(&t.name[..t.name.len() - 7]))
        {
            return Err(bad("counts without sums"));
        }
        if m.entries.is_empty() {
            return Err(bad("no entries"));
        }
        Ok(m)
    }

    /// The statistics of a legacy `.dat` file: `i32` entry count; per entry
    /// an `i32`-length name, `i32` call count, `i32` value count and the
    /// values; optionally the chunk count and an `i32`-length dataset name.
    pub fn from_legacy(bytes: &[u8]) -> Result<Imatrix> {
        let mut r = Reader { bytes, at: 0 };
        let n = r.i32("entry count")?;
        if n < 1 {
            return Err(bad("not a GGUF and not a legacy imatrix (no entries)"));
        }
        let mut m = Imatrix { legacy: true, ..Imatrix::default() };
        for _ in 0..n {
            let len = r.len("name length")?;
            let name = std::str::from_utf8(r.take(len, "name")?).map_err(|_| bad("a name is not UTF-8"))?.to_string();
            let ncall = r.i32("call count")?;
            let nval = r.len("value count")?;
            if nval == 0 || ncall < 0 {
                return Err(bad(format!("{name}: {nval} values, {ncall} calls")));
            }
            let sums: Vec<f32> = r
                .take(nval.checked_mul(4).ok_or_else(|| bad("value count"))?, "values")?
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if let Some(v) = sums.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
                return Err(bad(format!("{name} holds {v}")));
            }
            // The number of matrices is not in the file: the quantiser learns
            // it from the tensor (values = n_mat x cols).
            m.entries.insert(name, Entry { cols: nval, sums, counts: vec![ncall as u64] });
        }
        if r.at < bytes.len() {
            m.chunk_count = r.i32("chunk count")?.max(0) as u32;
            if r.at < bytes.len() {
                let len = r.len("dataset length")?;
                m.datasets.push(String::from_utf8_lossy(r.take(len, "dataset")?).into_owned());
            }
        }
        Ok(m)
    }

    /// The per-column weights llama-quantize gives tensor `name`: `[n_mat][cols]`
    /// mean squares (a matrix that met no token weighs every column 1).
    pub fn weights(&self, name: &str) -> Option<Vec<f32>> {
        let e = self.entries.get(name)?;
        if self.legacy {
            let ncall = e.counts[0];
            return Some(if ncall > 0 { e.sums.iter().map(|s| s / ncall as f32).collect() } else { e.sums.clone() });
        }
        let mut w = Vec::with_capacity(e.sums.len());
        for (sums, &count) in e.sums.chunks_exact(e.cols).zip(&e.counts) {
            if count > 0 {
                w.extend(sums.iter().map(|s| s / count as f32));
            } else {
                w.extend(std::iter::repeat_n(1.0, e.cols));
            }
        }
        Some(w)
    }

    /// This matrix as the bytes of a GGUF file, as llama-imatrix writes it
    /// (tensors sorted by name, sums then counts).
    pub fn to_gguf_bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new();
        w.kv("general.type", Value::String("imatrix".into()));
        let datasets: StringArray = self.datasets.iter().map(String::as_str).collect();
        w.kv("imatrix.datasets", Value::Array(Array::String(datasets)));
        w.kv("imatrix.chunk_count", Value::U32(self.chunk_count));
        w.kv("imatrix.chunk_size", Value::U32(self.chunk_size));
        for (name, e) in &self.entries {
            let n_mat = e.counts.len() as u64;
            w.tensor(&format!("{name}.in_sum2"), GgmlType::F32, &[e.cols as u64, n_mat]);
            w.tensor(&format!("{name}.counts"), GgmlType::F32, &[1, n_mat]);
        }
        let entries: Vec<&Entry> = self.entries.values().collect();
        w.to_bytes(|i, buf| {
            let e = entries[i / 2];
            let counts: Vec<f32>;
            let values = if i % 2 == 0 {
                &e.sums
            } else {
                counts = e.counts.iter().map(|&c| c as f32).collect();
                &counts
            };
            for (b, v) in buf.chunks_exact_mut(4).zip(values) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        })
    }

    /// Write this matrix as a GGUF file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        Ok(std::fs::write(path, self.to_gguf_bytes())?)
    }
}

/// Bounds-checked little-endian reads.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| bad(format!("truncated at the {what} (byte {})", self.at)))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i32(&mut self, what: &str) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn len(&mut self, what: &str) -> Result<usize> {
        let v = self.i32(what)?;
        usize::try_from(v).map_err(|_| bad(format!("negative {what} {v}")))
    }
}

/// Collects an importance matrix while the model evaluates text: an
/// [`Observer`] for [`crate::model::Model::forward_observed`]. As
/// llama-imatrix does, it keeps the layers' weights (`blk.*`): not the output
/// head, nor the token embedding (a lookup, not a product).
#[derive(Default)]
pub struct Collector {
    stats: Mutex<BTreeMap<String, Sums>>,
}

struct Sums {
    cols: usize,
    sums: Vec<f64>,
    counts: Vec<u64>,
}

impl Observer for Collector {
    fn input(&self, name: &str, mat: usize, n_mat: usize, cols: usize, x: &[f32], rows: Option<&[usize]>) {
        if !name.starts_with("blk.") || cols == 0 {
            return;
        }
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let s = stats.entry(name.to_string()).or_insert_with(|| Sums {
            cols,
            sums: vec![0.0; n_mat * cols],
            counts: vec![0; n_mat],
        });
        if s.cols != cols || s.counts.len() != n_mat || mat >= n_mat {
            return; // one name, one shape: a model never multiplies a tensor two ways
        }
        let acc = &mut s.sums[mat * cols..(mat + 1) * cols];
        let mut add = |row: &[f32]| {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += (v * v) as f64;
            }
        };
        match rows {
            Some(rows) => rows.iter().for_each(|&r| add(&x[r * cols..(r + 1) * cols])),
            None => x.chunks_exact(cols).for_each(add),
        }
        s.counts[mat] += rows.map_or(x.len() / cols, <[usize]>::len) as u64;
    }
}

impl Collector {
    pub fn new() -> Collector {
        Collector::default()
    }

    /// The statistics so far, as a file would hold them.
    pub fn imatrix(&self, datasets: Vec<String>, chunk_count: u32, chunk_size: u32) -> Imatrix {
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let entries = stats
            .iter()
            .map(|(name, s)| {
                let sums = s.sums.iter().map(|&v| v as f32).collect();
                (name.clone(), Entry { cols: s.cols, sums, counts: s.counts.clone() })
            })
            .collect();
        Imatrix { entries, datasets, chunk_count, chunk_size, legacy: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut m =
            Imatrix { datasets: vec!["wiki.txt".into()], chunk_count: 3, chunk_size: 128, ..Default::default() };
        m.entries
            .insert("blk.0.attn_q.weight".into(), Entry { cols: 4, sums: vec![1.0, 2.0, 3.0, 4.0], counts: vec![2] });
        m.entries.insert(
            "blk.0.ffn_up_exps.weight".into(),
            Entry { cols: 2, sums: vec![4.0, 8.0, 0.0, 0.0, 9.0, 3.0], counts: vec![4, 0, 3] },
        );
        m
    }

    #[test]
    fn gguf_round_trip_and_weights() {
        let m = sample();
        let bytes = m.to_gguf_bytes();
        let back = Imatrix::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.weights("blk.0.attn_q.weight").unwrap(), [0.5, 1.0, 1.5, 2.0]);
        // A matrix that met no token weighs every column 1.
        assert_eq!(back.weights("blk.0.ffn_up_exps.weight").unwrap(), [1.0, 2.0, 1.0, 1.0, 3.0, 1.0]);
        assert!(back.weights("blk.1.attn_q.weight").is_none());
    }

    fn legacy_bytes(entries: &[(&str, i32, &[f32])], tail: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, vals) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((vals.len() as i32).to_le_bytes());
            vals.iter().for_each(|v| b.extend(v.to_le_bytes()));
        }
        if let Some((chunks, data)) = tail {
            b.extend(chunks.to_le_bytes());
            b.extend((data.len() as i32).to_le_bytes());
            b.extend(data.as_bytes());
        }
        b
    }

    #[test]
    fn legacy_files_are_read_and_checked() {
        let b = legacy_bytes(&[("blk.0.ffn_down.weight", 10, &[20.0, 5.0, 0.0])], Some((10, "train.txt")));
        let m = Imatrix::from_legacy(&b).unwrap();
        assert!(m.legacy);
        assert_eq!((m.chunk_count, &m.datasets[..]), (10, &["train.txt".to_string()][..]));
        assert_eq!(m.weights("blk.0.ffn_down.weight").unwrap(), [2.0, 0.5, 0.0]);
        // Without the optional tail.
        let b = legacy_bytes(&[("a", 1, &[1.0])], None);
        assert_eq!(Imatrix::from_legacy(&b).unwrap().entries.len(), 1);
        // Every truncation is an error, never a panic; so are nonsense counts.
        let full = legacy_bytes(&[("blk.0.x", 2, &[1.0, 2.0]), ("blk.1.x", 2, &[1.0, 2.0])], None);
        for cut in 0..full.len() {
            assert!(Imatrix::from_legacy(&full[..cut]).is_err(), "cut at {cut}");
        }
        assert!(Imatrix::from_legacy(&legacy_bytes(&[("a", 1, &[f32::NAN])], None)).is_err());
        let mut huge = legacy_bytes(&[("a", 1, &[1.0])], None);
        huge[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(Imatrix::from_legacy(&huge).is_err());
    }

    #[test]
    fn the_collector_sums_squares_per_matrix_and_counts_tokens() {
        let c = Collector::new();
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 3 rows of 2
        c.input("blk.0.attn_k.weight", 0, 1, 2, &x, None);
        c.input("blk.0.ffn_gate_exps.weight", 1, 3, 2, &x, Some(&[0, 2]));
        c.input("blk.0.ffn_gate_exps.weight", 1, 3, 2, &x, Some(&[1]));
        c.input("output.weight", 0, 1, 2, &x, None); // not collected, as llama-imatrix
        let m = c.imatrix(vec!["t".into()], 1, 3);
        assert_eq!(m.entries.len(), 2);
        let k = &m.entries["blk.0.attn_k.weight"];
        assert_eq!((&k.sums[..], &k.counts[..]), (&[35.0, 56.0][..], &[3][..]));
        let e = &m.entries["blk.0.ffn_gate_exps.weight"];
        assert_eq!(&e.counts[..], &[0, 3, 0]);
        assert_eq!(&e.sums[2..4], &[35.0, 56.0]);
        assert_eq!(m.weights("blk.0.ffn_gate_exps.weight").unwrap()[..4], [1.0, 1.0, 35.0 / 3.0, 56.0 / 3.0]);
    }
}
