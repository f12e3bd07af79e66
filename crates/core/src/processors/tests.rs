//! Properties every kind shares: resume safety, the canonical order, spec errors naming fields.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::spec::{kind, parse_pipeline, reads_history, EngineContext, ProcessorSpec};

const VOCAB: u32 = 12;

fn context() -> EngineContext {
    EngineContext {
        vocab_size: Some(VOCAB as usize),
        ..Default::default()
    }
}

fn realize(spec: &ProcessorSpec, prompt_len: usize) -> Box<dyn LogitsProcessor> {
    spec.realize(&context(), prompt_len).unwrap()
}

/// What a history does between two steps.
#[derive(Debug, Clone)]
enum Move {
    /// Decode steps: new ids appended.
    Extend(Vec<u32>),
    /// A step planned and taken back (another row failed), then ids appended.
    Undone(Vec<u32>),
    /// Rolled back by some ids.
    Rewind(usize),
    /// Another request's ids.
    Replace(Vec<u32>),
}

impl Move {
    /// The history after this move (a step taken back leaves the ids as they were).
    fn apply(&self, ids: &mut Vec<u32>) {
        match self {
            Move::Extend(new) | Move::Undone(new) => ids.extend(new),
            Move::Rewind(n) => ids.truncate(ids.len().saturating_sub(*n)),
            Move::Replace(new) => ids.clone_from(new),
        }
    }
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    // Ids 12 and 13 are outside the vocab: processors that read history ids must skip them.
    let ids = || {
        proptest::collection::vec(
            prop_oneof![9 => 0u32..6, 3 => 6u32..12, 1 => 12u32..14],
            0..4,
        )
    };
    proptest::collection::vec(
        prop_oneof![
            8 => ids().prop_map(Move::Extend),
            2 => ids().prop_map(Move::Undone),
            1 => (0usize..4).prop_map(Move::Rewind),
            1 => proptest::collection::vec(0u32..6, 0..12).prop_map(Move::Replace),
        ],
        1..40,
    )
}

/// One processor runs through every history in turn; at each, a processor realized fresh from
/// the spec and handed the history (a request admitted mid-generation, or moved to another
/// worker) must plan exactly the same edits.
fn plans_as_if_fresh(
    spec: &Value,
    prompt_len: usize,
    moves: &[Move],
) -> std::result::Result<(), TestCaseError> {
    let spec = ProcessorSpec::from_value(spec).unwrap();
    let mut running = realize(&spec, prompt_len);
    let mut ids: Vec<u32> = (0..prompt_len as u32).map(|i| i % 5).collect();
    let (mut got, mut want) = (RowPlan::new(), RowPlan::new());
    for step in moves {
        if let Move::Undone(_) = step {
            got.clear();
            running.plan(&ids, &mut got).unwrap();
            running.undo();
        }
        step.apply(&mut ids);
        got.clear();
        want.clear();
        running.plan(&ids, &mut got).unwrap();
        realize(&spec, prompt_len).plan(&ids, &mut want).unwrap();
        prop_assert_eq!(&got, &want, "{} after {:?}", spec.to_value(), ids);
    }
    Ok(())
}

fn token() -> impl Strategy<Value = u32> {
    0u32..VOCAB
}

fn tokens(max: usize) -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(token(), 1..max)
}

fn sequences() -> impl Strategy<Value = Vec<Vec<u32>>> {
    proptest::collection::vec(proptest::collection::vec(0u32..6, 1..4), 1..6)
}

fn min_keep() -> impl Strategy<Value = u32> {
    1u32..4
}

/// A penalty's window: absent, -1 (all), 0 (none) or a few ids.
fn window() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![Just(None), Just(Some(-1)), (0i64..6).prop_map(Some)]
}

fn with_window(mut spec: Value, window: Option<i64>) -> Value {
    if let Some(w) = window {
        spec["window"] = json!(w);
    }
    spec
}

/// A spec of every kind, with parameters in range.
fn spec_of(kind: &'static str) -> BoxedStrategy<Value> {
    match kind {
        "top_k" => (1u32..6, min_keep())
            .prop_map(|(k, m)| json!({"kind": "top_k", "k": k, "min_tokens_to_keep": m}))
            .boxed(),
        "top_p" => (0.05f64..1.0, min_keep())
            .prop_map(|(p, m)| json!({"kind": "top_p", "p": p, "min_tokens_to_keep": m}))
            .boxed(),
        "min_p" => (0.0f64..1.0, min_keep())
            .prop_map(|(p, m)| json!({"kind": "min_p", "p": p, "min_tokens_to_keep": m}))
            .boxed(),
        "typical_p" => (0.05f64..0.95, min_keep())
            .prop_map(|(p, m)| json!({"kind": "typical_p", "mass": p, "min_tokens_to_keep": m}))
            .boxed(),
        "epsilon_cutoff" => (0.001f64..0.5, min_keep())
            .prop_map(|(e, m)| json!({"kind": "epsilon_cutoff", "epsilon": e, "min_tokens_to_keep": m}))
            .boxed(),
        "eta_cutoff" => (0.001f64..0.5, min_keep())
            .prop_map(|(e, m)| json!({"kind": "eta_cutoff", "epsilon": e, "min_tokens_to_keep": m}))
            .boxed(),
        "repetition_penalty" => (0.3f64..3.0, prop_oneof![Just("all"), Just("output"), Just("prompt")], window())
            .prop_map(|(p, s, w)| with_window(json!({"kind": "repetition_penalty", "penalty": p, "scope": s}), w))
            .boxed(),
        "frequency_penalty" => (-2.0f64..2.0, window())
            .prop_map(|(p, w)| with_window(json!({"kind": "frequency_penalty", "penalty": p}), w))
            .boxed(),
        "presence_penalty" => (-2.0f64..2.0, window())
            .prop_map(|(p, w)| with_window(json!({"kind": "presence_penalty", "penalty": p}), w))
            .boxed(),
        "no_repeat_ngram" => (1u32..5)
            .prop_map(|n| json!({"kind": "no_repeat_ngram", "n": n}))
            .boxed(),
        "bad_words" => sequences()
            .prop_map(|s| json!({"kind": "bad_words", "sequences": s}))
            .boxed(),
        "sequence_bias" => proptest::collection::vec(
            (proptest::collection::vec(0u32..6, 1..4), -4.0f64..4.0),
            1..6,
        )
        .prop_map(|b| json!({"kind": "sequence_bias", "biases": b}))
        .boxed(),
        "allowed_token_ids" => tokens(6)
            .prop_map(|t| json!({"kind": "allowed_token_ids", "token_ids": t}))
            .boxed(),
        "min_new_tokens" => (0usize..8, tokens(3))
            .prop_map(|(n, e)| json!({"kind": "min_new_tokens", "min_new_tokens": n, "eos_token_ids": e}))
            .boxed(),
        "min_length" => (0usize..12, tokens(3))
            .prop_map(|(n, e)| json!({"kind": "min_length", "min_length": n, "eos_token_ids": e}))
            .boxed(),
        "exponential_decay_length_penalty" => (0usize..6, 0.5f64..2.0, tokens(3))
            .prop_map(|(s, f, e)| {
                json!({"kind": "exponential_decay_length_penalty", "start_index": s,
                       "decay_factor": f, "eos_token_ids": e})
            })
            .boxed(),
        "forced_bos" => token()
            .prop_map(|b| json!({"kind": "forced_bos", "bos_token_id": b}))
            .boxed(),
        "forced_eos" => (0usize..12, tokens(3))
            .prop_map(|(n, e)| json!({"kind": "forced_eos", "max_length": n, "eos_token_ids": e}))
            .boxed(),
        "repetition_detection" => (0usize..3, 1usize..5, 2usize..4, tokens(3))
            .prop_map(|(min, max, c, e)| {
                json!({"kind": "repetition_detection", "min_pattern_size": min.min(max),
                       "max_pattern_size": max, "min_count": c, "eos_token_ids": e})
            })
            .boxed(),
        "suppress_tokens_at_begin" => (tokens(4), proptest::option::of(0usize..10))
            .prop_map(|(t, b)| match b {
                Some(b) => json!({"kind": "suppress_tokens_at_begin", "token_ids": t, "begin_index": b}),
                None => json!({"kind": "suppress_tokens_at_begin", "token_ids": t}),
            })
            .boxed(),
        "ban_tokens" => tokens(5)
            .prop_map(|t| json!({"kind": "ban_tokens", "token_ids": t}))
            .boxed(),
        "logit_bias" => (token(), -3.0f64..3.0)
            .prop_map(|(t, b)| json!({"kind": "logit_bias", "bias": {t.to_string(): b}}))
            .boxed(),
        "temperature" => (0.2f64..3.0)
            .prop_map(|t| json!({"kind": "temperature", "temperature": t}))
            .boxed(),
        "forced_sequence" => tokens(4)
            .prop_map(|t| json!({"kind": "forced_sequence", "token_ids": t, "eos_token_id": 1, "position": "tokens"}))
            .boxed(),
        "thinking_budget" => (0usize..6)
            .prop_map(|m| json!({"kind": "thinking_budget", "max_thinking_tokens": m,
                                 "start_token_id": 1, "end_token_id": 2, "newline_token_id": 3}))
            .boxed(),
        // Nothing allowed until the caller's mask is copied in: the same plan every step.
        "bitmask" => Just(json!({"kind": "bitmask"})).boxed(),
        "dry" => (
            0.0f64..2.0,
            1.0f64..3.0,
            0u32..4,
            prop_oneof![Just(-1i64), 0i64..20],
            proptest::collection::vec(proptest::collection::vec(0u32..6, 1..3), 0..3),
        )
            .prop_map(|(m, b, a, n, breakers)| {
                json!({"kind": "dry", "multiplier": m, "base": b, "allowed_length": a,
                       "penalty_last_n": n, "sequence_breaker_ids": breakers})
            })
            .boxed(),
        "mirostat" => (1u32..3, 0.5f64..8.0, 0.0f64..1.0, 2u32..50, proptest::option::of(0.0f64..12.0))
            .prop_map(|(v, tau, eta, m, mu)| {
                let mut spec = json!({"kind": "mirostat", "version": v, "tau": tau, "eta": eta, "m": m});
                if let Some(mu) = mu {
                    spec["mu"] = json!(mu);
                }
                spec
            })
            .boxed(),
        "adaptive_p" => (-0.5f64..1.2, 0.0f64..1.0)
            .prop_map(|(t, d)| json!({"kind": "adaptive_p", "target": t, "decay": d}))
            .boxed(),
        "top_n_sigma" => (-1.0f64..3.0)
            .prop_map(|n| json!({"kind": "top_n_sigma", "n": n}))
            .boxed(),
        "top_a" => (0.0f64..1.0, min_keep())
            .prop_map(|(a, m)| json!({"kind": "top_a", "a": a, "min_tokens_to_keep": m}))
            .boxed(),
        "p_less" => (min_keep(), any::<bool>())
            .prop_map(|(m, n)| json!({"kind": "p_less", "min_tokens_to_keep": m, "normalized": n}))
            .boxed(),
        "top_h" => (0.01f64..1.0).prop_map(|h| json!({"kind": "top_h", "top_h": h})).boxed(),
        "tail_free" => (0.0f64..1.0, min_keep())
            .prop_map(|(z, m)| json!({"kind": "tail_free", "z": z, "min_tokens_to_keep": m}))
            .boxed(),
        "xtc" => (0.0f64..1.0, 0.0f64..0.6, min_keep(), any::<u64>())
            .prop_map(|(p, t, m, seed)| {
                json!({"kind": "xtc", "probability": p, "threshold": t, "min_keep": m, "seed": seed})
            })
            .boxed(),
        "dynamic_temperature" => (0.0f64..2.0, -0.5f64..1.5, 0.0f64..3.0)
            .prop_map(|(t, r, e)| {
                json!({"kind": "dynamic_temperature", "temperature": t, "range": r, "exponent": e})
            })
            .boxed(),
        "log_softmax" => Just(json!({"kind": "log_softmax"})).boxed(),
        "inf_nan_remove" => Just(json!({"kind": "inf_nan_remove"})).boxed(),
        "synthid_watermark" => (
            1usize..5,
            proptest::collection::vec(any::<i64>(), 1..4),
            prop::sample::select(vec![1u64, 3, 1000, 1 << 16]),
            any::<u64>(),
            0usize..6,
            any::<bool>(),
        )
            .prop_map(|(n, keys, size, seed, history, skip)| {
                json!({"kind": "synthid_watermark", "ngram_len": n, "keys": keys,
                       "sampling_table_size": size, "sampling_table_seed": seed,
                       "context_history_size": history, "skip_first_ngram_calls": skip})
            })
            .boxed(),
        // A few keys: each self-hash key's table is a randperm of 1,000,003, cached.
        "watermark" => (0.05f64..0.95, -3.0f64..3.0, proptest::sample::select(vec![15485863i64, 7, -3]),
                        any::<bool>(), 1usize..4)
            .prop_map(|(r, b, key, selfhash, width)| {
                json!({"kind": "watermark", "greenlist_ratio": r, "bias": b, "hashing_key": key,
                       "seeding_scheme": if selfhash { "selfhash" } else { "lefthash" },
                       "context_width": width})
            })
            .boxed(),
        "smoothing" => (0.0f64..3.0, 0.0f64..4.0)
            .prop_map(|(f, c)| json!({"kind": "smoothing", "factor": f, "curve": c}))
            .boxed(),
        "force_last_phrase" => (tokens(4), token())
            .prop_map(|(p, e)| json!({"kind": "force_last_phrase", "phrase": p, "eos_token_id": e}))
            .boxed(),
        "gen_length" => (-2.0f64..2.0, 0u32..4, any::<bool>(), token(), proptest::collection::vec(token(), 1..3))
            .prop_map(|(f, p, c, b, ends)| {
                json!({"kind": "gen_length", "boost_factor": f, "p": p, "complete_sentences": c,
                       "boost_token": b, "sentence_end_ids": ends})
            })
            .boxed(),
        // A limit no test reaches: a fresh processor starts its clock again (documented).
        "max_time" => (1e6f64..1e9, any::<bool>(), token(), proptest::collection::vec(token(), 1..3))
            .prop_map(|(t, c, b, ends)| {
                json!({"kind": "max_time", "max_time": t, "complete_sentences": c,
                       "boost_token": b, "sentence_end_ids": ends})
            })
            .boxed(),
        // The trigger token only: a time trigger restarts with a fresh processor (documented).
        "trigger_phrase" => (tokens(4), token(), 0u32..3, any::<bool>())
            .prop_map(|(p, t, c, a)| {
                json!({"kind": "trigger_phrase", "phrase": p, "trigger_token_phrase": t,
                       "trigger_count": c, "trigger_after": a})
            })
            .boxed(),
        "prevent_hallucination" => (0.0f64..1.0, 0u32..3, tokens(4))
            .prop_map(|(m, t, p)| {
                json!({"kind": "prevent_hallucination", "minp": m, "tolerate": t, "phrase": p})
            })
            .boxed(),
        "cite_from_prompt" => (-2.0f64..2.0, any::<bool>(), -2.0f64..2.0, token())
            .prop_map(|(b, e, c, eos)| {
                json!({"kind": "cite_from_prompt", "boost_factor": b, "boost_eos": e,
                       "conditional_boost_factor": c, "eos_token_id": eos})
            })
            .boxed(),
        "multiple_choice" => tokens(5)
            .prop_map(|c| json!({"kind": "multiple_choice", "choices": c}))
            .boxed(),
        other => panic!("no strategy for {other}"),
    }
}

/// Kinds realized from the engine's tokenizer, tested with a real one (tests/grammar.rs).
fn needs_tokenizer(kind: &str) -> bool {
    matches!(
        kind,
        "hello_world" | "grammar" | "json_object" | "ban_strings" | "lazy_grammar"
    )
}

/// A resume test per kind, and the list of the kinds that have one ([`RESUME_TESTED`]).
macro_rules! resume_safe {
    ($($name:ident: $kind:literal),* $(,)?) => {
        proptest! {
            $(
                #[test]
                fn $name(spec in spec_of($kind), prompt_len in 0usize..6, moves in moves()) {
                    plans_as_if_fresh(&spec, prompt_len, &moves)?;
                }
            )*
        }
        /// The kinds with a resume test above, from the same list.
        const RESUME_TESTED: &[&str] = &[$($kind),*];
    };
}

resume_safe! {
    resume_safe_top_k: "top_k",
    resume_safe_top_p: "top_p",
    resume_safe_min_p: "min_p",
    resume_safe_typical_p: "typical_p",
    resume_safe_epsilon_cutoff: "epsilon_cutoff",
    resume_safe_eta_cutoff: "eta_cutoff",
    resume_safe_repetition_penalty: "repetition_penalty",
    resume_safe_frequency_penalty: "frequency_penalty",
    resume_safe_presence_penalty: "presence_penalty",
    resume_safe_no_repeat_ngram: "no_repeat_ngram",
    resume_safe_bad_words: "bad_words",
    resume_safe_sequence_bias: "sequence_bias",
    resume_safe_allowed_token_ids: "allowed_token_ids",
    resume_safe_min_new_tokens: "min_new_tokens",
    resume_safe_min_length: "min_length",
    resume_safe_exponential_decay_length_penalty: "exponential_decay_length_penalty",
    resume_safe_forced_bos: "forced_bos",
    resume_safe_forced_eos: "forced_eos",
    resume_safe_repetition_detection: "repetition_detection",
    resume_safe_suppress_tokens_at_begin: "suppress_tokens_at_begin",
    resume_safe_forced_sequence_by_tokens: "forced_sequence",
    resume_safe_thinking_budget: "thinking_budget",
    resume_safe_bitmask: "bitmask",
    // Stateless kinds: the same test shows they are (a plan that depended on an earlier step
    // would differ from a fresh processor's).
    resume_safe_ban_tokens: "ban_tokens",
    resume_safe_logit_bias: "logit_bias",
    resume_safe_temperature: "temperature",
    resume_safe_dry: "dry",
    resume_safe_top_n_sigma: "top_n_sigma",
    resume_safe_mirostat_without_a_pass: "mirostat",
    resume_safe_adaptive_p_without_a_pass: "adaptive_p",
    resume_safe_top_a: "top_a",
    resume_safe_p_less: "p_less",
    resume_safe_tail_free: "tail_free",
    resume_safe_top_h: "top_h",
    resume_safe_xtc: "xtc",
    resume_safe_dynamic_temperature: "dynamic_temperature",
    resume_safe_smoothing: "smoothing",
    resume_safe_log_softmax: "log_softmax",
    resume_safe_inf_nan_remove: "inf_nan_remove",
    resume_safe_synthid_watermark: "synthid_watermark",
    resume_safe_watermark: "watermark",
    resume_safe_force_last_phrase_without_a_pass: "force_last_phrase",
    resume_safe_gen_length: "gen_length",
    resume_safe_max_time_before_its_limit: "max_time",
    resume_safe_trigger_phrase_without_a_pass: "trigger_phrase",
    resume_safe_prevent_hallucination_without_a_pass: "prevent_hallucination",
    resume_safe_cite_from_prompt: "cite_from_prompt",
    resume_safe_multiple_choice: "multiple_choice",
}

/// Kinds whose state is what their passes saw, which no history tells (mirostat's `mu`,
/// adaptive-p's running average, a clock): after a replaced history they keep it, as documented.
fn state_from_passes(kind: &str) -> bool {
    matches!(kind, "mirostat" | "adaptive_p" | "max_time")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// A processor that saw its passes (the triggers that fired, the tokens they forced), then
    /// is given a history that does not extend the last (another request's ids, a rewrite), plans
    /// as a fresh processor given that history: nothing counted from the old history survives.
    #[test]
    fn a_replaced_history_plans_as_a_fresh_processor_after_passes(
        spec in proptest::sample::select(
            kinds_where(|k| !state_from_passes(k.name))
        ).prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        moves in moves(),
        rows in proptest::collection::vec(
            proptest::collection::vec(-4.0f32..4.0, VOCAB as usize), 1..8),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        let mut running = realize(&spec, prompt_len);
        let mut ids: Vec<u32> = (0..prompt_len as u32).map(|i| i % 5).collect();
        let mut plan = RowPlan::new();
        for (i, step) in moves.iter().enumerate() {
            let row = &rows[i % rows.len()];
            if let Move::Undone(_) = step {
                plan.clear();
                running.plan(&ids, &mut plan).unwrap();
                running.undo();
            }
            let before = ids.clone();
            step.apply(&mut ids);
            plan.clear();
            running.plan(&ids, &mut plan).unwrap();
            let (mut got, mut want) = (row.clone(), row.clone());
            plan.apply(&mut got).unwrap();
            if !ids.starts_with(&before) {
                let mut fresh = RowPlan::new();
                realize(&spec, prompt_len).plan(&ids, &mut fresh).unwrap();
                fresh.apply(&mut want).unwrap();
                let bits = |r: &[f32]| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want), "{} after {:?} then {:?}",
                    spec.to_value(), before, ids);
            }
        }
    }
}

#[test]
fn every_kind_has_a_strategy_and_a_resume_test() {
    // `spec_of` panics for a kind it does not know: a new kind must be added to these tests.
    let runner = &mut proptest::test_runner::TestRunner::default();
    let untested: Vec<&str> = crate::spec::kinds()
        .filter(|&k| !needs_tokenizer(k))
        .inspect(|&k| drop(spec_of(k).new_tree(runner).unwrap()))
        .filter(|k| !RESUME_TESTED.contains(k))
        .collect();
    // The kinds that read the tokenizer have theirs with a real one (tests/grammar.rs: rollback
    // and undo; hello_world is a forced sequence).
    assert!(untested.is_empty(), "no resume test: {untested:?}");
}

/// Each kind's spec in a random set, in the canonical order.
fn spec_set() -> impl Strategy<Value = Vec<Value>> {
    let kinds: Vec<&'static str> = crate::spec::kinds()
        .filter(|&k| !needs_tokenizer(k))
        .collect();
    proptest::sample::subsequence(kinds.clone(), 1..kinds.len())
        .prop_flat_map(|kinds| kinds.into_iter().map(spec_of).collect::<Vec<_>>())
        .prop_shuffle()
}

proptest! {
    /// Applied step by step in the canonical order, no step brings back a token an earlier one
    /// set to `-inf`, except a token a step sets by value (a forced EOS, the thinking budget's
    /// end token).
    #[test]
    fn in_the_canonical_order_no_step_brings_back_a_banned_token(
        specs in spec_set(),
        prompt_len in 0usize..6,
        ids in proptest::collection::vec(0u32..8, 0..14),
        row in proptest::collection::vec(-8.0f32..8.0, VOCAB as usize),
    ) {
        let specs = parse_pipeline(&Value::Array(specs).to_string()).unwrap();
        let ordered = canonical_order(specs);
        prop_assert!(check_order(ordered.iter().map(|s| (s.position(), s))).is_ok());
        let ranks: Vec<usize> = ordered.iter().map(|s| kind_rank(s.kind())).collect();
        prop_assert!(ranks.windows(2).all(|w| w[0] <= w[1]));
        let ids: Vec<u32> = (0..prompt_len as u32).chain(ids).collect();
        let mut row = row;
        for spec in &ordered {
            let mut plan = RowPlan::new();
            realize(spec, prompt_len).plan(&ids, &mut plan).unwrap();
            let set: Vec<u32> = plan
                .edits()
                .iter()
                .filter_map(|e| match *e {
                    Edit::Set { token, .. } => Some(token),
                    Edit::Force { token, value: ForcedValue::Set(_) } => Some(token),
                    _ => None,
                })
                .collect();
            if !set.is_empty() {
                prop_assert!(matches!(spec.kind(), "forced_bos" | "forced_eos" | "repetition_detection" | "thinking_budget"), "{}", spec.kind());
            }
            let before = row.clone();
            plan.apply(&mut row).unwrap();
            for (i, (&b, &a)) in before.iter().zip(&row).enumerate() {
                if b == f32::NEG_INFINITY && !set.contains(&(i as u32)) {
                    // A whole-row edit (inf/NaN removal, a watermark) gives it the smallest
                    // finite value, as transformers does: never sampled beside a finite logit.
                    if finite_izes(&plan) {
                        prop_assert!(a == f32::NEG_INFINITY || a == f32::MIN, "{} gave {} {}", spec.kind(), i, a);
                    } else {
                        prop_assert_eq!(a, f32::NEG_INFINITY, "{} brought back {}", spec.kind(), i);
                    }
                }
            }
        }
    }
}

/// Whether the plan holds a whole-row edit, which gives `-inf` the row type's smallest value.
fn finite_izes(plan: &RowPlan) -> bool {
    plan.edits().iter().any(|e| matches!(e, Edit::Whole(_)))
}

#[test]
fn user_steps_go_before_the_thinking_budget() {
    let specs = parse_pipeline(
        r#"[{"kind": "top_p", "p": 0.9}, {"kind": "temperature", "temperature": 0.7},
            {"kind": "repetition_penalty", "penalty": 1.1},
            {"kind": "ban_tokens", "token_ids": [3]}, {"kind": "min_p", "p": 0.1},
            {"kind": "top_k", "k": 5}]"#,
    )
    .unwrap();
    let ordered = canonical_order(specs);
    let kinds: Vec<&str> = ordered.iter().map(|s| s.kind()).collect();
    assert_eq!(
        kinds,
        [
            "repetition_penalty",
            "ban_tokens",
            "temperature",
            "top_k",
            "top_p",
            "min_p"
        ]
    );
    assert_eq!(user_steps_at(&ordered), 2);
    assert_eq!(user_steps_at(&ordered[..2]), 2);
}

fn field_of(error: crate::Error) -> String {
    match error {
        crate::Error::InvalidSpec { field, .. }
        | crate::Error::TooLarge { field, .. }
        | crate::Error::TokenOutOfVocab { field, .. } => field,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn every_new_kind_parses_and_writes_back_what_it_read() {
    let specs = parse_pipeline(
        r#"[{"kind": "top_k", "k": 5},
            {"kind": "top_p", "p": 0.9, "min_tokens_to_keep": 2},
            {"kind": "min_p", "p": 0.0},
            {"kind": "typical_p", "mass": 0.5},
            {"kind": "epsilon_cutoff", "epsilon": 0.001},
            {"kind": "eta_cutoff", "epsilon": 0.001},
            {"kind": "repetition_penalty", "penalty": 1.2, "scope": "output"},
            {"kind": "frequency_penalty", "penalty": -2},
            {"kind": "presence_penalty", "penalty": 2},
            {"kind": "no_repeat_ngram", "n": 3},
            {"kind": "bad_words", "sequences": [[1], [2, 3]]},
            {"kind": "sequence_bias", "biases": [[[1], -1.5], [[2, 3], 2]]},
            {"kind": "allowed_token_ids", "token_ids": [1, 2]},
            {"kind": "min_new_tokens", "min_new_tokens": 3, "eos_token_ids": [2]},
            {"kind": "min_length", "min_length": 3, "eos_token_ids": [2, 3]},
            {"kind": "exponential_decay_length_penalty", "start_index": 4, "decay_factor": 1.1,
             "eos_token_ids": [2]},
            {"kind": "forced_eos", "max_length": 20, "eos_token_ids": [2]},
            {"kind": "suppress_tokens_at_begin", "token_ids": [4], "begin_index": 3},
            {"kind": "suppress_tokens_at_begin", "token_ids": [4]},
            {"kind": "repetition_penalty", "penalty": 1.1, "window": 64},
            {"kind": "frequency_penalty", "penalty": 0.5, "window": -1},
            {"kind": "presence_penalty", "penalty": 0.5, "window": 0},
            {"kind": "top_n_sigma", "n": 1.5},
            {"kind": "top_a", "a": 0.2},
            {"kind": "tail_free", "z": 0.95, "min_tokens_to_keep": 2},
            {"kind": "xtc", "probability": 0.5},
            {"kind": "dynamic_temperature", "temperature": 0.8, "range": 0.3},
            {"kind": "smoothing", "factor": 0.3},
            {"kind": "dry", "multiplier": 0.8, "sequence_breaker_ids": [[3], [4, 5]]},
            {"kind": "mirostat", "version": 1, "mu": 7.5},
            {"kind": "adaptive_p", "target": 0.4},
            {"kind": "top_h", "top_h": 0.4}]"#,
    )
    .unwrap();
    for spec in &specs {
        let value = spec.to_value();
        assert_eq!(&ProcessorSpec::from_value(&value).unwrap(), spec, "{value}");
        spec.validate(&context()).unwrap();
    }
    assert_eq!(
        specs[0].to_value(),
        json!({"kind": "top_k", "k": 5, "min_tokens_to_keep": 1})
    );
    assert_eq!(specs[6].to_value()["scope"], "output");
    assert_eq!(specs[19].to_value()["window"], 64);
    assert_eq!(
        specs[25].to_value(),
        json!({"kind": "xtc", "probability": 0.5, "threshold": 0.1, "min_keep": 1, "seed": 0})
    );
    assert_eq!(
        specs[26].to_value(),
        json!({"kind": "dynamic_temperature", "temperature": 0.8, "range": 0.3, "exponent": 1.0})
    );
    assert_eq!(specs[27].to_value()["curve"], 1.0);
    assert_eq!(
        specs[28].to_value(),
        json!({"kind": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2,
               "penalty_last_n": 64, "sequence_breaker_ids": [[3], [4, 5]]})
    );
    assert_eq!(
        specs[29].to_value(),
        json!({"kind": "mirostat", "version": 1, "tau": 5.0, "eta": 0.1, "m": 100, "mu": 7.5})
    );
    assert_eq!(
        specs[30].to_value(),
        json!({"kind": "adaptive_p", "target": 0.4, "decay": 0.9})
    );
}

#[test]
fn bad_values_are_refused_naming_the_field() {
    let cases = [
        (r#"{"kind": "top_k", "k": -2}"#, "k"),
        (r#"{"kind": "top_k", "k": 4294967296}"#, "k"),
        (
            r#"{"kind": "top_k", "k": 3, "min_tokens_to_keep": 0}"#,
            "min_tokens_to_keep",
        ),
        (r#"{"kind": "top_p", "p": -0.1}"#, "p"),
        (r#"{"kind": "top_p", "p": 1.5}"#, "p"),
        (r#"{"kind": "min_p", "p": -0.1}"#, "p"),
        (r#"{"kind": "typical_p", "mass": 0}"#, "mass"),
        (r#"{"kind": "typical_p", "mass": 1.5}"#, "mass"),
        (r#"{"kind": "epsilon_cutoff", "epsilon": 0}"#, "epsilon"),
        (r#"{"kind": "eta_cutoff", "epsilon": 1}"#, "epsilon"),
        (r#"{"kind": "eta_cutoff", "eps": 0.1}"#, "eps"),
        (r#"{"kind": "repetition_penalty", "penalty": 0}"#, "penalty"),
        (
            r#"{"kind": "repetition_penalty", "penalty": 1.1, "scope": "both"}"#,
            "scope",
        ),
        (
            r#"{"kind": "frequency_penalty", "penalty": 1e39}"#,
            "penalty",
        ),
        (
            r#"{"kind": "presence_penalty", "penalty": -1e39}"#,
            "penalty",
        ),
        (r#"{"kind": "no_repeat_ngram", "n": 0}"#, "n"),
        (
            r#"{"kind": "repetition_penalty", "penalty": 1.1, "window": -2}"#,
            "window",
        ),
        (
            r#"{"kind": "frequency_penalty", "penalty": 1, "window": 1.5}"#,
            "window",
        ),
        (r#"{"kind": "top_n_sigma", "n": 1e39}"#, "n"),
        (r#"{"kind": "top_a", "a": 1.5}"#, "a"),
        (r#"{"kind": "tail_free", "z": -0.1}"#, "z"),
        (r#"{"kind": "top_h", "top_h": 0.0}"#, "top_h"),
        (r#"{"kind": "xtc", "probability": 1.1}"#, "probability"),
        (
            r#"{"kind": "xtc", "probability": 1, "threshold": 2}"#,
            "threshold",
        ),
        (
            r#"{"kind": "xtc", "probability": 1, "min_keep": 0}"#,
            "min_keep",
        ),
        (
            r#"{"kind": "dynamic_temperature", "temperature": -1}"#,
            "temperature",
        ),
        (
            r#"{"kind": "dynamic_temperature", "temperature": 1, "exponent": -1}"#,
            "exponent",
        ),
        (r#"{"kind": "smoothing", "factor": -1}"#, "factor"),
        (r#"{"kind": "mirostat", "version": 3}"#, "version"),
        (r#"{"kind": "mirostat", "version": 1, "m": 1}"#, "m"),
        (r#"{"kind": "mirostat", "tau": 1e39}"#, "tau"),
        (r#"{"kind": "adaptive_p", "target": 1e39}"#, "target"),
        (r#"{"kind": "adaptive_p", "decay": 0.5}"#, "target"),
        (
            r#"{"kind": "dry", "multiplier": 1, "penalty_last_n": -2}"#,
            "penalty_last_n",
        ),
        (
            r#"{"kind": "dry", "multiplier": 1, "sequence_breakers": [""]}"#,
            "sequence_breakers[0]",
        ),
        (
            r#"{"kind": "dry", "multiplier": 1, "sequence_breaker_ids": [[1], []]}"#,
            "sequence_breaker_ids[1]",
        ),
        (
            r#"{"kind": "bad_words", "sequences": [[1], []]}"#,
            "sequences[1]",
        ),
        (
            r#"{"kind": "bad_words", "sequences": [[1, -2]]}"#,
            "sequences[0][1]",
        ),
        (
            r#"{"kind": "sequence_bias", "biases": [[[1], 1e300]]}"#,
            "biases[0][1]",
        ),
        (
            r#"{"kind": "sequence_bias", "biases": [[[1], 1.0], [[], 1.0]]}"#,
            "biases[1]",
        ),
        (
            r#"{"kind": "sequence_bias", "biases": [[[1]]]}"#,
            "biases[0]",
        ),
        (
            r#"{"kind": "allowed_token_ids", "token_ids": []}"#,
            "token_ids",
        ),
        (
            r#"{"kind": "min_length", "min_length": 3, "eos_token_ids": []}"#,
            "eos_token_ids",
        ),
        (
            r#"{"kind": "min_new_tokens", "min_new_tokens": 3}"#,
            "eos_token_ids",
        ),
        (
            r#"{"kind": "forced_eos", "max_length": -1, "eos_token_ids": [1]}"#,
            "max_length",
        ),
        (
            r#"{"kind": "exponential_decay_length_penalty", "start_index": 1, "decay_factor": 0,
                "eos_token_ids": [1]}"#,
            "decay_factor",
        ),
        (
            r#"[{"kind": "top_k", "k": 1}, {"kind": "min_p", "p": -1}]"#,
            "[1].p",
        ),
    ];
    for (json, field) in cases {
        assert_eq!(field_of(parse_pipeline(json).unwrap_err()), field, "{json}");
    }
    // Out of the vocab, or text the context has no tokenizer for.
    let out_of_vocab = [
        (
            r#"{"kind": "dry", "multiplier": 1, "sequence_breakers": ["\n"]}"#,
            "sequence_breakers",
        ),
        (
            r#"{"kind": "dry", "multiplier": 1, "sequence_breaker_ids": [[1, 99]]}"#,
            "sequence_breaker_ids[0][1]",
        ),
        (
            r#"{"kind": "bad_words", "sequences": [[1], [2, 12]]}"#,
            "sequences[1][1]",
        ),
        (
            r#"{"kind": "sequence_bias", "biases": [[[1, 99], 1.0]]}"#,
            "biases[0][0][1]",
        ),
        (
            r#"{"kind": "min_length", "min_length": 1, "eos_token_ids": [1, 12]}"#,
            "eos_token_ids[1]",
        ),
        (
            r#"{"kind": "allowed_token_ids", "token_ids": [12]}"#,
            "token_ids[0]",
        ),
    ];
    for (json, field) in out_of_vocab {
        let spec = ProcessorSpec::parse(json).unwrap();
        assert_eq!(
            field_of(spec.validate(&context()).unwrap_err()),
            field,
            "{json}"
        );
    }
}

#[test]
fn spec_numbers_are_read_correctly_rounded() {
    // Halfway between two f32 values to 17 digits: a parser off by one f64 ulp rounds a bias to
    // the wrong f32, where Python and torch read the same text exactly.
    let text = "1.8639519810676575";
    let spec = ProcessorSpec::parse(&format!(
        r#"{{"kind": "temperature", "temperature": {text}}}"#
    ))
    .unwrap();
    let read = spec.to_value()["temperature"].as_f64().unwrap();
    assert_eq!(read.to_bits(), text.parse::<f64>().unwrap().to_bits());
    assert_eq!(read as f32, 1.863_951_9_f32);
}

proptest! {
    /// A kind said to read no history plans the same edits whatever the ids and however many
    /// steps came before: a fresh processor given no ids agrees with a running one at every step.
    #[test]
    fn history_free_kinds_plan_without_the_ids(
        spec in proptest::sample::select(
            crate::spec::kinds().filter(|&k| !reads_history(k)).collect::<Vec<_>>()
        ).prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        moves in moves(),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        let mut running = realize(&spec, prompt_len);
        let mut ids: Vec<u32> = (0..prompt_len as u32).collect();
        let (mut got, mut want) = (RowPlan::new(), RowPlan::new());
        for step in &moves {
            step.apply(&mut ids);
            got.clear();
            want.clear();
            running.plan(&ids, &mut got).unwrap();
            realize(&spec, 0).plan(&Vec::<u32>::new(), &mut want).unwrap();
            prop_assert_eq!(&got, &want, "{} after {:?}", spec.to_value(), ids);
        }
    }
}

proptest! {
    /// A spec that says it does not depend on where the prompt ends plans the same edits
    /// whatever `prompt_len` it was realized with, step after step.
    #[test]
    fn specs_that_need_no_prompt_len_ignore_it(
        spec in proptest::sample::select(
            crate::spec::kinds().filter(|&k| !needs_tokenizer(k)).collect::<Vec<_>>()
        ).prop_flat_map(spec_of),
        prompt_len in 1usize..6,
        moves in moves(),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        prop_assume!(!spec.needs_prompt_len());
        let (mut at_zero, mut at_len) = (realize(&spec, 0), realize(&spec, prompt_len));
        let mut ids: Vec<u32> = (0..prompt_len as u32).map(|i| i % 5).collect();
        let (mut got, mut want) = (RowPlan::new(), RowPlan::new());
        for step in &moves {
            step.apply(&mut ids);
            got.clear();
            want.clear();
            at_len.plan(&ids, &mut got).unwrap();
            at_zero.plan(&ids, &mut want).unwrap();
            prop_assert_eq!(&got, &want, "{} after {:?}", spec.to_value(), ids);
        }
    }
}

#[test]
fn a_spec_that_needs_prompt_len_is_refused_without_it() {
    let specs = parse_pipeline(
        r#"[{"kind": "repetition_penalty", "penalty": 1.2},
            {"kind": "min_new_tokens", "min_new_tokens": 2, "eos_token_ids": [1]}]"#,
    )
    .unwrap();
    let with_places = || specs.iter().map(|s| (s.position(), s));
    match check_prompt_len(with_places(), None) {
        Err(crate::Error::InvalidArgument { field, message }) => {
            assert_eq!(field, "prompt_len");
            assert!(message.contains("[1] 'min_new_tokens'"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    check_prompt_len(with_places(), Some(0)).unwrap();
    check_prompt_len(with_places().take(1), None).unwrap();
    // The kinds whose meaning moves with the prompt's end, by their settings.
    for (json, needs) in [
        (
            r#"{"kind": "repetition_penalty", "penalty": 1.2, "scope": "output"}"#,
            true,
        ),
        (
            r#"{"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 2}"#,
            false,
        ),
        (
            r#"{"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 2, "position": "tokens"}"#,
            true,
        ),
        (
            r#"{"kind": "suppress_tokens_at_begin", "token_ids": [1], "begin_index": 3}"#,
            false,
        ),
        (
            r#"{"kind": "suppress_tokens_at_begin", "token_ids": [1]}"#,
            true,
        ),
        (r#"{"kind": "frequency_penalty", "penalty": 0.5}"#, true),
        (
            r#"{"kind": "min_length", "min_length": 3, "eos_token_ids": [1]}"#,
            false,
        ),
    ] {
        let spec = ProcessorSpec::parse(json).unwrap();
        assert_eq!(spec.needs_prompt_len(), needs, "{json}");
    }
}

#[test]
fn history_free_kinds_are_kinds() {
    assert!(crate::spec::kinds().any(|k| !reads_history(k)));
    assert!(reads_history("forced_sequence") && reads_history("no such kind"));
}

/// The registered kinds that `spec_of` makes specs for, whose registry entry answers `question`.
fn kinds_where(question: fn(&crate::spec::Kind) -> bool) -> Vec<&'static str> {
    KINDS
        .iter()
        .filter(|k| !needs_tokenizer(k.name) && question(k))
        .map(|k| k.name)
        .collect()
}

/// The tokens a fresh processor of `spec` leaves finite in `row`, given `ids`.
fn finite_after(spec: &ProcessorSpec, prompt_len: usize, ids: &[u32], row: &[f32]) -> Vec<usize> {
    let mut plan = RowPlan::new();
    realize(spec, prompt_len)
        .plan(&ids.to_vec(), &mut plan)
        .unwrap();
    let mut row = row.to_vec();
    plan.apply(&mut row).unwrap();
    (0..row.len()).filter(|&t| row[t].is_finite()).collect()
}

proptest! {
    /// A kind said to mask allows the same tokens whatever the row's logits: two rows of
    /// different values keep the same tokens.
    #[test]
    fn masking_kinds_allow_the_same_tokens_whatever_the_logits(
        spec in proptest::sample::select(kinds_where(crate::spec::Kind::masks)).prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        ids in proptest::collection::vec(0u32..8, 0..10),
        rows in proptest::collection::vec(proptest::collection::vec(-8.0f32..8.0, VOCAB as usize), 2),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        prop_assert!(spec.masks());
        let ids: Vec<u32> = (0..prompt_len as u32).chain(ids).collect();
        prop_assert_eq!(
            finite_after(&spec, prompt_len, &ids, &rows[0]),
            finite_after(&spec, prompt_len, &ids, &rows[1]),
            "{}", spec.to_value()
        );
    }

    /// Only a kind said to truncate plans a truncation (a cut of the row by its values).
    #[test]
    fn only_truncating_kinds_plan_a_truncation(
        spec in proptest::sample::select(kinds_where(|_| true)).prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        moves in moves(),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        let mut processor = realize(&spec, prompt_len);
        let mut ids: Vec<u32> = (0..prompt_len as u32).collect();
        for step in &moves {
            step.apply(&mut ids);
            let mut plan = RowPlan::new();
            processor.plan(&ids, &mut plan).unwrap();
            let cuts = plan.edits().iter().any(|e| matches!(e, Edit::Truncate(_)));
            prop_assert!(!cuts || spec.truncates(), "{} truncates", spec.to_value());
        }
    }
}

#[test]
fn truncating_kinds_plan_a_truncation() {
    let truncating = kinds_where(crate::spec::Kind::truncates);
    assert!(truncating.len() > 5, "{truncating:?}");
    let runner = &mut proptest::test_runner::TestRunner::deterministic();
    for name in truncating {
        let cuts = (0..64).any(|_| {
            let spec =
                ProcessorSpec::from_value(&spec_of(name).new_tree(runner).unwrap().current())
                    .unwrap();
            let mut plan = RowPlan::new();
            realize(&spec, 0)
                .plan(&vec![1u32, 2, 3], &mut plan)
                .unwrap();
            plan.edits().iter().any(|e| matches!(e, Edit::Truncate(_)))
        });
        assert!(
            cuts,
            "{name} is said to truncate, and planned no truncation"
        );
    }
}

/// Whether a pipeline of `spec` plans an edit the device kernels do not carry out
/// ([`RowPlan::cpu_only`]) at any of `steps` after `prompt` (each step the row it edits, then
/// the id appended), its passes fed back as an engine's are.
fn plans_a_host_edit(
    spec: &ProcessorSpec,
    context: &EngineContext,
    prompt: &[u32],
    steps: &[(u32, Vec<f32>)],
) -> bool {
    let mut pipeline =
        crate::Pipeline::from_specs(std::slice::from_ref(spec), context, prompt.len()).unwrap();
    let mut ids = prompt.to_vec();
    for (next, row) in steps {
        pipeline.plan(&ids).unwrap();
        let host = pipeline
            .stages()
            .iter()
            .any(|s| matches!(s, crate::Stage::Plan(plan) if plan.cpu_only()));
        if host {
            return true;
        }
        let mut row = row.clone();
        pipeline.validate_plans(row.len()).unwrap();
        pipeline
            .apply_planned(&mut row, &mut |_, _| unreachable!("no external steps"))
            .unwrap();
        ids.push(*next);
    }
    false
}

/// Decode steps over a vocab of `vocab`: each a row of logits and the id sampled after it.
fn decode_steps(vocab: u32) -> impl Strategy<Value = Vec<(u32, Vec<f32>)>> {
    proptest::collection::vec(
        (
            0u32..vocab,
            proptest::collection::vec(-8.0f32..8.0, vocab as usize),
        ),
        1..8,
    )
}

/// A prompt of `n` ids, as the property tests make them.
fn prompt_of(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i % 5).collect()
}

proptest! {
    /// Only a kind said to edit on the host plans an edit the device kernels do not carry out.
    #[test]
    fn only_kinds_said_to_edit_on_the_host_plan_host_edits(
        // The caller's bitmask is given to a batch's step, not to `Pipeline::plan`.
        spec in proptest::sample::select(kinds_where(|k| !k.edits_on_host() && k.name != "bitmask"))
            .prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        steps in decode_steps(VOCAB),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        prop_assert!(
            !plans_a_host_edit(&spec, &context(), &prompt_of(prompt_len), &steps),
            "{} plans an edit only the host carries out", spec.to_value()
        );
    }
}

/// Each kind said to edit on the host plans such an edit for some spec and decode: the answer
/// is not an over-cautious one. (`multiple_choice` edits on the host only with
/// `boost_first_words`, which needs the token texts: over a byte-level vocab, after a prompt
/// that lists its choices as lines.)
#[test]
fn kinds_said_to_edit_on_the_host_do() {
    use proptest::strategy::ValueTree;
    let runner = &mut proptest::test_runner::TestRunner::deterministic();
    let mut host_edited: Vec<&str> = KINDS
        .iter()
        .filter(|k| k.edits_on_host())
        .map(|k| k.name)
        .collect();
    assert!(host_edited.len() > 5, "{host_edited:?}");
    host_edited.retain(|&name| {
        let (spec, context, vocab, prompt) = match name {
            // "\n1. A\n2. B\n", one byte a token.
            #[cfg(feature = "tokenizers")]
            "multiple_choice" => (
                Just(json!({"kind": "multiple_choice", "choices": [49, 50],
                            "boost_first_words": 0.5, "delimiter": 46}))
                .boxed(),
                EngineContext {
                    vocab_size: Some(256),
                    vocab: Some(crate::vocab::byte_level_vocab(&[])),
                    ..Default::default()
                },
                256,
                Some(vec![10u32, 49, 46, 65, 10, 50, 46, 66, 10]),
            ),
            // Without token texts it cannot boost its first words.
            #[cfg(not(feature = "tokenizers"))]
            "multiple_choice" => return false,
            name => (spec_of(name), context(), VOCAB, None),
        };
        let found = (0..256).any(|i| {
            let value = spec.new_tree(runner).unwrap().current();
            let steps = decode_steps(vocab).new_tree(runner).unwrap().current();
            let prompt = prompt.clone().unwrap_or_else(|| prompt_of(i % 6));
            let spec = ProcessorSpec::from_value(&value).unwrap();
            plans_a_host_edit(&spec, &context, &prompt, &steps)
        });
        !found
    });
    assert!(
        host_edited.is_empty(),
        "said to edit on the host, and never planned such an edit: {host_edited:?}"
    );
}

/// The second step's row after a first step given `first`, through one pipeline of `spec`.
fn second_step(
    spec: &ProcessorSpec,
    prompt_len: usize,
    ids: &[u32],
    first: &[f32],
    second: &[f32],
) -> Vec<u32> {
    let mut pipeline =
        crate::Pipeline::from_specs(std::slice::from_ref(spec), &context(), prompt_len).unwrap();
    let mut row = first.to_vec();
    pipeline
        .process(&ids[..ids.len() - 1].to_vec(), &mut row)
        .unwrap();
    let mut row = second.to_vec();
    pipeline.process(&ids.to_vec(), &mut row).unwrap();
    row.iter().map(|x| x.to_bits()).collect()
}

/// Whether the processors of `spec` keep a checkpoint ([`LogitsProcessor::checkpoint`]): their
/// state holds what a pass observed.
fn keeps_checkpoint(spec: &ProcessorSpec) -> bool {
    realize(spec, 0).checkpoint().is_some()
}

proptest! {
    /// A kind whose processors keep no checkpoint plans from its spec and the ids alone: two
    /// first steps given different rows leave the second step's row edited alike. (So reading
    /// the ids again after a rejected draft takes it back.)
    #[test]
    fn kinds_without_a_checkpoint_do_not_depend_on_the_rows_before(
        // The caller's bitmask is given to a batch's step, not to `Pipeline::process`.
        spec in proptest::sample::select(kinds_where(|k| k.name != "bitmask"))
            .prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        ids in proptest::collection::vec(0u32..8, 1..10),
        rows in proptest::collection::vec(proptest::collection::vec(-8.0f32..8.0, VOCAB as usize), 3),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        prop_assume!(!keeps_checkpoint(&spec));
        let ids: Vec<u32> = (0..prompt_len as u32).chain(ids).collect();
        prop_assert_eq!(
            second_step(&spec, prompt_len, &ids, &rows[0], &rows[2]),
            second_step(&spec, prompt_len, &ids, &rows[1], &rows[2]),
            "{}", spec.to_value()
        );
    }
}

/// The kinds that keep a checkpoint need one: for some spec and rows, the second step depends
/// on the first step's row. docs/core.md's "Draft rows" names them.
#[test]
fn kinds_that_keep_a_checkpoint_depend_on_the_rows_before() {
    use proptest::strategy::ValueTree;
    let runner = &mut proptest::test_runner::TestRunner::deterministic();
    let keeping: Vec<&str> = kinds_where(|k| k.name != "bitmask")
        .into_iter()
        .filter(|&name| {
            let spec = spec_of(name).new_tree(runner).unwrap().current();
            keeps_checkpoint(&ProcessorSpec::from_value(&spec).unwrap())
        })
        .collect();
    assert!(keeping.contains(&"mirostat"), "{keeping:?}");
    let page = include_str!("../../../../docs/core.md");
    let mut named = kinds_listed(page, "which no id gives back:", "Their processors");
    named.retain(|name| kind(name).is_some());
    named.sort();
    let mut sorted = keeping.clone();
    sorted.sort();
    assert_eq!(named, sorted, "docs/core.md's Draft rows");
    let rows =
        proptest::collection::vec(proptest::collection::vec(-8.0f32..8.0, VOCAB as usize), 3);
    for name in keeping {
        let depends = (0..256).any(|_| {
            let spec =
                ProcessorSpec::from_value(&spec_of(name).new_tree(runner).unwrap().current())
                    .unwrap();
            let rows = rows.new_tree(runner).unwrap().current();
            // The next id is the first step's pick from the row as the kind left it (a forced
            // token, when its trigger held).
            let mut first = rows[0].clone();
            crate::Pipeline::from_specs(std::slice::from_ref(&spec), &context(), 0)
                .unwrap()
                .process(&[1u32, 2, 3], &mut first)
                .unwrap();
            let ids = [1u32, 2, 3, argmax(&first)];
            second_step(&spec, 0, &ids, &rows[0], &rows[2])
                != second_step(&spec, 0, &ids, &rows[1], &rows[2])
        });
        assert!(
            depends,
            "{name} keeps a checkpoint, and its steps never depended on the rows before"
        );
    }
}

/// The greedy pick of a row (the lowest id among equal values; NaN above all, as `total_cmp`).
fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .rev()
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32
}

/// The model's row after `ids`: a function of the ids alone, so that a pipeline planning draft
/// rows and one given only the accepted ids see the same rows for the same ids.
fn row_after(ids: &[u32], seed: u64) -> Vec<f32> {
    let mut state = ids.iter().fold(seed, |h, &id| {
        (h ^ u64::from(id)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    (0..VOCAB)
        .map(|_| {
            state ^= state >> 29;
            state = state.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            (state >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Speculative decoding, every kind: a pipeline planning up to 3 draft rows a step, row `j`
    /// after the committed ids and the drafts before it (a drafter right or wrong at random),
    /// the drafts accepted while each is the greedy pick of the row before it and then the
    /// pick of the first row not accepted. Every row of the accepted path is edited bit for bit
    /// as by a pipeline given only the accepted ids; sometimes a step is planned and undone
    /// first (another row of a batch failed).
    #[test]
    fn draft_rows_are_edited_as_the_accepted_ids_alone(
        spec in proptest::sample::select(kinds_where(|k| k.name != "bitmask"))
            .prop_flat_map(spec_of),
        prompt_len in 0usize..6,
        seed in any::<u64>(),
        steps in proptest::collection::vec(
            (0usize..=3, proptest::collection::vec(proptest::option::of(token()), 3), any::<bool>()),
            1..10,
        ),
    ) {
        let spec = ProcessorSpec::from_value(&spec).unwrap();
        let speculative = EngineContext { speculative_tokens: 3, ..context() };
        let pipeline = |context: &EngineContext| {
            crate::Pipeline::from_specs(std::slice::from_ref(&spec), context, prompt_len).unwrap()
        };
        let (mut drafting, mut plain) = (pipeline(&speculative), pipeline(&context()));
        let bits = |r: &[f32]| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut ids = prompt_of(prompt_len);
        for (count, wrong, undone) in steps {
            if undone {
                drafting.plan(&ids).unwrap();
                drafting.undo();
            }
            // Each row after the drafts before it; a draft is the row's pick, or a wrong one.
            let mut history = ids.clone();
            let mut rows = vec![];
            let mut wrong = wrong.into_iter();
            for j in 0..=count {
                let mut row = row_after(&history, seed);
                drafting.process(&history, &mut row).unwrap();
                if j < count {
                    history.push(wrong.next().flatten().unwrap_or_else(|| argmax(&row)));
                }
                rows.push(row);
            }
            let drafts = &history[ids.len()..];
            let accepted = (0..count)
                .take_while(|&j| drafts[j] == argmax(&rows[j]))
                .count();
            for (j, row) in rows.iter().enumerate().take(accepted + 1) {
                let mut want = row_after(&[&ids[..], &drafts[..j]].concat(), seed);
                plain.process(&[&ids[..], &drafts[..j]].concat(), &mut want).unwrap();
                prop_assert_eq!(
                    bits(row), bits(&want),
                    "{} row {} of {:?} + {:?}", spec.to_value(), j, ids, drafts
                );
            }
            let bonus = argmax(&rows[accepted]);
            ids.extend_from_slice(&drafts[..accepted]);
            ids.push(bonus);
        }
    }
}

/// A kind needs token texts exactly when said to: every kind said not to realizes its specs in
/// a context without them, and each kind said to has a spec refused there naming the field.
#[test]
fn kinds_need_token_texts_as_said() {
    let runner = &mut proptest::test_runner::TestRunner::deterministic();
    for name in kinds_where(|k| !k.needs_token_texts()) {
        for _ in 0..16 {
            let spec =
                ProcessorSpec::from_value(&spec_of(name).new_tree(runner).unwrap().current())
                    .unwrap();
            assert!(!spec.needs_token_texts());
            spec.realize(&context(), 0).unwrap();
        }
    }
    let declared: Vec<&str> = KINDS
        .iter()
        .filter(|k| k.needs_token_texts())
        .map(|k| k.name)
        .collect();
    assert!(declared.contains(&"dry"), "{declared:?}");
    for name in declared {
        let (json, field) = match name {
            // Without breakers given, llama.cpp's default text breakers.
            "dry" => (
                json!({"kind": "dry", "multiplier": 0.8}),
                "sequence_breakers",
            ),
            "multiple_choice" => (
                json!({"kind": "multiple_choice", "choices": [1, 2], "boost_first_words": 0.5}),
                "",
            ),
            "ban_strings" => (json!({"kind": "ban_strings", "strings": ["no"]}), "strings"),
            "grammar" => (json!({"kind": "grammar", "regex": "a+"}), ""),
            "json_object" => (json!({"kind": "json_object"}), ""),
            "lazy_grammar" => (
                json!({"kind": "lazy_grammar", "triggers": [
                    {"begin": "<tool_call>", "grammar": {"regex": "a+"}}]}),
                "triggers",
            ),
            other => panic!("{other} is said to need token texts: give a spec that does here"),
        };
        let spec = ProcessorSpec::from_value(&json).unwrap();
        assert!(spec.needs_token_texts() && kind(name).unwrap().needs_token_texts());
        let error = spec
            .realize(&context(), 0)
            .err()
            .unwrap_or_else(|| panic!("{json} is realized without token texts"));
        assert!(error.to_string().contains(field), "{name}: {error}");
    }
}

#[test]
fn a_mask_after_truncation_is_refused_naming_both() {
    let specs = parse_pipeline(
        r#"[{"kind": "temperature", "temperature": 0.7}, {"kind": "top_p", "p": 0.9},
            {"kind": "repetition_penalty", "penalty": 1.1},
            {"kind": "allowed_token_ids", "token_ids": [1, 2]}, {"kind": "top_k", "k": 2}]"#,
    )
    .unwrap();
    let at = |specs: &[ProcessorSpec]| check_order(specs.iter().map(|s| (s.position(), s)));
    let error = at(&specs).unwrap_err().to_string();
    assert!(
        error.contains("[3].kind") && error.contains("truncation step [1] 'top_p'"),
        "{error}"
    );
    assert!(crate::Pipeline::from_specs(&specs, &context(), 0).is_err());
    assert!(at(&canonical_order(specs)).is_ok());
    // Masks before truncation, and truncation with no mask after it, are fine.
    let fine = parse_pipeline(
        r#"[{"kind": "allowed_token_ids", "token_ids": [1, 2]}, {"kind": "top_k", "k": 2},
            {"kind": "temperature", "temperature": 0.7}, {"kind": "ban_tokens", "token_ids": [1]}]"#,
    )
    .unwrap();
    assert!(at(&fine).is_ok());
}

/// The kinds a page names, in a list that starts at `start` and ends at `end`: the backticked
/// names that are kinds' spelling (no `::`, `(`).
fn kinds_listed(page: &str, start: &str, end: &str) -> Vec<String> {
    let from = page.find(start).expect("the list's opening words") + start.len();
    let text = &page[from..];
    let to = text.find(end).expect("the list's closing words");
    text[..to]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

/// The one list of kinds the docs explain by hand, docs/core.md's canonical order, is checked
/// against the registry; every other list of kinds in the docs is generated (docs/specs.md).
#[test]
fn the_docs_list_every_kind_in_the_registrys_order() {
    let core = include_str!("../../../../docs/core.md");
    let registry: Vec<String> = crate::spec::kinds().map(str::to_string).collect();
    let order: Vec<String> = kinds_listed(
        core,
        "specs of one kind keeping their order:",
        "Biases and penalties first",
    )
    .into_iter()
    .filter(|k| registry.contains(k))
    .collect();
    assert_eq!(order, registry);
}

/// Finite values at the edges of what a spec's numbers may be: zeros, the smallest and largest
/// normal and subnormal numbers of f32 and f64, and the values around them.
const EXTREME_NUMBERS: &[f64] = &[
    0.0,
    -0.0,
    1e-300,
    -1e-300,
    1e-45,
    1e-40,
    -1e-40,
    1.2e-38,
    1e-30,
    1e-6,
    0.5,
    1.0,
    -1.0,
    2.0,
    1e6,
    -1e6,
    1e30,
    -1e30,
    3.4e38,
    -3.4e38,
    3.5e38,
    -3.5e38,
    1e300,
    -1e300,
    f64::MAX,
    f64::MIN,
];

/// Integers at the edges of a spec's counts: 0, 1, a few, and each integer type's largest.
const EXTREME_INTEGERS: &[i128] = &[
    0,
    1,
    2,
    3,
    1000,
    65_536,
    i32::MAX as i128,
    u32::MAX as i128,
    u32::MAX as i128 + 1,
    i64::MAX as i128,
    u64::MAX as i128,
    -1,
    i64::MIN as i128,
];

/// Whether a property's schema admits a number (a float when `float`, else an integer).
fn schema_takes_number(schema: &Value, float: bool) -> bool {
    let wanted = if float { "number" } else { "integer" };
    let typed = match &schema["type"] {
        Value::String(t) => t == wanted,
        Value::Array(types) => types.iter().any(|t| t == wanted),
        _ => false,
    };
    typed
        || ["anyOf", "oneOf"].iter().any(|k| {
            schema[*k]
                .as_array()
                .is_some_and(|options| options.iter().any(|o| schema_takes_number(o, float)))
        })
}

/// The JSON pointers of `spec`'s numbers, each with whether it is a float; and, from the
/// kind's schema, its top-level number fields that `spec` leaves out (as pointers to add).
fn number_places(spec: &Value) -> Vec<(String, bool)> {
    fn walk(v: &Value, at: String, out: &mut Vec<(String, bool)>) {
        match v {
            Value::Number(n) => out.push((at, !(n.is_u64() || n.is_i64()))),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, format!("{at}/{i}"), out);
                }
            }
            Value::Object(fields) => {
                for (k, item) in fields {
                    walk(
                        item,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    );
                }
            }
            _ => {}
        }
    }
    let mut places = vec![];
    walk(spec, String::new(), &mut places);
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let schema = SCHEMA.get_or_init(crate::spec_schema::spec_schema);
    let kind = spec["kind"].as_str().unwrap();
    for (name, property) in schema["$defs"][kind]["properties"].as_object().unwrap() {
        if spec.get(name).is_none() {
            for float in [true, false] {
                if schema_takes_number(property, float) {
                    places.push((format!("/{name}"), float));
                }
            }
        }
    }
    places
}

/// `spec` with the number at `at` (added when it is a top-level field not there) replaced.
fn with_number(mut spec: Value, at: &str, value: Value) -> Value {
    match spec.pointer_mut(at) {
        Some(slot) => *slot = value,
        None => {
            spec[&at[1..]] = value;
        }
    }
    spec
}

/// A finite logit as models give them (`|x| <= 1e4`), `-inf` (banned), or an exact edge value.
fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -30.0f32..30.0,
        2 => -1e4f32..1e4,
        1 => Just(f32::NEG_INFINITY),
        1 => prop::sample::select(vec![0.0f32, -0.0, 1e4, -1e4, 1e-38, -1e-38, 1e-45]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, max_shrink_iters: 256, ..ProptestConfig::default() })]

    /// Every kind, its numbers set to extreme finite values (one to three at a time, within the
    /// spec or among the schema's fields it leaves out): if admission takes the spec, every step
    /// leaves a finite logit finite or `-inf`, never NaN or infinity, and `-inf` stays `-inf`
    /// (but for a token a step sets by value: a forced EOS, the thinking budget's end).
    #[test]
    fn no_admitted_spec_makes_a_finite_logit_nan_or_infinite(
        (base, changes) in proptest::sample::select(kinds_where(|_| true))
            .prop_flat_map(spec_of)
            .prop_flat_map(|base| {
                let n = number_places(&base).len().max(1);
                (Just(base), proptest::collection::vec(
                    (0..n, any::<prop::sample::Index>()), 1..4))
            }),
        prompt_len in 0usize..6,
        history in prop_oneof![
            3 => proptest::collection::vec(0u32..VOCAB, 0..12),
            1 => (0u32..VOCAB, 0usize..1500).prop_map(|(id, n)| vec![id; n]),
        ],
        steps in proptest::collection::vec(
            (0u32..VOCAB, proptest::collection::vec(logit(), VOCAB as usize)), 1..4),
    ) {
        let places = number_places(&base);
        let mut spec = base.clone();
        for (place, pick) in &changes {
            let Some((at, float)) = places.get(*place) else { continue };
            let value = if *float {
                json!(pick.get(EXTREME_NUMBERS))
            } else {
                let n = *pick.get(EXTREME_INTEGERS);
                match u64::try_from(n) {
                    Ok(n) => json!(n),
                    Err(_) => json!(n as i64),
                }
            };
            spec = with_number(spec, at, value);
        }
        let Ok(parsed) = ProcessorSpec::from_value(&spec) else { return Ok(()) };
        let Ok(mut processor) = parsed.realize(&context(), prompt_len) else { return Ok(()) };
        let mut ids: Vec<u32> = (0..prompt_len as u32).map(|i| i % 5).chain(history).collect();
        let mut plan = RowPlan::new();
        for (next, row) in &steps {
            plan.clear();
            processor.plan(&ids, &mut plan).unwrap();
            let set: Vec<u32> = plan
                .edits()
                .iter()
                .filter_map(|e| match *e {
                    Edit::Set { token, .. } => Some(token),
                    Edit::Force { token, value: ForcedValue::Set(_) } => Some(token),
                    _ => None,
                })
                .collect();
            let mut edited = row.clone();
            plan.apply(&mut edited).unwrap();
            for (t, (&before, &after)) in row.iter().zip(&edited).enumerate() {
                prop_assert!(
                    after.is_finite() || after == f32::NEG_INFINITY,
                    "{spec}: logit {t} {before} became {after} (ids {} long)", ids.len()
                );
                if before == f32::NEG_INFINITY && !set.contains(&(t as u32)) {
                    if finite_izes(&plan) {
                        prop_assert!(after == f32::NEG_INFINITY || after == f32::MIN, "{}: logit {} is {}", spec, t, after);
                    } else {
                        prop_assert_eq!(after, f32::NEG_INFINITY, "{}: logit {} came back", spec, t);
                    }
                }
            }
            ids.push(*next);
        }
    }
}

/// Histories of `n` ids in the shapes that make a scan superlinear if anything does: a short
/// pattern repeated, one id throughout, every id once, ascending and descending runs.
fn history_shapes(n: usize) -> Vec<(&'static str, Vec<u32>)> {
    let n32 = n as u32;
    vec![
        ("repeats", (0..n32).map(|i| i % 5).collect()),
        ("one id", vec![3; n]),
        ("every id once", (0..n32).collect()),
        ("ascending", (0..n32).map(|i| i % 1000).collect()),
        ("descending", (0..n32).map(|i| 999 - i % 1000).collect()),
    ]
}

/// The lesser of two timings of `run`, each on a value `make` builds untimed.
fn least_time<T>(mut make: impl FnMut() -> T, mut run: impl FnMut(T)) -> std::time::Duration {
    (0..2)
        .map(|_| {
            let value = make();
            let start = std::time::Instant::now();
            run(value);
            start.elapsed()
        })
        .min()
        .unwrap()
}

/// Every kind that reads the history plans its first step over a history of 1k, 32k and 128k ids
/// (each shape of [`history_shapes`]) at the cost of a rescan: a fresh processor (a request
/// admitted with its prompt) within 20 times a rewound one's (which rescans after a rollback)
/// plus 2 ms, and the fresh one at 128k within 4 times 20 its cost at 32k plus 2 ms: linear in
/// the history, whatever its shape. A continuing processor's step is timed beside them.
#[test]
fn every_kind_plans_its_first_step_in_time_linear_in_the_history() {
    let context = EngineContext {
        vocab_size: Some(1 << 18),
        ..Default::default()
    };
    let runner = &mut proptest::test_runner::TestRunner::deterministic();
    let slack = std::time::Duration::from_millis(2);
    let mut failures = vec![];
    for name in kinds_where(crate::spec::Kind::reads_history) {
        // The whole history read, where a spec can say so: the longest scans.
        let mut value = spec_of(name).new_tree(runner).unwrap().current();
        for whole in ["window", "penalty_last_n"] {
            if value.get(whole).is_some() {
                value[whole] = json!(-1);
            }
        }
        if name == "dry" {
            value["multiplier"] = json!(1.0);
        }
        let spec = ProcessorSpec::from_value(&value).unwrap();
        let realize = || spec.realize(&context, 4).unwrap();
        let plan = |p: &mut Box<dyn LogitsProcessor>, ids: &[u32]| {
            p.plan(&ids.to_vec(), &mut RowPlan::new()).unwrap();
        };
        for (shape, ids) in history_shapes((128 << 10) + 64) {
            let mut fresh_at = vec![];
            for n in [1 << 10, 32 << 10, 128 << 10] {
                let ids = &ids[..n + 64];
                let fresh = least_time(realize, |mut p| plan(&mut p, &ids[..n]));
                let rewound = least_time(
                    || {
                        let mut p = realize();
                        plan(&mut p, ids);
                        p
                    },
                    |mut p| plan(&mut p, &ids[..n]),
                );
                let continuing = least_time(
                    || {
                        let mut p = realize();
                        plan(&mut p, &ids[..n - 1]);
                        p
                    },
                    |mut p| plan(&mut p, &ids[..n]),
                );
                if fresh > rewound * 20 + slack {
                    failures.push(format!(
                        "{name}, {shape}, {n} ids: fresh {fresh:?}, rewound {rewound:?}, \
                         continuing {continuing:?}"
                    ));
                }
                fresh_at.push(fresh);
            }
            if fresh_at[2] > fresh_at[1] * 80 + slack {
                failures.push(format!(
                    "{name}, {shape}: fresh at 32k, 128k ids {fresh_at:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A limit of a numeric field: its value and whether the value itself is allowed.
type Limit = Option<(f64, bool)>;

/// A numeric field's limits as the schema states them (`minimum`, `exclusiveMinimum`, `maximum`,
/// `exclusiveMaximum`, and an integer's `format`): `(integer, lowest, highest)`, `None` for a
/// field that is not a number. A float field the schema states no limit for has none here.
fn schema_limits(property: &Value) -> Option<(bool, Limit, Limit)> {
    let options: Vec<&Value> = match property["anyOf"].as_array() {
        Some(options) => options.iter().collect(),
        None => vec![property],
    };
    let number = options
        .into_iter()
        .find(|o| schema_takes_number(o, true) || schema_takes_number(o, false))?;
    let integer = schema_takes_number(number, false) && !schema_takes_number(number, true);
    let (mut low, mut high): (Limit, Limit) = match number["format"].as_str() {
        Some("uint8") => (Some((0.0, true)), Some((u8::MAX as f64, true))),
        Some("uint16") => (Some((0.0, true)), Some((u16::MAX as f64, true))),
        Some("uint32") => (Some((0.0, true)), Some((u32::MAX as f64, true))),
        Some("int32") => (Some((i32::MIN as f64, true)), Some((i32::MAX as f64, true))),
        // Past 2^53 an f64 is not every integer: only the lower bound is tried.
        Some("uint64") | Some("uint") => (Some((0.0, true)), None),
        _ => (None, None),
    };
    if let Some(m) = number["minimum"].as_f64() {
        low = Some((m, true));
    }
    if let Some(m) = number["exclusiveMinimum"].as_f64() {
        low = Some((m, false));
    }
    if let Some(m) = number["maximum"].as_f64() {
        high = Some((m, true));
    }
    if let Some(m) = number["exclusiveMaximum"].as_f64() {
        high = Some((m, false));
    }
    Some((integer, low, high))
}

/// Values just inside and just outside each limit: `(value, inside)`.
fn edges(integer: bool, low: Limit, high: Limit) -> Vec<(Value, bool)> {
    let mut out = vec![];
    if integer {
        let int = |n: i128| match u64::try_from(n) {
            Ok(n) => json!(n),
            Err(_) => json!(n as i64),
        };
        if let Some((m, allowed)) = low {
            let first = m as i128 + !allowed as i128;
            out.extend([(int(first), true), (int(first - 1), false)]);
        }
        if let Some((m, allowed)) = high {
            let last = m as i128 - !allowed as i128;
            out.extend([(int(last), true), (int(last + 1), false)]);
        }
    } else {
        if let Some((m, allowed)) = low {
            let first = if allowed { m } else { m.next_up() };
            out.extend([(json!(first), true), (json!(first.next_down()), false)]);
        }
        if let Some((m, allowed)) = high {
            let last = if allowed { m } else { m.next_down() };
            out.extend([(json!(last), true), (json!(last.next_up()), false)]);
        }
    }
    out
}

/// Every numeric field of every kind, at each edge of the limits its schema states: a value
/// just inside is admitted (an id field may instead be refused for the vocab), one just outside
/// is refused with an error naming the field. What the docs (the schema's descriptions) refuse,
/// the schema states, and admission refuses.
#[test]
fn admission_refuses_exactly_past_the_schemas_limits() {
    let schema = crate::spec_schema::spec_schema();
    let runner = &mut proptest::test_runner::TestRunner::deterministic();
    let mut mismatches = vec![];
    for name in kinds_where(|_| true) {
        let base = spec_of(name).new_tree(runner).unwrap().current();
        let properties = schema["$defs"][name]["properties"].as_object().unwrap();
        for (field, property) in properties {
            let Some((integer, low, high)) = schema_limits(property) else {
                continue;
            };
            for (value, inside) in edges(integer, low, high) {
                let mut spec = base.clone();
                spec[field.as_str()] = value.clone();
                let outcome = ProcessorSpec::from_value(&spec)
                    .and_then(|s| s.realize(&context(), 4).map(drop));
                let named = |e: &crate::Error| match e {
                    crate::Error::InvalidSpec { field: f, .. }
                    | crate::Error::InvalidArgument { field: f, .. }
                    | crate::Error::TooLarge { field: f, .. } => f == field,
                    _ => false,
                };
                match (inside, &outcome) {
                    (true, Ok(())) => {}
                    (true, Err(crate::Error::TokenOutOfVocab { field: f, .. })) if f == field => {}
                    (false, Err(e)) if named(e) => {}
                    (true, Err(e)) => {
                        mismatches.push(format!("{name}.{field} = {value}: refused: {e}"))
                    }
                    (false, Err(e)) => mismatches.push(format!(
                        "{name}.{field} = {value}: refused without naming it: {e:?}"
                    )),
                    (false, Ok(())) => {
                        mismatches.push(format!("{name}.{field} = {value}: admitted"))
                    }
                }
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
