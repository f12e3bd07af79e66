use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::cursor::Cursor;
use crate::processors::token_text::TextOrId;
use crate::processors::LogitsProcessor;
use crate::spec::with_kind;
use crate::spec::{check_len, EngineContext, KindSpec};

/// `{"kind": "multiple_choice", "choices": [32, 33, 34, 35]}`: the answer is one of the
/// choices, as logits-processor-zoo's `MultipleChoiceLogitsProcessor`.
///
/// - `choices`: each the text of one token (as the zoo: at most a prefix token and one) or an id;
///   default `["1", "2", "3", "4"]`;
/// - `boost_first_words` (finite, default 0.0) and `delimiter` (text of one token or an id,
///   default `"."`): when not 0, each choice `c` listed in the prompt as a line `c<delimiter>
///   first word...` (after a token whose text ends with a newline; the choices in order) gets
///   `boost_first_words` times its first word's logit as the row stands at this step, as the
///   zoo does. Needs the tokenizer's token texts (for the newline tokens), as grammars do.
///
/// Every step, every logit but the choices' becomes `-inf` (a mask); the choices keep their
/// values (boosted). The zoo lifts the choices by one common amount to the row's maximum and fills the
/// rest with the row's minimum, which leaves the others some probability on a flat row: the
/// same distribution among the choices, none outside them here.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultipleChoiceSpec {
    #[serde(default = "default_choices")]
    pub choices: Vec<TextOrId>,
    #[serde(default = "default_delimiter")]
    pub delimiter: TextOrId,
    #[serde(default)]
    pub boost_first_words: f64,
}

fn default_choices() -> Vec<TextOrId> {
    ["1", "2", "3", "4"]
        .map(|c| TextOrId::Text(c.into()))
        .to_vec()
}

fn default_delimiter() -> TextOrId {
    TextOrId::Text(".".into())
}

impl MultipleChoiceSpec {
    fn ids(&self, context: &EngineContext) -> Result<Vec<u32>> {
        self.choices
            .iter()
            .enumerate()
            .map(|(i, c)| c.id(context, &format!("choices[{i}]")))
            .collect()
    }
}

/// The tokens whose text ends a line, found once per tokenizer; `None` without token texts.
#[cfg(feature = "tokenizers")]
fn newline_tokens(context: &EngineContext) -> Option<Result<Arc<Vec<u32>>>> {
    let env = context.vocab.as_ref()?;
    Some(env.derived("newline tokens", |env| {
        let mut newlines = vec![];
        for t in 0..env.vocab_size() as u32 {
            if env.decoded_text(t)?.ends_with(b"\n") {
                newlines.push(t);
            }
        }
        Ok(newlines)
    }))
}

#[cfg(not(feature = "tokenizers"))]
fn newline_tokens(_: &EngineContext) -> Option<Result<Arc<Vec<u32>>>> {
    None
}

impl KindSpec for MultipleChoiceSpec {
    /// The first words are looked for in the output alone.
    fn needs_prompt_len(&self) -> bool {
        self.boost_first_words != 0.0
    }

    fn check(&self) -> Result<()> {
        if self.choices.is_empty() {
            return Err(Error::argument("choices", "must list at least one choice"));
        }
        check_len("choices", self.choices.len())?;
        let boost = self.boost_first_words;
        if !(boost.is_finite() && (boost as f32).is_finite()) {
            return Err(Error::argument(
                "boost_first_words",
                format!("must be finite, got {boost}"),
            ));
        }
        Ok(())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let choice = MultipleChoice::new(&self.ids(context)?);
        if self.boost_first_words == 0.0 {
            return Ok(Box::new(choice));
        }
        let delimiter = self.delimiter.id(context, "delimiter")?;
        let newlines = newline_tokens(context).ok_or_else(|| {
            Error::spec(
                "boost_first_words",
                "needs the tokenizer's token texts (its newline tokens): the engine's context \
                 must have a tokenizer whose token texts can be read (as grammars do)",
            )
        })??;
        Ok(Box::new(choice.with_first_words(
            self.boost_first_words as f32,
            delimiter,
            newlines,
            prompt_len,
        )))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        if !context.structure_only {
            return None;
        }
        let boost = self.boost_first_words != 0.0;
        let needs_text =
            self.choices.iter().any(TextOrId::is_text) || (boost && self.delimiter.is_text());
        // Without the engine, what the engine supplies is not checked.
        ((needs_text && context.encoder.is_none()) || (boost && !context.has_token_texts()))
            .then_some(Ok(()))
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if context.encoder.is_none() {
            return Ok(None);
        }
        let resolved = MultipleChoiceSpec {
            choices: self.ids(context)?.into_iter().map(TextOrId::Id).collect(),
            ..self.clone()
        };
        Ok(Some(with_kind("multiple_choice", &resolved)))
    }
}

/// Only the choices: see [`MultipleChoiceSpec`].
///
/// ```
/// use logits_processing::{process_row, processors::MultipleChoice};
/// let mut choice = MultipleChoice::new(&[2, 4]);
/// let mut row = [5.0f32, 1.0, 2.0, 3.0, 0.5];
/// process_row(&mut choice, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, ninf, 2.0, ninf, 0.5]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MultipleChoice {
    choices: Vec<u32>,
    // Bit set = a choice, up to the largest; everything past it is not.
    mask: Vec<u32>,
    max_token_id: u32,
    first_words: Option<FirstWords>,
}

/// The zoo's boost of each choice by its first word's logit.
#[derive(Debug, Clone, PartialEq)]
struct FirstWords {
    factor: f32,
    delimiter: u32,
    // Tokens whose text ends with a newline, sorted.
    newlines: Arc<Vec<u32>>,
    prompt_len: usize,
    // The prompt read, and each listed choice's first word (in the choices' order).
    read: Option<(Cursor, Vec<(u32, u32)>)>,
}

impl FirstWords {
    /// The zoo's scan of the prompt: a newline token, the next choice, the delimiter, then the
    /// choice's first word.
    fn pairs(&mut self, ids: &dyn TokenHistory, choices: &[u32]) -> &[(u32, u32)] {
        let len = self.prompt_len.min(ids.token_count());
        let fresh = self
            .read
            .as_ref()
            .is_some_and(|(c, _)| c.seen() == len && c.extended_by(ids));
        if !fresh {
            let prompt: Vec<u32> = (0..len).map(|i| ids.token_at(i)).collect();
            let mut pairs = vec![];
            for i in 0..prompt.len().saturating_sub(3) {
                let Some(&choice) = choices.get(pairs.len()) else {
                    break;
                };
                if self.newlines.binary_search(&prompt[i]).is_ok()
                    && prompt[i + 1] == choice
                    && prompt[i + 2] == self.delimiter
                {
                    pairs.push((choice, prompt[i + 3]));
                }
            }
            let mut cursor = Cursor::default();
            cursor.read_all(&prompt);
            self.read = Some((cursor, pairs));
        }
        &self.read.as_ref().expect("read above").1
    }
}

impl MultipleChoice {
    /// The choices' ids (at least one).
    pub fn new(choices: &[u32]) -> Self {
        let max_token_id = choices.iter().copied().max().unwrap_or(0);
        let mut mask = vec![0u32; (max_token_id as usize + 1).div_ceil(32)];
        for &token in choices {
            mask[token as usize / 32] |= 1 << (token % 32);
        }
        Self {
            choices: choices.to_vec(),
            mask,
            max_token_id,
            first_words: None,
        }
    }

    /// The same choices, each boosted by `factor` times its first word's logit when the prompt
    /// lists it after a `newlines` token as `choice delimiter first-word`; the prompt is the
    /// first `prompt_len` ids.
    pub fn with_first_words(
        mut self,
        factor: f32,
        delimiter: u32,
        newlines: Arc<Vec<u32>>,
        prompt_len: usize,
    ) -> Self {
        self.first_words = Some(FirstWords {
            factor,
            delimiter,
            newlines,
            prompt_len,
            read: None,
        });
        self
    }
}

impl LogitsProcessor for MultipleChoice {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if let Some(first_words) = &mut self.first_words {
            let factor = first_words.factor;
            for &(token, source) in first_words.pairs(ids, &self.choices) {
                plan.push(Edit::AddScaledFrom {
                    token,
                    source,
                    factor,
                });
            }
        }
        plan.push_mask(&self.mask, false);
        Ok(())
    }

    // The prompt read is a cache of the ids, not state.
    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        Some(self.max_token_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    #[test]
    fn boosts_each_listed_choice_by_its_first_words_logit() {
        // Prompt: "\n" (9) "A" (1) "." (5) "car" (7) "\n" (9) "B" (2) "." (5) "apple" (8).
        let choice = MultipleChoice::new(&[1, 2, 3]).with_first_words(0.5, 5, Arc::new(vec![9]), 8);
        let mut choice = choice;
        let mut row = [0.0f32, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 4.0, -2.0, 0.0];
        process_row(&mut choice, &[9u32, 1, 5, 7, 9, 2, 5, 8], &mut row).unwrap();
        let ninf = f32::NEG_INFINITY;
        // A + 0.5 * car, B + 0.5 * apple; C is not listed.
        assert_eq!(
            row,
            [ninf, 3.0, 0.0, 1.0, ninf, ninf, ninf, ninf, ninf, ninf]
        );
    }
}
