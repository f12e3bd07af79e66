//! The call machinery every reference class shares: plan with the GIL held, apply the row in one
//! pass without it, all or nothing.

use logits_processing::{LogitsProcessor, Result as CoreResult, RowPlan, TokenHistory};
use pyo3::prelude::*;

use crate::args;
use crate::device::apply_row;
use crate::errors::{as_ours, new_err_with, to_py, Attr, ErrorClass, IntoPyResult};
use crate::exclusive::Exclusive;
use crate::history::PyIds;
use crate::tensor::{Block, TensorView};
use crate::watch::check_unmoved;

/// What one `__call__` plans and applies: one processor with its plan, or a pipeline.
pub(crate) trait RowSteps {
    /// Plans this step; on error the state is unchanged.
    fn plan(&mut self, ids: &dyn TokenHistory) -> CoreResult<()>;
    /// Takes back the last successful `plan`.
    fn undo(&mut self);
    /// Checks every token the last plan names against the row's length.
    fn validate(&self, vocab: usize) -> CoreResult<()>;
    /// Applies the last (validated) plan to the one row of `block`.
    fn apply(&mut self, py: Python<'_>, block: Block) -> PyResult<()>;
}

/// One built-in processor and the plan it fills.
pub(crate) struct Single<'a> {
    pub processor: &'a mut dyn LogitsProcessor,
    pub plan: &'a mut RowPlan,
}

impl RowSteps for Single<'_> {
    fn plan(&mut self, ids: &dyn TokenHistory) -> CoreResult<()> {
        self.plan.clear();
        self.processor.plan(ids, self.plan)
    }

    fn undo(&mut self) {
        self.processor.undo();
    }

    fn validate(&self, vocab: usize) -> CoreResult<()> {
        self.plan.validate(vocab)
    }

    fn apply(&mut self, py: Python<'_>, block: Block) -> PyResult<()> {
        apply_row(py, self.plan, block)
    }
}

/// Runs `steps` on one row: the shared body of every `__call__`. `max_token` is the largest id
/// the steps can name, which callers cache (a forced sequence's is O(its length)). All or
/// nothing: on any error the logits and the state are as they were.
pub(crate) fn call_row(
    py: Python<'_>,
    steps: &mut dyn RowSteps,
    max_token: Option<u32>,
    input_ids: &Bound<'_, PyAny>,
    logits: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let view = TensorView::of(logits)?;
    let block = Block::from_view(&view, 1)?;
    crate::device::check_supported(block.device)?;
    if let Some(token) = max_token.filter(|&t| t as usize >= block.vocab) {
        return Err(to_py(logits_processing::Error::TokenOutOfVocab {
            field: "token id".into(),
            token_id: token.into(),
            vocab_size: block.vocab,
        }));
    }
    let ids = PyIds::new(input_ids);
    let planned = steps.plan(&ids);
    if let Some(error) = ids.take_error() {
        // Planned from an id read as `u32::MAX`: taken back, so the next call starts from here.
        if planned.is_ok() {
            steps.undo();
        }
        return Err(as_ours(py, error, "input_ids"));
    }
    planned.py()?;
    if ids.ran_python() {
        if let Err(error) = check_unmoved("logits", logits, &view) {
            steps.undo();
            return Err(error);
        }
    }
    let applied = steps
        .validate(block.vocab)
        .py()
        .and_then(|()| steps.apply(py, block));
    if applied.is_err() {
        steps.undo();
    }
    applied?;
    view.edited(logits)
}

/// Runs `processor` on one row (see [`call_row`]).
pub(crate) fn call_processor(
    py: Python<'_>,
    processor: &mut dyn LogitsProcessor,
    max_token: Option<u32>,
    plan: &mut RowPlan,
    input_ids: &Bound<'_, PyAny>,
    logits: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let mut single = Single { processor, plan };
    call_row(py, &mut single, max_token, input_ids, logits)
}

/// The logits of a `__call__`: given as `logits` (the protocol's name) or `scores` (the name the
/// reference's forced sequence uses), not both.
pub(crate) fn logits_arg<'a, 'py>(
    logits: Option<&'a Bound<'py, PyAny>>,
    scores: Option<&'a Bound<'py, PyAny>>,
) -> PyResult<&'a Bound<'py, PyAny>> {
    match (logits, scores) {
        (Some(logits), None) => Ok(logits),
        (None, Some(scores)) => Ok(scores),
        (Some(_), Some(_)) => Err(args::bad_value(
            "logits",
            "was given twice: pass logits or scores, not both",
        )),
        (None, None) => Err(new_err_with(
            ErrorClass::ArgumentType,
            "logits must be a torch tensor or a numpy array, got None",
            &[("field", Attr::Str("logits".into()))],
        )),
    }
}

/// A processor's state and the plan its calls fill, behind one lock.
pub(crate) struct Row<P> {
    pub(super) processor: P,
    pub(super) plan: RowPlan,
}

impl<P: LogitsProcessor> Row<P> {
    pub(super) fn new(processor: P) -> Exclusive<Self> {
        Exclusive::new(Self {
            processor,
            plan: RowPlan::new(),
        })
    }

    pub(super) fn call(
        &mut self,
        py: Python<'_>,
        max_token: Option<u32>,
        input_ids: &Bound<'_, PyAny>,
        logits: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        call_processor(
            py,
            &mut self.processor,
            max_token,
            &mut self.plan,
            input_ids,
            logits,
        )
    }
}

/// The rest of a pickle's state: a subclass instance's `__dict__`, or None.
pub(super) fn instance_dict<'py>(slf: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    slf.getattr("__dict__")
        .unwrap_or_else(|_| slf.py().None().into_bound(slf.py()))
}
