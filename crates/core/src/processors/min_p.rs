use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "min_p", "p": 0.05, "min_tokens_to_keep": 1}`: keeps the logits whose probability is
/// at least `p` (`0 <= p <= 1`) times the largest; `min_tokens_to_keep` (at least 1, default 1) as
/// in transformers' `MinPLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MinPSpec {
    pub p: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl MinPSpec {
    fn rule(&self) -> Truncation {
        Truncation::MinP {
            p: self.p as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for MinPSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
