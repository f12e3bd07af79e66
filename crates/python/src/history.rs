//! The core's `TokenHistory` over Python token ids, read in place.
//!
//! A list or tuple is read item by item, a numpy array or CPU torch tensor of integers through
//! DLPack, so a processor that reads only the ids new since its last call (the thinking budget)
//! costs the same at 32,000 ids as at 1,000. Anything else iterable is converted once per call.

use std::cell::{Cell, OnceCell, RefCell};

use logits_processing::TokenHistory;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

use crate::errors::{new_err_with, Attr, ErrorClass};
use crate::tensor::{IntArray, TensorView};

enum Ids<'py> {
    Empty,
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
    Array(IntArray),
    Owned(Vec<u32>),
}

/// One request's ids, resolved from the Python object on first use. A bad id (negative, too
/// large, not an int) is recorded and read as `u32::MAX`; the caller checks [`PyIds::take_error`]
/// after planning and takes the plan back.
pub(crate) struct PyIds<'py> {
    source: Option<Bound<'py, PyAny>>,
    ids: OnceCell<Ids<'py>>,
    error: RefCell<Option<PyErr>>,
    // Whether reading the ids may have run Python code (an iterator, `__dlpack__`, `__index__`).
    ran_python: Cell<bool>,
}

impl<'py> PyIds<'py> {
    /// `None` stands for no ids (an engine that passes no history).
    pub fn new(source: &Bound<'py, PyAny>) -> Self {
        Self {
            source: (!source.is_none()).then(|| source.clone()),
            ids: OnceCell::new(),
            error: RefCell::new(None),
            ran_python: Cell::new(false),
        }
    }

    pub fn empty() -> Self {
        Self {
            source: None,
            ids: OnceCell::new(),
            error: RefCell::new(None),
            ran_python: Cell::new(false),
        }
    }

    /// Whether reading the ids so far may have run Python code, which could have moved the
    /// logits: a list or tuple of plain ints runs none.
    pub fn ran_python(&self) -> bool {
        self.ran_python.get()
    }

    /// The first error met reading the ids, if any.
    pub fn take_error(&self) -> Option<PyErr> {
        self.error.borrow_mut().take()
    }

    fn record(&self, error: PyErr) {
        let mut slot = self.error.borrow_mut();
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    fn ids(&self) -> &Ids<'py> {
        self.ids.get_or_init(|| match self.resolve() {
            Ok(ids) => ids,
            Err(error) => {
                self.record(error);
                Ids::Empty
            }
        })
    }

    fn resolve(&self) -> PyResult<Ids<'py>> {
        let Some(source) = &self.source else {
            return Ok(Ids::Empty);
        };
        if let Ok(list) = source.cast::<PyList>() {
            return Ok(Ids::List(list.clone()));
        }
        if let Ok(tuple) = source.cast::<PyTuple>() {
            return Ok(Ids::Tuple(tuple.clone()));
        }
        self.ran_python.set(true);
        if source.hasattr(pyo3::intern!(source.py(), "__dlpack__"))? {
            let view = TensorView::of(source)?;
            let dtype = view.dtype_name();
            return match IntArray::from_view(view)? {
                Some(array) => Ok(Ids::Array(array)),
                None => Err(new_err_with(
                    ErrorClass::DType,
                    format!("input_ids must hold integers, got {dtype}"),
                    &[("field", Attr::Str("input_ids".into()))],
                )),
            };
        }
        // Any other iterable: converted whole, once per call.
        let mut ids = vec![];
        let py = source.py();
        if !source.hasattr(pyo3::intern!(py, "__iter__"))?
            && !source.hasattr(pyo3::intern!(py, "__getitem__"))?
        {
            // Ids of the wrong type are a DTypeError, as ids that are not ints are.
            return Err(new_err_with(
                ErrorClass::DType,
                format!(
                    "input_ids must be a sequence of token ids, got {}",
                    source.get_type().name()?
                ),
                &[("field", Attr::Str("input_ids".into()))],
            ));
        }
        for (index, item) in source.try_iter()?.enumerate() {
            ids.push(to_id(&item?, index)?);
        }
        Ok(Ids::Owned(ids))
    }
}

/// Token id `index` of the ids: an int from 0 to 2**32-1. An int out of that range is an
/// `InvalidArgumentError`, anything else (a float, a string) a `DTypeError`, as ids of a float
/// tensor are; both name the id (`input_ids[3]`).
fn to_id(item: &Bound<'_, PyAny>, index: usize) -> PyResult<u32> {
    item.extract::<u32>().map_err(|_| {
        let field = format!("input_ids[{index}]");
        let is_int = item
            .py()
            .import("operator")
            .and_then(|operator| operator.getattr("index")?.call1((item,)))
            .is_ok();
        let (kind, expected) = match is_int {
            true => (ErrorClass::Argument, "a token id (from 0 to 2**32-1)"),
            false => (ErrorClass::DType, "an integer token id"),
        };
        new_err_with(
            kind,
            format!(
                "{field} must be {expected}, found {}",
                crate::args::shown(item)
            ),
            &[("field", Attr::Str(field.clone()))],
        )
    })
}

impl TokenHistory for PyIds<'_> {
    fn token_count(&self) -> usize {
        match self.ids() {
            Ids::Empty => 0,
            Ids::List(list) => list.len(),
            Ids::Tuple(tuple) => tuple.len(),
            Ids::Array(array) => array.len(),
            Ids::Owned(ids) => ids.len(),
        }
    }

    fn token_at(&self, index: usize) -> u32 {
        let item = match self.ids() {
            Ids::Empty => return u32::MAX,
            Ids::Owned(ids) => return ids[index],
            Ids::Array(array) => {
                return array.get(index).unwrap_or_else(|| {
                    let field = format!("input_ids[{index}]");
                    self.record(new_err_with(
                        ErrorClass::Argument,
                        format!("{field} is not a token id (from 0 to 2**32-1)"),
                        &[("field", Attr::Str(field.clone()))],
                    ));
                    u32::MAX
                })
            }
            Ids::List(list) => list.get_item(index),
            Ids::Tuple(tuple) => tuple.get_item(index),
        };
        if item
            .as_ref()
            .map_or(true, |item| !item.is_exact_instance_of::<PyInt>())
        {
            self.ran_python.set(true);
        }
        match item.and_then(|item| to_id(&item, index)) {
            Ok(id) => id,
            Err(error) => {
                self.record(error);
                u32::MAX
            }
        }
    }
}
