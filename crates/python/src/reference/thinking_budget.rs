//! `ThinkingBudgetLogitsProcessor`: the reference's thinking budget, backed by the core's.

use logits_processing::{LogitsProcessor, ThinkingBudget, ThinkingTokenConfig};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args;
use crate::errors::IntoPyResult;
use crate::exclusive::{Exclusive, Held};

use super::call::{logits_arg, Row};

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
