use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::Truncation;
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "tail_free", "z": 0.95, "min_tokens_to_keep": 1}`: tail-free sampling (Trenton
/// Bricken's), as text-generation-webui's `TailFreeLogitsWarper` defines it: with the finite
/// logits' probabilities sorted in decreasing order, `d2[i] = |p[i] - 2 p[i+1] + p[i+2]|`
/// normalized to sum 1, the largest logit is kept, and the one after `i` + 1 sorted places while
/// the cumulative sum of `d2` up to `i` is at most `z` (`0 <= z <= 1`); the least likely candidate
/// always goes.
///
/// Differences: only finite logits are candidates (the webui's sort includes the zeros of
/// `-inf` logits, whose step down adds to `d2`); ties at the cut are kept together. The rule needs
/// every candidate's sorted neighbours and sums in sorted order, so a step sorts the finite logits
/// (a radix sort of their order keys, `O(n)`: the one kind here that orders the whole row).
///
/// ```
/// use logits_processing::{process_row, processors::Truncate, Truncation};
/// let mut tfs = Truncate::new(Truncation::TailFree { z: 0.5, min_keep: 1 })?;
/// let mut row = [3.0f32, 2.9, 0.0, -1.0, -1.5, -2.0];
/// process_row(&mut tfs, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [3.0, 2.9, ninf, ninf, ninf, ninf]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TailFreeSpec {
    #[schemars(range(min = 0.0, max = 1.0))]
    pub z: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl TailFreeSpec {
    fn rule(&self) -> Truncation {
        Truncation::TailFree {
            z: self.z as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

impl KindSpec for TailFreeSpec {
    fn check(&self) -> Result<()> {
        crate::processors::truncate::parameter("z", self.z, (0.0, true), (1.0, true))?;
        self.rule().validate()
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}
