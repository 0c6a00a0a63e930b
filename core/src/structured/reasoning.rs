//! Thinking formats: how a model opens and closes its thought. A marker is
//! matched as one token where the vocabulary has it as one, else as text
//! (small vocabularies spell `<think>` in several tokens).

use crate::tokenizer::Tokenizer;

/// Where harmony's thought begins.
const HARMONY_OPEN: &str = "<|channel|>analysis<|message|>";

/// A model's thought markers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThinkFormat {
    /// The markers' text, and their token where each is a single token.
    pub open: &'static str,
    pub close: &'static str,
    pub open_id: Option<u32>,
    pub close_id: Option<u32>,
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
        let single = |t: &str| tok.token_id(t).filter(|&id| tok.token_piece(id) == t.as_bytes());
        if super::harmony::is_harmony_template(template) {
            // gpt-oss: thinking is the analysis channel's message (`harmony_turn.rs` routes it).
            return Some(ThinkFormat {
                open: HARMONY_OPEN,
                close: "<|end|>",
                open_id: None,
                close_id: None,
                header: "",
                close_text: "<|end|>",
                empty: "<|channel|>analysis<|message|><|end|><|start|>assistant",
            });
        }
        if template.contains("<|channel>") && template.contains("<channel|>") {
            return Some(ThinkFormat {
                open: "<|channel>",
                close: "<channel|>",
                open_id: single("<|channel>"),
                close_id: single("<channel|>"),
                header: "thought\n",
                close_text: "<channel|>",
                empty: "<|channel>thought\n<channel|>",
            });
        }
        if template.contains("<think>") && template.contains("</think>") {
            return Some(ThinkFormat {
                open: "<think>",
                close: "</think>",
                open_id: single("<think>"),
                close_id: single("</think>"),
                header: "",
                close_text: "\n</think>\n\n",
                empty: "<think>\n\n</think>\n\n",
            });
        }
        None
    }

    /// gpt-oss's harmony: the thought is a message of its own.
    pub fn is_harmony(&self) -> bool {
        self.open == HARMONY_OPEN
    }

    /// Whether a rendered prompt leaves a thought open (the template opened
    /// it in its generation prompt).
    pub fn open_at_end(&self, text: &str) -> bool {
        match text.rfind(self.open) {
            Some(i) => !text[i..].contains(self.close),
            None => false,
        }
    }
}
