//! The built-in processors, one file each, and the trait they share.

mod ban_tokens;
mod forced_sequence;
mod hello_world;
mod logit_bias;
mod temperature;
mod thinking_budget;
mod thinking_config;

pub use ban_tokens::{BanTokens, BanTokensSpec};
pub use forced_sequence::{ForcedSequence, ForcedSequenceSpec, Position, PositionSpec};
pub use hello_world::{hello_world, HelloWorldSpec, TextEncoder, HELLO_WORLD_TEXT};
pub use logit_bias::{LogitBias, LogitBiasSpec};
pub use temperature::{Temperature, TemperatureSpec};
pub use thinking_budget::{ThinkingBudget, ThinkingBudgetSpec, CHECKED_TAIL};
pub use thinking_config::{
    get_thinking_token_config, register_thinking_token_config, ThinkingTokenConfig,
};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::spec::Kind;

/// Every spec kind, by its `"kind"` name. Adding a processor: its file (the processor, its spec
/// struct and `KindSpec`), one line here, its docs and its tests (docs/core.md).
pub(crate) static KINDS: &[Kind] = &[
    Kind::new::<TemperatureSpec>("temperature"),
    Kind::new::<ForcedSequenceSpec>("forced_sequence"),
    Kind::new::<HelloWorldSpec>("hello_world"),
    Kind::new::<ThinkingBudgetSpec>("thinking_budget"),
    Kind::new::<BanTokensSpec>("ban_tokens"),
    Kind::new::<LogitBiasSpec>("logit_bias"),
];
use crate::logit::Logit;
use crate::plan::RowPlan;

/// Per-request state that decides, each step, how one row of logits is edited.
///
/// A processor never touches logits itself: from the request's token ids it adds edits to the
/// row's [`RowPlan`], and the plan is applied in one pass (or by the GPU, for a whole batch).
/// Call order: once per decode step, with the ids so far (each call's ids usually extend the
/// previous call's by one).
pub trait LogitsProcessor: Send + std::fmt::Debug {
    /// Adds this step's edits to `plan` and advances the state. On error the state is unchanged.
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()>;

    /// Takes back the last successful [`LogitsProcessor::plan`]: the state is again what it was
    /// before that call. A batch calls it when another step of the same call failed, so a failed
    /// step never loses or repeats a token. Called at most once after each `plan`.
    fn undo(&mut self);

    /// The largest token id this processor can name, so a vocab can be checked at admission.
    fn max_token_id(&self) -> Option<u32> {
        None
    }

    /// Back to the state of a new request.
    fn reset(&mut self) {}
}

/// Runs one processor on one row: plan, then apply. On error the row and the processor's state are
/// as they were.
pub fn process_row<T: Logit>(
    processor: &mut dyn LogitsProcessor,
    ids: &dyn TokenHistory,
    row: &mut [T],
) -> Result<()> {
    if let Some(token) = processor.max_token_id() {
        crate::error::check_token("token id", token, row.len())?;
    }
    let mut plan = RowPlan::new();
    processor.plan(ids, &mut plan)?;
    if let Err(error) = plan.validate(row.len()) {
        processor.undo();
        return Err(error);
    }
    plan.apply(row)
}
