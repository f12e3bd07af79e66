use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, Reshape, RowPlan, Shape};
use crate::processors::{LogitsProcessor, MIN_TEMPERATURE};
use crate::spec::{KindSpec, SpecContext};
use crate::truncation::Softmax;

/// `{"kind": "dynamic_temperature", "temperature": 1.0, "range": 0.5, "exponent": 1.0}`: llama.cpp's
/// entropy-scaled temperature (`llama_sampler_init_temp_ext(temp, delta, exponent)`, the
/// `--dynatemp-range` and `--dynatemp-exp` options; from "Dynamic temperature" by kalomaze). With
/// `H` the entropy of the row's softmax and `n` its number of finite logits, the row is divided by
///
/// `t = max(0, temperature - range) + 2 range * (H / ln n)^exponent`
///
/// (`min + (max - min) * normalized^exponent`, in f32 as llama.cpp). `range <= 0` is a plain
/// temperature. A temperature that comes out `<= 0` keeps only the largest logit (every tie of
/// it), as llama.cpp's temperature 0 does, and so does one below `1e-30` ([`MIN_TEMPERATURE`]:
/// dividing by it would turn logits into infinity); a row with at most one finite logit is left
/// as it is.
///
/// `temperature` (finite, `>= 0`), `range` (finite, `temperature + range` finite in f32; default 0),
/// `exponent` (finite, `>= 0`, default 1).
///
/// Differences from llama.cpp: `n` and the entropy count the finite logits only (llama.cpp
/// counts every candidate, `-inf` included, in `ln n`); the entropy is the truncation module's
/// fixed-point one (`H = ln S + E / W`, probabilities below `2^-33` of the largest count as 0)
/// where llama.cpp sums `p ln p` in f32, so `t` agrees to a few units in its last place.
///
/// ```
/// use logits_processing::{process_row, processors::DynamicTemperature};
/// let mut dyn_t = DynamicTemperature::new(1.0, 0.5, 1.0)?;
/// let mut row = [1.0f32, 1.0, 1.0, 1.0]; // entropy ln 4: the largest temperature, 1.5
/// process_row(&mut dyn_t, &[0u32], &mut row)?;
/// assert_eq!(row, [1.0 / 1.5; 4]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DynamicTemperatureSpec {
    #[schemars(range(min = 0.0))]
    pub temperature: f64,
    #[serde(default)]
    pub range: f64,
    #[serde(default = "default_exponent")]
    #[schemars(range(min = 0.0))]
    pub exponent: f64,
}

fn default_exponent() -> f64 {
    1.0
}

impl KindSpec for DynamicTemperatureSpec {
    fn check(&self) -> Result<()> {
        DynamicTemperature::new(self.temperature, self.range, self.exponent).map(drop)
    }

    fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(DynamicTemperature::new(
            self.temperature,
            self.range,
            self.exponent,
        )?))
    }
}

/// The dynamic temperature at every step: see [`DynamicTemperatureSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicTemperature {
    rule: Reshape,
}

impl DynamicTemperature {
    pub fn new(temperature: f64, range: f64, exponent: f64) -> Result<Self> {
        let finite = |name: &str, v: f64, at_least_zero: bool| {
            let ok = v.is_finite() && (v as f32).is_finite() && (!at_least_zero || v >= 0.0);
            match ok {
                true => Ok(v as f32),
                false => Err(Error::argument(
                    name,
                    format!(
                        "must be finite{}, got {v}",
                        if at_least_zero { " and >= 0" } else { "" }
                    ),
                )),
            }
        };
        if !((temperature as f32) + (range as f32).max(0.0)).is_finite() {
            return Err(Error::argument(
                "range",
                format!("temperature + range must be finite in f32, got {temperature} + {range}"),
            ));
        }
        Ok(Self {
            rule: Reshape::DynamicTemperature {
                temperature: finite("temperature", temperature, true)?,
                range: finite("range", range, false)?,
                exponent: finite("exponent", exponent, true)?,
            },
        })
    }
}

impl LogitsProcessor for DynamicTemperature {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        match self.rule {
            Reshape::DynamicTemperature {
                temperature, range, ..
            } if range <= 0.0 && temperature == 1.0 => {}
            Reshape::DynamicTemperature {
                temperature, range, ..
            } if range <= 0.0 && temperature as f64 >= MIN_TEMPERATURE => {
                plan.push(Edit::Scale { temperature })
            }
            rule => plan.push(Edit::Reshape(rule)),
        }
        Ok(())
    }

    fn undo(&mut self) {}
}

/// The shape dynamic temperature gives `values`.
#[inline(always)]
pub(crate) fn shape(values: &[f32], temperature: f32, range: f32, exponent: f32) -> Shape {
    let greedy_or_scale = |t: f32| {
        // Below the smallest temperature, a division would turn logits into infinity.
        if (t as f64) < MIN_TEMPERATURE {
            let max = crate::truncation::largest(values);
            Shape::Greedy { max }
        } else {
            Shape::Scale { temperature: t }
        }
    };
    if range <= 0.0 {
        return greedy_or_scale(temperature);
    }
    let min_temp = (temperature - range).max(0.0);
    let max_temp = temperature + range;
    let finite = values.iter().filter(|x| x.is_finite()).count();
    if finite <= 1 {
        return Shape::Identity;
    }
    let softmax = Softmax::of(values);
    if !softmax.is_defined() {
        return Shape::Identity;
    }
    let max_entropy = (finite as f64).ln();
    let entropy = (softmax.scale() as f64).ln() + softmax.entropy_sum as f64 / softmax.sum as f64;
    let normalized = (entropy / max_entropy) as f32;
    greedy_or_scale(min_temp + (max_temp - min_temp) * normalized.powf(exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `temp_ext` arithmetic in f64: the temperature it divides by.
    fn llama_temperature(values: &[f32], t: f64, range: f64, exponent: f64) -> f64 {
        let finite: Vec<f64> = values
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| x as f64)
            .collect();
        let max = finite.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = finite.iter().map(|x| (x - max).exp()).sum();
        let h: f64 = -finite
            .iter()
            .map(|x| {
                let p = (x - max).exp() / s;
                if p > 0.0 {
                    p * p.ln()
                } else {
                    0.0
                }
            })
            .sum::<f64>();
        let lo = (t - range).max(0.0);
        lo + (t + range - lo) * (h / (finite.len() as f64).ln()).powf(exponent)
    }

    #[test]
    fn a_top_temperature_past_f32_is_refused_naming_range() {
        let error = DynamicTemperature::new(3e38, 3e38, 1.0)
            .unwrap_err()
            .to_string();
        assert!(error.contains("range"), "{error}");
        assert!(DynamicTemperature::new(3e38, 0.0, 1.0).is_ok());
    }

    #[test]
    fn the_temperature_is_llama_cpps_within_rounding() {
        let mut seed = 1u64;
        for len in [2usize, 10, 1000, 50_000] {
            for (t, range, exponent) in [(1.0, 0.5, 1.0), (0.8, 1.0, 2.0), (1.5, 0.2, 0.5)] {
                for scale in [0.5f32, 4.0, 20.0] {
                    let row: Vec<f32> = (0..len)
                        .map(|i| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            match i % 13 {
                                12 => f32::NEG_INFINITY,
                                _ => ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale,
                            }
                        })
                        .collect();
                    let Shape::Scale { temperature } = shape(&row, t, range, exponent) else {
                        panic!("a scale")
                    };
                    let expected = llama_temperature(&row, t as f64, range as f64, exponent as f64);
                    assert!(
                        (temperature as f64 - expected).abs() < 1e-5 * expected.max(1.0),
                        "{len} {scale}: {temperature} vs {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn edge_cases_follow_llama_cpp() {
        let ninf = f32::NEG_INFINITY;
        assert_eq!(shape(&[1.0, ninf], 1.0, 0.5, 1.0), Shape::Identity);
        // A one-hot row has entropy 0: the smallest temperature, here 0, which is greedy.
        assert_eq!(
            shape(&[0.0, -200.0, -300.0], 0.5, 1.0, 1.0),
            Shape::Greedy { max: 0.0 }
        );
        assert_eq!(
            shape(&[0.0, 1.0], 0.7, 0.0, 1.0),
            Shape::Scale { temperature: 0.7 }
        );
        assert!(DynamicTemperature::new(-1.0, 0.5, 1.0).is_err());
        assert!(DynamicTemperature::new(1.0, f64::NAN, 1.0).is_err());
    }
}
