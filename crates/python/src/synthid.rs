//! SynthID Text's detection-side functions, from the core's one definition of the hashing and
//! the sampling table (`logits_processing::synthid`).

use logits_processing::synthid::{context_repetition_mask, Watermark, MAX_NGRAM_LEN};
use pyo3::prelude::*;

fn check_ngram_len(ngram_len: usize) -> PyResult<()> {
    if (1..=MAX_NGRAM_LEN).contains(&ngram_len) {
        return Ok(());
    }
    Err(crate::errors::to_py(
        logits_processing::Error::InvalidArgument {
            field: "ngram_len".into(),
            message: format!("must be 1 to {MAX_NGRAM_LEN}, got {ngram_len}"),
        },
    ))
}

/// SynthID Text's g-values of every n-gram of each row of ``input_ids``, as transformers'
/// ``SynthIDTextWatermarkLogitsProcessor.compute_g_values`` gives them: per row, for each of its
/// ``len(row) - ngram_len + 1`` n-grams, one 0 or 1 per key.
///
/// Args:
///     input_ids: rows of token ids (lists of ints).
///     ngram_len: the watermark's n-gram length (1 to 256).
///     keys: the watermark's keys (1 to 64).
///     sampling_table_size: the sampling table's size (1 to 2**24).
///     sampling_table_seed: the table's seed (its low 32 bits, as torch seeds).
///
/// Raises:
///     InvalidArgumentError: a value out of range, naming it.
///
/// Example:
///     >>> from logits_processing import synthid_g_values
///     >>> g = synthid_g_values([[5, 6, 7, 8]], ngram_len=3, keys=[654, 400])
///     >>> len(g[0]), len(g[0][0])
///     (2, 2)
#[pyfunction]
#[pyo3(signature = (input_ids, ngram_len, keys, sampling_table_size = 65536, sampling_table_seed = 0))]
pub(crate) fn synthid_g_values(
    py: Python<'_>,
    input_ids: Vec<Vec<i64>>,
    ngram_len: usize,
    keys: Vec<i64>,
    sampling_table_size: u64,
    sampling_table_seed: u64,
) -> PyResult<Vec<Vec<Vec<i64>>>> {
    check_ngram_len(ngram_len)?;
    let watermark = Watermark::new(&keys, sampling_table_size, sampling_table_seed)
        .map_err(crate::errors::to_py)?;
    Ok(py.detach(|| {
        input_ids
            .iter()
            .map(|row| {
                // Ints, not bytes (PyO3 turns a `Vec<u8>` into `bytes`).
                let grams = watermark.compute_g_values(row, ngram_len);
                grams
                    .into_iter()
                    .map(|g| g.into_iter().map(i64::from).collect())
                    .collect()
            })
            .collect()
    }))
}

/// Whether each n-gram's context (its first ``ngram_len - 1`` ids) is new, per row, as
/// transformers' ``compute_context_repetition_mask`` gives it: ``False`` for a context among the
/// last ``context_history_size`` ones (or one hashing to 0 while fewer were seen, the history
/// starting zeroed), ``True`` otherwise.
///
/// Args:
///     input_ids: rows of token ids (lists of ints).
///     ngram_len: the watermark's n-gram length (1 to 256).
///     context_history_size: how many contexts are remembered.
///
/// Raises:
///     InvalidArgumentError: a value out of range, naming it.
///
/// Example:
///     >>> from logits_processing import synthid_context_repetition_mask
///     >>> synthid_context_repetition_mask([[1, 2, 1, 2, 1]], ngram_len=2)
///     [[True, True, False, False]]
#[pyfunction]
#[pyo3(signature = (input_ids, ngram_len, context_history_size = 1024))]
pub(crate) fn synthid_context_repetition_mask(
    input_ids: Vec<Vec<i64>>,
    ngram_len: usize,
    context_history_size: usize,
) -> PyResult<Vec<Vec<bool>>> {
    check_ngram_len(ngram_len)?;
    Ok(input_ids
        .iter()
        .map(|row| context_repetition_mask(row, ngram_len, context_history_size))
        .collect())
}
