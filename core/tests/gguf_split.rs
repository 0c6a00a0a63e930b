//! Split models (`llama-gguf-split` shards) read as one model: the fixtures'
//! (and Gemma 3 270M's) shards give the single file's logits bit for bit,
//! opened from the first shard's path, from a list of paths in any order,
//! from descriptor ranges, and under a memory budget (the expert cache);
//! the identity covers every shard; `quantize` and the imatrix collector
//! read split input; split -> merge is byte-identical; every malformed set
//! is `Error::Split` naming the shard; and, when `POCKET_LLAMA_GGUF_SPLIT`
//! names a built `llama-gguf-split`, `split`/`merge` write its bytes.

mod common;

use std::path::{Path, PathBuf};

use pocket_core::gguf::split::{self, SplitLimit, SplitOptions};
use pocket_core::gguf::{GgufFile, GgufWriter, Value};
use pocket_core::model::{KvType, LoadOptions, Logits, Model, ModelIdentity};
use pocket_core::quantize::file::{quantize_file, Options};
use pocket_core::quantize::imatrix::Collector;
use pocket_core::quantize::mix::FileType;
use pocket_core::threads::ThreadPool;
use pocket_core::{Error, ShardProblem};

/// The fixture models of every architecture the engine runs.
const ARCHES: &[&str] = &["qwen3moe-tiny", "qwen35moe-tiny", "gemma3-tiny", "mixtral-tiny"];

fn fixture(name: &str) -> PathBuf {
    common::fixtures().join("models").join(name)
}

/// A fresh scratch folder for one test.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pocket-split-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tensors(n: usize) -> SplitOptions {
    SplitOptions { limit: SplitLimit::Tensors(n), no_tensor_first_split: false }
}

/// Split `file` into `PREFIX-0000k-of-0000N.gguf` files in `dir`.
fn split_file(file: &Path, dir: &Path, prefix: &str, opts: &SplitOptions) -> Vec<PathBuf> {
    let g = GgufFile::open(file).unwrap();
    split::split(&g, dir.join(prefix).to_str().unwrap(), opts, &mut |_, _| {}).unwrap()
}

/// Split into `n` shards or so (by tensor count).
fn split_in(file: &Path, dir: &Path, n: usize) -> Vec<PathBuf> {
    let count = GgufFile::open(file).unwrap().tensors().len();
    split_file(file, dir, "model", &tensors(count.div_ceil(n)))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Batch and token-by-token logits of a fixed prompt, as bits.
fn logits(model: &Model) -> (Vec<u32>, Vec<u32>) {
    let tokens: Vec<u32> = (0..12).map(|i| (7 + 131 * i) % model.n_vocab() as u32).collect();
    let (batch, decode) = common::batch_and_decode_logits(model, &ThreadPool::new(2), &tokens);
    (bits(&batch), bits(&decode))
}

fn manifest_files() -> Vec<String> {
    let m = common::manifest();
    let mut out = Vec::new();
    for model in m["models"].as_array().unwrap() {
        if ARCHES.contains(&model["name"].as_str().unwrap()) {
            for f in model["files"].as_array().unwrap() {
                out.push(f["gguf"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(out.len() >= 8, "{out:?}");
    out
}

#[test]
fn the_fixtures_shards_give_the_single_file_s_logits_bit_for_bit() {
    let dir = scratch("fixtures");
    for (i, file) in manifest_files().iter().enumerate() {
        let single = common::fixtures().join(file);
        let sub = dir.join(i.to_string());
        std::fs::create_dir_all(&sub).unwrap();
        let shards = split_in(&single, &sub, 3);
        assert_eq!(shards.len(), 3, "{file}");
        let one = Model::load(&single).unwrap();
        let split = Model::load(&shards[0]).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(split.file().shards().len(), 3);
        assert_eq!(split.file().tensors().len(), one.file().tensors().len());
        let want = logits(&one);
        assert_eq!(logits(&split), want, "{file}: the shards' logits differ from the single file's");
        // The summary is the model's, whatever its files.
        let (a, b) = (one.summary(), split.summary());
        assert_eq!(
            (a.parameter_count, &a.tensor_types, &a.architecture),
            (b.parameter_count, &b.tensor_types, &b.architecture)
        );
        assert_eq!(b.file_bytes, shards.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum::<u64>());
        eprintln!("{file}: 3 shards, {} logits equal", want.0.len());
        std::fs::remove_dir_all(&sub).unwrap();
    }
}

#[test]
fn a_split_moe_model_under_a_memory_budget_reads_its_experts_from_every_shard() {
    let dir = scratch("budget");
    for name in ["qwen3moe-tiny-Q4_K_M.gguf", "qwen35moe-tiny-Q4_K_M.gguf"] {
        let single = fixture(name);
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).unwrap();
        // Small shards: the expert stacks of one layer land in different files.
        let shards = split_in(&single, &sub, 5);
        let one = Model::load(&single).unwrap();
        let split = Model::load(&shards[0]).unwrap();
        let (p1, p2) = (one.memory_plan(0), split.memory_plan(0));
        assert_eq!(
            (p1.expert_bytes, p1.slot_bytes, p1.session_bytes),
            (p2.expert_bytes, p2.slot_bytes, p2.session_bytes)
        );
        let headers: u64 = split.file().shards().iter().map(|s| s.data_offset).sum();
        assert_eq!(
            p2.resident_bytes - headers,
            p1.resident_bytes - one.file().data_offset(),
            "{name}: resident weights"
        );
        assert_eq!(p2.file_bytes, split.file().file_bytes());
        // A cache of a few slots: experts are evicted and read again, from every shard.
        let budget = p1.minimum_budget_bytes.max(p2.minimum_budget_bytes) + 3 * p1.slot_bytes;
        let opts = LoadOptions { memory_budget: budget, ..Default::default() };
        let want = logits(&Model::load_with(&single, &opts).unwrap());
        assert_eq!(want, logits(&one), "{name}: the budget changes nothing");
        let budgeted = Model::load_with(&shards[0], &opts).unwrap();
        assert_eq!(budgeted.memory_budget(), budget);
        assert_eq!(logits(&budgeted), want, "{name}: split under a budget");
    }
}

#[cfg(unix)]
#[test]
fn parts_in_any_order_paths_or_descriptors_load_the_same_model() {
    use std::os::fd::AsRawFd;
    let dir = scratch("parts");
    let single = fixture("qwen3moe-tiny-Q4_0.gguf");
    let shards = split_in(&single, &dir, 4);
    let first = Model::load(&shards[0]).unwrap();
    let want = logits(&first);
    let mut shuffled = shards.clone();
    shuffled.reverse();
    shuffled.swap(0, 1);
    let g = GgufFile::open_parts(&shuffled).unwrap();
    assert_eq!(g.shards().iter().map(|s| PathBuf::from(&s.name)).collect::<Vec<_>>(), shards, "in split.no order");
    let parts = Model::from_gguf(g).unwrap();
    assert_eq!(parts.identity(), first.identity(), "the order given does not change the identity");
    assert_eq!(logits(&parts), want);

    // Descriptor ranges: each shard inside a bigger file at an unaligned offset, as assets of an APK.
    let mut ranges = Vec::new();
    let mut files = Vec::new();
    for (i, s) in shuffled.iter().enumerate() {
        let body = std::fs::read(s).unwrap();
        let pad = 4097 + 1000 * i;
        let mut bytes = vec![0xAB; pad];
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&[0xCD; 333]);
        let p = dir.join(format!("pack{i}.bin"));
        std::fs::write(&p, &bytes).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        ranges.push((f.as_raw_fd(), pad as u64, body.len() as u64));
        files.push(f);
    }
    let g = GgufFile::open_fd_parts(&ranges).unwrap();
    drop(files); // the descriptors were duplicated
    let fds = Model::from_gguf(g).unwrap();
    assert_eq!(fds.identity(), first.identity());
    assert_eq!(logits(&fds), want);
    // And under a budget: the expert cache reads each shard's range of its pack.
    let budget = first.memory_plan(0).minimum_budget_bytes + 4 * first.memory_plan(0).slot_bytes;
    let files: Vec<_> =
        (0..ranges.len()).map(|i| std::fs::File::open(dir.join(format!("pack{i}.bin"))).unwrap()).collect();
    let ranges: Vec<_> = files.iter().zip(&ranges).map(|(f, r)| (f.as_raw_fd(), r.1, r.2)).collect();
    let g = GgufFile::open_fd_parts(&ranges).unwrap();
    let budgeted = Model::from_gguf_with(g, &LoadOptions { memory_budget: budget, ..Default::default() }).unwrap();
    assert_eq!(logits(&budgeted), want);
}

#[test]
fn the_identity_covers_every_shard() {
    use pocket_core::session::{Session, SessionOptions};
    let dir = scratch("identity");
    let single = fixture("gemma3-tiny-Q8_0.gguf");
    let shards = split_in(&single, &dir, 3);
    let one = ModelIdentity::of(&GgufFile::open(&single).unwrap());
    let model = std::sync::Arc::new(Model::load(&shards[0]).unwrap());
    let split = *model.identity();
    assert_ne!(one, split);
    let sizes: Vec<u64> = shards.iter().map(|p| std::fs::metadata(p).unwrap().len()).collect();
    assert_eq!(split.file_bytes, sizes.iter().sum::<u64>());
    // A snapshot of a session on the shards.
    let mut snap = Vec::new();
    Session::new(model.clone(), SessionOptions::default()).unwrap().write_snapshot(&mut snap).unwrap();
    let restore = |m: &std::sync::Arc<Model>| {
        Session::restore_from(m.clone(), &mut &snap[..], snap.len() as u64, SessionOptions::default()).map(|_| ())
    };
    restore(&model).unwrap();
    drop(model);
    // A change in the last shard's header alone (one metadata pair more) changes the identity.
    let last = GgufFile::open_single(&shards[2]).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in last.metadata() {
        w.kv(k, v.clone());
    }
    w.kv("general.note", Value::String("x".into()));
    for t in last.tensors() {
        w.tensor(&t.name, t.ty, t.shape());
    }
    let bytes = w.to_bytes(|i, out| out.copy_from_slice(last.tensor_data(&last.tensors()[i])));
    drop(last);
    let tmp = dir.join("new.gguf");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, &shards[2]).unwrap();
    let changed = std::sync::Arc::new(Model::load(&shards[0]).unwrap());
    assert_ne!(*changed.identity(), split, "the third shard's header is part of the identity");
    assert_eq!(changed.identity().file_bytes, changed.file().file_bytes());
    // ... so the snapshot refuses the changed set.
    let e = restore(&changed).unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
}

#[test]
fn split_then_merge_is_byte_identical() {
    let dir = scratch("roundtrip");
    for (name, opts) in [
        ("qwen35moe-tiny-Q4_K_M.gguf", tensors(20)),
        ("gemma3-tiny-F32.gguf", SplitOptions { limit: SplitLimit::Bytes(3_000_000), no_tensor_first_split: false }),
        ("mixtral-tiny-Q8_0.gguf", SplitOptions { limit: SplitLimit::Tensors(25), no_tensor_first_split: true }),
    ] {
        let x = fixture(name);
        let a = split_file(&x, &dir, "a", &opts);
        assert!(a.len() >= 2, "{name}: {} shards", a.len());
        let y = dir.join("y.gguf");
        split::merge(&a[0], &y).unwrap();
        // The merged file is the model: the same tensors, bytes and metadata (split.count now 0).
        let (gx, gy) = (GgufFile::open(&x).unwrap(), GgufFile::open(&y).unwrap());
        assert!(!gy.is_split());
        assert_eq!(gy.get_u64("split.count").unwrap(), Some(0));
        let meta = |g: &GgufFile| {
            g.metadata()
                .filter(|(k, _)| !k.starts_with("split."))
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(meta(&gx), meta(&gy), "{name}");
        for (tx, ty) in gx.tensors().iter().zip(gy.tensors()) {
            assert_eq!((&tx.name, tx.ty, tx.dims), (&ty.name, ty.ty, ty.dims));
            assert_eq!(gx.tensor_data(tx), gy.tensor_data(ty), "{name} {}", tx.name);
        }
        // Split again: the same shards; merged again: the same file.
        let b = split_file(&y, &dir, "b", &opts);
        assert_eq!(a.len(), b.len());
        for (p, q) in a.iter().zip(&b) {
            assert!(
                std::fs::read(p).unwrap() == std::fs::read(q).unwrap(),
                "{name}: {} and {}",
                p.display(),
                q.display()
            );
        }
        let z = dir.join("z.gguf");
        split::merge(&b[0], &z).unwrap();
        assert!(std::fs::read(&y).unwrap() == std::fs::read(&z).unwrap(), "{name}: merge(split(merge)) differs");
        // merge does not overwrite.
        assert!(matches!(split::merge(&b[0], &z), Err(Error::InvalidArgument(_))));
        for p in a.iter().chain(&b).chain([&y, &z]) {
            std::fs::remove_file(p).unwrap();
        }
    }
}

#[test]
fn split_plans_as_llama_gguf_split_does() {
    let g = GgufFile::open(fixture("gemma3-tiny-F32.gguf")).unwrap();
    let n = g.tensors().len();
    let plan = split::plan_split(&g, &tensors(10)).unwrap();
    assert_eq!(plan.len(), n.div_ceil(10));
    assert!(plan.iter().all(|s| s.len() <= 10));
    let first = SplitOptions { limit: SplitLimit::Tensors(10), no_tensor_first_split: true };
    let plan = split::plan_split(&g, &first).unwrap();
    assert!(plan[0].is_empty() && plan.len() == n.div_ceil(10) + 1);
    // By size: each shard's tensors, padded to 32 bytes, within the limit.
    let max = 2_000_000;
    let plan =
        split::plan_split(&g, &SplitOptions { limit: SplitLimit::Bytes(max), no_tensor_first_split: false }).unwrap();
    for s in &plan {
        let bytes: u64 = s.iter().map(|&i| g.tensors()[i].size.next_multiple_of(32)).sum();
        assert!(bytes <= max || s.len() == 1);
    }
    // A tensor larger than the limit alone: refused, as llama-gguf-split refuses it.
    let biggest = g.tensors().iter().map(|t| t.size).max().unwrap();
    let tiny = SplitOptions { limit: SplitLimit::Bytes(biggest - 1), no_tensor_first_split: false };
    assert!(matches!(split::plan_split(&g, &tiny), Err(Error::InvalidArgument(_))));
}

#[test]
fn quantize_and_the_imatrix_collector_read_split_input() {
    let dir = scratch("quantize");
    let single = fixture("qwen35moe-tiny-F32.gguf");
    let shards = split_in(&single, &dir, 3);
    let opts =
        Options { ftype: FileType::from_name("Q4_K_M").unwrap(), imatrix: None, allow_requantize: false, threads: 2 };
    let (a, b) = (dir.join("single-q4.gguf"), dir.join("split-q4.gguf"));
    quantize_file(&single, &a, &opts, &mut |_, _, _| {}).unwrap();
    quantize_file(&shards[0], &b, &opts, &mut |_, _, _| {}).unwrap();
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "quantised from shards: another file");
    assert!(!GgufFile::open(&b).unwrap().is_split());

    let collect = |path: &Path| {
        let model = Model::load(path).unwrap();
        let (pool, c) = (ThreadPool::new(2), Collector::new());
        let tokens: Vec<u32> = (0..64).map(|i| (3 + 17 * i) % model.n_vocab() as u32).collect();
        let mut st = model.new_state(64, KvType::default()).unwrap();
        model.forward_observed(&pool, &mut st, &tokens, Logits::None, Some(&c)).unwrap();
        c.imatrix(vec![], 1, 64).to_gguf_bytes()
    };
    assert!(collect(&single) == collect(&shards[0]), "the imatrix of the shards differs");
}

/// Rewrite one metadata value of a shard (a test's malformed set).
fn rewrite(path: &Path, key: &str, value: Value) {
    let g = GgufFile::open_single(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.kv(k, if k == key { value.clone() } else { v.clone() });
    }
    for t in g.tensors() {
        w.tensor(&t.name, t.ty, t.shape());
    }
    let bytes = w.to_bytes(|i, out| out.copy_from_slice(g.tensor_data(&g.tensors()[i])));
    drop(g);
    std::fs::write(path, bytes).unwrap();
}

/// `Err(Error::Split)` naming a shard whose name contains `shard`, with a problem `problem` accepts.
#[track_caller]
fn assert_split_error(r: Result<GgufFile, Error>, shard: &str, problem: impl Fn(&ShardProblem) -> bool) {
    let e = match r {
        Err(e) => e,
        Ok(_) => panic!("expected a split error naming {shard}, got a model"),
    };
    let text = e.to_string();
    let Error::Split { shard: s, problem: p } = e else { panic!("expected a split error naming {shard}, got {text}") };
    assert!(s.contains(shard), "the error names {s}, not {shard}: {text}");
    assert!(problem(&p), "{text}: {p:?}");
    eprintln!("{text}");
}

#[test]
fn every_malformed_set_is_a_typed_error_naming_the_shard() {
    let dir = scratch("malformed");
    let single = fixture("qwen3moe-tiny-Q4_K_M.gguf");
    let fresh = |name: &str, n: usize| -> Vec<PathBuf> {
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).unwrap();
        split_in(&single, &sub, n)
    };
    let file = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_string();

    // Missing: the second of three is gone (found by name, and in a list).
    let s = fresh("missing", 3);
    std::fs::remove_file(&s[1]).unwrap();
    assert_split_error(GgufFile::open(&s[0]), &file(&s[1]), |p| matches!(p, ShardProblem::Missing { no: 1, count: 3 }));
    assert_split_error(GgufFile::open_parts(&[&s[2], &s[0]]), &file(&s[1]), |p| {
        matches!(p, ShardProblem::Missing { no: 1, count: 3 })
    });
    assert!(matches!(Model::load(&s[0]), Err(Error::Split { .. })), "the model load says the same");

    // Extra: a fourth file claiming split.no 3 of a set of 3.
    let s = fresh("extra", 3);
    let extra = dir.join("extra/extra.gguf");
    std::fs::copy(&s[2], &extra).unwrap();
    rewrite(&extra, "split.no", Value::U16(3));
    assert_split_error(GgufFile::open_parts(&[&s[0], &s[1], &s[2], &extra]), "extra.gguf", |p| {
        matches!(p, ShardProblem::Extra { no: 3, count: 3 })
    });

    // Duplicated: the same shard twice, or two files claiming one place.
    let s = fresh("duplicated", 3);
    assert_split_error(
        GgufFile::open_parts(&[&s[0], &s[1], &s[1], &s[2]]),
        &file(&s[1]),
        |p| matches!(p, ShardProblem::Duplicate { no: 1, other } if other.ends_with(&file(&s[1]))),
    );

    // Mismatched count: the second file is the second of a split into 4.
    let s = fresh("mismatched", 3);
    let four = fresh("four", 4);
    std::fs::copy(&four[1], &s[1]).unwrap();
    assert_split_error(GgufFile::open(&s[0]), &file(&s[1]), |p| {
        matches!(p, ShardProblem::CountMismatch { found: 4, expected: 3 })
    });
    assert_split_error(GgufFile::open_parts(&[&s[0], &s[2], &four[3]]), &file(&four[3]), |p| {
        matches!(p, ShardProblem::CountMismatch { found: 4, expected: 3 })
    });

    // Mismatched tensors: a shard of another model's split into 3.
    let s = fresh("other-model", 3);
    let other = dir.join("other-model/other");
    std::fs::create_dir_all(&other).unwrap();
    let o = split_in(&fixture("gemma3-tiny-Q8_0.gguf"), &other, 3);
    assert_split_error(GgufFile::open_parts(&[&s[0], &s[1], &o[2]]), &file(&o[2]), |p| {
        matches!(p, ShardProblem::TensorCountMismatch { .. })
    });
    // ... and with its split.tensors.count made to agree: the tensors do not add up.
    let n = GgufFile::open(&s[0]).unwrap().tensors().len() as i32;
    rewrite(&o[2], "split.tensors.count", Value::I32(n));
    assert_split_error(GgufFile::open_parts(&[&s[0], &s[1], &o[2]]), &file(&s[0]), |p| {
        matches!(p, ShardProblem::TensorTotal { .. })
    });
    // A tensor in two shards.
    let dup = dir.join("other-model/dup.gguf");
    std::fs::copy(&s[1], &dup).unwrap();
    rewrite(&dup, "split.no", Value::U16(2));
    assert_split_error(
        GgufFile::open_parts(&[&s[0], &s[1], &dup]),
        "dup.gguf",
        |p| matches!(p, ShardProblem::Invalid(e) if matches!(**e, Error::DuplicateTensor(_))),
    );

    // A tensor running past its shard: the last file cut short.
    let s = fresh("truncated", 3);
    let bytes = std::fs::read(&s[2]).unwrap();
    std::fs::write(&s[2], &bytes[..bytes.len() - 100]).unwrap();
    assert_split_error(
        GgufFile::open(&s[0]),
        &file(&s[2]),
        |p| matches!(p, ShardProblem::Invalid(e) if matches!(**e, Error::TensorOutOfBounds { .. })),
    );

    // Wrong split.no: the third file copied over the second's name.
    let s = fresh("wrong-no", 3);
    std::fs::copy(&s[2], &s[1]).unwrap();
    assert_split_error(GgufFile::open(&s[0]), &file(&s[1]), |p| {
        matches!(p, ShardProblem::WrongIndex { found: 2, expected: 1 })
    });

    // Opened from a later shard; a first shard renamed so the others cannot be found.
    let s = fresh("names", 3);
    assert_split_error(GgufFile::open(&s[1]), &file(&s[1]), |p| {
        matches!(p, ShardProblem::NotFirst { no: 1, count: 3 })
    });
    let renamed = dir.join("names/renamed.gguf");
    std::fs::copy(&s[0], &renamed).unwrap();
    assert_split_error(
        GgufFile::open(&renamed),
        "renamed.gguf",
        |p| matches!(p, ShardProblem::BadName { expected } if expected == "-00001-of-00003.gguf"),
    );
    // ... but given as a list, names do not matter.
    assert_eq!(GgufFile::open_parts(&[&renamed, &s[1], &s[2]]).unwrap().shards().len(), 3);
    // A file that is not a shard among shards.
    assert_split_error(GgufFile::open_parts(&[&s[0], &s[1], &single]), &file(&single), |p| {
        matches!(p, ShardProblem::NotAShard)
    });
    // A shard that is not a GGUF file at all.
    std::fs::write(&s[2], b"not a model").unwrap();
    assert_split_error(
        GgufFile::open(&s[0]),
        &file(&s[2]),
        |p| matches!(p, ShardProblem::Invalid(e) if matches!(**e, Error::Truncated { .. } | Error::BadMagic(_))),
    );
}

/// Gemma 3 270M (`POCKET_GEMMA`, or the README's cache): its shards give its logits bit for bit.
#[test]
fn gemma_270m_shards_give_its_logits_bit_for_bit() {
    let Some(single) = common::gemma_270m() else {
        eprintln!("skipped: Gemma 3 270M not found (set POCKET_GEMMA)");
        return;
    };
    let dir = scratch("gemma");
    let shards = split_file(
        &single,
        &dir,
        "gemma",
        &SplitOptions { limit: SplitLimit::Bytes(100_000_000), no_tensor_first_split: false },
    );
    assert!(shards.len() >= 2, "{} shards", shards.len());
    let one = Model::load(&single).unwrap();
    let split = Model::load(&shards[0]).unwrap();
    let want = logits(&one);
    assert_eq!(logits(&split), want, "Gemma 3 270M: the shards' logits differ");
    eprintln!("Gemma 3 270M: {} shards of at most 100M, {} logits equal", shards.len(), want.0.len());
    let merged = dir.join("merged.gguf");
    split::merge(&shards[0], &merged).unwrap();
    assert_eq!(logits(&Model::load(&merged).unwrap()), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `POCKET_LLAMA_GGUF_SPLIT`: a built `llama-gguf-split`, whose shards and
/// merged files ours must equal byte for byte.
#[test]
fn split_and_merge_write_llama_gguf_split_s_bytes() {
    let Some(tool) = std::env::var_os("POCKET_LLAMA_GGUF_SPLIT").map(PathBuf::from) else {
        eprintln!("skipped: POCKET_LLAMA_GGUF_SPLIT does not name a built llama-gguf-split");
        return;
    };
    assert!(tool.is_file(), "POCKET_LLAMA_GGUF_SPLIT={} is not a file", tool.display());
    let dir = scratch("llama");
    let mut inputs: Vec<PathBuf> = manifest_files().iter().map(|f| common::fixtures().join(f)).collect();
    inputs.extend(common::gemma_270m());
    for input in &inputs {
        let name = input.file_name().unwrap().to_str().unwrap();
        for (flags, opts) in [
            (vec!["--split-max-tensors", "17"], tensors(17)),
            (
                vec!["--split-max-size", "1M"],
                SplitOptions { limit: SplitLimit::Bytes(1_000_000), no_tensor_first_split: false },
            ),
            (
                vec!["--split-max-tensors", "40", "--no-tensor-first-split"],
                SplitOptions { limit: SplitLimit::Tensors(40), no_tensor_first_split: true },
            ),
        ] {
            let g = GgufFile::open(input).unwrap();
            let plan = split::plan_split(&g, &opts);
            let theirs_prefix = dir.join("theirs");
            let out = std::process::Command::new(&tool)
                .arg("--split")
                .args(&flags)
                .arg(input)
                .arg(&theirs_prefix)
                .output()
                .unwrap();
            let Ok(plan) = plan else {
                assert!(!out.status.success(), "{name} {flags:?}: llama-gguf-split split what we refuse");
                continue;
            };
            assert!(out.status.success(), "{name} {flags:?}: {}", String::from_utf8_lossy(&out.stderr));
            let ours = split::split(&g, dir.join("ours").to_str().unwrap(), &opts, &mut |_, _| {}).unwrap();
            assert_eq!(ours.len(), plan.len());
            for (k, p) in ours.iter().enumerate() {
                let t = PathBuf::from(split::shard_path(theirs_prefix.to_str().unwrap(), k as u64, ours.len() as u64));
                assert!(
                    std::fs::read(p).unwrap() == std::fs::read(&t).unwrap(),
                    "{name} {flags:?}: shard {} differs",
                    k + 1
                );
            }
            let (m_ours, m_theirs) = (dir.join("merged-ours.gguf"), dir.join("merged-theirs.gguf"));
            split::merge(&ours[0], &m_ours).unwrap();
            let out = std::process::Command::new(&tool).arg("--merge").arg(&ours[0]).arg(&m_theirs).output().unwrap();
            assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(
                std::fs::read(&m_ours).unwrap() == std::fs::read(&m_theirs).unwrap(),
                "{name} {flags:?}: merged files differ"
            );
            eprintln!("{name} {flags:?}: {} shards and the merged file equal llama-gguf-split's", ours.len());
            for p in std::fs::read_dir(&dir).unwrap() {
                std::fs::remove_file(p.unwrap().path()).unwrap();
            }
        }
    }
}
