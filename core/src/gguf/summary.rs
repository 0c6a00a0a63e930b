//! What a GGUF file holds, in the terms an app developer asks about: size,
//! parameters, quantisation mix, experts, and the weight bytes one decoded
//! token must stream from memory.

use std::collections::BTreeMap;

use super::{Arch, GgufFile, Key, TensorKind, TensorName};
use crate::error::Result;
use crate::quant::GgmlType;

/// Tensors of one type: how many, how many bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypeTotals {
    pub count: u64,
    pub bytes: u64,
}

/// A summary of a GGUF file, valid for any architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub architecture: String,
    pub name: Option<String>,
    pub version: u32,
    pub file_bytes: u64,
    pub tensor_count: u64,
    pub parameter_count: u64,
    /// Per tensor type, in type-id order.
    pub tensor_types: BTreeMap<GgmlType, TypeTotals>,
    /// `general.file_type` rendered as llama.cpp names it (`Q4_K_M`), else the
    /// type holding the most bytes.
    pub quantization: String,
    pub block_count: Option<u64>,
    pub context_length: Option<u64>,
    pub vocab_size: Option<u64>,
    pub embedding_length: Option<u64>,
    pub expert_count: Option<u64>,
    pub expert_used_count: Option<u64>,
    pub has_chat_template: bool,
    /// Bytes of routed-expert tensors (all experts).
    pub expert_bytes: u64,
    /// Weight bytes read per decoded token: every weight except the token
    /// embedding (one row is gathered) and the routed experts, plus
    /// used/total of the routed-expert bytes.
    pub bytes_per_token_estimate: u64,
    /// Tensors the engine does not read for text generation, for an
    /// architecture it runs: names outside its tensor table (a vision or
    /// audio tower, a multi-token-prediction drafter) and layers past the trunk.
    pub ignored_tensors: Vec<String>,
}

/// llama.cpp's `llama_ftype` names, by `general.file_type` value.
const FILE_TYPES: &[(u64, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
];

impl Summary {
    pub fn of(g: &GgufFile) -> Result<Summary> {
        let architecture = g.architecture()?.unwrap_or("").to_string();
        let arch = architecture.as_str();
        let u = |k: Key| g.get_u64(&k.for_arch(arch));

        // Multi-token-prediction layers follow the trunk; decoding does not read them.
        let trunk = match (u(Key::BlockCount)?, u(Key::NextnPredictLayers)?) {
            (Some(b), Some(n)) if n < b => b - n,
            _ => u64::MAX,
        };
        let mut tensor_types: BTreeMap<GgmlType, TypeTotals> = BTreeMap::new();
        let table = Arch::from_name(arch).map(Arch::tensors);
        let mut ignored = Vec::new();
        let (mut params, mut expert_bytes, mut embd_bytes, mut all_bytes, mut unread) = (0u64, 0u64, 0u64, 0u64, 0u64);
        for t in g.tensors() {
            let e = tensor_types.entry(t.ty).or_default();
            e.count += 1;
            e.bytes += t.size;
            params += t.n_elements();
            all_bytes += t.size;
            let name = TensorName::parse(&t.name);
            if super::keys::layer_of(&t.name).is_some_and(|l| l as u64 >= trunk) {
                unread += t.size;
                ignored.push(t.name.clone());
                continue;
            }
            if let Some(table) = table {
                if !name.is_some_and(|n| table.contains(&n.kind)) {
                    unread += t.size;
                    ignored.push(t.name.clone());
                    continue;
                }
            }
            match name.map(|n| n.kind) {
                Some(k) if k.is_routed_expert() => expert_bytes += t.size,
                Some(TensorKind::TokenEmbd) => embd_bytes += t.size,
                // Gemma 4's per-layer embeddings: one row gathered per token, as the embedding.
                Some(TensorKind::PerLayerTokenEmbd) => unread += t.size,
                _ => {}
            }
        }

        let expert_count = u(Key::ExpertCount)?.filter(|&n| n > 0);
        let expert_used_count = u(Key::ExpertUsedCount)?.filter(|&n| n > 0);
        let routed = match (expert_count, expert_used_count) {
            (Some(n), Some(k)) => (expert_bytes as u128 * k.min(n) as u128 / n as u128) as u64,
            _ => expert_bytes,
        };
        // A model without an output head reads the (tied) embedding matrix in full.
        let has_output = g.tensor(&TensorKind::Output.weight(0)).is_some();
        let head = if has_output { 0 } else { embd_bytes };
        let bytes_per_token_estimate = all_bytes - unread - expert_bytes - embd_bytes + routed + head;

        let vocab_size = match u(Key::VocabSize)? {
            Some(v) => Some(v),
            None => match g.get_array(Key::TokenizerTokens.name())? {
                Some(a) => Some(a.len() as u64),
                None => g.tensor(&TensorKind::TokenEmbd.weight(0)).map(|t| t.dims[1]),
            },
        };
        let quantization = match g.get_u64(Key::GeneralFileType.name()).ok().flatten() {
            Some(ft) => FILE_TYPES.iter().find(|f| f.0 == ft).map_or(format!("file type {ft}"), |f| f.1.to_string()),
            None => tensor_types
                .iter()
                .max_by_key(|(_, t)| t.bytes)
                .map_or_else(|| "none".to_string(), |(ty, _)| ty.name().to_string()),
        };

        Ok(Summary {
            name: g.get_str(Key::GeneralName.name())?.map(str::to_string),
            version: g.version(),
            file_bytes: g.file_bytes(),
            tensor_count: g.tensors().len() as u64,
            parameter_count: params,
            tensor_types,
            quantization,
            block_count: u(Key::BlockCount)?,
            context_length: u(Key::ContextLength)?,
            vocab_size,
            embedding_length: u(Key::EmbeddingLength)?,
            expert_count,
            expert_used_count,
            has_chat_template: g.get_str(Key::TokenizerChatTemplate.name())?.is_some_and(|s| !s.is_empty()),
            expert_bytes,
            bytes_per_token_estimate,
            ignored_tensors: ignored,
            architecture,
        })
    }
}
