use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, Truncation};
use crate::processors::truncate::one;
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "xtc", "probability": 0.5, "threshold": 0.1, "min_keep": 1, "seed": 0}`: "exclude top
/// choices" (llama.cpp's `llama_sampler_init_xtc`, from text-generation-webui): at a step where a
/// uniform draw in `[0, 1)` is at most `probability`, every token whose probability is at least
/// `threshold` is removed except the least likely of them, provided at least two reach the
/// threshold and `min_keep` candidates stay. `probability <= 0` or `threshold > 0.5` does nothing,
/// as in llama.cpp.
///
/// The draw is a counter-based generator keyed by `(seed, position)` (`position` the number of ids
/// so far): a resumed, migrated or re-planned request draws what the uninterrupted one drew, and
/// with `probability` 1 every step applies. llama.cpp draws from one `mt19937` stream per
/// sampler, so its draws depend on how many steps it ran, and its default seed is random; the
/// default here is 0.
///
/// Differences from llama.cpp, which keeps one arbitrary member of a tie: the least likely
/// above-threshold value is kept with every token tied with it (so when every token above the
/// threshold ties, nothing is removed); only finite logits count as candidates for `min_keep`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct XtcSpec {
    #[schemars(range(min = 0.0, max = 1.0))]
    pub probability: f64,
    #[serde(default = "default_threshold")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub threshold: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_keep: u32,
    #[serde(default)]
    pub seed: u64,
}

fn default_threshold() -> f64 {
    0.1
}

impl KindSpec for XtcSpec {
    fn check(&self) -> Result<()> {
        Xtc::new(self.probability, self.threshold, self.min_keep, self.seed).map(drop)
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Xtc::new(
            self.probability,
            self.threshold,
            self.min_keep,
            self.seed,
        )?))
    }
}

/// XTC: see [`XtcSpec`]. No state: each step's draw is a function of the seed and the position.
///
/// ```
/// use logits_processing::{process_row, processors::Xtc};
/// let mut xtc = Xtc::new(1.0, 0.1, 1, 0)?;
/// let mut row = [3.0f32, 2.0, 1.0, -5.0]; // probabilities .66, .24, .09, .0003
/// process_row(&mut xtc, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, 2.0, 1.0, -5.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: u32,
    seed: u64,
}

impl Xtc {
    pub fn new(probability: f64, threshold: f64, min_keep: u32, seed: u64) -> Result<Self> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(Error::argument(
                "probability",
                format!("{probability} is outside the range 0 <= probability <= 1"),
            ));
        }
        let rule = Truncation::Xtc {
            threshold: threshold as f32,
            min_keep,
        };
        if !(0.0..=1.0).contains(&threshold) {
            return Err(Error::argument(
                "threshold",
                format!("{threshold} is outside the range 0 <= threshold <= 1"),
            ));
        }
        if min_keep == 0 {
            return Err(Error::argument("min_keep", "must be at least 1"));
        }
        rule.validate()?;
        Ok(Self {
            probability: probability as f32,
            threshold: threshold as f32,
            min_keep,
            seed,
        })
    }

    /// The step's draw in `[0, 1)`: 24 bits of a SplitMix64 hash of the seed and the position.
    pub fn draw(seed: u64, position: usize) -> f32 {
        let x = splitmix64(splitmix64(seed) ^ position as u64);
        (x >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// SplitMix64's finalizer of `x + golden gamma`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl LogitsProcessor for Xtc {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if self.probability <= 0.0 || self.threshold > 0.5 {
            return Ok(());
        }
        if Self::draw(self.seed, ids.token_count()) > self.probability {
            return Ok(());
        }
        plan.push(Edit::Truncate(Truncation::Xtc {
            threshold: self.threshold,
            min_keep: self.min_keep,
        }));
        Ok(())
    }

    fn undo(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    /// llama.cpp's XTC at probability 1, in f64, on distinct values.
    fn llama(values: &[f32], threshold: f64, min_keep: usize) -> Vec<bool> {
        let max = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let q: Vec<f64> = values.iter().map(|&x| (x as f64 - max).exp()).collect();
        let s: f64 = q.iter().sum();
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
        let mut pos_last = 0;
        for (rank, &i) in order.iter().enumerate() {
            if q[i] / s >= threshold {
                pos_last = rank;
            } else {
                break;
            }
        }
        let mut keep = vec![true; values.len()];
        if values.len() - pos_last >= min_keep && pos_last > 0 {
            for &i in &order[..pos_last] {
                keep[i] = false;
            }
        }
        keep
    }

    #[test]
    fn at_probability_one_equals_llama_cpp_on_distinct_values() {
        let mut seed = 3u64;
        for len in [2usize, 3, 8, 64, 5000] {
            for threshold in [0.0f64, 0.05, 0.1, 0.3, 0.5] {
                for min_keep in [1usize, 2, 6] {
                    let row: Vec<f32> = (0..len)
                        .map(|_| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
                        })
                        .collect();
                    let mut xtc = Xtc::new(1.0, threshold, min_keep as u32, 9).unwrap();
                    let mut out = row.clone();
                    process_row(&mut xtc, &[1u32, 2], &mut out).unwrap();
                    let kept: Vec<bool> = out.iter().map(|x| x.is_finite()).collect();
                    assert_eq!(kept, llama(&row, threshold, min_keep), "{len} {threshold}");
                }
            }
        }
    }

    #[test]
    fn draws_depend_on_seed_and_position_only_and_are_uniform() {
        assert_eq!(Xtc::draw(5, 17), Xtc::draw(5, 17));
        assert_ne!(Xtc::draw(5, 17), Xtc::draw(6, 17));
        let n = 100_000;
        let below: usize = (0..n).filter(|&i| Xtc::draw(1, i) < 0.25).count();
        assert!((below as f64 / n as f64 - 0.25).abs() < 0.01, "{below}");
        // A step applies exactly when its draw is at most the probability.
        let mut xtc = Xtc::new(0.5, 0.1, 1, 1).unwrap();
        for position in 0..50 {
            let ids = vec![0u32; position];
            let mut plan = RowPlan::new();
            xtc.plan(&ids, &mut plan).unwrap();
            assert_eq!(!plan.is_empty(), Xtc::draw(1, position) <= 0.5);
        }
    }
}
