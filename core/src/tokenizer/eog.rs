//! End-of-generation tokens, found as llama.cpp finds them: by id keys when
//! the file has them, else by well-known texts (`<|im_end|>`,
//! `<end_of_turn>`, ...). Tokens that end generation become control tokens.

use std::collections::BTreeSet;

use super::vocab::{attr, Vocab};
use super::SpecialIds;

/// End-of-turn markers found by text, as llama.cpp (`llama-vocab.cpp`):
/// the first of each list fills its id when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Every token with one of these texts ends generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Find the end-of-generation tokens and make sure each is a control token
/// (llama.cpp overrides the type of "control-looking" tokens).
pub(crate) fn mark_end_of_generation(vocab: &mut Vocab, ids: &mut SpecialIds) -> BTreeSet<u32> {
    let control = |vocab: &mut Vocab, id: u32| vocab.attrs[id as usize] |= attr::CONTROL;
    let lists: [(&[&str], &mut Option<u32>); 8] = [
        (EOT_TEXTS, &mut ids.eot),
        (&["<|eom_id|>"], &mut ids.eom),
        (FIM_PRE_TEXTS, &mut ids.fim_pre),
        (FIM_SUF_TEXTS, &mut ids.fim_suf),
        (FIM_MID_TEXTS, &mut ids.fim_mid),
        (FIM_PAD_TEXTS, &mut ids.fim_pad),
        (FIM_REP_TEXTS, &mut ids.fim_rep),
        (FIM_SEP_TEXTS, &mut ids.fim_sep),
    ];
    for (texts, slot) in lists {
        if slot.is_none() {
            // The lowest id among the candidates (llama.cpp takes whichever
            // its hash map yields first).
            if let Some(id) = texts.iter().filter_map(|t| vocab.find(t.as_bytes())).min() {
                *slot = Some(id);
                control(vocab, id);
            }
        }
    }
    // Control tokens named "unused" are unused.
    for id in 0..vocab.len() as u32 {
        if vocab.has_attr(id, attr::CONTROL) && vocab.text(id).windows(6).any(|w| w == b"unused") {
            vocab.attrs[id as usize] |= attr::UNUSED;
        }
    }
    let mut eog: BTreeSet<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep].into_iter().flatten().collect();
    for t in EOG_TEXTS {
        if let Some(id) = vocab.find(t.as_bytes()) {
            eog.insert(id);
            control(vocab, id);
        }
    }
    // gpt-oss: these render as text.
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = vocab.find(t.as_bytes()) {
            vocab.attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    // With <|return|> and <|call|> (gpt-oss) or <|calls|> and <|flush|>
    // (solar-open), <|end|> only ends a message, not the generation.
    let in_eog = |t: &str| vocab.find(t.as_bytes()).filter(|id| eog.contains(id));
    let has = |t: &str| in_eog(t).is_some();
    let has_call = has("<|call|>") || has("<|calls|>");
    let end = in_eog("<|end|>").filter(|_| has_call && (has("<|return|>") || has("<|flush|>")));
    // Gemma 4 and PLaMo 2 have a normal "</s>".
    let s = in_eog("</s>").filter(|_| has("<|tool_response>") || has("<|plamo:eos|>"));
    if let Some(end) = end {
        eog.remove(&end);
        vocab.attrs[end as usize] = attr::USER_DEFINED;
    }
    if let Some(s) = s {
        eog.remove(&s);
        vocab.attrs[s as usize] = attr::NORMAL;
    }
    eog
}
