//! The thinking tokens from Python: a `ThinkingTokenConfig` given, and the core's table by name.

use logits_processing::ThinkingTokenConfig;
use pyo3::prelude::*;

use crate::args;

/// A `ThinkingTokenConfig` (anything with its three attributes) or a 3-tuple of ids.
pub(crate) fn thinking_config_of(object: &Bound<'_, PyAny>) -> PyResult<ThinkingTokenConfig> {
    const NAMES: [&str; 3] = ["start_token_id", "end_token_id", "newline_token_id"];
    let ids: Vec<Bound<'_, PyAny>> = if object.hasattr("start_token_id").unwrap_or(false) {
        NAMES
            .iter()
            .map(|name| {
                object.getattr(*name).map_err(|_| {
                    args::wrong_type(
                        "thinking_tokens",
                        "a ThinkingTokenConfig (with start_token_id, end_token_id and newline_token_id)",
                        object,
                    )
                })
            })
            .collect::<PyResult<_>>()?
    } else {
        let (a, b, c) = object.extract().map_err(|_| {
            args::wrong_type(
                "thinking_tokens",
                "a ThinkingTokenConfig or (start_token_id, end_token_id, newline_token_id)",
                object,
            )
        })?;
        vec![a, b, c]
    };
    let id = |i: usize| args::token_id(&ids[i], &format!("thinking_tokens.{}", NAMES[i]));
    Ok(ThinkingTokenConfig {
        start_token_id: id(0)?,
        end_token_id: id(1)?,
        newline_token_id: id(2)?,
    })
}

/// The thinking-token table, in lookup order: `[(key, (start, end, newline))]`.
#[pyfunction]
pub(crate) fn thinking_token_table() -> Vec<(String, (u32, u32, u32))> {
    logits_processing::processors::thinking_token_table()
        .into_iter()
        .map(|(key, c)| (key, (c.start_token_id, c.end_token_id, c.newline_token_id)))
        .collect()
}
