//! The reference's processors as Python classes, each backed by the core's processor.
//!
//! A call plans with the GIL held (reading only the ids it needs), then edits the row in one pass
//! with the GIL released. On any error the logits and the processor's state are as they were.

mod call;
mod forced_sequence;
mod out_of_vocab;
mod temperature;
mod thinking_budget;

use logits_processing::LogitsProcessor;
use pyo3::prelude::*;
use pyo3::PyTypeInfo;

pub(crate) use call::{call_row, logits_arg, RowSteps};
pub(crate) use forced_sequence::PyForcedSequence;
pub(crate) use out_of_vocab::PyOutOfVocabForTests;
pub(crate) use temperature::PyTemperature;
pub(crate) use thinking_budget::PyThinkingBudget;

/// A built-in processor object, as fresh core state for a batch row; `None` for anything else,
/// including a subclass that overrides `__call__` (it is then the user's processor).
pub(crate) fn builtin_processor(
    object: &Bound<'_, PyAny>,
) -> PyResult<Option<Box<dyn LogitsProcessor>>> {
    fn own_call<T: PyTypeInfo>(object: &Bound<'_, PyAny>) -> PyResult<bool> {
        let own = object.py().get_type::<T>().getattr("__call__")?;
        Ok(own.is(&object.get_type().getattr("__call__")?))
    }
    if let Ok(p) = object.cast::<PyTemperature>() {
        if own_call::<PyTemperature>(object)? {
            return p.get().processor(object.py()).map(Some);
        }
    } else if let Ok(p) = object.cast::<PyForcedSequence>() {
        // HelloWorldLogitsProcessor is a Python subclass that keeps `__call__`.
        if own_call::<PyForcedSequence>(object)? {
            return p.get().processor(object.py()).map(Some);
        }
    } else if let Ok(p) = object.cast::<PyThinkingBudget>() {
        if own_call::<PyThinkingBudget>(object)? {
            return p.get().processor(object.py()).map(Some);
        }
    } else if let Ok(p) = object.cast::<PyOutOfVocabForTests>() {
        return Ok(Some(p.borrow().processor()));
    }
    Ok(None)
}
