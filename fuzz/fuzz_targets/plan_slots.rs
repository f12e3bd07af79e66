//! The plan's slots against their edit-by-edit meaning, over rows with NaN, infinities, signed
//! zeros and ties, in f32, f16 and bf16:
//! - random plans (every kind of edit: scales, forces, bans, biases, penalties, raises, sets,
//!   bitmasks, each truncation rule) applied by the fused pass equal each edit applied to the
//!   whole row in turn ([`RowPlan::apply_edit_by_edit`]), and pack for the device kernels; a plan
//!   naming a token outside the row is an error that leaves the row bit for bit as it was;
//! - random pipelines of every built-in kind (realized from specs), through a batch in place and
//!   out of place, equal their processors applied to the row one after another.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use logits_processing::{
    bf16, f16, parse_pipeline, Batch, BatchLayout, Edit, ForcedValue, Logit, Pipeline, RowPlan,
    EngineContext, ThinkingTokenConfig, Truncation,
};
use logits_processing_cuda::packed::{kernel_carries, PackedPlans};
use serde_json::{json, Value};

#[derive(Arbitrary, Debug)]
enum Value32 {
    /// Few distinct values: ties.
    Small(i8),
    Wide(i16),
    Bits(u32),
    Nan,
    Inf,
    NegInf,
    Zero,
    NegZero,
}

impl Value32 {
    fn get(&self) -> f32 {
        match *self {
            Value32::Small(v) => v as f32 / 4.0,
            Value32::Wide(v) => v as f32 / 64.0,
            Value32::Bits(b) => f32::from_bits(b),
            Value32::Nan => f32::NAN,
            Value32::Inf => f32::INFINITY,
            Value32::NegInf => f32::NEG_INFINITY,
            Value32::Zero => 0.0,
            Value32::NegZero => -0.0,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum EditInput {
    Scale(u16),
    Force(u16, Option<i8>),
    Ban(u16),
    Bias(u16, i8),
    Penalty(u16, u8),
    Raise(u16, i8),
    Set(u16, i8),
    Mask {
        seed: u32,
        short: bool,
        beyond: bool,
    },
    TopK(u16, u8),
    TopP(u16, u8),
    MinP(u16, u8),
    Typical(u16, u8),
    Epsilon(u16, u8),
    Eta(u16, u8),
}

#[derive(Arbitrary, Debug)]
struct SpecInput {
    kind: u8,
    a: u16,
    b: u16,
    ids: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    len: u8,
    /// Rows past the chunk (4096 logits) and the sampled pivots' threshold.
    long: bool,
    dtype: u8,
    values: Vec<Value32>,
    rows: Vec<Vec<EditInput>>,
    specs: Vec<SpecInput>,
    history: Vec<u8>,
}

/// Bits equal, NaN equal to NaN (its payload is not promised).
fn same<T: Logit>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let (x, y) = (x.to_f32(), y.to_f32());
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        })
}

fn bits<T: Logit>(row: &[T]) -> Vec<u32> {
    row.iter().map(|x| x.to_f32().to_bits()).collect()
}

/// A token of a row of `len`, now and then just past it.
fn token(t: u16, len: usize) -> u32 {
    (t as usize % (len + 1)) as u32
}

fn unit(x: u16) -> f32 {
    x as f32 / u16::MAX as f32
}

fn plan_of(edits: &[EditInput], len: usize) -> RowPlan {
    let mut plan = RowPlan::new();
    for edit in edits {
        let keep = |m: u8| 1 + (m % 8) as u32;
        let truncate = |rule: Truncation| rule.validate().is_ok().then_some(Edit::Truncate(rule));
        let edit = match *edit {
            EditInput::Scale(t) => Some(Edit::Scale {
                temperature: (t as f32 + 1.0) / 1024.0,
            }),
            EditInput::Force(t, set) => Some(Edit::Force {
                token: token(t, len),
                value: set.map_or(ForcedValue::Keep, |v| ForcedValue::Set(v as f32 / 8.0)),
            }),
            EditInput::Ban(t) => Some(Edit::Ban {
                token: token(t, len),
            }),
            EditInput::Bias(t, b) => Some(Edit::Bias {
                token: token(t, len),
                bias: b as f32 / 8.0,
            }),
            EditInput::Penalty(t, p) => Some(Edit::Penalty {
                token: token(t, len),
                penalty: (p as f32 + 1.0) / 32.0,
            }),
            EditInput::Raise(t, f) => Some(Edit::AddScaledAbs {
                token: token(t, len),
                factor: f as f32 / 32.0,
            }),
            EditInput::Set(t, v) => Some(Edit::Set {
                token: token(t, len),
                value: v as f32 / 4.0,
            }),
            EditInput::Mask {
                seed,
                short,
                beyond,
            } => {
                let words: Vec<u32> = (0..len.div_ceil(32) as u32)
                    .map(|w| (seed ^ w.wrapping_mul(0x9e37_79b9)).rotate_left(w))
                    .collect();
                let words = if short {
                    &words[..words.len() / 2]
                } else {
                    &words
                };
                plan.push_mask(words, beyond);
                None
            }
            EditInput::TopK(k, m) => truncate(Truncation::TopK {
                k: k as u32 % (len as u32 + 2),
                min_keep: keep(m),
            }),
            EditInput::TopP(p, m) => truncate(Truncation::TopP {
                p: unit(p),
                min_keep: keep(m),
            }),
            EditInput::MinP(p, m) => truncate(Truncation::MinP {
                p: unit(p),
                min_keep: keep(m),
            }),
            EditInput::Typical(p, m) => truncate(Truncation::Typical {
                mass: unit(p),
                min_keep: keep(m),
            }),
            EditInput::Epsilon(p, m) => truncate(Truncation::Epsilon {
                epsilon: unit(p) / 4.0,
                min_keep: keep(m),
            }),
            EditInput::Eta(p, m) => truncate(Truncation::Eta {
                epsilon: unit(p) / 4.0,
                min_keep: keep(m),
            }),
        };
        if let Some(edit) = edit {
            plan.push(edit);
        }
    }
    plan
}

/// Each plan alone, fused against edit by edit; then the block through the kernels' emulation.
fn check_plans<T: Logit>(plans: &mut [RowPlan], source: &[f32], len: usize) {
    let row: Vec<T> = source.iter().map(|&x| T::from_f32(x)).collect();
    let mut want = vec![];
    for plan in plans.iter_mut() {
        let mut slow = row.clone();
        let mut fused = row.clone();
        let expected = plan.apply_edit_by_edit(&mut slow);
        let got = plan.apply(&mut fused);
        assert_eq!(got.is_ok(), expected.is_ok(), "{:?}", plan.edits());
        if got.is_err() {
            assert_eq!(bits(&fused), bits(&row), "an error left the row as it was");
            assert_eq!(bits(&slow), bits(&row));
            continue;
        }
        assert!(
            same(&fused, &slow),
            "{:?}\n{fused:?}\n{slow:?}",
            plan.edits()
        );
        want.push(slow);
    }
    if want.len() != plans.len() {
        return;
    }
    // The valid plans pack for the device kernels exactly when the kernels carry them.
    let mut packed = PackedPlans::new();
    let packs = packed
        .pack(|| plans.iter().enumerate(), plans.len(), len)
        .is_ok();
    assert_eq!(packs, plans.iter().all(kernel_carries), "packing");
    if packs {
        assert_eq!(packed.slots(), plans.iter().filter(|p| !p.is_empty()).count());
    }
}

fn spec(input: &SpecInput, len: usize) -> Value {
    let id = |x: u16| x as usize % len;
    let ids: Vec<usize> = input.ids.iter().map(|&t| t as usize % len).collect();
    let (a, b) = (input.a, input.b);
    let f = |x: u16| x as f64 / 1024.0;
    match input.kind % 25 {
        0 => json!({"kind": "temperature", "temperature": f(a) + 0.01}),
        1 => json!({"kind": "logit_bias", "bias": {id(a).to_string(): f(b) - 32.0}}),
        2 => {
            json!({"kind": "sequence_bias", "biases": [[ids, f(b) - 32.0], [[id(a)], f(b) / 2.0]]})
        }
        3 => json!({"kind": "repetition_penalty", "penalty": f(a) + 0.05,
                    "scope": (["all", "output", "prompt"][b as usize % 3])}),
        4 => json!({"kind": "frequency_penalty", "penalty": f(a) - 16.0}),
        5 => json!({"kind": "presence_penalty", "penalty": f(a) - 16.0}),
        6 => json!({"kind": "exponential_decay_length_penalty", "start_index": b % 8,
                    "decay_factor": 1.0 + f(a) / 64.0, "eos_token_ids": ids}),
        7 => json!({"kind": "ban_tokens", "token_ids": ids}),
        8 => json!({"kind": "bad_words", "sequences": [ids, [id(a)], [id(b), id(a)]]}),
        9 => json!({"kind": "no_repeat_ngram", "n": 1 + a % 4}),
        10 => json!({"kind": "min_length", "min_length": b % 12, "eos_token_ids": ids}),
        11 => json!({"kind": "min_new_tokens", "min_new_tokens": b % 12, "eos_token_ids": ids}),
        12 => json!({"kind": "suppress_tokens_at_begin", "token_ids": ids, "begin_index": b % 6}),
        13 => json!({"kind": "allowed_token_ids", "token_ids": ids}),
        14 => json!({"kind": "forced_eos", "max_length": b % 12, "eos_token_ids": ids}),
        15 => json!({"kind": "forced_sequence", "token_ids": ids, "eos_token_id": id(a),
                     "position": (["calls", "tokens"][b as usize % 2])}),
        16 => json!({"kind": "hello_world"}),
        17 => json!({"kind": "thinking_budget", "max_thinking_tokens": a % 8,
                     "overflow_percentage": f(b) / 16.0}),
        18 => {
            json!({"kind": "top_k", "k": 1 + a as usize % (len + 1), "min_tokens_to_keep": 1 + b % 4})
        }
        19 => json!({"kind": "top_p", "p": unit(a), "min_tokens_to_keep": 1 + b % 4}),
        20 => json!({"kind": "min_p", "p": unit(a), "min_tokens_to_keep": 1 + b % 4}),
        21 => json!({"kind": "typical_p", "mass": unit(a), "min_tokens_to_keep": 1 + b % 4}),
        22 => {
            json!({"kind": "epsilon_cutoff", "epsilon": unit(a) / 4.0, "min_tokens_to_keep": 1 + b % 4})
        }
        23 => {
            json!({"kind": "eta_cutoff", "epsilon": unit(a) / 4.0, "min_tokens_to_keep": 1 + b % 4})
        }
        _ => json!({"kind": "min_p", "p": 0.0}),
    }
}

/// The pipeline of `specs` through batches (in place, out of place) against its processors run
/// one after another, each on the row the one before left.
fn check_pipeline<T: Logit>(specs: &[Value], context: &EngineContext, history: &[u32], row: &[f32]) {
    let len = row.len();
    let row: Vec<T> = row.iter().map(|&x| T::from_f32(x)).collect();
    let realize = |specs: &[Value]| -> Option<Pipeline> {
        let parsed = parse_pipeline(&Value::Array(specs.to_vec()).to_string()).ok()?;
        Pipeline::from_specs(&parsed, context, 2).ok()
    };
    let Some(in_place) = realize(specs) else {
        return;
    };
    let out_of_place = realize(specs).expect("realized once");
    let mut alone: Vec<Pipeline> = specs
        .iter()
        .map(|s| realize(std::slice::from_ref(s)).expect("realized in the pipeline"))
        .collect();

    let mut want = row.clone();
    let mut failed = false;
    for pipeline in &mut alone {
        let before = want.clone();
        if pipeline.process(&history, &mut want).is_err() {
            assert_eq!(
                bits(&want),
                bits(&before),
                "an error left the row as it was"
            );
            failed = true;
            break;
        }
    }

    // Row 1 of 2, with 2 logits of padding per row.
    let layout = BatchLayout {
        rows: 2,
        row_stride: len + 2,
    };
    let empty: Vec<u32> = vec![];
    let histories: [&dyn logits_processing::TokenHistory; 2] = [&empty, &history];
    let mut block = vec![T::from_f32(-1.25); 2 * (len + 2)];
    block[len + 2..2 * len + 2].copy_from_slice(&row);
    let source = block.clone();

    let mut batch = Batch::new(len);
    batch.add(1, in_place).unwrap();
    let applied = batch.apply(&mut block, layout, &histories);
    assert_eq!(applied.is_err(), failed, "{specs:?}: {applied:?}");
    if failed {
        assert_eq!(
            bits(&block),
            bits(&source),
            "an error left the block as it was"
        );
        return;
    }
    assert!(
        same(&block[len + 2..2 * len + 2], &want),
        "{specs:?}\n{:?}\n{want:?}",
        &block[len + 2..2 * len + 2]
    );
    let mut unchanged = source.clone();
    unchanged[len + 2..2 * len + 2].copy_from_slice(&want);
    assert!(
        same(&block, &unchanged),
        "other rows and the padding untouched"
    );

    let mut batch = Batch::new(len);
    batch.add(1, out_of_place).unwrap();
    batch.plan(&histories).unwrap();
    let mut dst = vec![T::from_f32(3.0); block.len()];
    batch
        .apply_planned_into(&source, &mut dst, layout, &mut |_, _, _| unreachable!())
        .unwrap();
    assert!(
        same(&dst[len + 2..2 * len + 2], &want),
        "out of place: {specs:?}"
    );
    assert!(same(&dst[..len], &source[..len]), "a row without a request is copied");
}

fuzz_target!(|input: Input| {
    let len = 1 + input.len as usize % 96 * if input.long { 60 } else { 1 };
    if input.values.is_empty() {
        return;
    }
    let row: Vec<f32> = (0..len)
        .map(|i| input.values[i % input.values.len()].get())
        .collect();
    let mut plans: Vec<RowPlan> = input
        .rows
        .iter()
        .take(4)
        .map(|edits| plan_of(&edits[..edits.len().min(24)], len))
        .collect();
    match input.dtype % 3 {
        0 => check_plans::<f32>(&mut plans, &row, len),
        1 => check_plans::<f16>(&mut plans, &row, len),
        _ => check_plans::<bf16>(&mut plans, &row, len),
    }

    let specs: Vec<Value> = input.specs.iter().take(6).map(|s| spec(s, len)).collect();
    if specs.is_empty() {
        return;
    }
    let history: Vec<u32> = input
        .history
        .iter()
        .take(32)
        .map(|&t| t as u32 % len as u32)
        .collect();
    let context = EngineContext {
        vocab_size: Some(len),
        hello_world: Some((vec![0, len as u32 / 2], len as u32 - 1)),
        thinking_tokens: Some(ThinkingTokenConfig {
            start_token_id: 0,
            end_token_id: len as u32 / 3,
            newline_token_id: len as u32 - 1,
        }),
        ..Default::default()
    };
    match input.dtype % 3 {
        0 => check_pipeline::<f32>(&specs, &context, &history, &row),
        1 => check_pipeline::<f16>(&specs, &context, &history, &row),
        _ => check_pipeline::<bf16>(&specs, &context, &history, &row),
    }
});
