//! The packed format and the kernel's algorithm, checked on the host: the emulation of the kernel
//! (`packed::emulate`) must give what `RowPlan::apply` gives, bit for bit, for random plans, every
//! dtype, the vocab sizes of `common::VOCABS` and ragged batches. No GPU needed.

mod common;

use common::{
    cpu_apply, dtypes, external_edit, first_difference, lifecycle, plan_of, random_plans,
    truncation, Rng, VOCABS,
};
use logits_processing::{Batch, BatchLayout, DType, Edit, Logit, RowPlan};
use logits_processing_cuda::packed::{emulate, emulate_batch, PackedPlans};
use logits_processing_cuda::CudaError;
use proptest::prelude::*;

/// Random plans on some rows of a block (others unlisted), emulated kernel vs `RowPlan::apply`.
fn plans_case<T: Logit>(seed: u64, vocab: usize) -> Result<(), String> {
    let (layout, input, listed) = random_plans::<T>(seed, vocab);
    compare(layout, &input, listed, vocab)
}

/// Rows of ordinary logits (spread narrow or wide, ties in the 16-bit types, a few `-inf`, NaN and
/// signed zeros, never `+inf`, so every row has a distribution), each with every kind of
/// truncation after a few other edits (and sometimes a second truncation or a mask between).
fn truncation_case<T: Logit>(seed: u64, vocab: usize) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let rows = 1 + rng.below(3);
    let layout = BatchLayout {
        rows,
        row_stride: vocab + rng.pick(&[0, 3]),
    };
    let spread = rng.pick(&[0.05f32, 1.0, 5.0, 30.0]);
    let input: Vec<T> = (0..layout.required_len(vocab))
        .map(|_| {
            T::from_f32(if rng.chance(300) {
                rng.pick(&[f32::NEG_INFINITY, f32::NAN, 0.0, -0.0])
            } else {
                rng.uniform(-1.0, 1.0) * spread
            })
        })
        .collect();
    let mut listed = vec![];
    for row in 0..rows {
        let mut plan = RowPlan::new();
        for _ in 0..rng.below(4) {
            let token = rng.below(vocab) as u32;
            plan.push(match rng.below(3) {
                0 => Edit::Scale {
                    temperature: rng.uniform(0.3, 2.0),
                },
                1 => Edit::Ban { token },
                _ => Edit::Bias {
                    token,
                    bias: rng.uniform(-3.0, 3.0) * spread,
                },
            });
        }
        plan.push(truncation(&mut rng, vocab));
        if rng.chance(3) {
            let words: Vec<u32> = (0..vocab.div_ceil(32))
                .map(|_| !(rng.next() as u32 & rng.next() as u32))
                .collect();
            plan.push_mask(&words, true);
        }
        if rng.chance(2) {
            plan.push(truncation(&mut rng, vocab));
        }
        listed.push((row, plan));
    }
    compare(layout, &input, listed, vocab)
}

/// The emulated kernels against `RowPlan::apply` on `input`.
fn compare<T: Logit>(
    layout: BatchLayout,
    input: &[T],
    mut listed: Vec<(usize, RowPlan)>,
    vocab: usize,
) -> Result<(), String> {
    let input = input.to_vec();
    let want = cpu_apply(&input, layout, vocab, &mut listed);
    let mut packed = PackedPlans::new();
    packed
        .pack(|| listed.iter().map(|(r, p)| (*r, p)), layout.rows, vocab)
        .map_err(|e| e.to_string())?;
    let mut got = input.clone();
    emulate(&packed, vocab, layout.row_stride, &mut got);
    match first_difference(&got, &want) {
        None => Ok(()),
        Some((i, g, w)) => {
            let row = i / layout.row_stride;
            let plan = listed
                .iter()
                .find(|(r, _)| *r == row)
                .map(|(_, p)| p.edits().iter().take(24).copied().collect::<Vec<_>>());
            Err(format!(
                "{} vocab {vocab}: element {i} (row {row}, index {}) is {g:e}, the CPU gives {w:e}; plan {plan:?}",
                T::DTYPE.name(),
                i % layout.row_stride
            ))
        }
    }
}

fn lifecycle_case<T: Logit>(seed: u64, vocab: usize) -> Result<(), String> {
    let mut packed = PackedPlans::new();
    lifecycle::<T>(
        seed,
        vocab,
        4,
        true,
        |batch: &mut Batch, input: &[T], layout| {
            let mut got = input.to_vec();
            emulate_batch(&mut packed, batch, &mut got, layout, &mut |_, key, row| {
                external_edit(key, row);
                Ok(())
            })
            .unwrap();
            got
        },
    )
}

/// `default` cases, or `default * LOGITS_PROCESSING_CASES_X` for a longer run.
fn cases(default: u32) -> u32 {
    let factor = std::env::var("LOGITS_PROCESSING_CASES_X")
        .ok()
        .and_then(|v| v.parse().ok());
    default * factor.unwrap_or(1)
}

fn dtype_of(i: usize) -> DType {
    dtypes()[i % 3]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    #[test]
    fn emulated_kernel_equals_row_plan_apply_small_vocab(seed in any::<u64>(), d in 0usize..3, v in 2usize..4) {
        // 32,001 and 7
        let r = for_dtype!(dtype_of(d), plans_case(seed, VOCABS[v]));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// Every truncation rule on rows with a distribution, at awkward vocabs (tile and radix edges).
    #[test]
    fn emulated_truncations_equal_row_plan_apply(
        seed in any::<u64>(),
        d in 0usize..3,
        vocab in prop_oneof![Just(1usize), 2usize..40, Just(1023), Just(1025), Just(4097), Just(32001)],
    ) {
        let r = for_dtype!(dtype_of(d), truncation_case(seed, vocab));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn emulated_batch_equals_cpu_batch_small_vocab(seed in any::<u64>(), d in 0usize..3, v in 2usize..4) {
        let r = for_dtype!(dtype_of(d), lifecycle_case(seed, VOCABS[v]));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

proptest! {
    // Full-size rows: fewer cases, each a few rows of 130k-150k logits.
    #![proptest_config(ProptestConfig::with_cases(cases(6)))]

    #[test]
    fn emulated_kernel_equals_row_plan_apply_large_vocab(seed in any::<u64>(), d in 0usize..3, v in 0usize..2) {
        // 151,936 and 129,280
        let r = for_dtype!(dtype_of(d), plans_case(seed, VOCABS[v]));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn emulated_truncations_equal_row_plan_apply_large_vocab(seed in any::<u64>(), d in 0usize..3, v in 0usize..2) {
        let r = for_dtype!(dtype_of(d), truncation_case(seed, VOCABS[v]));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn emulated_batch_equals_cpu_batch_large_vocab(seed in any::<u64>(), d in 0usize..3, v in 0usize..2) {
        let r = for_dtype!(dtype_of(d), lifecycle_case(seed, VOCABS[v]));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
fn forced_keep_turns_negative_zero_into_zero() {
    let plan = plan_of(&[logits_processing::Edit::Force {
        token: 1,
        value: logits_processing::ForcedValue::Keep,
    }]);
    let mut packed = PackedPlans::new();
    packed.pack(|| [(0usize, &plan)].into_iter(), 1, 3).unwrap();
    let mut row = [3.0f32, -0.0, 2.0];
    emulate(&packed, 3, 3, &mut row);
    assert_eq!(row[1].to_bits(), 0.0f32.to_bits());
    assert_eq!(row[0], f32::NEG_INFINITY);
}

#[test]
fn bad_plans_and_rows_are_refused() {
    let mut packed = PackedPlans::new();
    let ok = plan_of(&[logits_processing::Edit::Ban { token: 2 }]);
    let outside = plan_of(&[logits_processing::Edit::Ban { token: 3 }]);
    assert!(matches!(
        packed.pack(|| [(0usize, &outside)].into_iter(), 1, 3),
        Err(CudaError::Core(_))
    ));
    assert!(matches!(
        packed.pack(|| [(1usize, &ok)].into_iter(), 1, 3),
        Err(CudaError::InvalidArgument(_))
    ));
    assert!(matches!(
        packed.pack(|| [(0usize, &ok), (0, &ok)].into_iter(), 1, 3),
        Err(CudaError::InvalidArgument(_))
    ));
    assert_eq!(packed.slots(), 0);
}

#[test]
fn empty_plans_take_no_slot_and_sparse_ops_are_grouped_by_token() {
    use logits_processing::Edit;
    use logits_processing_cuda::packed::{Op, DESC_WORDS, OP_BITS, SPARSE_WORDS};
    let mut packed = PackedPlans::new();
    let empty = plan_of(&[]);
    let sparse = plan_of(&[
        Edit::Ban { token: 5 },
        Edit::Scale { temperature: 0.5 },
        Edit::Bias {
            token: 5,
            bias: 1.0,
        },
        Edit::Ban { token: 2 },
    ]);
    packed
        .pack(|| [(0usize, &empty), (1, &sparse)].into_iter(), 2, 10)
        .unwrap();
    assert_eq!(packed.slots(), 1);
    let w = packed.words();
    let d = &w[..DESC_WORDS];
    assert_eq!(d[0], 1); // row
    assert_eq!(d[3], 1); // one dense op: the scale
    assert_eq!(&w[d[4] as usize..(d[4] + d[5]) as usize], &[2, 5]); // sorted, distinct
    let bounds = &w[d[6] as usize..d[6] as usize + 3];
    // Token 2: one op; token 5: two, in plan order, before and after the scale.
    assert_eq!(bounds[1] - bounds[0], SPARSE_WORDS as u32);
    assert_eq!(bounds[2] - bounds[1], 2 * SPARSE_WORDS as u32);
    let five = &w[bounds[1] as usize..bounds[2] as usize];
    assert_eq!(five[0], Op::Ban as u32);
    assert_eq!(five[2], Op::Bias as u32 | 1 << OP_BITS);
    assert_eq!(packed.truncating(), (w.len(), 0));
}

/// Thousands of sparse edits of one token between dense ops, against the CPU: the token's
/// program is merged with the dense chain in plan order.
#[test]
fn many_edits_of_one_token_equal_the_cpu() {
    use logits_processing::{Edit, Truncation};
    let vocab = 3000;
    let mut edits = vec![];
    for i in 0..4000u32 {
        edits.push(match i % 7 {
            0 => Edit::Bias {
                token: 1234,
                bias: 0.001 * i as f32,
            },
            1 => Edit::Penalty {
                token: 1234,
                penalty: 1.0 + (i % 5) as f32 * 0.01,
            },
            2 if i % 500 == 2 => Edit::Scale { temperature: 1.01 },
            3 if i == 3003 => Edit::Truncate(Truncation::TopK {
                k: 100,
                min_keep: 1,
            }),
            _ => Edit::Bias {
                token: 1234 + i % 3,
                bias: -0.0005,
            },
        });
    }
    let mut plan = plan_of(&edits);
    let input: Vec<f32> = (0..vocab).map(|i| (i % 101) as f32 * 0.1 - 5.0).collect();
    let mut want = input.clone();
    plan.apply(&mut want).unwrap();
    let mut packed = PackedPlans::new();
    packed
        .pack(|| [(0usize, &plan)].into_iter(), 1, vocab)
        .unwrap();
    let mut got = input.clone();
    emulate(&packed, vocab, vocab, &mut got);
    assert_eq!(first_difference(&got, &want), None);
    assert_ne!(want, input);
}

/// A forced row with more survivors: sets after the last force bring their tokens back (and a band
/// after such a set sees them), a set before the force does not; every dtype, tokens on both sides
/// of a tile edge. The survivors' list is packed sorted and distinct, without the forced token.
#[test]
fn sets_after_a_force_survive_as_on_the_cpu() {
    use logits_processing::{ForcedValue, Truncation};
    use logits_processing_cuda::packed::DESC_WORDS;
    fn case<T: Logit>(edits: &[Edit], vocab: usize) {
        let mut plan = plan_of(edits);
        let input: Vec<T> = (0..vocab)
            .map(|i| T::from_f32((i % 37) as f32 * 0.25 - 4.0))
            .collect();
        let mut want = input.clone();
        plan.apply(&mut want).unwrap();
        let mut packed = PackedPlans::new();
        packed
            .pack(|| [(0usize, &plan)].into_iter(), 1, vocab)
            .unwrap();
        let mut got = input.clone();
        emulate(&packed, vocab, vocab, &mut got);
        assert_eq!(first_difference(&got, &want), None, "{edits:?}");
    }
    let vocab = 3000;
    let force = |token| Edit::Force {
        token,
        value: ForcedValue::Keep,
    };
    let set = |token, value| Edit::Set { token, value };
    let raise = |token, factor| Edit::AddScaledAbs { token, factor };
    let top_k = |k| Edit::Truncate(Truncation::TopK { k, min_keep: 1 });
    let cases: Vec<Vec<Edit>> = vec![
        vec![force(1023), set(1024, 2.0), set(7, -1.5), set(1024, 3.0)],
        vec![set(5, 9.0), force(1023), set(1023, 1.0), raise(1023, 0.5)],
        vec![force(10), set(11, 50.0), top_k(1), set(12, 1.0)],
        vec![
            force(10),
            set(11, -50.0),
            raise(11, 0.25),
            top_k(1),
            force(20),
            set(21, 0.0),
        ],
        vec![
            Edit::Bias {
                token: 2999,
                bias: 1.0,
            },
            force(2999),
            set(0, f32::NEG_INFINITY),
            set(2048, f32::NAN),
            Edit::Scale { temperature: 0.5 },
            top_k(2),
            Edit::Ban { token: 2048 },
        ],
    ];
    for edits in &cases {
        case::<f32>(edits, vocab);
        case::<logits_processing::f16>(edits, vocab);
        case::<logits_processing::bf16>(edits, vocab);
    }
    let plan = plan_of(&cases[0]);
    let mut packed = PackedPlans::new();
    packed
        .pack(|| [(0usize, &plan)].into_iter(), 1, vocab)
        .unwrap();
    let w = packed.words();
    let d = &w[..DESC_WORDS];
    assert_eq!(d[1], 1023);
    assert_eq!(&w[d[8] as usize..(d[8] + d[9]) as usize], &[7, 1024]);
}

#[test]
fn plans_only_the_cpu_path_carries_out_are_refused_as_unsupported() {
    use logits_processing::{Edit, Reshape, Truncation};
    let mut packed = PackedPlans::new();
    let edits = [
        Edit::Reshape(Reshape::Smoothing { k: 1.0, s: 0.0 }),
        Edit::Reshape(Reshape::DynamicTemperature {
            temperature: 1.0,
            range: 0.5,
            exponent: 1.0,
        }),
        Edit::Truncate(Truncation::TopNSigma { n: 1.0 }),
        Edit::Truncate(Truncation::TopA {
            a: 0.1,
            min_keep: 1,
        }),
        Edit::Truncate(Truncation::TailFree {
            z: 0.9,
            min_keep: 1,
        }),
        Edit::Truncate(Truncation::Xtc {
            threshold: 0.1,
            min_keep: 1,
        }),
        Edit::Truncate(Truncation::MirostatV2 { mu: 10.0, key: 0 }),
        Edit::Truncate(Truncation::MirostatV1 {
            mu: 10.0,
            m: 100,
            n_vocab: 3,
            key: 0,
        }),
    ];
    for edit in edits {
        let plan = plan_of(&[Edit::Ban { token: 1 }, edit]);
        assert!(plan.cpu_only());
        assert!(
            matches!(
                packed.pack(|| [(0usize, &plan)].into_iter(), 1, 3),
                Err(CudaError::Unsupported(_))
            ),
            "{edit:?}"
        );
        assert_eq!(packed.slots(), 0);
    }
}
