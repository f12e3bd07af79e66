//! The built-in processors, one file each, and the trait they share.

pub(crate) mod adaptive_p;
mod allowed_token_ids;
mod bad_words;
#[cfg(feature = "grammar")]
mod ban_strings;
mod ban_tokens;
mod bitmask;
mod cite_from_prompt;
mod count_penalty;
mod counts;
mod cursor;
mod dry;
pub(crate) mod dynamic_temperature;
mod eos;
mod exponential_decay_length_penalty;
mod force_last_phrase;
mod forced_bos;
mod forced_eos;
mod forced_sequence;
mod frequency_penalty;
mod gen_length;
#[cfg(feature = "grammar")]
mod grammar;
mod hello_world;
mod logit_bias;
mod matcher;
mod max_time;
mod min_length;
mod min_new_tokens;
pub(crate) mod mirostat;
mod multiple_choice;
mod no_repeat_ngram;
mod phrase;
mod presence_penalty;
mod prevent_hallucination;
mod repetition_penalty;
mod sequence_bias;
pub(crate) mod smoothing;
mod suppress_tokens_at_begin;
pub(crate) mod tail_free;
mod temperature;
#[cfg(test)]
mod tests;
mod thinking_budget;
mod thinking_config;
pub(crate) mod top_a;
pub(crate) mod top_n_sigma;
mod trigger_phrase;
mod truncate;
pub(crate) mod xtc;
pub(crate) mod zoo;

pub use adaptive_p::{AdaptiveP, AdaptivePSpec};
pub use allowed_token_ids::{AllowedTokenIds, AllowedTokenIdsSpec};
pub use bad_words::{BadWords, BadWordsSpec};
#[cfg(feature = "grammar")]
pub use ban_strings::{BanStrings, BanStringsSpec};
pub use ban_tokens::{BanTokens, BanTokensSpec};
pub use bitmask::{BitmaskSpec, CallerBitmask};
pub use cite_from_prompt::{CiteFromPrompt, CiteFromPromptSpec};
pub use count_penalty::CountPenalty;
pub use dry::{Dry, DrySpec};
pub use dynamic_temperature::{DynamicTemperature, DynamicTemperatureSpec};
pub use exponential_decay_length_penalty::{
    ExponentialDecayLengthPenalty, ExponentialDecayLengthPenaltySpec,
};
pub use force_last_phrase::{ForceLastPhrase, ForceLastPhraseSpec};
pub use forced_bos::{ForcedBos, ForcedBosSpec};
pub use forced_eos::{ForcedEos, ForcedEosSpec};
pub use forced_sequence::{ForcedSequence, ForcedSequenceSpec, Position, PositionSpec};
pub use frequency_penalty::{FrequencyPenalty, FrequencyPenaltySpec};
pub use gen_length::{GenLength, GenLengthSpec};
#[cfg(feature = "grammar")]
pub use grammar::{Grammar, GrammarSpec, JsonObjectSpec};
pub use hello_world::{hello_world, HelloWorldSpec, TextEncoder, HELLO_WORLD_TEXT};
pub use logit_bias::{LogitBias, LogitBiasSpec};
pub use max_time::{MaxTime, MaxTimeSpec};
pub use min_length::{MinLength, MinLengthSpec};
pub use min_new_tokens::{MinNewTokens, MinNewTokensSpec};
pub use mirostat::{Mirostat, MirostatSpec};
pub use multiple_choice::{MultipleChoice, MultipleChoiceSpec};
pub use no_repeat_ngram::{NoRepeatNGram, NoRepeatNGramSpec};
pub use presence_penalty::{PresencePenalty, PresencePenaltySpec};
pub use prevent_hallucination::{PreventHallucination, PreventHallucinationSpec};
pub use repetition_penalty::{RepetitionPenalty, RepetitionPenaltySpec, Scope};
pub use sequence_bias::{SequenceBias, SequenceBiasSpec};
pub use smoothing::{Smoothing, SmoothingSpec};
pub use suppress_tokens_at_begin::{SuppressTokensAtBegin, SuppressTokensAtBeginSpec};
pub use tail_free::TailFreeSpec;
pub use temperature::{Temperature, TemperatureSpec};
pub use thinking_budget::{ThinkingBudget, ThinkingBudgetSpec, CHECKED_TAIL};
pub use thinking_config::{
    get_thinking_token_config, lookup_thinking_token_config, register_thinking_token_config,
    thinking_token_table, ThinkingTokenConfig,
};
pub use top_a::TopASpec;
pub use top_n_sigma::TopNSigmaSpec;
pub use trigger_phrase::{TriggerPhrase, TriggerPhraseSpec};
pub use truncate::{
    EpsilonCutoffSpec, EtaCutoffSpec, MinPSpec, TopKSpec, TopPSpec, Truncate, TypicalPSpec,
};
pub use xtc::{Xtc, XtcSpec};
pub use zoo::{Clock, ManualClock, SystemClock, TextOrId, TextOrIds};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::spec::Kind;

/// Every spec kind, by its `"kind"` name, in the canonical order ([`canonical_order`]). Adding a
/// processor: its file (the processor, its spec struct and `KindSpec`), one line here, its docs
/// and its tests (docs/core.md).
pub(crate) static KINDS: &[Kind] = &[
    // Biases and penalties: they move logits, and never to or from -inf.
    Kind::new::<LogitBiasSpec>("logit_bias"),
    Kind::new::<SequenceBiasSpec>("sequence_bias"),
    Kind::new::<RepetitionPenaltySpec>("repetition_penalty"),
    Kind::new::<FrequencyPenaltySpec>("frequency_penalty"),
    Kind::new::<PresencePenaltySpec>("presence_penalty"),
    Kind::new::<DrySpec>("dry"),
    Kind::new::<ExponentialDecayLengthPenaltySpec>("exponential_decay_length_penalty"),
    // logits-processor-zoo's biases: the end token by length, the prompt's tokens.
    Kind::new::<GenLengthSpec>("gen_length"),
    Kind::new::<CiteFromPromptSpec>("cite_from_prompt"),
    // Bans and allowed ids, then the kinds that force a token.
    Kind::new::<BanTokensSpec>("ban_tokens"),
    Kind::new::<BadWordsSpec>("bad_words"),
    #[cfg(feature = "grammar")]
    Kind::new::<BanStringsSpec>("ban_strings"),
    Kind::new::<NoRepeatNGramSpec>("no_repeat_ngram"),
    Kind::new::<MinLengthSpec>("min_length"),
    Kind::new::<MinNewTokensSpec>("min_new_tokens"),
    Kind::new::<SuppressTokensAtBeginSpec>("suppress_tokens_at_begin"),
    Kind::new::<AllowedTokenIdsSpec>("allowed_token_ids"),
    Kind::new::<MultipleChoiceSpec>("multiple_choice"),
    // Grammars and the caller's own bitmask: masks, like the allowed ids.
    #[cfg(feature = "grammar")]
    Kind::new::<GrammarSpec>("grammar"),
    #[cfg(feature = "grammar")]
    Kind::new::<JsonObjectSpec>("json_object"),
    Kind::new::<BitmaskSpec>("bitmask"),
    Kind::new::<ForcedBosSpec>("forced_bos"),
    Kind::new::<ForcedEosSpec>("forced_eos"),
    Kind::new::<ForcedSequenceSpec>("forced_sequence"),
    Kind::new::<HelloWorldSpec>("hello_world"),
    // logits-processor-zoo's forcing kinds: their triggers read the row the kinds above left.
    Kind::new::<ForceLastPhraseSpec>("force_last_phrase"),
    Kind::new::<MaxTimeSpec>("max_time"),
    Kind::new::<TriggerPhraseSpec>("trigger_phrase"),
    Kind::new::<PreventHallucinationSpec>("prevent_hallucination"),
    // (User processors go here: see `USER_STEPS_BEFORE`.)
    Kind::new::<ThinkingBudgetSpec>("thinking_budget"),
    // Value transforms that read the row: quadratic smoothing before any temperature, as
    // text-generation-webui runs it; llama.cpp's dynamic temperature in the temperature's place.
    Kind::new::<SmoothingSpec>("smoothing"),
    Kind::new::<TemperatureSpec>("temperature"),
    Kind::new::<DynamicTemperatureSpec>("dynamic_temperature"),
    // Truncation, in transformers' order, then the samplers of llama.cpp and
    // text-generation-webui, XTC last (it removes the most likely tokens that the others keep).
    Kind::new::<TopKSpec>("top_k"),
    Kind::new::<TopPSpec>("top_p"),
    Kind::new::<MinPSpec>("min_p"),
    Kind::new::<TypicalPSpec>("typical_p"),
    Kind::new::<EpsilonCutoffSpec>("epsilon_cutoff"),
    Kind::new::<EtaCutoffSpec>("eta_cutoff"),
    Kind::new::<TopNSigmaSpec>("top_n_sigma"),
    Kind::new::<TopASpec>("top_a"),
    Kind::new::<TailFreeSpec>("tail_free"),
    Kind::new::<XtcSpec>("xtc"),
    // Mirostat last: it reads the row the others left and its next step reads what it kept.
    Kind::new::<MirostatSpec>("mirostat"),
    // adaptive-p last too, as llama.cpp chains it: its next step reads the row its pass read.
    Kind::new::<AdaptivePSpec>("adaptive_p"),
];

/// Kinds whose edits depend on nothing a request accumulates: neither its ids nor how many steps
/// came before. An engine that runs ahead of its history (vLLM's Model Runner V2, SGLang's overlap
/// scheduler) can plan a row of these kinds without waiting for the newest sampled token; every
/// other kind reads the ids. A property test holds each listed kind to it.
static HISTORY_FREE: &[&str] = &[
    "logit_bias",
    "ban_tokens",
    "allowed_token_ids",
    "bitmask",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "smoothing",
    "dynamic_temperature",
    "top_n_sigma",
    "top_a",
    "tail_free",
];

/// Whether a spec of `kind` reads the request's token ids (or counts its steps); see
/// [`HISTORY_FREE`]. Unknown kinds read them (the safe answer).
pub fn reads_history(kind: &str) -> bool {
    !HISTORY_FREE.contains(&kind)
}

/// Kinds that allow only some tokens, whatever their logits.
static MASKS: &[&str] = &[
    "allowed_token_ids",
    "multiple_choice",
    "grammar",
    "json_object",
    "bitmask",
];

/// Kinds that cut a row by its values.
static TRUNCATIONS: &[&str] = &[
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "top_n_sigma",
    "top_a",
    "tail_free",
    "xtc",
    "mirostat",
];

/// Refuses a mask (allowed ids, a grammar, the caller's bitmask) listed after a truncation step:
/// truncating first keeps a few tokens by their logits, and the mask can then allow none of them,
/// which leaves the row with no token at all. Every engine applies its grammar before truncation,
/// and so does [`canonical_order`]. `specs` come with where each stood in the pipeline
/// (`"[3]"`); the error names the mask's `kind` field there and the truncation step it follows.
pub fn check_order<'a>(
    specs: impl IntoIterator<Item = (&'a str, &'a ProcessorSpec)>,
) -> Result<()> {
    let mut truncation: Option<(&str, &ProcessorSpec)> = None;
    for (at, spec) in specs {
        if let (Some((cut_at, cut)), true) = (truncation, MASKS.contains(&spec.kind())) {
            return Err(crate::error::Error::InvalidSpec {
                field: crate::error::field_at(at, "kind"),
                message: format!(
                    "'{}' comes after the truncation step {}'{}': truncating first can leave no \
                     token the mask allows (a row of -inf); list masks before truncation, as \
                     canonical_order() does",
                    spec.kind(),
                    match cut_at {
                        "" => String::new(),
                        at => format!("{at} "),
                    },
                    cut.kind(),
                ),
            });
        }
        if truncation.is_none() && TRUNCATIONS.contains(&spec.kind()) {
            truncation = Some((at, spec));
        }
    }
    Ok(())
}

/// Refuses specs that depend on where the prompt ends ([`ProcessorSpec::needs_prompt_len`]: a
/// grammar, the penalties that count the output alone, the kinds that count new tokens, a
/// sequence positioned by tokens) when no `prompt_len` is given: read from 0, the prompt would
/// count as output (a grammar would reject it and allow only EOS). The error, an
/// [`crate::Error::InvalidArgument`], names `prompt_len` and the first such spec (`specs` come
/// with where each stood, `"[2]"`).
pub fn check_prompt_len<'a>(
    specs: impl IntoIterator<Item = (&'a str, &'a ProcessorSpec)>,
    prompt_len: Option<usize>,
) -> Result<()> {
    if prompt_len.is_some() {
        return Ok(());
    }
    match specs.into_iter().find(|(_, spec)| spec.needs_prompt_len()) {
        Some((at, spec)) => Err(crate::error::Error::InvalidArgument {
            field: "prompt_len".into(),
            message: format!(
                "the spec {}'{}' depends on where the prompt ends in the ids; give prompt_len \
                 (the prompt's length in ids, 0 for none)",
                match at {
                    "" => String::new(),
                    at => format!("{at} "),
                },
                spec.kind()
            ),
        }),
        None => Ok(()),
    }
}

/// In the canonical order, user processors (external steps) go before the first spec of this
/// kind or of a kind after it in [`KINDS`].
pub const USER_STEPS_BEFORE: &str = "thinking_budget";

/// The default order of a pipeline given as a set of specs (e.g. from a generation config):
/// biases and penalties; bans and allowed ids, then forced tokens; (user processors, see
/// [`user_steps_at`]); the thinking budget; temperature; truncation (top-k, top-p, min-p, typical,
/// epsilon, eta, transformers' order). Specs of one kind keep their order. A pipeline given as
/// a list keeps the list's order; this is for callers that hold a set.
///
/// In this order no step brings back a token an earlier one banned, except the steps that force
/// a token by setting its value (`forced_eos`, the thinking budget's end token), as transformers
/// and the reference do.
pub fn canonical_order(mut specs: Vec<ProcessorSpec>) -> Vec<ProcessorSpec> {
    specs.sort_by_key(|spec| kind_rank(spec.kind()));
    specs
}

/// Where user processors go among specs in the canonical order: the index of the first spec at
/// or after [`USER_STEPS_BEFORE`].
pub fn user_steps_at(ordered: &[ProcessorSpec]) -> usize {
    let boundary = kind_rank(USER_STEPS_BEFORE);
    ordered
        .iter()
        .position(|spec| kind_rank(spec.kind()) >= boundary)
        .unwrap_or(ordered.len())
}

fn kind_rank(kind: &str) -> usize {
    KINDS
        .iter()
        .position(|k| k.name == kind)
        .unwrap_or(KINDS.len())
}

/// Ban lists longer than this are pushed as a bitmask: one bit per token up to the largest id,
/// applied word by word in the row's pass, instead of one sparse edit per token.
pub(crate) const MASK_FROM: usize = 256;

/// Bans `tokens` (sorted, distinct): a sparse edit each, or one bitmask for a long list.
pub(crate) fn push_bans(plan: &mut RowPlan, tokens: &[u32]) {
    match tokens.last() {
        Some(&last) if tokens.len() > MASK_FROM => {
            plan.push_mask_with((last as usize + 1).div_ceil(32), true, |words| {
                words.fill(u32::MAX);
                for &token in tokens {
                    words[token as usize / 32] &= !(1 << (token % 32));
                }
            })
        }
        _ => {
            for &token in tokens {
                plan.push(Edit::Ban { token });
            }
        }
    }
}
use crate::logit::Logit;
use crate::plan::{Edit, MaskId, RowPlan};
use crate::spec::ProcessorSpec;

/// Per-request state that decides, each step, how one row of logits is edited.
///
/// A processor never touches logits itself: from the request's token ids it adds edits to the
/// row's [`RowPlan`], and the plan is applied in one pass (or by the GPU, for a whole batch).
/// Call order: once per decode step, with the ids so far (each call's ids usually extend the
/// previous call's by one).
pub trait LogitsProcessor: Send + std::fmt::Debug {
    /// Adds this step's edits to `plan` and advances the state. On error the state is unchanged.
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()>;

    /// Takes back the last successful [`LogitsProcessor::plan`]: the state is again what it was
    /// before that call. A batch calls it when another step of the same call failed, so a failed
    /// step never loses or repeats a token. Called at most once after each `plan`.
    fn undo(&mut self);

    /// Whether [`LogitsProcessor::finish`] has work to do: a batch then runs it for this row in
    /// parallel with the other rows' (and, in Python, without the GIL).
    fn finishes(&self) -> bool {
        false
    }

    /// The costly part of a step, after every row's [`LogitsProcessor::plan`] succeeded: a
    /// grammar's mask, computed into the mask its `plan` reserved in `plan`. It cannot fail (a
    /// failure becomes the processor's state, see [`LogitsProcessor::failure`]); an
    /// [`LogitsProcessor::undo`] after it takes back the plan and the finish together.
    fn finish(&mut self, _plan: &mut RowPlan) {}

    /// The mask its last plan reserved for the bitmask the caller gives with the step
    /// (`{"kind": "bitmask"}`), which the batch copies in.
    fn caller_mask(&self) -> Option<MaskId> {
        None
    }

    /// Why the processor stopped constraining as asked, when it did (a grammar that rejected a
    /// token the engine chose): such a failure is state, not an error, so the other rows go on.
    fn failure(&self) -> Option<String> {
        None
    }

    /// The largest token id this processor can name, so a vocab can be checked at admission.
    fn max_token_id(&self) -> Option<u32> {
        None
    }

    /// Back to the state of a new request.
    fn reset(&mut self) {}
}

/// Runs one processor on one row: plan, then apply. On error the row and the processor's state are
/// as they were.
pub fn process_row<T: Logit>(
    processor: &mut dyn LogitsProcessor,
    ids: &dyn TokenHistory,
    row: &mut [T],
) -> Result<()> {
    if let Some(token) = processor.max_token_id() {
        crate::error::check_token("token id", token, row.len())?;
    }
    let mut plan = RowPlan::new();
    processor.plan(ids, &mut plan)?;
    processor.finish(&mut plan);
    if let Err(error) = plan.validate(row.len()) {
        processor.undo();
        return Err(error);
    }
    plan.apply(row)
}
