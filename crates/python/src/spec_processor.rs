//! `Processor`: any spec kind as a processor of one row, with no binding code per kind.

use logits_processing::{Pipeline, Result as CoreResult, TokenHistory};
use pyo3::prelude::*;

use crate::args;
use crate::context::context_arg;
use crate::device::{apply_pipeline_row, Pending};
use crate::errors::{to_py, IntoPyResult};
use crate::exclusive::Exclusive;
use crate::reference::{call_row, logits_arg, RowSteps};
use crate::specs::{check_prompt_len, entries_any_order, refuse_caller_mask, Entry};
use crate::tensor::Block;

/// A processor made from a request spec: every kind a ``Batch`` accepts, for one row.
///
/// Called like the reference's processors, ``processor(input_ids, logits)``, it edits the 1-D
/// row in place (torch or numpy, float32 / float16 / bfloat16, no copy) and keeps its own state
/// from call to call; a list of specs is a pipeline, applied in order in one pass over the row.
/// Token ids are checked against the row's length at each call, so no vocab size is needed. On any
/// error the logits and the state are as they were.
///
/// One processor serves one request, as the reference's do. Kinds that read the ids recompute
/// from whatever ids they are given, but kinds that count calls (a forced sequence positioned by
/// ``"calls"``, the default) carry on, and ``prompt_len`` is the one given here: for another
/// request make a new processor, or call :meth:`reset` when its prompt has the same length.
///
/// Args:
///     spec: A spec dict, JSON text (one spec object or a list), or a list of dicts / JSON texts.
///     prompt_len (int): Keyword only. Where generated ids start in ``input_ids``: the prompt's
///         length. Required by the specs that depend on it (:func:`needs_prompt_len`), as by
///         :meth:`Batch.add`; ignored by the others (0).
///     context (EngineContext | None): Keyword only. What the engine knows, for specs that
///         need it (``hello_world``, thinking budgets without ids, grammars).
///
/// Raises:
///     SpecError: (a ValueError) naming the field of a bad spec, e.g. ``"[1].token_ids"``; a
///         ``bitmask`` step, whose mask only :meth:`Batch.apply` takes.
///     InvalidArgumentError: no prompt_len for specs that need it (``field`` is
///         ``"prompt_len"``).
///     TokenOutOfVocabError: at a call, for a spec naming a token outside the row.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing import Processor
///     >>> ban = Processor([{"kind": "ban_tokens", "token_ids": [0]},
///     ...                  {"kind": "temperature", "temperature": 0.5}])
///     >>> logits = torch.tensor([1.0, 2.0, -4.0])
///     >>> ban([7, 8], logits)
///     >>> logits
///     tensor([-inf,  4., -8.])
///     >>> ban.kinds
///     ['ban_tokens', 'temperature']
#[pyclass(frozen, subclass, module = "logits_processing", name = "Processor")]
pub(crate) struct PyProcessor {
    // The pipeline, and its last device step's outcomes for its next step.
    pipeline: Exclusive<(Pipeline, Pending)>,
    kinds: Vec<&'static str>,
    max_token: Option<u32>,
}

/// A pipeline of specs as the steps of one `__call__`.
struct Steps<'a>(&'a mut Pipeline, &'a mut Pending);

impl RowSteps for Steps<'_> {
    fn plan(&mut self, ids: &dyn TokenHistory) -> CoreResult<()> {
        self.0.plan(ids)
    }

    fn undo(&mut self) {
        self.0.undo();
    }

    fn validate(&self, vocab: usize) -> CoreResult<()> {
        self.0.validate_plans(vocab)
    }

    fn apply(&mut self, py: Python<'_>, block: Block) -> PyResult<()> {
        let applied = apply_pipeline_row(py, self.0, block, self.1);
        if applied.is_err() {
            self.1.discard();
        }
        applied
    }
}

#[pymethods]
impl PyProcessor {
    #[new]
    #[pyo3(
        signature = (spec, *, prompt_len = None, context = None),
        text_signature = "(spec, *, prompt_len=0, context=None)"
    )]
    fn new(
        spec: &Bound<'_, PyAny>,
        prompt_len: Option<&Bound<'_, PyAny>>,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let prompt_len = args::given(prompt_len)
            .map(|n| args::index(n, "prompt_len"))
            .transpose()?;
        let context = context_arg(context)?;
        let entries = entries_any_order(spec, false)?;
        refuse_caller_mask(&entries, "a Processor")?;
        let mut kinds = vec![];
        for (at, entry) in &entries {
            match entry {
                Entry::Specs(specs) => kinds.extend(specs.iter().map(|spec| spec.kind())),
                _ => {
                    return Err(to_py(logits_processing::Error::InvalidSpec {
                        field: if at.is_empty() {
                            "spec".into()
                        } else {
                            at.clone()
                        },
                        message: "expected a spec (a dict or JSON text)".into(),
                    }))
                }
            }
        }
        let needs_prompt_len = check_prompt_len(&entries, prompt_len);
        let pipeline = Pipeline::from_entries(entries, &context, prompt_len.unwrap_or(0), |_| {
            unreachable!("no callables among specs")
        })
        .py()?;
        // After the specs' own errors, which say more.
        needs_prompt_len?;
        Ok(Self {
            max_token: pipeline.max_token_id(),
            pipeline: Exclusive::new((pipeline, Pending::default())),
            kinds,
        })
    }

    /// The kind of each spec, in pipeline order.
    #[getter]
    fn kinds(&self) -> Vec<&'static str> {
        self.kinds.clone()
    }

    /// Back to the state of a new request (a forced sequence starts again); ``prompt_len`` stays
    /// the one given.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        let mut state = self.pipeline.lock(py, "Processor")?;
        state.0.reset();
        state.1.discard();
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
        let mut state = self.pipeline.lock(py, "Processor")?;
        let (pipeline, pending) = &mut *state;
        pending.collect_pipeline(py, pipeline)?;
        call_row(
            py,
            &mut Steps(pipeline, pending),
            self.max_token,
            input_ids,
            logits,
        )
    }

    fn __repr__(&self) -> String {
        let kinds: Vec<String> = self.kinds.iter().map(|k| format!("'{k}'")).collect();
        format!("Processor(kinds=[{}])", kinds.join(", "))
    }
}
