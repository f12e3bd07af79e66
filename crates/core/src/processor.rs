//! The two traits every kind implements: [`KindSpec`], what its spec (the JSON data of a request)
//! provides, and [`LogitsProcessor`], the per-request state realized from it.

use crate::error::Result;
use crate::history::TokenHistory;
use crate::logit::Logit;
use crate::plan::{MaskId, RowPlan};
use crate::spec::EngineContext;
use serde_json::Value;

/// What each kind's spec struct provides (besides serde, with unknown fields denied).
pub trait KindSpec: std::fmt::Debug + Send + Sync + 'static {
    /// Checks what does not depend on the engine (value ranges, list sizes). Errors name the
    /// field relative to the spec (`"temperature"`, `"token_ids"`).
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Fresh per-request state. `prompt_len` is where generated ids start in the ids the engine
    /// will pass. Ids must be checked against `context` here, naming the field.
    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>>;

    /// Checks the spec against `context` where realizing it there is not possible (a grammar
    /// without the engine's tokenizer is compiled on its own); `None`: it is realized.
    fn validate(&self, _context: &EngineContext) -> Option<Result<()>> {
        None
    }

    /// The spec with what it takes from the engine made explicit (e.g. `hello_world` as the
    /// forced sequence of the tokenizer's ids), for a worker that does not have the engine's
    /// tokenizer. `None`: the spec is already explicit, or `context` does not know what it needs
    /// (then the engine resolves it).
    fn resolve(&self, _context: &EngineContext) -> Result<Option<Value>> {
        Ok(None)
    }

    /// Makes a kind that counts its steps by calls count them by generated tokens instead
    /// (`"position": "tokens"`), for a pipeline rebuilt from a request's ids part-way through
    /// (a migrated or resumed request, an engine that drops and rebuilds state). Kinds without
    /// such a choice do nothing.
    fn position_by_tokens(&mut self) {}

    /// Whether the step takes the caller's own mask each step (`Batch::fill_bitmask`), which
    /// only a batch is given.
    fn takes_caller_mask(&self) -> bool {
        false
    }

    /// Whether the spec's edits depend on where the prompt ends in the ids (the `prompt_len`
    /// given to [`KindSpec::realize`]): a grammar reads the output alone, a penalty may count
    /// the output alone, a length kind counts new tokens. A row of such specs is refused without
    /// an explicit `prompt_len` ([`crate::check_prompt_len`]).
    fn needs_prompt_len(&self) -> bool {
        false
    }
}

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

    /// Whether [`LogitsProcessor::finish`] has work to do: a batch then runs it for this row in
    /// parallel with the other rows' (and, in Python, without the GIL).
    fn finishes(&self) -> bool {
        false
    }

    /// The costly part of a step, after every row's [`LogitsProcessor::plan`] succeeded: a
    /// grammar's mask, computed into the mask its `plan` reserved in `plan`. It cannot fail (a
    /// failure becomes the processor's state, see [`LogitsProcessor::failure`]); an
    /// [`LogitsProcessor::undo`] after it takes back the plan and the finish together.
    fn finish(&mut self, _plan: &mut RowPlan) {}

    /// The mask its last plan reserved for the bitmask the caller gives with the step
    /// (`{"kind": "bitmask"}`), which the batch copies in.
    fn caller_mask(&self) -> Option<MaskId> {
        None
    }

    /// Why the processor stopped constraining as asked, when it did (a grammar that rejected a
    /// token the engine chose): such a failure is state, not an error, so the other rows go on.
    fn failure(&self) -> Option<String> {
        None
    }

    /// The largest token id this processor can name, so a vocab can be checked at admission.
    fn max_token_id(&self) -> Option<u32> {
        None
    }

    /// Back to the state of a new request.
    fn reset(&mut self) {}

    /// The part of its state that its ids cannot give back, where it has one: what the passes
    /// it read left in it (mirostat's `mu`, whether a phrase trigger held), for a kind whose
    /// next step reads what the previous step's pass observed ([`RowPlan::observed`],
    /// [`RowPlan::fired`]). A pipeline that plans draft rows
    /// ([`crate::EngineContext::speculative_tokens`]) keeps it after each plan, with that plan's
    /// pass's observations, and gives it back ([`LogitsProcessor::restore`]) when later ids part
    /// from the drafts planned. `None` (the default): the state is a function of the ids, read
    /// again when they roll back.
    fn checkpoint(&self) -> Option<Checkpoint> {
        None
    }

    /// Back to the state a [`LogitsProcessor::checkpoint`] of this processor returned.
    fn restore(&mut self, _checkpoint: &Checkpoint) {}
}

/// A processor's state as [`LogitsProcessor::checkpoint`] returns it, for its own
/// [`LogitsProcessor::restore`]: a few numbers, never the processor itself.
pub struct Checkpoint(Box<dyn std::any::Any + Send>);

impl Checkpoint {
    pub fn new<T: std::any::Any + Send>(state: T) -> Self {
        Self(Box::new(state))
    }

    /// The state, when it is a `T`.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checkpoint(..)")
    }
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
    processor.finish(&mut plan);
    if let Err(error) = plan.validate(row.len()) {
        processor.undo();
        return Err(error);
    }
    plan.apply(row)
}
