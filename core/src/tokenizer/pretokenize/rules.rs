//! llama.cpp's splitting rules: for each pre-tokenizer type, the patterns
//! its `llm_tokenizer_bpe` constructor applies in turn (`llama-vocab.cpp`),
//! each one splitting the pieces the one before produced.
//!
//! The patterns are kept verbatim because llama.cpp dispatches on the exact
//! text: a handful have hand-written splitters in its `unicode.cpp` (and in
//! [`super::custom`] here), selected by string equality; every other one runs
//! through `std::regex` (and [`super::regex`] here).

/// A pre-tokenizer type (`LLAMA_VOCAB_PRE_TYPE_*`): one splitting rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreType {
    /// `LLAMA_VOCAB_PRE_TYPE_DEFAULT`
    Default,
    /// `LLAMA_VOCAB_PRE_TYPE_LLAMA3`
    Llama3,
    /// `LLAMA_VOCAB_PRE_TYPE_JAIS2`
    Jais2,
    /// `LLAMA_VOCAB_PRE_TYPE_DBRX`
    Dbrx,
    /// `LLAMA_VOCAB_PRE_TYPE_SMAUG`
    Smaug,
    /// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM`
    DeepseekLlm,
    /// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM`
    Deepseek3Llm,
    /// `LLAMA_VOCAB_PRE_TYPE_HUNYUAN_DENSE`
    HunyuanDense,
    /// `LLAMA_VOCAB_PRE_TYPE_JOYAI_LLM`
    JoyaiLlm,
    /// `LLAMA_VOCAB_PRE_TYPE_HY_V4`
    HyV4,
    /// `LLAMA_VOCAB_PRE_TYPE_SPARK2_5`
    Spark25,
    /// `LLAMA_VOCAB_PRE_TYPE_YOUTU`
    Youtu,
    /// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_CODER`
    DeepseekCoder,
    /// `LLAMA_VOCAB_PRE_TYPE_FALCON`
    Falcon,
    /// `LLAMA_VOCAB_PRE_TYPE_STARCODER`
    Starcoder,
    /// `LLAMA_VOCAB_PRE_TYPE_REFACT`
    Refact,
    /// `LLAMA_VOCAB_PRE_TYPE_COMMAND_R`
    CommandR,
    /// `LLAMA_VOCAB_PRE_TYPE_SMOLLM`
    Smollm,
    /// `LLAMA_VOCAB_PRE_TYPE_CODESHELL`
    Codeshell,
    /// `LLAMA_VOCAB_PRE_TYPE_EXAONE`
    Exaone,
    /// `LLAMA_VOCAB_PRE_TYPE_MINERVA`
    Minerva,
    /// `LLAMA_VOCAB_PRE_TYPE_MELLUM2`
    Mellum2,
    /// `LLAMA_VOCAB_PRE_TYPE_GPT2`
    Gpt2,
    /// `LLAMA_VOCAB_PRE_TYPE_MPT`
    Mpt,
    /// `LLAMA_VOCAB_PRE_TYPE_OLMO`
    Olmo,
    /// `LLAMA_VOCAB_PRE_TYPE_JAIS`
    Jais,
    /// `LLAMA_VOCAB_PRE_TYPE_TRILLION`
    Trillion,
    /// `LLAMA_VOCAB_PRE_TYPE_GRANITE_DOCLING`
    GraniteDocling,
    /// `LLAMA_VOCAB_PRE_TYPE_STABLELM2`
    Stablelm2,
    /// `LLAMA_VOCAB_PRE_TYPE_QWEN2`
    Qwen2,
    /// `LLAMA_VOCAB_PRE_TYPE_HUNYUAN`
    Hunyuan,
    /// `LLAMA_VOCAB_PRE_TYPE_SOLAR_OPEN`
    SolarOpen,
    /// `LLAMA_VOCAB_PRE_TYPE_QWEN35`
    Qwen35,
    /// `LLAMA_VOCAB_PRE_TYPE_PORO`
    Poro,
    /// `LLAMA_VOCAB_PRE_TYPE_BLOOM`
    Bloom,
    /// `LLAMA_VOCAB_PRE_TYPE_GPT3_FINNISH`
    Gpt3Finnish,
    /// `LLAMA_VOCAB_PRE_TYPE_CHATGLM4`
    Chatglm4,
    /// `LLAMA_VOCAB_PRE_TYPE_VIKING`
    Viking,
    /// `LLAMA_VOCAB_PRE_TYPE_TEKKEN`
    Tekken,
    /// `LLAMA_VOCAB_PRE_TYPE_CHAMELEON`
    Chameleon,
    /// `LLAMA_VOCAB_PRE_TYPE_GPT4O`
    Gpt4o,
    /// `LLAMA_VOCAB_PRE_TYPE_MINIMAX_M2`
    MinimaxM2,
    /// `LLAMA_VOCAB_PRE_TYPE_GRANITE_EMB_MULTI`
    GraniteEmbMulti,
    /// `LLAMA_VOCAB_PRE_TYPE_TINY_AYA`
    TinyAya,
    /// `LLAMA_VOCAB_PRE_TYPE_KIMI_K2`
    KimiK2,
    /// `LLAMA_VOCAB_PRE_TYPE_SUPERBPE`
    Superbpe,
    /// `LLAMA_VOCAB_PRE_TYPE_BAILINGMOE`
    Bailingmoe,
    /// `LLAMA_VOCAB_PRE_TYPE_SEED_CODER`
    SeedCoder,
    /// `LLAMA_VOCAB_PRE_TYPE_UFAKZEKA`
    Ufakzeka,
    /// `LLAMA_VOCAB_PRE_TYPE_GROK_2`
    Grok2,
    /// `LLAMA_VOCAB_PRE_TYPE_AFMOE`
    Afmoe,
    /// `LLAMA_VOCAB_PRE_TYPE_LAGUNA`
    Laguna,
    /// `LLAMA_VOCAB_PRE_TYPE_EXAONE_MOE`
    ExaoneMoe,
    /// `LLAMA_VOCAB_PRE_TYPE_GEMMA4`
    Gemma4,
    /// `LLAMA_VOCAB_PRE_TYPE_SARVAM_MOE`
    SarvamMoe,
    /// `LLAMA_VOCAB_PRE_TYPE_MINICPM5`
    Minicpm5,
    /// `LLAMA_VOCAB_PRE_TYPE_WHITESPACE`
    Whitespace,
}

/// GPT-2's split pattern; llama.cpp runs its own hand-written splitter for it.
pub(super) const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
/// Llama 3's, Qwen2's and Qwen3.5's (case-insensitive contractions spelled
/// out, as llama.cpp rewrites them): hand-written splitters too.
pub(super) const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
pub(super) const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
pub(super) const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// The remaining patterns llama.cpp recognises by text and splits by hand.
pub(super) const NEWLINES: &str = "[^\\n]+|[\\n]+";
pub(super) const HAN: &str = "\\p{Han}+";
pub(super) const AFMOE_DIGITS: &str = "\\p{AFMoE_digits}";
pub(super) const TINY_AYA_DIGITS: &str = "\\d{1,3}(?=(?:\\d{3})*\\b)";

/// llama.cpp's fallback rule (no or "default" pre-tokenizer).
const DEFAULT: &[&str] = &["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"];

impl PreType {
    /// The patterns, applied in order.
    pub fn patterns(self) -> &'static [&'static str] {
        match self {
            PreType::Default => DEFAULT,
            PreType::Llama3 => &[LLAMA3],
            PreType::Jais2 => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
            ],
            PreType::Dbrx | PreType::Smaug => &[LLAMA3],
            PreType::DeepseekLlm => &[
                "[\r\n]",
                "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
                "\\s+$",
                "[一-龥ࠀ-一가-퟿]+",
                "\\p{N}+",
            ],
            PreType::Deepseek3Llm | PreType::HunyuanDense | PreType::JoyaiLlm | PreType::HyV4 => &[
                "\\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::Spark25 => &[
                "\\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
                "\\p{N}",
            ],
            PreType::Youtu => &[
                "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::DeepseekCoder => &["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"],
            PreType::Falcon => &["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"],
            PreType::Starcoder
            | PreType::Refact
            | PreType::CommandR
            | PreType::Smollm
            | PreType::Codeshell
            | PreType::Exaone
            | PreType::Minerva
            | PreType::Mellum2 => &["\\p{N}", GPT2],
            PreType::Gpt2
            | PreType::Mpt
            | PreType::Olmo
            | PreType::Jais
            | PreType::Trillion
            | PreType::GraniteDocling => &[GPT2],
            PreType::Stablelm2 | PreType::Qwen2 | PreType::Hunyuan | PreType::SolarOpen => &[QWEN2],
            PreType::Qwen35 => &[QWEN35],
            PreType::Poro | PreType::Bloom | PreType::Gpt3Finnish => &[" ?[^(\\s|.,!?…。，、।۔،)]+"],
            PreType::Chatglm4 => &[LLAMA3],
            PreType::Viking => &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"],
            PreType::Tekken => &[
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::Chameleon => &[
                "<sentinel:[0-9]+>",
                "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                "([\\t\\n]|    |  )",
                "\\p{N}",
                "[\\p{P}!-/:-@\\[-`{-~]",
                GPT2,
            ],
            PreType::Gpt4o | PreType::MinimaxM2 => &[
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::GraniteEmbMulti => &[
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::TinyAya => &[
                TINY_AYA_DIGITS,
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::KimiK2 => &[HAN],
            PreType::Superbpe => &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
            PreType::Bailingmoe => &[
                "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            ],
            PreType::SeedCoder => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::Ufakzeka => &[
                "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::Grok2 => &[QWEN2],
            PreType::Afmoe => &[
                AFMOE_DIGITS,
                "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::Laguna => &[NEWLINES, QWEN2],
            PreType::ExaoneMoe => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            ],
            PreType::Gemma4 => &[NEWLINES],
            PreType::SarvamMoe => &[NEWLINES],
            PreType::Minicpm5 => &[
                "\\p{N}{1,3}",
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreType::Whitespace => &["\\S+"],
        }
    }

    /// Whether words are GPT-2 byte-encoded before the merges. The
    /// SentencePiece-shaped BPE vocabularies keep raw UTF-8 (with `<0xXX>`
    /// byte tokens) instead.
    pub fn byte_encode(self) -> bool {
        !matches!(self, PreType::Gemma4 | PreType::SarvamMoe | PreType::Whitespace)
    }
}
