use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "eta_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1}`: keeps the logits whose
/// probability is at least `min(epsilon, sqrt(epsilon) * exp(-entropy))` (`0 < epsilon < 1`);
/// `min_tokens_to_keep` (at least 1, default 1) as in transformers' `EtaLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EtaCutoffSpec {
    pub epsilon: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl EtaCutoffSpec {
    fn rule(&self) -> Truncation {
        Truncation::Eta {
            epsilon: self.epsilon as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for EtaCutoffSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
