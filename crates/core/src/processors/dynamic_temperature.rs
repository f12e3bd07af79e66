use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, Reshape, RowPlan};
use crate::processors::{LogitsProcessor, MIN_TEMPERATURE};
use crate::spec::{EngineContext, KindSpec};

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

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_temperature_past_f32_is_refused_naming_range() {
        let error = DynamicTemperature::new(3e38, 3e38, 1.0)
            .unwrap_err()
            .to_string();
        assert!(error.contains("range"), "{error}");
        assert!(DynamicTemperature::new(3e38, 0.0, 1.0).is_ok());
    }

    #[test]
    fn a_negative_temperature_or_a_nan_range_is_refused() {
        assert!(DynamicTemperature::new(-1.0, 0.5, 1.0).is_err());
        assert!(DynamicTemperature::new(1.0, f64::NAN, 1.0).is_err());
    }
}
