//! The reference's processors as Python classes, each backed by the core's processor.
//!
//! A call plans with the GIL held (reading only the ids it needs), then edits the row in one pass
//! with the GIL released. On any error the logits and the processor's state are as they were.

use logits_processing::{
    ForcedSequence, LogitsProcessor, Position, Result as CoreResult, RowPlan, Temperature,
    ThinkingBudget, ThinkingTokenConfig, TokenHistory,
};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::device::apply_row;
use crate::errors::{new_err, to_py, IntoPyResult, Kind};
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
        return Err(error);
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
    applied
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

/// A token id given from Python, as the core's `u32`.
pub(crate) fn token_id(field: &str, value: i64) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        new_err(
            Kind::Argument,
            format!("{field} must be a token id (an integer from 0 to 2**32-1), got {value}"),
        )
    })
}

fn token_ids(field: &str, values: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut ids = vec![];
    for (i, item) in values.try_iter()?.enumerate() {
        let item = item?;
        let value: i64 = item.extract().map_err(|_| {
            new_err(
                Kind::Argument,
                format!("{field}[{i}] must be an integer token id, got {item}"),
            )
        })?;
        ids.push(token_id(&format!("{field}[{i}]"), value)?);
    }
    Ok(ids)
}

/// Divides every logit by `temperature`: above 1 flattens the distribution, below 1 sharpens it.
///
/// A drop-in for the reference's `TemperatureProcessor`, with the same results bit for bit
/// (`logits / temperature`, rounded as torch's `div_` rounds it; `1.0` leaves the logits
/// untouched). It ignores `input_ids`. One pass over the row, with the GIL released.
///
/// Args:
///     temperature (float): The divisor; must be finite and > 0. Default 1.0.
///
/// Raises:
///     InvalidArgumentError: (a ValueError) for a temperature <= 0, NaN or infinite.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing.examples import TemperatureProcessor
///     >>> logits = torch.tensor([1.0, 2.0, -4.0])
///     >>> TemperatureProcessor(0.5)([1, 2, 3], logits)
///     >>> logits
///     tensor([ 2.,  4., -8.])
#[pyclass(module = "logits_processing.examples", name = "TemperatureProcessor")]
pub(crate) struct PyTemperature {
    inner: Temperature,
    plan: RowPlan,
}

#[pymethods]
impl PyTemperature {
    #[new]
    #[pyo3(signature = (temperature = 1.0))]
    fn new(temperature: f64) -> PyResult<Self> {
        Ok(Self {
            inner: Temperature::new(temperature).py()?,
            plan: RowPlan::new(),
        })
    }

    /// The divisor (float). Assigning checks it as the constructor does.
    #[getter]
    fn temperature(&self) -> f64 {
        self.inner.temperature()
    }

    #[setter]
    fn set_temperature(&mut self, temperature: f64) -> PyResult<()> {
        self.inner = Temperature::new(temperature).py()?;
        Ok(())
    }

    /// Edits `logits` (1-D, float32/float16/bfloat16, torch or numpy) in place.
    fn __call__(
        &mut self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        logits: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        call_processor(py, &mut self.inner, None, &mut self.plan, input_ids, logits)
    }

    fn __repr__(&self) -> String {
        format!(
            "TemperatureProcessor(temperature={})",
            self.inner.temperature()
        )
    }
}

impl PyTemperature {
    pub(crate) fn processor(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.inner.clone())
    }
}

/// Forces `token_ids` one per call, then `eos_token_id` forever.
///
/// A drop-in for the reference's `ForcedSequenceLogitsProcessor`: each call keeps only the target
/// token's logit (at its own value; `-0.0` becomes `0.0` as the reference's mask add makes it) and
/// sets every other logit to `-inf`. The target is `token_ids[state]` while there is one, else the
/// EOS id; `state` then advances by one. One instance serves one request. Unlike the reference,
/// one write-only pass and no allocation per call.
///
/// Args:
///     token_ids (Sequence[int]): The ids to force, in order.
///     eos_token_id (int): Forced once `token_ids` are used up. Required (None raises).
///     position (str): Keyword only. ``"calls"`` (the default, the reference's counting: one step
///         per call) or ``"tokens"``: the step is ``len(input_ids) - prompt_len``, which survives
///         preemption and a prefill/decode split.
///     prompt_len (int): Keyword only; where generated ids start, for ``position="tokens"``.
///
/// Attributes:
///     token_ids (list[int]), eos_id (int), state (int): as the reference's; all assignable.
///
/// Raises:
///     InvalidArgumentError: (a ValueError) when `eos_token_id` is None or an id is negative.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing.examples import ForcedSequenceLogitsProcessor
///     >>> forced = ForcedSequenceLogitsProcessor([2, 0], eos_token_id=3)
///     >>> logits = torch.tensor([0.5, 1.5, 2.5, 3.5])
///     >>> forced([], logits)
///     >>> logits
///     tensor([  -inf,   -inf, 2.5000,   -inf])
///     >>> forced.state
///     1
#[pyclass(
    subclass,
    module = "logits_processing.examples",
    name = "ForcedSequenceLogitsProcessor"
)]
pub(crate) struct PyForcedSequence {
    inner: ForcedSequence,
    max_token: Option<u32>,
    plan: RowPlan,
}

fn position_of(position: &str, prompt_len: usize) -> PyResult<Position> {
    match position {
        "calls" => Ok(Position::Calls),
        "tokens" => Ok(Position::GeneratedTokens { prompt_len }),
        other => Err(new_err(
            Kind::Argument,
            format!("position must be \"calls\" or \"tokens\", got {other:?}"),
        )),
    }
}

#[pymethods]
impl PyForcedSequence {
    #[new]
    #[pyo3(signature = (token_ids, eos_token_id, *, position = "calls", prompt_len = 0))]
    fn new(
        token_ids: &Bound<'_, PyAny>,
        eos_token_id: Option<i64>,
        position: &str,
        prompt_len: usize,
    ) -> PyResult<Self> {
        let eos = eos_token_id
            .map(|id| token_id("eos_token_id", id))
            .transpose()?;
        let inner = ForcedSequence::new(token_ids_of(token_ids)?, eos)
            .py()?
            .with_position(position_of(position, prompt_len)?);
        Ok(Self {
            max_token: inner.max_token_id(),
            inner,
            plan: RowPlan::new(),
        })
    }

    /// The ids to force (a copy, as a list).
    #[getter]
    fn token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.token_ids())
    }

    #[setter]
    fn set_token_ids(&mut self, token_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.rebuild(token_ids_of(token_ids)?, self.inner.eos_token_id())
    }

    /// The EOS id, forced once the sequence is used up.
    #[getter]
    fn eos_id(&self) -> u32 {
        self.inner.eos_token_id()
    }

    #[setter]
    fn set_eos_id(&mut self, eos_id: i64) -> PyResult<()> {
        let ids = self.inner.token_ids().to_vec();
        self.rebuild(ids, token_id("eos_id", eos_id)?)
    }

    /// The step the next call forces: the number of calls so far (with ``position="calls"``).
    #[getter]
    fn state(&self) -> usize {
        self.inner.state()
    }

    #[setter]
    fn set_state(&mut self, state: usize) {
        self.inner.set_state(state);
    }

    /// ``"calls"`` or ``"tokens"``.
    #[getter]
    fn position(&self) -> &'static str {
        match self.inner.position() {
            Position::Calls => "calls",
            Position::GeneratedTokens { .. } => "tokens",
        }
    }

    /// Edits `logits` (1-D, float32/float16/bfloat16, torch or numpy) in place.
    fn __call__(
        &mut self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        logits: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        call_processor(
            py,
            &mut self.inner,
            self.max_token,
            &mut self.plan,
            input_ids,
            logits,
        )
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.borrow();
        Ok(format!(
            "{}(token_ids={:?}, eos_token_id={}, state={})",
            slf.get_type().name()?,
            this.inner.token_ids(),
            this.inner.eos_token_id(),
            this.inner.state()
        ))
    }
}

fn token_ids_of(values: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    token_ids("token_ids", values)
}

impl PyForcedSequence {
    fn rebuild(&mut self, ids: Vec<u32>, eos: u32) -> PyResult<()> {
        let state = self.inner.state();
        let mut inner = ForcedSequence::new(ids, Some(eos))
            .py()?
            .with_position(self.inner.position());
        inner.set_state(state);
        self.max_token = inner.max_token_id();
        self.inner = inner;
        Ok(())
    }

    pub(crate) fn processor(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.inner.clone())
    }
}

/// Ends a ``<think>`` block once it has used its budget, by forcing the end token.
///
/// The reference's rule: with a start or end id of 0 it does nothing; it finds the last start id
/// in `input_ids`; a block closed by an end id after it is left alone; with `n` ids after the
/// start and ``n >= max_thinking_tokens``, it forces the end token (every logit ``-inf``, the end
/// id's exactly ``0.0``) when the last id is the newline id (a graceful exit at a line end) or when
/// ``n >= max_thinking_tokens + floor(max_thinking_tokens * overflow_percentage)`` (the hard
/// limit). Unlike the reference it reads only the ids new since its previous call, so a step costs
/// the same at 32,000 ids as at 1,000 (ids that do not extend the previous call's are rescanned).
///
/// Args:
///     thinking_start_token_id (int): The id of ``<think>``; 0 disables the processor.
///     thinking_end_token_id (int): The id of ``</think>``; 0 disables the processor.
///     newline_token_id (int): The id of a line end, where the budget may end gracefully.
///     max_thinking_tokens (int): The budget, >= 0.
///     overflow_percentage (float): How far past the budget a line may run, as a fraction of it
///         (default 0.1).
///
/// Example:
///     >>> import torch
///     >>> from logits_processing import ThinkingBudgetLogitsProcessor
///     >>> budget = ThinkingBudgetLogitsProcessor(1, 2, 3, max_thinking_tokens=2, overflow_percentage=0.5)
///     >>> logits = torch.zeros(5)
///     >>> budget([1, 4, 4], logits)  # 2 ids: at the budget, mid-line: left alone
///     >>> logits
///     tensor([0., 0., 0., 0., 0.])
///     >>> budget([1, 4, 4, 4], logits)  # 3 ids: the hard limit
///     >>> logits
///     tensor([-inf, -inf, 0., -inf, -inf])
#[pyclass(module = "logits_processing", name = "ThinkingBudgetLogitsProcessor")]
pub(crate) struct PyThinkingBudget {
    inner: ThinkingBudget,
    plan: RowPlan,
}

#[pymethods]
impl PyThinkingBudget {
    #[new]
    #[pyo3(signature = (thinking_start_token_id, thinking_end_token_id, newline_token_id, max_thinking_tokens, overflow_percentage = 0.1))]
    fn new(
        thinking_start_token_id: i64,
        thinking_end_token_id: i64,
        newline_token_id: i64,
        max_thinking_tokens: i64,
        overflow_percentage: f64,
    ) -> PyResult<Self> {
        let tokens = ThinkingTokenConfig {
            start_token_id: token_id("thinking_start_token_id", thinking_start_token_id)?,
            end_token_id: token_id("thinking_end_token_id", thinking_end_token_id)?,
            newline_token_id: token_id("newline_token_id", newline_token_id)?,
        };
        let max = usize::try_from(max_thinking_tokens).map_err(|_| {
            new_err(
                Kind::Argument,
                format!("max_thinking_tokens must be >= 0, got {max_thinking_tokens}"),
            )
        })?;
        Ok(Self {
            inner: ThinkingBudget::new(tokens, max, overflow_percentage).py()?,
            plan: RowPlan::new(),
        })
    }

    #[getter]
    fn thinking_start_token_id(&self) -> u32 {
        self.inner.tokens().start_token_id
    }

    #[getter]
    fn thinking_end_token_id(&self) -> u32 {
        self.inner.tokens().end_token_id
    }

    #[getter]
    fn newline_token_id(&self) -> u32 {
        self.inner.tokens().newline_token_id
    }

    #[getter]
    fn max_thinking_tokens(&self) -> usize {
        self.inner.max_thinking_tokens()
    }

    #[getter]
    fn overflow_percentage(&self) -> f64 {
        self.inner.overflow_percentage()
    }

    /// ``floor(max_thinking_tokens * overflow_percentage)``.
    #[getter]
    fn overflow_budget(&self) -> usize {
        self.inner.overflow_budget()
    }

    /// Forgets what it remembers of earlier ids (the answers never depend on it).
    fn reset(&mut self) {
        self.inner.reset();
    }

    /// Edits `logits` (1-D, float32/float16/bfloat16, torch or numpy) in place.
    fn __call__(
        &mut self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        logits: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let max_token = self.inner.max_token_id();
        call_processor(
            py,
            &mut self.inner,
            max_token,
            &mut self.plan,
            input_ids,
            logits,
        )
    }

    fn __repr__(&self) -> String {
        let t = self.inner.tokens();
        format!(
            "ThinkingBudgetLogitsProcessor(thinking_start_token_id={}, thinking_end_token_id={}, newline_token_id={}, max_thinking_tokens={}, overflow_percentage={})",
            t.start_token_id, t.end_token_id, t.newline_token_id, self.inner.max_thinking_tokens(), self.inner.overflow_percentage()
        )
    }
}

impl PyThinkingBudget {
    pub(crate) fn processor(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.inner.clone())
    }
}

/// A built-in processor object, as fresh core state for a batch row.
pub(crate) fn builtin_processor(object: &Bound<'_, PyAny>) -> Option<Box<dyn LogitsProcessor>> {
    if let Ok(p) = object.cast::<PyTemperature>() {
        return Some(p.borrow().processor());
    }
    if let Ok(p) = object.cast::<PyForcedSequence>() {
        // A Python subclass (HelloWorldLogitsProcessor) is ours unless it overrides `__call__`.
        let py = object.py();
        let own_call = py.get_type::<PyForcedSequence>().getattr("__call__").ok()?;
        let its_call = object.get_type().getattr("__call__").ok()?;
        if own_call.is(&its_call) {
            return Some(p.borrow().processor());
        }
        return None;
    }
    if let Ok(p) = object.cast::<PyThinkingBudget>() {
        return Some(p.borrow().processor());
    }
    if let Ok(p) = object.cast::<PyOutOfVocabForTests>() {
        return Some(Box::new(OutOfVocab {
            on_id: p.borrow().on_id,
        }));
    }
    None
}

/// For the tests of a batch's plan validation: a pipeline step that, when the last id is
/// `on_id`, plans a token outside any vocab without saying so in `max_token_id` (no built-in
/// does; a processor added later might).
#[pyclass(module = "logits_processing._lib", name = "_OutOfVocabForTests")]
pub(crate) struct PyOutOfVocabForTests {
    on_id: u32,
}

#[pymethods]
impl PyOutOfVocabForTests {
    #[new]
    fn new(on_id: u32) -> Self {
        Self { on_id }
    }
}

#[derive(Debug)]
struct OutOfVocab {
    on_id: u32,
}

impl LogitsProcessor for OutOfVocab {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> CoreResult<()> {
        if ids.last_token() == Some(self.on_id) {
            plan.push(logits_processing::Edit::Ban {
                token: u32::MAX - 1,
            });
        }
        Ok(())
    }

    fn undo(&mut self) {}
}
