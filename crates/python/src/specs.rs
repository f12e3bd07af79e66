//! Specs and pipelines given from Python: the JSON text of a dict, the entries of a pipeline
//! (specs, processor objects, callables), their realization with a context; and the spec
//! functions, `validate_specs`, `resolve_specs` and `position_by_tokens`.

use logits_processing::spec::MAX_PIPELINE_LEN;
use logits_processing::{parse_pipeline, EngineContext, Error};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::args;
use crate::context::context_arg;
use crate::errors::{spec_error, to_py, IntoPyResult};
use crate::reference::builtin_processor;

/// The JSON text of a spec given as a string or as a dict (or list) of JSON values.
/// `at`: where the entry stands in the pipeline given (`"[1]"`), for errors.
fn json_of(object: &Bound<'_, PyAny>, at: &str) -> PyResult<String> {
    if is_bytes(object) {
        let bytes: Vec<u8> = object.extract()?;
        return String::from_utf8(bytes).map_err(|e| {
            to_py(Error::InvalidSpec {
                field: "spec".into(),
                message: format!("not UTF-8 text: {e}"),
            })
        });
    }
    if object.is_instance_of::<PyString>() {
        return args::text(object, "spec").map_err(|e| {
            to_py(Error::InvalidSpec {
                field: "spec".into(),
                message: e.value(object.py()).to_string(),
            })
        });
    }
    let py = object.py();
    let dumps = py.import("json")?.getattr("dumps")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    match dumps.call((object,), Some(&kwargs)) {
        // `json.dumps` escapes every non-ASCII character (lone surrogates too).
        Ok(text) => text.extract(),
        Err(e) => Err(to_py(match non_finite(object, "", 0) {
            Some((field, value)) => spec_error(
                Error::InvalidSpec {
                    field: if field.is_empty() {
                        "spec".into()
                    } else {
                        field
                    },
                    message: format!("must be finite (JSON has no NaN or infinity), got {value}"),
                },
                at,
            ),
            None => Error::InvalidSpec {
                field: "spec".into(),
                message: format!("not JSON data: {e}"),
            },
        })),
    }
}

/// Where in a spec given as Python data the first float that is not finite is (its field, as
/// errors name fields: `p`, `bias.3`, `[1].p`), and how it prints; JSON has no NaN or infinity.
fn non_finite(object: &Bound<'_, PyAny>, at: &str, depth: usize) -> Option<(String, String)> {
    // Deeper than `json.dumps` goes before it fails on its own.
    if depth > 128 {
        return None;
    }
    if let Ok(float) = object.cast::<pyo3::types::PyFloat>() {
        let value = float.value();
        return (!value.is_finite()).then(|| (at.to_string(), value.to_string()));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        return dict.iter().find_map(|(key, value)| {
            let key = key.str().map(|k| k.to_string()).unwrap_or_default();
            let field = if at.is_empty() {
                key
            } else {
                format!("{at}.{key}")
            };
            non_finite(&value, &field, depth + 1)
        });
    }
    if object.is_instance_of::<PyList>() || object.is_instance_of::<PyTuple>() {
        return object
            .try_iter()
            .ok()?
            .enumerate()
            .find_map(|(i, item)| non_finite(&item.ok()?, &format!("{at}[{i}]"), depth + 1));
    }
    None
}

/// What one entry of a pipeline given from Python becomes: specs, a built-in processor object,
/// or a Python callable.
pub(crate) type Entry = logits_processing::PipelineEntry<Py<PyAny>>;

/// JSON text as it arrives off a wire: `bytes` or `bytearray`, UTF-8.
fn is_bytes(object: &Bound<'_, PyAny>) -> bool {
    object.is_instance_of::<PyBytes>() || object.is_instance_of::<PyByteArray>()
}

fn entry_of(item: &Bound<'_, PyAny>, at: &str, allow_external: bool) -> PyResult<Entry> {
    if item.is_instance_of::<PyString>() || item.is_instance_of::<PyDict>() || is_bytes(item) {
        let specs = parse_pipeline(&json_of(item, at)?).map_err(|e| to_py(spec_error(e, at)))?;
        return Ok(Entry::Specs(specs));
    }
    if let Some(processor) = builtin_processor(item)? {
        return Ok(Entry::Processor(processor));
    }
    if allow_external && item.is_callable() {
        return Ok(Entry::External(item.clone().unbind()));
    }
    let what = if allow_external {
        "a spec (a dict or JSON text), a processor or a callable"
    } else {
        "a spec (a dict or JSON text)"
    };
    Err(to_py(Error::InvalidSpec {
        field: if at.is_empty() {
            "spec".into()
        } else {
            at.into()
        },
        message: format!("expected {what}, got {}", item.get_type().name()?),
    }))
}

/// Parses a pipeline given as JSON text, a dict, a processor, a callable, or a list of these,
/// refusing a mask after a truncation step (`check_order`).
/// Refuses a spec that takes the caller's mask each step (`{"kind": "bitmask"}`) where `holder`
/// (a `Processor`, an engine's adapter) is given none: every step would fail. The error names
/// the spec's `kind` field.
pub(crate) fn refuse_caller_mask(entries: &[(String, Entry)], holder: &str) -> PyResult<()> {
    for (at, entry) in entries {
        let Entry::Specs(specs) = entry else { continue };
        if let Some((i, spec)) = specs
            .iter()
            .enumerate()
            .find(|(_, s)| s.takes_caller_mask())
        {
            // Entry `at` of a list, one spec object, or spec `i` of a JSON list.
            let field = match (at.is_empty(), specs.len()) {
                (false, _) => format!("{at}.kind"),
                (true, 1) => "kind".into(),
                _ => format!("[{i}].kind"),
            };
            return Err(to_py(logits_processing::Error::InvalidSpec {
                field,
                message: format!(
                    "a '{}' step takes its mask from the caller each step \
                     (Batch.apply(bitmask=...)), and {holder} gives none; constrain the output \
                     with a 'grammar' spec instead",
                    spec.kind()
                ),
            }));
        }
    }
    Ok(())
}

/// Refuses specs holding a `{"kind": "bitmask"}` step, for a holder that gives no mask (see
/// :class:`Processor`); the adapters call it at admission.
#[pyfunction]
#[pyo3(name = "_refuse_caller_mask")]
pub(crate) fn refuse_caller_mask_py(specs: &Bound<'_, PyAny>, holder: &str) -> PyResult<()> {
    refuse_caller_mask(&entries_of(specs, true)?, holder)
}

pub(crate) fn entries_of(
    pipeline: &Bound<'_, PyAny>,
    allow_external: bool,
) -> PyResult<Vec<(String, Entry)>> {
    let entries = entries_any_order(pipeline, allow_external)?;
    let mut specs = vec![];
    for (at, entry) in &entries {
        if let Entry::Specs(list) = entry {
            specs.extend(
                list.iter()
                    .map(|spec| (format!("{at}{}", spec.position()), spec)),
            );
        }
    }
    logits_processing::check_order(specs.iter().map(|(at, spec)| (at.as_str(), *spec))).py()?;
    Ok(entries)
}

/// Refuses `entries` whose specs depend on where the prompt ends when no `prompt_len` was given
/// ([`logits_processing::check_prompt_len`]), naming `prompt_len` and the spec.
pub(crate) fn check_prompt_len(
    entries: &[(String, Entry)],
    prompt_len: Option<usize>,
) -> PyResult<()> {
    let mut specs = vec![];
    for (at, entry) in entries {
        if let Entry::Specs(list) = entry {
            specs.extend(
                list.iter()
                    .map(|spec| (format!("{at}{}", spec.position()), spec)),
            );
        }
    }
    logits_processing::check_prompt_len(
        specs.iter().map(|(at, spec)| (at.as_str(), *spec)),
        prompt_len,
    )
    .py()
}

/// Parses a pipeline as [`entries_of`] does, in any order (for `canonical_order`).
pub(crate) fn entries_any_order(
    pipeline: &Bound<'_, PyAny>,
    allow_external: bool,
) -> PyResult<Vec<(String, Entry)>> {
    if pipeline.is_instance_of::<PyList>() || pipeline.is_instance_of::<PyTuple>() {
        let len = pipeline.len()?;
        if len > MAX_PIPELINE_LEN {
            return Err(to_py(Error::TooLarge {
                field: "pipeline".into(),
                len,
                limit: MAX_PIPELINE_LEN,
            }));
        }
        return pipeline
            .try_iter()?
            .enumerate()
            .map(|(i, item)| {
                let at = format!("[{i}]");
                let entry = entry_of(&item?, &at, allow_external)?;
                Ok((at, entry))
            })
            .collect();
    }
    // One JSON text may itself hold a list; its errors already name "[i]".
    Ok(vec![(
        String::new(),
        entry_of(pipeline, "", allow_external)?,
    )])
}

/// A Python callable's name in a pipeline's labels.
pub(crate) fn callable_name(callable: &Py<PyAny>) -> String {
    let name = Python::attach(|py| {
        let callable = callable.bind(py);
        callable
            .getattr("__qualname__")
            .or_else(|_| callable.get_type().getattr("__qualname__"))
            .and_then(|n| n.extract::<String>())
            .unwrap_or_else(|_| "?".into())
    });
    format!("{name} (a Python processor)")
}

/// Checks request specs as a `Batch` would admit them, without building a batch.
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///     context (EngineContext | None): Keyword only. What the engine knows (vocab size,
///         tokenizer, thinking tokens): every token id must be below its vocab size, and
///         ``hello_world`` and thinking budgets without ids need what it derived.
///         ``EngineContext.structure_only()`` checks only what does not depend on the engine
///         (for a frontend or client). None: an engine that knows nothing.
///
/// Raises:
///     SpecError: (a ValueError) whose ``field`` names the offending part, e.g. ``"[1].token_ids"``.
///     TokenOutOfVocabError: (a SpecError) for a token id at or above the vocab size.
///
/// Example:
///     >>> from logits_processing import validate_specs, EngineContext, SpecError
///     >>> validate_specs({"kind": "forced_sequence", "token_ids": [1, 2, 3], "eos_token_id": 2})
///     >>> try:
///     ...     validate_specs([{"kind": "temperature", "temperature": 0.7}, {"kind": "ban_tokens"}])
///     ... except SpecError as e:
///     ...     print(e.field)
///     [1].token_ids
///     >>> validate_specs({"kind": "hello_world"}, context=EngineContext.structure_only())
#[pyfunction]
#[pyo3(signature = (specs, *, context = None))]
pub(crate) fn validate_specs(
    specs: &Bound<'_, PyAny>,
    context: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let context = context_arg(context)?;
    validate_with(specs, &context)
}

/// Validates `specs` against `context`, naming the field of the first bad one.
pub(crate) fn validate_with(specs: &Bound<'_, PyAny>, context: &EngineContext) -> PyResult<()> {
    for (at, entry) in entries_of(specs, false)? {
        let Entry::Specs(specs) = entry else {
            unreachable!("entries_of refuses processors and callables here")
        };
        for spec in specs {
            spec.validate(context)
                .map_err(|e| to_py(spec_error(e, &at)))?;
        }
    }
    Ok(())
}

/// The specs with what they take from the engine made explicit, for a worker that has not got
/// the engine's tokenizer: ``hello_world`` becomes the ``forced_sequence`` of its ids, a
/// ``thinking_budget`` without ids gets the model's. Every spec is validated first, as
/// :func:`validate_specs` does. Engine adapters call this; nothing about a kind is re-derived in
/// Python.
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///     context (EngineContext | None): Keyword only. As for :func:`validate_specs`.
///
/// Returns:
///     list[dict]: One explicit spec per spec given, in order.
///
/// Raises:
///     SpecError: for a spec that does not parse, naming the field.
///
/// Example:
///     >>> from logits_processing import EngineContext, resolve_specs
///     >>> resolve_specs({"kind": "hello_world"}, context=EngineContext(hello_world=([9, 8], 2)))
///     [{'kind': 'forced_sequence', 'token_ids': [9, 8], 'eos_token_id': 2, 'position': 'calls'}]
#[pyfunction]
#[pyo3(signature = (specs, *, context = None))]
pub(crate) fn resolve_specs<'py>(
    specs: &Bound<'py, PyAny>,
    context: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let context = context_arg(context)?;
    resolve_with(specs, &context)
}

/// Resolves `specs` against `context`, as a list of dicts.
pub(crate) fn resolve_with<'py>(
    specs: &Bound<'py, PyAny>,
    context: &EngineContext,
) -> PyResult<Bound<'py, PyAny>> {
    let mut resolved = vec![];
    for (at, entry) in entries_of(specs, false)? {
        let Entry::Specs(specs) = entry else {
            unreachable!("entries_of refuses processors and callables here")
        };
        for spec in specs {
            let value = spec
                .resolve(context)
                .map_err(|e| to_py(spec_error(e, &at)))?;
            resolved.push(value);
        }
    }
    let text = serde_json::to_string(&resolved).expect("specs are plain data");
    specs.py().import("json")?.call_method1("loads", (text,))
}

/// The specs with every step that counts its calls made to count generated tokens instead
/// (``"position": "tokens"``), for a pipeline rebuilt part-way through a request (a migrated
/// or resumed request, an engine that drops and rebuilds state): forced sequences then pick
/// up where the request is. Which kinds have such a choice is the core's to say.
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///
/// Returns:
///     list[dict]: One spec per spec given, in order.
///
/// Raises:
///     SpecError: for a spec that does not parse, naming the field.
///
/// Example:
///     >>> from logits_processing import position_by_tokens
///     >>> position_by_tokens([{"kind": "hello_world"}, {"kind": "temperature", "temperature": 0.5}])
///     [{'kind': 'hello_world', 'position': 'tokens'}, {'kind': 'temperature', 'temperature': 0.5}]
#[pyfunction]
pub(crate) fn position_by_tokens<'py>(specs: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let mut positioned = vec![];
    for (_, entry) in entries_of(specs, false)? {
        let Entry::Specs(specs) = entry else {
            unreachable!("entries_of refuses processors and callables here")
        };
        positioned.extend(specs.iter().map(|s| s.positioned_by_tokens().to_value()));
    }
    let text = serde_json::to_string(&positioned).expect("specs are plain data");
    specs.py().import("json")?.call_method1("loads", (text,))
}
