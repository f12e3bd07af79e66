use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan, Trigger};
use crate::processors::clock::{Clock, SystemClock};
use crate::processors::phrase::{Phase, PhraseRuns};
use crate::processors::token_text::{TextOrId, TextOrIds};
use crate::processors::{Checkpoint, LogitsProcessor};
use crate::spec::{structure_only, with_kind};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "trigger_phrase", "phrase": [6029, 1077], "trigger_token_phrase": 7, "trigger_count": 1}`:
/// a phrase written when the model is about to write
/// a trigger token, or after some time, as logits-processor-zoo's `TriggerPhraseLogitsProcessor`.
///
/// - `phrase`: text or ids;
/// - `trigger_token_phrase`: the trigger, text of one token or an id: the phrase starts when it is
///   the most likely token of the row as it stands at this step (a tie for the largest counts);
/// - `trigger_time`: or (and) seconds of wall-clock time since the first step, or since the last
///   phrase ended; `0` means never, as in the zoo. At least one of the two;
/// - `trigger_count` (default 1): how many times the phrase is written;
/// - `trigger_after` (default false): the phrase follows the trigger step (which the model then
///   writes as it likes) instead of replacing its token.
///
/// Differences from the zoo, on purpose: forcing is hard (every other logit `-inf`); progress
/// through a phrase counts generated tokens, and a fresh processor for a resumed request reads
/// the phrases written so far from the ids (each full occurrence of the phrase counts against
/// `trigger_count`; ids ending with a part of it continue it; with `trigger_after`, ids ending
/// with the trigger token start the phrase, though the trigger's step may have had another
/// argmax). The clock is injectable
/// ([`TriggerPhrase::with_clock`]) and a fresh processor starts it again.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerPhraseSpec {
    pub phrase: TextOrIds,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_token_phrase: Option<TextOrId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub trigger_time: Option<f64>,
    #[serde(default = "default_count")]
    pub trigger_count: u32,
    #[serde(default)]
    pub trigger_after: bool,
}

fn default_count() -> u32 {
    1
}

impl KindSpec for TriggerPhraseSpec {
    /// It counts generated tokens.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        self.phrase.check("phrase")?;
        if self.trigger_token_phrase.is_none() && self.trigger_time.is_none() {
            return Err(Error::spec(
                "trigger_token_phrase",
                "give trigger_token_phrase, trigger_time or both",
            ));
        }
        if let Some(t) = self.trigger_time {
            if !(t.is_finite() && t >= 0.0) {
                return Err(Error::argument(
                    "trigger_time",
                    format!("must be a finite number of seconds >= 0 (0: never), got {t}"),
                ));
            }
        }
        Ok(())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let phrase = self.phrase.ids(context, "phrase")?;
        let trigger = self
            .trigger_token_phrase
            .as_ref()
            .map(|t| t.id(context, "trigger_token_phrase"))
            .transpose()?;
        Ok(Box::new(TriggerPhrase::new(
            phrase,
            trigger,
            self.trigger_time,
            self.trigger_count,
            self.trigger_after,
            prompt_len,
        )))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        let needs = self.phrase.is_text()
            || self
                .trigger_token_phrase
                .as_ref()
                .is_some_and(TextOrId::is_text);
        structure_only(context, needs).then_some(Ok(()))
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if context.encoder.is_none() {
            return Ok(None);
        }
        let resolved = TriggerPhraseSpec {
            phrase: TextOrIds::Ids(self.phrase.ids(context, "phrase")?),
            trigger_token_phrase: self
                .trigger_token_phrase
                .as_ref()
                .map(|t| t.id(context, "trigger_token_phrase").map(TextOrId::Id))
                .transpose()?,
            ..self.clone()
        };
        Ok(Some(with_kind("trigger_phrase", &resolved)))
    }
}

/// A phrase on a trigger token or after a time: see [`TriggerPhraseSpec`].
///
/// ```
/// use logits_processing::{Pipeline, Step, processors::TriggerPhrase};
/// // Phrase [4, 5] instead of trigger 1, once; no time trigger; prompt of one id.
/// let p = TriggerPhrase::new(vec![4, 5], Some(1), None, 1, false, 1);
/// let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(p))]);
/// let mut row = [0.0f32, 3.0, 2.0, 0.0, 0.5, 0.0];
/// pipeline.process(&[9u32], &mut row)?;
/// assert_eq!(row.iter().position(|x| x.is_finite()), Some(4));
/// let mut row = [0.0f32, 3.0, 2.0, 0.0, 0.5, 0.0];
/// pipeline.process(&[9u32, 4], &mut row)?;
/// assert_eq!(row.iter().position(|x| x.is_finite()), Some(5));
/// let mut row = [0.0f32, 3.0, 2.0, 0.0, 0.5, 0.0];
/// pipeline.process(&[9u32, 4, 5], &mut row)?; // trigger_count reached
/// assert_eq!(row, [0.0, 3.0, 2.0, 0.0, 0.5, 0.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TriggerPhrase {
    trigger: Option<u32>,
    /// `None`: no time trigger (`trigger_time` absent or 0).
    trigger_time: Option<f64>,
    trigger_after: bool,
    runs: PhraseRuns,
    clock: Arc<dyn Clock>,
    start: Option<f64>,
    before: Option<f64>,
}

impl TriggerPhrase {
    /// `phrase` (not empty) on `trigger` or after `trigger_time` seconds (`0`: never),
    /// `trigger_count` times; generated ids start at `prompt_len`.
    pub fn new(
        phrase: Vec<u32>,
        trigger: Option<u32>,
        trigger_time: Option<f64>,
        trigger_count: u32,
        trigger_after: bool,
        prompt_len: usize,
    ) -> Self {
        Self {
            trigger,
            trigger_time: trigger_time.filter(|&t| t > 0.0),
            trigger_after,
            runs: PhraseRuns::new(
                phrase,
                prompt_len,
                trigger_after as usize,
                0,
                Some(trigger_count),
            )
            .with_trigger_before(trigger),
            clock: SystemClock::shared(),
            start: None,
            before: None,
        }
    }

    /// The same trigger, reading `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn force(&self, plan: &mut RowPlan, k: usize) {
        plan.push(Edit::Force {
            token: self.runs.phrase()[k],
            value: ForcedValue::Keep,
        });
    }

    /// The phrase's last token is forced at this step: its time restarts, as the zoo's.
    fn ends_phrase(&mut self, k: usize, now: f64) {
        if k + 1 == self.runs.phrase().len() {
            self.start = Some(now);
        }
    }
}

impl LogitsProcessor for TriggerPhrase {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.before = self.start;
        let now = self.clock.now();
        let start = *self.start.get_or_insert(now);
        let n = self.runs.step(ids);
        match self.runs.begin(ids, plan).0 {
            Phase::Armed => {
                let time_over = self.trigger_time.is_some_and(|t| now - start > t);
                if time_over {
                    self.runs.fire_now(n);
                    if !self.trigger_after {
                        self.force(plan, 0);
                        self.ends_phrase(0, now);
                    }
                } else if let Some(trigger) = self.trigger {
                    let edit = Edit::ForceIf {
                        token: (!self.trigger_after).then(|| self.runs.phrase()[0]),
                        when: Trigger::ArgmaxIs { token: trigger },
                        key: n.min(u32::MAX as usize) as u32,
                    };
                    self.runs.arm(plan, edit, n, true);
                }
            }
            Phase::Force(k) => {
                self.force(plan, k);
                self.ends_phrase(k, now);
            }
            Phase::Idle | Phase::Done => {}
        }
        Ok(())
    }

    fn undo(&mut self) {
        self.runs.undo();
        self.start = self.before;
    }

    fn max_token_id(&self) -> Option<u32> {
        self.runs.phrase().iter().copied().chain(self.trigger).max()
    }

    fn reset(&mut self) {
        self.runs.reset();
        self.start = None;
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        Some(Checkpoint::new((self.runs.saved(), self.start)))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) {
        if let Some(&(state, start)) = checkpoint.get() {
            self.runs.restore(state);
            self.start = start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::ManualClock;
    use crate::{Pipeline, Step};

    fn survivors(row: &[f32]) -> Vec<usize> {
        (0..row.len()).filter(|&i| row[i].is_finite()).collect()
    }

    /// Runs `steps` steps with the trigger (token 1) the argmax at `trigger_at`; the next id is
    /// the forced one, else 3. Returns the generated ids.
    fn generate(p: TriggerPhrase, steps: usize, trigger_at: &[usize]) -> Vec<u32> {
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(p))]);
        let mut ids = vec![9u32];
        for step in 0..steps {
            let mut row = [0.0f32, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
            if trigger_at.contains(&step) {
                row[1] = 2.0;
            }
            pipeline.process(&ids, &mut row).unwrap();
            let kept = survivors(&row);
            ids.push(match kept.len() {
                1 => kept[0] as u32,
                _ if trigger_at.contains(&step) => 1,
                _ => 3,
            });
        }
        ids.split_off(1)
    }

    #[test]
    fn replaced_ids_equal_a_fresh_processor() {
        let new = || TriggerPhrase::new(vec![4, 5], Some(9), None, 2, false, 0);
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(new()))]);
        let mut row = vec![0.0f32; 10];
        row[9] = 1.0;
        // A run written, then another history of the same or larger length, not an extension.
        for ids in [
            &[1u32][..],
            &[1, 4],
            &[1, 4, 5],
            &[1, 4, 5, 7],
            &[2, 2, 2, 2, 2],
        ] {
            let mut r = row.clone();
            pipeline.process(&ids, &mut r).unwrap();
        }
        let ids = [2u32, 2, 2, 2, 2, 2];
        let mut continuing = row.clone();
        pipeline.process(&ids, &mut continuing).unwrap();
        let mut fresh = row.clone();
        Pipeline::new(vec![Step::Processor(Box::new(new()))])
            .process(&ids, &mut fresh)
            .unwrap();
        assert_eq!(survivors(&continuing), survivors(&fresh));
    }

    #[test]
    fn instead_of_the_trigger_or_after_it_as_often_as_asked() {
        let instead = TriggerPhrase::new(vec![5, 6], Some(1), None, 2, false, 1);
        assert_eq!(
            generate(instead, 10, &[1, 4, 7]),
            [3, 5, 6, 3, 5, 6, 3, 1, 3, 3]
        );
        let after = TriggerPhrase::new(vec![5, 6], Some(1), None, 1, true, 1);
        assert_eq!(generate(after, 7, &[1, 5]), [3, 1, 5, 6, 3, 1, 3]);
    }

    #[test]
    fn a_time_trigger_fires_after_its_time_and_restarts_when_the_phrase_ends() {
        let clock = Arc::new(ManualClock::default());
        let p =
            TriggerPhrase::new(vec![5, 6], None, Some(1.0), 2, false, 1).with_clock(clock.clone());
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(p))]);
        let mut ids = vec![9u32];
        let mut out = vec![];
        for (step, time) in [0.0, 0.5, 1.5, 1.6, 2.0, 2.7, 3.0].iter().enumerate() {
            clock.set(*time);
            let mut row = [0.0f32, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
            pipeline.process(&ids, &mut row).unwrap();
            let kept = survivors(&row);
            let next = if kept.len() == 1 { kept[0] as u32 } else { 3 };
            ids.push(next);
            out.push(next);
            let _ = step;
        }
        // Fires at 1.5 (5, then 6 at 1.6: the time restarts); again past 2.6.
        assert_eq!(out, [3, 3, 5, 6, 3, 5, 6]);
    }

    #[test]
    fn a_re_sent_request_continues_as_the_uninterrupted_one() {
        let trigger = (vec![0.0f32, 5.0, 0.0, 1.0, 0.0, 0.0, 0.0], 1);
        let other = (vec![0.0f32, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], 3);
        for after in [false, true] {
            let rows = [
                other.clone(),
                trigger.clone(),
                other.clone(),
                other.clone(),
                other.clone(),
                trigger.clone(),
                other.clone(),
                other.clone(),
                trigger.clone(),
                other.clone(),
            ];
            let make = || Box::new(TriggerPhrase::new(vec![5, 6], Some(1), None, 2, after, 1)) as _;
            let out = crate::processors::phrase::resumed_equals_uninterrupted(make, &[9], &rows);
            let want: &[u32] = match after {
                false => &[3, 5, 6, 3, 3, 5, 6, 3, 1, 3],
                true => &[3, 1, 5, 6, 3, 1, 5, 6, 1, 3],
            };
            assert_eq!(out, want, "trigger_after {after}");
        }
    }

    #[test]
    fn trigger_time_zero_never_fires() {
        let clock = Arc::new(ManualClock::default());
        let p = TriggerPhrase::new(vec![5], None, Some(0.0), 1, false, 0).with_clock(clock.clone());
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(p))]);
        clock.set(100.0);
        let mut row = [0.0f32; 6];
        pipeline.process(&[0u32; 0], &mut row).unwrap();
        clock.set(200.0);
        pipeline.process(&[3u32], &mut row).unwrap();
        assert_eq!(row, [0.0; 6]);
    }
}
