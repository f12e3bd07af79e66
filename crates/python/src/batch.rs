//! `Batch`: one pipeline per row of a `[rows, vocab]` logits block, one call per decode step.

use std::collections::HashMap;

use logits_processing::{Batch, EngineContext, Error, Pipeline, Step, StepBitmask, TokenHistory};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::args;
use crate::context::{context_arg, context_of};
use crate::device::{apply_batch, apply_batch_host_into, Pending};
use crate::errors::{
    describe_exception, in_row, new_err, new_err_with, spec_error, to_py, Attr, ErrorClass,
    IntoPyResult,
};
use crate::exclusive::{Exclusive, Held};
use crate::history::PyIds;
use crate::reference::logits_arg;
use crate::specs::{callable_name, check_prompt_len, entries_any_order};
use crate::tensor::{bitmask_words, Block, Device, TensorView};
use crate::tokenizer::check_vocab_size;
use crate::watch::{check_unmoved, row_moved, Moved, Watched};

/// The source block of an out-of-place apply: what `out` (`block`) will hold, read from `view`.
fn source_block(view: &TensorView, block: &Block) -> PyResult<Block> {
    let source = Block::source_from_view(view, 2)?;
    if (source.dtype, source.rows, source.vocab) != (block.dtype, block.rows, block.vocab) {
        return Err(new_err(
            ErrorClass::Shape,
            format!(
                "out must match logits: logits are {} x {} {}, out is {} x {} {}",
                source.rows,
                source.vocab,
                source.dtype.name(),
                block.rows,
                block.vocab,
                block.dtype.name()
            ),
        ));
    }
    if source.row_stride != block.row_stride {
        return Err(new_err(
            ErrorClass::Shape,
            format!(
                "out must have the row stride of logits ({}), got {}",
                source.row_stride, block.row_stride
            ),
        ));
    }
    if source.device != Device::Cpu || block.device != Device::Cpu {
        return Err(new_err(
            ErrorClass::Device,
            format!(
                "out= takes host tensors (logits on {}, out on {}); for GPU logits clone them and \
                 apply in place",
                source.device, block.device
            ),
        ));
    }
    if source.overlaps(block) {
        return Err(new_err(
            ErrorClass::Shape,
            "out overlaps logits; leave out None to edit logits in place",
        ));
    }
    Ok(source)
}

/// One pipeline per row of a ``[rows, vocab_size]`` logits block, and one call per decode step that
/// edits every row in place.
///
/// It follows an engine's row lifecycle: a request's pipeline is added at its row, removed when
/// the request ends, moved or swapped when the engine compacts its batch. Each step,
/// :meth:`apply` plans every row (cheap: each processor reads only its new ids) while holding the
/// GIL, then releases it and edits the rows in parallel, one pass per row. A user's own Python
/// processor may sit in a pipeline between built-ins: it runs in its place, on its row, with the
/// GIL. Rows without a request are left untouched.
///
/// Args:
///     vocab_size (int | None): Logits per row (the last dimension of the logits); default: the
///         context's.
///     context (EngineContext | None): Keyword only. What the engine knows, for specs that
///         need it (``hello_world``, thinking budgets without ids, grammars, text), and the EOS
///         ids a row left with no finite logit is given (see :meth:`failure`): build one per
///         engine and share it between batches. Not :meth:`EngineContext.structure_only`.
///
/// Raises:
///     ArgumentTypeError, InvalidArgumentError: no vocab size (neither given nor in the
///         context), or a structure-only context.
///     TokenOutOfVocabError: an EOS id of the context outside ``vocab_size``.
///     TokenizerError: a tokenizer with more tokens than ``vocab_size``.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing import Batch
///     >>> batch = Batch(4)
///     >>> batch.add(0, {"kind": "temperature", "temperature": 0.5})
///     >>> batch.add(1, '{"kind": "forced_sequence", "token_ids": [2], "eos_token_id": 0}')
///     >>> logits = torch.ones(3, 4)
///     >>> batch.apply(logits, [[5], [7], None])
///     >>> logits
///     tensor([[2., 2., 2., 2.],
///             [-inf, -inf, 1., -inf],
///             [1., 1., 1., 1.]])
#[pyclass(frozen, module = "logits_processing", name = "Batch")]
pub(crate) struct PyBatch {
    state: Exclusive<BatchState>,
}

pub(crate) struct BatchState {
    batch: Batch,
    context: EngineContext,
    externals: HashMap<u64, Py<PyAny>>,
    next_key: u64,
    // The last device step's outcomes for the processors' next step (collected before the batch
    // plans again or its rows change).
    pending: Pending,
}

impl PyBatch {
    /// The batch, the last device step's outcomes recorded in its plans first (one wait on their
    /// copy when they are in flight, which only steps with a kind reading its pass leave): before
    /// the batch plans again, or its rows change.
    fn lock(&self, py: Python<'_>) -> PyResult<Held<'_, BatchState>> {
        let mut held = self.state.lock(py, "Batch")?;
        let state = &mut *held;
        state.pending.collect_batch(py, &mut state.batch)?;
        Ok(held)
    }
}

impl BatchState {
    fn batch(&mut self) -> &mut Batch {
        &mut self.batch
    }

    /// Drops the Python processors of a pipeline that left the batch.
    fn forget(&mut self, pipeline: Option<Pipeline>) {
        for step in pipeline.iter().flat_map(Pipeline::steps) {
            if let Step::External(key) = step {
                self.externals.remove(key);
            }
        }
    }
}

#[pymethods]
impl PyBatch {
    #[new]
    #[pyo3(signature = (vocab_size = None, *, context = None))]
    fn new(
        vocab_size: Option<&Bound<'_, PyAny>>,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let given_vocab = args::given(vocab_size)
            .map(|v| args::index(v, "vocab_size"))
            .transpose()?;
        if let Some(context) = args::given(context) {
            if context_of(context)?.get().context.structure_only {
                return Err(args::bad_value(
                    "context",
                    "is EngineContext.structure_only(), which cannot realize specs; give the \
                     engine's context",
                ));
            }
        }
        let mut context = context_arg(context)?;
        let vocab_size = given_vocab.or(context.vocab_size).ok_or_else(|| {
            new_err_with(
                ErrorClass::ArgumentType,
                "Batch: vocab_size is missing: give it, or a context that knows it",
                &[("field", Attr::Str("vocab_size".into()))],
            )
        })?;
        context.vocab_size = Some(vocab_size);
        if let Some(vocab) = &context.vocab {
            check_vocab_size(vocab, vocab_size)?;
        }
        let batch = Batch::new(vocab_size)
            .with_eos_token_ids(context.eos_token_ids.clone())
            .py()?;
        Ok(Self {
            state: Exclusive::new(BatchState {
                batch,
                context,
                externals: HashMap::new(),
                next_key: 0,
                pending: Pending::default(),
            }),
        })
    }

    /// Puts a new request's pipeline at `row`, replacing what was there.
    ///
    /// Args:
    ///     row (int): The request's row in the logits block.
    ///     pipeline: JSON text (one spec or a list), a spec dict, or a list mixing spec dicts,
    ///         this package's processor objects (their current state is copied) and any callable
    ///         ``f(input_ids, logits_row) -> None`` that edits its row in place.
    ///     prompt_len (int): Keyword only. Where generated ids start in this row's input_ids:
    ///         the prompt's length. Required by the specs that depend on it
    ///         (:func:`needs_prompt_len`: grammars, ``json_object``, frequency and presence
    ///         penalties, a repetition penalty scoped to the output or the prompt,
    ///         ``min_new_tokens``, the exponential decay length penalty,
    ///         ``suppress_tokens_at_begin`` without ``begin_index``, forced sequences and
    ///         ``hello_world`` positioned by tokens); ignored by the others (0).
    ///
    /// Raises:
    ///     SpecError: naming the field of a bad spec; TokenOutOfVocabError for an id >= vocab_size.
    ///     ArgumentTypeError, InvalidArgumentError: a row or prompt_len that is not an integer
    ///         from 0 to 2**64-1; no prompt_len for specs that need it (``field`` is
    ///         ``"prompt_len"``, the message names the spec).
    #[pyo3(
        signature = (row, pipeline, *, prompt_len = None),
        text_signature = "(self, row, pipeline, *, prompt_len=0)"
    )]
    fn add(
        &self,
        py: Python<'_>,
        row: &Bound<'_, PyAny>,
        pipeline: &Bound<'_, PyAny>,
        prompt_len: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let row = args::index(row, "row")?;
        let prompt_len = args::given(prompt_len)
            .map(|n| args::index(n, "prompt_len"))
            .transpose()?;
        let entries = entries_any_order(pipeline, true)?;
        let needs_prompt_len = check_prompt_len(&entries, prompt_len);
        let mut this = self.lock(py)?;
        let this = &mut *this;
        let mut callables = vec![];
        let mut next_key = this.next_key;
        let pipeline = Pipeline::from_entries(
            entries,
            &this.context,
            prompt_len.unwrap_or(0),
            |callable| {
                next_key += 1;
                let name = callable_name(&callable);
                callables.push((next_key, callable));
                (next_key, name)
            },
        )
        .py()?;
        // After the specs' own errors, which say more.
        needs_prompt_len?;
        let vocab = this.batch().vocab_size();
        pipeline
            .validate(vocab)
            .map_err(|e| to_py(spec_error(e, "")))?;
        let replaced = this.batch().add(row, pipeline).py()?;
        this.forget(replaced);
        this.next_key = next_key;
        this.externals.extend(callables);
        Ok(())
    }

    /// Takes the request at `row` out of the batch. Returns whether there was one.
    fn remove(&self, py: Python<'_>, row: &Bound<'_, PyAny>) -> PyResult<bool> {
        let row = args::index(row, "row")?;
        let mut this = self.lock(py)?;
        let removed = this.batch().remove(row);
        let had = removed.is_some();
        this.forget(removed);
        Ok(had)
    }

    /// Moves the request at `src` to `dst` (vLLM's unidirectional move): the request that was at
    /// `dst`, if any, is dropped, and `src` is left empty.
    #[pyo3(name = "move")]
    fn move_row(
        &self,
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (src, dst) = (args::index(src, "src")?, args::index(dst, "dst")?);
        let mut this = self.lock(py)?;
        let dropped = this.batch().move_row(src, dst);
        this.forget(dropped);
        Ok(())
    }

    /// Sets the request at ``row`` aside, state and all, leaving the row empty; returns a ticket
    /// for :meth:`unpark`, or None when the row is empty. For engines whose calls leave out
    /// requests that still run (SGLang samples a prefill of joining requests alone): what the
    /// ids cannot rebuild (mirostat's ``mu``, ``max_time``'s clock) survives the call.
    fn park(&self, py: Python<'_>, row: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let row = args::index(row, "row")?;
        Ok(self.lock(py)?.batch().park(row))
    }

    /// Puts the request parked under ``ticket`` back at ``row``; the request that was at
    /// ``row``, if any, is dropped.
    ///
    /// Raises:
    ///     InvalidArgumentError: no request is parked under ``ticket`` (nothing changes).
    fn unpark(
        &self,
        py: Python<'_>,
        ticket: &Bound<'_, PyAny>,
        row: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ticket = args::index(ticket, "ticket")? as u64;
        let row = args::index(row, "row")?;
        let mut this = self.lock(py)?;
        let dropped = this.batch().unpark(ticket, row).py()?;
        this.forget(dropped);
        Ok(())
    }

    /// Drops the request parked under ``ticket``. Returns whether there was one.
    fn discard(&self, py: Python<'_>, ticket: &Bound<'_, PyAny>) -> PyResult<bool> {
        let ticket = args::index(ticket, "ticket")? as u64;
        let mut this = self.lock(py)?;
        let dropped = this.batch().discard(ticket);
        let had = dropped.is_some();
        this.forget(dropped);
        Ok(had)
    }

    /// How many requests are parked.
    #[getter]
    fn parked(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.batch().parked())
    }

    /// Swaps the requests at rows `a` and `b` (either may be empty).
    fn swap(&self, py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<()> {
        let (a, b) = (args::index(a, "a")?, args::index(b, "b")?);
        self.lock(py)?.batch().swap_rows(a, b);
        Ok(())
    }

    fn __contains__(&self, py: Python<'_>, row: &Bound<'_, PyAny>) -> PyResult<bool> {
        let row = args::index(row, "row")?;
        Ok(self.lock(py)?.batch().get(row).is_some())
    }

    /// The rows that hold a request, in order.
    fn rows(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        Ok(self.lock(py)?.rows_list())
    }

    /// How many rows hold a request.
    #[getter]
    fn occupied(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.batch().occupied())
    }

    /// Logits per row.
    #[getter]
    fn vocab_size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.batch().vocab_size())
    }

    /// Edits every row of `logits` that holds a request, in place.
    ///
    /// A step is all or nothing: when anything fails in any row (an id that is not a token id, a
    /// user's processor raising, a plan naming a token outside the vocab), every row's logits and
    /// every processor's state are as they were before the call, and the error's ``row`` says
    /// which row failed. The next call behaves as if the failed one never happened.
    ///
    /// Args:
    ///     logits: A 2-D ``[rows, vocab_size]`` torch tensor or numpy array, float32 / float16 /
    ///         bfloat16, contiguous in its last dimension (rows may be further apart).
    ///     input_ids: One entry per row: that request's ids so far (a list, tuple, numpy array or
    ///         CPU torch tensor of ints), or None for a row without a request.
    ///     out: Where to write instead (host tensors): a tensor or array of the same shape,
    ///         dtype and row stride as `logits`, not overlapping it. `logits` is then only read
    ///         (it may be read-only), every row of `out` is written (rows without a request get a
    ///         copy), and each logit is read and written once, where a copy followed by an edit in
    ///         place would make two passes (HF transformers' rule that processors leave their
    ///         input alone).
    ///     scores: Keyword only; the logits under the name the reference's forced sequence gives
    ///         them (give `logits` or `scores`, not both).
    ///     bitmask: For rows whose pipeline has a ``{"kind": "bitmask"}`` step: the caller's own
    ///         mask, an int32 (or uint32) host tensor or array ``[rows, ceil(vocab_size / 32)]``,
    ///         C-contiguous, bit ``i % 32`` of word ``i // 32`` set allowing token ``i``
    ///         (llguidance's and xgrammar's layout). It is applied in that step's place in the
    ///         row's one pass; other rows ignore it.
    ///
    /// Raises:
    ///     ArgumentTypeError, InvalidArgumentError: an argument of the wrong type or out of range,
    ///         naming it.
    ///     ShapeError, DTypeError, ReadOnlyError, DeviceError: before anything is edited
    ///         (a bitmask of the wrong shape or dtype, or none when a row takes one, included).
    ///     InvalidArgumentError, DTypeError: a row's ids that are not token ids, or None for a row
    ///         that holds a request (``row`` set).
    ///     TokenOutOfVocabError: a row planned a token outside the vocab (``row`` set).
    ///     ProcessorError: a user's processor raised (its exception is the ``__cause__``), or
    ///         moved the logits' memory during its step (``resize_``, ``set_``): the step is
    ///         taken back, and where the memory the logits had is gone, it is not written to
    ///         (the message says so). ``KeyboardInterrupt``, ``SystemExit`` and other exceptions
    ///         that are not an ``Exception`` propagate unchanged, after the step is taken back.
    #[pyo3(
        signature = (logits = None, input_ids = None, *, out = None, scores = None, bitmask = None),
        text_signature = "(self, logits, input_ids, *, out=None, scores=None, bitmask=None)"
    )]
    fn apply(
        &self,
        py: Python<'_>,
        logits: Option<&Bound<'_, PyAny>>,
        input_ids: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        scores: Option<&Bound<'_, PyAny>>,
        bitmask: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let logits = logits_arg(logits, scores)?;
        let input_ids = input_ids_arg(input_ids)?;
        let mut this = self.lock(py)?;
        let this = &mut *this;
        let vocab = this.batch().vocab_size();
        let tensors = Tensors::of(logits, args::given(out), vocab)?;
        let block = tensors.block;
        this.batch()
            .check_layout(block.len(), block.layout())
            .py()?;
        let rows: Vec<usize> = this.rows_list();
        let given = input_ids.len().map_err(|_| not_input_ids(input_ids))?;
        if let Some(&row) = rows.last().filter(|&&row| row >= given) {
            return Err(new_err(
                ErrorClass::Shape,
                format!("row {row} holds a request but input_ids has only {given} entries"),
            ));
        }
        crate::device::check_supported(block.device)?;
        let mask_view = bitmask
            .filter(|m| !m.is_none())
            .map(|m| bitmask_words(m, block.rows, vocab.div_ceil(32)))
            .transpose()?;
        let histories = histories_of(py, input_ids, &rows)?;
        let step_mask = mask_view.as_ref().map(|view| StepBitmask {
            // SAFETY: checked by `bitmask_words`: host memory of this many aligned 32-bit words,
            // kept alive by `bitmask` for the call.
            words: unsafe { view.words() },
            words_per_row: vocab.div_ceil(32),
        });
        this.plan_step(py, &histories, step_mask)?;
        // Reading input_ids may have run Python code (a sequence type, an iterator, `__index__`),
        // which may have moved the logits; a list or tuple of lists of ints runs none.
        let ran_python = !(input_ids.is_exact_instance_of::<PyList>()
            || input_ids.is_exact_instance_of::<PyTuple>())
            || histories.iter().any(PyIds::ran_python);
        drop(histories);
        if ran_python {
            if let Err(error) = tensors.check_unmoved() {
                this.batch().undo_plan();
                return Err(error);
            }
        }
        this.run_step(py, &tensors, input_ids)
    }

    /// Why the request at `row` stopped being constrained as asked, or None: a grammar that
    /// rejected a token the engine chose (another processor forced it, or the mask was not
    /// applied) allows only EOS from then on, and says why here. So does a step that would have
    /// left the row with no finite logit (the logits given had none, or its specs removed every
    /// token: allowed ids all banned, a grammar's mask meeting a ban, a bitmask of zeros, a
    /// Python processor): that step gave the row only the context's EOS ids (without any, it
    /// left the row with no finite logit), and the reason names the specs. Such a row never
    /// fails a step.
    fn failure(&self, py: Python<'_>, row: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let row = args::index(row, "row")?;
        let mut this = self.lock(py)?;
        let Some(pipeline) = this.batch().get(row) else {
            return Ok(None);
        };
        let failures = pipeline.failures();
        Ok((!failures.is_empty()).then(|| failures.join("; ")))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut this = self.lock(py)?;
        let vocab = this.batch().vocab_size();
        Ok(format!(
            "Batch(vocab_size={vocab}, rows={:?})",
            this.rows_list()
        ))
    }
}

/// `input_ids` of `Batch.apply`: one entry per row, so anything with a length.
/// The tensors of one `Batch.apply` call: the logits, and `out` where the result goes.
struct Tensors<'a, 'py> {
    logits: &'a Bound<'py, PyAny>,
    view: TensorView,
    out: Option<(&'a Bound<'py, PyAny>, TensorView)>,
    /// The block the steps edit: the logits', or `out`'s.
    block: Block,
    /// With `out`: the logits' block, which the steps read.
    source: Option<Block>,
}

impl<'a, 'py> Tensors<'a, 'py> {
    /// Reads the tensors' layouts, refusing blocks of another width than `vocab`.
    fn of(
        logits: &'a Bound<'py, PyAny>,
        out: Option<&'a Bound<'py, PyAny>>,
        vocab: usize,
    ) -> PyResult<Self> {
        let view = TensorView::of(logits)?;
        let out = out
            .map(|out| TensorView::of(out).map(|view| (out, view)))
            .transpose()?;
        let (source, block) = match &out {
            None => (None, Block::from_view(&view, 2)?),
            Some((_, out_view)) => {
                let block = Block::from_view(out_view, 2)?;
                (Some(source_block(&view, &block)?), block)
            }
        };
        if block.vocab != vocab {
            return Err(new_err(
                ErrorClass::Shape,
                format!(
                    "logits have {} per row, the batch's vocab_size is {vocab}",
                    block.vocab
                ),
            ));
        }
        Ok(Self {
            logits,
            view,
            out,
            block,
            source,
        })
    }

    /// Where the result goes: its name, its object, its view.
    fn target(&self) -> (&'static str, &'a Bound<'py, PyAny>, &TensorView) {
        match &self.out {
            Some((out, view)) => ("out", out, view),
            None => ("logits", self.logits, &self.view),
        }
    }

    /// Refuses tensors that moved since they were read (Python code ran in between).
    fn check_unmoved(&self) -> PyResult<()> {
        check_unmoved("logits", self.logits, &self.view)?;
        match &self.out {
            Some((out, view)) => check_unmoved("out", out, view),
            None => Ok(()),
        }
    }

    /// What is checked after each user step: the target, and the logits when they are apart.
    fn watched(&self) -> Vec<Watched> {
        let (name, target, view) = self.target();
        let mut watched = vec![Watched::new(name, target, view)];
        if self.out.is_some() {
            watched.push(Watched::new("logits", self.logits, &self.view));
        }
        watched
    }

    /// Tells torch the target was written (its version counter).
    fn edited(&self) -> PyResult<()> {
        let (_, target, view) = self.target();
        view.edited(target)
    }
}

/// Each held row's ids from `input_ids` (rows without a request read nothing); None for a row
/// that holds a request is refused.
fn histories_of<'py>(
    py: Python<'py>,
    input_ids: &Bound<'py, PyAny>,
    rows: &[usize],
) -> PyResult<Vec<PyIds<'py>>> {
    let mut histories: Vec<PyIds<'py>> = (0..rows.last().map_or(0, |r| r + 1))
        .map(|_| PyIds::empty())
        .collect();
    for &row in rows {
        let ids = input_ids
            .get_item(row)
            .map_err(|e| in_row(py, e, row, &format!("input_ids[{row}]")))?;
        if ids.is_none() {
            // An empty history would restart the row's request (its prompt read as absent).
            let error = new_err(
                ErrorClass::Argument,
                format!(
                    "input_ids[{row}] is None, but row {row} holds a request: give its ids \
                     (None is for a row without one)"
                ),
            );
            return Err(in_row(py, error, row, &format!("input_ids[{row}]")));
        }
        histories[row] = PyIds::new(&ids);
    }
    Ok(histories)
}

fn input_ids_arg<'a, 'py>(
    input_ids: Option<&'a Bound<'py, PyAny>>,
) -> PyResult<&'a Bound<'py, PyAny>> {
    match args::given(input_ids) {
        Some(ids) => Ok(ids),
        None => Err(new_err_with(
            ErrorClass::ArgumentType,
            "input_ids must be a sequence with one entry per row (each a row's ids, or None), got None",
            &[("field", Attr::Str("input_ids".into()))],
        )),
    }
}

fn not_input_ids(input_ids: &Bound<'_, PyAny>) -> PyErr {
    args::wrong_type(
        "input_ids",
        "a sequence with one entry per row (each a row's ids, or None)",
        input_ids,
    )
}

impl BatchState {
    fn rows_list(&mut self) -> Vec<usize> {
        self.batch().iter().map(|(row, _)| row).collect()
    }

    /// Plans a step: every row's processors read their ids, the caller's bitmask is filled in,
    /// and the costly part (grammar masks) runs, rows in parallel, without the GIL. On error
    /// nothing stays planned.
    fn plan_step(
        &mut self,
        py: Python<'_>,
        histories: &[PyIds<'_>],
        bitmask: Option<StepBitmask<'_>>,
    ) -> PyResult<()> {
        let refs: Vec<&dyn TokenHistory> =
            histories.iter().map(|h| h as &dyn TokenHistory).collect();
        let planned = self.batch().plan_ids(&refs);
        // An id that could not be read was planned as `u32::MAX`: whatever the plan made of it,
        // the step is taken back (a failed plan already took back every row).
        let unreadable = histories
            .iter()
            .enumerate()
            .find_map(|(row, history)| history.take_error().map(|error| (row, error)));
        if let Some((row, error)) = unreadable {
            if planned.is_ok() {
                self.batch().undo_plan();
            }
            return Err(in_row(py, error, row, &format!("input_ids[{row}]")));
        }
        planned.py()?;
        if let Err(error) = self.batch().fill_bitmask(bitmask) {
            self.batch().undo_plan();
            return Err(to_py(error));
        }
        let batch = self.batch();
        py.detach(|| batch.finish_plans());
        Ok(())
    }

    /// Applies the planned step to the tensors, calling each user step in its place on its row
    /// of the target (with the row's ids from `input_ids`).
    fn run_step(
        &mut self,
        py: Python<'_>,
        tensors: &Tensors<'_, '_>,
        input_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let BatchState {
            batch,
            externals,
            pending,
            ..
        } = self;
        // User steps edit the rows where the result goes. They may move that memory, or the
        // source's (a tensor they hold on to): both are checked after each user step.
        let watched = if batch.iter().any(|(_, p)| p.has_external()) {
            tensors.watched()
        } else {
            vec![]
        };
        let target = tensors.target().1.clone().unbind();
        let ids_object = input_ids.clone().unbind();
        let block = tensors.block;
        // Plain numbers: the closure must be Send, and a raw pointer is not.
        let (base, row_bytes, vocab) = (
            block.data as usize,
            block.row_stride * block.dtype.size(),
            block.vocab,
        );
        let mut failure: Option<(usize, Failure)> = None;
        let mut external = |row: usize, key: u64| -> logits_processing::Result<()> {
            Python::attach(|py| {
                let processor = externals
                    .get(&key)
                    .expect("every external step has its callable")
                    .bind(py);
                let called = target.bind(py).get_item(row).and_then(|row_logits| {
                    let ids = ids_object.bind(py).get_item(row)?;
                    processor.call1((ids, &row_logits))?;
                    Ok(row_logits)
                });
                // Before anything more is written to the block: is it still where it was?
                let moved = watched.iter().find_map(|w| w.check(py)).or_else(|| {
                    let start = base.wrapping_add(row.wrapping_mul(row_bytes));
                    called
                        .as_ref()
                        .ok()
                        .and_then(|row_logits| row_moved(row_logits, start, vocab))
                });
                let cause = called.err();
                match moved {
                    Some(moved) => {
                        let error = if moved.memory_alive {
                            Error::External(moved.what.clone())
                        } else {
                            Error::LogitsMoved(moved.what.clone())
                        };
                        failure = Some((row, Failure::Moved { moved, cause }));
                        Err(error)
                    }
                    None => match cause {
                        Some(cause) => {
                            failure = Some((row, Failure::Raised(cause)));
                            Err(Error::External("a user's processor raised".into()))
                        }
                        None => Ok(()),
                    },
                }
            })
        };
        let result = match tensors.source {
            // `source_block` took host blocks only.
            Some(source) => apply_batch_host_into(py, batch, source, block, &mut external),
            None => apply_batch(py, batch, block, &mut external, pending),
        };
        match failure {
            Some((row, failure)) => Err(failure.into_py_err(py, row)),
            None => result.and_then(|()| tensors.edited()),
        }
    }
}

/// How a user's step failed.
enum Failure {
    /// It raised.
    Raised(PyErr),
    /// It moved the logits (and may have raised too).
    Moved { moved: Moved, cause: Option<PyErr> },
}

impl Failure {
    /// The exception for the caller, the step having been taken back. An exception that is not
    /// an `Exception` (`KeyboardInterrupt`, `SystemExit`) is raised unchanged.
    fn into_py_err(self, py: Python<'_>, row: usize) -> PyErr {
        let (message, cause) = match self {
            Failure::Raised(cause) => {
                if !cause.is_instance_of::<PyException>(py) {
                    return cause;
                }
                let message = format!(
                    "row {row}: the processor raised {}",
                    describe_exception(cause.value(py))
                );
                (message, Some(cause))
            }
            Failure::Moved { moved, cause } => {
                if let Some(cause) = cause
                    .as_ref()
                    .filter(|c| !c.is_instance_of::<PyException>(py))
                {
                    return cause.clone_ref(py);
                }
                let outcome = if moved.memory_alive {
                    "the step was taken back and the memory the logits had was restored"
                } else {
                    "the step was taken back, but the logits were not restored: the memory they \
                     had may have been freed, so nothing was written to it"
                };
                (
                    format!(
                        "row {row}: the processor moved the logits: {}; {outcome}",
                        moved.what
                    ),
                    cause,
                )
            }
        };
        let error = new_err_with(
            ErrorClass::Processor,
            message,
            &[("row", Attr::Int(row as u64))],
        );
        error.set_cause(py, cause);
        error
    }
}
