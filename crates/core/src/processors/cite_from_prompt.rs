use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::cursor::Cursor;
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::token_text::eos_or;
use crate::processors::{check_bias, LogitsProcessor};
use crate::spec::{structure_only, with_kind};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "cite_from_prompt", "boost_factor": 1.0, "conditional_boost_factor": 0.5, "eos_token_id": 2}`:
/// a bias on the prompt's tokens, as logits-processor-zoo's `CiteFromPromptLogitsProcessor`
/// (negative factors keep the answer away from the prompt's words).
///
/// - `boost_factor` (finite, default 1.0): added once to each distinct token of the prompt (the
///   first `prompt_len` ids), and to the EOS token when `boost_eos` (default true);
/// - `conditional_boost_factor` (finite, default 0.0): once a token has been generated, added to
///   each distinct token that follows the last id somewhere in the prompt;
/// - `eos_token_id`: default the engine's EOS id (needed only with `boost_eos`).
///
/// As the zoo, every step adds the boost (a zero included, which turns a `-0.0` logit into
/// `0.0`); ids outside the vocab are skipped.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CiteFromPromptSpec {
    #[serde(default = "default_boost")]
    #[schemars(range(min = -1e30, max = 1e30))]
    pub boost_factor: f64,
    #[serde(default = "default_boost_eos")]
    pub boost_eos: bool,
    #[serde(default)]
    #[schemars(range(min = -1e30, max = 1e30))]
    pub conditional_boost_factor: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
}

fn default_boost() -> f64 {
    1.0
}

fn default_boost_eos() -> bool {
    true
}

impl KindSpec for CiteFromPromptSpec {
    /// The prompt is what it cites from.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        for (name, value) in [
            ("boost_factor", self.boost_factor),
            ("conditional_boost_factor", self.conditional_boost_factor),
        ] {
            check_bias(name, value)?;
        }
        Ok(())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let eos = self
            .boost_eos
            .then(|| eos_or(context, self.eos_token_id, "eos_token_id"))
            .transpose()?;
        Ok(Box::new(CiteFromPrompt {
            boost: self.boost_factor as f32,
            conditional: self.conditional_boost_factor as f32,
            eos,
            prompt_len,
            limit: vocab_limit(context.vocab_size),
            prompt: None,
        }))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        structure_only(context, self.boost_eos && self.eos_token_id.is_none()).then_some(Ok(()))
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if !self.boost_eos || self.eos_token_id.is_some() || context.eos_token_id().is_none() {
            return Ok(None);
        }
        let resolved = CiteFromPromptSpec {
            eos_token_id: context.eos_token_id(),
            ..self.clone()
        };
        Ok(Some(with_kind("cite_from_prompt", &resolved)))
    }
}

/// What the prompt gives, read once: its distinct tokens (and EOS), and the distinct tokens that
/// follow each token in it.
#[derive(Debug, Clone, PartialEq)]
struct Prompt {
    cursor: Cursor,
    tokens: Vec<u32>,
    next: HashMap<u32, Vec<u32>>,
}

/// The prompt's tokens boosted: see [`CiteFromPromptSpec`].
///
/// ```
/// use logits_processing::{process_row, ProcessorSpec, EngineContext};
/// let spec = ProcessorSpec::parse(r#"{"kind": "cite_from_prompt", "boost_factor": 2.0, "eos_token_id": 0}"#)?;
/// let mut cite = spec.realize(&EngineContext::default(), 2)?;
/// let mut row = [0.0f32; 5];
/// process_row(cite.as_mut(), &[3u32, 4, 1], &mut row)?; // prompt [3, 4], then 1
/// assert_eq!(row, [2.0, 0.0, 0.0, 2.0, 2.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CiteFromPrompt {
    boost: f32,
    conditional: f32,
    eos: Option<u32>,
    prompt_len: usize,
    limit: u32,
    prompt: Option<Prompt>,
}

impl CiteFromPrompt {
    fn read_prompt(&mut self, ids: &dyn TokenHistory) -> &Prompt {
        let len = self.prompt_len.min(ids.token_count());
        let fresh = self
            .prompt
            .as_ref()
            .is_some_and(|p| p.cursor.seen() == len && p.cursor.extended_by(ids));
        if !fresh {
            let prompt: Vec<u32> = (0..len).map(|i| ids.token_at(i)).collect();
            let mut tokens: Vec<u32> = prompt.iter().copied().chain(self.eos).collect();
            tokens.retain(|&t| t < self.limit);
            tokens.sort_unstable();
            tokens.dedup();
            let mut next: HashMap<u32, Vec<u32>> = HashMap::new();
            for pair in prompt.windows(2) {
                if pair[1] < self.limit {
                    next.entry(pair[0]).or_default().push(pair[1]);
                }
            }
            for followers in next.values_mut() {
                followers.sort_unstable();
                followers.dedup();
            }
            let mut cursor = Cursor::default();
            cursor.read_all(&prompt);
            self.prompt = Some(Prompt {
                cursor,
                tokens,
                next,
            });
        }
        self.prompt.as_ref().expect("read above")
    }
}

impl LogitsProcessor for CiteFromPrompt {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let (boost, conditional) = (self.boost, self.conditional);
        let generated = ids.token_count() > self.prompt_len;
        let prompt = self.read_prompt(ids);
        for &token in &prompt.tokens {
            plan.push(Edit::Bias { token, bias: boost });
        }
        if conditional != 0.0 && generated {
            let last = ids.last_token().expect("a generated id");
            for &token in prompt.next.get(&last).into_iter().flatten() {
                plan.push(Edit::Bias {
                    token,
                    bias: conditional,
                });
            }
        }
        Ok(())
    }

    // The prompt read is a cache of the ids, not state: nothing to take back.
    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.eos
    }

    fn reset(&mut self) {
        self.prompt = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    #[test]
    fn boosts_the_prompt_and_what_follows_the_last_id_in_it() {
        let spec: CiteFromPromptSpec = serde_json::from_str(
            r#"{"boost_factor": 1.0, "boost_eos": false, "conditional_boost_factor": 0.5}"#,
        )
        .unwrap();
        let mut cite = spec.realize(&EngineContext::default(), 4).unwrap();
        let mut row = [0.0f32; 6];
        // Prompt 1 2 1 3: after a generated 1 come 2 and 3.
        process_row(cite.as_mut(), &[1u32, 2, 1, 3], &mut row).unwrap();
        assert_eq!(row, [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
        let mut row = [0.0f32; 6];
        process_row(cite.as_mut(), &[1u32, 2, 1, 3, 1], &mut row).unwrap();
        assert_eq!(row, [0.0, 1.0, 1.5, 1.5, 0.0, 0.0]);
    }
}
