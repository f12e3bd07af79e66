//! Arguments from Python, read with errors of ours that name them.
//!
//! Every public constructor, method and function takes its arguments as Python objects and reads
//! them here, so that any value of any type either works or raises an `ArgumentTypeError` (a
//! `TypeError`) or an `InvalidArgumentError` (a `ValueError`) whose `field` is the argument, never
//! PyO3's plain `TypeError` / `OverflowError`. Nothing is allocated in proportion to a number
//! given: an integer is range-checked before it is used.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt, PyString};

use crate::errors::{new_err_with, Attr, ErrorClass};

/// A short, never-failing rendering of `value` for a message (a huge int is not printed whole).
pub(crate) fn shown(value: &Bound<'_, PyAny>) -> String {
    const MAX: usize = 60;
    let text = match value.cast::<PyInt>() {
        // A 10**6-digit int would take its whole length to print: its bits say enough.
        Ok(int)
            if int
                .call_method0("bit_length")
                .and_then(|b| b.extract::<u64>())
                .unwrap_or(0)
                > 128 =>
        {
            let negative = int.lt(0).unwrap_or(false);
            return format!(
                "{}an integer of more than 128 bits",
                if negative { "-" } else { "" }
            );
        }
        _ => value.repr().map(|r| r.to_string()),
    };
    match text {
        Ok(text) if text.chars().count() > MAX => {
            format!("{}...", text.chars().take(MAX).collect::<String>())
        }
        Ok(text) => text,
        Err(_) => format!(
            "a {} whose repr() raised",
            value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ),
    }
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// An `ArgumentTypeError` for `name`.
pub(crate) fn wrong_type(name: &str, expected: &str, value: &Bound<'_, PyAny>) -> PyErr {
    new_err_with(
        ErrorClass::ArgumentType,
        format!("{name} must be {expected}, got {}", type_name(value)),
        &[("field", Attr::Str(name.into()))],
    )
}

/// An `InvalidArgumentError` for `name`.
pub(crate) fn bad_value(name: &str, message: impl std::fmt::Display) -> PyErr {
    new_err_with(
        ErrorClass::Argument,
        format!("{name} {message}"),
        &[("field", Attr::Str(name.into()))],
    )
}

/// `value` as a Python int: an `int` or anything with `__index__` (numpy integers).
fn int_of<'py>(value: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyInt>> {
    if let Ok(int) = value.cast::<PyInt>() {
        return Ok(int.clone());
    }
    let index = value
        .py()
        .import("operator")?
        .getattr("index")?
        .call1((value,));
    match index {
        Ok(int) => int
            .cast_into::<PyInt>()
            .map_err(|e| wrong_type(name, "an integer", e.into_inner().as_any())),
        Err(e) if e.is_instance_of::<PyTypeError>(value.py()) => {
            Err(wrong_type(name, "an integer", value))
        }
        Err(e) => Err(e),
    }
}

/// A non-negative integer: `None` when it is past 2**64-1.
fn non_negative(value: &Bound<'_, PyAny>, name: &str, range: &str) -> PyResult<Option<u64>> {
    let int = int_of(value, name)?;
    if int.lt(0)? {
        return Err(bad_value(
            name,
            format!("must be {range}, got {}", shown(value)),
        ));
    }
    Ok(int.extract::<u64>().ok())
}

/// A count or index from 0 to 2**64-1.
pub(crate) fn index(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    const RANGE: &str = "an integer from 0 to 2**64-1";
    non_negative(value, name, RANGE)?
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad_value(name, format!("must be {RANGE}, got {}", shown(value))))
}

/// A count from 0 up, where any count past 2**64-1 means the same as 2**64-1 (a budget no
/// generation reaches, a sequence long used up).
pub(crate) fn saturating_index(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    Ok(non_negative(value, name, "an integer >= 0")?
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(usize::MAX))
}

/// A token id: an integer from 0 to 2**32-1.
pub(crate) fn token_id(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    const RANGE: &str = "a token id (an integer from 0 to 2**32-1)";
    non_negative(value, name, RANGE)?
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad_value(name, format!("must be {RANGE}, got {}", shown(value))))
}

/// Token ids from any iterable of integers.
pub(crate) fn token_ids(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    if value.is_instance_of::<PyString>() {
        return Err(wrong_type(name, "a sequence of token ids", value));
    }
    let items = value
        .try_iter()
        .map_err(|_| wrong_type(name, "a sequence of token ids", value))?;
    let mut ids = Vec::with_capacity(value.len().unwrap_or(0).min(1 << 16));
    for (i, item) in items.enumerate() {
        ids.push(token_id(&item?, &format!("{name}[{i}]"))?);
    }
    Ok(ids)
}

/// A real number (a float, an int, anything with `__float__`).
pub(crate) fn real(value: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    if let Ok(float) = value.cast::<PyFloat>() {
        return Ok(float.value());
    }
    if value.is_instance_of::<PyString>() {
        return Err(wrong_type(name, "a number", value));
    }
    value.extract::<f64>().map_err(|e| {
        if e.is_instance_of::<PyTypeError>(value.py()) {
            wrong_type(name, "a number", value)
        } else {
            bad_value(
                name,
                format!("must be a number a float can hold, got {}", shown(value)),
            )
        }
    })
}

/// Text, as UTF-8 (a `str` holding a lone surrogate is refused).
pub(crate) fn text(value: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    let string = value
        .cast::<PyString>()
        .map_err(|_| wrong_type(name, "a str", value))?;
    string.to_cow().map(|text| text.into_owned()).map_err(|_| {
        bad_value(
            name,
            "is not valid text: it holds a lone surrogate (\\ud800-\\udfff), which UTF-8 cannot encode",
        )
    })
}

/// `value`, or `None` for Python's `None`.
pub(crate) fn given<'a, 'py>(
    value: Option<&'a Bound<'py, PyAny>>,
) -> Option<&'a Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none())
}

/// The one optional argument `name` of `callee`, given by position or keyword, where Python's
/// `None` is a value to refuse rather than "omitted" (an `ArgumentTypeError` naming it, as for
/// any value of the wrong type); `None` here: not given.
pub(crate) fn one_optional<'py>(
    args: &Bound<'py, pyo3::types::PyTuple>,
    kwargs: Option<&Bound<'py, pyo3::types::PyDict>>,
    name: &str,
    callee: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    use pyo3::types::PyDictMethods;
    let too_many = |what: String| {
        new_err_with(
            ErrorClass::ArgumentType,
            format!("{callee}() takes one argument, {name}: {what}"),
            &[("field", Attr::Str(name.into()))],
        )
    };
    if args.len() > 1 {
        return Err(too_many(format!("{} were given", args.len())));
    }
    let mut value = args.get_item(0).ok();
    if let Some(kwargs) = kwargs {
        for (key, item) in kwargs.iter() {
            let key: String = key.extract().unwrap_or_default();
            if key != name {
                return Err(too_many(format!("got an unexpected keyword {key:?}")));
            }
            if value.is_some() {
                return Err(too_many("given twice".into()));
            }
            value = Some(item);
        }
    }
    match value {
        Some(v) if v.is_none() => Err(wrong_type(name, "a number", &v)),
        other => Ok(other),
    }
}
