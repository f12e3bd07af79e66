use std::sync::Arc;

use llguidance::api::{GrammarInit, TopLevelGrammar};
use llguidance::Matcher;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::grammar::{check_lark_regexes, check_regex_size, check_schema_regexes, grammar_limits};
use crate::history::TokenHistory;
use crate::plan::{MaskId, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};
use crate::vocab::Vocab;

/// `{"kind": "grammar", "regex": "(yes|no)"}`: output constrained to one of `"json_schema": {...}`
/// (a JSON Schema), `"regex": "..."`,
/// `"lark": "..."` (llguidance's Lark dialect) or `"llguidance": {...}` (llguidance's own
/// top-level grammar object). Exactly one.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrammarSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lark: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llguidance: Option<Value>,
}

const GRAMMAR_FIELDS: &str = "json_schema, regex, lark or llguidance";

impl GrammarSpec {
    /// The one grammar field that is set.
    pub(crate) fn field(&self) -> Result<&'static str> {
        let set: Vec<&'static str> = [
            ("json_schema", self.json_schema.is_some()),
            ("regex", self.regex.is_some()),
            ("lark", self.lark.is_some()),
            ("llguidance", self.llguidance.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        match set[..] {
            [one] => Ok(one),
            [] => Err(Error::spec(
                "kind",
                format!("a grammar needs one of {GRAMMAR_FIELDS}"),
            )),
            [first, second, ..] => Err(Error::spec(
                second,
                format!("a grammar takes one of {GRAMMAR_FIELDS}; {first} is already given"),
            )),
        }
    }

    pub(crate) fn grammar(&self, field: &str) -> Result<TopLevelGrammar> {
        Ok(
            match (&self.json_schema, &self.regex, &self.lark, &self.llguidance) {
                (Some(schema), ..) => TopLevelGrammar::from_json_schema(schema.clone()),
                (_, Some(regex), ..) => TopLevelGrammar::from_regex(regex),
                (_, _, Some(lark), _) => TopLevelGrammar::from_lark(lark.clone()),
                (.., Some(object)) => serde_json::from_value(object.clone())
                    .map_err(|e| Error::spec(field, e.to_string()))?,
                _ => unreachable!("checked by `field`"),
            },
        )
    }
}

impl KindSpec for GrammarSpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        self.field()?;
        // Work bounds llguidance's fuel does not keep to a step's budget: refused here.
        if let Some(regex) = &self.regex {
            check_regex_size("regex", regex)?;
        }
        if let Some(schema) = &self.json_schema {
            check_schema_regexes("json_schema", schema)?;
        }
        if let Some(lark) = &self.lark {
            check_lark_regexes("lark", lark)?;
        }
        Ok(())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let field = self.field()?;
        let key = serde_json::to_string(self).expect("specs are plain data");
        let env = env_of(context)?;
        let compiled = env.compiled(field, &key, || self.grammar(field))?;
        check_vocab(env, context)?;
        Ok(Box::new(Grammar::new(env.clone(), compiled, prompt_len)))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        if context.vocab.is_some() {
            return None;
        }
        // No tokenizer here (a frontend): the grammar is compiled without one.
        Some(self.field().and_then(|field| {
            GrammarInit::Serialized(self.grammar(field)?)
                .to_internal(None, grammar_limits())
                .map(drop)
                .map_err(|e| Error::spec(field, e.to_string()))
        }))
    }
}

/// `{"kind": "json_object"}`: any JSON object (the engines' "JSON mode").
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonObjectSpec {}

impl KindSpec for JsonObjectSpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        GrammarSpec {
            json_schema: Some(json!({"type": "object"})),
            ..Default::default()
        }
        .realize(context, prompt_len)
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        context.vocab.is_none().then_some(Ok(()))
    }
}

pub(crate) fn env_of(context: &EngineContext) -> Result<&Vocab> {
    context.vocab.as_ref().ok_or_else(|| {
        Error::spec(
            "kind",
            "a grammar needs the engine's tokenizer; give it to the engine's context (in \
             Python Batch(vocab_size, context=EngineContext(tokenizer)))",
        )
    })
}

/// The logits must have a place for each of the tokenizer's tokens.
pub(crate) fn check_vocab(env: &Vocab, context: &EngineContext) -> Result<()> {
    match context.vocab_size.filter(|&v| v < env.vocab_size()) {
        Some(vocab) => Err(Error::spec(
            "kind",
            format!(
                "the tokenizer has {} tokens, more than the vocab size {vocab}",
                env.vocab_size()
            ),
        )),
        None => Ok(()),
    }
}

/// Constrains a request's output to a grammar, through llguidance: each step its matcher reads
/// the tokens new since the last (from `prompt_len` on), and the row's mask allows exactly the
/// tokens that can continue the grammar (EOS among them once the output is complete; only EOS
/// once the grammar can go no further). Tokens the tokenizer does not know (a padded vocab) are
/// masked out.
///
/// The mask is computed in [`LogitsProcessor::finish`], rows in parallel. When the engine
/// chooses a token the grammar does not allow (another processor forced it, or the engine
/// ignored the mask), or a mask exceeds the limits ([`crate::grammar::grammar_limits`]), the
/// row does not fail the step: it allows only EOS from then on and
/// [`LogitsProcessor::failure`] says why. Ids that go back (an engine's speculative tokens
/// rejected, a rewound request) roll the matcher back to the ids it shares with them.
pub struct Grammar {
    env: Vocab,
    // The matcher as compiled, before any token (shared through the cache): to start over from.
    fresh: Arc<Matcher>,
    matcher: Matcher,
    prompt_len: usize,
    // The output tokens the matcher has consumed.
    accepted: Vec<u32>,
    failure: Option<Failure>,
    mask: Option<MaskId>,
    // The state before the last plan, for `undo`.
    saved: Option<(Vec<u32>, Option<Failure>)>,
}

/// Why a row's grammar stopped: at output position `at` (every token before it accepted), the
/// token there (`None`: the mask could not be computed).
#[derive(Debug, Clone, PartialEq)]
struct Failure {
    at: usize,
    token: Option<u32>,
    reason: String,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("accepted", &self.accepted.len())
            .field("failure", &self.failure)
            .finish()
    }
}

impl Grammar {
    fn new(env: Vocab, fresh: Arc<Matcher>, prompt_len: usize) -> Self {
        Self {
            env,
            // A deep copy: a plain clone shares the lexer's cache behind one lock, which would
            // make rows of one grammar compute their masks one at a time.
            matcher: fresh.deep_clone(),
            fresh,
            prompt_len,
            accepted: vec![],
            failure: None,
            mask: None,
            saved: None,
        }
    }

    /// The matcher again in the state of `accepted` (which it accepted before): rolled back when
    /// it can be, else replayed from the compiled grammar.
    fn rewind_to(&mut self, keep: usize) {
        let drop = self.accepted.len() - keep;
        self.accepted.truncate(keep);
        if drop == 0 && !self.matcher.is_error() {
            return;
        }
        if self.matcher.is_error() || self.matcher.rollback(drop).is_err() {
            self.matcher = self.fresh.deep_clone();
            // These tokens were accepted from this state before: they are again.
            let _ = self.matcher.consume_tokens(&self.accepted);
        }
    }

    /// Feeds the output tokens `new` (after `accepted`) to the matcher, stopping at the first it
    /// rejects.
    fn consume(&mut self, new: &[u32]) {
        let vocab = self.env.vocab_size();
        let known = new.iter().take_while(|&&t| (t as usize) < vocab).count();
        let taken = match self.matcher.try_consume_tokens(&new[..known]) {
            Ok(taken) => taken,
            Err(e) => {
                self.fail(new.first().copied(), e.to_string());
                return;
            }
        };
        self.accepted.extend_from_slice(&new[..taken]);
        // EOS after the grammar's end (an engine padding a finished row) is not output: it is
        // left unconsumed and looked at again with the next ids.
        let eos = self.env.eos_words().unwrap_or_default();
        let is_eos = |t: &u32| {
            eos.get(*t as usize / 32)
                .is_some_and(|w| w >> (t % 32) & 1 == 1)
        };
        // The token at fault is the first that is neither accepted nor such padding.
        let padding = if self.matcher.is_stopped() && !self.matcher.is_error() {
            new[taken..].iter().take_while(|t| is_eos(t)).count()
        } else {
            0
        };
        let at = taken + padding;
        if let Some(&token) = new.get(at) {
            let position = self.accepted.len() + padding;
            let reason = if at < known {
                format!("output token {position} (id {token}) is not allowed by the grammar")
            } else {
                format!(
                    "output token {position} (id {token}) is not a token of the tokenizer \
                     ({vocab} tokens)"
                )
            };
            self.fail_at(position, Some(token), reason);
        }
    }

    fn fail(&mut self, token: Option<u32>, reason: String) {
        self.fail_at(self.accepted.len(), token, reason);
    }

    /// Fails at output position `at` (every output token before it accepted or padding).
    fn fail_at(&mut self, at: usize, token: Option<u32>, reason: String) {
        self.failure = Some(Failure { at, token, reason });
    }
}

impl LogitsProcessor for Grammar {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.saved = Some((self.accepted.clone(), self.failure.clone()));
        let generated = ids.token_count().saturating_sub(self.prompt_len);
        let prompt_len = self.prompt_len;
        let output = |i: usize| ids.token_at(prompt_len + i);
        let shared = (0..self.accepted.len().min(generated))
            .take_while(|&i| output(i) == self.accepted[i])
            .count();
        // A failure stands while the ids still hold what caused it.
        if let Some(failure) = &self.failure {
            let stands = shared == self.accepted.len()
                && failure
                    .token
                    .is_none_or(|token| generated > failure.at && output(failure.at) == token);
            if !stands {
                self.failure = None;
            }
        }
        if shared < self.accepted.len() || (self.failure.is_none() && self.matcher.is_error()) {
            self.rewind_to(shared);
        }
        if self.failure.is_none() && generated > shared {
            let new: Vec<u32> = (shared..generated).map(output).collect();
            self.consume(&new);
        }
        self.mask = Some(plan.reserve_mask(self.env.vocab_size().div_ceil(32), false));
        Ok(())
    }

    fn finishes(&self) -> bool {
        true
    }

    fn finish(&mut self, plan: &mut RowPlan) {
        let Some(id) = self.mask.take() else {
            return;
        };
        if self.failure.is_none() {
            match self.matcher.compute_mask_or_eos() {
                Ok(mask) => {
                    let words = plan.mask_words_mut(id);
                    let n = words.len().min(mask.as_slice().len());
                    words[..n].copy_from_slice(&mask.as_slice()[..n]);
                    return;
                }
                Err(e) => self.fail(None, format!("the grammar's mask failed: {e}")),
            }
        }
        // Built: this grammar was compiled in it.
        let eos = self.env.eos_words().unwrap_or_default();
        let words = plan.mask_words_mut(id);
        let n = words.len().min(eos.len());
        words[..n].copy_from_slice(&eos[..n]);
    }

    fn undo(&mut self) {
        let Some((accepted, failure)) = self.saved.take() else {
            return;
        };
        let shared = accepted
            .iter()
            .zip(&self.accepted)
            .take_while(|(a, b)| a == b)
            .count();
        self.rewind_to(shared);
        self.failure = None;
        if accepted.len() > shared {
            // Tokens a rollback in the undone step dropped: consumed again.
            let _ = self.matcher.consume_tokens(&accepted[shared..]);
            self.accepted = accepted;
        }
        self.failure = failure;
    }

    fn failure(&self) -> Option<String> {
        self.failure.as_ref().map(|f| f.reason.clone())
    }

    fn reset(&mut self) {
        self.matcher = self.fresh.deep_clone();
        self.accepted.clear();
        self.failure = None;
        self.saved = None;
    }
}
