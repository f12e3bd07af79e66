//! The packed format, checked on the host: what `PackedPlans::pack` refuses, and the layout it
//! writes. What the kernels make of the words is checked by running them: through Triton's
//! interpreter in the Python suite (`test_triton_kernels.py`, on this crate's `testing` cases),
//! and on a GPU (`tests/gpu.rs`).

use logits_processing_cuda::packed::PackedPlans;
use logits_processing_cuda::testing::plan_of;
use logits_processing_cuda::CudaError;

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

/// A forced row's other survivors (the tokens sets after its last force bring back) are packed
/// sorted and distinct, without the forced token.
#[test]
fn a_forced_rows_other_survivors_are_packed_sorted_and_distinct() {
    use logits_processing::{Edit, ForcedValue};
    use logits_processing_cuda::packed::DESC_WORDS;
    let vocab = 3000;
    let set = |token, value| Edit::Set { token, value };
    let plan = plan_of(&[
        Edit::Force {
            token: 1023,
            value: ForcedValue::Keep,
        },
        set(1024, 2.0),
        set(7, -1.5),
        set(1024, 3.0),
    ]);
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
        Edit::Reshape(Reshape::DynamicTemperature {
            temperature: 1.0,
            range: 0.5,
            exponent: 1.0,
        }),
        Edit::Truncate(Truncation::TopNSigma { n: 1.0 }),
        Edit::Truncate(Truncation::TailFree {
            z: 0.9,
            min_keep: 1,
        }),
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
