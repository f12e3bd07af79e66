//! `detect_watermark`: transformers' `WatermarkDetector` verdicts from the core's detector.

use logits_processing::processors::WatermarkSpec;
use logits_processing::watermark::{detect, DetectOptions};
use logits_processing::Error;
use pyo3::prelude::*;

use crate::{args, errors};

/// One text's verdict: `(num_tokens_scored, num_green_tokens, green_fraction, z_score, p_value,
/// prediction, confidence)`.
type Verdict = (usize, usize, f64, f64, f64, bool, f64);

/// transformers' `WatermarkDetector` for texts watermarked by the kind `watermark` (or by
/// transformers' `WatermarkLogitsProcessor` on the CPU), one verdict per text. Wrapped by
/// `logits_processing.detect_watermark`, which takes tensors and gives the output's fields.
///
/// Args:
///     texts: a list of id lists (the prompt best left out, as transformers advises).
///     vocab_size: the model's vocab size the green lists permute.
///     greenlist_ratio, bias, hashing_key, seeding_scheme, context_width: the watermark's
///         settings, as the spec (and transformers' `WatermarkingConfig`) gives them.
///     ignore_repeated_ngrams: count each distinct n-gram once.
///     z_threshold: the verdict is `z_score > z_threshold`.
///     bos_token_id: a leading BOS id, not scored.
///
/// Returns:
///     A list of `(num_tokens_scored, num_green_tokens, green_fraction, z_score, p_value,
///     prediction, confidence)`.
///
/// Raises:
///     SpecError / InvalidArgumentError: a setting out of range, naming it; a text too short or a
///         batch whose texts do not all start (or all not) with the BOS id.
#[pyfunction]
#[pyo3(signature = (texts, *, vocab_size, greenlist_ratio = 0.25, bias = 2.0,
    hashing_key = 15485863, seeding_scheme = "lefthash", context_width = None,
    ignore_repeated_ngrams = false, z_threshold = 3.0, bos_token_id = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn detect_watermark(
    py: Python<'_>,
    texts: &Bound<'_, PyAny>,
    vocab_size: &Bound<'_, PyAny>,
    greenlist_ratio: f64,
    bias: f64,
    hashing_key: i64,
    seeding_scheme: &str,
    context_width: Option<&Bound<'_, PyAny>>,
    ignore_repeated_ngrams: bool,
    z_threshold: f64,
    bos_token_id: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Verdict>> {
    let spec = serde_json::json!({
        "greenlist_ratio": greenlist_ratio,
        "bias": bias,
        "hashing_key": hashing_key,
        "seeding_scheme": seeding_scheme,
        "context_width": context_width.map_or(Ok(1), |w| args::index(w, "context_width"))?,
        "vocab_size": args::index(vocab_size, "vocab_size")?,
    });
    let spec: WatermarkSpec = serde_json::from_value(spec).map_err(|e| {
        errors::to_py(Error::InvalidSpec {
            field: "seeding_scheme".into(),
            message: e.to_string(),
        })
    })?;
    let lists = spec.green_lists(None).map_err(errors::to_py)?;
    let options = DetectOptions {
        greenlist_ratio,
        ignore_repeated_ngrams,
        z_threshold,
        bos_token_id: bos_token_id
            .filter(|b| !b.is_none())
            .map(|b| args::token_id(b, "bos_token_id"))
            .transpose()?,
    };
    let mut rows = vec![];
    for (i, text) in texts.try_iter()?.enumerate() {
        rows.push(args::token_ids(&text?, &format!("input_ids[{i}]"))?);
    }
    let views: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let verdicts = py
        .detach(|| detect(&lists, &options, &views))
        .map_err(errors::to_py)?;
    Ok(verdicts
        .into_iter()
        .map(|d| {
            (
                d.num_tokens_scored,
                d.num_green_tokens,
                d.green_fraction,
                d.z_score,
                d.p_value,
                d.prediction,
                d.confidence,
            )
        })
        .collect())
}
