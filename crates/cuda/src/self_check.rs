//! The device's self-check: the kernels against the CPU path on a batch covering every kind of
//! edit, at the engine's vocab and over a few hundred rows, once per device and process, before
//! the first applier is handed out. The kernels have not been run on every driver and
//! architecture they may meet (see the crate docs), and a wrong logit must never pass silently.

use std::sync::Arc;

use logits_processing::{
    bf16, f16, BatchLayout, Edit, ForcedValue, Logit, RowPlan, Trigger, Truncation,
};

use crate::device::{DeviceBuffer, Stream};
use crate::driver::Kernels;
use crate::{CudaBatchApplier, CudaError};

/// The smallest vocab the check runs at (its plans name tokens up to here); a smaller engine vocab
/// is checked at this one.
const MIN_VOCAB: usize = 2053;
/// The check's rows: its plans over and over, every 16th row unlisted.
const ROWS: usize = 324;
/// Rows per copy of the plans.
pub(crate) const GROUP: usize = 27;

/// Runs the check on the device the first time, at `vocab` (later calls return its cached
/// outcome, whatever their vocab).
pub(crate) fn ensure(
    kernels: &Arc<Kernels>,
    ordinal: usize,
    vocab: usize,
) -> Result<(), CudaError> {
    kernels
        .checked
        .get_or_init(|| run(kernels, ordinal, vocab.max(MIN_VOCAB)))
        .clone()
        .map_err(CudaError::SelfCheck)
}

fn run(kernels: &Arc<Kernels>, ordinal: usize, vocab: usize) -> Result<(), String> {
    // The switch `scripts/gpu-check.sh` checks the fallback with (the device then takes the host
    // round trip, with one warning).
    if std::env::var_os("LOGITS_PROCESSING_TEST_SELF_CHECK").is_some_and(|v| v == "fail") {
        return Err("failed on purpose (LOGITS_PROCESSING_TEST_SELF_CHECK=fail)".into());
    }
    let mut applier = CudaBatchApplier::with_kernels(kernels.clone(), ordinal);
    let stream = Stream::new(ordinal).map_err(|e| format!("could not run: {e}"))?;
    check::<f32>(&mut applier, &stream, vocab)?;
    check::<f16>(&mut applier, &stream, vocab)?;
    check::<bf16>(&mut applier, &stream, vocab)
}

/// The batch: one row per kind of edit and the mixes that exercise the kernels' paths (forced
/// survivor with its own edits, a forced row with more survivors (sets after the force), raises
/// and sets, sparse-only rows, a mask, every truncation rule, before and after other edits and
/// after another truncation).
/// Row 7 of every group is not listed and must come back untouched. Tokens are named from both ends
/// of the row (`vocab` at least [`MIN_VOCAB`]).
pub(crate) fn plans(vocab: usize) -> Vec<(usize, RowPlan)> {
    let last = vocab as u32 - 1;
    let plan = |edits: &[Edit]| {
        let mut plan = RowPlan::new();
        edits.iter().for_each(|e| plan.push(*e));
        plan
    };
    let top_k = |k| Edit::Truncate(Truncation::TopK { k, min_keep: 1 });
    let mut masked = plan(&[Edit::Scale { temperature: 0.6 }]);
    let words: Vec<u32> = (0..vocab as u32 / 64)
        .map(|w| w.wrapping_mul(0x9e37_79b9) | 1)
        .collect();
    masked.push_mask(&words, true);
    masked.push(Edit::Bias {
        token: 33,
        bias: 1.0,
    });
    let one_group = vec![
        (0, plan(&[Edit::Scale { temperature: 0.7 }])),
        (
            1,
            plan(&[
                Edit::Scale { temperature: 0.3 },
                Edit::Force {
                    token: 1500,
                    value: ForcedValue::Keep,
                },
            ]),
        ),
        (
            2,
            plan(&[
                Edit::Bias {
                    token: 7,
                    bias: 0.25,
                },
                Edit::Force {
                    token: 7,
                    value: ForcedValue::Set(2.5),
                },
            ]),
        ),
        (
            3,
            plan(&[
                Edit::Ban { token: 3 },
                Edit::Bias {
                    token: 3,
                    bias: 1.0,
                },
                Edit::Bias {
                    token: 1030,
                    bias: -0.5,
                },
                Edit::Scale { temperature: 0.9 },
                Edit::Penalty {
                    token: 1030,
                    penalty: 1.3,
                },
                Edit::Penalty {
                    token: 5,
                    penalty: 1.7,
                },
                Edit::Ban { token: last },
            ]),
        ),
        (4, masked),
        (
            5,
            plan(&[
                Edit::Scale { temperature: 0.8 },
                Edit::Ban { token: 10 },
                top_k(50),
                Edit::Bias {
                    token: 11,
                    bias: 0.5,
                },
            ]),
        ),
        (
            6,
            plan(&[
                Edit::Ban { token: 0 },
                Edit::Bias {
                    token: 2047,
                    bias: 3.0,
                },
                Edit::Penalty {
                    token: 100,
                    penalty: 1.2,
                },
            ]),
        ),
        (
            8,
            plan(&[
                top_k(5),
                Edit::Force {
                    token: 42,
                    value: ForcedValue::Keep,
                },
            ]),
        ),
        (
            9,
            plan(&[
                Edit::Scale { temperature: 0.5 },
                Edit::Truncate(Truncation::TopP {
                    p: 0.8,
                    min_keep: 1,
                }),
                Edit::Bias {
                    token: 900,
                    bias: 0.5,
                },
            ]),
        ),
        (
            10,
            plan(&[Edit::Truncate(Truncation::MinP {
                p: 0.05,
                min_keep: 2,
            })]),
        ),
        (
            11,
            plan(&[
                Edit::Ban { token: 12 },
                Edit::Truncate(Truncation::Typical {
                    mass: 0.7,
                    min_keep: 3,
                }),
            ]),
        ),
        (
            12,
            plan(&[Edit::Truncate(Truncation::Epsilon {
                epsilon: 1e-3,
                min_keep: 1,
            })]),
        ),
        (
            13,
            plan(&[
                Edit::Scale { temperature: 1.5 },
                Edit::Truncate(Truncation::Eta {
                    epsilon: 1e-3,
                    min_keep: 1,
                }),
                Edit::Truncate(Truncation::MinP {
                    p: 0.2,
                    min_keep: 1,
                }),
            ]),
        ),
        (
            14,
            // Raises of negative and positive logits around a scale; a set, and a set that brings
            // back a banned token, raised after.
            plan(&[
                Edit::AddScaledAbs {
                    token: 5,
                    factor: 0.25,
                },
                Edit::AddScaledAbs {
                    token: 900,
                    factor: 1.5,
                },
                Edit::Scale { temperature: 0.9 },
                Edit::AddScaledAbs {
                    token: 5,
                    factor: 0.125,
                },
                Edit::Set {
                    token: 17,
                    value: -2.75,
                },
                Edit::Ban { token: last },
                Edit::Set {
                    token: last,
                    value: 1.3,
                },
                Edit::AddScaledAbs {
                    token: last,
                    factor: 0.7,
                },
            ]),
        ),
        (
            15,
            // A forced row with more survivors: sets after the force, one before a truncation (the
            // band sees it) and one after; the set before the force does not survive.
            plan(&[
                Edit::Set {
                    token: 3,
                    value: 9.0,
                },
                Edit::Bias {
                    token: 40,
                    bias: 0.5,
                },
                Edit::Force {
                    token: 40,
                    value: ForcedValue::Keep,
                },
                Edit::Set {
                    token: 1100,
                    value: 3.0,
                },
                Edit::AddScaledAbs {
                    token: 1100,
                    factor: 0.5,
                },
                top_k(1),
                Edit::Set {
                    token: last - 53,
                    value: -1.0,
                },
                Edit::Scale { temperature: 0.5 },
            ]),
        ),
        (
            16,
            // Values read where they stand (a multiple choice's boost by its first word's logit):
            // after a scale, before the source's own bias, and from a token another read boosts.
            plan(&[
                Edit::Scale { temperature: 0.9 },
                Edit::AddScaledFrom {
                    token: 5,
                    source: last - 1,
                    factor: 0.5,
                },
                Edit::Bias {
                    token: last - 1,
                    bias: 2.0,
                },
                Edit::AddScaledFrom {
                    token: last,
                    source: 5,
                    factor: -0.25,
                },
            ]),
        ),
        (
            17,
            // Infinities and NaN made finite between other edits: a ban's -inf becomes the
            // type's lowest, and the scale after it overflows it back (f32) or not.
            plan(&[
                Edit::Ban { token: 3 },
                Edit::Set {
                    token: 4,
                    value: f32::NAN,
                },
                Edit::Whole(logits_processing::WholeRow::InfNanRemove),
                Edit::Scale { temperature: 0.5 },
            ]),
        ),
        (
            18,
            plan(&[
                Edit::Scale { temperature: 0.4 },
                Edit::Truncate(Truncation::TopA {
                    a: 0.2,
                    min_keep: 2,
                }),
            ]),
        ),
        (
            19,
            // XTC's cut: the most likely tokens above the least likely one reaching the threshold.
            plan(&[
                Edit::Scale { temperature: 0.1 },
                Edit::Truncate(Truncation::Xtc {
                    threshold: 0.0002,
                    min_keep: 2,
                }),
            ]),
        ),
        (
            20,
            // Conditional forces on the argmax: one whose token is not the largest (it does not
            // fire), one whose token a set made the largest (it fires), a bias on its token after.
            plan(&[
                Edit::ForceIf {
                    token: Some(12),
                    when: Trigger::ArgmaxIs { token: last },
                    key: 0,
                },
                Edit::Set {
                    token: 9,
                    value: 100.0,
                },
                Edit::ForceIf {
                    token: Some(12),
                    when: Trigger::ArgmaxIs { token: 9 },
                    key: 1,
                },
                Edit::Bias {
                    token: 12,
                    bias: 1.0,
                },
            ]),
        ),
        (
            21,
            // On the largest probability: a watch that fires, a force that does not, one that
            // does, and a set after it that survives.
            plan(&[
                Edit::Scale { temperature: 0.5 },
                Edit::ForceIf {
                    token: None,
                    when: Trigger::MaxProbBelow { p: 0.5 },
                    key: 0,
                },
                Edit::ForceIf {
                    token: Some(last - 2),
                    when: Trigger::MaxProbBelow { p: 1e-30 },
                    key: 1,
                },
                Edit::ForceIf {
                    token: Some(last),
                    when: Trigger::MaxProbBelow { p: 0.9 },
                    key: 2,
                },
                Edit::Set {
                    token: 6,
                    value: -1.5,
                },
            ]),
        ),
        (
            22,
            plan(&[
                Edit::Scale { temperature: 0.05 },
                Edit::Truncate(Truncation::MirostatV2 { mu: 12.0, key: 0 }),
            ]),
        ),
        (
            23,
            // Smoothing's quadratic around the row's largest value, after a bias that makes it,
            // with a cubic term; then a top-k over the reshaped row.
            plan(&[
                Edit::Bias {
                    token: 30,
                    bias: 20.0,
                },
                Edit::Reshape(logits_processing::Reshape::Smoothing { k: 0.4, s: 0.05 }),
                top_k(20),
            ]),
        ),
        (
            24,
            // adaptive-p's transform toward its target probability, after a temperature.
            plan(&[
                Edit::Scale { temperature: 0.2 },
                Edit::Reshape(logits_processing::Reshape::AdaptiveP {
                    target: 0.3,
                    key: 0,
                }),
            ]),
        ),
        (
            25,
            // Log-probabilities after a top-p (its removed tokens stay -inf).
            plan(&[
                Edit::Truncate(Truncation::TopP {
                    p: 0.9,
                    min_keep: 1,
                }),
                Edit::Reshape(logits_processing::Reshape::LogSoftmax),
            ]),
        ),
        (
            26,
            // p-less and p-less-norm after a temperature.
            plan(&[
                Edit::Scale { temperature: 0.3 },
                Edit::Truncate(Truncation::PLess {
                    min_keep: 2,
                    normalized: true,
                }),
                Edit::Truncate(Truncation::PLess {
                    min_keep: 1,
                    normalized: false,
                }),
            ]),
        ),
    ];
    // The same plans in every group of rows (each group's own logits).
    (0..ROWS / GROUP)
        .flat_map(|group| {
            one_group
                .iter()
                .map(move |(row, plan)| (group * GROUP + row, plan.clone()))
        })
        .collect()
}

/// The input block: values spread over both signs, with the special ones the edits treat apart.
pub(crate) fn input<T: Logit>(layout: BatchLayout, vocab: usize) -> Vec<T> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    (0..layout.required_len(vocab))
        .map(|i| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            T::from_f32(match i % 97 {
                0 => -0.0,
                1 => 0.0,
                2 => 1e-40,
                _ => (seed >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0,
            })
        })
        .collect()
}

/// The check's block at `vocab`: [`ROWS`] rows, padded.
pub(crate) fn layout(vocab: usize) -> BatchLayout {
    BatchLayout {
        rows: ROWS,
        row_stride: vocab + 3,
    }
}

/// The first element where `got` and `want` differ (NaN equal to NaN), as a message.
pub(crate) fn difference<T: Logit>(got: &[T], want: &[T], stride: usize) -> Option<String> {
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    let i = (0..got.len()).find(|&i| !same(got[i].to_f32(), want[i].to_f32()))?;
    let (g, w) = (got[i].to_f32(), want[i].to_f32());
    Some(format!(
        "{}: row {}, token {}: GPU {g:e} (bits {:#010x}), CPU {w:e} (bits {:#010x})",
        T::DTYPE.name(),
        i / stride,
        i % stride,
        g.to_bits(),
        w.to_bits()
    ))
}

fn check<T: Logit>(
    applier: &mut CudaBatchApplier,
    stream: &Stream,
    vocab: usize,
) -> Result<(), String> {
    let layout = layout(vocab);
    let input = input::<T>(layout, vocab);
    let mut listed = plans(vocab);
    let mut want = input.clone();
    for (row, plan) in &mut listed {
        let start = *row * layout.row_stride;
        plan.apply(&mut want[start..start + vocab])
            .map_err(|e| format!("the CPU refused the check's plan: {e}"))?;
    }
    let plans: Vec<(usize, &RowPlan)> = listed.iter().map(|(r, p)| (*r, p)).collect();
    let ordinal = applier.device_ordinal();
    let could_not = |e: CudaError| format!("could not run: {e}");
    let buffer = DeviceBuffer::from_host(ordinal, &input).map_err(could_not)?;
    // SAFETY: the buffer covers the layout; the stream is live.
    unsafe {
        applier.apply_plans(
            &plans,
            buffer.ptr(),
            T::DTYPE,
            layout,
            vocab,
            stream.raw(),
            &|_| &[],
            None,
        )
    }
    .map_err(could_not)?;
    stream.synchronize().map_err(could_not)?;
    let mut got = input.clone();
    buffer.to_host(&mut got).map_err(could_not)?;
    match difference(&got, &want, layout.row_stride) {
        None => Ok(()),
        Some(message) => Err(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const VOCAB: usize = MIN_VOCAB;

    /// The check's rows: every group the same plans, all but row 7 listed.
    #[test]
    fn the_check_runs_its_plans_over_a_few_hundred_rows() {
        let listed = plans(151_936);
        assert_eq!(listed.len(), ROWS / GROUP * (GROUP - 1));
        assert!(listed
            .iter()
            .all(|(row, _)| row % GROUP != 7 && *row < ROWS));
        for (row, plan) in &listed {
            plan.validate(151_936).unwrap();
            // (By their Debug text: a NaN set is not equal to itself.)
            let first = &plans(151_936)[row % GROUP - usize::from(row % GROUP > 7)].1;
            assert_eq!(
                format!("{:?}", plan.edits()),
                format!("{:?}", first.edits())
            );
        }
    }

    #[test]
    fn the_check_covers_every_op() {
        use crate::packed::Op;
        let listed = plans(VOCAB);
        // A value read (`ValueAt`) is packed where an `AddScaledFrom` stands.
        for op in Op::ALL.into_iter().filter(|op| *op != Op::ValueAt) {
            assert!(
                listed
                    .iter()
                    .any(|(_, p)| p.edits().iter().any(|e| Op::of(e) == Some(op))),
                "{op:?} is not in the self-check"
            );
        }
    }

    #[test]
    fn the_check_covers_every_truncation_rule() {
        use crate::packed::Rule;
        let listed = plans(VOCAB);
        for rule in Rule::ALL {
            assert!(
                listed.iter().any(|(_, p)| p.edits().iter().any(
                    |e| matches!(e, Edit::Truncate(t) if Rule::of(t).map(|r| r.0) == Some(rule))
                )),
                "{rule:?} is not in the self-check"
            );
        }
    }

    /// Each truncation row of the check removes some logits and keeps some: the band is tested.
    #[test]
    fn the_check_truncations_cut_inside_the_row() {
        let layout = layout(VOCAB);
        let input = input::<f32>(layout, VOCAB);
        for (row, mut plan) in plans(VOCAB) {
            let truncates = plan.edits().iter().any(|e| matches!(e, Edit::Truncate(_)));
            if !truncates || plan.forced_token().is_some() {
                continue;
            }
            let start = row * layout.row_stride;
            let mut out = input[start..start + VOCAB].to_vec();
            plan.apply(&mut out).unwrap();
            let removed = out.iter().filter(|x| **x == f32::NEG_INFINITY).count();
            assert!(
                removed > 2 && removed < VOCAB - 1,
                "row {row}: {removed} removed"
            );
        }
    }

    /// The forced row with sets after its force keeps more than its forced token, and fills the
    /// rest: the kernel's other survivors are tested.
    #[test]
    fn the_check_has_a_forced_row_with_more_survivors() {
        let layout = layout(VOCAB);
        let input = input::<f32>(layout, VOCAB);
        let (row, mut plan) = plans(VOCAB)
            .into_iter()
            .find(|(_, p)| {
                p.forced_token().is_some() && p.set_after_force(0..p.edits().len()).count() > 1
            })
            .expect("a forced row with sets after the force");
        let start = row * layout.row_stride;
        let mut out = input[start..start + VOCAB].to_vec();
        plan.apply(&mut out).unwrap();
        let kept = out.iter().filter(|x| **x != f32::NEG_INFINITY).count();
        assert!(kept > 1 && kept < 5, "row {row}: {kept} kept");
    }

    #[test]
    fn a_difference_names_row_token_and_values() {
        let want = vec![1.0f32; 10];
        let mut got = want.clone();
        got[7] = 2.0;
        let message = difference(&got, &want, 5).unwrap();
        assert!(
            message.starts_with("float32: row 1, token 2: GPU 2e0"),
            "{message}"
        );
    }
}
