use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::{Band, Truncation};
use crate::processors::truncate::{one, Truncate};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};
use crate::truncation::{exp, kth_largest, largest, Softmax, Work, EXP_MIN};

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

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Truncate::new(self.rule())?))
    }
}

/// The band top-a keeps. With `q = exp(x - max)` and `S` the sum of the `q`s (the fixed-point sum
/// of the truncation module), `p = q / S` and `p_max = 1 / S`, so the rule is `q >= a / S`: one
/// vectorized pass for `S`, then one pass of compares, `q` computed only for the values within a
/// margin of `max + ln(a / S)` ([`lowest_reaching`]).
#[inline(always)]
pub(crate) fn band(values: &[f32], a: f32, min_keep: usize, work: &mut Work) -> Band {
    let max = largest(values);
    if !max.is_finite() || a <= 0.0 {
        return Band::ALL;
    }
    let softmax = Softmax::weights_only(values, max);
    let threshold = a / softmax.scale();
    let lo = lowest_reaching(values, max, threshold, work);
    Band {
        lo: lo.min(match min_keep {
            1 => max,
            _ => kth_largest(values, min_keep, work),
        }),
        hi: f32::INFINITY,
    }
}

/// The smallest value but `-inf` whose `q = exp(x - max)` reaches `threshold` (`+inf` when none
/// does). `q`
/// is monotone in `x`, so only the values within a margin of `max + ln(threshold)` need their
/// `q` computed: those above the margin all reach it, those below none does (the margin, 0.01
/// plus 8 units in the last place of `max`, is far wider than the error of `exp` and of the
/// subtraction). One pass: the smallest value above the margin, and the few inside it.
#[inline(always)]
pub(crate) fn lowest_reaching(values: &[f32], max: f32, threshold: f32, work: &mut Work) -> f32 {
    work.clear();
    let ln = (threshold as f64).ln();
    let margin = 0.01 + max.abs() as f64 * (1.0 / (1u64 << 20) as f64);
    // Near `exp`'s floor (-104, where its results are subnormal and coarse), and for a threshold
    // of 0 or NaN, every value is decided exactly.
    let exact_only = threshold.is_nan() || threshold <= 0.0 || ln - margin < (EXP_MIN + 1.0) as f64;
    // `-inf` is never a candidate (its q is 0, which reaches a threshold of 0).
    let lo = if exact_only {
        f32::MIN
    } else {
        (max as f64 + ln - margin) as f32
    };
    let hi = if exact_only {
        f32::INFINITY
    } else {
        (max as f64 + ln + margin) as f32
    };
    let mut sure = f32::INFINITY;
    #[cfg(target_arch = "x86_64")]
    let wide = crate::truncation::wide_available();
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    if wide {
        #[cfg(target_arch = "x86_64")]
        if let Some(smallest) =
            crate::truncation::smallest_above_and_between(values, lo, hi, usize::MAX, work)
        {
            sure = smallest;
        }
    } else {
        for &x in values {
            if x >= lo {
                if x >= hi {
                    sure = sure.min(x);
                } else {
                    work.push((0, 0, x));
                }
            }
        }
    }
    let mut lowest = sure;
    for &(_, _, x) in work.iter() {
        if x < lowest && exp(x - max) >= threshold {
            lowest = x;
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// text-generation-webui's `TopALogitsWarper`, in f64: sort, softmax, remove
    /// `probs < probs_max^2 * a`, keep `min_tokens_to_keep`.
    pub(crate) fn webui(values: &[f32], a: f64, min_keep: usize) -> Vec<bool> {
        let max = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let q: Vec<f64> = values.iter().map(|&x| (x as f64 - max).exp()).collect();
        let s: f64 = q.iter().sum();
        let p_max = 1.0 / s;
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
        let mut keep: Vec<bool> = q.iter().map(|&q| q / s >= p_max * p_max * a).collect();
        for &i in order.iter().take(min_keep) {
            keep[i] = true;
        }
        keep
    }

    #[test]
    fn the_lowest_reaching_value_is_the_exact_one_at_any_offset() {
        let mut seed = 17u64;
        for offset in [0.0f32, -50.0, 1e3, 1e5, 3e6] {
            for spread in [0.1f32, 3.0, 40.0, 200.0] {
                let row: Vec<f32> = (0..3000)
                    .map(|i| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        match i % 97 {
                            5 => f32::NAN,
                            6 => f32::NEG_INFINITY,
                            _ => {
                                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread + offset
                            }
                        }
                    })
                    .collect();
                let max = largest(&row);
                for threshold in [0.0f32, 1e-45, 1e-30, 1e-8, 1e-3, 0.1, 0.5, 1.0, 2.0] {
                    let exact = row
                        .iter()
                        .filter(|&&x| x > f32::NEG_INFINITY && exp(x - max) >= threshold)
                        .fold(f32::INFINITY, |m, &x| m.min(x));
                    let got = lowest_reaching(&row, max, threshold, &mut vec![]);
                    assert_eq!(
                        got.to_bits(),
                        exact.to_bits(),
                        "{offset} {spread} {threshold}"
                    );
                }
            }
        }
    }

    #[test]
    fn equals_text_generation_webui_away_from_the_threshold() {
        let mut seed = 11u64;
        for len in [2usize, 5, 300, 20_000] {
            for a in [0.0f64, 0.01, 0.2, 0.9] {
                for min_keep in [1usize, 3] {
                    let row: Vec<f32> = (0..len)
                        .map(|_| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 10.0 - 5.0
                        })
                        .collect();
                    let b = band(&row, a as f32, min_keep, &mut vec![]);
                    let kept: Vec<bool> = row.iter().map(|&x| !b.removes(x)).collect();
                    let expected = webui(&row, a, min_keep);
                    let differ = kept.iter().zip(&expected).filter(|(x, y)| x != y).count();
                    assert!(differ <= 1, "len {len} a {a}: {differ} differ");
                }
            }
        }
    }
}
