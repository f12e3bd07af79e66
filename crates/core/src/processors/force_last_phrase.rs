use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan, Trigger};
use crate::processors::phrase::{Phase, PhraseRuns};
use crate::processors::token_text::{eos_or, TextOrIds};
use crate::processors::{Checkpoint, LogitsProcessor};
use crate::spec::structure_only;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "force_last_phrase", "phrase": [271, 9906], "eos_token_id": 2}`: the phrase the model
/// must write before it ends, as logits-processor-zoo's `ForceLastPhraseLogitsProcessor`.
///
/// - `phrase`: text (encoded with the engine's tokenizer, no special tokens) or ids;
/// - `eos_token_id`: the end the phrase goes before (default: the engine's EOS id).
///
/// The first time EOS is the most likely token of the row as it stands at this step (a tie for
/// the largest counts), the step forces the phrase's first token instead, and the following
/// steps force the rest, one token each; then the kind does nothing more (the model may end).
///
/// Differences from the zoo, on purpose: forcing is hard (every other logit becomes `-inf`; the
/// zoo fills them with the row's minimum, which leaves them some probability on a flat row);
/// progress through the phrase counts generated tokens, not calls. A fresh processor for a
/// resumed request reads its progress from the ids (see [`crate::processors`]' phrase runs):
/// generated ids that end with a part of the phrase continue it, and a phrase already written in
/// full counts as done, though the model may have written it by itself.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceLastPhraseSpec {
    pub phrase: TextOrIds,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
}

impl KindSpec for ForceLastPhraseSpec {
    /// It counts generated tokens.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        self.phrase.check("phrase")
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let phrase = self.phrase.ids(context, "phrase")?;
        let eos = eos_or(context, self.eos_token_id, "eos_token_id")?;
        Ok(Box::new(ForceLastPhrase::new(phrase, eos, prompt_len)))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        structure_only(
            context,
            self.phrase.is_text() || self.eos_token_id.is_none(),
        )
        .then_some(Ok(()))
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if context.encoder.is_none() && self.phrase.is_text() {
            return Ok(None);
        }
        let Ok(eos) = eos_or(context, self.eos_token_id, "eos_token_id") else {
            return Ok(None);
        };
        let resolved = ForceLastPhraseSpec {
            phrase: TextOrIds::Ids(self.phrase.ids(context, "phrase")?),
            eos_token_id: Some(eos),
        };
        Ok(Some(crate::spec::with_kind("force_last_phrase", &resolved)))
    }
}

/// The phrase before the end: see [`ForceLastPhraseSpec`].
///
/// ```
/// use logits_processing::{Pipeline, Step, processors::ForceLastPhrase};
/// // Phrase [4, 5] before EOS 0; prompt of one id.
/// let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(ForceLastPhrase::new(vec![4, 5], 0, 1)))]);
/// let mut row = [3.0f32, 1.0, 2.0, 0.0, 0.5, 0.0];
/// pipeline.process(&[9u32], &mut row)?; // EOS is the argmax: 4 instead
/// assert_eq!(row.iter().position(|x| x.is_finite()), Some(4));
/// let mut row = [3.0f32, 1.0, 2.0, 0.0, 0.5, 0.0];
/// pipeline.process(&[9u32, 4], &mut row)?; // then 5
/// assert_eq!(row.iter().position(|x| x.is_finite()), Some(5));
/// let mut row = [3.0f32, 1.0, 2.0, 0.0, 0.5, 0.0];
/// pipeline.process(&[9u32, 4, 5], &mut row)?; // then the model may end
/// assert_eq!(row, [3.0, 1.0, 2.0, 0.0, 0.5, 0.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ForceLastPhrase {
    eos_token_id: u32,
    runs: PhraseRuns,
}

impl ForceLastPhrase {
    /// `phrase` (not empty) before `eos_token_id`; generated ids start at `prompt_len`.
    pub fn new(phrase: Vec<u32>, eos_token_id: u32, prompt_len: usize) -> Self {
        Self {
            eos_token_id,
            runs: PhraseRuns::new(phrase, prompt_len, 0, 0, Some(1)),
        }
    }
}

impl LogitsProcessor for ForceLastPhrase {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let n = self.runs.step(ids);
        match self.runs.begin(ids, plan).0 {
            Phase::Armed => {
                let edit = Edit::ForceIf {
                    token: Some(self.runs.phrase()[0]),
                    when: Trigger::ArgmaxIs {
                        token: self.eos_token_id,
                    },
                    key: n.min(u32::MAX as usize) as u32,
                };
                self.runs.arm(plan, edit, n, true);
            }
            Phase::Force(k) => plan.push(Edit::Force {
                token: self.runs.phrase()[k],
                value: ForcedValue::Keep,
            }),
            Phase::Idle | Phase::Done => {}
        }
        Ok(())
    }

    fn undo(&mut self) {
        self.runs.undo();
    }

    fn max_token_id(&self) -> Option<u32> {
        self.runs
            .phrase()
            .iter()
            .copied()
            .chain([self.eos_token_id])
            .max()
    }

    fn reset(&mut self) {
        self.runs.reset();
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        Some(Checkpoint::new(self.runs.saved()))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) {
        if let Some(&state) = checkpoint.get() {
            self.runs.restore(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Pipeline, Step};

    fn pipeline(phrase: Vec<u32>, eos: u32, prompt_len: usize) -> Pipeline {
        Pipeline::new(vec![Step::Processor(Box::new(ForceLastPhrase::new(
            phrase, eos, prompt_len,
        )))])
    }

    fn survivors(row: &[f32]) -> Vec<usize> {
        (0..row.len()).filter(|&i| row[i].is_finite()).collect()
    }

    #[test]
    fn nothing_until_eos_is_the_argmax_then_the_phrase_once() {
        let mut p = pipeline(vec![3, 4, 3], 0, 2);
        let mut ids = vec![9u32, 9];
        let not_eos = [1.0f32, 2.0, 0.0, 0.0, 0.0];
        let eos = [2.0f32, 1.0, 0.0, 0.0, 0.0];
        let mut forced = vec![];
        for step in 0..8 {
            let mut row = if step >= 2 { eos } else { not_eos };
            p.process(&ids, &mut row).unwrap();
            let kept = survivors(&row);
            let next = if kept.len() == 1 {
                forced.push(kept[0]);
                kept[0] as u32
            } else {
                assert_eq!(row, if step >= 2 { eos } else { not_eos });
                if step >= 2 {
                    0
                } else {
                    1
                }
            };
            ids.push(next);
        }
        assert_eq!(forced, [3, 4, 3]);
        assert_eq!(&ids[2..], [1, 1, 3, 4, 3, 0, 0, 0]);
    }

    #[test]
    fn a_tie_for_the_largest_fires_and_a_banned_eos_does_not() {
        let mut p = pipeline(vec![3], 0, 0);
        let mut row = [1.0f32, 1.0, 0.0, 0.0];
        p.process(&[0u32; 0], &mut row).unwrap();
        assert_eq!(survivors(&row), [3]);
        let mut p = pipeline(vec![3], 0, 0);
        let mut row = [f32::NEG_INFINITY; 4];
        p.process(&[0u32; 0], &mut row).unwrap();
        assert_eq!(row, [f32::NEG_INFINITY; 4]);
    }

    #[test]
    fn a_re_sent_request_continues_as_the_uninterrupted_one() {
        let eos_row = (vec![5.0f32, 1.0, 0.0, 0.0, 0.0, 0.0], 0);
        let other = (vec![1.0f32, 5.0, 0.0, 0.0, 0.0, 0.0], 1);
        let rows = [
            other.clone(),
            eos_row.clone(),
            eos_row.clone(),
            eos_row.clone(),
            other,
            eos_row,
        ];
        let make = || Box::new(ForceLastPhrase::new(vec![3, 4, 5], 0, 2)) as _;
        let out = crate::processors::phrase::resumed_equals_uninterrupted(make, &[9, 9], &rows);
        assert_eq!(out, [1, 3, 4, 5, 1, 0]);
    }

    #[test]
    fn a_fresh_processor_continues_a_phrase_from_the_ids() {
        // Resumed after the trigger fired and "3 4" was written: the next is 5.
        let mut p = pipeline(vec![3, 4, 5], 0, 1);
        let mut row = [0.0f32; 6];
        p.process(&[9u32, 1, 3, 4], &mut row).unwrap();
        assert_eq!(survivors(&row), [5]);
        // A phrase written in full: done.
        let mut p = pipeline(vec![3, 4, 5], 0, 1);
        let mut row = [1.0f32, 0.0, 0.0, 0.0, 0.0, 0.0];
        p.process(&[9u32, 3, 4, 5], &mut row).unwrap();
        assert_eq!(row, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }
}
