use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::end_token::EndToken;
use crate::processors::end_token::Seen;
use crate::processors::token_text::TextOrId;
use crate::processors::LogitsProcessor;
use crate::spec::with_kind;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "gen_length", "boost_factor": 0.5, "p": 2, "boost_token": 2}`: a bias on
/// the end token growing with the answer's length, as logits-processor-zoo's
/// `GenLengthLogitsProcessor` (negative factors lengthen answers).
///
/// - `boost_factor` (finite): after `n` generated tokens the end token's logit gets
///   `boost_factor * n^p / 10^p` (in f64, saturated at ±1e30 so that it stays finite, added in
///   f32), until the end token has been generated;
/// - `p` (int >= 0, default 2);
/// - `complete_sentences` (default false): only when the last id ends a sentence;
/// - `boost_token` (text of one token, or an id; default the engine's EOS id), e.g. `"</think>"`;
/// - `sentence_end_ids` (ids; default the last tokens of `"It is a sentence."` and
///   `"It is a new line\n"`, the zoo's full stop and new line).
///
/// The zoo adds `enabled * boost`, so a step that does not boost still adds a zero of the boost's
/// sign, and so does this kind (bit for bit, `-0.0` included). One difference, on purpose: at the
/// first step the zoo looks for the end token in the whole prompt (its `input_ids[:, -0:]`); this
/// kind only in the generated ids (the boost there is `0` unless `p` is 0).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GenLengthSpec {
    pub boost_factor: f64,
    #[serde(default = "default_p")]
    pub p: u32,
    #[serde(default)]
    pub complete_sentences: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boost_token: Option<TextOrId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentence_end_ids: Option<Vec<u32>>,
}

/// The boost saturates at this magnitude: added to any finite f32 it stays finite.
const MAX_BOOST: f64 = 1e30;

fn default_p() -> u32 {
    2
}

impl GenLengthSpec {
    fn end_token(&self) -> EndToken<'_> {
        EndToken {
            boost_token: self.boost_token.as_ref(),
            complete_sentences: self.complete_sentences,
            sentence_end_ids: self.sentence_end_ids.as_deref(),
        }
    }
}

impl KindSpec for GenLengthSpec {
    /// It counts generated tokens.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        if !self.boost_factor.is_finite() {
            return Err(Error::argument(
                "boost_factor",
                format!("must be finite, got {}", self.boost_factor),
            ));
        }
        self.end_token().check()
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let (boost_token, sentence_ends) = self.end_token().ids(context)?;
        Ok(Box::new(GenLength {
            boost_factor: self.boost_factor,
            p: self.p,
            boost_token,
            sentence_ends,
            prompt_len,
            seen: Seen::default(),
            before: Seen::default(),
        }))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        self.end_token().validate(context)
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        let Some((boost, ends)) = self.end_token().resolved(context) else {
            return Ok(None);
        };
        let resolved = GenLengthSpec {
            boost_token: Some(boost),
            sentence_end_ids: ends,
            ..self.clone()
        };
        Ok(Some(with_kind("gen_length", &resolved)))
    }
}

/// The growing end-token bias: see [`GenLengthSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenLength {
    boost_factor: f64,
    p: u32,
    boost_token: u32,
    sentence_ends: Option<Vec<u32>>,
    prompt_len: usize,
    seen: Seen,
    before: Seen,
}

impl GenLength {
    /// The boost after `n` generated tokens: `boost_factor * n^p / 10^p`, as Python computes it
    /// (exact integer powers, each rounded once to f64), then rounded to f32 as torch does.
    pub fn boost(&self, n: usize) -> f32 {
        let power = |base: u128| match base.checked_pow(self.p) {
            Some(v) => v as f64,
            None => (base as f64).powi(self.p.min(i32::MAX as u32) as i32),
        };
        let mut boost = self.boost_factor * power(n as u128) / power(10);
        if boost.is_nan() {
            // Both powers overflowed: their ratio, then `0 * inf` is no boost.
            boost = self.boost_factor * (n as f64 / 10.0).powf(self.p as f64);
            if boost.is_nan() {
                boost = 0.0;
            }
        }
        boost.clamp(-MAX_BOOST, MAX_BOOST) as f32
    }
}

impl LogitsProcessor for GenLength {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.before = self.seen;
        let n = ids.token_count().saturating_sub(self.prompt_len);
        let mut enabled = !self.seen.update(ids, self.prompt_len, self.boost_token);
        if let Some(ends) = &self.sentence_ends {
            enabled &= ids.last_token().is_some_and(|last| ends.contains(&last));
        }
        let boost = self.boost(n);
        plan.push(Edit::Bias {
            token: self.boost_token,
            // torch's `enabled * boost`: a zero of the boost's sign when not enabled.
            bias: if enabled { boost } else { 0.0 * boost },
        });
        Ok(())
    }

    fn undo(&mut self) {
        self.seen = self.before;
    }

    fn max_token_id(&self) -> Option<u32> {
        Some(self.boost_token)
    }

    fn reset(&mut self) {
        self.seen = Seen::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    fn gen_length(factor: f64, p: u32, ends: Option<Vec<u32>>) -> GenLength {
        GenLength {
            boost_factor: factor,
            p,
            boost_token: 0,
            sentence_ends: ends,
            prompt_len: 2,
            seen: Seen::default(),
            before: Seen::default(),
        }
    }

    #[test]
    fn an_extreme_boost_saturates_finite() {
        for (factor, p, n) in [
            (1.0, 400, 5),
            (1e300, 2, 50),
            (1.0, 200, 1000),
            (-1.0, 400, 1000),
        ] {
            let spec = GenLengthSpec {
                boost_factor: factor,
                p,
                complete_sentences: false,
                boost_token: None,
                sentence_end_ids: None,
            };
            let gen = GenLength {
                boost_factor: spec.boost_factor,
                p: spec.p,
                boost_token: 0,
                sentence_ends: None,
                prompt_len: 0,
                seen: Seen::default(),
                before: Seen::default(),
            };
            let boost = gen.boost(n);
            assert!(
                boost.is_finite() && (1.0f32 + boost).is_finite(),
                "{factor} {p} {n}: {boost}"
            );
        }
    }

    #[test]
    fn the_boost_grows_with_length_until_the_end_token_is_written() {
        let mut g = gen_length(0.5, 2, None);
        let mut row = [1.0f32, 0.0, 0.0];
        process_row(&mut g, &[5u32, 6, 1, 2, 3], &mut row).unwrap();
        // 3 generated: 0.5 * 9 / 100.
        assert_eq!(row[0], 1.0 + (0.5f64 * 9.0 / 100.0) as f32);
        let mut row = [-0.0f32, 0.0, 0.0];
        process_row(&mut g, &[5u32, 6, 1, 0, 3, 4], &mut row).unwrap();
        assert_eq!(row[0].to_bits(), 0.0f32.to_bits(), "adds +0.0 once written");
        let mut g = gen_length(-0.5, 2, None);
        let mut row = [-0.0f32, 0.0, 0.0];
        process_row(&mut g, &[5u32, 6, 0], &mut row).unwrap();
        assert_eq!(row[0].to_bits(), (-0.0f32).to_bits(), "adds -0.0");
    }

    #[test]
    fn complete_sentences_boost_only_after_a_sentence_end() {
        let mut g = gen_length(1.0, 1, Some(vec![7]));
        let mut row = [0.0f32; 8];
        process_row(&mut g, &[5u32, 6, 1, 2], &mut row).unwrap();
        assert_eq!(row[0], 0.0);
        process_row(&mut g, &[5u32, 6, 1, 2, 7], &mut row).unwrap();
        assert_eq!(row[0], 0.3);
    }
}
