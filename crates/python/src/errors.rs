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
pub(crate) enum Kind {
    Base,
    Argument,
    Spec,
    TokenOutOfVocab,
    Shape,
    ReadOnly,
    DType,
    Device,
    Tokenizer,
    Processor,
}

/// Name, base classes (earlier entries of this table or builtins) and docstring of each class.
const CLASSES: &[(Kind, &str, &[Parent], &str)] = &[
    (Kind::Base, "LogitsProcessingError", &[Parent::Builtin(Builtin::Exception)],
     "Base class of every error this package raises."),
    (Kind::Argument, "InvalidArgumentError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Value)],
     "A constructor or function argument out of range (a temperature <= 0, a missing EOS id, ...)."),
    (Kind::Spec, "SpecError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Value)],
     "A request spec (JSON or dict) that cannot be accepted. `field` names the offending part."),
    (Kind::TokenOutOfVocab, "TokenOutOfVocabError", &[Parent::Ours(Kind::Spec), Parent::Builtin(Builtin::Index)],
     "A token id outside the vocab. Attributes: `field`, `token_id`, `vocab_size`."),
    (Kind::Shape, "ShapeError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Value)],
     "Logits or token ids whose rank, size or strides do not fit the call."),
    (Kind::ReadOnly, "ReadOnlyError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Value)],
     "Logits that cannot be written in place (a read-only numpy array)."),
    (Kind::DType, "DTypeError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Type)],
     "Logits (or token ids) of an unsupported element type."),
    (Kind::Device, "DeviceError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Value)],
     "Logits on a device this build cannot edit in place; the message names the device."),
    (Kind::Tokenizer, "TokenizerError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Value)],
     "A tokenizer that could not be loaded or used."),
    (Kind::Processor, "ProcessorError", &[Parent::Ours(Kind::Base), Parent::Builtin(Builtin::Runtime)],
     "A user's processor failed inside a batch; `__cause__` is its exception."),
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
    Ours(Kind),
}

static TYPES: PyOnceLock<Vec<(Kind, Py<PyType>)>> = PyOnceLock::new();

fn types(py: Python<'_>) -> &Vec<(Kind, Py<PyType>)> {
    TYPES.get_or_init(py, || {
        let mut made: Vec<(Kind, Py<PyType>)> = vec![];
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
pub(crate) fn class(py: Python<'_>, kind: Kind) -> Bound<'_, PyType> {
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
    kind: Kind,
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
pub(crate) fn new_err(kind: Kind, message: impl Into<String>) -> PyErr {
    new_err_with(kind, message, &[])
}

/// The Python exception for a core error: every variant has its class.
pub(crate) fn to_py(error: Error) -> PyErr {
    let message = error.to_string();
    let field = |f: &str| ("field", Attr::Str(f.to_string()));
    match &error {
        Error::InvalidTemperature { value } => {
            let message = if *value > 0.0 {
                format!("Temperature must be finite and positive, got {value}")
            } else {
                format!("Temperature must be positive, got {value}")
            };
            new_err_with(Kind::Argument, message, &[field("temperature")])
        }
        Error::MissingEosToken { .. } => {
            new_err_with(Kind::Argument, message, &[field("eos_token_id")])
        }
        Error::InvalidArgument { field: f, .. } => {
            new_err_with(Kind::Argument, message, &[field(f)])
        }
        Error::TokenOutOfVocab {
            field: f,
            token_id,
            vocab_size,
        } => new_err_with(
            Kind::TokenOutOfVocab,
            message,
            &[
                field(f),
                ("token_id", Attr::Int(*token_id)),
                ("vocab_size", Attr::Int(*vocab_size as u64)),
            ],
        ),
        Error::InvalidSpec { field: f, .. } | Error::TooLarge { field: f, .. } => {
            new_err_with(Kind::Spec, message, &[field(f)])
        }
        Error::Shape(_) | Error::Row { .. } => new_err(Kind::Shape, message),
        Error::Tokenizer(_) => new_err(Kind::Tokenizer, message),
        Error::External(_) => new_err(Kind::Processor, message),
        // The enum is non-exhaustive; a variant added later still reaches Python as our base class.
        _ => new_err(Kind::Base, message),
    }
}

/// A core error met while admitting a request spec: argument errors become `SpecError`s that
/// name the field, with `at` (`"[2]"` for the third entry of a pipeline) in front of it.
pub(crate) fn spec_error(error: Error, at: &str) -> Error {
    let path = |field: &str| match (at.is_empty(), field.is_empty()) {
        (true, _) => field.to_string(),
        (false, true) => at.to_string(),
        (false, false) => format!("{at}.{field}"),
    };
    match error {
        Error::InvalidTemperature { .. } => Error::InvalidSpec {
            field: path("temperature"),
            message: error.to_string(),
        },
        Error::MissingEosToken { .. } => Error::InvalidSpec {
            field: path("eos_token_id"),
            message: error.to_string(),
        },
        Error::InvalidArgument { field, message } | Error::InvalidSpec { field, message } => {
            Error::InvalidSpec {
                field: path(&field),
                message,
            }
        }
        Error::TooLarge { field, len, limit } => Error::TooLarge {
            field: path(&field),
            len,
            limit,
        },
        Error::TokenOutOfVocab {
            field,
            token_id,
            vocab_size,
        } => Error::TokenOutOfVocab {
            field: path(&field),
            token_id,
            vocab_size,
        },
        other => other,
    }
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
