//! The host round trip ([`round_trip::apply_batch`]) through host memory reached by copies, as a
//! device's is: equal to the CPU path bit for bit (it is the CPU path), on ragged batches with
//! external steps, for the kinds the kernels do not carry, and a failed step leaves the memory and
//! every row's state as they were. Runs everywhere (no GPU).

use logits_processing::{
    parse_pipeline, Batch, BatchLayout, EngineContext, Error, Logit, Pipeline, TokenHistory,
};
use logits_processing_cuda::round_trip::{self, HostMemory};
use logits_processing_cuda::testing::{bits, dtypes, external_edit, lifecycle, logits, Rng};
use logits_processing_cuda::{for_dtype, packed};

fn ragged_case<T: Logit>(seed: u64, vocab: usize) {
    let result = lifecycle::<T>(seed, vocab, 5, true, |batch, input, layout| {
        let mut device = input.to_vec();
        let base = device.as_mut_ptr();
        let (stride, bytes) = (layout.row_stride, std::mem::size_of_val(input));
        // SAFETY: `device` outlives the memory, and only its copies touch it during the step.
        let mut memory = unsafe { HostMemory::new(base.cast(), bytes) };
        let mut external = |row: usize, key: u64| {
            // An external step edits its row where it lives.
            // SAFETY: the round trip wrote the row there and reads it back after this returns.
            let row = unsafe { std::slice::from_raw_parts_mut(base.add(row * stride), vocab) };
            external_edit(key, row);
            Ok(())
        };
        round_trip::apply_batch(&mut memory, batch, T::DTYPE, layout, &mut external).unwrap();
        device
    });
    if let Err(message) = result {
        panic!("seed {seed}: {message}");
    }
}

#[test]
fn round_trip_equals_the_cpu_path_on_ragged_batches_with_external_steps() {
    for vocab in [1, 37, 2053] {
        for dtype in dtypes() {
            for seed in 0..6 {
                for_dtype!(dtype, ragged_case(seed * 17 + 3, vocab));
            }
        }
    }
}

const VOCAB: usize = 64;
const EOS: u32 = 0;

/// Kinds whose plans the kernels do not carry (some only on some steps), as the V2 tests write
/// them (`multiple_choice` with `boost_first_words`, which needs token texts: the Python tests).
const HOST_ONLY: &[&str] = &[
    r#"[{"kind": "smoothing", "factor": 0.5}]"#,
    r#"[{"kind": "dynamic_temperature", "temperature": 0.8, "range": 0.3}]"#,
    r#"[{"kind": "top_n_sigma", "n": 1.0}]"#,
    r#"[{"kind": "top_a", "a": 0.2}]"#,
    r#"[{"kind": "tail_free", "z": 0.9}]"#,
    r#"[{"kind": "xtc", "probability": 0.5, "threshold": 0.05, "seed": 7}]"#,
    r#"[{"kind": "mirostat", "version": 2, "tau": 3.0}]"#,
    r#"[{"kind": "mirostat", "version": 1, "tau": 3.0, "n_vocab": 64}]"#,
    r#"[{"kind": "min_p", "p": 0.02}, {"kind": "adaptive_p", "target": 0.5}]"#,
    r#"[{"kind": "force_last_phrase", "phrase": [40, 41, 42], "eos_token_id": 0}]"#,
    r#"[{"kind": "trigger_phrase", "phrase": [43, 44], "trigger_token_phrase": 7, "trigger_count": 2}]"#,
    r#"[{"kind": "prevent_hallucination", "minp": 0.3, "tolerate": 1, "phrase": [45, 46]}]"#,
];

fn batch_of(specs: &[&str], prompt: usize) -> Batch {
    let context = EngineContext::default();
    let mut batch = Batch::new(VOCAB);
    for (row, json) in specs.iter().enumerate() {
        let specs = parse_pipeline(json).unwrap();
        let pipeline = Pipeline::from_specs(&specs, &context, prompt)
            .unwrap()
            .with_eos_token_ids(vec![EOS]);
        batch.add(row, pipeline).unwrap();
    }
    batch
}

fn argmax<T: Logit>(row: &[T]) -> u32 {
    let mut best = 0;
    for (i, x) in row.iter().enumerate() {
        if x.to_f32() > row[best].to_f32() {
            best = i;
        }
    }
    best as u32
}

/// The kinds the kernels do not carry, each a row of one batch over a decode loop (every row's
/// token its greedy pick, steps with and without a padded stride): the round trip's logits equal
/// the CPU path's bit for bit at every step, and some step needed the host.
fn host_only_case<T: Logit>(seed: u64) {
    let prompt = 3;
    let (mut on_host, mut cpu) = (batch_of(HOST_ONLY, prompt), batch_of(HOST_ONLY, prompt));
    let rows = HOST_ONLY.len();
    let mut ids: Vec<Vec<u32>> = (0..rows).map(|r| vec![1, 7, 2 + r as u32]).collect();
    let mut rng = Rng::new(seed);
    let mut needed_host = 0;
    for step in 0..24 {
        let layout = BatchLayout {
            rows,
            row_stride: VOCAB + [0, 5][step % 2],
        };
        let input: Vec<T> = logits(&mut rng, layout.required_len(VOCAB));
        let histories: Vec<&dyn TokenHistory> =
            ids.iter().map(|h| h as &dyn TokenHistory).collect();
        on_host.plan(&histories).unwrap();
        cpu.plan(&histories).unwrap();
        needed_host += packed::needs_host(&on_host) as usize;
        let mut device = input.clone();
        let bytes = std::mem::size_of_val(&device[..]);
        // SAFETY: `device` outlives the memory, and only its copies touch it during the step.
        let mut memory = unsafe { HostMemory::new(device.as_mut_ptr().cast(), bytes) };
        round_trip::apply_batch(&mut memory, &mut on_host, T::DTYPE, layout, &mut |_, _| {
            Ok(())
        })
        .unwrap();
        assert_eq!(memory.waits, 1, "one wait a step without external steps");
        let mut want = input.clone();
        cpu.apply_planned(&mut want, layout, &mut |_, _, _| Ok(()))
            .unwrap();
        assert_eq!(
            bits(&device),
            bits(&want),
            "step {step}, {}",
            T::DTYPE.name()
        );
        for (row, history) in ids.iter_mut().enumerate() {
            let start = row * layout.row_stride;
            history.push(argmax(&device[start..start + VOCAB]));
        }
    }
    assert!(
        needed_host > 0,
        "no step held a plan the kernels do not carry"
    );
}

#[test]
fn kinds_the_kernels_do_not_carry_equal_the_cpu_path_by_the_round_trip() {
    for dtype in dtypes() {
        for seed in 0..3 {
            for_dtype!(dtype, host_only_case(seed));
        }
    }
}

/// An external step that fails after others edited their rows on the device: the memory holds
/// what it held before the step, bit for bit, and every row's state is taken back (the next step
/// equals that of a batch that never took the failed one).
#[test]
fn a_failed_step_leaves_the_memory_and_every_row_as_they_were() {
    let mut rng = Rng::new(11);
    let layout = BatchLayout {
        rows: 4,
        row_stride: VOCAB + 3,
    };
    let fresh = || {
        let mut batch = batch_of(&HOST_ONLY[..3], 2);
        batch
            .add(3, Pipeline::new(vec![logits_processing::Step::External(9)]))
            .unwrap();
        batch
    };
    let (mut failing, mut untouched) = (fresh(), fresh());
    let ids: Vec<Vec<u32>> = (0..4).map(|r| vec![3, r]).collect();
    let histories: Vec<&dyn TokenHistory> = ids.iter().map(|h| h as &dyn TokenHistory).collect();
    let input: Vec<f32> = logits(&mut rng, layout.required_len(VOCAB));
    let mut device = input.clone();
    let base: *mut f32 = device.as_mut_ptr();
    failing.plan(&histories).unwrap();
    {
        // SAFETY: `device` outlives the memory, and only its copies and the step below touch it.
        let mut memory = unsafe { HostMemory::new(base.cast(), input.len() * 4) };
        let error = round_trip::apply_batch(
            &mut memory,
            &mut failing,
            logits_processing::DType::F32,
            layout,
            &mut |row, _| {
                // It edits its row where it lives, then fails.
                // SAFETY: the round trip wrote the row there and nothing else touches it meanwhile.
                unsafe { *base.add(row * layout.row_stride) = 1e9 };
                Err(Error::External("the user's step raised".into()))
            },
        )
        .unwrap_err();
        assert!(error.to_string().contains("raised"), "{error}");
        assert_eq!(
            memory.waits, 2,
            "the read, and the row written for the external step"
        );
    }
    assert_eq!(bits(&device), bits(&input));
    // The next step: the same as a batch that never planned the failed one.
    let next: Vec<f32> = logits(&mut rng, layout.required_len(VOCAB));
    let (mut a, mut b) = (next.clone(), next.clone());
    for (batch, out) in [(&mut failing, &mut a), (&mut untouched, &mut b)] {
        batch.plan(&histories).unwrap();
        batch
            .apply_planned(out, layout, &mut |_, _, _| Ok(()))
            .unwrap();
    }
    assert_eq!(bits(&a), bits(&b));
}
