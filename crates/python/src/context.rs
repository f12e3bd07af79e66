//! `EngineContext`: what an engine knows at start-up that specs may rely on, built once per
//! engine and given to `Batch`, `Processor`, `validate_specs` and `resolve_specs` as `context=`;
//! and the conversions from Python that it needs.

use std::sync::Arc;

use logits_processing::{EngineContext, TextEncoder, Vocab};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};

use crate::args;
use crate::errors::{new_err, ErrorClass, IntoPyResult};
use crate::thinking::thinking_config_of;
use crate::tokenizer::{
    check_vocab_size, declared_eos, eos_token_ids_arg, shared_vocab, PyTextEncoder, PyVocab,
    Tokenizer,
};

/// `(token_ids, eos_token_id)`: the encoding of "Hello world!" and the EOS id.
fn hello_world_of(h: &Bound<'_, PyAny>) -> PyResult<(Vec<u32>, u32)> {
    let (ids, eos): (Bound<'_, PyAny>, Bound<'_, PyAny>) = h.extract().map_err(|_| {
        args::wrong_type(
            "hello_world",
            "(token_ids, eos_token_id): the encoding of \"Hello world!\" and the EOS id",
            h,
        )
    })?;
    Ok((
        args::token_ids(&ids, "hello_world[0]")?,
        args::token_id(&eos, "hello_world[1]")?,
    ))
}

/// The context of a call: `context=` (an `EngineContext`), or one that knows nothing.
pub(crate) fn context_arg(context: Option<&Bound<'_, PyAny>>) -> PyResult<EngineContext> {
    match args::given(context) {
        Some(context) => Ok(context_of(context)?.get().context.clone()),
        None => Ok(EngineContext::default()),
    }
}

/// `context=`, which must be an `EngineContext`.
pub(crate) fn context_of<'a, 'py>(
    context: &'a Bound<'py, PyAny>,
) -> PyResult<&'a Bound<'py, PyEngineContext>> {
    context
        .cast::<PyEngineContext>()
        .map_err(|_| args::wrong_type("context", "an EngineContext", context))
}

/// What an engine knows at start-up that request specs may rely on, built once per engine and
/// given to :class:`Batch`, :class:`Processor`, :func:`validate_specs` and
/// :func:`resolve_specs` as ``context=``.
///
/// From the tokenizer it derives, by the core's one rule each: the ids of ``"Hello world!"``
/// and the EOS id (for ``hello_world`` specs), the thinking tokens (the tokenizer's single
/// ``<think>`` / ``</think>`` / newline tokens, else the model name in the thinking-token table;
/// for ``thinking_budget`` specs without ids), its :class:`Vocab` (the token texts for the
/// kinds that read them, grammars and ``ban_strings`` among them: read once per tokenizer
/// object, its texts at the first such spec) and the token ids of text (:meth:`encode`).
/// Nothing about a kind is re-derived in Python.
///
/// Args:
///     tokenizer: Optional. The engine's tokenizer: a transformers tokenizer, a
///         ``tokenizers.Tokenizer``, a ``tokenizer.json`` path, a :class:`Vocab`, or
///         anything with ``encode(text, add_special_tokens=False)`` (then without the kinds
///         that read token texts).
///     model_name (str | None): Keyword only. The model's name or path, for the thinking-token
///         table.
///     vocab_size (int | None): Keyword only. Logits per row (the model's vocab, padding
///         included); token ids in specs must be below it.
///     eos_token_id (int | Sequence[int] | None): Keyword only. The EOS id, or ids (a chat
///         model may end on either of two); the first ends a ``hello_world`` reply, all end a
///         grammar. Default: the transformers tokenizer's ``eos_token_id``, or for a path the
///         ``eos_token`` of the ``tokenizer_config.json`` beside it.
///     vocab (Vocab | bool | None): Keyword only. A :class:`Vocab` to share (its compiled
///         grammars and automata with it); ``False`` for none; default: read from the tokenizer
///         where its token texts can be read, once per tokenizer object (and EOS ids): every
///         context made from one tokenizer shares its ``Vocab``.
///     hello_world (tuple[list[int], int] | None), thinking_tokens (ThinkingTokenConfig |
///         None): Keyword only. Explicit values, where the tokenizer's are not wanted.
///     speculative_tokens (int): Keyword only. Under speculative decoding, the most drafts the
///         engine verifies for a request in one step (vLLM's ``num_speculative_tokens``), where
///         it hands one row per draft, each after the drafts before it: every pipeline then keeps
///         what it needs to resume from any of them when the engine rejects the rest (for the
///         kinds whose next step reads what the previous step's pass saw: mirostat,
///         ``adaptive_p``, the phrase kinds' triggers; the others read the ids again). Default 0.
///
/// Raises:
///     TokenizerError: a tokenizer path that cannot be read, an ``encode`` that fails, or a
///         tokenizer with more tokens than ``vocab_size``.
///     ArgumentTypeError, InvalidArgumentError: an argument of the wrong type or value.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing import Batch, EngineContext, validate_specs, SpecError
///     >>> class Letters:  # a toy tokenizer: one id per character
///     ...     eos_token_id = 0
///     ...     def encode(self, text, add_special_tokens=False):
///     ...         return [ord(c) for c in text]
///     >>> context = EngineContext(Letters(), model_name="my-model", vocab_size=128)
///     >>> context.hello_world[0][:5] == [ord(c) for c in "Hello"], context.hello_world[1]
///     (True, 0)
///     >>> batch = Batch(context=context)
///     >>> batch.add(0, {"kind": "hello_world"})
///     >>> logits = torch.zeros(1, 128)
///     >>> batch.apply(logits, [[]])
///     >>> chr(int(logits[0].argmax()))
///     'H'
///     >>> validate_specs({"kind": "hello_world"}, context=EngineContext.structure_only())
///     >>> try:
///     ...     validate_specs({"kind": "ban_tokens", "token_ids": [500]}, context=context)
///     ... except SpecError as e:
///     ...     print(e.field)
///     token_ids[0]
#[pyclass(frozen, subclass, module = "logits_processing", name = "EngineContext")]
pub(crate) struct PyEngineContext {
    pub(crate) context: EngineContext,
    model_name: Option<String>,
    eos_token_ids: Vec<u32>,
}

impl PyEngineContext {
    fn build(
        py: Python<'_>,
        tokenizer: Option<&Bound<'_, PyAny>>,
        model_name: Option<String>,
        vocab_size: Option<usize>,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        vocab: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let explicit_eos = eos_token_ids_arg(eos_token_id)?;
        let tokenizer = args::given(tokenizer).map(Tokenizer::of).transpose()?;
        // A path is read here, for its text encoding and its token texts.
        let read = match &tokenizer {
            Some(Tokenizer::Path(path)) => {
                let path = path.clone();
                let eos = explicit_eos.clone();
                Some(py.detach(|| Vocab::from_file(path, &eos)).py()?)
            }
            _ => None,
        };
        let vocab = match args::given(vocab) {
            None => match &tokenizer {
                Some(Tokenizer::Vocab(env)) => Some(env.clone()),
                Some(Tokenizer::Path(_)) => read.clone(),
                // An object whose token texts cannot be read (a slow tokenizer, a test double)
                // still encodes text; the kinds that read texts are then refused, saying why.
                Some(Tokenizer::Object(t)) => shared_vocab(t, &explicit_eos).or_else(|e| {
                    if e.is_instance(py, &crate::errors::class(py, ErrorClass::Tokenizer)) {
                        Ok(None)
                    } else {
                        Err(e)
                    }
                })?,
                None => None,
            },
            Some(g) if g.is_instance_of::<PyBool>() => {
                if g.is_truthy()? {
                    return Err(args::bad_value(
                        "vocab",
                        "takes a Vocab, False (none) or None (from the tokenizer), got True",
                    ));
                }
                None
            }
            Some(g) => Some(
                g.cast::<PyVocab>()
                    .map_err(|_| args::wrong_type("vocab", "a Vocab, False or None", g))?
                    .get()
                    .vocab
                    .clone(),
            ),
        };
        if let (Some(vocab), Some(size)) = (&vocab, vocab_size) {
            check_vocab_size(vocab, size)?;
        }
        let mut eos_token_ids = explicit_eos;
        if eos_token_ids.is_empty() {
            match &tokenizer {
                Some(Tokenizer::Path(path)) => {
                    eos_token_ids.extend(read.as_ref().and_then(|env| {
                        logits_processing::tokenizer::eos_token_id_from_config(
                            env.tokenizer(),
                            path,
                        )
                    }))
                }
                Some(Tokenizer::Object(t)) => eos_token_ids.extend(declared_eos(t)),
                _ => {}
            }
        }
        // The tokenizer as the context encodes text with it: the Python object where there is
        // one (what the engine itself calls), else the one read in Rust (without the GIL).
        let python = match &tokenizer {
            Some(Tokenizer::Object(t)) => Some(Arc::new(PyTextEncoder::new((*t).clone().unbind()))),
            _ => None,
        };
        let (encoder, in_python): (Option<Arc<dyn TextEncoder + Send + Sync>>, bool) =
            match &tokenizer {
                Some(Tokenizer::Object(_)) => (python.clone().map(|e| e as _), true),
                Some(Tokenizer::Vocab(env)) => (Some(Arc::new(env.clone())), false),
                Some(Tokenizer::Path(_)) => match &read {
                    Some(env) => (Some(Arc::new(env.clone())), false),
                    None => (None, false),
                },
                _ => (None, false),
            };
        let build = || {
            EngineContext::for_engine(encoder, model_name.as_deref(), vocab_size, &eos_token_ids)
        };
        let built = if in_python { build() } else { py.detach(build) };
        let mut context = built.map_err(|error| match &python {
            Some(encoder) => encoder.error(py, error),
            None => crate::errors::to_py(error),
        })?;
        context.vocab = vocab;
        Ok(Self {
            context,
            model_name,
            eos_token_ids,
        })
    }
}

#[pymethods]
impl PyEngineContext {
    #[new]
    #[pyo3(signature = (tokenizer = None, *, model_name = None, vocab_size = None, eos_token_id = None, vocab = None, hello_world = None, thinking_tokens = None, speculative_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tokenizer: Option<&Bound<'_, PyAny>>,
        model_name: Option<&Bound<'_, PyAny>>,
        vocab_size: Option<&Bound<'_, PyAny>>,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        vocab: Option<&Bound<'_, PyAny>>,
        hello_world: Option<&Bound<'_, PyAny>>,
        thinking_tokens: Option<&Bound<'_, PyAny>>,
        speculative_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let model_name = args::given(model_name)
            .map(|m| args::text(m, "model_name"))
            .transpose()?;
        let vocab_size = args::given(vocab_size)
            .map(|v| args::index(v, "vocab_size"))
            .transpose()?;
        let mut this = Self::build(py, tokenizer, model_name, vocab_size, eos_token_id, vocab)?;
        if let Some(h) = args::given(hello_world) {
            this.context.hello_world = Some(hello_world_of(h)?);
        }
        if let Some(t) = args::given(thinking_tokens) {
            this.context.thinking_tokens = Some(thinking_config_of(t)?);
        }
        if let Some(k) = args::given(speculative_tokens) {
            this.context.speculative_tokens = args::index(k, "speculative_tokens")?;
        }
        Ok(this)
    }

    /// The context of a caller that does not know the engine yet (a frontend, a client):
    /// :func:`validate_specs` then checks everything that does not depend on the engine (kinds,
    /// fields, types, values, size limits, a grammar's syntax) and accepts what the engine will
    /// supply (``hello_world``, a thinking budget without ids). It cannot build a batch.
    #[staticmethod]
    fn structure_only() -> Self {
        Self {
            context: EngineContext::structure_only(),
            model_name: None,
            eos_token_ids: vec![],
        }
    }

    /// Whether this is :meth:`structure_only`'s context.
    #[getter]
    fn is_structure_only(&self) -> bool {
        self.context.structure_only
    }

    /// Logits per row, or None where not given.
    #[getter]
    fn vocab_size(&self) -> Option<usize> {
        self.context.vocab_size
    }

    /// The most drafts a step verifies for a request (0: no speculative decoding).
    #[getter]
    fn speculative_tokens(&self) -> usize {
        self.context.speculative_tokens
    }

    /// The model's name, or None.
    #[getter]
    fn model_name(&self) -> Option<String> {
        self.model_name.clone()
    }

    /// The EOS ids (given, or the tokenizer's); may be empty.
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_ids.clone()
    }

    /// ``(ids of "Hello world!", EOS id)``, or None without a tokenizer and an EOS id.
    #[getter]
    fn hello_world(&self) -> Option<(Vec<u32>, u32)> {
        self.context.hello_world.clone()
    }

    /// The model's thinking tokens (a :class:`ThinkingTokenConfig`), or None where neither the
    /// tokenizer nor the table knows them.
    #[getter]
    fn thinking_tokens<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.context
            .thinking_tokens
            .map(|c| {
                py.import("logits_processing.thinking")?
                    .getattr("ThinkingTokenConfig")?
                    .call1((c.start_token_id, c.end_token_id, c.newline_token_id))
            })
            .transpose()
    }

    /// The tokenizer's :class:`Vocab` (token texts, compiled grammars), or None.
    #[getter]
    fn vocab(&self) -> Option<PyVocab> {
        self.context.vocab.clone().map(|vocab| PyVocab { vocab })
    }

    /// The token ids of `text` (no special tokens), by the engine's tokenizer.
    ///
    /// Raises:
    ///     SpecError: the context has no tokenizer.
    ///     TokenizerError: the tokenizer failed.
    fn encode(&self, py: Python<'_>, text: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let text = args::text(text, "text")?;
        let _ = py;
        self.context.encode("text", &text).py()
    }

    /// A new :class:`Batch` with this context. `vocab_size` defaults to the context's.
    #[pyo3(signature = (vocab_size = None))]
    fn batch(
        slf: &Bound<'_, Self>,
        vocab_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<crate::batch::PyBatch>> {
        let py = slf.py();
        let kwargs = PyDict::new(py);
        kwargs.set_item("context", slf)?;
        let args = PyTuple::new(py, args::given(vocab_size))?;
        let batch = py
            .get_type::<crate::batch::PyBatch>()
            .call(args, Some(&kwargs))?;
        Ok(batch.cast_into::<crate::batch::PyBatch>()?.unbind())
    }

    /// :func:`validate_specs` with this context.
    fn validate(slf: &Bound<'_, Self>, specs: &Bound<'_, PyAny>) -> PyResult<()> {
        crate::specs::validate_with(specs, &slf.get().context)
    }

    /// :func:`resolve_specs` with this context.
    fn resolve_specs<'py>(
        slf: &Bound<'py, Self>,
        specs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::specs::resolve_with(specs, &slf.get().context)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.get();
        let name = slf.get_type().name()?;
        if this.context.structure_only {
            return Ok(format!("{name}.structure_only()"));
        }
        Ok(format!(
            "{name}(model_name={:?}, vocab_size={:?}, eos_token_ids={:?}, hello_world={}, \
             thinking_tokens={:?}, vocab={}, speculative_tokens={})",
            this.model_name,
            this.context.vocab_size,
            this.eos_token_ids,
            this.context.hello_world.is_some(),
            this.context.thinking_tokens.map(|c| (
                c.start_token_id,
                c.end_token_id,
                c.newline_token_id
            )),
            this.context.vocab.is_some(),
            this.context.speculative_tokens,
        ))
    }
}

/// `(ids of "Hello world!", eos id)` from a tokenizer: a transformers tokenizer (or anything
/// with ``encode``), a ``tokenizers.Tokenizer`` or a ``tokenizer.json`` path; the EOS id is
/// `eos_token_id`, else the tokenizer's (for a path, the ``tokenizer_config.json`` beside it).
#[pyfunction]
#[pyo3(signature = (tokenizer, eos_token_id = None))]
pub(crate) fn hello_world_ids(
    tokenizer: &Bound<'_, PyAny>,
    eos_token_id: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Vec<u32>, u32)> {
    let eos = args::given(eos_token_id)
        .map(|id| args::token_id(id, "eos_token_id"))
        .transpose()?;
    let py = tokenizer.py();
    let is_path = matches!(Tokenizer::of(tokenizer), Ok(Tokenizer::Path(_)));
    if tokenizer.is_instance_of::<PyVocab>()
        || !is_path && !tokenizer.getattr("encode").is_ok_and(|e| e.is_callable())
    {
        return Err(args::wrong_type(
            "tokenizer",
            "a tokenizer (with encode(text, add_special_tokens=False)) or the path of a tokenizer.json",
            tokenizer,
        ));
    }
    let eos_arg = eos.map(|id| PyTuple::new(py, [id])).transpose()?;
    // A path is read in Rust; an object encodes in Python. Neither is read for its token texts.
    let no_vocab = PyBool::new(py, false).to_owned().into_any();
    let context = PyEngineContext::build(
        py,
        Some(tokenizer),
        None,
        None,
        eos_arg.as_ref().map(|t| t.as_any()),
        Some(&no_vocab),
    )?;
    context.context.hello_world.ok_or_else(|| {
        new_err(
            ErrorClass::Argument,
            "Tokenizer has no eos_token_id; HelloWorldLogitsProcessor requires one.",
        )
    })
}
