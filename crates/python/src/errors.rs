//! The exception hierarchy, and the one mapping from the core's `Error` to it.
//!
//! The classes are made at import time with `type(name, bases, namespace)` rather than
//! `create_exception!`, because several have two bases (`SpecError` is both a
//! `LogitsProcessingError` and a `ValueError`), which the macro cannot express.

use logits_processing::Error;
use pyo3::exceptions::{PyException, PyIndexError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// Which exception class an error becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    Base,
    Argument,
    ArgumentType,
    Spec,
    TokenOutOfVocab,
    Shape,
    ReadOnly,
    DType,
    Device,
    Tokenizer,
    Processor,
    Busy,
}

/// Name, base classes (earlier entries of this table or builtins) and docstring of each class.
const CLASSES: &[(ErrorClass, &str, &[Parent], &str)] = &[
    (ErrorClass::Base, "LogitsProcessingError", &[Parent::Builtin(Builtin::Exception)],
     "Base class of every error this package raises. `field` names the argument, id or spec part \
      at fault (`temperature`, `input_ids[0][3]`, `[1].token_ids[2]`; None when there is none \
      to name); `row` is the batch row an error of one row happened in (else None)."),
    (ErrorClass::Argument, "InvalidArgumentError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Value)],
     "A constructor or function argument out of range (a temperature <= 0, a missing EOS id, ...)."),
    (ErrorClass::ArgumentType, "ArgumentTypeError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Type)],
     "A constructor, method or function argument of the wrong type (a str where a number goes, ...). \
      `field` names the argument."),
    (ErrorClass::Spec, "SpecError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Value)],
     "A request spec (JSON or dict) that cannot be accepted. `field` names the offending part."),
    (ErrorClass::TokenOutOfVocab, "TokenOutOfVocabError", &[Parent::Ours(ErrorClass::Spec), Parent::Builtin(Builtin::Index)],
     "A token id outside the vocab. Attributes: `field`, `token_id`, `vocab_size`."),
    (ErrorClass::Shape, "ShapeError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Value)],
     "Logits or token ids whose rank, size or strides do not fit the call."),
    (ErrorClass::ReadOnly, "ReadOnlyError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Value)],
     "Logits that cannot be written in place (a read-only numpy array)."),
    (ErrorClass::DType, "DTypeError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Type)],
     "Logits (or token ids) of an unsupported element type."),
    (ErrorClass::Device, "DeviceError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Value)],
     "Logits on a device this build cannot edit in place; the message names the device."),
    (ErrorClass::Tokenizer, "TokenizerError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Value)],
     "A tokenizer that could not be loaded or used."),
    (ErrorClass::Processor, "ProcessorError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Runtime)],
     "A user's processor failed inside a batch, or moved the logits' memory; `__cause__` is its \
      exception, `row` its row."),
    (ErrorClass::Busy, "BusyError", &[Parent::Ours(ErrorClass::Base), Parent::Builtin(Builtin::Runtime)],
     "A processor or batch called again from inside its own call (a user's processor calling the \
      batch that runs it). Calls from several threads wait for each other instead."),
];

#[derive(Clone, Copy)]
enum Builtin {
    Exception,
    Value,
    Type,
    Index,
    Runtime,
}

#[derive(Clone, Copy)]
enum Parent {
    Builtin(Builtin),
    Ours(ErrorClass),
}

static TYPES: PyOnceLock<Vec<(ErrorClass, Py<PyType>)>> = PyOnceLock::new();

fn types(py: Python<'_>) -> &Vec<(ErrorClass, Py<PyType>)> {
    TYPES.get_or_init(py, || {
        let mut made: Vec<(ErrorClass, Py<PyType>)> = vec![];
        for &(kind, name, parents, doc) in CLASSES {
            let bases: Vec<Bound<'_, PyType>> = parents
                .iter()
                .map(|parent| match parent {
                    Parent::Builtin(Builtin::Exception) => py.get_type::<PyException>(),
                    Parent::Builtin(Builtin::Value) => py.get_type::<PyValueError>(),
                    Parent::Builtin(Builtin::Type) => py.get_type::<PyTypeError>(),
                    Parent::Builtin(Builtin::Index) => py.get_type::<PyIndexError>(),
                    Parent::Builtin(Builtin::Runtime) => py.get_type::<PyRuntimeError>(),
                    Parent::Ours(k) => made
                        .iter()
                        .find(|(m, _)| m == k)
                        .unwrap()
                        .1
                        .bind(py)
                        .clone(),
                })
                .collect();
            let namespace = PyDict::new(py);
            namespace
                .set_item("__module__", "logits_processing")
                .unwrap();
            namespace.set_item("__doc__", doc).unwrap();
            if kind == ErrorClass::Base {
                // Set on the errors of one batch row, and on those with a field to name; None
                // on the others.
                namespace.set_item("row", py.None()).unwrap();
                namespace.set_item("field", py.None()).unwrap();
            }
            let class = py
                .get_type::<PyType>()
                .call1((name, PyTuple::new(py, bases).unwrap(), namespace))
                .and_then(|c| Ok(c.cast_into::<PyType>()?))
                .expect("creating an exception class cannot fail");
            made.push((kind, class.unbind()));
        }
        made
    })
}

/// The class of `kind`.
pub(crate) fn class(py: Python<'_>, kind: ErrorClass) -> Bound<'_, PyType> {
    types(py)
        .iter()
        .find(|(k, _)| *k == kind)
        .unwrap()
        .1
        .bind(py)
        .clone()
}

/// Adds every class to the module, under its name.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    for &(kind, name, _, _) in CLASSES {
        module.add(name, class(py, kind))?;
    }
    Ok(())
}

/// A new exception of `kind`, with extra attributes set on it.
pub(crate) fn new_err_with(
    kind: ErrorClass,
    message: impl Into<String>,
    attrs: &[(&str, Attr)],
) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let build = || -> PyResult<PyErr> {
            let value = class(py, kind).call1((message.clone(),))?;
            for (name, attr) in attrs {
                match attr {
                    Attr::Str(s) => value.setattr(*name, s)?,
                    Attr::Int(n) => value.setattr(*name, n)?,
                }
            }
            Ok(PyErr::from_value(value))
        };
        build().unwrap_or_else(|e| e)
    })
}

pub(crate) enum Attr {
    Str(String),
    Int(u64),
}

/// A new exception of `kind`.
pub(crate) fn new_err(kind: ErrorClass, message: impl Into<String>) -> PyErr {
    new_err_with(kind, message, &[])
}

/// The Python exception for a core error: every variant has its class. An error of one batch
/// row ([`Error::InRow`]) is its inner error's class, with the row in the message and as the
/// attribute `row`.
pub(crate) fn to_py(error: Error) -> PyErr {
    let (kind, message, attrs) = describe(&error);
    new_err_with(kind, message, &attrs)
}

/// The class, message and attributes of a core error's exception.
fn describe(error: &Error) -> (ErrorClass, String, Vec<(&'static str, Attr)>) {
    let message = error.to_string();
    let field = |f: &str| ("field", Attr::Str(f.to_string()));
    match error {
        Error::InvalidTemperature { value } => {
            // The reference's message where it refuses the value too (<= 0).
            let message = if *value <= 0.0 {
                "Temperature must be positive".to_string()
            } else {
                format!(
                    "Temperature must be finite and at least 1e-30 (a smaller one turns logits \
                     into infinity), got {value}"
                )
            };
            (ErrorClass::Argument, message, vec![field("temperature")])
        }
        Error::MissingEosToken { .. } => {
            (ErrorClass::Argument, message, vec![field("eos_token_id")])
        }
        Error::InvalidArgument { field: f, .. } => (ErrorClass::Argument, message, vec![field(f)]),
        Error::TokenOutOfVocab {
            field: f,
            token_id,
            vocab_size,
        } => (
            ErrorClass::TokenOutOfVocab,
            message,
            vec![
                field(f),
                ("token_id", Attr::Int(*token_id)),
                ("vocab_size", Attr::Int(*vocab_size as u64)),
            ],
        ),
        Error::InvalidSpec { field: f, .. } | Error::TooLarge { field: f, .. } => {
            (ErrorClass::Spec, message, vec![field(f)])
        }
        Error::Shape(_) => (ErrorClass::Shape, message, vec![]),
        Error::Row { row, .. } => (
            ErrorClass::Shape,
            message,
            vec![("row", Attr::Int(*row as u64))],
        ),
        Error::Tokenizer(_) => (ErrorClass::Tokenizer, message, vec![]),
        Error::External(_) => (ErrorClass::Processor, message, vec![]),
        Error::InRow { row, error } => {
            let (kind, inner, mut attrs) = describe(error);
            attrs.retain(|(name, _)| *name != "row");
            attrs.push(("row", Attr::Int(*row as u64)));
            (kind, format!("row {row}: {inner}"), attrs)
        }
        // The enum is non-exhaustive; a variant added later still reaches Python as our base class.
        _ => (ErrorClass::Base, message, vec![]),
    }
}

/// `error`, raised while reading batch row `row`'s input, as an error of that row: ours get the
/// row in their message and as `row`; another `Exception` becomes ours (a `DTypeError` for a
/// `TypeError`, else an `InvalidArgumentError` naming `field`) with it as the cause. Anything
/// that is not an `Exception` (`KeyboardInterrupt`, `SystemExit`) is returned unchanged.
pub(crate) fn in_row(py: Python<'_>, error: PyErr, row: usize, field: &str) -> PyErr {
    if !error.is_instance_of::<PyException>(py) {
        return error;
    }
    let value = error.value(py);
    if value
        .is_instance(&class(py, ErrorClass::Base))
        .unwrap_or(false)
    {
        let message = format!("row {row}: {}", text_of(value));
        // A field within the row's ids (`input_ids[3]`) is named within the call's
        // (`input_ids[0][3]`).
        let inner = value
            .getattr("field")
            .and_then(|f| f.extract::<Option<String>>())
            .ok()
            .flatten();
        let nested = inner
            .as_deref()
            .and_then(|f| f.strip_prefix("input_ids"))
            .filter(|_| field.starts_with("input_ids"))
            .map(|rest| format!("{field}{rest}"));
        let tagged = value
            .setattr("args", (message,))
            .and_then(|_| value.setattr("row", row))
            .and_then(|_| match nested {
                Some(nested) => value.setattr("field", nested),
                None => Ok(()),
            });
        return match tagged {
            Ok(()) => error,
            Err(other) => other,
        };
    }
    wrap_foreign(
        py,
        error,
        format!("row {row}: {field}"),
        &[
            ("field", Attr::Str(field.to_string())),
            ("row", Attr::Int(row as u64)),
        ],
    )
}

/// `error`, raised by user code while reading argument `field`, as ours: unchanged when it is
/// ours already or not an `Exception` (`KeyboardInterrupt`); else a `DTypeError` for a
/// `TypeError`, an `InvalidArgumentError` otherwise, with it as the cause.
pub(crate) fn as_ours(py: Python<'_>, error: PyErr, field: &str) -> PyErr {
    let value = error.value(py);
    if !error.is_instance_of::<PyException>(py)
        || value
            .is_instance(&class(py, ErrorClass::Base))
            .unwrap_or(false)
    {
        return error;
    }
    wrap_foreign(
        py,
        error,
        field.to_string(),
        &[("field", Attr::Str(field.to_string()))],
    )
}

/// A user's `Exception` (not ours) raised while reading `what`, as ours with it as the cause: a
/// `DTypeError` for a `TypeError`, an `InvalidArgumentError` otherwise.
fn wrap_foreign(py: Python<'_>, error: PyErr, what: String, attrs: &[(&str, Attr)]) -> PyErr {
    let kind = if error.is_instance_of::<PyTypeError>(py) {
        ErrorClass::DType
    } else {
        ErrorClass::Argument
    };
    let message = format!(
        "{what} could not be read: {}",
        describe_exception(error.value(py))
    );
    let ours = new_err_with(kind, message, attrs);
    ours.set_cause(py, Some(error));
    ours
}

/// `str(value)`, or a placeholder when that raises.
fn text_of(value: &Bound<'_, pyo3::exceptions::PyBaseException>) -> String {
    value
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "(str() of the error raised)".into())
}

/// `repr(value)` for a message, never failing: an exception whose `repr()` raises is named by its
/// type, so that the user's error (kept as the cause) is what the caller sees.
pub(crate) fn describe_exception(value: &Bound<'_, pyo3::exceptions::PyBaseException>) -> String {
    match value.repr() {
        Ok(repr) => repr.to_string(),
        Err(_) => {
            let name = value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "an exception".into());
            format!("{name} (whose repr() raised)")
        }
    }
}

/// A core error met while admitting a request spec: argument errors become `SpecError`s that
/// name the field, with `at` (`"[2]"` for the third entry of a pipeline) in front of it.
pub(crate) fn spec_error(error: Error, at: &str) -> Error {
    error.in_spec(at)
}

/// `.py()` on a core result: its error as the right Python exception.
pub(crate) trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
