//! Fuzz the session snapshot reader: any bytes must restore or fail with
//! `InvalidArgument`, never panic; a session that restores must save again,
//! and that snapshot must restore to the same tokens.
//!
//! Needs the fixture store (POCKET_FIXTURES) for the hybrid qwen35moe model
//! (KV cache, recurrent layers and checkpoints in one snapshot). The first
//! input byte picks the mode:
//! - even: the rest is a snapshot as is;
//! - odd: the rest edits a valid snapshot of that model (bit 2 picks which):
//!   a cut (u32, applied when below the length) and (offset u32, xor byte)
//!   pairs; with bit 1 set, the checksums are recomputed afterwards so that
//!   the edits reach the decoding behind them.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use pocket_core::model::Model;
use pocket_core::sampler::SamplerConfig;
use pocket_core::session::{GenerateOptions, Session, SessionOptions};
use pocket_core::Error;
use xxhash_rust::xxh3::xxh3_64;

fn options() -> SessionOptions {
    SessionOptions { context_length: 16, threads: 1, ..Default::default() }
}

/// The model and two valid snapshots of sessions on it: after a prompt alone
/// (one checkpoint, equal to the state: stored as a flag), and after a prompt
/// and an answer (two checkpoints, the first stored in full).
fn base() -> &'static (Arc<Model>, [Vec<u8>; 2]) {
    static BASE: OnceLock<(Arc<Model>, [Vec<u8>; 2])> = OnceLock::new();
    BASE.get_or_init(|| {
        let store = std::env::var_os("POCKET_FIXTURES").map(PathBuf::from).expect("set POCKET_FIXTURES");
        let model = Arc::new(Model::load(store.join("models/qwen35moe-tiny-Q4_K_M.gguf")).expect("fixture model"));
        let snapshot = |max_tokens| {
            let mut s = Session::new(model.clone(), options()).unwrap();
            let o = GenerateOptions { max_tokens, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
            s.generate("Hi", &o, &mut |_| true).unwrap();
            let mut bytes = Vec::new();
            s.write_snapshot(&mut bytes).unwrap();
            bytes
        };
        let bases = [snapshot(0), snapshot(3)];
        (model, bases)
    })
}

/// Recompute every section's checksum (the framing is documented in core's `session::snapshot`).
fn reseal(b: &mut [u8]) {
    let mut at = 12usize;
    while at + 20 <= b.len() {
        let len = u64::from_le_bytes(b[at + 4..at + 12].try_into().unwrap());
        let Some(end) = usize::try_from(len).ok().and_then(|l| (at + 20).checked_add(l)).filter(|&e| e <= b.len())
        else {
            return;
        };
        let sum = xxh3_64(&b[at + 20..end]);
        b[at + 12..at + 20].copy_from_slice(&sum.to_le_bytes());
        at = end;
    }
}

fuzz_target!(|data: &[u8]| {
    let (model, bases) = base();
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut b = bases[(mode >> 2) as usize & 1].clone();
        let (cut, edits) = rest.split_at(rest.len().min(4));
        if let Ok(cut) = <[u8; 4]>::try_from(cut) {
            let cut = u32::from_le_bytes(cut) as usize;
            if cut < b.len() {
                b.truncate(cut);
            }
        }
        for e in edits.chunks_exact(5) {
            if !b.is_empty() {
                let at = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize % b.len();
                b[at] ^= e[4];
            }
        }
        if mode & 2 != 0 {
            reseal(&mut b);
        }
        b
    };
    let mut r = bytes.as_slice();
    match Session::restore_from(model.clone(), &mut r, bytes.len() as u64, options()) {
        Ok(s) => {
            assert!(s.cached_tokens().len() <= s.context_length());
            let mut again = Vec::new();
            s.write_snapshot(&mut again).expect("a restored session saves");
            let mut r = again.as_slice();
            let t = Session::restore_from(model.clone(), &mut r, again.len() as u64, options()).expect("its snapshot restores");
            assert_eq!(t.cached_tokens(), s.cached_tokens());
        }
        Err(Error::InvalidArgument(_)) => {}
        Err(e) => panic!("a snapshot in memory failed with {e:?}"),
    }
});
