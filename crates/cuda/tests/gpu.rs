//! The GPU against the CPU, bit for bit: random plans (every kind of edit), every dtype, the
//! vocab sizes of `testing::VOCABS`, ragged batches with external steps, many steps in flight, the self-check.
//! They need a CUDA GPU, so they are ignored in a plain `cargo test` (where they would have
//! nothing to run on); `scripts/gpu-check.sh` runs them (`--include-ignored`) on a GPU machine,
//! with the embedded PTX and again with NVRTC, and there they fail, never skip, when the GPU
//! cannot be used. `tests/no_cuda.rs` checks the machine without a driver.

use logits_processing::{Batch, BatchLayout, Edit, Logit, Truncation};
use logits_processing_cuda::device::{DeviceBuffer, Stream};
use logits_processing_cuda::for_dtype;
use logits_processing_cuda::testing::{
    cpu_apply, dtypes, external_edit, first_difference, lifecycle, plan_of, random_plans, Rng,
    VOCABS,
};
use logits_processing_cuda::{
    cuda_available, cuda_unavailable_reason, CudaBatchApplier, CudaError, Readback,
};

const NEEDS_GPU: &str = "needs a CUDA GPU; run scripts/gpu-check.sh";

/// The applier on GPU 0 (its first creation in the process runs the self-check).
fn gpu() -> CudaBatchApplier {
    assert!(
        cuda_available(),
        "{NEEDS_GPU}: {}",
        cuda_unavailable_reason().unwrap_or_default()
    );
    let applier = CudaBatchApplier::new(0, 151_936)
        .unwrap_or_else(|e| panic!("CudaBatchApplier::new(0): {e}"));
    println!(
        "GPU tests run with the kernels from {}",
        applier.kernel_origin()
    );
    applier
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/gpu-check.sh"]
fn a_gpu_is_available_and_a_missing_ordinal_is_an_error() {
    assert!(cuda_available());
    assert_eq!(cuda_unavailable_reason(), None);
    assert!(matches!(
        CudaBatchApplier::new(1 << 20, 8),
        Err(CudaError::NoDevice(_))
    ));
    assert!(Stream::new(1 << 20).is_err());
}

/// The self-check passes on this device (it ran when the first applier was made).
#[test]
#[ignore = "needs a CUDA GPU; run scripts/gpu-check.sh"]
fn the_self_check_passes() {
    let applier = gpu();
    // A second applier on the same device reuses the cached outcome.
    drop(applier);
    CudaBatchApplier::new(0, 8).unwrap();
}

fn plans_case<T: Logit>(applier: &mut CudaBatchApplier, stream: &Stream, seed: u64, vocab: usize) {
    let (layout, input, mut listed) = random_plans::<T>(seed, vocab);
    let want = cpu_apply(&input, layout, vocab, &mut listed);
    let buffer = DeviceBuffer::from_host(0, &input).unwrap();
    let plans: Vec<(usize, &logits_processing::RowPlan)> =
        listed.iter().map(|(r, p)| (*r, p)).collect();
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
    .unwrap();
    stream.synchronize().unwrap();
    let mut got = input.clone();
    buffer.to_host(&mut got).unwrap();
    if let Some((i, g, w)) = first_difference(&got, &want) {
        panic!(
            "seed {seed}, {} vocab {vocab}: element {i} (row {}, index {}) is {g:e} on the GPU, {w:e} on the CPU",
            T::DTYPE.name(),
            i / layout.row_stride,
            i % layout.row_stride
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/gpu-check.sh"]
fn gpu_plans_equal_cpu_for_every_dtype_and_vocab() {
    let mut applier = gpu();
    let stream = Stream::new(0).unwrap();
    for vocab in VOCABS {
        for dtype in dtypes() {
            let cases = if vocab > 100_000 { 12 } else { 40 };
            for seed in 0..cases {
                let seed = seed * 7919 + vocab as u64;
                for_dtype!(dtype, plans_case(&mut applier, &stream, seed, vocab));
            }
        }
    }
}

fn lifecycle_case<T: Logit>(
    applier: &mut CudaBatchApplier,
    stream: &Stream,
    seed: u64,
    vocab: usize,
) {
    let mut readback = Readback::new();
    let result = lifecycle::<T>(
        seed,
        vocab,
        5,
        true,
        |batch: &mut Batch, input: &[T], layout| {
            let mut buffer = DeviceBuffer::from_host(0, input).unwrap();
            let mut host = input.to_vec();
            let ptr = buffer.ptr();
            let stride = layout.row_stride;
            // The external step edits its row on the same stream; here: wait, edit on the host, upload.
            let mut external = |row: usize, key: u64| -> Result<(), CudaError> {
                stream.synchronize()?;
                buffer.to_host(&mut host)?;
                external_edit(key, &mut host[row * stride..row * stride + vocab]);
                buffer.upload(&host)
            };
            // SAFETY: the buffer covers the layout; the stream is live.
            unsafe {
                applier.apply_batch(
                    batch,
                    ptr,
                    T::DTYPE,
                    layout,
                    stream.raw(),
                    &mut external,
                    &mut readback,
                )
            }
            .unwrap();
            readback.collect_batch(batch, true).unwrap();
            stream.synchronize().unwrap();
            buffer.to_host(&mut host).unwrap();
            host
        },
    );
    if let Err(message) = result {
        panic!("seed {seed}: {message}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/gpu-check.sh"]
fn gpu_ragged_batches_with_external_steps_equal_cpu() {
    let mut applier = gpu();
    let stream = Stream::new(0).unwrap();
    for vocab in VOCABS {
        for dtype in dtypes() {
            let cases = if vocab > 100_000 { 4 } else { 12 };
            for seed in 0..cases {
                for_dtype!(
                    dtype,
                    lifecycle_case(&mut applier, &stream, seed * 31 + 5, vocab)
                );
            }
        }
    }
}

/// 40 steps queued back to back without waiting (more than the 16 staging slots), each with its
/// own plans (masks and truncation bands included), on a block big enough (256 rows) that the GPU falls behind the host: every step must
/// see its own plans, never a later step's.
#[test]
#[ignore = "needs a CUDA GPU; run scripts/gpu-check.sh"]
fn many_steps_in_flight_keep_their_own_plans() {
    let mut applier = gpu();
    let stream = Stream::new(0).unwrap();
    let vocab = VOCABS[0];
    let layout = BatchLayout::contiguous(256, vocab);
    let mut rng = Rng::new(42);
    let input: Vec<f32> = (0..layout.required_len(vocab))
        .map(|_| rng.uniform(-4.0, 4.0))
        .collect();
    // Every step's plans and the CPU's answer first, so that the launches below run back to back.
    let mut steps = vec![];
    let mut want = input.clone();
    for step in 0..40u32 {
        let mut listed: Vec<(usize, logits_processing::RowPlan)> = vec![];
        for row in 0..layout.rows {
            let mut edits = vec![Edit::Scale {
                temperature: 1.0 + (step % 5) as f32 * 0.01,
            }];
            edits.push(Edit::Bias {
                token: (step * 997 + row as u32) % vocab as u32,
                bias: step as f32 * 0.125,
            });
            if (row as u32 + step).is_multiple_of(9) {
                edits.push(Edit::Ban { token: step });
            }
            if (row as u32 + step).is_multiple_of(13) {
                edits.push(Edit::Truncate(Truncation::TopK {
                    k: 1 + step * 3,
                    min_keep: 1,
                }));
            }
            let mut plan = plan_of(&edits);
            // Each step's own mask words travel in its own staging slot.
            if (row as u32 + step).is_multiple_of(7) {
                let words: Vec<u32> = (0..vocab as u32 / 32)
                    .map(|w| (w ^ step).wrapping_mul(0x9e37_79b9))
                    .collect();
                plan.push_mask(&words, step % 2 == 0);
            }
            listed.push((row, plan));
        }
        want = cpu_apply(&want, layout, vocab, &mut listed);
        steps.push(listed);
    }
    let buffer = DeviceBuffer::from_host(0, &input).unwrap();
    for listed in &steps {
        let plans: Vec<_> = listed.iter().map(|(r, p)| (*r, p)).collect();
        // SAFETY: the buffer covers the layout; the stream is live.
        unsafe {
            applier.apply_plans(
                &plans,
                buffer.ptr(),
                logits_processing::DType::F32,
                layout,
                vocab,
                stream.raw(),
                &|_| &[],
                None,
            )
        }
        .unwrap();
    }
    println!(
        "staging slots after 40 queued steps: {}",
        applier.staging_slots()
    );
    stream.synchronize().unwrap();
    let mut got = input.clone();
    buffer.to_host(&mut got).unwrap();
    assert_eq!(first_difference(&got, &want), None);
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/gpu-check.sh"]
fn default_stream_and_bad_arguments() {
    let mut applier = gpu();
    let vocab = 7;
    let layout = BatchLayout::contiguous(2, vocab);
    let input = vec![1.0f32; 14];
    let buffer = DeviceBuffer::from_host(0, &input).unwrap();
    let plan = plan_of(&[Edit::Scale { temperature: 0.5 }]);
    let f32_ = logits_processing::DType::F32;
    unsafe {
        applier
            .apply_plans(
                &[(1, &plan)],
                buffer.ptr(),
                f32_,
                layout,
                vocab,
                0,
                &|_| &[],
                None,
            )
            .unwrap();
        let misaligned = applier.apply_plans(
            &[(1, &plan)],
            buffer.ptr() + 2,
            f32_,
            layout,
            vocab,
            0,
            &|_| &[],
            None,
        );
        assert!(matches!(misaligned, Err(CudaError::InvalidArgument(_))));
        let null = applier.apply_plans(&[(1, &plan)], 0, f32_, layout, vocab, 0, &|_| &[], None);
        assert!(matches!(null, Err(CudaError::InvalidArgument(_))));
        let outside = applier.apply_plans(
            &[(2, &plan)],
            buffer.ptr(),
            f32_,
            layout,
            vocab,
            0,
            &|_| &[],
            None,
        );
        assert!(matches!(outside, Err(CudaError::InvalidArgument(_))));
        let bad_token = plan_of(&[Edit::Ban { token: 7 }]);
        assert!(matches!(
            applier.apply_plans(
                &[(0, &bad_token)],
                buffer.ptr(),
                f32_,
                layout,
                vocab,
                0,
                &|_| &[],
                None
            ),
            Err(CudaError::Core(_))
        ));
    }
    let mut got = vec![0.0f32; 14];
    buffer.to_host(&mut got).unwrap();
    assert_eq!(&got[..7], &[1.0; 7]);
    assert_eq!(&got[7..], &[2.0; 7]);
}
