//! Which type each tensor of a file gets: the presets of `pocket quantize`
//! (`Q4_K_M`, `IQ2_XXS`, ...) and the per-tensor choices inside them, made as
//! llama.cpp 0c1e570's `llama-quantize` makes them, so that a file type
//! means the same mix in both tools: the embedding, the output head,
//! attention V and the first and last layers' down projections get more
//! bits; which ones depends on the architecture's shape (grouped-query
//! attention, expert count) and on whether an importance matrix is given.

use crate::gguf::layer_of;
use crate::quant::GgmlType;

/// A file type: the preset a whole file is quantised to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2K,
    Q2KS,
    Q3KS,
    Q3KM,
    Q3KL,
    Q4KS,
    Q4KM,
    Q5KS,
    Q5KM,
    Q6K,
    IQ1S,
    IQ1M,
    IQ2XXS,
    IQ2XS,
    IQ2S,
    IQ2M,
    IQ3XXS,
    IQ3XS,
    IQ3S,
    IQ3M,
    IQ4XS,
    IQ4NL,
    MXFP4Moe,
    TQ1_0,
    TQ2_0,
}

/// (file type, name, `general.file_type` id, the type most tensors get)
const FILE_TYPES: &[(FileType, &str, u32, GgmlType)] = &[
    (FileType::F32, "F32", 0, GgmlType::F32),
    (FileType::F16, "F16", 1, GgmlType::F16),
    (FileType::BF16, "BF16", 32, GgmlType::BF16),
    (FileType::Q8_0, "Q8_0", 7, GgmlType::Q8_0),
    (FileType::Q4_0, "Q4_0", 2, GgmlType::Q4_0),
    (FileType::Q4_1, "Q4_1", 3, GgmlType::Q4_1),
    (FileType::Q5_0, "Q5_0", 8, GgmlType::Q5_0),
    (FileType::Q5_1, "Q5_1", 9, GgmlType::Q5_1),
    (FileType::Q2K, "Q2_K", 10, GgmlType::Q2K),
    (FileType::Q2KS, "Q2_K_S", 21, GgmlType::Q2K),
    (FileType::Q3KS, "Q3_K_S", 11, GgmlType::Q3K),
    (FileType::Q3KM, "Q3_K_M", 12, GgmlType::Q3K),
    (FileType::Q3KL, "Q3_K_L", 13, GgmlType::Q3K),
    (FileType::Q4KS, "Q4_K_S", 14, GgmlType::Q4K),
    (FileType::Q4KM, "Q4_K_M", 15, GgmlType::Q4K),
    (FileType::Q5KS, "Q5_K_S", 16, GgmlType::Q5K),
    (FileType::Q5KM, "Q5_K_M", 17, GgmlType::Q5K),
    (FileType::Q6K, "Q6_K", 18, GgmlType::Q6K),
    (FileType::IQ1S, "IQ1_S", 24, GgmlType::IQ1S),
    (FileType::IQ1M, "IQ1_M", 31, GgmlType::IQ1M),
    (FileType::IQ2XXS, "IQ2_XXS", 19, GgmlType::IQ2XXS),
    (FileType::IQ2XS, "IQ2_XS", 20, GgmlType::IQ2XS),
    // IQ2_S files are mostly IQ2_XS tensors and IQ2_M files IQ2_S ones.
    (FileType::IQ2S, "IQ2_S", 28, GgmlType::IQ2XS),
    (FileType::IQ2M, "IQ2_M", 29, GgmlType::IQ2S),
    (FileType::IQ3XXS, "IQ3_XXS", 23, GgmlType::IQ3XXS),
    (FileType::IQ3XS, "IQ3_XS", 22, GgmlType::IQ3S),
    (FileType::IQ3S, "IQ3_S", 26, GgmlType::IQ3S),
    (FileType::IQ3M, "IQ3_M", 27, GgmlType::IQ3S),
    (FileType::IQ4XS, "IQ4_XS", 30, GgmlType::IQ4XS),
    (FileType::IQ4NL, "IQ4_NL", 25, GgmlType::IQ4NL),
    (FileType::MXFP4Moe, "MXFP4_MOE", 38, GgmlType::MXFP4),
    (FileType::TQ1_0, "TQ1_0", 36, GgmlType::TQ1_0),
    (FileType::TQ2_0, "TQ2_0", 37, GgmlType::TQ2_0),
];

impl FileType {
    /// The preset named `name` (case-insensitive; `Q3_K`, `Q4_K` and `Q5_K`
    /// are llama-quantize's aliases of their `_M` mixes).
    pub fn from_name(name: &str) -> Option<FileType> {
        let name = name.to_ascii_uppercase();
        let name = match name.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            n => n,
        };
        FILE_TYPES.iter().find(|t| t.1 == name).map(|t| t.0)
    }

    fn row(self) -> &'static (FileType, &'static str, u32, GgmlType) {
        // Every variant has exactly one row (checked by a test).
        FILE_TYPES.iter().find(|t| t.0 == self).unwrap_or(&FILE_TYPES[0])
    }

    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// The `general.file_type` value (llama.cpp's `llama_ftype`).
    pub fn id(self) -> u32 {
        self.row().2
    }

    /// The type most tensors get.
    pub fn default_type(self) -> GgmlType {
        self.row().3
    }

    /// Every preset, in the order `pocket quantize --help` lists them.
    pub fn all() -> impl Iterator<Item = FileType> {
        FILE_TYPES.iter().map(|t| t.0)
    }

    fn is_iq1_or_iq2(self) -> bool {
        use FileType::*;
        matches!(self, IQ2XXS | IQ2XS | IQ1S | IQ2S | IQ2M | IQ1M)
    }
}

/// The model facts the choices depend on.
#[derive(Clone, Debug, Default)]
pub struct ModelShape {
    /// `general.architecture`.
    pub arch: String,
    pub n_layer: usize,
    /// Routed experts (0 or 1: a dense model).
    pub n_expert: usize,
    /// Query heads per KV head in the first layer (0 when it has no KV heads).
    pub n_gqa: usize,
    /// llama.cpp's "70B" class (Llama with 80 layers): attention V gets more bits.
    pub is_70b: bool,
}

/// What a tensor is, for the choices (llama.cpp's broad categories).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

impl Category {
    pub fn of(name: &str) -> Category {
        use Category::*;
        if name == "output.weight" {
            return Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return TokenEmbd;
        }
        const BY_PART: &[(&str, Category)] = &[
            ("attn_qkv.weight", AttnQkv),
            ("attn_kv_b.weight", AttnKvB),
            ("attn_v.weight", AttnV),
            ("attn_k.weight", AttnK),
            ("attn_q.weight", AttnQ),
            ("attn_output.weight", AttnOutput),
            ("ffn_up", FfnUp),
            ("ffn_gate", FfnGate),
            ("ffn_down", FfnDown),
        ];
        BY_PART.iter().find(|(part, _)| name.contains(part)).map_or(Other, |&(_, c)| c)
    }

    /// Attention-V-like: the most sensitive to quantisation.
    fn is_attn_v(self) -> bool {
        matches!(self, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
    }
}

/// A shape as ggml counts its dimensions: trailing 1s dropped (at least one
/// left), so `[n, 1]` is a vector.
pub fn ggml_dims(shape: &[u64]) -> &[u64] {
    &shape[..shape.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)]
}

/// Whether a tensor is quantised at all: matrices (two or more dimensions
/// above 1) named `*weight`, except norms, routers, convolutions and the
/// small or positional tables llama.cpp keeps as they are.
pub fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    if ggml_dims(dims).len() < 2 || !name.ends_with("weight") {
        return false;
    }
    const KEEP: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    name != "position_embd.weight" && name != "token_types.weight" && !KEEP.iter().any(|k| name.contains(k))
}

/// Chooses each tensor's type, visiting the tensors in llama.cpp's order
/// (by layer, then by name): some choices count the tensors of a kind seen
/// so far.
pub struct Mixer {
    ftype: FileType,
    shape: ModelShape,
    has_imatrix: bool,
    tied_embeddings: bool,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
    i_ffn_gate: usize,
    i_ffn_up: usize,
    /// Tensors whose row did not fit the preset's block (given a wider-block type).
    pub n_fallback: usize,
}

impl Mixer {
    /// A mixer for a file whose tensors are named `names`.
    pub fn new<'a>(
        ftype: FileType,
        shape: ModelShape,
        has_imatrix: bool,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Mixer {
        let (mut n_attention_wv, mut tied_embeddings) = (0, true);
        for name in names {
            let c = Category::of(name);
            n_attention_wv += c.is_attn_v() as usize;
            tied_embeddings &= c != Category::Output;
        }
        Mixer {
            ftype,
            shape,
            has_imatrix,
            tied_embeddings,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            n_fallback: 0,
        }
    }

    /// The type of the next tensor (`dims` innermost first, `current` its
    /// type now): its current type when it is not quantised at all.
    pub fn choose(&mut self, name: &str, dims: &[u64], current: GgmlType) -> GgmlType {
        if !allows_quantization(name, dims) {
            return current;
        }
        let default = self.ftype.default_type();
        if matches!(default, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return default;
        }
        let ty = self.by_rule(name, dims, default);
        self.fallback(dims[0], ty)
    }

    /// Row length `cols` not a whole number of `ty`'s blocks: the nearest
    /// type with 32-wide blocks, else F16.
    fn fallback(&mut self, cols: u64, ty: GgmlType) -> GgmlType {
        use GgmlType::*;
        let fits = |t: GgmlType| cols.is_multiple_of(t.block_size() as u64);
        if fits(ty) {
            return ty;
        }
        self.n_fallback += 1;
        let wider = match ty {
            IQ1S | IQ1M | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ4XS => IQ4NL,
            Q2K | Q3K | TQ1_0 | TQ2_0 | Q2_0 => Q4_0,
            Q4K => Q5_0,
            Q5K => Q5_1,
            Q6K => Q8_0,
            other => other,
        };
        if fits(wider) {
            wider
        } else {
            F16
        }
    }

    fn by_rule(&mut self, name: &str, dims: &[u64], default: GgmlType) -> GgmlType {
        use Category as C;
        use FileType as F;
        use GgmlType as T;
        let ft = self.ftype;
        let (arch, n_expert, gqa4) = (self.shape.arch.as_str(), self.shape.n_expert, self.shape.n_gqa >= 4);
        let falcon = arch == "falcon";
        let n_layer = self.shape.n_layer as i64;
        let category = Category::of(name);
        // The tensor's layer: parsed from the name in a MoE model (whose
        // tensors are not one per layer), else the count so far.
        let layer = |count: usize| -> i64 {
            if n_expert > 1 {
                layer_of(name).map_or(count as i64, |l| l as i64)
            } else {
                count as i64
            }
        };
        let more_bits = |i: i64, n: i64| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;

        let mut ty = default;
        if category == C::Output || (self.tied_embeddings && category == C::TokenEmbd) {
            ty = if ft == F::MXFP4Moe || falcon || !dims[0].is_multiple_of(default.block_size() as u64) {
                T::Q8_0
            } else if ft.is_iq1_or_iq2() || ft == F::IQ3XXS {
                T::Q5K
            } else if default != T::Q8_0 {
                T::Q6K
            } else {
                default
            };
        } else if ft == F::MXFP4Moe {
            ty = if dims.get(2).is_some_and(|&e| e > 1) { T::MXFP4 } else { T::Q8_0 };
        } else if category == C::TokenEmbd {
            if matches!(ft, F::IQ2XXS | F::IQ2XS | F::IQ1S | F::IQ1M) {
                ty = T::Q2K;
            } else if matches!(ft, F::IQ2S | F::IQ2M | F::IQ3XXS) {
                ty = T::IQ3S;
            } else if matches!(ft, F::TQ1_0 | F::TQ2_0) {
                ty = T::Q4K;
            }
        } else if ft.is_iq1_or_iq2() {
            let iq2_sm = matches!(ft, F::IQ2S | F::IQ2M);
            if category.is_attn_v() {
                ty = if gqa4 || n_expert >= 4 {
                    T::Q4K
                } else if iq2_sm {
                    T::IQ3S
                } else {
                    T::Q2K
                };
                self.i_attention_wv += 1;
            } else if n_expert == 8 && category == C::AttnK {
                ty = T::Q4K;
            } else if category == C::FfnDown {
                if self.i_ffn_down < self.shape.n_layer / 8 {
                    ty = if iq2_sm { T::IQ3S } else { T::Q2K };
                }
                self.i_ffn_down += 1;
            } else if category == C::AttnOutput {
                if n_expert == 8 {
                    ty = T::Q5K;
                } else if matches!(ft, F::IQ1S | F::IQ1M) {
                    ty = T::IQ2XXS;
                } else if iq2_sm {
                    ty = T::IQ3S;
                }
            }
        } else if category.is_attn_v() {
            let i = self.i_attention_wv as i64;
            match ft {
                F::Q2K => ty = if gqa4 { T::Q4K } else { T::Q3K },
                F::Q2KS if gqa4 => ty = T::Q4K,
                F::IQ3XXS => {
                    ty = if gqa4 {
                        T::Q4K
                    } else if !self.has_imatrix {
                        T::IQ3S
                    } else {
                        T::IQ3XXS
                    }
                }
                F::IQ3XS | F::IQ3S if gqa4 => ty = T::Q4K,
                F::IQ3M => ty = T::Q4K,
                F::Q3KM => ty = if i < 2 { T::Q5K } else { T::Q4K },
                F::Q3KL => ty = T::Q5K,
                F::IQ4NL | F::IQ4XS if gqa4 => ty = T::Q5K,
                F::Q4KM | F::Q5KM if more_bits(i, self.n_attention_wv as i64) => ty = T::Q6K,
                F::Q4KS if i < 4 => ty = T::Q5K,
                _ => {}
            }
            if self.shape.is_70b && matches!(ty, T::Q3K | T::Q4K) {
                ty = T::Q5K;
            }
            if n_expert == 8 {
                ty = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if category == C::AttnK {
            if n_expert == 8 {
                ty = T::Q8_0;
            } else if ft == F::IQ3XS {
                ty = T::IQ3XXS;
            } else if ft == F::IQ3XXS {
                ty = T::IQ2S;
            }
        } else if category == C::AttnQ {
            if ft == F::IQ3XS {
                ty = T::IQ3XXS;
            } else if ft == F::IQ3XXS {
                ty = T::IQ2S;
            }
        } else if category == C::FfnDown {
            let i = layer(self.i_ffn_down);
            match ft {
                F::Q2K => ty = T::Q3K,
                F::Q2KS if i < n_layer / 8 => ty = T::Q4K,
                F::IQ3XXS if !self.has_imatrix => ty = if i < n_layer / 8 { T::Q4K } else { T::Q3K },
                F::Q3KM => {
                    ty = if i < n_layer / 16 {
                        T::Q5K
                    } else if !falcon || more_bits(i, n_layer) {
                        T::Q4K
                    } else {
                        T::Q3K
                    }
                }
                F::IQ3M if i < n_layer / 8 || (n_expert == 8 && more_bits(i, n_layer)) => ty = T::Q4K,
                F::Q3KL => ty = if falcon { T::Q4K } else { T::Q5K },
                F::Q4KM => {
                    if falcon {
                        ty = if i < n_layer / 16 {
                            T::Q6K
                        } else if more_bits(i, n_layer) {
                            T::Q5K
                        } else {
                            T::Q4K
                        };
                    } else if more_bits(i, n_layer) {
                        ty = T::Q6K;
                    }
                }
                F::IQ4NL | F::IQ4XS if i < n_layer / 8 && !self.has_imatrix => ty = T::Q5K,
                F::Q5KM if more_bits(i, n_layer) => ty = T::Q6K,
                F::Q4KS if !falcon && i < n_layer / 8 => ty = T::Q5K,
                F::Q4_0 | F::Q5_0 if self.has_imatrix && i < n_layer / 8 => {
                    ty = if ft == F::Q4_0 { T::Q4_1 } else { T::Q5_1 }
                }
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if category == C::AttnOutput {
            if !falcon {
                if n_expert == 8 {
                    use FileType::*;
                    if matches!(ft, Q2K | IQ3XS | IQ3XXS | Q3KS | Q3KM | IQ4NL | Q4KS | Q4KM | IQ3S | IQ3M | IQ4XS) {
                        ty = T::Q5K;
                    }
                } else {
                    match ft {
                        F::Q2K => ty = T::Q3K,
                        F::IQ3XXS => ty = T::IQ3S,
                        F::Q3KM | F::IQ3M => ty = T::Q4K,
                        F::Q3KL => ty = T::Q5K,
                        _ => {}
                    }
                }
            } else if ft == F::Q3KL {
                ty = T::Q4K;
            }
        } else if category == C::FfnGate || category == C::FfnUp {
            let count = if category == C::FfnGate { &mut self.i_ffn_gate } else { &mut self.i_ffn_up };
            let i = if n_expert > 1 { layer_of(name).map_or(*count as i64, |l| l as i64) } else { *count as i64 };
            if ft == F::IQ3XS && i >= n_layer / 8 && i < 7 * n_layer / 8 {
                ty = T::IQ3XXS;
            }
            *count += 1;
        }
        ty
    }
}

/// llama.cpp's tensor order: by layer (tensors outside the layers first), then by name.
pub fn tensor_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |n: &str| layer_of(n).map_or(-1, |l| l as i64);
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// Whether llama.cpp refuses to make tensor `name` as `ty` in a file of
/// type `ftype` without an importance matrix.
pub fn tensor_requires_imatrix(name: &str, ty: GgmlType, ftype: FileType) -> bool {
    use GgmlType::*;
    if matches!(Category::of(name), Category::TokenEmbd | Category::Output) {
        return false;
    }
    match ty {
        IQ3XXS | IQ2XXS | IQ2XS | IQ2S | IQ1M | IQ1S => true,
        Q2K => ftype == FileType::Q2KS,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_type_has_one_row_and_round_trips_by_name() {
        for ft in FileType::all() {
            assert_eq!(FILE_TYPES.iter().filter(|t| t.0 == ft).count(), 1);
            assert_eq!(FileType::from_name(ft.name()), Some(ft));
            assert_eq!(FileType::from_name(&ft.name().to_lowercase()), Some(ft));
        }
        assert_eq!(FileType::from_name("q4_k"), Some(FileType::Q4KM));
        assert_eq!(FileType::from_name("Q7_K"), None);
    }

    #[test]
    fn order_is_by_layer_then_name() {
        let mut names = [
            "blk.10.attn_q.weight",
            "output.weight",
            "blk.2.ffn_up.weight",
            "blk.2.attn_k.weight",
            "token_embd.weight",
        ];
        names.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(
            names,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.ffn_up.weight",
                "blk.10.attn_q.weight"
            ]
        );
    }

    #[test]
    fn what_is_quantised() {
        assert!(allows_quantization("blk.0.attn_q.weight", &[64, 64]));
        assert!(allows_quantization("blk.0.ffn_down_exps.weight", &[64, 64, 8]));
        assert!(!allows_quantization("blk.0.attn_norm.weight", &[64]));
        assert!(!allows_quantization("blk.0.ffn_gate_inp.weight", &[64, 8]));
        assert!(!allows_quantization("blk.0.ffn_gate_inp_shexp.weight", &[64, 1]));
        assert!(!allows_quantization("blk.0.ssm_conv1d.weight", &[4, 64]));
        assert!(!allows_quantization("blk.0.attn_q.bias", &[64, 64]));
    }
}
