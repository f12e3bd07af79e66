use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::zoo::{structure_only, with_kind, TextOrId};
use crate::processors::LogitsProcessor;
use crate::spec::{check_len, KindSpec, SpecContext};

/// `{"kind": "multiple_choice", "choices": [32, 33, 34, 35]}`: the answer is one of the
/// choices, as logits-processor-zoo's `MultipleChoiceLogitsProcessor`.
///
/// - `choices`: each the text of one token (as the zoo: at most a prefix token and one) or an id;
///   default `["1", "2", "3", "4"]`;
/// - `delimiter` (default `"."`) and `boost_first_words` (default 0.0): the zoo's boost of each
///   choice by its text's first word in the prompt. Not supported yet: a non-zero
///   `boost_first_words` is refused.
///
/// Every step, every logit but the choices' becomes `-inf` (a mask); the choices keep their
/// values. The zoo lifts the choices by one common amount to the row's maximum and fills the
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
    fn ids(&self, context: &SpecContext) -> Result<Vec<u32>> {
        self.choices
            .iter()
            .enumerate()
            .map(|(i, c)| c.id(context, &format!("choices[{i}]")))
            .collect()
    }
}

impl KindSpec for MultipleChoiceSpec {
    fn check(&self) -> Result<()> {
        if self.choices.is_empty() {
            return Err(Error::argument("choices", "must list at least one choice"));
        }
        check_len("choices", self.choices.len())?;
        if self.boost_first_words != 0.0 {
            return Err(Error::argument(
                "boost_first_words",
                "is not supported yet: give 0 (the default)",
            ));
        }
        Ok(())
    }

    fn realize(&self, context: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(MultipleChoice::new(&self.ids(context)?)))
    }

    fn validate(&self, context: &SpecContext) -> Option<Result<()>> {
        let needs = self.choices.iter().any(TextOrId::is_text);
        structure_only(context, needs).then_some(Ok(()))
    }

    fn resolve(&self, context: &SpecContext) -> Result<Option<serde_json::Value>> {
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
    // Bit set = a choice, up to the largest; everything past it is not.
    mask: Vec<u32>,
    max_token_id: u32,
}

impl MultipleChoice {
    /// The choices' ids (at least one).
    pub fn new(choices: &[u32]) -> Self {
        let max_token_id = choices.iter().copied().max().unwrap_or(0);
        let mut mask = vec![0u32; (max_token_id as usize + 1).div_ceil(32)];
        for &token in choices {
            mask[token as usize / 32] |= 1 << (token % 32);
        }
        Self { mask, max_token_id }
    }
}

impl LogitsProcessor for MultipleChoice {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        plan.push_mask(&self.mask, false);
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        Some(self.max_token_id)
    }
}
