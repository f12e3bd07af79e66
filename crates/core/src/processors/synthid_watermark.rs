use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::cursor::Cursor;
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};
use crate::synthid::{
    context_hash, seen_before, Watermark, MAX_CONTEXT_HISTORY, MAX_DEPTH, MAX_NGRAM_LEN,
    MAX_TABLE_SIZE,
};

fn default_table_size() -> u64 {
    1 << 16
}

fn default_history() -> usize {
    1024
}

/// `{"kind": "synthid_watermark", "ngram_len": 5, "keys": [654, 400, 836, 123, 340, 443, 597,
/// 160, 57]}`: SynthID Text watermarking, as transformers' `SynthIDTextWatermarkLogitsProcessor`
/// (a `SynthIDTextWatermarkingConfig`, its fields and defaults). Each step, the row's softmax goes
/// through a tournament of `len(keys)` depths, one key each, whose g-values (0 or 1 per token and
/// depth) hash the last `ngram_len - 1` generated ids (zeros before the first: the prompt is not
/// read), the token and the key into a table of `sampling_table_size` random bits drawn from
/// `sampling_table_seed` (torch's CPU generator); the row becomes its log, a zero probability
/// `finfo.min`. A context seen among the last `context_history_size` contexts (or hashing to 0
/// while fewer were seen: transformers' zeroed history) leaves the row as it is, and with
/// `skip_first_ngram_calls` so do the first `ngram_len - 1` steps. Every step costs
/// `vocab * len(keys)` hashes, hence the bounds: `ngram_len` 1 to 256, 1 to 64 keys, a table of
/// at most 2^24 (transformers' own limit), a history of at most 65,536.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SynthIdWatermarkSpec {
    #[schemars(range(min = 1, max = 256))]
    pub ngram_len: usize,
    #[schemars(length(min = 1, max = 64))]
    pub keys: Vec<i64>,
    #[serde(default = "default_table_size")]
    #[schemars(range(min = 1, max = 16777216))]
    pub sampling_table_size: u64,
    /// As torch seeds its generator: only the low 32 bits count.
    #[serde(default)]
    pub sampling_table_seed: u64,
    #[serde(default = "default_history")]
    #[schemars(range(max = 65536))]
    pub context_history_size: usize,
    #[serde(default)]
    pub skip_first_ngram_calls: bool,
}

impl KindSpec for SynthIdWatermarkSpec {
    fn needs_prompt_len(&self) -> bool {
        // The context is the generated ids alone.
        true
    }

    fn check(&self) -> Result<()> {
        if !(1..=MAX_NGRAM_LEN).contains(&self.ngram_len) {
            return Err(Error::argument(
                "ngram_len",
                format!("must be 1 to {MAX_NGRAM_LEN}, got {}", self.ngram_len),
            ));
        }
        if self.keys.is_empty() || self.keys.len() > MAX_DEPTH {
            return Err(Error::argument(
                "keys",
                format!("needs 1 to {MAX_DEPTH} keys, got {}", self.keys.len()),
            ));
        }
        if !(1..=MAX_TABLE_SIZE).contains(&self.sampling_table_size) {
            return Err(Error::argument(
                "sampling_table_size",
                format!(
                    "must be 1 to 2**24 (transformers' limit), got {}",
                    self.sampling_table_size
                ),
            ));
        }
        if self.context_history_size > MAX_CONTEXT_HISTORY {
            return Err(Error::argument(
                "context_history_size",
                format!(
                    "must be at most {MAX_CONTEXT_HISTORY}, got {}",
                    self.context_history_size
                ),
            ));
        }
        Ok(())
    }

    fn realize(&self, _: &EngineContext, prompt_len: usize) -> Result<Box<dyn LogitsProcessor>> {
        self.check()?;
        let watermark = Watermark::new(
            &self.keys,
            self.sampling_table_size,
            self.sampling_table_seed,
        )?;
        Ok(Box::new(SynthIdWatermark::new(
            Arc::new(watermark),
            self.ngram_len,
            self.context_history_size,
            self.skip_first_ngram_calls,
            prompt_len,
        )))
    }
}

/// SynthID Text's watermark: see [`SynthIdWatermarkSpec`]. transformers' state (the context, the
/// ring of context hashes, the number of calls) is a function of the generated ids, so it is
/// kept as the hash of the context each step had, one per generated id, extended with the new
/// ids and computed again from the first generated id when the ids do not extend those read: a
/// resumed request plans what the uninterrupted one plans. Its first step is the one with no
/// generated id (the context all zeros, as transformers' first call).
///
/// ```
/// use std::sync::Arc;
/// use logits_processing::{process_row, processors::SynthIdWatermark, synthid::Watermark};
/// let watermark = Arc::new(Watermark::new(&[654, 400, 836], 1 << 16, 0)?);
/// let mut mark = SynthIdWatermark::new(watermark, 3, 1024, false, 1);
/// let mut row = [1.0f32, 2.0, 0.5, f32::NEG_INFINITY];
/// process_row(&mut mark, &[7u32], &mut row)?;
/// assert_eq!(row[3], f32::MIN); // a zero probability's log, as transformers gives it
/// let total: f32 = row.iter().map(|x| x.exp()).sum();
/// assert!((total - 1.0).abs() < 1e-5);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SynthIdWatermark {
    watermark: Arc<Watermark>,
    ngram_len: usize,
    history: usize,
    skip_first: bool,
    prompt_len: usize,
    cursor: Cursor,
    // hashes[j]: the hash of the context of the step with `j` generated ids.
    hashes: Vec<i64>,
    // For `undo`: the cursor and the hashes' length before the last plan, and the hashes it
    // replaced when it read the ids again.
    before: Option<(Cursor, usize, Option<Vec<i64>>)>,
}

impl SynthIdWatermark {
    pub fn new(
        watermark: Arc<Watermark>,
        ngram_len: usize,
        history: usize,
        skip_first: bool,
        prompt_len: usize,
    ) -> Self {
        Self {
            watermark,
            ngram_len: ngram_len.max(1),
            history,
            skip_first,
            prompt_len,
            cursor: Cursor::default(),
            hashes: Vec::new(),
            before: None,
        }
    }

    /// The hash of the context of the step with `j` generated ids: the last `ngram_len - 1` of
    /// them, zeros before the first.
    fn hash_at(&self, ids: &dyn TokenHistory, j: usize) -> i64 {
        let width = self.ngram_len - 1;
        context_hash((0..width).map(|i| match (j + i).checked_sub(width) {
            Some(p) => i64::from(ids.token_at(self.prompt_len + p)),
            None => 0,
        }))
    }
}

impl LogitsProcessor for SynthIdWatermark {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let generated = ids.token_count().saturating_sub(self.prompt_len);
        let mut replaced = None;
        let kept = self.hashes.len();
        let cursor = self.cursor;
        if !self.cursor.extended_by(ids) {
            replaced = Some(std::mem::take(&mut self.hashes));
        }
        self.hashes.truncate(generated + 1);
        while self.hashes.len() <= generated {
            let hash = self.hash_at(ids, self.hashes.len());
            self.hashes.push(hash);
        }
        self.cursor.read_all(ids);
        self.before = Some((cursor, kept, replaced));

        // transformers' call number is generated + 1; with skip_first_ngram_calls the calls
        // before the `ngram_len`-th return the scores and record no context.
        let first = if self.skip_first {
            self.ngram_len - 1
        } else {
            0
        };
        if generated < first {
            return Ok(());
        }
        let hash = self.hashes[generated];
        if seen_before(&self.hashes[first..generated], hash, self.history) {
            return Ok(());
        }
        plan.push_synthid(self.watermark.clone(), hash);
        Ok(())
    }

    fn undo(&mut self) {
        if let Some((cursor, kept, replaced)) = self.before.take() {
            self.cursor = cursor;
            match replaced {
                Some(hashes) => self.hashes = hashes,
                None => self.hashes.truncate(kept),
            }
        }
    }

    fn reset(&mut self) {
        self.cursor = Cursor::default();
        self.hashes.clear();
        self.before = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Edit, WholeRow};

    fn marks(spec: &SynthIdWatermarkSpec, prompt: usize, generated: &[u32]) -> Vec<bool> {
        let mut p = spec.realize(&EngineContext::default(), prompt).unwrap();
        let mut ids: Vec<u32> = vec![9; prompt];
        let mut out = Vec::new();
        for step in 0..=generated.len() {
            let mut plan = RowPlan::new();
            p.plan(&ids, &mut plan).unwrap();
            out.push(matches!(plan.edits(), [Edit::Whole(WholeRow::SynthId(_))]));
            if step < generated.len() {
                ids.push(generated[step]);
            }
        }
        out
    }

    fn spec(ngram_len: usize, history: usize, skip: bool) -> SynthIdWatermarkSpec {
        SynthIdWatermarkSpec {
            ngram_len,
            keys: vec![1, 2],
            sampling_table_size: 1 << 16,
            sampling_table_seed: 0,
            context_history_size: history,
            skip_first_ngram_calls: skip,
        }
    }

    #[test]
    fn a_repeated_context_and_the_first_calls_are_left_alone() {
        // ngram_len 2: the context is the last id. Ids 5, 6, 5: the fourth step's context (5)
        // was the second's.
        assert_eq!(
            marks(&spec(2, 1024, false), 3, &[5, 6, 5]),
            [true, true, true, false]
        );
        // A history of 1 remembers only the last context.
        assert_eq!(
            marks(&spec(2, 1, false), 3, &[5, 6, 5]),
            [true, true, true, true]
        );
        // Skipping: the first ngram_len - 1 = 2 steps are left alone and record nothing.
        assert_eq!(
            marks(&spec(3, 1024, true), 0, &[5, 6, 7, 8]),
            [false, false, true, true, true]
        );
        // ngram_len 1: one context (no ids) for every step: only the first is marked.
        assert_eq!(
            marks(&spec(1, 1024, false), 2, &[5, 6]),
            [true, false, false]
        );
    }

    #[test]
    fn bounds_are_refused_naming_the_field() {
        let field = |s: SynthIdWatermarkSpec| match s.check() {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(spec(0, 1, false)), "ngram_len");
        assert_eq!(field(spec(257, 1, false)), "ngram_len");
        assert_eq!(field(spec(2, 65537, false)), "context_history_size");
        let mut s = spec(2, 1, false);
        s.keys = vec![0; 65];
        assert_eq!(field(s), "keys");
        let mut s = spec(2, 1, false);
        s.sampling_table_size = (1 << 24) + 1;
        assert_eq!(field(s), "sampling_table_size");
    }
}
