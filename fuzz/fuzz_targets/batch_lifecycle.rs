//! The batch's row lifecycle (add, remove, move, swap, steps that succeed or fail) against a
//! simple model: one pipeline per row kept apart and run row by row. After every step the block
//! must be what the model gives, and after a failed step exactly what it was before.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use logits_processing::{
    parse_pipeline, Batch, BatchLayout, Error, Pipeline, EngineContext, Step, ThinkingTokenConfig,
    TokenHistory,
};

const ROWS: usize = 6;
const VOCAB: usize = 16;

#[derive(Arbitrary, Debug)]
enum Op {
    Add {
        row: u8,
        kind: u8,
        a: u8,
        b: u8,
    },
    Remove {
        row: u8,
    },
    Move {
        from: u8,
        to: u8,
    },
    Swap {
        a: u8,
        b: u8,
    },
    /// A step; with `fail`, the external step of that row fails after scribbling on its row.
    Apply {
        tokens: [u8; ROWS],
        fail: Option<u8>,
    },
}

fn spec(kind: u8, a: u8, b: u8) -> String {
    let id = |x: u8| x as usize % VOCAB;
    match kind % 6 {
        0 => format!(
            r#"{{"kind": "temperature", "temperature": {}}}"#,
            0.25 + a as f64 / 64.0
        ),
        1 => format!(
            r#"{{"kind": "forced_sequence", "token_ids": [{}, {}], "eos_token_id": {}}}"#,
            id(a),
            id(b),
            id(a ^ b)
        ),
        2 => format!(
            r#"{{"kind": "ban_tokens", "token_ids": [{}, {}]}}"#,
            id(a),
            id(b)
        ),
        3 => format!(
            r#"{{"kind": "repetition_penalty", "penalty": {}}}"#,
            1.0 + a as f64 / 32.0
        ),
        4 => format!(
            r#"{{"kind": "thinking_budget", "max_thinking_tokens": {}}}"#,
            a % 4
        ),
        _ => format!(
            r#"[{{"kind": "temperature", "temperature": 0.5}}, {{"kind": "ban_tokens", "token_ids": [{}]}}]"#,
            id(a)
        ),
    }
}

/// One request: its pipeline in the batch is this one plus an external step.
struct Request {
    model: Pipeline,
    ids: Vec<u32>,
}

fuzz_target!(|ops: Vec<Op>| {
    let context = EngineContext {
        vocab_size: Some(VOCAB),
        hello_world: None,
        thinking_tokens: Some(ThinkingTokenConfig {
            start_token_id: 1,
            end_token_id: 2,
            newline_token_id: 3,
        }),
        ..Default::default()
    };
    let build = |text: &str, external: Option<u64>| {
        let specs = parse_pipeline(text).unwrap();
        let mut steps = Pipeline::from_specs(&specs, &context, 0)
            .unwrap()
            .into_steps();
        steps.extend(external.map(Step::External));
        Pipeline::new(steps)
    };
    let mut batch = Batch::new(VOCAB);
    let mut model: BTreeMap<usize, Request> = BTreeMap::new();
    let layout = BatchLayout::contiguous(ROWS, VOCAB);
    let mut next_key = 0u64;
    for op in ops {
        match op {
            Op::Add { row, kind, a, b } => {
                let row = row as usize % ROWS;
                let text = spec(kind, a, b);
                next_key += 1;
                batch.add(row, build(&text, Some(next_key))).unwrap();
                // The model starts from the same ids: the thinking budget opens a block.
                let request = Request {
                    model: build(&text, None),
                    ids: vec![1],
                };
                model.insert(row, request);
            }
            Op::Remove { row } => {
                let row = row as usize % ROWS;
                assert_eq!(batch.remove(row).is_some(), model.remove(&row).is_some());
            }
            Op::Move { from, to } => {
                let (from, to) = (from as usize % ROWS, to as usize % ROWS);
                batch.move_row(from, to);
                if from != to {
                    match model.remove(&from) {
                        Some(request) => model.insert(to, request),
                        None => model.remove(&to),
                    };
                }
            }
            Op::Swap { a, b } => {
                let (a, b) = (a as usize % ROWS, b as usize % ROWS);
                batch.swap_rows(a, b);
                let (at_a, at_b) = (model.remove(&a), model.remove(&b));
                at_a.map(|r| model.insert(b, r));
                at_b.map(|r| model.insert(a, r));
            }
            Op::Apply { tokens, fail } => {
                let fail = fail
                    .map(|f| f as usize % ROWS)
                    .filter(|f| model.contains_key(f));
                for (row, request) in model.iter_mut() {
                    request.ids.push(u32::from(tokens[*row]) % VOCAB as u32);
                }
                let empty: Vec<u32> = vec![];
                let histories: Vec<&dyn TokenHistory> = (0..ROWS)
                    .map(|row| {
                        model
                            .get(&row)
                            .map_or(&empty as &dyn TokenHistory, |r| &r.ids as &dyn TokenHistory)
                    })
                    .collect();
                let before: Vec<f32> = (0..ROWS * VOCAB).map(|i| (i % 7) as f32 - 2.5).collect();
                let mut logits = before.clone();
                let applied = batch.plan(&histories).and_then(|()| {
                    batch.apply_planned(&mut logits, layout, &mut |row, _, slice| {
                        if Some(row) == fail {
                            slice.fill(99.0);
                            return Err(Error::External("a failing step".into()));
                        }
                        Ok(())
                    })
                });
                drop(histories);
                if fail.is_some() {
                    assert!(applied.is_err());
                    assert_eq!(logits, before, "a failed step left the block as it was");
                    for request in model.values_mut() {
                        request.ids.pop();
                    }
                    continue;
                }
                applied.unwrap();
                for row in 0..ROWS {
                    let got = &logits[row * VOCAB..(row + 1) * VOCAB];
                    let mut want = before[row * VOCAB..(row + 1) * VOCAB].to_vec();
                    if let Some(request) = model.get_mut(&row) {
                        request.model.process(&request.ids, &mut want).unwrap();
                    }
                    let (got, want): (Vec<u32>, Vec<u32>) = (
                        got.iter().map(|x| x.to_bits()).collect(),
                        want.iter().map(|x| x.to_bits()).collect(),
                    );
                    assert_eq!(got, want, "row {row}");
                }
            }
        }
        assert_eq!(
            batch.iter().map(|(row, _)| row).collect::<Vec<_>>(),
            model.keys().copied().collect::<Vec<_>>()
        );
    }
});
