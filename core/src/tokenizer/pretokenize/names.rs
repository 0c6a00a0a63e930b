//! Every `tokenizer.ggml.pre` name llama.cpp accepts, with the rule and the
//! tokenizer flags it sets for that name (`llama_vocab::impl::load`, the
//! chain of name comparisons for BPE vocabularies).

use super::rules::PreType;

/// What a name sets besides its rule. llama.cpp's BPE defaults are all off
/// except `clean_spaces`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NameFlags {
    /// Whole words that are tokens skip the merges.
    pub ignore_merges: bool,
    /// Detokenizing removes spaces before punctuation.
    pub clean_spaces: bool,
    /// BOS is added unless the file says otherwise.
    pub add_bos: bool,
    /// The model has no BOS by default (`special_bos_id = LLAMA_TOKEN_NULL`).
    pub no_bos: bool,
    /// Spaces become `▁` before splitting (SentencePiece-shaped BPE).
    pub escape_whitespaces: bool,
}

const BASE: NameFlags =
    NameFlags { ignore_merges: false, clean_spaces: true, add_bos: false, no_bos: false, escape_whitespaces: false };
/// Most newer names turn `clean_spaces` off.
const RAW: NameFlags = NameFlags { clean_spaces: false, ..BASE };
const RAW_IM: NameFlags = NameFlags { ignore_merges: true, ..RAW };
const IM_BOS: NameFlags = NameFlags { ignore_merges: true, add_bos: true, ..BASE };
const NO_BOS: NameFlags = NameFlags { no_bos: true, ..BASE };
const ESCAPE: NameFlags = NameFlags { escape_whitespaces: true, ..BASE };

type Entry = (&'static [&'static str], PreType, NameFlags);

/// In llama.cpp's order. A name listed twice there (`jina-v1-en`) takes the
/// first match, as its `if` chain does.
const NAMES: &[Entry] = &[
    (&["", "default"], PreType::Default, BASE),
    (&["minicpm5"], PreType::Minicpm5, NameFlags { ignore_merges: true, ..BASE }),
    (
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
        PreType::Llama3,
        IM_BOS,
    ),
    (&["deepseek-llm"], PreType::DeepseekLlm, RAW),
    (&["deepseek-coder"], PreType::DeepseekCoder, RAW),
    (&["deepseek-v3"], PreType::Deepseek3Llm, RAW),
    (&["spark2_5"], PreType::Spark25, RAW),
    (&["youtu"], PreType::Youtu, RAW_IM),
    (&["falcon"], PreType::Falcon, BASE),
    (&["mpt"], PreType::Mpt, BASE),
    (&["starcoder"], PreType::Starcoder, BASE),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
        ],
        PreType::Gpt2,
        BASE,
    ),
    (&["jais-2"], PreType::Jais2, BASE),
    (&["gemma4", "granite-embed-multi-311m"], PreType::Gemma4, ESCAPE),
    (&["sarvam-moe"], PreType::SarvamMoe, NameFlags { clean_spaces: false, ..ESCAPE }),
    // These also set `add_sep`, which only matters for embedding models'
    // special tokens (not modelled here).
    (&["jina-v1-en", "jina-v2-code", "roberta-bpe"], PreType::Gpt2, BASE),
    (&["whitespace"], PreType::Whitespace, BASE),
    (&["refact"], PreType::Refact, BASE),
    (&["command-r"], PreType::CommandR, RAW),
    (&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], PreType::Qwen2, RAW),
    (&["qwen35"], PreType::Qwen35, RAW),
    (&["stablelm2"], PreType::Stablelm2, BASE),
    (&["olmo"], PreType::Olmo, BASE),
    (&["dbrx"], PreType::Dbrx, BASE),
    (&["smaug-bpe"], PreType::Smaug, BASE),
    (&["poro-chat"], PreType::Poro, RAW),
    (&["chatglm-bpe"], PreType::Chatglm4, NO_BOS),
    (&["glm4", "glm5"], PreType::Chatglm4, NameFlags { ignore_merges: true, ..NO_BOS }),
    (&["viking"], PreType::Viking, RAW),
    (&["jais"], PreType::Jais, BASE),
    (&["tekken"], PreType::Tekken, NameFlags { clean_spaces: false, ..IM_BOS }),
    (&["smollm"], PreType::Smollm, RAW),
    (&["codeshell"], PreType::Codeshell, BASE),
    (&["bloom"], PreType::Bloom, BASE),
    (&["gpt3-finnish"], PreType::Gpt3Finnish, BASE),
    (&["exaone"], PreType::Exaone, BASE),
    (&["exaone4"], PreType::Gpt2, BASE),
    (&["exaone-moe"], PreType::ExaoneMoe, BASE),
    (&["chameleon"], PreType::Chameleon, NameFlags { add_bos: true, ..RAW }),
    (&["minerva-7b"], PreType::Minerva, BASE),
    (&["megrez"], PreType::Qwen2, BASE),
    (&["gpt-4o", "llama4", "kanana2", "talkie"], PreType::Gpt4o, RAW),
    (&["granite-embed-multi-97m"], PreType::GraniteEmbMulti, RAW_IM),
    (&["tiny_aya", "cohere2moe"], PreType::TinyAya, RAW),
    (&["superbpe"], PreType::Superbpe, RAW),
    (&["trillion"], PreType::Trillion, RAW),
    (&["granite-docling"], PreType::GraniteDocling, RAW),
    (&["bailingmoe", "bailingmoe2", "llada-moe"], PreType::Bailingmoe, RAW),
    (&["seed-coder"], PreType::SeedCoder, RAW),
    (&["hunyuan"], PreType::Hunyuan, RAW),
    (&["hunyuan-dense"], PreType::HunyuanDense, RAW),
    (&["hy_v4"], PreType::HyV4, RAW),
    (&["joyai-llm"], PreType::JoyaiLlm, RAW),
    (&["kimi-k2"], PreType::KimiK2, RAW),
    (&["ufakzeka"], PreType::Ufakzeka, RAW),
    (&["grok-2"], PreType::Grok2, RAW),
    (&["afmoe"], PreType::Afmoe, RAW),
    (&["laguna"], PreType::Laguna, RAW),
    (&["minimax-m2"], PreType::MinimaxM2, RAW),
    (&["solar-open"], PreType::SolarOpen, RAW),
    (&["mellum2"], PreType::Mellum2, BASE),
];

/// The rule and flags of a name; `None` for a name llama.cpp refuses.
pub(crate) fn lookup(name: &str) -> Option<(PreType, NameFlags)> {
    NAMES.iter().find(|e| e.0.contains(&name)).map(|&(_, t, f)| (t, f))
}

/// Every accepted name.
#[cfg(test)]
pub(crate) fn all_names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().flat_map(|e| e.0.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_llama_cpp() {
        assert_eq!(lookup("llama-bpe"), Some((PreType::Llama3, IM_BOS)));
        assert_eq!(lookup("smollm"), Some((PreType::Smollm, RAW)));
        assert_eq!(lookup("megrez").map(|e| e.1.clean_spaces), Some(true));
        assert_eq!(lookup("glm4").map(|e| (e.1.no_bos, e.1.ignore_merges)), Some((true, true)));
        assert_eq!(lookup(""), Some((PreType::Default, BASE)));
        assert_eq!(lookup("Qwen2"), None);
        assert_eq!(lookup("no-such-pre"), None);
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = all_names().collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        // llama.cpp 0c1e570 names 91, plus the empty name it treats as "default".
        assert_eq!(n, 92);
    }
}
