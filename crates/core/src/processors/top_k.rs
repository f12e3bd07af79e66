use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "top_k", "k": 50, "min_tokens_to_keep": 1}`: keeps the `k` (at least 1) largest logits
/// and every logit tied with the k-th; `min_tokens_to_keep` (at least 1, default 1) as in
/// transformers' `TopKLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopKSpec {
    pub k: u32,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl TopKSpec {
    fn rule(&self) -> Truncation {
        Truncation::TopK {
            k: self.k,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for TopKSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
