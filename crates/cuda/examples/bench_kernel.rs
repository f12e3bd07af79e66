//! The CUDA path from Rust, without Python: per decode step of the mixed batch (a third forced
//! sequences keeping their token's value, a third temperature 0.7, a third thinking budgets over
//! budget forcing the end token to 0.0), vocab 151,936, f32, B = 1, 16, 64, 256; medians of
//! CUDA-event time over back-to-back steps, each step `CudaBatchApplier::apply_plans` (pack, staging
//! copy, one launch; two for rows that truncate), beside a device-to-device copy of the block (the
//! floor). Then, at B = 64, one line per slot of the plan: an all-temperature batch (every logit
//! read and written), sparse bans of 1k / 4k / 16k / 65,536 ids, temperature with 1 / 16 / 256 /
//! 4,096 sparse edits (biases and penalties), a bitmask row, and top-k after temperature (the band
//! kernel reads the row four times, once per radix digit).
//!
//! ```text
//! cargo run --release -p logits-processing-cuda --example bench_kernel [-- --quick]
//! ```
//!
//! Prints a message and exits 0 where there is no GPU.

use logits_processing::{BatchLayout, DType, Edit, ForcedValue, RowPlan, Truncation};
use logits_processing_cuda::device::{DeviceBuffer, Stream};
use logits_processing_cuda::{
    cuda_available, cuda_unavailable_reason, CudaBatchApplier, CudaError,
};

const VOCAB: usize = 151_936;
const END: u32 = 151_668;

fn plan(edit: Edit) -> RowPlan {
    let mut plan = RowPlan::new();
    plan.push(edit);
    plan
}

fn mixed(rows: usize) -> Vec<(usize, RowPlan)> {
    (0..rows)
        .map(|row| {
            let edit = match row % 3 {
                0 => Edit::Force {
                    token: 100,
                    value: ForcedValue::Keep,
                },
                1 => Edit::Scale { temperature: 0.7 },
                _ => Edit::Force {
                    token: END,
                    value: ForcedValue::Set(0.0),
                },
            };
            (row, plan(edit))
        })
        .collect()
}

/// Bytes the kernels move for these plans (f32): forced rows are written only; rows with sparse
/// edits only read and write their tokens; other rows are read and written once, plus their mask
/// words; a truncating row is read four more times by the band kernel.
fn kernel_bytes(plans: &[(usize, RowPlan)]) -> f64 {
    let per_row = (VOCAB * 4) as f64;
    plans
        .iter()
        .map(|(_, p)| {
            let edits = p.edits();
            let masks = edits.iter().filter(|e| matches!(e, Edit::Mask(_))).count();
            let bands = if p.truncates() { 4.0 * per_row } else { 0.0 };
            bands
                + if p.forced_token().is_some() {
                    per_row
                } else if edits.iter().all(|e| e.is_sparse()) {
                    let mut tokens: Vec<u32> = edits.iter().filter_map(|e| e.token()).collect();
                    tokens.sort_unstable();
                    tokens.dedup();
                    tokens.len() as f64 * 8.0
                } else {
                    2.0 * per_row + masks as f64 * (VOCAB / 8) as f64
                }
        })
        .sum()
}

/// `rows` copies of the plan `make` builds.
fn batch(rows: usize, make: impl Fn() -> RowPlan) -> Vec<(usize, RowPlan)> {
    (0..rows).map(|row| (row, make())).collect()
}

/// `n` distinct token ids spread over the vocab.
fn spread(n: usize) -> impl Iterator<Item = u32> {
    (0..n as u64).map(move |i| (i * VOCAB as u64 / n as u64) as u32)
}

struct Measured {
    ours_us: f64,
    copy_us: f64,
    bytes: f64,
}

fn measure(
    applier: &mut CudaBatchApplier,
    stream: &Stream,
    plans: &[(usize, RowPlan)],
    rows: usize,
    calls: usize,
    blocks: usize,
) -> Result<Measured, CudaError> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let host: Vec<f32> = (0..rows * VOCAB)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0
        })
        .collect();
    let master = DeviceBuffer::from_host(0, &host)?;
    let mut data = DeviceBuffer::from_host(0, &host)?;
    let mut dst = DeviceBuffer::from_host(0, &host)?;
    let layout = BatchLayout::contiguous(rows, VOCAB);
    let listed: Vec<(usize, &RowPlan)> = plans.iter().map(|(r, p)| (*r, p)).collect();
    let ptr = data.ptr();
    // Warm-up: loads the kernels, grows the staging buffers.
    for _ in 0..3 {
        // SAFETY: `data` covers the layout; the stream is live.
        unsafe {
            applier.apply_plans(
                &listed,
                ptr,
                DType::F32,
                layout,
                VOCAB,
                stream.raw(),
                &|_| &[],
                None,
            )?
        };
    }
    let ours_us = stream.time_us(
        calls,
        blocks,
        &mut || data.copy_from_async(&master, stream),
        // SAFETY: as above.
        &mut || unsafe {
            applier.apply_plans(
                &listed,
                ptr,
                DType::F32,
                layout,
                VOCAB,
                stream.raw(),
                &|_| &[],
                None,
            )
        },
    )?;
    let copy_us = stream.time_us(calls, blocks, &mut || Ok(()), &mut || {
        dst.copy_from_async(&master, stream)
    })?;
    Ok(Measured {
        ours_us,
        copy_us,
        bytes: kernel_bytes(plans),
    })
}

fn main() -> Result<(), CudaError> {
    if !cuda_available() {
        println!(
            "bench_kernel: SKIPPED: {}",
            cuda_unavailable_reason().unwrap_or_default()
        );
        return Ok(());
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let (calls, blocks) = if quick { (20, 5) } else { (100, 11) };
    let mut applier = CudaBatchApplier::new(0, VOCAB)?;
    let stream = Stream::new(0)?;
    println!(
        "kernels from {}; vocab {VOCAB}, f32; median us per step (CUDA events, {calls} back-to-back steps x {blocks})",
        applier.kernel_origin()
    );
    println!(
        "{:<28} {:>10} {:>12} {:>10} {:>12}",
        "batch", "ours (us)", "D2D copy", "ours/copy", "ours GB/s"
    );
    let line = |name: String, m: Measured| {
        println!(
            "{name:<28} {:>10.1} {:>12.1} {:>10.2} {:>12.0}",
            m.ours_us,
            m.copy_us,
            m.ours_us / m.copy_us,
            m.bytes / (m.ours_us * 1e-6) / 1e9
        );
    };
    for rows in [1, 16, 64, 256] {
        let plans = mixed(rows);
        let m = measure(&mut applier, &stream, &plans, rows, calls, blocks)?;
        line(format!("kernel mixed B={rows}"), m);
    }
    let all_scaled: Vec<(usize, RowPlan)> = (0..256)
        .map(|row| (row, plan(Edit::Scale { temperature: 0.7 })))
        .collect();
    let m = measure(&mut applier, &stream, &all_scaled, 256, calls, blocks)?;
    line("kernel all-temperature B=256".into(), m);

    const ROWS: usize = 64;
    let temperature = Edit::Scale { temperature: 0.7 };
    let mut cases: Vec<(String, Vec<(usize, RowPlan)>)> = vec![(
        format!("temperature B={ROWS}"),
        batch(ROWS, || plan(temperature)),
    )];
    for n in [1_000, 4_000, 16_000, 65_536] {
        let make = move || {
            let mut p = RowPlan::new();
            spread(n).for_each(|token| p.push(Edit::Ban { token }));
            p
        };
        cases.push((format!("ban {n} ids B={ROWS}"), batch(ROWS, make)));
    }
    for n in [1, 16, 256, 4_096] {
        let make = move || {
            let mut p = plan(temperature);
            for (i, token) in spread(n).enumerate() {
                p.push(if i % 2 == 0 {
                    Edit::Bias { token, bias: 0.5 }
                } else {
                    Edit::Penalty {
                        token,
                        penalty: 1.3,
                    }
                });
            }
            p
        };
        cases.push((format!("temp + {n} sparse B={ROWS}"), batch(ROWS, make)));
    }
    let words: Vec<u32> = (0..VOCAB as u32 / 32)
        .map(|w| w.wrapping_mul(0x9e37_79b9))
        .collect();
    cases.push((
        format!("temp + bitmask B={ROWS}"),
        batch(ROWS, || {
            let mut p = plan(temperature);
            p.push_mask(&words, false);
            p
        }),
    ));
    cases.push((
        format!("temp + top-k 50 B={ROWS}"),
        batch(ROWS, || {
            let mut p = plan(temperature);
            p.push(Edit::Truncate(Truncation::TopK { k: 50, min_keep: 1 }));
            p
        }),
    ));
    for (name, plans) in cases {
        let m = measure(&mut applier, &stream, &plans, ROWS, calls, blocks)?;
        line(name, m);
    }
    println!(
        "staging slots in use after the run: {}",
        applier.staging_slots()
    );
    Ok(())
}
