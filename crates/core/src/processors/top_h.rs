use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::Truncate;
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "top_h", "top_h": 0.4}`: transformers' `TopHLogitsWarper` (top-H, bounded
/// entropy): among the 100 largest logits, by rank, keeps the largest and then each while the
/// cumulative entropy of their probabilities (a softmax over the 100) stays within `top_h`
/// (`0 < top_h <= 1`) times those 100's entropy.
///
/// ```
/// use logits_processing::{process_row, processors::Truncate, Truncation};
/// let mut top_h = Truncate::new(Truncation::TopH { top_h: 0.01 })?;
/// let mut row = [2.0f32, 0.0, 1.9, -3.0];
/// process_row(&mut top_h, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [2.0, ninf, ninf, ninf]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopHSpec {
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1.0))]
    pub top_h: f64,
}

impl TopHSpec {
    /// The rule, `top_h` rounded into the f32 range (a positive value below f32's least stays
    /// positive).
    fn rule(&self) -> Result<Truncation> {
        let top_h =
            crate::processors::truncate::parameter("top_h", self.top_h, (0.0, false), (1.0, true))?;
        Ok(Truncation::TopH { top_h })
    }
}

impl KindSpec for TopHSpec {
    fn check(&self) -> Result<()> {
        self.rule()?.validate()
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule()?)?))
    }
}
