use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::processors::{LogitsProcessor, TextOrIds, ThinkingTokenConfig};
use crate::spec::structure_only;
use crate::spec::{check_len, EngineContext, KindSpec};

/// `{"kind": "thinking_budget", "max_thinking_tokens": 100, "overflow_percentage": 0.1}`, plus
/// `start_token_id` / `end_token_id` / `newline_token_id` (all three, or none to take the
/// model's from [`EngineContext::thinking_tokens`]). Beyond the reference: `end_token_ids`, an end
/// marker of several tokens in place of `end_token_id` (forced one token a step; a marker the
/// model began itself is completed), and `message`, text or ids written before the end marker
/// when the budget runs out (llama.cpp's `--reasoning-budget-message`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThinkingBudgetSpec {
    pub max_thinking_tokens: usize,
    #[serde(default = "default_overflow")]
    #[schemars(range(min = 0.0))]
    pub overflow_percentage: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_token_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_token_id: Option<u32>,
    /// The end marker as several ids (`"\n</think>\n\n"` on a model without one `</think>` id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_token_ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newline_token_id: Option<u32>,
    /// Written before the end marker when the budget forces the end (text through the engine's
    /// tokenizer, or ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<TextOrIds>,
}

fn default_overflow() -> f64 {
    0.1
}

impl ThinkingBudgetSpec {
    fn tokens(&self, context: &EngineContext) -> Result<ThinkingTokenConfig> {
        let end = self
            .end_token_id
            .or(self.end_token_ids.as_ref().map(|ids| ids[0]));
        match (self.start_token_id, end, self.newline_token_id) {
            (Some(start), Some(end), Some(newline)) => Ok(ThinkingTokenConfig {
                start_token_id: start,
                end_token_id: end,
                newline_token_id: newline,
            }),
            _ => context.thinking_tokens.ok_or_else(|| {
                Error::spec(
                    "start_token_id",
                    "thinking_budget needs its token ids, in the spec or from the model",
                )
            }),
        }
    }

    fn needs_tokenizer(&self) -> bool {
        self.message.as_ref().is_some_and(TextOrIds::is_text)
    }
}

impl KindSpec for ThinkingBudgetSpec {
    fn check(&self) -> Result<()> {
        if self.end_token_id.is_some() && self.end_token_ids.is_some() {
            return Err(Error::spec(
                "end_token_ids",
                "give end_token_id or end_token_ids, not both",
            ));
        }
        if let Some(ids) = &self.end_token_ids {
            if ids.is_empty() {
                return Err(Error::spec("end_token_ids", "must hold at least one id"));
            }
            check_len("end_token_ids", ids.len())?;
        }
        if let Some(message) = &self.message {
            message.check("message")?;
        }
        let ids = [
            ("start_token_id", self.start_token_id.is_some()),
            (
                "end_token_id",
                self.end_token_id.is_some() || self.end_token_ids.is_some(),
            ),
            ("newline_token_id", self.newline_token_id.is_some()),
        ];
        let given = ids.iter().filter(|(_, given)| *given).count();
        if given != 0 && given != 3 {
            let missing = ids.iter().find(|(_, given)| !given).unwrap().0;
            return Err(Error::spec(
                missing,
                "give all three thinking token ids or none",
            ));
        }
        ThinkingBudget::new(ThinkingTokenConfig::DISABLED, 0, self.overflow_percentage)
            .map(drop)
            .map_err(|e| Error::spec("overflow_percentage", e.to_string()))
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        let tokens = self.tokens(context)?;
        let end_marker = match &self.end_token_ids {
            Some(ids) => ids.clone(),
            None => vec![tokens.end_token_id],
        };
        let message = match &self.message {
            Some(message) => message.ids(context, "message")?,
            None => vec![],
        };
        let budget =
            ThinkingBudget::new(tokens, self.max_thinking_tokens, self.overflow_percentage)?
                .with_marker(end_marker, message);
        if budget.enabled() {
            context.check_id("start_token_id", tokens.start_token_id)?;
            match &self.end_token_ids {
                Some(ids) => context.check_ids("end_token_ids", ids.iter().copied())?,
                None => context.check_id("end_token_id", tokens.end_token_id)?,
            }
            context.check_id("newline_token_id", tokens.newline_token_id)?;
        }
        Ok(Box::new(budget))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        // Without an engine, ids not in the spec are the engine's to supply, and a message's
        // text its tokenizer's to encode.
        let engine_supplies = self.start_token_id.is_none() && context.thinking_tokens.is_none();
        ((context.structure_only && engine_supplies)
            || structure_only(context, self.needs_tokenizer()))
        .then(|| {
            ThinkingBudget::new(
                ThinkingTokenConfig::DISABLED,
                self.max_thinking_tokens,
                self.overflow_percentage,
            )
            .map(drop)
        })
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if self.start_token_id.is_some() || context.thinking_tokens.is_none() {
            return Ok(None);
        }
        let tokens = self.tokens(context)?;
        let explicit = ThinkingBudgetSpec {
            start_token_id: Some(tokens.start_token_id),
            end_token_id: Some(tokens.end_token_id),
            newline_token_id: Some(tokens.newline_token_id),
            ..self.clone()
        };
        let mut value = serde_json::to_value(explicit).expect("plain data");
        value["kind"] = "thinking_budget".into();
        Ok(Some(value))
    }
}

/// Ends a `<think>` block once it has used its budget of tokens, by forcing the end token.
///
/// The reference's rules, exactly: with a start or end id of 0 it does nothing; it looks at the
/// last start id in the ids; a block already closed by an end id is left alone; with `n` ids
/// after the start and `n >= max_thinking_tokens`, it forces the end token (every logit `-inf`,
/// the end id's `0.0`) when the last id is the newline id (a graceful exit at a line end) or when
/// `n >= max_thinking_tokens + floor(max_thinking_tokens * overflow_percentage)` (the hard limit).
///
/// With an end marker of several ids or a message ([`ThinkingBudget::with_marker`]), the first
/// step at which those rules fire starts a forced sequence: the message then the marker, one id a
/// step; or, when the ids already end in the marker's first ids (the model began closing by
/// itself), the rest of the marker alone. A block is closed when its whole marker follows the
/// start, forced or written by the model. An id that leaves the forced sequence (a later step
/// overrode the force) ends it, and the rules are asked again from there. All of this is a
/// function of the ids, so a rewound or resumed request gets the same answers. With one end id
/// and no message this is the reference's rule.
///
/// Unlike the reference, which rescans every id at every step, it remembers where the last block
/// starts and reads only the ids that are new since its previous call, so a step costs the same at
/// 1,000 ids of history as at 32,000. The ids count as extending the previous call's when they are
/// at least as many and agree with them at the positions the state rests on: the previous call's
/// last [`CHECKED_TAIL`] ids, its last start id and the end id that closed that block. Otherwise
/// (a rollback, another request's ids) it rescans them all. This is a fingerprint, not a full
/// comparison: ids that differ from the previous call's only before its last 16 positions, and
/// not at the start or end it found, are taken as an extension. Engines pass each request's ids
/// append-only, and a new request gets a fresh processor (or call [`LogitsProcessor::reset`]).
///
/// ```
/// use logits_processing::{process_row, ThinkingBudget, ThinkingTokenConfig};
/// let ids = ThinkingTokenConfig { start_token_id: 1, end_token_id: 2, newline_token_id: 3 };
/// let mut budget = ThinkingBudget::new(ids, 2, 0.5)?; // hard limit: 2 + 1 = 3 ids of thinking
/// let mut row = [0.5f32; 5];
/// process_row(&mut budget, &[1u32, 4, 4], &mut row)?; // 2 ids: at budget, mid-line
/// assert_eq!(row, [0.5; 5]);
/// process_row(&mut budget, &[1u32, 4, 4, 4], &mut row)?; // 3 ids: hard limit
/// assert_eq!(row, [f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ThinkingBudget {
    tokens: ThinkingTokenConfig,
    // What closes a block: `[tokens.end_token_id]` unless given.
    end_marker: Vec<u32>,
    // Forced before the marker.
    message: Vec<u32>,
    max_thinking_tokens: usize,
    overflow_percentage: f64,
    overflow_budget: usize,
    scan: Scan,
    // The scan before the last plan, for `undo`.
    previous: Scan,
}

/// How many of the previous call's last ids must reappear at their positions for new ids to count
/// as extending them.
pub const CHECKED_TAIL: usize = 16;

/// What the ids seen so far say about the last thinking block.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Scan {
    seen: usize,
    // The last min(seen, CHECKED_TAIL) ids seen, oldest first.
    tail: [u32; CHECKED_TAIL],
    last_start: Option<usize>,
    // Where the marker that closed the last block ends.
    closed_at: Option<usize>,
    forcing: Option<Forcing>,
}

/// A forced sequence under way: the message then the marker, or the marker's ids after the
/// `begun` ones the model wrote itself.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Forcing {
    begun: usize,
    written: usize,
}

impl ThinkingBudget {
    pub fn new(
        tokens: ThinkingTokenConfig,
        max_thinking_tokens: usize,
        overflow_percentage: f64,
    ) -> Result<Self> {
        if !(overflow_percentage.is_finite() && overflow_percentage >= 0.0) {
            return Err(Error::argument(
                "overflow_percentage",
                format!("must be finite and >= 0, got {overflow_percentage}"),
            ));
        }
        // Python's int(max * pct): truncation, which is floor for these non-negative values; a
        // product past usize saturates (the hard limit is then never reached, as in Python).
        let overflow_budget = (max_thinking_tokens as f64 * overflow_percentage) as usize;
        Ok(Self {
            tokens,
            end_marker: vec![tokens.end_token_id],
            message: vec![],
            max_thinking_tokens,
            overflow_percentage,
            overflow_budget,
            scan: Scan::default(),
            previous: Scan::default(),
        })
    }

    /// The same budget closing its blocks with `end_marker` (at least one id) and writing
    /// `message` before it when the budget forces the end.
    pub fn with_marker(mut self, end_marker: Vec<u32>, message: Vec<u32>) -> Self {
        assert!(!end_marker.is_empty(), "an end marker holds an id");
        self.end_marker = end_marker;
        self.message = message;
        self.reset();
        self
    }

    pub fn tokens(&self) -> ThinkingTokenConfig {
        self.tokens
    }

    pub fn max_thinking_tokens(&self) -> usize {
        self.max_thinking_tokens
    }

    pub fn overflow_percentage(&self) -> f64 {
        self.overflow_percentage
    }

    /// `floor(max_thinking_tokens * overflow_percentage)`.
    pub fn overflow_budget(&self) -> usize {
        self.overflow_budget
    }

    pub(crate) fn enabled(&self) -> bool {
        self.tokens.start_token_id != 0 && self.end_marker != [0]
    }

    /// The `at`-th id of the sequence a [`Forcing`] forces.
    fn forced_id(&self, forcing: Forcing, at: usize) -> Option<u32> {
        if forcing.begun > 0 {
            return self.end_marker.get(forcing.begun + at).copied();
        }
        self.message.iter().chain(&self.end_marker).nth(at).copied()
    }

    /// Whether `ids[..=i]` ends in the whole marker, after the start at `start`.
    fn marker_ends_at(&self, ids: &dyn TokenHistory, i: usize, start: usize) -> bool {
        let len = self.end_marker.len();
        i >= start + len && (0..len).all(|k| ids.token_at(i + 1 - len + k) == self.end_marker[k])
    }

    /// How many of the marker's first ids (fewer than all) `ids[..=i]` ends in, after `start`.
    fn marker_begun_at(&self, ids: &dyn TokenHistory, i: usize, start: usize) -> usize {
        (1..self.end_marker.len())
            .rev()
            .find(|&j| {
                i >= start + j && (0..j).all(|k| ids.token_at(i + 1 - j + k) == self.end_marker[k])
            })
            .unwrap_or(0)
    }

    fn extends_previous(&self, ids: &dyn TokenHistory) -> bool {
        let scan = &self.scan;
        let agrees = |at: Option<usize>, id: u32| at.is_none_or(|i| ids.token_at(i) == id);
        let tail_len = scan.seen.min(CHECKED_TAIL);
        let tail_start = scan.seen - tail_len;
        ids.token_count() >= scan.seen
            && (0..tail_len).all(|i| ids.token_at(tail_start + i) == scan.tail[i])
            && agrees(scan.last_start, self.tokens.start_token_id)
            && agrees(scan.closed_at, self.end_marker[self.end_marker.len() - 1])
    }

    fn update(&mut self, ids: &dyn TokenHistory) {
        if !self.extends_previous(ids) {
            self.scan = Scan::default();
        }
        let start_id = self.tokens.start_token_id;
        let mut scan = self.scan;
        for i in scan.seen..ids.token_count() {
            let id = ids.token_at(i);
            if id == start_id {
                scan.last_start = Some(i);
                scan.closed_at = None;
                scan.forcing = None;
            }
            let (Some(start), None) = (scan.last_start, scan.closed_at) else {
                continue;
            };
            if self.marker_ends_at(ids, i, start) {
                scan.closed_at = Some(i);
                scan.forcing = None;
                continue;
            }
            if let Some(forcing) = &mut scan.forcing {
                if self.forced_id(*forcing, forcing.written) == Some(id) {
                    forcing.written += 1;
                    continue;
                }
                scan.forcing = None;
            }
            let thought = i - start;
            if thought >= self.max_thinking_tokens
                && (id == self.tokens.newline_token_id
                    || thought
                        >= self
                            .max_thinking_tokens
                            .saturating_add(self.overflow_budget))
            {
                scan.forcing = Some(Forcing {
                    begun: self.marker_begun_at(ids, i, start),
                    written: 0,
                });
            }
        }
        scan.seen = ids.token_count();
        let tail_start = scan.seen.saturating_sub(CHECKED_TAIL);
        for (slot, i) in scan.tail.iter_mut().zip(tail_start..scan.seen) {
            *slot = ids.token_at(i);
        }
        self.scan = scan;
    }

    /// The id to force now, from the ids so far: the end id (or the next id of the message and
    /// the marker) once the budget is spent, else `None`.
    pub fn forced_now(&mut self, ids: &dyn TokenHistory) -> Option<u32> {
        if !self.enabled() {
            return None;
        }
        self.update(ids);
        let forcing = self.scan.forcing?;
        self.forced_id(forcing, forcing.written)
    }

    /// Whether an id must be forced now ([`ThinkingBudget::forced_now`]).
    pub fn must_end(&mut self, ids: &dyn TokenHistory) -> bool {
        self.forced_now(ids).is_some()
    }
}

impl LogitsProcessor for ThinkingBudget {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.previous = self.scan;
        if let Some(token) = self.forced_now(ids) {
            plan.push(Edit::Force {
                token,
                value: ForcedValue::Set(0.0),
            });
        }
        Ok(())
    }

    fn max_token_id(&self) -> Option<u32> {
        if !self.enabled() {
            return None;
        }
        self.end_marker.iter().chain(&self.message).copied().max()
    }

    fn undo(&mut self) {
        self.scan = self.previous;
    }

    fn reset(&mut self) {
        self.scan = Scan::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const START: u32 = 1;
    const END: u32 = 2;
    const NEWLINE: u32 = 3;
    const WORD: u32 = 4;
    const IDS: ThinkingTokenConfig = ThinkingTokenConfig {
        start_token_id: START,
        end_token_id: END,
        newline_token_id: NEWLINE,
    };

    /// The reference's rule, straight from its description: a full rescan every call.
    fn reference(tokens: ThinkingTokenConfig, max: usize, pct: f64, ids: &[u32]) -> bool {
        if tokens.start_token_id == 0 || tokens.end_token_id == 0 {
            return false;
        }
        let Some(start) = ids.iter().rposition(|&t| t == tokens.start_token_id) else {
            return false;
        };
        if ids[start + 1..].contains(&tokens.end_token_id) {
            return false;
        }
        let n = ids.token_count() - start - 1;
        let overflow = (max as f64 * pct) as usize;
        n >= max && (ids.last_token() == Some(tokens.newline_token_id) || n >= max + overflow)
    }

    fn budget(max: usize) -> ThinkingBudget {
        ThinkingBudget::new(IDS, max, 0.1).unwrap()
    }

    fn thinking(n: usize) -> Vec<u32> {
        let mut ids = vec![9, 9, START];
        ids.extend(std::iter::repeat_n(WORD, n));
        ids
    }

    #[test]
    fn budget_10_at_10_percent_forces_at_11_and_not_at_10_unless_at_a_newline() {
        assert!(!budget(10).must_end(&thinking(10)));
        assert!(budget(10).must_end(&thinking(11)));
        let mut at_newline = thinking(9);
        at_newline.push(NEWLINE);
        assert!(budget(10).must_end(&at_newline));
        let mut early_newline = thinking(8);
        early_newline.push(NEWLINE);
        assert!(!budget(10).must_end(&early_newline));
    }

    #[test]
    fn forcing_sets_all_to_minus_inf_and_the_end_to_zero() {
        let mut row = [0.25f32; 6];
        crate::process_row(&mut budget(0), &[START], &mut row).unwrap();
        let expected: Vec<f32> = (0..6)
            .map(|i| {
                if i == END as usize {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        assert_eq!(row.to_vec(), expected);
    }

    #[test]
    fn a_closed_block_is_left_alone() {
        let mut ids = thinking(50);
        ids.push(END);
        ids.extend([WORD; 30]);
        assert!(!budget(10).must_end(&ids));
    }

    #[test]
    fn a_second_open_block_counts_from_its_own_start() {
        let mut ids = thinking(50);
        ids.extend([END, WORD, START]);
        ids.extend([WORD; 5]);
        assert!(!budget(10).must_end(&ids));
        ids.extend([WORD; 6]);
        assert!(budget(10).must_end(&ids));
    }

    #[test]
    fn zero_ids_change_nothing() {
        for tokens in [
            ThinkingTokenConfig {
                start_token_id: 0,
                ..IDS
            },
            ThinkingTokenConfig {
                end_token_id: 0,
                ..IDS
            },
        ] {
            let mut b = ThinkingBudget::new(tokens, 0, 0.1).unwrap();
            let mut row = [1.0f32; 5];
            crate::process_row(&mut b, &thinking(100), &mut row).unwrap();
            assert_eq!(row, [1.0; 5]);
        }
    }

    #[test]
    fn no_start_means_nothing_and_budget_zero_ends_right_after_the_start() {
        assert!(!budget(0).must_end(&[WORD, WORD]));
        assert!(budget(0).must_end(&[WORD, START]));
    }

    #[test]
    fn a_huge_overflow_never_reaches_the_hard_limit() {
        let mut b = ThinkingBudget::new(IDS, 10, 1e300).unwrap();
        assert_eq!(b.overflow_budget(), usize::MAX);
        assert!(!b.must_end(&thinking(1000)));
        let mut at_newline = thinking(20);
        at_newline.push(NEWLINE);
        assert!(b.must_end(&at_newline));
    }

    #[test]
    fn rejects_a_bad_overflow_percentage() {
        assert!(ThinkingBudget::new(IDS, 10, -0.1).is_err());
        assert!(ThinkingBudget::new(IDS, 10, f64::NAN).is_err());
    }

    /// A budget of `max` (no overflow) closing with `marker` after `message`.
    fn marked(max: usize, marker: &[u32], message: &[u32]) -> ThinkingBudget {
        ThinkingBudget::new(IDS, max, 0.0)
            .unwrap()
            .with_marker(marker.to_vec(), message.to_vec())
    }

    /// The ids a greedy loop writes from `ids` on while the budget forces, `WORD` otherwise.
    fn run(budget: &mut ThinkingBudget, mut ids: Vec<u32>, steps: usize) -> Vec<u32> {
        for _ in 0..steps {
            let next = budget.forced_now(&ids).unwrap_or(WORD);
            ids.push(next);
        }
        ids
    }

    const MARKER: [u32; 3] = [NEWLINE, END, NEWLINE];

    #[test]
    fn a_marker_of_several_ids_is_forced_one_a_step_then_the_block_is_closed() {
        let ids = run(&mut marked(2, &MARKER, &[]), vec![START], 8);
        assert_eq!(
            ids,
            [START, WORD, WORD, NEWLINE, END, NEWLINE, WORD, WORD, WORD]
        );
    }

    #[test]
    fn the_message_comes_before_the_marker() {
        let ids = run(&mut marked(1, &MARKER, &[6, 7]), vec![START], 8);
        assert_eq!(ids, [START, WORD, 6, 7, NEWLINE, END, NEWLINE, WORD, WORD]);
    }

    #[test]
    fn a_marker_the_model_began_is_completed_without_the_message() {
        let mut budget = marked(3, &MARKER, &[6, 7]);
        // At the budget the ids end in the marker's first two ids: only its last is forced.
        let ids = vec![START, WORD, NEWLINE, END];
        assert_eq!(budget.forced_now(&ids), Some(NEWLINE));
        let mut closed = ids.clone();
        closed.push(NEWLINE);
        assert_eq!(budget.forced_now(&closed), None);
        closed.extend([WORD; 10]);
        assert_eq!(budget.forced_now(&closed), None);
    }

    #[test]
    fn a_marker_the_model_wrote_itself_closes_the_block() {
        let mut ids = vec![START, WORD];
        ids.extend(MARKER);
        ids.extend([WORD; 20]);
        assert_eq!(marked(2, &MARKER, &[6]).forced_now(&ids), None);
        // A part of the marker does not close it: the budget still forces.
        let mut open = vec![START, WORD, END, NEWLINE];
        open.extend([WORD; 5]);
        assert_eq!(marked(2, &MARKER, &[6]).forced_now(&open), Some(6));
    }

    #[test]
    fn an_id_that_leaves_the_forced_sequence_ends_it() {
        let mut budget = marked(1, &MARKER, &[6, 7]);
        // The budget forced 6, then something else came (a later step overrode the force): the
        // hard limit still holds, so the sequence starts over.
        assert_eq!(budget.forced_now(&[START, WORD]), Some(6));
        assert_eq!(budget.forced_now(&[START, WORD, 6]), Some(7));
        assert_eq!(budget.forced_now(&[START, WORD, 6, 5]), Some(6));
    }

    #[test]
    fn the_spec_takes_a_marker_and_a_message() {
        use crate::spec::ProcessorSpec;
        let spec = ProcessorSpec::parse(
            r#"{"kind": "thinking_budget", "max_thinking_tokens": 1, "start_token_id": 1,
                "end_token_ids": [3, 2, 3], "newline_token_id": 3, "message": [6, 7]}"#,
        )
        .unwrap();
        let mut budget = spec.realize(&EngineContext::default(), 0).unwrap();
        let mut ids = vec![START, WORD];
        for want in [6, 7, NEWLINE, END, NEWLINE] {
            let mut row = [0.0f32; 8];
            crate::process_row(budget.as_mut(), &ids, &mut row).unwrap();
            assert_eq!(row[want as usize], 0.0);
            assert_eq!(row.iter().filter(|x| x.is_finite()).count(), 1);
            ids.push(want);
        }
        let mut row = [0.5f32; 8];
        crate::process_row(budget.as_mut(), &ids, &mut row).unwrap();
        assert_eq!(row, [0.5; 8]);
        for bad in [
            r#""end_token_id": 2, "end_token_ids": [2]"#,
            r#""end_token_ids": []"#,
            r#""message": """#,
        ] {
            let text = format!(
                r#"{{"kind": "thinking_budget", "max_thinking_tokens": 1, "start_token_id": 1,
                    "newline_token_id": 3, {bad}}}"#
            );
            assert!(ProcessorSpec::parse(&text).is_err(), "{bad}");
        }
    }

    fn token() -> impl Strategy<Value = u32> {
        prop_oneof![Just(START), Just(END), Just(NEWLINE), 4u32..8]
    }

    proptest! {
        /// Fed growing, shrinking and replaced histories, the incremental state answers as the
        /// reference's full rescan does.
        /// With a marker of several ids and a message, fed growing, shrinking and replaced
        /// histories, the incremental state answers as a fresh scan of the same ids does.
        #[test]
        fn with_a_marker_incremental_equals_a_fresh_scan(
            max in 0usize..8,
            marker in proptest::collection::vec(token(), 1..4),
            message in proptest::collection::vec(token(), 0..3),
            steps in proptest::collection::vec(
                (0usize..4, proptest::collection::vec(token(), 0..6)), 1..40),
        ) {
            let mut b = ThinkingBudget::new(IDS, max, 0.5).unwrap()
                .with_marker(marker.clone(), message.clone());
            let mut ids: Vec<u32> = vec![];
            for (action, chunk) in steps {
                match action {
                    0 | 1 => ids.extend(chunk),
                    2 => ids.truncate(ids.token_count().saturating_sub(chunk.len())),
                    _ => ids = chunk,
                }
                let mut fresh = ThinkingBudget::new(IDS, max, 0.5).unwrap()
                    .with_marker(marker.clone(), message.clone());
                prop_assert_eq!(b.forced_now(&ids), fresh.forced_now(&ids), "{:?}", ids);
            }
        }

        #[test]
        fn incremental_equals_rescan(
            max in 0usize..12,
            pct in 0.0f64..1.0,
            steps in proptest::collection::vec(
                (0usize..4, proptest::collection::vec(token(), 0..6)), 1..40),
        ) {
            let mut b = ThinkingBudget::new(IDS, max, pct).unwrap();
            let mut ids: Vec<u32> = vec![];
            for (action, chunk) in steps {
                match action {
                    0 | 1 => ids.extend(chunk),                  // a decode step (or several)
                    2 => ids.truncate(ids.token_count().saturating_sub(chunk.len())), // rewound
                    _ => ids = chunk,                            // another request's ids
                }
                prop_assert_eq!(b.must_end(&ids), reference(IDS, max, pct, &ids), "{:?}", ids);
            }
        }
    }
}
