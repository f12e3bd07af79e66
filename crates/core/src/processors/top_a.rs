use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "top_a", "a": 0.2, "min_tokens_to_keep": 1}`: keeps the logits whose probability is at
/// least `a * p_max^2` (`0 <= a <= 1`; `0` keeps everything), `p_max` the largest probability:
/// text-generation-webui's `TopALogitsWarper` (from BlinkDL's RWKV sampler).
///
/// ```
/// use logits_processing::{process_row, processors::Truncate, Truncation};
/// let mut top_a = Truncate::new(Truncation::TopA { a: 0.5, min_keep: 1 })?;
/// let mut row = [2.0f32, 0.0, 1.9, -3.0];
/// process_row(&mut top_a, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [2.0, ninf, 1.9, ninf]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopASpec {
    #[schemars(range(min = 0.0, max = 1.0))]
    pub a: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl TopASpec {
    fn rule(&self) -> Truncation {
        Truncation::TopA {
            a: self.a as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for TopASpec {
    fn check(&self) -> Result<()> {
        crate::processors::truncate::parameter("a", self.a, (0.0, true), (1.0, true))?;
        self.rule().validate()
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
