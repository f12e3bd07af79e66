use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::processors::{LogitsProcessor, ThinkingTokenConfig};
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "thinking_budget", "max_thinking_tokens": 100, "overflow_percentage": 0.1}`, plus
/// `start_token_id` / `end_token_id` / `newline_token_id` (all three, or none to take the
/// model's from [`SpecContext::thinking_tokens`]).
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newline_token_id: Option<u32>,
}

fn default_overflow() -> f64 {
    0.1
}

impl ThinkingBudgetSpec {
    fn tokens(&self, context: &SpecContext) -> Result<ThinkingTokenConfig> {
        match (
            self.start_token_id,
            self.end_token_id,
            self.newline_token_id,
        ) {
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
}

impl KindSpec for ThinkingBudgetSpec {
    fn check(&self) -> Result<()> {
        let ids = [
            ("start_token_id", self.start_token_id),
            ("end_token_id", self.end_token_id),
            ("newline_token_id", self.newline_token_id),
        ];
        let given = ids.iter().filter(|(_, id)| id.is_some()).count();
        if given != 0 && given != 3 {
            let missing = ids.iter().find(|(_, id)| id.is_none()).unwrap().0;
            return Err(Error::spec(
                missing,
                "give all three thinking token ids or none",
            ));
        }
        ThinkingBudget::new(ThinkingTokenConfig::DISABLED, 0, self.overflow_percentage)
            .map(drop)
            .map_err(|e| Error::spec("overflow_percentage", e.to_string()))
    }

    fn realize(&self, context: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        let tokens = self.tokens(context)?;
        let budget =
            ThinkingBudget::new(tokens, self.max_thinking_tokens, self.overflow_percentage)?;
        if budget.enabled() {
            context.check_id("start_token_id", tokens.start_token_id)?;
            context.check_id("end_token_id", tokens.end_token_id)?;
            context.check_id("newline_token_id", tokens.newline_token_id)?;
        }
        Ok(Box::new(budget))
    }

    fn validate(&self, context: &SpecContext) -> Option<Result<()>> {
        // Without an engine, ids not in the spec are the engine's to supply.
        let engine_supplies = self.start_token_id.is_none() && context.thinking_tokens.is_none();
        (context.structure_only && engine_supplies).then(|| {
            ThinkingBudget::new(
                ThinkingTokenConfig::DISABLED,
                self.max_thinking_tokens,
                self.overflow_percentage,
            )
            .map(drop)
        })
    }

    fn resolve(&self, context: &SpecContext) -> Result<Option<serde_json::Value>> {
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
    closed_at: Option<usize>,
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
            max_thinking_tokens,
            overflow_percentage,
            overflow_budget,
            scan: Scan::default(),
            previous: Scan::default(),
        })
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
        self.tokens.start_token_id != 0 && self.tokens.end_token_id != 0
    }

    fn extends_previous(&self, ids: &dyn TokenHistory) -> bool {
        let scan = &self.scan;
        let agrees = |at: Option<usize>, id: u32| at.is_none_or(|i| ids.token_at(i) == id);
        let tail_len = scan.seen.min(CHECKED_TAIL);
        let tail_start = scan.seen - tail_len;
        ids.token_count() >= scan.seen
            && (0..tail_len).all(|i| ids.token_at(tail_start + i) == scan.tail[i])
            && agrees(scan.last_start, self.tokens.start_token_id)
            && agrees(scan.closed_at, self.tokens.end_token_id)
    }

    fn update(&mut self, ids: &dyn TokenHistory) {
        if !self.extends_previous(ids) {
            self.scan = Scan::default();
        }
        let ThinkingTokenConfig {
            start_token_id: start,
            end_token_id: end,
            ..
        } = self.tokens;
        let scan = &mut self.scan;
        for i in scan.seen..ids.token_count() {
            let id = ids.token_at(i);
            if id == start {
                scan.last_start = Some(i);
                scan.closed_at = None;
            } else if id == end && scan.last_start.is_some() && scan.closed_at.is_none() {
                scan.closed_at = Some(i);
            }
        }
        scan.seen = ids.token_count();
        let tail_start = scan.seen.saturating_sub(CHECKED_TAIL);
        for (slot, i) in scan.tail.iter_mut().zip(tail_start..scan.seen) {
            *slot = ids.token_at(i);
        }
    }

    /// Whether the end token must be forced now, from the ids so far.
    pub fn must_end(&mut self, ids: &dyn TokenHistory) -> bool {
        if !self.enabled() {
            return false;
        }
        self.update(ids);
        let (Some(start), None) = (self.scan.last_start, self.scan.closed_at) else {
            return false;
        };
        let thought = ids.token_count() - start - 1;
        thought >= self.max_thinking_tokens
            && (ids.last_token() == Some(self.tokens.newline_token_id)
                || thought
                    >= self
                        .max_thinking_tokens
                        .saturating_add(self.overflow_budget))
    }
}

impl LogitsProcessor for ThinkingBudget {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.previous = self.scan;
        if self.must_end(ids) {
            plan.push(Edit::Force {
                token: self.tokens.end_token_id,
                value: ForcedValue::Set(0.0),
            });
        }
        Ok(())
    }

    fn max_token_id(&self) -> Option<u32> {
        self.enabled().then_some(self.tokens.end_token_id)
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

    fn token() -> impl Strategy<Value = u32> {
        prop_oneof![Just(START), Just(END), Just(NEWLINE), 4u32..8]
    }

    proptest! {
        /// Fed growing, shrinking and replaced histories, the incremental state answers as the
        /// reference's full rescan does.
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
