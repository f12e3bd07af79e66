use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan, Trigger};
use crate::processors::phrase::{Phase, PhraseRuns};
use crate::processors::token_text::TextOrIds;
use crate::processors::{Checkpoint, LogitsProcessor};
use crate::spec::{structure_only, with_kind};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "prevent_hallucination", "minp": 0.4, "tolerate": 1, "phrase": [1131, 40]}`:
/// a fallback phrase when the model keeps being unsure, as logits-processor-zoo's
/// `PreventHallucinationLogitsProcessor`.
///
/// - `minp` (0 ..= 1, default 0.4): a step is unsure when the largest probability of the row as
///   it stands there is below it;
/// - `tolerate` (int >= 0, default 1): the unsure steps tolerated; the next one forces the
///   phrase's first token instead, and the following steps the rest;
/// - `phrase` (text or ids, default `"...I don't know actually.\n"`).
///
/// As in the zoo, every step counts (the phrase's steps too), the step after a phrase does
/// nothing and sets the count back to 0, and the phrase may come again.
///
/// Differences from the zoo, on purpose: forcing is hard (every other logit `-inf`); progress
/// through the phrase counts generated tokens. The count of unsure steps is read from the passes
/// over the rows: a fresh processor for a resumed request starts it at 0, and reads a phrase in
/// progress from the ids (ids ending with a part of the phrase).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreventHallucinationSpec {
    #[serde(default = "default_minp")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub minp: f64,
    #[serde(default = "default_tolerate")]
    pub tolerate: u32,
    #[serde(default = "default_phrase")]
    pub phrase: TextOrIds,
}

fn default_minp() -> f64 {
    0.4
}

fn default_tolerate() -> u32 {
    1
}

fn default_phrase() -> TextOrIds {
    TextOrIds::Text("...I don't know actually.\n".into())
}

impl KindSpec for PreventHallucinationSpec {
    /// It counts generated tokens.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.minp) {
            return Err(Error::argument(
                "minp",
                format!("must be in 0 ..= 1, got {}", self.minp),
            ));
        }
        self.phrase.check("phrase")
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let phrase = self.phrase.ids(context, "phrase")?;
        Ok(Box::new(PreventHallucination::new(
            self.minp as f32,
            self.tolerate,
            phrase,
            prompt_len,
        )))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        structure_only(context, self.phrase.is_text()).then_some(Ok(()))
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if context.encoder.is_none() {
            return Ok(None);
        }
        let resolved = PreventHallucinationSpec {
            phrase: TextOrIds::Ids(self.phrase.ids(context, "phrase")?),
            ..self.clone()
        };
        Ok(Some(with_kind("prevent_hallucination", &resolved)))
    }
}

/// The fallback phrase: see [`PreventHallucinationSpec`].
///
/// ```
/// use logits_processing::{Pipeline, Step, processors::PreventHallucination};
/// // Phrase [4], after more than 0 unsure steps (largest probability below 0.5).
/// let p = PreventHallucination::new(0.5, 0, vec![4], 0);
/// let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(p))]);
/// let mut row = [0.0f32; 6]; // flat: unsure
/// pipeline.process(&[0u32; 0], &mut row)?;
/// assert_eq!(row.iter().position(|x| x.is_finite()), Some(4));
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PreventHallucination {
    minp: f32,
    tolerate: u32,
    runs: PhraseRuns,
    /// Unsure steps since the last phrase, as the passes reported them.
    count: u32,
    /// Whether the last armed step only watched (its firing counts an unsure step).
    watching: bool,
    before: (u32, bool),
}

impl PreventHallucination {
    /// `phrase` (not empty) once more than `tolerate` steps had a largest probability below
    /// `minp`; generated ids start at `prompt_len`.
    pub fn new(minp: f32, tolerate: u32, phrase: Vec<u32>, prompt_len: usize) -> Self {
        Self {
            minp,
            tolerate,
            runs: PhraseRuns::new(phrase, prompt_len, 0, 1, None),
            count: 0,
            watching: false,
            before: (0, false),
        }
    }
}

impl LogitsProcessor for PreventHallucination {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.before = (self.count, self.watching);
        let n = self.runs.step(ids);
        let (phase, fired) = self.runs.begin(ids, plan);
        if !self.runs.observed() {
            self.count = 0;
        } else if fired == Some(true) && self.watching {
            self.count += 1;
        }
        match phase {
            Phase::Armed => {
                // The count before this step is at most `tolerate`: this step's row fires the
                // phrase when it is unsure and the count has reached `tolerate`.
                self.watching = self.count < self.tolerate;
                let edit = Edit::ForceIf {
                    token: (!self.watching).then(|| self.runs.phrase()[0]),
                    when: Trigger::MaxProbBelow { p: self.minp },
                    key: n.min(u32::MAX as usize) as u32,
                };
                self.runs.arm(plan, edit, n, !self.watching);
            }
            Phase::Force(k) => plan.push(Edit::Force {
                token: self.runs.phrase()[k],
                value: ForcedValue::Keep,
            }),
            // The step after a phrase: the zoo sets its count back.
            Phase::Idle => self.count = 0,
            Phase::Done => {}
        }
        Ok(())
    }

    fn undo(&mut self) {
        self.runs.undo();
        (self.count, self.watching) = self.before;
    }

    fn max_token_id(&self) -> Option<u32> {
        self.runs.phrase().iter().copied().max()
    }

    fn reset(&mut self) {
        self.runs.reset();
        self.count = 0;
        self.watching = false;
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        Some(Checkpoint::new((
            self.runs.saved(),
            self.count,
            self.watching,
        )))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) {
        if let Some(&(state, count, watching)) = checkpoint.get() {
            self.runs.restore(state);
            (self.count, self.watching) = (count, watching);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Pipeline, Step};

    #[test]
    fn the_phrase_after_more_than_tolerate_unsure_steps_then_a_reset_step() {
        let p = PreventHallucination::new(0.4, 1, vec![5, 6], 0);
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(p))]);
        let sure = [0.0f32, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let unsure = [0.0f32; 7];
        // unsure, sure, unsure (fires: 2 > 1), phrase, reset step, unsure, unsure (fires again).
        let rows = [unsure, sure, unsure, unsure, unsure, unsure, unsure, unsure];
        let mut ids = vec![];
        let mut out = vec![];
        for row in rows {
            let mut r = row;
            pipeline.process(&ids, &mut r).unwrap();
            let kept: Vec<usize> = (0..7).filter(|&i| r[i].is_finite()).collect();
            let next = if kept.len() == 1 { kept[0] as u32 } else { 1 };
            out.push(next);
            ids.push(next);
        }
        assert_eq!(out, [1, 1, 5, 6, 1, 1, 5, 6]);
    }
}
