//! Tokenizers read from GGUF metadata, token-for-token identical to llama.cpp.
//!
//! Two models cover the supported families:
//! - `gpt2`: byte-level BPE ([`bpe`]) after a pre-tokenizer chosen by
//!   `tokenizer.ggml.pre` ([`pretokenize`]): every name llama.cpp knows;
//!   `gemma4` is the same BPE on raw UTF-8 with SentencePiece's spaces.
//! - `llama`: SentencePiece-style BPE with byte fallback ([`spm`]): Llama 2,
//!   Mistral/Mixtral, Gemma.
//! - `bert`: WordPiece ([`wpm`]): BERT-family embedding models.
//! - `t5`: Unigram ([`ugm`]): T5, XLM-RoBERTa and their embedding models.
//!
//! Encoding first splits special tokens out of the text ([`special`]), then
//! runs the model on each text fragment. Decoding and streaming live in
//! [`decode`].

mod bpe;
mod cache;
mod decode;
mod eog;
mod pretokenize;
mod special;
mod spm;
mod ugm;
mod unicode;
mod vocab;
mod wpm;

use std::collections::BTreeSet;

use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

pub use decode::StreamDecoder;

use crate::gguf::{Array, GgufFile, Key};
use crate::{Error, Result};
use bpe::BpeModel;
use decode::FirstSpace;
use pretokenize::{PreConfig, PreTokenizer};
use special::{Fragment, SpecialTokens};
use vocab::{attr, Vocab};

/// The tokenization algorithm and its model-specific state.
enum Model {
    /// `escape`: spaces become `▁` before splitting (raw-UTF-8 BPE).
    Bpe {
        pre: PreTokenizer,
        bpe: Box<BpeModel>,
        nfc: bool,
        escape: bool,
    },
    Spm(Box<spm::SpmModel>),
    Wpm(wpm::WpmModel),
    /// `merge`: runs of spaces collapse (`remove_extra_whitespaces`).
    Ugm {
        ugm: Box<ugm::UgmModel>,
        merge: bool,
    },
}

/// A tokenizer loaded from a GGUF file. Immutable and `Send + Sync`: share
/// one between sessions.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    special: SpecialTokens,
    /// Token pieces as llama.cpp's `token_to_piece(id, special = true)`.
    pieces: decode::Pieces,
    ids: SpecialIds,
    add_bos: bool,
    add_eos: bool,
    /// WordPiece ends an input with `[SEP]`.
    add_sep: bool,
    add_space_prefix: bool,
    /// The leading space decoding drops at the start of a text.
    first_space: FirstSpace,
    clean_spaces: bool,
    /// Tokens that end generation (EOS, EOT, EOM, end-of-turn markers).
    eog: BTreeSet<u32>,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.model {
            Model::Bpe { pre, .. } => format!("BPE ({pre:?})"),
            Model::Spm(_) => "SPM".to_string(),
            Model::Wpm(_) => "WPM".to_string(),
            Model::Ugm { .. } => "UGM".to_string(),
        };
        f.debug_struct("Tokenizer").field("model", &kind).field("n_vocab", &self.n_vocab()).finish()
    }
}

impl Tokenizer {
    /// Load the tokenizer of a GGUF file (a full model or a vocabulary-only
    /// file). Fails with [`Error::UnknownTokenizer`] or
    /// [`Error::UnknownPreTokenizer`] for models this engine does not know.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        let model_name = g.require(Key::TokenizerModel.name(), g.get_str(Key::TokenizerModel.name()))?;
        let pre_name = g.get_str(Key::TokenizerPre.name())?;
        let vocab = Vocab::from_gguf(g)?;
        let n = vocab.len() as u32;

        // Defaults per model, as llama.cpp; the file's keys override them.
        let (mut force_bos, mut raw_bpe) = (false, false);
        let (model, mut ids, mut add_bos, mut add_space_prefix, clean_spaces) = match model_name {
            "llama" => {
                let ids = SpecialIds { bos: Some(1), eos: Some(2), unk: Some(0), ..SpecialIds::default() };
                (Model::Spm(Box::new(spm::SpmModel::new(&vocab))), ids, true, true, false)
            }
            "gpt2" | "gemma4" => {
                // llama.cpp ignores the file's pre-tokenizer for Gemma 4.
                let gemma4 = model_name == "gemma4";
                let cfg = PreConfig::from_name(if gemma4 { "gemma4" } else { pre_name.unwrap_or("default") })?;
                let key = Key::TokenizerMerges.name();
                let merges = g.require(key, g.get_array(key))?;
                let merges = merges.as_strings().ok_or_else(|| Error::WrongValueType {
                    key: key.to_string(),
                    expected: "array of strings",
                    found: merges.element_type().name(),
                })?;
                let bpe = Box::new(BpeModel::new(&vocab, merges, cfg.ignore_merges, cfg.raw, cfg.newline_words));
                // Gemma 4 has no default special ids: the file names them.
                let ids = match (gemma4, cfg.no_bos) {
                    (true, _) => SpecialIds::default(),
                    (false, no_bos) => {
                        SpecialIds { bos: (!no_bos).then_some(11), eos: Some(11), ..SpecialIds::default() }
                    }
                };
                force_bos = cfg.force_bos;
                raw_bpe = cfg.raw;
                let model = Model::Bpe { pre: cfg.pre, bpe, nfc: cfg.nfc, escape: cfg.escape_whitespaces };
                (model, ids, cfg.add_bos, false, cfg.clean_spaces)
            }
            "bert" => {
                // llama.cpp: lowercase unless the file says otherwise, strip
                // accents when lowercasing unless the file says otherwise.
                let lowercase = g.get_bool(Key::TokenizerNormalizerLowercase.name())?.unwrap_or(true);
                let strip_accents = g.get_bool(Key::TokenizerNormalizerStripAccents.name())?.unwrap_or(lowercase);
                let ids = SpecialIds { bos: Some(101), unk: Some(100), sep: Some(102), ..SpecialIds::default() };
                force_bos = true;
                (Model::Wpm(wpm::WpmModel::new(&vocab, lowercase, strip_accents)), ids, true, false, true)
            }
            "t5" => {
                let key = Key::TokenizerPrecompiledCharsmap.name();
                let charsmap = match g.get_array(key)? {
                    None => None,
                    Some(Array::U8(v)) => Some(v.clone()),
                    Some(Array::I8(v)) => Some(v.iter().map(|&b| b as u8).collect()),
                    Some(other) => {
                        return Err(Error::WrongValueType {
                            key: key.to_string(),
                            expected: "array of bytes",
                            found: other.element_type().name(),
                        })
                    }
                };
                let ugm = Box::new(ugm::UgmModel::new(&vocab, charsmap.as_deref())?);
                let merge = g.get_bool(Key::TokenizerRemoveExtraWhitespaces.name())?.unwrap_or(false);
                let ids = SpecialIds { eos: Some(1), unk: Some(2), ..SpecialIds::default() };
                (Model::Ugm { ugm, merge }, ids, false, false, false)
            }
            other => return Err(Error::UnknownTokenizer(other.to_string())),
        };
        let space_prefix_key = g.get_bool(Key::TokenizerAddSpacePrefix.name())?;
        let mut id_keys: [(Key, &mut Option<u32>); 12] = [
            (Key::TokenizerBosId, &mut ids.bos),
            (Key::TokenizerEosId, &mut ids.eos),
            (Key::TokenizerEotId, &mut ids.eot),
            (Key::TokenizerEomId, &mut ids.eom),
            (Key::TokenizerUnkId, &mut ids.unk),
            (Key::TokenizerSepId, &mut ids.sep),
            (Key::TokenizerFimPreId, &mut ids.fim_pre),
            (Key::TokenizerFimSufId, &mut ids.fim_suf),
            (Key::TokenizerFimMidId, &mut ids.fim_mid),
            (Key::TokenizerFimPadId, &mut ids.fim_pad),
            (Key::TokenizerFimRepId, &mut ids.fim_rep),
            (Key::TokenizerFimSepId, &mut ids.fim_sep),
        ];
        for (key, id) in id_keys.iter_mut() {
            if id.is_some_and(|i| i >= n) {
                **id = None;
            }
            // An id out of range keeps the default, as llama.cpp.
            if let Some(v) = g.get_u32(key.name())?.filter(|&v| v < n) {
                **id = Some(v);
            }
        }
        match space_prefix_key {
            Some(v) => add_space_prefix = v,
            // Deviation from llama.cpp, which adds the prefix: SentencePiece
            // models with Gemma's special-token layout (pad 0, EOS 1, BOS 2)
            // are trained without a dummy prefix, and Hugging Face tokenizes
            // them without one; llama.cpp's converter only records this for
            // Gemma architectures.
            None if matches!(model, Model::Spm(_)) && ids.bos == Some(2) && ids.eos == Some(1) => {
                add_space_prefix = false
            }
            None => {}
        }
        if let Some(v) = g.get_bool(Key::TokenizerAddBos.name())? {
            add_bos = v;
        }
        add_bos |= force_bos;
        let add_eos = g.get_bool(Key::TokenizerAddEos.name())?.unwrap_or(false);
        // llama.cpp frames WordPiece input as [CLS] ... [SEP] whatever the
        // file's flags say.
        let wpm = matches!(model, Model::Wpm(_));
        let add_sep = wpm;
        let first_space = match (wpm, add_space_prefix) {
            (true, _) => FirstSpace::FirstVisible,
            (false, true) => FirstSpace::FirstToken,
            (false, false) => FirstSpace::Keep,
        };

        let mut vocab = vocab;
        let eog = eog::mark_end_of_generation(&mut vocab, &mut ids);
        // Per-model token attributes llama.cpp sets by name (Phi-3: special
        // tokens swallow the whitespace after them).
        let name = g.get_str(Key::GeneralName.name())?.unwrap_or("").to_lowercase();
        let special = SpecialTokens::new(&vocab);
        if name.contains("phi-3") || name.contains("phi3") {
            special.set_attr_all(&mut vocab, attr::RSTRIP);
            set_attr_by_text(&mut vocab, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set_attr_by_text(&mut vocab, t, attr::RSTRIP, false);
            }
        }
        // Raw-UTF-8 BPE spells its pieces as SentencePiece does ('▁', <0xXX>).
        let is_bpe = matches!(model, Model::Bpe { .. });
        let pieces = decode::Pieces::new(&vocab, is_bpe && !raw_bpe);
        Ok(Tokenizer {
            vocab,
            model,
            special,
            pieces,
            ids,
            add_bos,
            add_eos,
            add_sep,
            add_space_prefix,
            first_space,
            clean_spaces,
            eog,
        })
    }

    /// Tokenize `text`. `add_special` adds BOS/EOS where the model asks for
    /// them (`tokenizer.ggml.add_bos_token`/`add_eos_token`; WordPiece
    /// always frames the text as `[CLS] ... [SEP]`, as llama.cpp);
    /// `parse_special` turns the text of control tokens (`<|im_start|>`,
    /// `<start_of_turn>`) into those tokens instead of tokenizing it as plain
    /// text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let mut fragments = Vec::new();
        self.special.partition(&self.vocab, text, parse_special, &mut fragments);
        if add_special && self.add_bos {
            out.extend(self.ids.bos);
        }
        match &self.model {
            Model::Bpe { pre, bpe, nfc, escape } => {
                let mut words = Vec::new();
                let mut scratch = bpe::Scratch::default();
                let mut cache = cache::WordCache::default();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(a, b) => {
                            let (normalized, escaped);
                            let mut piece = &text[a..b];
                            if *nfc && is_nfc_quick(piece.chars()) != IsNormalized::Yes {
                                normalized = piece.nfc().collect::<String>();
                                piece = &normalized;
                            }
                            if *escape {
                                escaped = piece.replace(' ', "▁");
                                piece = &escaped;
                            }
                            words.clear();
                            pre.split(piece, 0, &mut words);
                            for &(s, e) in &words {
                                let word = &piece.as_bytes()[s..e];
                                if !cache.lookup(word, &mut out) {
                                    let start = out.len();
                                    bpe.encode_word(&self.vocab, word, &mut scratch, &mut out);
                                    cache.insert(word, &out[start..]);
                                }
                            }
                        }
                    }
                }
            }
            Model::Spm(spm) => {
                let mut scratch = spm::Scratch::default();
                let mut escaped = String::new();
                // A space goes in front of the text, and again after each
                // special token, when the model adds a prefix space.
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(a, b) => {
                            escaped.clear();
                            if self.add_space_prefix && prev_special {
                                escaped.push('▁');
                            }
                            escape_spaces(&text[a..b], &mut escaped);
                            spm.encode(&self.vocab, &escaped, &mut scratch, &mut out)?;
                            prev_special = false;
                        }
                    }
                }
            }
            Model::Wpm(wpm) => {
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(a, b) => wpm.encode(&self.vocab, &text[a..b], self.ids.unk, &mut out)?,
                    }
                }
            }
            Model::Ugm { ugm, merge } => {
                let spaces = (self.add_space_prefix, *merge);
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(a, b) => ugm.encode(&self.vocab, &text[a..b], spaces, self.ids.unk, &mut out)?,
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.ids.eos);
        }
        if add_special && self.add_sep {
            out.extend(self.ids.sep);
        }
        Ok(out)
    }

    /// Detokenize as llama.cpp's `llama_detokenize` (special tokens kept in
    /// the sequence; hidden unless `show_special`): the leading space the
    /// model's prefix added is removed, and GPT-2-style vocabularies clean up
    /// spaces before punctuation. Invalid UTF-8 becomes U+FFFD; unknown ids
    /// are skipped.
    pub fn decode(&self, ids: &[u32], show_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, show_special)).into_owned()
    }

    /// [`decode`](Self::decode) without the UTF-8 repair.
    pub fn decode_bytes(&self, ids: &[u32], show_special: bool) -> Vec<u8> {
        decode::detokenize(self, ids, show_special)
    }

    /// The raw bytes a token stands for, special tokens shown (what
    /// `llama-tokenize` prints). May be part of a UTF-8 sequence (byte tokens).
    pub fn token_piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id)
    }

    /// The token's text as stored in the vocabulary (`▁` and byte-level
    /// characters included).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        std::str::from_utf8(self.vocab.text(id)).ok().filter(|_| (id as usize) < self.vocab.len())
    }

    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.find(text.as_bytes())
    }

    /// A [`StreamDecoder`] for text generated after a prompt.
    pub fn stream_decoder(&self, show_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, show_special)
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.ids.eot
    }
    pub fn unk(&self) -> Option<u32> {
        self.ids.unk
    }
    /// The model wants BOS in front of a prompt.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// The model wants EOS after a prompt.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// SentencePiece models that put a space in front of the text.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Whether generating `id` ends the turn: EOS, EOT, EOM and the
    /// end-of-turn markers llama.cpp recognises (`<|im_end|>`,
    /// `<end_of_turn>`, `<|eot_id|>`, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Every token that ends a turn (see [`is_end_of_generation`](Self::is_end_of_generation)), in id order.
    pub fn end_of_generation_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// Control tokens (hidden when decoding unless asked).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.has_attr(id, attr::CONTROL)
    }

    /// Tokens added to the trained vocabulary: control and user-defined
    /// ones (a chat format's markers: `<|im_end|>`, `<think>`, `<tool_call>`).
    pub fn is_added(&self, id: u32) -> bool {
        self.vocab.has_attr(id, attr::CONTROL | attr::USER_DEFINED)
    }

    /// The first way `other`'s vocabulary differs from this one (the token
    /// count, then each token's text and type in id order), or `None` when
    /// they are the same (a draft model must be: `session/draft.rs`).
    pub fn first_difference(&self, other: &Tokenizer) -> Option<String> {
        let (a, b) = (&self.vocab, &other.vocab);
        if a.len() != b.len() {
            return Some(format!("{} tokens, not {}", b.len(), a.len()));
        }
        (0..a.len() as u32).find_map(|id| {
            let (ta, tb) = (a.text(id), b.text(id));
            if ta != tb {
                Some(format!("token {id} is {:?}, not {:?}", String::from_utf8_lossy(tb), String::from_utf8_lossy(ta)))
            } else if a.attr(id) != b.attr(id) {
                Some(format!(
                    "token {id} ({:?}) has attributes {:#x}, not {:#x}",
                    String::from_utf8_lossy(ta),
                    b.attr(id),
                    a.attr(id)
                ))
            } else {
                None
            }
        })
    }
}

/// SentencePiece's whitespace escape: ' ' -> '▁'.
fn escape_spaces(text: &str, out: &mut String) {
    let mut rest = text;
    while let Some(p) = rest.find(' ') {
        out.push_str(&rest[..p]);
        out.push('▁');
        rest = &rest[p + 1..];
    }
    out.push_str(rest);
}

fn set_attr_by_text(vocab: &mut Vocab, text: &str, bits: u16, on: bool) {
    if let Some(id) = vocab.find(text.as_bytes()) {
        let a = &mut vocab.attrs[id as usize];
        *a = if on { *a | bits } else { *a & !bits };
    }
}
