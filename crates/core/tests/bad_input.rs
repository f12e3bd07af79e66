//! The bad-input matrix of the core: each bad spec, row, layout or history gets its error variant,
//! and leaves the logits and every processor's state as they were (a twin batch that never saw
//! the bad call gives the same answers, bit for bit, afterwards).

use logits_processing::spec::{MAX_PIPELINE_LEN, MAX_SPEC_BYTES, MAX_TOKEN_IDS};
use logits_processing::{
    parse_pipeline, Batch, BatchLayout, EngineContext, Error, ForcedSequence, LogitsProcessor,
    Pipeline, ThinkingBudget, ThinkingTokenConfig, TokenHistory,
};

const VOCAB: usize = 16;

fn context() -> EngineContext {
    EngineContext {
        vocab_size: Some(VOCAB),
        ..Default::default()
    }
}

fn pipeline(json: &str) -> Pipeline {
    Pipeline::from_specs(&parse_pipeline(json).unwrap(), &context(), 0).unwrap()
}

fn new_batch() -> Batch {
    let mut batch = Batch::new(VOCAB);
    batch
        .add(
            0,
            pipeline(r#"{"kind": "temperature", "temperature": 0.5}"#),
        )
        .unwrap();
    batch
        .add(
            2,
            pipeline(r#"{"kind": "forced_sequence", "token_ids": [3, 4, 5], "eos_token_id": 1}"#),
        )
        .unwrap();
    batch
}

fn block() -> Vec<f32> {
    (0..3 * VOCAB).map(|i| i as f32 / 7.0).collect()
}

fn step(batch: &mut Batch) -> Vec<u32> {
    let mut logits = block();
    let ids: [&dyn TokenHistory; 3] = [&[7u32], &[], &[7u32, 3]];
    batch
        .apply(&mut logits, BatchLayout::contiguous(3, VOCAB), &ids)
        .unwrap();
    logits.iter().map(|x| x.to_bits()).collect()
}

/// Runs `bad` on one of two twin batches, checks its error, and that both answer alike after.
fn check(bad: impl FnOnce(&mut Batch) -> Error, expect: impl Fn(&Error) -> bool) {
    let (mut subject, mut twin) = (new_batch(), new_batch());
    step(&mut subject);
    step(&mut twin);
    let error = bad(&mut subject);
    assert!(expect(&error), "unexpected error: {error:?}");
    for _ in 0..4 {
        assert_eq!(step(&mut subject), step(&mut twin));
    }
    assert_eq!(
        subject.iter().map(|(r, _)| r).collect::<Vec<_>>(),
        twin.iter().map(|(r, _)| r).collect::<Vec<_>>()
    );
}

#[test]
fn bad_specs_are_spec_errors() {
    let deep = "[".repeat(100_000);
    let long_ids = format!(
        r#"{{"kind": "ban_tokens", "token_ids": [{}]}}"#,
        vec!["1"; MAX_TOKEN_IDS + 1].join(",")
    );
    let long_pipeline = format!(
        "[{}]",
        vec![r#"{"kind": "temperature", "temperature": 0.5}"#; MAX_PIPELINE_LEN + 1].join(",")
    );
    let huge = " ".repeat(MAX_SPEC_BYTES + 1);
    for text in [
        "",
        "not json",
        "{}",
        r#"{"kind": 5}"#,
        r#"{"kind": "no_such_kind"}"#,
        r#"{"kind": "temperature", "temperature": "hot"}"#,
        r#"{"kind": "temperature", "temperature": 1e400}"#,
        r#"{"kind": "temperature", "temperature": -1}"#,
        r#"{"kind": "forced_sequence", "token_ids": [-1], "eos_token_id": 0}"#,
        r#"{"kind": "forced_sequence", "token_ids": [4294967296], "eos_token_id": 0}"#,
        r#"{"kind": "forced_sequence", "token_ids": [1]}"#,
        r#"{"kind": "ban_tokens", "token_ids": [1], "extra": 1}"#,
        r#"{"kind": "thinking_budget", "max_thinking_tokens": 18446744073709551616}"#,
        r#"{"kind": "temperature", "temperature": 0.5, "\ud800": 1}"#,
        &deep,
        &long_ids,
        &long_pipeline,
        &huge,
    ] {
        let parsed = parse_pipeline(text)
            .and_then(|specs| Pipeline::from_specs(&specs, &context(), 0).map(drop));
        match parsed {
            Err(
                Error::InvalidSpec { .. } | Error::TooLarge { .. } | Error::InvalidArgument { .. },
            )
            | Err(Error::InvalidTemperature { .. } | Error::MissingEosToken { .. }) => {}
            other => panic!("{:.60}: {other:?}", text),
        }
    }
}

#[test]
fn a_pipeline_naming_an_id_outside_the_vocab_is_refused_and_changes_nothing() {
    check(
        |batch| {
            batch
                .add(1, pipeline(r#"{"kind": "ban_tokens", "token_ids": [15]}"#))
                .unwrap();
            let too_far = Pipeline::from_specs(
                &parse_pipeline(r#"{"kind": "ban_tokens", "token_ids": [16]}"#).unwrap(),
                &EngineContext::default(),
                0,
            )
            .unwrap();
            let error = batch.add(0, too_far).unwrap_err();
            batch.remove(1);
            error
        },
        |e| matches!(e, Error::InRow { row: 0, error } if matches!(**error, Error::TokenOutOfVocab { .. })),
    );
}

#[test]
fn rows_up_to_usize_max_are_keys_and_a_step_that_misses_them_changes_nothing() {
    check(
        |batch| {
            batch
                .add(
                    usize::MAX,
                    pipeline(r#"{"kind": "temperature", "temperature": 2.0}"#),
                )
                .unwrap();
            let mut logits = block();
            let ids: [&dyn TokenHistory; 3] = [&[7u32], &[], &[7u32, 3]];
            let error = batch
                .apply(&mut logits, BatchLayout::contiguous(3, VOCAB), &ids)
                .unwrap_err();
            assert_eq!(logits, block());
            batch.move_row(usize::MAX, usize::MAX - 1);
            batch.swap_rows(usize::MAX - 1, usize::MAX);
            assert!(batch.remove(usize::MAX).is_some());
            error
        },
        |e| {
            matches!(
                e,
                Error::Row {
                    row: usize::MAX,
                    ..
                }
            )
        },
    );
}

#[test]
fn layouts_that_overflow_or_do_not_fit_are_shape_errors() {
    for layout in [
        BatchLayout {
            rows: usize::MAX,
            row_stride: usize::MAX,
        },
        BatchLayout {
            rows: 3,
            row_stride: VOCAB - 1,
        },
        BatchLayout {
            rows: 4,
            row_stride: VOCAB,
        },
        BatchLayout {
            rows: 2,
            row_stride: VOCAB,
        },
    ] {
        check(
            |batch| {
                let mut logits = block();
                let ids: [&dyn TokenHistory; 3] = [&[7u32], &[], &[7u32, 3]];
                let error = batch.apply(&mut logits, layout, &ids).unwrap_err();
                assert_eq!(logits, block());
                error
            },
            |e| matches!(e, Error::Shape(_) | Error::Row { .. }),
        );
    }
}

#[test]
fn too_few_histories_is_a_row_error() {
    check(
        |batch| {
            let mut logits = block();
            let ids: [&dyn TokenHistory; 1] = [&[7u32]];
            let error = batch
                .apply(&mut logits, BatchLayout::contiguous(3, VOCAB), &ids)
                .unwrap_err();
            assert_eq!(logits, block());
            error
        },
        |e| matches!(e, Error::InRow { row: 2, .. } | Error::Row { row: 2, .. }),
    );
}

#[test]
fn numbers_from_users_saturate() {
    // A state past the end is EOS however large; it never wraps to the start.
    let mut forced = ForcedSequence::new(vec![3, 4], Some(1)).unwrap();
    forced.set_state(usize::MAX);
    let mut row = vec![0.0f32; VOCAB];
    logits_processing::process_row(&mut forced, &[1u32], &mut row).unwrap();
    assert_eq!(row[1], 0.0);
    assert!(row[3].is_infinite());
    assert_eq!(forced.state(), usize::MAX);
    // An overflow budget past usize::MAX saturates; the hard limit is then never reached.
    let tokens = ThinkingTokenConfig {
        start_token_id: 1,
        end_token_id: 2,
        newline_token_id: 3,
    };
    let mut budget = ThinkingBudget::new(tokens, 10, 1e300).unwrap();
    assert_eq!(budget.overflow_budget(), usize::MAX);
    let ids: Vec<u32> = std::iter::once(1).chain([4; 50]).collect();
    assert!(!budget.must_end(&ids));
    let mut budget = ThinkingBudget::new(tokens, usize::MAX, 0.5).unwrap();
    assert!(!budget.must_end(&ids));
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        assert!(matches!(
            ThinkingBudget::new(tokens, 10, bad),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let _: &dyn LogitsProcessor = &forced;
}
