use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "epsilon_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1}`: keeps the logits whose
/// probability is at least `epsilon` (`0 < epsilon < 1`); `min_tokens_to_keep` (at least 1, default
/// 1) as in transformers' `EpsilonLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EpsilonCutoffSpec {
    pub epsilon: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl EpsilonCutoffSpec {
    fn rule(&self) -> Truncation {
        Truncation::Epsilon {
            epsilon: self.epsilon as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for EpsilonCutoffSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
