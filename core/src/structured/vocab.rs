//! A model's vocabulary as the constraint engine sees it: every token's
//! bytes in a trie (llguidance's `TokTrie`), control tokens apart (marked,
//! so no grammar text can produce them by accident), and the tokens that end
//! a turn as the grammar's end of text.

use std::sync::Arc;

use llguidance::api::ParserLimits;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Compiles constraints for one vocabulary. Built once per model (the trie
/// over a 262k vocabulary takes tens of milliseconds) and shared by its sessions.
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("n_vocab", &self.factory.tok_env().tok_trie().vocab_size()).finish()
    }
}

impl Grammars {
    /// The engine for `tok`'s vocabulary.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Grammars> {
        let n = tok.n_vocab();
        let eog: Vec<TokenId> = tok.end_of_generation_tokens().collect();
        let Some(&first_eog) = eog.first() else {
            return Err(Error::InvalidArgument("the vocabulary has no end-of-generation token".into()));
        };
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let piece = tok.token_piece(id);
                if tok.is_control(id) || eog.contains(&id) {
                    // Reachable only by name (`<|im_end|>` in a grammar) or as end of text.
                    let mut w = Vec::with_capacity(piece.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(piece);
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: first_eog,
            tok_bos: tok.bos(),
            tok_pad: None,
            tok_unk: tok.unk(),
            tok_end_of_turn: tok.eot(),
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        // The engine tokenises forced text with the model's own tokenizer.
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars { factory })
    }

    /// Tokens spelling exactly `bytes` (the model's tokenizer where it
    /// reproduces them, else the longest tokens first).
    pub fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.factory.tok_env().tokenize_bytes(bytes)
    }

    pub(crate) fn factory(&self) -> &ParserFactory {
        &self.factory
    }
}

/// Bounds on what one constraint may cost: compile fuel, lexer states and
/// grammar size (a pathological schema or regex is refused, never a hang).
fn limits() -> ParserLimits {
    ParserLimits {
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 200_000,
        max_lexer_states: 100_000,
        max_grammar_size: 200_000,
        step_max_items: 50_000,
        max_items_in_row: 2000,
        precompute_large_lexemes: true,
        verbose_errors: false,
    }
}

/// Text to tokens for forced (fast-forwarded) text: the model's tokenizer
/// where it reproduces the bytes exactly, else the trie's greedy split.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if let Ok(text) = std::str::from_utf8(s) {
            if let Ok(ids) = self.tok.encode(text, false, false) {
                let same = ids.iter().flat_map(|&i| self.trie.token(i).iter().copied()).eq(s.iter().copied());
                if same {
                    return ids;
                }
            }
        }
        self.trie.greedy_tokenize(s)
    }
}
