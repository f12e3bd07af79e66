use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "typical_p", "mass": 0.9, "min_tokens_to_keep": 1}`: locally typical sampling with
/// mass `mass` (`0 < mass < 1`); `min_tokens_to_keep` (at least 1, default 1) as in transformers'
/// `TypicalLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypicalPSpec {
    pub mass: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl TypicalPSpec {
    fn rule(&self) -> Truncation {
        Truncation::Typical {
            mass: self.mass as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for TypicalPSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
