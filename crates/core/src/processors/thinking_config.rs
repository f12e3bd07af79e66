use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::processors::TextEncoder;

/// The token ids that open and close a model's thinking block, and its newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ThinkingTokenConfig {
    pub start_token_id: u32,
    pub end_token_id: u32,
    pub newline_token_id: u32,
}

impl ThinkingTokenConfig {
    /// What the lookup returns when it finds nothing: start and end 0, which disables the budget.
    pub const DISABLED: Self = Self {
        start_token_id: 0,
        end_token_id: 0,
        newline_token_id: 10,
    };

    const fn new(start: u32, end: u32, newline: u32) -> Self {
        Self {
            start_token_id: start,
            end_token_id: end,
            newline_token_id: newline,
        }
    }
}

/// The reference's table, in its order; lookups take the first key found in the model name.
static TABLE: RwLock<Vec<(String, ThinkingTokenConfig)>> = RwLock::new(Vec::new());

fn with_table<R>(f: impl FnOnce(&mut Vec<(String, ThinkingTokenConfig)>) -> R) -> R {
    // A panic elsewhere while the lock was held cannot leave the table half-written (each write is
    // one push or one assignment), so a poisoned lock is safe to keep using.
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    if table.is_empty() {
        table.extend([
            (
                "deepseek".into(),
                ThinkingTokenConfig::new(128798, 128799, 201),
            ),
            (
                "qwen3".into(),
                ThinkingTokenConfig::new(151667, 151668, 198),
            ),
            ("glm4".into(), ThinkingTokenConfig::new(151350, 151351, 198)),
            (
                "glm-4".into(),
                ThinkingTokenConfig::new(151350, 151351, 198),
            ),
        ]);
    }
    f(&mut table)
}

/// Adds `model_key` (lower-cased) to the table, or replaces its entry where it is already there
/// (keeping its place in the order).
pub fn register_thinking_token_config(model_key: &str, config: ThinkingTokenConfig) {
    let key = model_key.to_lowercase();
    with_table(|table| match table.iter_mut().find(|(k, _)| *k == key) {
        Some(entry) => entry.1 = config,
        None => table.push((key, config)),
    })
}

/// The thinking tokens of `model_name`. With a tokenizer whose `<think>`, `</think>` and `\n`
/// each encode to exactly one token, those ids: the tokenizer is what the model was trained
/// with, and one family's name on another's tokenizer (or one version's table entry on another
/// version's tokenizer: DeepSeek's ids moved) must not budget the wrong token. Else the first
/// table key that is a substring of the lower-cased name. Else
/// [`ThinkingTokenConfig::DISABLED`], with a warning.
///
/// The reference looks at the table first and takes the first piece of a longer encoding; both
/// differ here on purpose. Every caller (the Python functions, every engine adapter) uses this
/// one rule.
pub fn get_thinking_token_config(
    model_name: &str,
    tokenizer: Option<&dyn TextEncoder>,
) -> ThinkingTokenConfig {
    lookup_thinking_token_config(model_name, tokenizer).0
}

/// The table's entries, in lookup order.
pub fn thinking_token_table() -> Vec<(String, ThinkingTokenConfig)> {
    with_table(|table| table.clone())
}

/// [`get_thinking_token_config`], and the table key whose entry it is (when it equals the entry
/// of the key the name matched).
pub fn lookup_thinking_token_config(
    model_name: &str,
    tokenizer: Option<&dyn TextEncoder>,
) -> (ThinkingTokenConfig, Option<String>) {
    let name = model_name.to_lowercase();
    let matched = with_table(|table| {
        table
            .iter()
            .find(|(key, _)| name.contains(key.as_str()))
            .cloned()
    });
    let config = find(model_name, tokenizer, matched.as_ref().map(|(_, c)| *c));
    let key = matched.filter(|(_, c)| *c == config).map(|(key, _)| key);
    (config, key)
}

fn find(
    model_name: &str,
    tokenizer: Option<&dyn TextEncoder>,
    from_table: Option<ThinkingTokenConfig>,
) -> ThinkingTokenConfig {
    if let Some(tokenizer) = tokenizer {
        let single = |text: &str| match tokenizer.encode_plain(text) {
            Ok(ids) if ids.len() == 1 => Some(ids[0]),
            _ => None,
        };
        if let (Some(start), Some(end), Some(newline)) =
            (single("<think>"), single("</think>"), single("\n"))
        {
            let found = ThinkingTokenConfig::new(start, end, newline);
            if from_table.is_some_and(|c| c != found) {
                log::warn!(
                    "{model_name}: the tokenizer's thinking ids {found:?} differ from the table's \
                     {from_table:?}; using the tokenizer's"
                );
            }
            return found;
        }
    }
    if let Some(config) = from_table {
        return config;
    }
    log::warn!(
        "{model_name}: no single-token <think>, </think> and newline known for this model; \
         thinking budget disabled"
    );
    ThinkingTokenConfig::DISABLED
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;

    struct Pieces;
    impl TextEncoder for Pieces {
        fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
            Ok(match text {
                "<think>" => vec![500],
                "</think>" => vec![501, 502],
                _ => vec![7],
            })
        }
    }

    struct Single;
    impl TextEncoder for Single {
        fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
            Ok(vec![text.len() as u32 * 100])
        }
    }

    #[test]
    fn table_matches_case_insensitive_substrings_in_order() {
        let qwen = get_thinking_token_config("Qwen/QWEN3-8B", None);
        assert_eq!(qwen, ThinkingTokenConfig::new(151667, 151668, 198));
        let glm = get_thinking_token_config("THUDM/GLM-4-9B", None);
        assert_eq!(glm.start_token_id, 151350);
        // "deepseek" comes first in the table, so a name holding both keys gets DeepSeek's ids.
        let both = get_thinking_token_config("deepseek-r1-distill-qwen3", None);
        assert_eq!(both.start_token_id, 128798);
    }

    #[test]
    fn registration_adds_and_replaces() {
        let mine = ThinkingTokenConfig::new(11, 12, 13);
        register_thinking_token_config("My-Model", mine);
        assert_eq!(get_thinking_token_config("org/my-model-7b", None), mine);
        let again = ThinkingTokenConfig::new(21, 22, 23);
        register_thinking_token_config("MY-MODEL", again);
        assert_eq!(get_thinking_token_config("my-model", None), again);
    }

    #[test]
    fn tokenizer_fallback_accepts_only_single_tokens() {
        assert_eq!(
            get_thinking_token_config("unknown-a", Some(&Pieces)),
            ThinkingTokenConfig::DISABLED
        );
        assert_eq!(
            get_thinking_token_config("unknown-b", Some(&Single)),
            ThinkingTokenConfig::new(700, 800, 100)
        );
        assert_eq!(
            get_thinking_token_config("unknown-c", None),
            ThinkingTokenConfig::DISABLED
        );
    }

    #[test]
    fn the_tokenizer_wins_over_the_table_and_the_table_over_pieces() {
        // A Qwen3-named model with another tokenizer: the tokenizer's single tokens.
        assert_eq!(
            get_thinking_token_config("qwen3-finetune", Some(&Single)),
            ThinkingTokenConfig::new(700, 800, 100)
        );
        // A tokenizer that splits </think>: the table's entry.
        assert_eq!(
            get_thinking_token_config("qwen3-finetune", Some(&Pieces)),
            ThinkingTokenConfig::new(151667, 151668, 198)
        );
    }
}
