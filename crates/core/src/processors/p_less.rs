use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "p_less", "min_tokens_to_keep": 1}`: keeps the logits whose probability is at least
/// `sum_i p_i^2`, the probability that two independent draws from the row agree: p-less sampling
/// ("p-less sampling: a robust hyperparameter-free approach for LLM decoding", arXiv 2509.23234),
/// with no parameter. A confident row keeps few tokens, a flat one many; ties at the threshold
/// are kept, and the most likely token always is. `"normalized": true` is the paper's
/// p-less-norm, the threshold `(n sum p^2 - 1) / (n - 1)` over the `n` candidates: more tokens
/// kept, for tasks that favour diversity.
///
/// ```
/// use logits_processing::{process_row, processors::Truncate, Truncation};
/// let mut p_less = Truncate::new(Truncation::PLess { min_keep: 1, normalized: false })?;
/// // p = (2/3, 1/6, 1/6): sum p^2 = 1/2.
/// let mut row = [4f32.ln(), 0.0, 0.0];
/// process_row(&mut p_less, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [4f32.ln(), ninf, ninf]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PLessSpec {
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
    #[serde(default)]
    pub normalized: bool,
}

impl PLessSpec {
    fn rule(&self) -> Truncation {
        Truncation::PLess {
            min_keep: self.min_tokens_to_keep,
            normalized: self.normalized,
        }
    }
}

impl KindSpec for PLessSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
