use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

pub use crate::reshape::MIN_TEMPERATURE;

/// `{"kind": "temperature", "temperature": 0.7}`: the temperature, finite and at least `1e-30`
/// ([`MIN_TEMPERATURE`]).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemperatureSpec {
    #[schemars(range(min = 1e-30))]
    pub temperature: f64,
}

impl KindSpec for TemperatureSpec {
    fn check(&self) -> Result<()> {
        Temperature::new(self.temperature)
            .map(drop)
            .map_err(|e| Error::argument("temperature", e.to_string()))
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Temperature::new(self.temperature)?))
    }
}

/// Divides every logit by a temperature: above 1 flattens the distribution, below 1 sharpens it.
///
/// Matches the reference's `TemperatureProcessor`: `1.0` leaves the row untouched; otherwise each
/// logit becomes `logit / temperature`, divided (not multiplied by a reciprocal) so f32 results are
/// bit for bit torch's `div_`. Unlike the reference, a temperature that is not finite, that
/// rounds to infinity in f32, or that is below [`MIN_TEMPERATURE`] is rejected too, not only one
/// `<= 0`.
///
/// ```
/// use logits_processing::{process_row, Temperature};
/// let mut t = Temperature::new(0.5)?;
/// let mut row = [1.0f32, -2.0, 0.25];
/// process_row(&mut t, &[1u32, 2], &mut row)?;
/// assert_eq!(row, [2.0, -4.0, 0.5]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Temperature {
    temperature: f64,
    divisor: f32,
}

impl Temperature {
    pub fn new(temperature: f64) -> Result<Self> {
        let divisor = temperature as f32;
        if !(temperature.is_finite() && temperature >= MIN_TEMPERATURE && divisor.is_finite()) {
            return Err(Error::InvalidTemperature { value: temperature });
        }
        Ok(Self {
            temperature,
            divisor,
        })
    }

    pub fn temperature(&self) -> f64 {
        self.temperature
    }
}

impl LogitsProcessor for Temperature {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if self.temperature != 1.0 {
            plan.push(Edit::Scale {
                temperature: self.divisor,
            });
        }
        Ok(())
    }

    fn undo(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    #[test]
    fn rejects_non_positive_and_non_finite() {
        for t in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e-50,
            1e-45,
            9.9e-31,
            1e300,
        ] {
            assert!(matches!(
                Temperature::new(t),
                Err(Error::InvalidTemperature { value }) if value.to_bits() == t.to_bits()
            ));
        }
    }

    #[test]
    fn one_leaves_the_row_untouched() {
        let mut row = [f32::NAN, -0.0, 3.0];
        process_row(&mut Temperature::new(1.0).unwrap(), &[0u32], &mut row).unwrap();
        assert!(row[0].is_nan());
        assert_eq!(row[1].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn divides_rather_than_multiplies() {
        // 1/0.7 is not exact in f32, so a multiply by the reciprocal differs from the division here.
        let row_value = 0.3f32;
        let mut row = [row_value];
        process_row(&mut Temperature::new(0.7).unwrap(), &[0u32], &mut row).unwrap();
        assert_eq!(row[0].to_bits(), (row_value / 0.7f32).to_bits());
    }
}
