//! The speculative decoding flags `run`, `chat` and `bench` share.

use std::sync::Arc;

use pocket_core::model::Model;
use pocket_core::session::Speculation;

/// How drafts are made (`--speculate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    // (Plain comments: doc comments here would turn every command's help into the long layout.)
    Off,
    // Prompt lookup: the tokens that followed the last n-gram earlier in the prompt or answer.
    Lookup,
    // The model's multi-token-prediction layer (qwen35moe files that keep it).
    Mtp,
    // A smaller draft model of the same vocabulary (--draft-model FILE).
    Draft,
}

#[derive(clap::Args, Clone, Debug)]
pub struct Speculate {
    /// Draft tokens and verify them in one pass: off, lookup, mtp or draft (greedy and seeded output unchanged)
    #[arg(long = "speculate", value_name = "KIND", default_value = "off")]
    kind: Kind,
    /// Most tokens drafted per pass (adapted between 1 and N by acceptance)
    #[arg(long, value_name = "N", default_value_t = 8, allow_negative_numbers = true)]
    draft_max: usize,
    /// With --speculate lookup: the longest n-gram matched
    #[arg(long, value_name = "N", default_value_t = 3, allow_negative_numbers = true)]
    ngram: usize,
    /// With --speculate draft: the draft model (a GGUF with the model's vocabulary)
    #[arg(long, value_name = "FILE")]
    draft_model: Option<String>,
}

impl Speculate {
    /// The request's setting, or why the flags cannot work.
    pub fn speculation(&self) -> Result<Speculation, String> {
        let max_draft = self.draft_max;
        let s = match self.kind {
            Kind::Off => Speculation::Off,
            Kind::Lookup => Speculation::Lookup { ngram: self.ngram, max_draft },
            Kind::Mtp => Speculation::Mtp { max_draft },
            Kind::Draft if self.draft_model.is_none() => {
                return Err("--speculate draft needs --draft-model FILE".into());
            }
            Kind::Draft => Speculation::DraftModel { max_draft },
        };
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    /// The model `--draft-model` names, loaded (with `--speculate draft` only).
    pub fn draft_model(&self) -> Result<Option<Arc<Model>>, String> {
        match (&self.draft_model, self.kind) {
            (None, _) => Ok(None),
            (Some(path), Kind::Draft) => {
                Model::load(path).map(|m| Some(Arc::new(m))).map_err(|e| format!("--draft-model {path}: {e}"))
            }
            (Some(_), _) => Err("--draft-model needs --speculate draft".into()),
        }
    }

    pub fn is_off(&self) -> bool {
        self.kind == Kind::Off
    }
}

/// Accepted drafts per drafted token (`None` when nothing was drafted).
pub fn acceptance(drafted: usize, accepted: usize) -> Option<f64> {
    (drafted > 0).then(|| accepted as f64 / drafted as f64)
}
