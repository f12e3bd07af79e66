//! OpenAI's frequency and presence penalties, one processor: both lower the logit of every token
//! among the generated ids, by `penalty` times its count or by `penalty` once.

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::counts::{window_of, TokenCounts};
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::{LogitsProcessor, MAX_BIAS};
use crate::spec::EngineContext;

/// The largest penalty a token gets, either way ([`MAX_BIAS`]): a product `penalty * count`
/// past it saturates there, so a finite logit stays finite.
const MAX_PENALTY: f32 = MAX_BIAS as f32;

/// A penalty over the counts of the generated ids (the ids past the prompt's length), computed
/// in f32 as vLLM does: `logit - penalty * count` when `PER_OCCURRENCE` (the frequency penalty),
/// `logit - penalty` for every token present otherwise (the presence penalty), `penalty * count`
/// saturated at `±1e30`. A negative penalty encourages repeats.
///
/// Counts are updated from the new ids only; a step costs one sparse edit per distinct generated
/// token, whatever the history's length.
#[derive(Debug, Clone, PartialEq)]
pub struct CountPenalty<const PER_OCCURRENCE: bool> {
    penalty: f32,
    counts: TokenCounts,
}

impl<const PER_OCCURRENCE: bool> CountPenalty<PER_OCCURRENCE> {
    /// `penalty` finite (OpenAI's range is `-2..=2`; llama.cpp accepts any value, and so do we).
    pub fn new(penalty: f64, prompt_len: usize, vocab_size: Option<usize>) -> Result<Self> {
        check_openai_penalty(penalty)?;
        Ok(Self {
            penalty: penalty as f32,
            counts: TokenCounts::new(prompt_len, usize::MAX, vocab_limit(vocab_size)),
        })
    }

    /// The processor of a `frequency_penalty` or `presence_penalty` spec.
    pub(crate) fn realized(
        penalty: f64,
        window: Option<i64>,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(
            Self::new(penalty, prompt_len, context.vocab_size)?.with_window(window_of(window)?),
        ))
    }

    /// Only the last `window` ids in scope count (llama.cpp's `penalty_last_n`), updated as
    /// incrementally as the rest: each step adds the new ids and takes out those that left.
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.counts = self.counts.with_window(window);
        self
    }
}

/// A `frequency_penalty` or `presence_penalty` spec's fields: the window as llama.cpp takes it.
pub(crate) fn check_count_penalty(penalty: f64, window: Option<i64>) -> Result<()> {
    window_of(window)?;
    check_openai_penalty(penalty)
}

/// A frequency or presence penalty: any finite value (also in f32), as llama.cpp accepts
/// beyond OpenAI's `-2..=2`; 0 changes nothing.
fn check_openai_penalty(penalty: f64) -> Result<()> {
    if penalty.is_finite() && (penalty as f32).is_finite() {
        Ok(())
    } else {
        Err(crate::Error::argument(
            "penalty",
            format!("must be finite, got {penalty}"),
        ))
    }
}

impl<const PER_OCCURRENCE: bool> LogitsProcessor for CountPenalty<PER_OCCURRENCE> {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if self.penalty == 0.0 {
            return Ok(());
        }
        self.counts.update(ids);
        for &(token, count) in self.counts.counts() {
            let times = if PER_OCCURRENCE { count as f32 } else { 1.0 };
            let bias = -(self.penalty * times);
            plan.push(Edit::Bias {
                token,
                // vLLM's product where it is finite; past f32's range, saturated.
                bias: bias.clamp(-MAX_PENALTY, MAX_PENALTY),
            });
        }
        Ok(())
    }

    fn undo(&mut self) {
        if self.penalty != 0.0 {
            self.counts.undo();
        }
    }

    fn reset(&mut self) {
        self.counts.reset();
    }
}
