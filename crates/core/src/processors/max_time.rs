use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::processors::clock::{Clock, SystemClock};
use crate::processors::end_token::EndToken;
use crate::processors::end_token::Seen;
use crate::processors::token_text::TextOrId;
use crate::processors::LogitsProcessor;
use crate::spec::with_kind;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "max_time", "max_time": 2.5, "boost_token": 2}`: the end token forced
/// once a request has run longer than `max_time` seconds of wall-clock time, as
/// logits-processor-zoo's `MaxTimeLogitsProcessor`.
///
/// - `max_time` (seconds, finite, >= 0), from the processor's first step: forcing starts once at
///   least that much time has passed (0: from the first step);
/// - `complete_sentences` (default false): only when the last id ends a sentence;
/// - `boost_token` (text of one token, or an id; default the engine's EOS id);
/// - `sentence_end_ids` (ids; default the zoo's full stop and new line, from the tokenizer).
///
/// Once the end token has been generated the kind does nothing. Differences from the zoo, on
/// purpose: forcing is hard (every other logit `-inf`); at the first step the zoo looks for the
/// end token in the whole prompt (its `input_ids[:, -0:]`), this kind only in the generated ids.
/// The clock is injectable ([`MaxTime::with_clock`]); a fresh processor for a resumed request
/// starts it again at its first step.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MaxTimeSpec {
    #[schemars(range(min = 0.0))]
    pub max_time: f64,
    #[serde(default)]
    pub complete_sentences: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boost_token: Option<TextOrId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentence_end_ids: Option<Vec<u32>>,
}

impl MaxTimeSpec {
    fn end_token(&self) -> EndToken<'_> {
        EndToken {
            boost_token: self.boost_token.as_ref(),
            complete_sentences: self.complete_sentences,
            sentence_end_ids: self.sentence_end_ids.as_deref(),
        }
    }
}

impl KindSpec for MaxTimeSpec {
    /// It counts generated tokens.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        if !(self.max_time.is_finite() && self.max_time >= 0.0) {
            return Err(Error::argument(
                "max_time",
                format!(
                    "must be a finite number of seconds >= 0, got {}",
                    self.max_time
                ),
            ));
        }
        self.end_token().check()
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let (boost_token, sentence_ends) = self.end_token().ids(context)?;
        Ok(Box::new(MaxTime::new(
            self.max_time,
            boost_token,
            sentence_ends,
            prompt_len,
        )))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        self.end_token().validate(context)
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        let Some((boost, ends)) = self.end_token().resolved(context) else {
            return Ok(None);
        };
        let resolved = MaxTimeSpec {
            boost_token: Some(boost),
            sentence_end_ids: ends,
            ..self.clone()
        };
        Ok(Some(with_kind("max_time", &resolved)))
    }
}

/// The end token after a time limit: see [`MaxTimeSpec`].
///
/// ```
/// use std::sync::Arc;
/// use logits_processing::{process_row, processors::{ManualClock, MaxTime}};
/// let clock = Arc::new(ManualClock::default());
/// let mut limit = MaxTime::new(2.0, 0, None, 1).with_clock(clock.clone());
/// let mut row = [0.5f32, 1.0, 2.0];
/// process_row(&mut limit, &[7u32], &mut row)?; // the clock starts
/// assert_eq!(row, [0.5, 1.0, 2.0]);
/// clock.set(2.5);
/// process_row(&mut limit, &[7u32, 2], &mut row)?;
/// assert_eq!(row, [0.5, f32::NEG_INFINITY, f32::NEG_INFINITY]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MaxTime {
    max_time: f64,
    boost_token: u32,
    sentence_ends: Option<Vec<u32>>,
    prompt_len: usize,
    clock: Arc<dyn Clock>,
    start: Option<f64>,
    seen: Seen,
    // For `undo`.
    before: (Option<f64>, Seen),
}

impl MaxTime {
    /// `boost_token` forced after `max_time` seconds (when the last id is one of `sentence_ends`,
    /// if given); generated ids start at `prompt_len`. The process's monotonic clock.
    pub fn new(
        max_time: f64,
        boost_token: u32,
        sentence_ends: Option<Vec<u32>>,
        prompt_len: usize,
    ) -> Self {
        Self {
            max_time,
            boost_token,
            sentence_ends,
            prompt_len,
            clock: SystemClock::shared(),
            start: None,
            seen: Seen::default(),
            before: (None, Seen::default()),
        }
    }

    /// The same limit, reading `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

impl LogitsProcessor for MaxTime {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.before = (self.start, self.seen);
        let now = self.clock.now();
        let start = *self.start.get_or_insert(now);
        let mut enabled = !self.seen.update(ids, self.prompt_len, self.boost_token);
        if let Some(ends) = &self.sentence_ends {
            enabled &= ids.last_token().is_some_and(|last| ends.contains(&last));
        }
        // At least `max_time`: 0 forces from the first step, as the zoo's `>` in practice (its
        // clock has moved on between its start and its first check).
        if enabled && now - start >= self.max_time {
            plan.push(Edit::Force {
                token: self.boost_token,
                value: ForcedValue::Keep,
            });
        }
        Ok(())
    }

    fn undo(&mut self) {
        (self.start, self.seen) = self.before;
    }

    fn max_token_id(&self) -> Option<u32> {
        Some(self.boost_token)
    }

    fn reset(&mut self) {
        self.start = None;
        self.seen = Seen::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;
    use crate::processors::ManualClock;

    #[test]
    fn forces_after_the_limit_at_a_sentence_end_until_the_end_token_is_written() {
        let clock = Arc::new(ManualClock::default());
        clock.set(10.0);
        let mut limit = MaxTime::new(1.0, 0, Some(vec![5]), 0).with_clock(clock.clone());
        let row = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        let mut out = row;
        process_row(&mut limit, &[1u32], &mut out).unwrap();
        assert_eq!(out, row, "the clock starts at the first step");
        clock.set(11.5);
        let mut out = row;
        process_row(&mut limit, &[1u32, 2], &mut out).unwrap();
        assert_eq!(out, row, "not at a sentence end");
        let mut out = row;
        process_row(&mut limit, &[1u32, 2, 5], &mut out).unwrap();
        assert_eq!(out.iter().filter(|x| x.is_finite()).count(), 1);
        let mut out = row;
        process_row(&mut limit, &[1u32, 2, 5, 0, 5], &mut out).unwrap();
        assert_eq!(out, row, "the end token was written");
    }

    #[test]
    fn an_undone_first_step_does_not_start_the_clock() {
        let clock = Arc::new(ManualClock::default());
        let mut limit = MaxTime::new(1.0, 0, None, 0).with_clock(clock.clone());
        limit.plan(&[1u32], &mut RowPlan::new()).unwrap();
        limit.undo();
        clock.set(5.0);
        let mut out = [1.0f32, 2.0];
        process_row(&mut limit, &[1u32], &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0]);
    }
}
