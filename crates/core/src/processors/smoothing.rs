use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
#[cfg(doc)]
use crate::plan::Shape;
use crate::plan::{Edit, Reshape, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "smoothing", "factor": 0.3, "curve": 1.0}`: text-generation-webui's quadratic sampling
/// (`QuadraticSamplingLogitsWarper`, its `smoothing_factor` and `smoothing_curve`). With `m` the
/// largest logit and `d = x - m`, every logit but `-inf` becomes
///
/// `-(k * factor * d^2) + s * factor * d^3 + m`, `k = (3 - curve) / 2`, `s = (curve - 1) / 2`,
///
/// computed as torch computes the webui's expression on an f32 row (`k * factor` and
/// `s * factor` in f64 rounded to f32, then f32 operations; see [`Shape::Quadratic`]). Where
/// torch's arithmetic would overflow, it saturates: the constants at `±f32::MAX`, a value whose
/// f32 expression overflows at the f64 expression clamped to `±f32::MAX`, so a finite logit
/// stays finite.
/// `factor` (finite, `>= 0`; 0 changes nothing), `curve` (finite, default 1: purely quadratic).
/// A row whose largest logit is not finite is left as it is (the webui would fill it with NaN);
/// NaN logits stay NaN and do not count for the maximum.
///
/// ```
/// use logits_processing::{process_row, processors::Smoothing};
/// let mut smooth = Smoothing::new(0.5, 1.0)?;
/// let mut row = [2.0f32, 0.0, f32::NEG_INFINITY];
/// process_row(&mut smooth, &[0u32], &mut row)?;
/// assert_eq!(row, [2.0, 0.0, f32::NEG_INFINITY]); // -(0.5 * 4) + 2 = 0
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SmoothingSpec {
    #[schemars(range(min = 0.0))]
    pub factor: f64,
    #[serde(default = "default_curve")]
    pub curve: f64,
}

fn default_curve() -> f64 {
    1.0
}

impl KindSpec for SmoothingSpec {
    fn check(&self) -> Result<()> {
        Smoothing::new(self.factor, self.curve).map(drop)
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Smoothing::new(self.factor, self.curve)?))
    }
}

/// Quadratic sampling at every step: see [`SmoothingSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct Smoothing {
    factor: f64,
    curve: f64,
}

impl Smoothing {
    pub fn new(factor: f64, curve: f64) -> Result<Self> {
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(Error::argument(
                "factor",
                format!("must be finite and >= 0, got {factor}"),
            ));
        }
        if !curve.is_finite() {
            return Err(Error::argument(
                "curve",
                format!("must be finite, got {curve}"),
            ));
        }
        Ok(Self { factor, curve })
    }
}

impl LogitsProcessor for Smoothing {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if self.factor > 0.0 {
            // Past f32's range the constants saturate (an infinite one would make the maximum
            // itself NaN: `inf * 0`).
            let to_f32 = |c: f64| c.clamp(-(f32::MAX as f64), f32::MAX as f64) as f32;
            plan.push(Edit::Reshape(Reshape::Smoothing {
                k: to_f32((3.0 - self.curve) / 2.0 * self.factor),
                s: to_f32((self.curve - 1.0) / 2.0 * self.factor),
            }));
        }
        Ok(())
    }

    fn undo(&mut self) {}
}
