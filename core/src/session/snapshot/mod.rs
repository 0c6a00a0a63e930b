//! Session snapshots: a conversation's evaluated state on disk, so that an
//! app the OS kills in the background continues where it stood, without
//! evaluating the conversation again.
//!
//! A snapshot holds exactly what the next request reads:
//! - the evaluated tokens (the cache a new prompt is compared with);
//! - per attention layer, the keys and values of the used positions only,
//!   in the cache's own precision (f32, f16 or q8_0 blocks), never the
//!   unused rest of the context nor any scratch buffer;
//! - per recurrent (DeltaNet) layer, its conv window and delta-rule state;
//! - the recurrent checkpoints the session rewinds to, with the state's
//!   clock and per-position stamps that tell which are still valid (a
//!   checkpoint identical to the current state is stored as a flag);
//! - the identity of the model file ([`ModelIdentity`]) and the options that
//!   shape the state (context length, KV type): a snapshot never loads into
//!   a state of another shape or onto other weights.
//!
//! No sampler state is saved because none survives a request: each request
//! builds its sampler from its seed (the request's, else the session's,
//! which the restoring caller passes in its options) and feeds it that
//! request's prompt. Logits are not saved either: a request always
//! evaluates at least the last prompt token before it samples.
//!
//! Layout (integers little-endian), see [`container`] for the framing:
//!
//! ```text
//! "PKTSNAP\0"  u32 version
//! INFO  identity (u64 file bytes, u64 header bytes, u128 XXH3 of the header),
//!       u64 context, u8 KV type (0 f32, 1 f16, 2 q8_0), u32 layers,
//!       u64 tokens, u64 positions kept (≥ tokens: checkpoints may lie beyond), u32 checkpoints
//! TOKS  u32 × tokens
//! CLCK  u64 clock, u64 × positions kept (the pass that wrote each)
//! per layer, in order:
//!   ATTN  u32 layer, then keys [kv_head][position < kept][dim], then values, in the cache's type
//!   DNET  u32 layer, f32 conv window, f32 delta states
//! per checkpoint, oldest first:
//!   CKPT  u64 position, u64 clock, u64 tokens, u32 × tokens,
//!         u8 shared (1: equal to the current recurrent state), else per recurrent layer conv and states
//! ```
//! each section framed as `[u8; 4] tag, u64 length, u64 XXH3-64 of the payload`.

mod container;
mod durable;
mod fields;

use std::io::{Read, Write};

use container::{invalid, Reader, Writer};
use fields::{put_f32s, put_u128, put_u32, put_u32s, put_u64, put_u64s, put_u8, Fields};

use crate::error::{Error, Result};
use crate::model::{Checkpoint, KvType, LayerState, Model, ModelIdentity, SavedDelta, State};

pub(super) use durable::replace;

const INFO: [u8; 4] = *b"INFO";
const TOKENS: [u8; 4] = *b"TOKS";
const CLOCK: [u8; 4] = *b"CLCK";
const ATTENTION: [u8; 4] = *b"ATTN";
const RECURRENT: [u8; 4] = *b"DNET";
const CHECKPOINT: [u8; 4] = *b"CKPT";

/// Bytes of the INFO payload.
const INFO_BYTES: u64 = 8 + 8 + 16 + 8 + 1 + 4 + 8 + 8 + 4;

/// What a snapshot holds of a session: the parts that carry its conversation.
pub(super) struct Conversation {
    pub state: State,
    /// The tokens evaluated into `state`.
    pub cached: Vec<u32>,
    pub checkpoints: Vec<(Vec<u32>, Checkpoint)>,
}

/// Where the session stands, borrowed for writing.
pub(super) struct Saved<'a> {
    pub model: &'a Model,
    pub kv: KvType,
    pub state: &'a State,
    pub cached: &'a [u32],
    pub checkpoints: &'a [(Vec<u32>, Checkpoint)],
}

fn kv_code(kv: KvType) -> u8 {
    match kv {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
    }
}

fn kv_of(code: u8) -> Option<KvType> {
    [KvType::F32, KvType::F16, KvType::Q8_0].into_iter().find(|&k| kv_code(k) == code)
}

/// Equal bit for bit (so -0.0 differs from 0.0 and a NaN equals itself).
fn same_bits(a: &SavedDelta, b: &SavedDelta) -> bool {
    let eq = |x: &[f32], y: &[f32]| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
    eq(&a.conv, &b.conv) && eq(&a.ssm, &b.ssm)
}

/// Write the snapshot of `s` to `w`, one section after the other.
pub(super) fn write(w: &mut dyn Write, s: &Saved) -> Result<()> {
    let state = s.state;
    let n_past = state.n_past();
    if s.cached.len() != n_past {
        return Err(Error::InvalidArgument(format!(
            "the session holds {} tokens but its state {n_past} positions",
            s.cached.len()
        )));
    }
    // Checkpoints may lie past the current position (a rewind to an earlier
    // one keeps the later ones while their positions are not rewritten).
    let kept = s.checkpoints.iter().map(|(_, c)| c.n_past()).fold(n_past, usize::max);
    let mut w = Writer::new(w)?;
    let mut p = Vec::new();

    let id = s.model.identity();
    put_u64(&mut p, id.file_bytes);
    put_u64(&mut p, id.header_bytes);
    put_u128(&mut p, id.header_hash);
    put_u64(&mut p, state.n_ctx() as u64);
    put_u8(&mut p, kv_code(s.kv));
    put_u32(&mut p, state.layers.len() as u32);
    put_u64(&mut p, n_past as u64);
    put_u64(&mut p, kept as u64);
    put_u32(&mut p, s.checkpoints.len() as u32);
    w.section(INFO, &p)?;

    p.clear();
    put_u32s(&mut p, s.cached);
    w.section(TOKENS, &p)?;

    p.clear();
    put_u64(&mut p, state.clock);
    put_u64s(&mut p, &state.stamps[..kept]);
    w.section(CLOCK, &p)?;

    // The recurrent layers' values now (read back once from a GPU that holds them).
    let mut current = Vec::new();
    for (il, layer) in state.layers.iter().enumerate() {
        p.clear();
        put_u32(&mut p, il as u32);
        match layer {
            LayerState::Attention(c) => {
                c.save_positions(kept, &mut p);
                w.section(ATTENTION, &p)?;
            }
            // An MLA layer's latent cache, in an attention section of its own size.
            LayerState::Latent(c) => {
                c.save_positions(kept, &mut p);
                w.section(ATTENTION, &p)?;
            }
            LayerState::Recurrent(r) => {
                let now = r.save()?;
                put_f32s(&mut p, &now.conv);
                put_f32s(&mut p, &now.ssm);
                w.section(RECURRENT, &p)?;
                current.push((il, now));
            }
            // A shared-KV layer's positions are its source layer's.
            LayerState::Shared { .. } => {}
        }
    }

    for (tokens, cp) in s.checkpoints {
        p.clear();
        put_u64(&mut p, cp.n_past() as u64);
        put_u64(&mut p, cp.clock());
        put_u64(&mut p, tokens.len() as u64);
        put_u32s(&mut p, tokens);
        let shared = cp.recurrent().len() == current.len()
            && cp.recurrent().iter().zip(&current).all(|((il, saved), (at, now))| il == at && same_bits(now, saved));
        put_u8(&mut p, shared as u8);
        if !shared {
            for (_, r) in cp.recurrent() {
                put_f32s(&mut p, &r.conv);
                put_f32s(&mut p, &r.ssm);
            }
        }
        w.section(CHECKPOINT, &p)?;
    }
    Ok(())
}

/// Read a snapshot of `len` bytes for a session of `model` with a context of
/// `n_ctx` and a `kv` cache, holding at most `max_checkpoints`. Everything is
/// checked before it is used; the result is a complete conversation or an
/// error ([`Error::InvalidArgument`] naming what is wrong, [`Error::Io`] when
/// reading fails).
pub(super) fn read(
    r: &mut dyn Read,
    len: u64,
    model: &Model,
    n_ctx: usize,
    kv: KvType,
    max_checkpoints: usize,
) -> Result<Conversation> {
    let mut reader = Reader::new(r, len)?;
    let mut buf = Vec::new();

    // ---- what it was made with: checked before anything is allocated ----
    reader.section(INFO, "model and options", INFO_BYTES, INFO_BYTES, &mut buf)?;
    let mut f = Fields::new(&buf, "the INFO section");
    let saved = ModelIdentity { file_bytes: f.u64()?, header_bytes: f.u64()?, header_hash: f.u128()? };
    let (saved_ctx, saved_kv, n_layer) = (f.u64()?, f.u8()?, f.u32()?);
    let (n_past, kept, n_checkpoints) = (f.u64()?, f.u64()?, f.u32()?);
    f.finish()?;
    if saved != *model.identity() {
        return Err(invalid(format!("it was made with another model ({saved}); this model is {}", model.identity())));
    }
    if saved_ctx != n_ctx as u64 {
        return Err(invalid(format!(
            "it was made with a context of {saved_ctx} tokens; the session options give {n_ctx}"
        )));
    }
    let saved_kv = kv_of(saved_kv).ok_or_else(|| invalid(format!("unknown KV cache type code {saved_kv}")))?;
    if saved_kv != kv {
        return Err(invalid(format!(
            "it was made with a {} KV cache; the session options ask for {}",
            saved_kv.name(),
            kv.name()
        )));
    }
    if n_past > kept || kept > n_ctx as u64 {
        return Err(invalid(format!("{n_past} tokens and {kept} positions do not fit a context of {n_ctx}")));
    }
    if n_checkpoints as usize > max_checkpoints {
        return Err(invalid(format!("{n_checkpoints} checkpoints (a session keeps at most {max_checkpoints})")));
    }
    let (n_past, kept) = (n_past as usize, kept as usize);
    let mut state = model.new_state(n_ctx, kv)?;
    if n_layer as usize != state.layers.len() {
        return Err(invalid(format!("{n_layer} layers; this model has {}", state.layers.len())));
    }
    let n_vocab = model.n_vocab();
    let check_tokens = |tokens: &[u32], what: &str| match tokens.iter().find(|&&t| t as usize >= n_vocab) {
        Some(bad) => Err(invalid(format!("{what}: token id {bad} is outside the vocabulary of {n_vocab}"))),
        None => Ok(()),
    };

    // ---- the tokens and the positions' clock ----
    let n = 4 * n_past as u64;
    reader.section(TOKENS, "tokens", n, n, &mut buf)?;
    let cached = Fields::new(&buf, "the token section").u32s(n_past)?;
    check_tokens(&cached, "the token section")?;

    let n = 8 + 8 * kept as u64;
    reader.section(CLOCK, "positions' clock", n, n, &mut buf)?;
    let mut f = Fields::new(&buf, "the clock section");
    let clock = f.u64()?;
    f.u64s_into(&mut state.stamps[..kept])?;
    f.finish()?;
    if state.stamps[..kept].iter().any(|&s| s > clock) {
        return Err(invalid(format!("a position is stamped after the clock ({clock})")));
    }
    state.clock = clock;
    state.n_past = n_past;

    // ---- every layer ----
    let mut recurrent_floats = 0u64;
    for (il, layer) in state.layers.iter_mut().enumerate() {
        match layer {
            LayerState::Attention(c) => {
                let what = format!("KV cache of layer {il}");
                let n = 4 + c.bytes_for(kept) as u64;
                reader.section(ATTENTION, &what, n, n, &mut buf)?;
                let mut f = Fields::new(&buf, &what);
                layer_index(&mut f, il, &what)?;
                c.load_positions(kept, f.rest()).map_err(|e| invalid(format!("{what}: {e}")))?;
            }
            LayerState::Latent(c) => {
                let what = format!("latent cache of layer {il}");
                let n = 4 + c.bytes_for(kept) as u64;
                reader.section(ATTENTION, &what, n, n, &mut buf)?;
                let mut f = Fields::new(&buf, &what);
                layer_index(&mut f, il, &what)?;
                c.load_positions(kept, f.rest()).map_err(|e| invalid(format!("{what}: {e}")))?;
            }
            LayerState::Recurrent(r) => {
                let what = format!("recurrent state of layer {il}");
                let floats = (r.conv.len() + r.ssm.len()) as u64;
                recurrent_floats += floats;
                reader.section(RECURRENT, &what, 4 + 4 * floats, 4 + 4 * floats, &mut buf)?;
                let mut f = Fields::new(&buf, &what);
                layer_index(&mut f, il, &what)?;
                f.f32s_into(r.conv.overwrite())?;
                f.f32s_into(r.ssm.overwrite())?;
                f.finish()?;
            }
            LayerState::Shared { .. } => {}
        }
    }

    // ---- checkpoints, oldest first ----
    let mut checkpoints = Vec::with_capacity(n_checkpoints as usize);
    for i in 1..=n_checkpoints {
        let what = format!("checkpoint {i}");
        let (min, max) = (8 * 3 + 1, 8 * 3 + 4 * kept as u64 + 1 + 4 * recurrent_floats);
        reader.section(CHECKPOINT, &what, min, max, &mut buf)?;
        let mut f = Fields::new(&buf, &what);
        let (at, cp_clock, n_tokens) = (f.u64()?, f.u64()?, f.u64()?);
        if at > kept as u64 || n_tokens != at || cp_clock > clock {
            return Err(invalid(format!(
                "{what}: {n_tokens} tokens at position {at} and clock {cp_clock} do not fit \
                 {kept} positions and clock {clock}"
            )));
        }
        let tokens = f.u32s(at as usize)?;
        check_tokens(&tokens, &what)?;
        let recurrent = state.layers.iter().enumerate().filter_map(|(il, l)| match l {
            LayerState::Recurrent(r) => Some((il, r)),
            LayerState::Attention(_) | LayerState::Shared { .. } | LayerState::Latent(_) => None,
        });
        let recurrent: Vec<(usize, SavedDelta)> = match f.u8()? {
            1 => recurrent.map(|(il, r)| r.save().map(|s| (il, s))).collect::<Result<_>>()?,
            0 => {
                let mut copies = Vec::new();
                for (il, r) in recurrent {
                    let mut s = r.blank();
                    f.f32s_into(&mut s.conv)?;
                    f.f32s_into(&mut s.ssm)?;
                    copies.push((il, s));
                }
                copies
            }
            other => return Err(invalid(format!("{what}: sharing flag {other} (0 or 1)"))),
        };
        f.finish()?;
        checkpoints.push((tokens, Checkpoint::from_parts(at as usize, cp_clock, recurrent)));
    }
    reader.finish()?;
    Ok(Conversation { state, cached, checkpoints })
}

fn layer_index(f: &mut Fields, il: usize, what: &str) -> Result<()> {
    match f.u32()? {
        i if i as usize == il => Ok(()),
        i => Err(invalid(format!("{what} is marked as layer {i}"))),
    }
}
