//! Thinking formats: how a model opens and closes its thought, found from
//! the vocabulary and the template (single tokens only: a marker spelled in
//! several tokens could not be told from text about it).

use crate::tokenizer::Tokenizer;

/// A model's thought markers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThinkFormat {
    /// The token that opens a thought and the one that closes it.
    pub open: u32,
    pub close: u32,
    /// Text the model writes right after the open marker that is not
    /// thinking (Gemma 4: `thought\n`, the channel's name).
    pub header: &'static str,
    /// What closes a thought that ran out of budget (tokenised with specials).
    pub close_text: &'static str,
    /// An empty thought, prefilled when thinking is off and the template
    /// has no `enable_thinking`.
    pub empty: &'static str,
}

impl ThinkFormat {
    /// The format of a model whose template is `template`, if it thinks.
    pub fn detect(tok: &Tokenizer, template: &str) -> Option<ThinkFormat> {
        let id = |t: &str| tok.token_id(t);
        if template.contains("<|channel>") {
            if let (Some(open), Some(close)) = (id("<|channel>"), id("<channel|>")) {
                return Some(ThinkFormat {
                    open,
                    close,
                    header: "thought\n",
                    close_text: "<channel|>",
                    empty: "<|channel>thought\n<channel|>",
                });
            }
        }
        if template.contains("<think>") {
            if let (Some(open), Some(close)) = (id("<think>"), id("</think>")) {
                return Some(ThinkFormat {
                    open,
                    close,
                    header: "",
                    close_text: "\n</think>\n\n",
                    empty: "<think>\n\n</think>\n\n",
                });
            }
        }
        None
    }

    /// Whether a rendered prompt leaves a thought open (the template opened
    /// it in the generation prompt).
    pub fn open_at_end(&self, tok: &Tokenizer, prompt: &[u32]) -> bool {
        let _ = tok;
        match prompt.iter().rposition(|&t| t == self.open) {
            Some(i) => !prompt[i..].contains(&self.close),
            None => false,
        }
    }
}
