use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::Truncate;
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "top_n_sigma", "n": 1.0}`: keeps the logits at least `max - n * sigma`, where `sigma`
/// is the population standard deviation of the row's finite logits (llama.cpp's
/// `llama_sampler_init_top_n_sigma`, from "Top-nσ: Not All Logits Are You Need"). `n <= 0`
/// changes nothing, as in llama.cpp (whose default, -1, is off).
///
/// ```
/// use logits_processing::{process_row, processors::Truncate, Truncation};
/// let mut sigma = Truncate::new(Truncation::TopNSigma { n: 1.0 })?;
/// let mut row = [0.0f32, 1.0, 2.0, 3.0]; // mean 1.5, sigma 1.118
/// process_row(&mut sigma, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, ninf, 2.0, 3.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopNSigmaSpec {
    pub n: f64,
}

impl TopNSigmaSpec {
    fn rule(&self) -> Truncation {
        Truncation::TopNSigma { n: self.n as f32 }
    }
}

impl KindSpec for TopNSigmaSpec {
    fn check(&self) -> Result<()> {
        self.rule().validate()
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
