//! The reference's processors as Python classes, each backed by the core's processor.
//!
//! A call plans with the GIL held (reading only the ids it needs), then edits the row in one pass
//! with the GIL released. On any error the logits and the processor's state are as they were.

use logits_processing::{
    ForcedSequence, LogitsProcessor, Position, Result as CoreResult, RowPlan, Temperature,
    ThinkingBudget, ThinkingTokenConfig, TokenHistory,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::PyTypeInfo;

use crate::args;
use crate::device::apply_row;
use crate::errors::{as_ours, new_err_with, to_py, Attr, ErrorClass, IntoPyResult};
use crate::exclusive::{Exclusive, Held};
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
    processor: P,
    plan: RowPlan,
}

impl<P: LogitsProcessor> Row<P> {
    fn new(processor: P) -> Exclusive<Self> {
        Exclusive::new(Self {
            processor,
            plan: RowPlan::new(),
        })
    }

    fn call(
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
fn instance_dict<'py>(slf: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    slf.getattr("__dict__")
        .unwrap_or_else(|_| slf.py().None().into_bound(slf.py()))
}

/// Divides every logit by `temperature`: above 1 flattens the distribution, below 1 sharpens it.
///
/// A drop-in for the reference's `TemperatureProcessor`, with the same results bit for bit
/// (`logits / temperature`, rounded as torch's `div_` rounds it; `1.0` leaves the logits
/// untouched). It ignores `input_ids`. One pass over the row, with the GIL released. It can be
/// subclassed, copied and pickled, as the reference's can.
///
/// Args:
///     temperature (float): The divisor; must be finite and > 0. Default 1.0.
///
/// Raises:
///     InvalidArgumentError: (a ValueError) for a temperature <= 0, NaN or infinite.
///     ArgumentTypeError: (a TypeError) for a temperature that is not a number.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing.examples import TemperatureProcessor
///     >>> logits = torch.tensor([1.0, 2.0, -4.0])
///     >>> TemperatureProcessor(0.5)([1, 2, 3], logits)
///     >>> logits
///     tensor([ 2.,  4., -8.])
#[pyclass(
    frozen,
    subclass,
    module = "logits_processing.examples",
    name = "TemperatureProcessor"
)]
pub(crate) struct PyTemperature {
    row: Exclusive<Row<Temperature>>,
}

fn temperature_of(value: &Bound<'_, PyAny>) -> PyResult<Temperature> {
    Temperature::new(args::real(value, "temperature")?).py()
}

#[pymethods]
impl PyTemperature {
    #[new]
    #[pyo3(signature = (*positional, **keywords), text_signature = "(temperature=1.0)")]
    fn new(
        positional: &Bound<'_, PyTuple>,
        keywords: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // Omitted is 1.0; None is refused (as the reference's `logits / None` does), so the
        // argument is read by hand rather than as an Option.
        let given =
            args::one_optional(positional, keywords, "temperature", "TemperatureProcessor")?;
        let temperature = match given {
            Some(value) => temperature_of(&value)?,
            None => Temperature::new(1.0).py()?,
        };
        Ok(Self {
            row: Row::new(temperature),
        })
    }

    /// The divisor (float). Assigning checks it as the constructor does.
    #[getter]
    fn temperature(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.lock(py)?.processor.temperature())
    }

    #[setter]
    fn set_temperature(&self, py: Python<'_>, temperature: &Bound<'_, PyAny>) -> PyResult<()> {
        let temperature = temperature_of(temperature)?;
        self.lock(py)?.processor = temperature;
        Ok(())
    }

    /// Edits `logits` (1-D, float32/float16/bfloat16, torch or numpy) in place.
    #[pyo3(signature = (input_ids, logits = None, *, scores = None))]
    fn __call__(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        logits: Option<&Bound<'_, PyAny>>,
        scores: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let logits = logits_arg(logits, scores)?;
        self.lock(py)?.call(py, None, input_ids, logits)
    }

    fn __getnewargs_ex__(&self, py: Python<'_>) -> PyResult<((f64,), Py<PyDict>)> {
        Ok(((self.temperature(py)?,), PyDict::new(py).unbind()))
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        Ok(format!(
            "{}(temperature={})",
            slf.get_type().name()?,
            slf.get().temperature(slf.py())?
        ))
    }
}

impl PyTemperature {
    fn lock(&self, py: Python<'_>) -> PyResult<Held<'_, Row<Temperature>>> {
        self.row.lock(py, "TemperatureProcessor")
    }

    pub(crate) fn processor(&self, py: Python<'_>) -> PyResult<Box<dyn LogitsProcessor>> {
        Ok(Box::new(self.lock(py)?.processor.clone()))
    }
}

/// Forces `token_ids` one per call, then `eos_token_id` forever.
///
/// A drop-in for the reference's `ForcedSequenceLogitsProcessor`: each call keeps only the target
/// token's logit (at its own value; `-0.0` becomes `0.0` as the reference's mask add makes it) and
/// sets every other logit to `-inf`. The target is `token_ids[state]` while there is one, else the
/// EOS id; `state` then advances by one. One instance serves one request. Unlike the reference,
/// one write-only pass and no allocation per call. It can be subclassed, copied and pickled (with
/// its state).
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
///     token_ids (list[int]), eos_id (int), state (int): as the reference's; all assignable. A
///     state past 2**64-1 is kept as 2**64-1 (the sequence is used up either way); a negative one
///     is refused (the reference would index from the end).
///
/// Raises:
///     InvalidArgumentError: (a ValueError) when `eos_token_id` is None or an id is negative.
///     ArgumentTypeError: (a TypeError) for an argument of the wrong type.
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
    frozen,
    subclass,
    module = "logits_processing.examples",
    name = "ForcedSequenceLogitsProcessor"
)]
pub(crate) struct PyForcedSequence {
    row: Exclusive<ForcedRow>,
}

/// The positional arguments of a forced sequence's constructor: its ids and EOS id.
type ForcedArgs = (Vec<u32>, u32);

/// A forced sequence, the largest id it names (O(its length) to find, so kept), its plan.
struct ForcedRow {
    max_token: Option<u32>,
    row: Row<ForcedSequence>,
}

fn position_of(position: &Bound<'_, PyAny>, prompt_len: usize) -> PyResult<Position> {
    match args::text(position, "position")?.as_str() {
        "calls" => Ok(Position::Calls),
        "tokens" => Ok(Position::GeneratedTokens { prompt_len }),
        other => Err(args::bad_value(
            "position",
            format!("must be \"calls\" or \"tokens\", got {other:?}"),
        )),
    }
}

#[pymethods]
impl PyForcedSequence {
    #[new]
    #[pyo3(
        signature = (token_ids, eos_token_id, *, position = None, prompt_len = None),
        text_signature = "(token_ids, eos_token_id, *, position='calls', prompt_len=0)"
    )]
    fn new(
        token_ids: &Bound<'_, PyAny>,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        position: Option<&Bound<'_, PyAny>>,
        prompt_len: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let ids = args::token_ids(token_ids, "token_ids")?;
        let eos = args::given(eos_token_id)
            .map(|id| args::token_id(id, "eos_token_id"))
            .transpose()?;
        let prompt_len = args::given(prompt_len)
            .map(|n| args::index(n, "prompt_len"))
            .transpose()?
            .unwrap_or(0);
        let position = match args::given(position) {
            Some(position) => position_of(position, prompt_len)?,
            None => Position::Calls,
        };
        let inner = ForcedSequence::new(ids, eos).py()?.with_position(position);
        Ok(Self {
            row: Exclusive::new(ForcedRow::new(inner)),
        })
    }

    /// The ids to force (a copy, as a list).
    #[getter]
    fn token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.lock(py)?.row.processor.token_ids())
    }

    #[setter]
    fn set_token_ids(&self, py: Python<'_>, token_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = args::token_ids(token_ids, "token_ids")?;
        let mut this = self.lock(py)?;
        let eos = this.row.processor.eos_token_id();
        this.rebuild(ids, eos)
    }

    /// The EOS id, forced once the sequence is used up.
    #[getter]
    fn eos_id(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.lock(py)?.row.processor.eos_token_id())
    }

    #[setter]
    fn set_eos_id(&self, py: Python<'_>, eos_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let eos = args::token_id(eos_id, "eos_id")?;
        let mut this = self.lock(py)?;
        let ids = this.row.processor.token_ids().to_vec();
        this.rebuild(ids, eos)
    }

    /// The step the next call forces: the number of calls so far (with ``position="calls"``).
    #[getter]
    fn state(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.row.processor.state())
    }

    #[setter]
    fn set_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = args::saturating_index(state, "state")?;
        self.lock(py)?.row.processor.set_state(state);
        Ok(())
    }

    /// ``"calls"`` or ``"tokens"``.
    #[getter]
    fn position(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(match self.lock(py)?.row.processor.position() {
            Position::Calls => "calls",
            Position::GeneratedTokens { .. } => "tokens",
        })
    }

    /// Edits `logits` (1-D, float32/float16/bfloat16, torch or numpy) in place.
    #[pyo3(signature = (input_ids, logits = None, *, scores = None))]
    fn __call__(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        logits: Option<&Bound<'_, PyAny>>,
        scores: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let logits = logits_arg(logits, scores)?;
        let mut this = self.lock(py)?;
        let max_token = this.max_token;
        this.row.call(py, max_token, input_ids, logits)
    }

    /// The constructor's arguments, for copy and pickle (the state travels in `__getstate__`).
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(ForcedArgs, Bound<'py, PyDict>)> {
        let this = self.lock(py)?;
        let processor = &this.row.processor;
        let kwargs = PyDict::new(py);
        if let Position::GeneratedTokens { prompt_len } = processor.position() {
            kwargs.set_item("position", "tokens")?;
            kwargs.set_item("prompt_len", prompt_len)?;
        }
        Ok((
            (processor.token_ids().to_vec(), processor.eos_token_id()),
            kwargs,
        ))
    }

    fn __getstate__<'py>(slf: &Bound<'py, Self>) -> PyResult<(usize, Bound<'py, PyAny>)> {
        Ok((slf.get().state(slf.py())?, instance_dict(slf.as_any())))
    }

    fn __setstate__(slf: &Bound<'_, Self>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let (count, dict): (Bound<'_, PyAny>, Bound<'_, PyAny>) = state
            .extract()
            .map_err(|_| args::wrong_type("state", "(state, __dict__)", state))?;
        slf.get().set_state(slf.py(), &count)?;
        if let Ok(dict) = dict.cast::<PyDict>() {
            slf.getattr("__dict__")?.call_method1("update", (dict,))?;
        }
        Ok(())
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.get().lock(slf.py())?;
        let processor = &this.row.processor;
        Ok(format!(
            "{}(token_ids={:?}, eos_token_id={}, state={})",
            slf.get_type().name()?,
            processor.token_ids(),
            processor.eos_token_id(),
            processor.state()
        ))
    }
}

impl ForcedRow {
    fn new(processor: ForcedSequence) -> Self {
        Self {
            max_token: processor.max_token_id(),
            row: Row {
                processor,
                plan: RowPlan::new(),
            },
        }
    }

    fn rebuild(&mut self, ids: Vec<u32>, eos: u32) -> PyResult<()> {
        let old = &self.row.processor;
        let mut processor = ForcedSequence::new(ids, Some(eos))
            .py()?
            .with_position(old.position());
        processor.set_state(old.state());
        *self = Self::new(processor);
        Ok(())
    }
}

impl PyForcedSequence {
    fn lock(&self, py: Python<'_>) -> PyResult<Held<'_, ForcedRow>> {
        self.row.lock(py, "ForcedSequenceLogitsProcessor")
    }

    pub(crate) fn processor(&self, py: Python<'_>) -> PyResult<Box<dyn LogitsProcessor>> {
        Ok(Box::new(self.lock(py)?.row.processor.clone()))
    }
}

/// Ends a ``<think>`` block once it has used its budget, by forcing the end token.
///
/// The reference's rule: with a start or end id of 0 it does nothing; it finds the last start id
/// in `input_ids`; a block closed by an end id after it is left alone; with `n` ids after the
/// start and ``n >= max_thinking_tokens``, it forces the end token (every logit ``-inf``, the end
/// id's exactly ``0.0``) when the last id is the newline id (a graceful exit at a line end) or when
/// ``n >= max_thinking_tokens + floor(max_thinking_tokens * overflow_percentage)`` (the hard
/// limit; a sum past 2**64-1 is 2**64-1, as unreachable as the reference's unbounded one). Unlike
/// the reference it reads only the ids new since its previous call, so a step costs the same at
/// 32,000 ids as at 1,000 (ids that do not extend the previous call's are rescanned). An end id
/// outside the row fails only a call that forces it (`TokenOutOfVocabError`), as in the
/// reference. It can be subclassed, copied and pickled.
///
/// Args:
///     thinking_start_token_id (int): The id of ``<think>``; 0 disables the processor.
///     thinking_end_token_id (int): The id of ``</think>``; 0 disables the processor.
///     newline_token_id (int): The id of a line end, where the budget may end gracefully.
///     max_thinking_tokens (int): The budget, >= 0 (any larger than 2**64-1 is never reached).
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
#[pyclass(
    frozen,
    subclass,
    module = "logits_processing",
    name = "ThinkingBudgetLogitsProcessor"
)]
pub(crate) struct PyThinkingBudget {
    row: Exclusive<Row<ThinkingBudget>>,
    // Read-only after construction: the getters and pickling read them without the lock.
    tokens: ThinkingTokenConfig,
    max_thinking_tokens: usize,
    overflow_percentage: f64,
    overflow_budget: usize,
}

#[pymethods]
impl PyThinkingBudget {
    #[new]
    #[pyo3(
        signature = (thinking_start_token_id, thinking_end_token_id, newline_token_id, max_thinking_tokens, overflow_percentage = None),
        text_signature = "(thinking_start_token_id, thinking_end_token_id, newline_token_id, max_thinking_tokens, overflow_percentage=0.1)"
    )]
    fn new(
        thinking_start_token_id: &Bound<'_, PyAny>,
        thinking_end_token_id: &Bound<'_, PyAny>,
        newline_token_id: &Bound<'_, PyAny>,
        max_thinking_tokens: &Bound<'_, PyAny>,
        overflow_percentage: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let tokens = ThinkingTokenConfig {
            start_token_id: args::token_id(thinking_start_token_id, "thinking_start_token_id")?,
            end_token_id: args::token_id(thinking_end_token_id, "thinking_end_token_id")?,
            newline_token_id: args::token_id(newline_token_id, "newline_token_id")?,
        };
        let max = args::saturating_index(max_thinking_tokens, "max_thinking_tokens")?;
        let overflow = args::given(overflow_percentage)
            .map(|p| args::real(p, "overflow_percentage"))
            .transpose()?
            .unwrap_or(0.1);
        let inner = ThinkingBudget::new(tokens, max, overflow).py()?;
        Ok(Self {
            tokens,
            max_thinking_tokens: max,
            overflow_percentage: inner.overflow_percentage(),
            overflow_budget: inner.overflow_budget(),
            row: Row::new(inner),
        })
    }

    #[getter]
    fn thinking_start_token_id(&self) -> u32 {
        self.tokens.start_token_id
    }

    #[getter]
    fn thinking_end_token_id(&self) -> u32 {
        self.tokens.end_token_id
    }

    #[getter]
    fn newline_token_id(&self) -> u32 {
        self.tokens.newline_token_id
    }

    #[getter]
    fn max_thinking_tokens(&self) -> usize {
        self.max_thinking_tokens
    }

    #[getter]
    fn overflow_percentage(&self) -> f64 {
        self.overflow_percentage
    }

    /// ``floor(max_thinking_tokens * overflow_percentage)``, at most 2**64-1.
    #[getter]
    fn overflow_budget(&self) -> usize {
        self.overflow_budget
    }

    /// Forgets what it remembers of earlier ids (the answers never depend on it).
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.lock(py)?.processor.reset();
        Ok(())
    }

    /// Edits `logits` (1-D, float32/float16/bfloat16, torch or numpy) in place.
    #[pyo3(signature = (input_ids, logits = None, *, scores = None))]
    fn __call__(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        logits: Option<&Bound<'_, PyAny>>,
        scores: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let logits = logits_arg(logits, scores)?;
        // No check of the end id up front: the plan names it only when it forces, and a plan is
        // checked against the row before anything is written (the reference fails only then too).
        self.lock(py)?.call(py, None, input_ids, logits)
    }

    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> ((u32, u32, u32, usize, f64), Bound<'py, PyDict>) {
        let t = self.tokens;
        (
            (
                t.start_token_id,
                t.end_token_id,
                t.newline_token_id,
                self.max_thinking_tokens,
                self.overflow_percentage,
            ),
            PyDict::new(py),
        )
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.get();
        let t = this.tokens;
        Ok(format!(
            "{}(thinking_start_token_id={}, thinking_end_token_id={}, newline_token_id={}, max_thinking_tokens={}, overflow_percentage={})",
            slf.get_type().name()?,
            t.start_token_id, t.end_token_id, t.newline_token_id, this.max_thinking_tokens, this.overflow_percentage
        ))
    }
}

impl PyThinkingBudget {
    fn lock(&self, py: Python<'_>) -> PyResult<Held<'_, Row<ThinkingBudget>>> {
        self.row.lock(py, "ThinkingBudgetLogitsProcessor")
    }

    pub(crate) fn processor(&self, py: Python<'_>) -> PyResult<Box<dyn LogitsProcessor>> {
        Ok(Box::new(self.lock(py)?.processor.clone()))
    }
}

/// A built-in processor object, as fresh core state for a batch row; `None` for anything else,
/// including a subclass that overrides `__call__` (it is then the user's processor).
pub(crate) fn builtin_processor(
    object: &Bound<'_, PyAny>,
) -> PyResult<Option<Box<dyn LogitsProcessor>>> {
    fn own_call<T: PyTypeInfo>(object: &Bound<'_, PyAny>) -> PyResult<bool> {
        let own = object.py().get_type::<T>().getattr("__call__")?;
        Ok(own.is(&object.get_type().getattr("__call__")?))
    }
    if let Ok(p) = object.cast::<PyTemperature>() {
        if own_call::<PyTemperature>(object)? {
            return p.get().processor(object.py()).map(Some);
        }
    } else if let Ok(p) = object.cast::<PyForcedSequence>() {
        // HelloWorldLogitsProcessor is a Python subclass that keeps `__call__`.
        if own_call::<PyForcedSequence>(object)? {
            return p.get().processor(object.py()).map(Some);
        }
    } else if let Ok(p) = object.cast::<PyThinkingBudget>() {
        if own_call::<PyThinkingBudget>(object)? {
            return p.get().processor(object.py()).map(Some);
        }
    } else if let Ok(p) = object.cast::<PyOutOfVocabForTests>() {
        return Ok(Some(Box::new(OutOfVocab {
            on_id: p.borrow().on_id,
        })));
    }
    Ok(None)
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
