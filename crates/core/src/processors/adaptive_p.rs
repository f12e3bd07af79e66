use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, Reshape, RowPlan};
use crate::processors::{Checkpoint, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "adaptive_p", "target": 0.5, "decay": 0.9}`: llama.cpp's adaptive-p
/// (`llama_sampler_init_adaptive_p(target, decay, seed)`): each step, every logit but `-inf`
/// becomes `5 - 10 d^2 / (1 + d)`, `d = |p - t| / 0.3`, `p` the token's probability in the row as
/// it comes in, so the tokens near the adapted target `t` are the likely ones;
/// `t = clamp(2 target - average, 0, 1)`, `average` an exponential moving average of the sampled
/// tokens' probabilities before the transform (weights `decay^i`; it starts as if every earlier
/// token had had probability `target`: sum `target / (1 - decay)`, weight `1 / (1 - decay)`).
///
/// `target` (finite; negative: off, as llama.cpp; above 1 counts as 1), `decay` (finite, default
/// 0.90, clamped to `0 ..= 0.99` as llama.cpp does). The engine samples; the next step reads the
/// sampled token's probability from the row the previous step's pass read (the plan keeps a copy
/// of that row: one row copy a step), as llama.cpp's `accept` does. After a resume the average
/// starts again as at the first step (it cannot be recomputed from ids); `weighted_sum` and
/// `total_weight` carry it. A step whose row cannot be read (no pass: the CUDA path, a plan
/// taken back, `process_row`'s new plan each call) or whose sampled token was `-inf` there
/// leaves the average as it was.
///
/// Differences: the probabilities are the fixed-point softmax's (`exp` of the truncation module
/// over the exact sum) where llama.cpp sums `expf` in f32, so the transformed logits agree to a
/// few units in the last place; the transform runs on every logit of the row, llama.cpp's on its
/// candidates (the same values).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdaptivePSpec {
    pub target: f64,
    #[serde(default = "default_decay")]
    pub decay: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weighted_sum: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_weight: Option<f64>,
}

fn default_decay() -> f64 {
    0.90
}

impl AdaptivePSpec {
    fn build(&self) -> Result<AdaptiveP> {
        let finite = |name: &str, v: f64| {
            if v.is_finite() && (v as f32).is_finite() {
                Ok(v as f32)
            } else {
                Err(Error::argument(name, format!("must be finite, got {v}")))
            }
        };
        let target = finite("target", self.target)?;
        let decay = finite("decay", self.decay)?.clamp(0.0, 0.99);
        let weighted_sum = match self.weighted_sum {
            Some(v) => finite("weighted_sum", v)?,
            None => target / (1.0 - decay),
        };
        let total_weight = match self.total_weight {
            Some(v) => finite("total_weight", v)?,
            None => 1.0 / (1.0 - decay),
        };
        Ok(AdaptiveP {
            target,
            decay,
            initial: (weighted_sum, total_weight),
            weighted_sum,
            total_weight,
            pending: None,
            last: None,
        })
    }
}

impl KindSpec for AdaptivePSpec {
    fn check(&self) -> Result<()> {
        self.build().map(drop)
    }

    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(self.build()?))
    }
}

/// Adaptive-p: see [`AdaptivePSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveP {
    target: f32,
    decay: f32,
    initial: (f32, f32),
    weighted_sum: f32,
    total_weight: f32,
    // The edit the last plan pushed and its index in the plan.
    pending: Pending,
    // For `undo`: the average and `pending` before the last plan.
    last: Option<(f32, f32, Pending)>,
}

/// The edit a plan pushed and its index in the plan.
type Pending = Option<(usize, Reshape)>;

impl AdaptiveP {
    /// The moving average's sum and weight.
    pub fn average(&self) -> (f32, f32) {
        (self.weighted_sum, self.total_weight)
    }
}

impl LogitsProcessor for AdaptiveP {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.last = Some((self.weighted_sum, self.total_weight, self.pending));
        if self.target < 0.0 {
            return Ok(());
        }
        if let Some((at, rule)) = self.pending {
            if let Reshape::AdaptiveP { key, .. } = rule {
                let key = key as usize;
                if ids.token_count() > key {
                    if let Some(p) = plan.observed(at, &Edit::Reshape(rule), ids.token_at(key)) {
                        // As llama.cpp's `accept`, in f32.
                        self.weighted_sum = p + self.decay * self.weighted_sum;
                        self.total_weight = 1.0 + self.decay * self.total_weight;
                    }
                }
            }
        }
        let target = self.target.clamp(0.0, 1.0);
        let adapted = if self.total_weight == 0.0 {
            target
        } else {
            2.0 * target - self.weighted_sum / self.total_weight
        }
        .clamp(0.0, 1.0);
        let rule = Reshape::AdaptiveP {
            target: adapted,
            key: ids.token_count().min(u32::MAX as usize) as u32,
        };
        self.pending = Some((plan.edits().len(), rule));
        plan.push(Edit::Reshape(rule));
        Ok(())
    }

    fn undo(&mut self) {
        if let Some((sum, weight, pending)) = self.last.take() {
            self.weighted_sum = sum;
            self.total_weight = weight;
            self.pending = pending;
        }
    }

    fn reset(&mut self) {
        (self.weighted_sum, self.total_weight) = self.initial;
        self.pending = None;
        self.last = None;
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        Some(Checkpoint::new((
            self.weighted_sum,
            self.total_weight,
            self.pending,
        )))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) {
        if let Some(&(sum, weight, pending)) = checkpoint.get() {
            self.weighted_sum = sum;
            self.total_weight = weight;
            self.pending = pending;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Pipeline, Step};

    #[test]
    fn the_transform_and_the_average_follow_llama_cpp() {
        let spec: AdaptivePSpec = serde_json::from_str(r#"{"target": 0.3, "decay": 0.5}"#).unwrap();
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(spec.build().unwrap()))]);
        let l = |p: f32| p.ln();
        let row = [l(0.5), l(0.3), l(0.2), f32::NEG_INFINITY];
        let mut out = row;
        pipeline.process(&[9u32], &mut out).unwrap();
        // The average starts at target: the adapted target is 0.3.
        let t = |p: f32| {
            let d = ((p - 0.3f32) * (1.0 / 0.3f32)).abs();
            5.0 - 10.0 * d * d / (1.0 + d)
        };
        for (i, p) in [0.5f32, 0.3, 0.2].into_iter().enumerate() {
            assert!((out[i] - t(p)).abs() < 1e-5, "{i}: {} vs {}", out[i], t(p));
        }
        assert_eq!(out[3], f32::NEG_INFINITY);
        // The engine sampled token 0 (p = 0.5 before the transform): sum 0.5 + 0.5 * 0.6,
        // weight 1 + 0.5 * 2, adapted target 0.6 - 0.8 / 2 = 0.2.
        let mut out = row;
        pipeline.process(&[9u32, 0], &mut out).unwrap();
        let Some(Step::Processor(p)) = pipeline.steps().first() else {
            panic!()
        };
        let text = format!("{p:?}");
        assert!(text.contains("weighted_sum: 0.8"), "{text}");
        assert!(text.contains("total_weight: 2.0"), "{text}");
    }
}
