//! The built-in processors, one file each, and the registry of their kinds ([`KINDS`]). The
//! traits they implement are in `processor.rs` (re-exported here); the order of steps in `order.rs`.

pub(crate) mod adaptive_p;
mod allowed_token_ids;
mod bad_words;
#[cfg(feature = "tokenizers")]
mod ban_strings;
mod ban_tokens;
mod bans;
mod bitmask;
mod cite_from_prompt;
mod clock;
mod count_penalty;
mod counts;
pub(crate) mod cursor;
mod dry;
pub(crate) mod dynamic_temperature;
mod end_token;
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
mod inf_nan_remove;
#[cfg(feature = "grammar")]
mod lazy_grammar;
mod log_softmax;
mod logit_bias;
mod matcher;
mod max_time;
mod min_length;
mod min_new_tokens;
pub(crate) mod mirostat;
mod multiple_choice;
mod no_repeat_ngram;
mod order;
pub(crate) mod p_less;
mod phrase;
mod presence_penalty;
mod prevent_hallucination;
mod repetition_detection;
mod repetition_penalty;
mod sequence_bias;
pub(crate) mod smoothing;
mod suppress_tokens_at_begin;
mod synthid_watermark;
pub(crate) mod tail_free;
mod temperature;
#[cfg(test)]
mod tests;
mod thinking_budget;
mod thinking_config;
mod token_text;
pub(crate) mod top_a;
pub(crate) mod top_h;
pub(crate) mod top_n_sigma;
mod trigger_phrase;
pub(crate) mod truncate;
mod watermark;
pub(crate) mod xtc;

pub use adaptive_p::{AdaptiveP, AdaptivePSpec};
pub use allowed_token_ids::{AllowedTokenIds, AllowedTokenIdsSpec};
pub use bad_words::{BadWords, BadWordsSpec};
#[cfg(feature = "tokenizers")]
pub use ban_strings::{BanStrings, BanStringsSpec};
pub use ban_tokens::{BanTokens, BanTokensSpec};
pub use bitmask::{BitmaskSpec, CallerBitmask};
pub use cite_from_prompt::{CiteFromPrompt, CiteFromPromptSpec};
pub use clock::{Clock, ManualClock, SystemClock};
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
pub use inf_nan_remove::{InfNanRemove, InfNanRemoveSpec};
#[cfg(feature = "grammar")]
pub use lazy_grammar::{LazyGrammar, LazyGrammarSpec, LazyTrigger};
pub use log_softmax::{LogSoftmax, LogSoftmaxSpec};
pub(crate) use logit_bias::check_bias;
pub use logit_bias::{LogitBias, LogitBiasSpec, MAX_BIAS};
pub use max_time::{MaxTime, MaxTimeSpec};
pub use min_length::{MinLength, MinLengthSpec};
pub use min_new_tokens::{MinNewTokens, MinNewTokensSpec};
pub use mirostat::{Mirostat, MirostatSpec};
pub use multiple_choice::{MultipleChoice, MultipleChoiceSpec};
pub use no_repeat_ngram::{NoRepeatNGram, NoRepeatNGramSpec};
pub use p_less::PLessSpec;
pub use presence_penalty::{PresencePenalty, PresencePenaltySpec};
pub use prevent_hallucination::{PreventHallucination, PreventHallucinationSpec};
pub use repetition_detection::{RepetitionDetection, RepetitionDetectionSpec};
pub use repetition_penalty::{RepetitionPenalty, RepetitionPenaltySpec, Scope};
pub use sequence_bias::{SequenceBias, SequenceBiasSpec};
pub use smoothing::{Smoothing, SmoothingSpec};
pub use suppress_tokens_at_begin::{SuppressTokensAtBegin, SuppressTokensAtBeginSpec};
pub use synthid_watermark::{SynthIdWatermark, SynthIdWatermarkSpec};
pub use tail_free::TailFreeSpec;
pub use temperature::{Temperature, TemperatureSpec, MIN_TEMPERATURE};
pub use thinking_budget::{ThinkingBudget, ThinkingBudgetSpec, CHECKED_TAIL};
pub use thinking_config::{
    get_thinking_token_config, lookup_thinking_token_config, register_thinking_token_config,
    thinking_token_table, ThinkingTokenConfig,
};
pub use token_text::{TextOrId, TextOrIds};
pub use top_a::TopASpec;
pub use top_h::TopHSpec;
pub use top_n_sigma::TopNSigmaSpec;
pub use trigger_phrase::{TriggerPhrase, TriggerPhraseSpec};
pub use truncate::{
    EpsilonCutoffSpec, EtaCutoffSpec, MinPSpec, TopKSpec, TopPSpec, Truncate, TypicalPSpec,
};
pub use watermark::{SeedingSchemeSpec, Watermark, WatermarkSpec};
pub use xtc::{Xtc, XtcSpec};

pub use crate::processor::{process_row, Checkpoint, LogitsProcessor};
pub(crate) use bans::{push_bans, MASK_FROM};
#[cfg(test)]
use order::kind_rank;
pub use order::{canonical_order, check_order, check_prompt_len, user_steps_at, USER_STEPS_BEFORE};

use crate::spec::Kind;

/// Every spec kind, by its `"kind"` name, in the canonical order ([`canonical_order`]), each line
/// also saying what the kind is (`.history_free()`, `.masking()`, `.truncating()`,
/// `.with_token_texts()`, `.editing_on_host()`; see [`Kind`]): the one list every question about
/// kinds is asked of.
/// Adding a processor: its file (the processor, its spec struct and `KindSpec`), one line here,
/// its docs and its tests (docs/core.md).
pub(crate) static KINDS: &[Kind] = &[
    // Biases and penalties: they move logits, and never to or from -inf.
    Kind::new::<LogitBiasSpec>("logit_bias").history_free(),
    Kind::new::<SequenceBiasSpec>("sequence_bias"),
    Kind::new::<RepetitionPenaltySpec>("repetition_penalty"),
    Kind::new::<FrequencyPenaltySpec>("frequency_penalty"),
    Kind::new::<PresencePenaltySpec>("presence_penalty"),
    Kind::new::<DrySpec>("dry").with_token_texts(),
    Kind::new::<ExponentialDecayLengthPenaltySpec>("exponential_decay_length_penalty"),
    // logits-processor-zoo's biases: the end token by length, the prompt's tokens.
    Kind::new::<GenLengthSpec>("gen_length"),
    Kind::new::<CiteFromPromptSpec>("cite_from_prompt"),
    // Bans and allowed ids, then the kinds that force a token.
    Kind::new::<BanTokensSpec>("ban_tokens").history_free(),
    Kind::new::<BadWordsSpec>("bad_words"),
    #[cfg(feature = "tokenizers")]
    Kind::new::<BanStringsSpec>("ban_strings").with_token_texts(),
    Kind::new::<NoRepeatNGramSpec>("no_repeat_ngram"),
    Kind::new::<MinLengthSpec>("min_length"),
    Kind::new::<MinNewTokensSpec>("min_new_tokens"),
    Kind::new::<SuppressTokensAtBeginSpec>("suppress_tokens_at_begin"),
    Kind::new::<AllowedTokenIdsSpec>("allowed_token_ids")
        .history_free()
        .masking(),
    Kind::new::<MultipleChoiceSpec>("multiple_choice")
        .masking()
        .with_token_texts(),
    // Grammars and the caller's own bitmask: masks, like the allowed ids.
    #[cfg(feature = "grammar")]
    Kind::new::<GrammarSpec>("grammar")
        .masking()
        .with_token_texts(),
    #[cfg(feature = "grammar")]
    Kind::new::<JsonObjectSpec>("json_object")
        .masking()
        .with_token_texts(),
    #[cfg(feature = "grammar")]
    Kind::new::<LazyGrammarSpec>("lazy_grammar")
        .masking()
        .with_token_texts(),
    Kind::new::<BitmaskSpec>("bitmask").history_free().masking(),
    Kind::new::<ForcedBosSpec>("forced_bos"),
    Kind::new::<ForcedEosSpec>("forced_eos"),
    // NaN and infinities made finite where transformers' `remove_invalid_values` runs them,
    // after its forced BOS and EOS: a banned token ends at the row type's smallest value.
    Kind::new::<InfNanRemoveSpec>("inf_nan_remove").history_free(),
    Kind::new::<RepetitionDetectionSpec>("repetition_detection"),
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
    Kind::new::<SmoothingSpec>("smoothing").history_free(),
    Kind::new::<TemperatureSpec>("temperature").history_free(),
    Kind::new::<DynamicTemperatureSpec>("dynamic_temperature")
        .history_free()
        .editing_on_host(),
    // Truncation, in transformers' order, then the samplers of llama.cpp and
    // text-generation-webui, XTC last (it removes the most likely tokens that the others keep).
    Kind::new::<TopKSpec>("top_k").history_free().truncating(),
    Kind::new::<TopPSpec>("top_p").history_free().truncating(),
    Kind::new::<MinPSpec>("min_p").history_free().truncating(),
    Kind::new::<TypicalPSpec>("typical_p")
        .history_free()
        .truncating(),
    Kind::new::<EpsilonCutoffSpec>("epsilon_cutoff")
        .history_free()
        .truncating(),
    Kind::new::<EtaCutoffSpec>("eta_cutoff")
        .history_free()
        .truncating(),
    Kind::new::<TopNSigmaSpec>("top_n_sigma")
        .history_free()
        .truncating()
        .editing_on_host(),
    Kind::new::<TopASpec>("top_a").history_free().truncating(),
    Kind::new::<PLessSpec>("p_less").history_free().truncating(),
    Kind::new::<TopHSpec>("top_h")
        .history_free()
        .truncating()
        .editing_on_host(),
    Kind::new::<TailFreeSpec>("tail_free")
        .history_free()
        .truncating()
        .editing_on_host(),
    Kind::new::<XtcSpec>("xtc").truncating(),
    // Mirostat last: it reads the row the others left and its next step reads what it kept.
    Kind::new::<MirostatSpec>("mirostat")
        .truncating()
        .editing_on_host(),
    // adaptive-p last too, as llama.cpp chains it: its next step reads the row its pass read.
    Kind::new::<AdaptivePSpec>("adaptive_p"),
    // The watermark after every warper, as transformers runs it: its bias is the last word on
    // the row the sampler reads, and the self-hash scheme reads the row they left.
    Kind::new::<WatermarkSpec>("watermark").editing_on_host(),
    // Watermarking after every other edit of the logits, as transformers runs it (before its
    // normalization): the watermark reads the distribution the sampler would.
    Kind::new::<SynthIdWatermarkSpec>("synthid_watermark").editing_on_host(),
    // The row as log-probabilities, after everything, as transformers runs its normalization.
    Kind::new::<LogSoftmaxSpec>("log_softmax").history_free(),
];
