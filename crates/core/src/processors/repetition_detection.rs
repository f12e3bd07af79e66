use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::cursor::Cursor;
use crate::processors::eos::{check_eos, eos_ids, ForcedEosIds};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// The largest `max_pattern_size`: each step costs one compare per pattern size.
const MAX_PATTERN_SIZE: usize = 4096;

/// `{"kind": "repetition_detection", "max_pattern_size": 8, "min_pattern_size": 1,
/// "min_count": 3, "eos_token_ids": [2]}`: vLLM's `RepetitionDetectionParams`. Once the
/// generated ids end with `min_count` repeats of one pattern of `min_pattern_size ..=
/// max_pattern_size` ids (`min_pattern_size` 0 meaning 1), the next token is forced to EOS, as
/// vLLM ends the request at that step. `max_pattern_size` 0 or `min_count` below 2 turns it off
/// (vLLM refuses a `min_count` below 2 with a pattern size set).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepetitionDetectionSpec {
    #[schemars(range(max = 4096))]
    pub max_pattern_size: usize,
    #[serde(default)]
    pub min_pattern_size: usize,
    pub min_count: usize,
    pub eos_token_ids: Vec<u32>,
}

impl KindSpec for RepetitionDetectionSpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        // vLLM's `RepetitionDetectionParams.__post_init__` (a `min_count` below 2 is off here, as
        // `check_sequence_repetition` treats it), and a bound on the step's cost.
        if self.min_pattern_size > self.max_pattern_size {
            return Err(Error::argument(
                "min_pattern_size",
                format!(
                    "{} is above max_pattern_size {}",
                    self.min_pattern_size, self.max_pattern_size
                ),
            ));
        }
        if self.max_pattern_size > MAX_PATTERN_SIZE {
            return Err(Error::argument(
                "max_pattern_size",
                format!("{} is above {MAX_PATTERN_SIZE}", self.max_pattern_size),
            ));
        }
        check_eos(&self.eos_token_ids)
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let eos = eos_ids(context, &self.eos_token_ids)?;
        Ok(Box::new(RepetitionDetection::new(
            self.min_pattern_size,
            self.max_pattern_size,
            self.min_count,
            eos,
            prompt_len,
        )))
    }
}

/// vLLM's `check_sequence_repetition` on the generated ids, kept incrementally: for each pattern
/// size `L`, the number of trailing ids equal to the id `L` before them. The ids end with
/// `min_count` repeats of an `L`-id pattern exactly when that run reaches `L * (min_count - 1)`,
/// so a step costs one compare per size (at most 4,096) and the state is one counter per size.
/// New ids that do not extend those read (a rollback, a resumed request) are read again from
/// the first generated id.
///
/// ```
/// use logits_processing::{process_row, processors::RepetitionDetection};
/// // Patterns of 1 or 2 ids, 3 times; a prompt of 1 id; EOS is 0.
/// let mut detect = RepetitionDetection::new(1, 2, 3, vec![0], 1);
/// let mut row = [1.0f32; 4];
/// process_row(&mut detect, &[3u32, 1, 2, 1, 2], &mut row)?;
/// assert_eq!(row, [1.0; 4]); // (1 2) twice only
/// process_row(&mut detect, &[3u32, 1, 2, 1, 2, 1, 2], &mut row)?;
/// assert_eq!(row, [0.0, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RepetitionDetection {
    min_size: usize,
    min_count: usize,
    prompt_len: usize,
    eos: ForcedEosIds,
    cursor: Cursor,
    // runs[k]: trailing generated ids equal to the one `min_size + k` before them.
    runs: Vec<u64>,
    // For `undo`: the state before the last plan.
    before: Option<(Cursor, Vec<u64>)>,
}

impl RepetitionDetection {
    /// `min_size` 0 means 1, `max_size` 0 (or `min_count < 2`) turns detection off.
    pub fn new(
        min_size: usize,
        max_size: usize,
        min_count: usize,
        eos_token_ids: Vec<u32>,
        prompt_len: usize,
    ) -> Self {
        let min_size = min_size.max(1);
        let sizes = if min_count >= 2 && max_size >= min_size {
            max_size - min_size + 1
        } else {
            0
        };
        Self {
            min_size,
            min_count,
            prompt_len,
            eos: ForcedEosIds::new(&eos_token_ids),
            cursor: Cursor::default(),
            runs: vec![0; sizes],
            before: None,
        }
    }

    /// Reads the new ids; whether the generated ids now end with a repeated pattern.
    fn repeats(&mut self, ids: &dyn TokenHistory) -> bool {
        let start = if self.cursor.extended_by(ids) {
            self.cursor.seen()
        } else {
            self.runs.fill(0);
            0
        };
        for i in start.max(self.prompt_len)..ids.token_count() {
            let generated = i - self.prompt_len;
            let token = ids.token_at(i);
            for (k, run) in self.runs.iter_mut().enumerate() {
                let size = self.min_size + k;
                *run = if generated >= size && ids.token_at(i - size) == token {
                    *run + 1
                } else {
                    0
                };
            }
        }
        self.cursor.read_all(ids);
        let repeats = (self.min_count - 1) as u64;
        self.runs
            .iter()
            .enumerate()
            .any(|(k, &run)| run >= ((self.min_size + k) as u64).saturating_mul(repeats))
    }
}

impl LogitsProcessor for RepetitionDetection {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.before = Some((self.cursor, self.runs.clone()));
        if self.runs.is_empty() || !self.repeats(ids) {
            return Ok(());
        }
        self.eos.push(plan);
        Ok(())
    }

    fn undo(&mut self) {
        if let Some((cursor, runs)) = self.before.take() {
            self.cursor = cursor;
            self.runs = runs;
        }
    }

    fn reset(&mut self) {
        self.cursor = Cursor::default();
        self.runs.fill(0);
        self.before = None;
    }

    fn max_token_id(&self) -> Option<u32> {
        self.eos.max_token_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's `check_sequence_repetition`, as written there.
    fn vllm(out: &[u32], min: usize, max: usize, count: usize) -> bool {
        let min = min.max(1);
        if max == 0 || count < 2 || min > max {
            return false;
        }
        for len in min..=max {
            if len * count > out.len() {
                return false;
            }
            let n = out.len();
            if (1..=len).all(|j| (1..count).all(|m| out[n - (len * m + j)] == out[n - j])) {
                return true;
            }
        }
        false
    }

    #[test]
    fn fires_at_the_step_vllm_does_on_random_and_repeating_ids() {
        let mut seed = 5u64;
        let mut fires = 0;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for case in 0..300 {
            let (min, max, count) = (next(3) as usize, 1 + next(6) as usize, 2 + next(3) as usize);
            let prompt: Vec<u32> = (0..next(4)).map(|_| next(3) as u32).collect();
            let vocab = 2 + next(3);
            let mut ids = prompt.clone();
            let mut detect = RepetitionDetection::new(min, max, count, vec![9], prompt.len());
            for step in 0..40 {
                let mut row = [1.0f32; 10];
                crate::process_row(&mut detect, &ids, &mut row).unwrap();
                let fired = row[9] == 0.0 && row[0] == f32::NEG_INFINITY;
                let want = vllm(&ids[prompt.len()..], min, max, count);
                assert_eq!(fired, want, "case {case} step {step} {ids:?}");
                fires += fired as usize;
                // Mostly repeats of a short pattern, sometimes a random id.
                let t = if next(4) == 0 || ids.len() < 2 {
                    next(vocab) as u32
                } else {
                    ids[ids.len() - 1 - next(2.min(ids.len() as u64)) as usize]
                };
                ids.push(t);
            }
        }
        assert!(fires > 100, "{fires}");
    }

    #[test]
    fn undo_and_a_rollback_give_the_same_answers() {
        let ids = [1u32, 2, 1, 2, 5, 1, 2, 1, 2, 1, 2];
        let mut detect = RepetitionDetection::new(2, 2, 3, vec![0], 0);
        let mut fresh = detect.clone();
        for n in 1..=ids.len() {
            let mut plan = RowPlan::default();
            detect.plan(&&ids[..n], &mut plan).unwrap();
            detect.undo();
            let (mut a, mut b) = (RowPlan::default(), RowPlan::default());
            detect.plan(&&ids[..n], &mut a).unwrap();
            fresh.reset();
            fresh.plan(&&ids[..n], &mut b).unwrap();
            assert_eq!(a.edits().len(), b.edits().len(), "{n}");
            assert_eq!(a.edits().is_empty(), n < ids.len(), "{n}");
        }
        // A rollback to a shorter, different history reads it again.
        let mut plan = RowPlan::default();
        detect.plan(&[1u32, 1, 1], &mut plan).unwrap();
        assert!(plan.edits().is_empty());
    }

    #[test]
    fn bad_parameters_are_refused_naming_the_field() {
        let spec = |max, min, count| RepetitionDetectionSpec {
            max_pattern_size: max,
            min_pattern_size: min,
            min_count: count,
            eos_token_ids: vec![2],
        };
        let field = |s: RepetitionDetectionSpec| s.check().unwrap_err().to_string();
        assert!(field(spec(2, 3, 3)).contains("min_pattern_size"));
        assert!(spec(4, 1, 1).check().is_ok());
        assert!(field(spec(5000, 1, 2)).contains("max_pattern_size"));
        assert!(spec(0, 0, 0).check().is_ok());
    }
}
