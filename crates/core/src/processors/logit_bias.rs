use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{check_len, EngineContext, KindSpec};

/// The largest bias a spec gives, either way, and where the biases kinds compute (penalties,
/// boosts) saturate: biases that meet on one token (a sequence bias's, a pipeline's) sum to at
/// most `1e30` times their number, far within f32's range.
pub const MAX_BIAS: f64 = 1e30;

/// Refuses a bias that is not finite or is larger than [`MAX_BIAS`], naming `field`.
pub(crate) fn check_bias(field: impl Into<String>, bias: f64) -> Result<()> {
    if bias.is_finite() && bias.abs() <= MAX_BIAS {
        return Ok(());
    }
    Err(Error::argument(
        field,
        format!("must be finite and at most 1e30 either way, got {bias}"),
    ))
}

/// `{"kind": "logit_bias", "bias": {"123": -1.5}}`: an object from token id (a string, as JSON
/// keys are) to a finite bias of at most `1e30` either way ([`MAX_BIAS`]; OpenAI's form).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogitBiasSpec {
    pub bias: BTreeMap<u32, f32>,
}

impl KindSpec for LogitBiasSpec {
    fn check(&self) -> Result<()> {
        check_len("bias", self.bias.len())?;
        self.bias
            .iter()
            .try_for_each(|(token, &bias)| check_bias(format!("bias.{token}"), bias as f64))
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        for &token in self.bias.keys() {
            context.check_id(&format!("bias.{token}"), token)?;
        }
        Ok(Box::new(LogitBias::new(
            self.bias.iter().map(|(&t, &b)| (t, b)).collect(),
        )?))
    }
}

/// Adds a fixed bias to some tokens' logits at every step (OpenAI's `logit_bias`). Biases must be
/// finite, so a bias never turns a banned (`-inf`) token back on.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitBias {
    biases: Vec<(u32, f32)>,
}

impl LogitBias {
    pub fn new(biases: Vec<(u32, f32)>) -> Result<Self> {
        if let Some((token, bias)) = biases.iter().find(|(_, b)| !b.is_finite()) {
            return Err(Error::argument(
                format!("bias[{token}]"),
                format!("must be finite, got {bias}"),
            ));
        }
        Ok(Self { biases })
    }

    pub fn biases(&self) -> &[(u32, f32)] {
        &self.biases
    }
}

impl LogitsProcessor for LogitBias {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        for &(token, bias) in &self.biases {
            plan.push(Edit::Bias { token, bias });
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.biases.iter().map(|&(token, _)| token).max()
    }
}
