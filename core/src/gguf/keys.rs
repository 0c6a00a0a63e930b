//! The one table of GGUF metadata keys and tensor names.
//!
//! Model code never spells a key or tensor name: it asks for a [`Key`] (with
//! the architecture filled in) or a [`TensorKind`] (with the layer filled in).
//! Names follow llama.cpp's converter, so files people already have load.

/// Architectures this engine knows by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama family, including Mixtral-style MoE (`ffn_*_exps`).
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    /// Qwen3.5 MoE: Gated DeltaNet layers interleaved with gated attention.
    Qwen35Moe,
    Gemma3,
    /// Gemma 4: sliding and global attention of different head sizes, MoE
    /// beside a dense MLP (26B-A4B), per-layer embeddings and shared KV (E models).
    Gemma4,
    /// DeepSeek-V2/V3 (and Moonlight, GLM-4.7-Flash): Multi-head Latent
    /// Attention over a compressed KV cache, group-limited MoE routing.
    Deepseek2,
    /// Granite 4.0-H: Mamba2 layers beside attention without positions,
    /// MoE with a shared expert, Granite's multipliers.
    GraniteHybrid,
    /// LFM2-MoE: gated short-convolution layers beside GQA attention,
    /// leading dense layers, then MoE with a selection-biased sigmoid router.
    Lfm2Moe,
    /// gpt-oss: sliding-window attention alternating with full attention,
    /// with per-head sinks and biases; MoE with a biased router, softmax
    /// over the chosen experts, biased experts and a clamped SwiGLU.
    GptOss,
    /// OLMoE: a Llama-shaped MoE with q/k RMS norms over the whole
    /// projections and an unnormalised softmax top-k router.
    Olmoe,
    /// ERNIE-4.5-MoE: leading dense layers, then (every
    /// `interleave_moe_layer_step`) a softmax MoE with a selection bias
    /// beside a shared expert.
    Ernie45Moe,
}

const ARCHES: &[(Arch, &str)] = &[
    (Arch::Llama, "llama"),
    (Arch::Qwen2, "qwen2"),
    (Arch::Qwen3, "qwen3"),
    (Arch::Qwen3Moe, "qwen3moe"),
    (Arch::Qwen35Moe, "qwen35moe"),
    (Arch::Gemma3, "gemma3"),
    (Arch::Gemma4, "gemma4"),
    (Arch::Deepseek2, "deepseek2"),
    (Arch::GraniteHybrid, "granitehybrid"),
    (Arch::Lfm2Moe, "lfm2moe"),
    (Arch::GptOss, "gpt-oss"),
    (Arch::Olmoe, "olmoe"),
    (Arch::Ernie45Moe, "ernie4_5-moe"),
];

impl Arch {
    /// Every architecture the engine runs.
    pub fn all() -> impl Iterator<Item = Arch> {
        ARCHES.iter().map(|a| a.0)
    }

    pub fn from_name(name: &str) -> Option<Arch> {
        ARCHES.iter().find(|a| a.1 == name).map(|a| a.0)
    }

    /// The value of `general.architecture` and the prefix of its keys.
    pub fn name(self) -> &'static str {
        ARCHES.iter().find(|a| a.0 == self).map_or("", |a| a.1)
    }

    /// The tensors a file of this architecture may hold (per layer where the
    /// pattern has a layer).
    pub fn tensors(self) -> &'static [TensorKind] {
        use TensorKind::*;
        match self {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => &[
                TokenEmbd,
                OutputNorm,
                Output,
                RopeFreqs,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnQNorm,
                AttnKNorm,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnGateInp,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
            ],
            Arch::Gemma3 => &[
                TokenEmbd,
                OutputNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnQNorm,
                AttnKNorm,
                AttnPostNorm,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnPostNorm,
            ],
            Arch::Gemma4 => &[
                TokenEmbd,
                OutputNorm,
                Output,
                RopeFreqs,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnQNorm,
                AttnKNorm,
                AttnPostNorm,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnPostNorm,
                FfnGateInp,
                FfnGateUpExps,
                FfnDownExps,
                FfnPreNorm2,
                FfnPostNorm1,
                FfnPostNorm2,
                LayerOutScale,
                PerLayerTokenEmbd,
                PerLayerModelProj,
                PerLayerProjNorm,
                PerLayerInpGate,
                PerLayerProj,
                PerLayerPostNorm,
            ],
            Arch::Deepseek2 => &[
                TokenEmbd,
                OutputNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnQA,
                AttnQANorm,
                AttnQB,
                AttnKvAMqa,
                AttnKvANorm,
                AttnKB,
                AttnVB,
                AttnOut,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnGateInp,
                FfnExpProbsB,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
                FfnGateShexp,
                FfnUpShexp,
                FfnDownShexp,
            ],
            Arch::Qwen35Moe => &[
                TokenEmbd,
                OutputNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnQNorm,
                AttnKNorm,
                AttnPostNorm,
                AttnQkv,
                AttnGate,
                SsmA,
                SsmConv1d,
                SsmDt,
                SsmAlpha,
                SsmBeta,
                SsmBetaAlpha,
                SsmNorm,
                SsmOut,
                FfnGateInp,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
                FfnGateInpShexp,
                FfnGateShexp,
                FfnUpShexp,
                FfnDownShexp,
            ],
            Arch::GraniteHybrid => &[
                TokenEmbd,
                OutputNorm,
                Output,
                RopeFreqs,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnGateInp,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
                FfnGateShexp,
                FfnUpShexp,
                FfnDownShexp,
                SsmIn,
                SsmConv1d,
                SsmDt,
                SsmA,
                SsmD,
                SsmNorm,
                SsmOut,
            ],
            Arch::Lfm2Moe => &[
                TokenEmbd,
                TokenEmbdNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnQNorm,
                AttnKNorm,
                ShortConvConv,
                ShortConvInProj,
                ShortConvOutProj,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnGateInp,
                FfnExpProbsB,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
            ],
            Arch::GptOss => &[
                TokenEmbd,
                OutputNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnSinks,
                AttnPostNorm,
                FfnGateInp,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
            ],
            Arch::Olmoe => &[
                TokenEmbd,
                OutputNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                AttnQNorm,
                AttnKNorm,
                FfnNorm,
                FfnGateInp,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
            ],
            Arch::Ernie45Moe => &[
                TokenEmbd,
                OutputNorm,
                Output,
                AttnNorm,
                AttnQ,
                AttnK,
                AttnV,
                AttnOut,
                FfnNorm,
                FfnGate,
                FfnUp,
                FfnDown,
                FfnGateInp,
                FfnExpProbsB,
                FfnGateExps,
                FfnUpExps,
                FfnDownExps,
                FfnGateShexp,
                FfnUpShexp,
                FfnDownShexp,
            ],
        }
    }
}

/// Metadata keys. Names containing `{arch}` are per architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    GeneralArchitecture,
    GeneralName,
    GeneralAlignment,
    GeneralFileType,
    GeneralQuantizationVersion,
    GeneralSizeLabel,

    VocabSize,
    ContextLength,
    EmbeddingLength,
    BlockCount,
    FeedForwardLength,
    ExpertFeedForwardLength,
    ExpertSharedFeedForwardLength,
    ExpertCount,
    ExpertUsedCount,
    ExpertSharedCount,
    ExpertWeightsScale,
    ExpertWeightsNorm,
    ExpertGatingFunc,
    /// Experts fall into this many groups; a token's experts come from the
    /// best `ExpertGroupUsedCount` of them (DeepSeek-V3; 0 or 1 = no groups).
    ExpertGroupCount,
    ExpertGroupUsedCount,
    /// The first N layers have a dense FFN instead of experts.
    LeadingDenseBlockCount,
    /// Every Nth layer (after the leading dense ones) is a MoE layer (ERNIE-4.5).
    InterleaveMoeLayerStep,
    NextnPredictLayers,
    FullAttentionInterval,
    AttnLogitSoftcapping,
    FinalLogitSoftcapping,
    EmbeddingScale,
    /// Granite: a block's output is scaled by this before it joins the residual.
    ResidualScale,
    /// Granite: the logits are divided by this.
    LogitScale,
    /// Width of the per-layer input embeddings (Gemma 4 E models; 0 = none).
    EmbeddingLengthPerLayer,

    HeadCount,
    HeadCountKv,
    KeyLength,
    ValueLength,
    /// Head sizes of sliding-window layers when they differ (Gemma 4).
    KeyLengthSwa,
    ValueLengthSwa,
    /// The last N layers read an earlier layer's KV cache (Gemma 4 E models).
    SharedKvLayers,
    LayerNormRmsEpsilon,
    SlidingWindow,
    SlidingWindowPattern,
    AttentionScale,
    RecurrentLayers,
    /// Multi-head Latent Attention: the query and key-value compression
    /// ranks, and the per-head key/value sizes of the decompressed heads.
    QLoraRank,
    KvLoraRank,
    KeyLengthMla,
    ValueLengthMla,

    RopeDimensionCount,
    RopeDimensionCountSwa,
    RopeDimensionSections,
    RopeFreqBase,
    RopeFreqBaseSwa,
    RopeScaleLinear,
    RopeScalingType,
    RopeScalingFactor,
    RopeScalingOrigCtxLen,
    RopeScalingAttnFactor,
    RopeScalingYarnBetaFast,
    RopeScalingYarnBetaSlow,
    /// DeepSeek's `mscale_all_dim`, times 0.1 as the converter writes it.
    RopeScalingYarnLogMultiplier,
    /// Granite: false turns RoPE off (attention without positions).
    RopeScalingFinetuned,

    SsmConvKernel,
    SsmInnerSize,
    SsmStateSize,
    SsmTimeStepRank,
    SsmGroupCount,
    /// Taps of LFM2's short convolution (the window is one less).
    ShortConvLCache,

    TokenizerModel,
    TokenizerPre,
    TokenizerTokens,
    TokenizerTokenType,
    TokenizerScores,
    TokenizerMerges,
    TokenizerBosId,
    TokenizerEosId,
    TokenizerEotId,
    TokenizerEomId,
    TokenizerUnkId,
    TokenizerSepId,
    TokenizerPadId,
    TokenizerMaskId,
    TokenizerFimPreId,
    TokenizerFimSufId,
    TokenizerFimMidId,
    TokenizerFimPadId,
    TokenizerFimRepId,
    TokenizerFimSepId,
    TokenizerAddBos,
    TokenizerAddEos,
    TokenizerAddSpacePrefix,
    TokenizerRemoveExtraWhitespaces,
    TokenizerNormalizerLowercase,
    TokenizerNormalizerStripAccents,
    TokenizerPrecompiledCharsmap,
    TokenizerChatTemplate,
}

impl Key {
    /// The key's name; `{arch}` stands for the architecture prefix.
    pub const fn name(self) -> &'static str {
        use Key::*;
        match self {
            GeneralArchitecture => "general.architecture",
            GeneralName => "general.name",
            GeneralAlignment => "general.alignment",
            GeneralFileType => "general.file_type",
            GeneralQuantizationVersion => "general.quantization_version",
            GeneralSizeLabel => "general.size_label",

            VocabSize => "{arch}.vocab_size",
            ContextLength => "{arch}.context_length",
            EmbeddingLength => "{arch}.embedding_length",
            BlockCount => "{arch}.block_count",
            FeedForwardLength => "{arch}.feed_forward_length",
            ExpertFeedForwardLength => "{arch}.expert_feed_forward_length",
            ExpertSharedFeedForwardLength => "{arch}.expert_shared_feed_forward_length",
            ExpertCount => "{arch}.expert_count",
            ExpertUsedCount => "{arch}.expert_used_count",
            ExpertSharedCount => "{arch}.expert_shared_count",
            ExpertWeightsScale => "{arch}.expert_weights_scale",
            ExpertWeightsNorm => "{arch}.expert_weights_norm",
            ExpertGatingFunc => "{arch}.expert_gating_func",
            ExpertGroupCount => "{arch}.expert_group_count",
            ExpertGroupUsedCount => "{arch}.expert_group_used_count",
            LeadingDenseBlockCount => "{arch}.leading_dense_block_count",
            InterleaveMoeLayerStep => "{arch}.interleave_moe_layer_step",
            NextnPredictLayers => "{arch}.nextn_predict_layers",
            FullAttentionInterval => "{arch}.full_attention_interval",
            AttnLogitSoftcapping => "{arch}.attn_logit_softcapping",
            FinalLogitSoftcapping => "{arch}.final_logit_softcapping",
            EmbeddingScale => "{arch}.embedding_scale",
            ResidualScale => "{arch}.residual_scale",
            LogitScale => "{arch}.logit_scale",
            EmbeddingLengthPerLayer => "{arch}.embedding_length_per_layer_input",

            HeadCount => "{arch}.attention.head_count",
            HeadCountKv => "{arch}.attention.head_count_kv",
            KeyLength => "{arch}.attention.key_length",
            ValueLength => "{arch}.attention.value_length",
            KeyLengthSwa => "{arch}.attention.key_length_swa",
            ValueLengthSwa => "{arch}.attention.value_length_swa",
            SharedKvLayers => "{arch}.attention.shared_kv_layers",
            LayerNormRmsEpsilon => "{arch}.attention.layer_norm_rms_epsilon",
            SlidingWindow => "{arch}.attention.sliding_window",
            SlidingWindowPattern => "{arch}.attention.sliding_window_pattern",
            AttentionScale => "{arch}.attention.scale",
            RecurrentLayers => "{arch}.attention.recurrent_layers",
            QLoraRank => "{arch}.attention.q_lora_rank",
            KvLoraRank => "{arch}.attention.kv_lora_rank",
            KeyLengthMla => "{arch}.attention.key_length_mla",
            ValueLengthMla => "{arch}.attention.value_length_mla",

            RopeDimensionCount => "{arch}.rope.dimension_count",
            RopeDimensionCountSwa => "{arch}.rope.dimension_count_swa",
            RopeDimensionSections => "{arch}.rope.dimension_sections",
            RopeFreqBase => "{arch}.rope.freq_base",
            RopeFreqBaseSwa => "{arch}.rope.freq_base_swa",
            RopeScaleLinear => "{arch}.rope.scale_linear",
            RopeScalingType => "{arch}.rope.scaling.type",
            RopeScalingFactor => "{arch}.rope.scaling.factor",
            RopeScalingOrigCtxLen => "{arch}.rope.scaling.original_context_length",
            RopeScalingAttnFactor => "{arch}.rope.scaling.attn_factor",
            RopeScalingYarnBetaFast => "{arch}.rope.scaling.yarn_beta_fast",
            RopeScalingYarnBetaSlow => "{arch}.rope.scaling.yarn_beta_slow",
            RopeScalingYarnLogMultiplier => "{arch}.rope.scaling.yarn_log_multiplier",
            RopeScalingFinetuned => "{arch}.rope.scaling.finetuned",

            SsmConvKernel => "{arch}.ssm.conv_kernel",
            SsmInnerSize => "{arch}.ssm.inner_size",
            SsmStateSize => "{arch}.ssm.state_size",
            SsmTimeStepRank => "{arch}.ssm.time_step_rank",
            SsmGroupCount => "{arch}.ssm.group_count",
            ShortConvLCache => "{arch}.shortconv.l_cache",

            TokenizerModel => "tokenizer.ggml.model",
            TokenizerPre => "tokenizer.ggml.pre",
            TokenizerTokens => "tokenizer.ggml.tokens",
            TokenizerTokenType => "tokenizer.ggml.token_type",
            TokenizerScores => "tokenizer.ggml.scores",
            TokenizerMerges => "tokenizer.ggml.merges",
            TokenizerBosId => "tokenizer.ggml.bos_token_id",
            TokenizerEosId => "tokenizer.ggml.eos_token_id",
            TokenizerEotId => "tokenizer.ggml.eot_token_id",
            TokenizerEomId => "tokenizer.ggml.eom_token_id",
            TokenizerUnkId => "tokenizer.ggml.unknown_token_id",
            TokenizerSepId => "tokenizer.ggml.seperator_token_id",
            TokenizerPadId => "tokenizer.ggml.padding_token_id",
            TokenizerMaskId => "tokenizer.ggml.mask_token_id",
            TokenizerFimPreId => "tokenizer.ggml.fim_pre_token_id",
            TokenizerFimSufId => "tokenizer.ggml.fim_suf_token_id",
            TokenizerFimMidId => "tokenizer.ggml.fim_mid_token_id",
            TokenizerFimPadId => "tokenizer.ggml.fim_pad_token_id",
            TokenizerFimRepId => "tokenizer.ggml.fim_rep_token_id",
            TokenizerFimSepId => "tokenizer.ggml.fim_sep_token_id",
            TokenizerAddBos => "tokenizer.ggml.add_bos_token",
            TokenizerAddEos => "tokenizer.ggml.add_eos_token",
            TokenizerAddSpacePrefix => "tokenizer.ggml.add_space_prefix",
            TokenizerRemoveExtraWhitespaces => "tokenizer.ggml.remove_extra_whitespaces",
            TokenizerNormalizerLowercase => "tokenizer.ggml.normalizer.lowercase",
            TokenizerNormalizerStripAccents => "tokenizer.ggml.normalizer.strip_accents",
            TokenizerPrecompiledCharsmap => "tokenizer.ggml.precompiled_charsmap",
            TokenizerChatTemplate => "tokenizer.chat_template",
        }
    }

    /// The full key for an architecture (e.g. `qwen3moe.block_count`).
    pub fn for_arch(self, arch: &str) -> String {
        self.name().replace("{arch}", arch)
    }
}

/// Kinds of tensors. Names containing `{layer}` repeat per layer; every kind
/// has a `.weight` tensor and some also a `.bias` (see [`TensorName`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorKind {
    TokenEmbd,
    OutputNorm,
    Output,
    RopeFreqs,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnQkv,
    AttnOut,
    AttnQNorm,
    AttnKNorm,
    AttnGate,
    AttnPostNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnPostNorm,
    FfnGateInp,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    FfnGateInpShexp,
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
    /// Routed experts' gate and up in one stack (gate rows first).
    FfnGateUpExps,
    FfnPreNorm2,
    FfnPostNorm1,
    FfnPostNorm2,
    /// A layer's output multiplier `[1]`.
    LayerOutScale,
    /// Per-layer input embeddings `[n_layer * n_embd_per_layer, n_vocab]`.
    PerLayerTokenEmbd,
    PerLayerModelProj,
    PerLayerProjNorm,
    PerLayerInpGate,
    PerLayerProj,
    PerLayerPostNorm,
    /// Multi-head Latent Attention: the query compression `[q_lora, n_embd]`
    /// and its norm, its decompression `[n_head*k_mla, q_lora]`; the joint KV
    /// compression with the rotary key `[kv_lora+rope, n_embd]` and its norm;
    /// per head, the key decompression `[kv_lora, nope]` and the value's `[v, kv_lora]`.
    AttnQA,
    AttnQANorm,
    AttnQB,
    AttnKvAMqa,
    AttnKvANorm,
    AttnKB,
    AttnVB,
    /// The router's selection bias `[n_expert]` (`exp_probs_b.bias`).
    FfnExpProbsB,
    SsmA,
    SsmConv1d,
    SsmDt,
    SsmAlpha,
    SsmBeta,
    SsmBetaAlpha,
    SsmNorm,
    SsmOut,
    /// Mamba2's input projection (z | xBC | dt).
    SsmIn,
    /// Mamba2's skip `D`, per head (stored without a suffix, as `ssm_a`).
    SsmD,
    /// LFM2's final norm (named after the embedding by its converter).
    TokenEmbdNorm,
    /// LFM2's short convolution: taps `[n_embd][l_cache]`, in/out projections.
    ShortConvConv,
    ShortConvInProj,
    ShortConvOutProj,
    /// gpt-oss's attention sinks: one extra logit per head `[n_head]`.
    AttnSinks,
    /// A multi-token-prediction (NextN) layer's own tensors: the projection
    /// `[2*n_embd] -> [n_embd]` over the normed embedding and hidden state,
    /// those two norms, and its optional embedding, head and head norm.
    NextnEhProj,
    NextnEnorm,
    NextnHnorm,
    NextnEmbedTokens,
    NextnSharedHeadHead,
    NextnSharedHeadNorm,
}

const TENSOR_PATTERNS: &[(TensorKind, &str)] = &[
    (TensorKind::TokenEmbd, "token_embd"),
    (TensorKind::OutputNorm, "output_norm"),
    (TensorKind::Output, "output"),
    (TensorKind::RopeFreqs, "rope_freqs"),
    (TensorKind::AttnNorm, "blk.{layer}.attn_norm"),
    (TensorKind::AttnQ, "blk.{layer}.attn_q"),
    (TensorKind::AttnK, "blk.{layer}.attn_k"),
    (TensorKind::AttnV, "blk.{layer}.attn_v"),
    (TensorKind::AttnQkv, "blk.{layer}.attn_qkv"),
    (TensorKind::AttnOut, "blk.{layer}.attn_output"),
    (TensorKind::AttnQNorm, "blk.{layer}.attn_q_norm"),
    (TensorKind::AttnKNorm, "blk.{layer}.attn_k_norm"),
    (TensorKind::AttnGate, "blk.{layer}.attn_gate"),
    (TensorKind::AttnPostNorm, "blk.{layer}.post_attention_norm"),
    (TensorKind::FfnNorm, "blk.{layer}.ffn_norm"),
    (TensorKind::FfnGate, "blk.{layer}.ffn_gate"),
    (TensorKind::FfnUp, "blk.{layer}.ffn_up"),
    (TensorKind::FfnDown, "blk.{layer}.ffn_down"),
    (TensorKind::FfnPostNorm, "blk.{layer}.post_ffw_norm"),
    (TensorKind::FfnGateInp, "blk.{layer}.ffn_gate_inp"),
    (TensorKind::FfnGateExps, "blk.{layer}.ffn_gate_exps"),
    (TensorKind::FfnUpExps, "blk.{layer}.ffn_up_exps"),
    (TensorKind::FfnDownExps, "blk.{layer}.ffn_down_exps"),
    (TensorKind::FfnGateInpShexp, "blk.{layer}.ffn_gate_inp_shexp"),
    (TensorKind::FfnGateShexp, "blk.{layer}.ffn_gate_shexp"),
    (TensorKind::FfnUpShexp, "blk.{layer}.ffn_up_shexp"),
    (TensorKind::FfnDownShexp, "blk.{layer}.ffn_down_shexp"),
    (TensorKind::FfnGateUpExps, "blk.{layer}.ffn_gate_up_exps"),
    (TensorKind::FfnPreNorm2, "blk.{layer}.pre_ffw_norm_2"),
    (TensorKind::FfnPostNorm1, "blk.{layer}.post_ffw_norm_1"),
    (TensorKind::FfnPostNorm2, "blk.{layer}.post_ffw_norm_2"),
    (TensorKind::LayerOutScale, "blk.{layer}.layer_output_scale"),
    (TensorKind::PerLayerTokenEmbd, "per_layer_token_embd"),
    (TensorKind::PerLayerModelProj, "per_layer_model_proj"),
    (TensorKind::PerLayerProjNorm, "per_layer_proj_norm"),
    (TensorKind::PerLayerInpGate, "blk.{layer}.inp_gate"),
    (TensorKind::PerLayerProj, "blk.{layer}.proj"),
    (TensorKind::PerLayerPostNorm, "blk.{layer}.post_norm"),
    (TensorKind::AttnQA, "blk.{layer}.attn_q_a"),
    (TensorKind::AttnQANorm, "blk.{layer}.attn_q_a_norm"),
    (TensorKind::AttnQB, "blk.{layer}.attn_q_b"),
    (TensorKind::AttnKvAMqa, "blk.{layer}.attn_kv_a_mqa"),
    (TensorKind::AttnKvANorm, "blk.{layer}.attn_kv_a_norm"),
    (TensorKind::AttnKB, "blk.{layer}.attn_k_b"),
    (TensorKind::AttnVB, "blk.{layer}.attn_v_b"),
    (TensorKind::FfnExpProbsB, "blk.{layer}.exp_probs_b"),
    (TensorKind::SsmA, "blk.{layer}.ssm_a"),
    (TensorKind::SsmConv1d, "blk.{layer}.ssm_conv1d"),
    (TensorKind::SsmDt, "blk.{layer}.ssm_dt"),
    (TensorKind::SsmAlpha, "blk.{layer}.ssm_alpha"),
    (TensorKind::SsmBeta, "blk.{layer}.ssm_beta"),
    (TensorKind::SsmBetaAlpha, "blk.{layer}.ssm_ba"),
    (TensorKind::SsmNorm, "blk.{layer}.ssm_norm"),
    (TensorKind::SsmOut, "blk.{layer}.ssm_out"),
    (TensorKind::SsmIn, "blk.{layer}.ssm_in"),
    (TensorKind::SsmD, "blk.{layer}.ssm_d"),
    (TensorKind::TokenEmbdNorm, "token_embd_norm"),
    (TensorKind::ShortConvConv, "blk.{layer}.shortconv.conv"),
    (TensorKind::ShortConvInProj, "blk.{layer}.shortconv.in_proj"),
    (TensorKind::ShortConvOutProj, "blk.{layer}.shortconv.out_proj"),
    (TensorKind::AttnSinks, "blk.{layer}.attn_sinks"),
    (TensorKind::NextnEhProj, "blk.{layer}.nextn.eh_proj"),
    (TensorKind::NextnEnorm, "blk.{layer}.nextn.enorm"),
    (TensorKind::NextnHnorm, "blk.{layer}.nextn.hnorm"),
    (TensorKind::NextnEmbedTokens, "blk.{layer}.nextn.embed_tokens"),
    (TensorKind::NextnSharedHeadHead, "blk.{layer}.nextn.shared_head_head"),
    (TensorKind::NextnSharedHeadNorm, "blk.{layer}.nextn.shared_head_norm"),
];

impl TensorKind {
    pub fn pattern(self) -> &'static str {
        TENSOR_PATTERNS.iter().find(|p| p.0 == self).map_or("", |p| p.1)
    }

    /// Routed-expert tensors (stacked 3-D, one slab per expert).
    pub fn is_routed_expert(self) -> bool {
        matches!(
            self,
            TensorKind::FfnGateExps | TensorKind::FfnUpExps | TensorKind::FfnDownExps | TensorKind::FfnGateUpExps
        )
    }

    /// The weight tensor of this kind in `layer` (ignored for global tensors).
    pub fn weight(self, layer: usize) -> String {
        self.name(layer, "weight")
    }

    /// The bias tensor of this kind in `layer`.
    pub fn bias(self, layer: usize) -> String {
        self.name(layer, "bias")
    }

    /// The scale tensor of this kind in `layer` (Gemma 4's router input
    /// scale `ffn_gate_inp.scale`, per-expert `ffn_down_exps.scale`).
    pub fn scale(self, layer: usize) -> String {
        self.name(layer, "scale")
    }

    fn name(self, layer: usize, suffix: &str) -> String {
        let p = self.pattern();
        let base = if p.contains("{layer}") { p.replace("{layer}", &layer.to_string()) } else { p.to_string() };
        if matches!(self, TensorKind::SsmA | TensorKind::SsmD) {
            // Stored without a suffix (`blk.N.ssm_a`, `blk.N.ssm_d`); a bias never exists.
            return base;
        }
        format!("{base}.{suffix}")
    }
}

/// `N` of a layer tensor's name `blk.N.*`; `None` for tensors outside the layers.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// A tensor name split into its kind, layer and suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorName<'a> {
    pub kind: TensorKind,
    pub layer: Option<usize>,
    pub suffix: &'a str,
}

impl<'a> TensorName<'a> {
    /// Classify a tensor name; `None` for names outside the table.
    pub fn parse(name: &'a str) -> Option<TensorName<'a>> {
        let (layer, rest) = match name.strip_prefix("blk.") {
            Some(r) => {
                let dot = r.find('.')?;
                (Some(r[..dot].parse::<usize>().ok()?), &r[dot + 1..])
            }
            None => (None, name),
        };
        let (stem, suffix) = match rest.rsplit_once('.') {
            Some((s, x)) if x == "weight" || x == "bias" || x == "scale" => (s, x),
            _ => (rest, ""),
        };
        TENSOR_PATTERNS.iter().find_map(|&(kind, p)| {
            let p_stem = match layer {
                Some(_) => p.strip_prefix("blk.{layer}.")?,
                None if p.contains("{layer}") => return None,
                None => p,
            };
            (p_stem == stem).then_some(TensorName { kind, layer, suffix })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &(kind, _) in TENSOR_PATTERNS {
            let n = kind.weight(7);
            let p = TensorName::parse(&n).unwrap_or_else(|| panic!("{n}"));
            assert_eq!(p.kind, kind);
        }
        assert_eq!(TensorKind::AttnQ.weight(3), "blk.3.attn_q.weight");
        assert_eq!(TensorKind::Output.weight(0), "output.weight");
        assert_eq!(TensorKind::SsmA.weight(1), "blk.1.ssm_a");
        assert_eq!(TensorKind::SsmD.weight(0), "blk.0.ssm_d");
        assert_eq!(TensorName::parse("blk.x.attn_q.weight"), None);
        assert_eq!(TensorName::parse("mystery.weight"), None);
        let p = TensorName::parse("blk.12.ffn_down_exps.weight").unwrap();
        assert_eq!((p.kind, p.layer, p.suffix), (TensorKind::FfnDownExps, Some(12), "weight"));
    }

    #[test]
    fn keys_fill_in_arch() {
        assert_eq!(Key::BlockCount.for_arch("qwen35moe"), "qwen35moe.block_count");
        assert_eq!(Key::TokenizerModel.for_arch("x"), "tokenizer.ggml.model");
        for a in ARCHES {
            assert_eq!(Arch::from_name(a.1), Some(a.0));
        }
    }
}
