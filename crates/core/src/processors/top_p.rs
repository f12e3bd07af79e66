use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "top_p", "p": 0.9, "min_tokens_to_keep": 1}`: keeps the smallest set of largest logits
/// whose probability reaches `p` (`0 < p <= 1`); `min_tokens_to_keep` (at least 1, default 1) as in
/// transformers' `TopPLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopPSpec {
    pub p: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl TopPSpec {
    fn rule(&self) -> Truncation {
        Truncation::TopP {
            p: self.p as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for TopPSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
