//! `TemperatureProcessor`: the reference's temperature, backed by the core's.

use logits_processing::{LogitsProcessor, Temperature};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::args;
use crate::errors::IntoPyResult;
use crate::exclusive::{Exclusive, Held};

use super::call::{logits_arg, Row};

/// Divides every logit by `temperature`: above 1 flattens the distribution, below 1 sharpens it.
///
/// A drop-in for the reference's `TemperatureProcessor`, with the same results bit for bit
/// (`logits / temperature`, rounded as torch's `div_` rounds it; `1.0` leaves the logits
/// untouched). It ignores `input_ids`. One pass over the row, with the GIL released. It can be
/// subclassed, copied and pickled, as the reference's can.
///
/// Args:
///     temperature (float): The divisor; must be finite and > 0. Default 1.0.
///
/// Raises:
///     InvalidArgumentError: (a ValueError) for a temperature <= 0, NaN or infinite.
///     ArgumentTypeError: (a TypeError) for a temperature that is not a number.
///
/// Example:
///     >>> import torch
///     >>> from logits_processing.examples import TemperatureProcessor
///     >>> logits = torch.tensor([1.0, 2.0, -4.0])
///     >>> TemperatureProcessor(0.5)([1, 2, 3], logits)
///     >>> logits
///     tensor([ 2.,  4., -8.])
#[pyclass(
    frozen,
    subclass,
    module = "logits_processing.examples",
    name = "TemperatureProcessor"
)]
pub(crate) struct PyTemperature {
    row: Exclusive<Row<Temperature>>,
}

fn temperature_of(value: &Bound<'_, PyAny>) -> PyResult<Temperature> {
    Temperature::new(args::real(value, "temperature")?).py()
}

#[pymethods]
impl PyTemperature {
    #[new]
    #[pyo3(signature = (*positional, **keywords), text_signature = "(temperature=1.0)")]
    fn new(
        positional: &Bound<'_, PyTuple>,
        keywords: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // Omitted is 1.0; None is refused (as the reference's `logits / None` does), so the
        // argument is read by hand rather than as an Option.
        let given =
            args::one_optional(positional, keywords, "temperature", "TemperatureProcessor")?;
        let temperature = match given {
            Some(value) => temperature_of(&value)?,
            None => Temperature::new(1.0).py()?,
        };
        Ok(Self {
            row: Row::new(temperature),
        })
    }

    /// The divisor (float). Assigning checks it as the constructor does.
    #[getter]
    fn temperature(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.lock(py)?.processor.temperature())
    }

    #[setter]
    fn set_temperature(&self, py: Python<'_>, temperature: &Bound<'_, PyAny>) -> PyResult<()> {
        let temperature = temperature_of(temperature)?;
        self.lock(py)?.processor = temperature;
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
        self.lock(py)?.call(py, None, input_ids, logits)
    }

    fn __getnewargs_ex__(&self, py: Python<'_>) -> PyResult<((f64,), Py<PyDict>)> {
        Ok(((self.temperature(py)?,), PyDict::new(py).unbind()))
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        Ok(format!(
            "{}(temperature={})",
            slf.get_type().name()?,
            slf.get().temperature(slf.py())?
        ))
    }
}

impl PyTemperature {
    fn lock(&self, py: Python<'_>) -> PyResult<Held<'_, Row<Temperature>>> {
        self.row.lock(py, "TemperatureProcessor")
    }

    pub(crate) fn processor(&self, py: Python<'_>) -> PyResult<Box<dyn LogitsProcessor>> {
        Ok(Box::new(self.lock(py)?.processor.clone()))
    }
}
