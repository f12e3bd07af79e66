//! `ForcedSequenceLogitsProcessor`: the reference's forced sequence, backed by the core's.

use logits_processing::{ForcedSequence, LogitsProcessor, Position, RowPlan};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::args;
use crate::errors::IntoPyResult;
use crate::exclusive::{Exclusive, Held};

use super::call::{instance_dict, logits_arg, Row};

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
