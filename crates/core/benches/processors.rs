//! Row and batch costs at Qwen3's vocab, each next to a copy of the same bytes in the same run.
//!
//! `cargo bench -p logits-processing --bench processors`; figures in docs/benchmarks.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use logits_processing::{
    bf16, f16, has_finite_logit, parse_pipeline, process_row, BanTokens, Batch, BatchLayout, Edit,
    EngineContext, ForcedSequence, Logit, LogitsProcessor, Pipeline, ProcessorSpec, Reshape,
    RowPlan, Step, StepBitmask, Temperature, ThinkingBudget, ThinkingTokenConfig, TokenHistory,
    Truncation,
};

const VOCAB: usize = 151_936;
const THINKING: ThinkingTokenConfig = ThinkingTokenConfig {
    start_token_id: 151_667,
    end_token_id: 151_668,
    newline_token_id: 198,
};

fn logits<T: Logit>(len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f32(((i * 7919) % 2000) as f32 / 100.0 - 10.0))
        .collect()
}

/// `len` ids of history: a prompt, then an open thinking block of ordinary words.
fn history(len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            if i == 10 {
                THINKING.start_token_id
            } else {
                1000 + i % 5000
            }
        })
        .collect()
}

fn single_row<T: Logit>(c: &mut Criterion, dtype: &str) {
    let mut group = c.benchmark_group(format!("row_{dtype}"));
    group.throughput(Throughput::Bytes((VOCAB * std::mem::size_of::<T>()) as u64));
    let source = logits::<T>(VOCAB);
    let mut row = source.clone();
    let ids = history(100);

    group.bench_function("memcpy", |b| {
        b.iter(|| row.copy_from_slice(black_box(&source)))
    });
    // Alternating 0.7 and 1/0.7 keeps the values in range step after step, as real logits are;
    // one temperature alone would shrink the row to zeros over millions of iterations.
    let mut temperatures = [
        Temperature::new(0.7).unwrap(),
        Temperature::new(1.0 / 0.7).unwrap(),
    ];
    let mut step = 0;
    group.bench_function("temperature", |b| {
        b.iter(|| {
            step += 1;
            process_row(&mut temperatures[step % 2], &ids, black_box(&mut row)).unwrap()
        })
    });
    let mut forced = ForcedSequence::new(vec![17, 42, 99], Some(2)).unwrap();
    group.bench_function("forced_sequence", |b| {
        b.iter(|| process_row(&mut forced, &ids, black_box(&mut row)).unwrap())
    });
    group.finish();
}

fn rows(c: &mut Criterion) {
    single_row::<f32>(c, "f32");
    single_row::<bf16>(c, "bf16");
    single_row::<f16>(c, "f16");
}

/// Sparse and dense edits on one f32 row, beside the row's memcpy: bans of growing lists, plans
/// with growing numbers of sparse edits (biases and repetition penalties after a temperature),
/// and bitmask rows (a grammar's dense mask, and one that allows a few tokens).
fn sparse_and_masks(c: &mut Criterion) {
    let mut group = c.benchmark_group("edits_f32");
    group.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let source = logits::<f32>(VOCAB);
    let mut row = source.clone();
    let ids = history(100);
    let spread = |n: usize| -> Vec<u32> {
        (0..n as u64)
            .map(|i| ((i * 2_654_435_761) % VOCAB as u64) as u32)
            .collect()
    };
    group.bench_function("memcpy", |b| {
        b.iter(|| row.copy_from_slice(black_box(&source)))
    });
    for n in [1_000usize, 4_000, 16_000, 65_536] {
        let mut ban = BanTokens::new(spread(n));
        group.bench_function(BenchmarkId::new("ban_tokens", n), |b| {
            b.iter(|| process_row(&mut ban, &ids, black_box(&mut row)).unwrap())
        });
    }
    for n in [1usize, 16, 256, 4_096] {
        let tokens = spread(n);
        let mut plan = RowPlan::new();
        group.bench_function(BenchmarkId::new("sparse_edits", n), |b| {
            b.iter(|| {
                plan.clear();
                plan.push(Edit::Scale { temperature: 1.0 });
                for (i, &token) in tokens.iter().enumerate() {
                    plan.push(match i % 2 {
                        0 => Edit::Bias { token, bias: 0.0 },
                        _ => Edit::Penalty {
                            token,
                            penalty: 1.0,
                        },
                    });
                }
                plan.apply(black_box(&mut row)).unwrap()
            })
        });
    }
    let words = VOCAB.div_ceil(32);
    let dense: Vec<u32> = (0..words as u32)
        .map(|w| w.wrapping_mul(0x9e37_79b9) ^ 0x5555_5555)
        .collect();
    let mut few = vec![0u32; words];
    for token in spread(64) {
        few[token as usize / 32] |= 1 << (token % 32);
    }
    let mut plan = RowPlan::new();
    for (name, mask) in [("bitmask_half", &dense), ("bitmask_few", &few)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                row.copy_from_slice(&source);
                plan.clear();
                plan.push_mask(mask, false);
                plan.apply(black_box(&mut row)).unwrap()
            })
        });
    }
    group.bench_function("memcpy_then_nothing", |b| {
        b.iter(|| row.copy_from_slice(black_box(&source)))
    });
    group.finish();
}

/// A mask applied to one row in place, beside the row's memcpy in the same group: the masks a
/// grammar gives (mostly whole words of banned tokens: a JSON-schema step allows a few dozen; or
/// mostly whole words of allowed ones) and random bits, the worst case (every word mixed). A mask
/// applied twice gives the same row, so the row is not restored between iterations: each figure
/// is the apply alone (with the plan's copy of the mask words), as an engine's step pays it.
fn bitmask_row<T: Logit>(c: &mut Criterion, dtype: &str) {
    let mut group = c.benchmark_group(format!("bitmask_{dtype}"));
    group.throughput(Throughput::Bytes((VOCAB * std::mem::size_of::<T>()) as u64));
    let source = logits::<T>(VOCAB);
    let mut row = source.clone();
    group.bench_function("memcpy", |b| {
        b.iter(|| row.copy_from_slice(black_box(&source)))
    });
    let words = VOCAB.div_ceil(32);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let random: Vec<u32> = (0..words).map(|_| rng.next() as u32).collect();
    // 48 allowed tokens spread over the vocab, as a grammar step between structural tokens.
    let mut mostly_banned = vec![0u32; words];
    // 48 banned tokens, as a grammar step inside a free string.
    let mut mostly_allowed = vec![u32::MAX; words];
    for _ in 0..48 {
        let token = (rng.next() % VOCAB as u64) as usize;
        mostly_banned[token / 32] |= 1 << (token % 32);
        mostly_allowed[token / 32] &= !(1 << (token % 32));
    }
    let mut plan = RowPlan::new();
    for (name, mask) in [
        ("mostly_banned", &mostly_banned),
        ("mostly_allowed", &mostly_allowed),
        ("random", &random),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                plan.clear();
                plan.push_mask(mask, false);
                plan.apply(black_box(&mut row)).unwrap()
            })
        });
    }
    group.finish();
}

/// The caller's own bitmask (`{"kind": "bitmask"}`) through a one-row batch step, random bits,
/// beside the row's memcpy: what `Batch.apply(..., bitmask=...)` costs before Python's share.
fn caller_bitmask(c: &mut Criterion) {
    let mut group = c.benchmark_group("caller_bitmask_f32");
    group.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let source = logits::<f32>(VOCAB);
    let mut row = source.clone();
    group.bench_function("memcpy", |b| {
        b.iter(|| row.copy_from_slice(black_box(&source)))
    });
    let mut batch = Batch::new(VOCAB);
    let caller = logits_processing::processors::CallerBitmask::new(VOCAB.div_ceil(32));
    batch
        .add(0, Pipeline::new(vec![Step::Processor(Box::new(caller))]))
        .unwrap();
    let mut rng = Rng(7);
    let words: Vec<u32> = (0..VOCAB.div_ceil(32)).map(|_| rng.next() as u32).collect();
    let mask = StepBitmask {
        words: &words,
        words_per_row: words.len(),
    };
    let ids = history(100);
    let histories: [&dyn TokenHistory; 1] = [&ids];
    let layout = BatchLayout::contiguous(1, VOCAB);
    group.bench_function("random", |b| {
        b.iter(|| {
            batch
                .apply_with_bitmask(black_box(&mut row), layout, &histories, mask)
                .unwrap()
        })
    });
    group.finish();
}

fn bitmasks(c: &mut Criterion) {
    bitmask_row::<f32>(c, "f32");
    bitmask_row::<bf16>(c, "bf16");
    caller_bitmask(c);
}

/// One decode step of the thinking budget (plan, and the forced row when over budget), with the
/// history one id longer than at the previous step, as in a real decode loop.
fn thinking_budget(c: &mut Criterion) {
    let mut group = c.benchmark_group("thinking_budget");
    for (name, budget, with_row) in [
        ("decide_under_budget", usize::MAX / 2, false),
        ("step_over_budget", 0, true),
    ] {
        for len in [1_000usize, 8_000, 32_000] {
            let chunk = 10_000;
            let ids = history(len + chunk);
            let mut row = logits::<f32>(VOCAB);
            group.bench_with_input(BenchmarkId::new(name, len), &len, |b, &len| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters as usize;
                    while left > 0 {
                        let steps = left.min(chunk);
                        let mut processor = ThinkingBudget::new(THINKING, budget, 0.1).unwrap();
                        // The first call reads the whole history, as a new request's would.
                        processor.must_end(&&ids[..len]);
                        let start = Instant::now();
                        for step in 1..=steps {
                            let seen = &ids[..len + step];
                            if with_row {
                                process_row(&mut processor, &seen, &mut row).unwrap();
                            } else {
                                black_box(processor.must_end(&seen));
                            }
                        }
                        total += start.elapsed();
                        left -= steps;
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

/// The check that no row is handed back with no finite logit, beside the row's memcpy: the
/// worst case (the one finite logit is the last, as for a row forced to a high EOS id), the usual
/// one (the first block has a finite logit), and a row copied from the model's logits then forced
/// to its first or last token, with its check (the difference is the scan after the pass).
fn no_token_check<T: Logit>(c: &mut Criterion, dtype: &str) {
    let mut group = c.benchmark_group(format!("no_token_check_{dtype}"));
    group.throughput(Throughput::Bytes((VOCAB * std::mem::size_of::<T>()) as u64));
    let source = logits::<T>(VOCAB);
    let mut row = source.clone();
    group.bench_function("memcpy", |b| {
        b.iter(|| row.copy_from_slice(black_box(&source)))
    });
    let mut last_only = vec![T::NEG_INFINITY; VOCAB];
    last_only[VOCAB - 1] = T::from_f32(0.0);
    group.bench_function("scan_last_finite", |b| {
        b.iter(|| assert!(has_finite_logit(black_box(&last_only))))
    });
    group.bench_function("scan_real_row", |b| {
        b.iter(|| assert!(has_finite_logit(black_box(&source))))
    });
    let ids = history(100);
    for (name, token) in [("forced_first", 0u32), ("forced_last", VOCAB as u32 - 1)] {
        let mut pipeline = Pipeline::new(vec![Step::Processor(Box::new(
            ForcedSequence::new(vec![token], Some(token)).unwrap(),
        ))]);
        // From the model's logits each time, as an engine gives them.
        group.bench_function(name, |b| {
            b.iter(|| {
                row.copy_from_slice(&source);
                pipeline.process(&ids, black_box(&mut row)).unwrap()
            })
        });
    }
    group.finish();
}

fn no_token_checks(c: &mut Criterion) {
    no_token_check::<f32>(c, "f32");
    no_token_check::<bf16>(c, "bf16");
}

/// The mixed batch: a third forced, a third temperature, a third thinking budget over budget,
/// each row with 4,000 ids of history.
fn batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_f32");
    group.sample_size(20);
    let ids = history(4_000);
    for rows in [1usize, 64, 256] {
        group.throughput(Throughput::Bytes((rows * VOCAB * 4) as u64));
        let source = logits::<f32>(rows * VOCAB);
        let mut block = source.clone();
        group.bench_function(BenchmarkId::new("memcpy", rows), |b| {
            b.iter(|| block.copy_from_slice(black_box(&source)))
        });

        let mut batch = Batch::new(VOCAB);
        for row in 0..rows {
            let processor: Box<dyn LogitsProcessor> = match row % 3 {
                0 => Box::new(ForcedSequence::new(vec![17, 42, 99], Some(2)).unwrap()),
                1 => Box::new(Temperature::new(0.7).unwrap()),
                _ => Box::new(ThinkingBudget::new(THINKING, 100, 0.1).unwrap()),
            };
            batch
                .add(row, Pipeline::new(vec![Step::Processor(processor)]))
                .unwrap();
        }
        let histories: Vec<&dyn TokenHistory> = (0..rows).map(|_| &ids as _).collect();
        let layout = BatchLayout::contiguous(rows, VOCAB);
        group.bench_function(BenchmarkId::new("mixed", rows), |b| {
            b.iter(|| {
                batch
                    .apply(black_box(&mut block), layout, &histories)
                    .unwrap()
            })
        });
        // The same step on the model's logits each time (the block above is the last step's
        // output, whose rows end up forced or overflowed): the copy, then the step.
        group.bench_function(BenchmarkId::new("memcpy_then_mixed", rows), |b| {
            b.iter(|| {
                block.copy_from_slice(&source);
                batch
                    .apply(black_box(&mut block), layout, &histories)
                    .unwrap()
            })
        });
    }
    group.finish();
}

/// A batch step on a quiet machine and with every core busy with another thread (2x
/// oversubscription), as in an engine whose tokenizers and scheduler share the cores.
fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention");
    group.sample_size(30);
    const VOCAB_DS: usize = 129_280;
    let ids = history(1_000);
    for rows in [4usize, 64] {
        let source = logits::<f32>(rows * VOCAB_DS);
        let mut block = source.clone();
        let mut batch = Batch::new(VOCAB_DS);
        for row in 0..rows {
            let processor: Box<dyn LogitsProcessor> = match row % 2 {
                0 => Box::new(ForcedSequence::new(vec![17, 42, 99], Some(2)).unwrap()),
                _ => Box::new(Temperature::new(0.7).unwrap()),
            };
            batch
                .add(row, Pipeline::new(vec![Step::Processor(processor)]))
                .unwrap();
        }
        let histories: Vec<&dyn TokenHistory> = (0..rows).map(|_| &ids as _).collect();
        let layout = BatchLayout::contiguous(rows, VOCAB_DS);
        for busy in [
            0,
            std::thread::available_parallelism().map_or(2, |n| n.get()),
        ] {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let spinners: Vec<_> = (0..busy)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let mut x = 0u64;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                        }
                    })
                })
                .collect();
            group.bench_function(
                BenchmarkId::new(format!("rows_{rows}_busy_threads"), busy),
                |b| {
                    b.iter(|| {
                        batch
                            .apply(black_box(&mut block), layout, &histories)
                            .unwrap()
                    })
                },
            );
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            spinners.into_iter().for_each(|t| t.join().unwrap());
        }
    }
    group.finish();
}

/// A deterministic generator (xorshift64*), so every run sees the same rows and histories.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Roughly normal (a sum of four uniforms), mean 0, deviation 1.
    fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.uniform()).sum::<f32>() - 2.0) * 1.732
    }

    /// Normal (Box-Muller), with the whole tail: the maximum of a row of N(0, 16) stands about
    /// 4.5 deviations up, as numpy's does.
    fn gaussian(&mut self) -> f32 {
        let (u, v) = (1.0 - self.uniform() as f64, self.uniform() as f64);
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// A row shaped like a language model's: a long tail around -2 and a few dozen likely tokens,
/// so top-p 0.9 keeps a few dozen tokens.
fn peaked_logits(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed | 1);
    let mut row: Vec<f32> = (0..len).map(|_| rng.normal() * 2.5 - 2.0).collect();
    for _ in 0..32 {
        let token = (rng.next() % len as u64) as usize;
        row[token] = 8.0 + rng.uniform() * 8.0;
    }
    row
}

/// `len` ids: `pool` distinct tokens in a random order (the same distinct count at any length),
/// or, with `pool == 0`, a Zipf-like draw over 50,000 tokens (distinct tokens grow with length).
fn ids_from(len: usize, pool: u32, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed | 1);
    (0..len)
        .map(|_| match pool {
            0 => {
                // Rank ~ 1/u: most draws among the first few hundred tokens.
                let rank = (1.0 / (rng.uniform() + 2e-5)) as u32;
                1000 + rank.min(49_999) * 3
            }
            _ => 1000 + (rng.next() % pool as u64) as u32 * 7,
        })
        .collect()
}

/// top-k, top-p and min-p on one f32 row, each beside the row's memcpy: a row shaped like a
/// model's and a flat one (uniform values: top-p's worst case, its mass spread over the vocab).
/// Each iteration restores the row (the copy is part of every figure, as it is of `memcpy`).
fn truncation(c: &mut Criterion) {
    let mut group = c.benchmark_group("truncation_f32");
    group.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    for (shape, source) in [
        ("peaked", peaked_logits(VOCAB, 7)),
        ("flat", logits::<f32>(VOCAB)),
    ] {
        let mut row = source.clone();
        group.bench_function(BenchmarkId::new("memcpy", shape), |b| {
            b.iter(|| row.copy_from_slice(black_box(&source)))
        });
        let rules = [
            ("top_k_50", Truncation::TopK { k: 50, min_keep: 1 }),
            (
                "top_p_0.9",
                Truncation::TopP {
                    p: 0.9,
                    min_keep: 1,
                },
            ),
            (
                "min_p_0.05",
                Truncation::MinP {
                    p: 0.05,
                    min_keep: 1,
                },
            ),
        ];
        // Top-p's softmax total alone: one fixed-point `exp` per value near the maximum.
        let max = source.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        group.bench_function(BenchmarkId::new("softmax_total", shape), |b| {
            b.iter(|| logits_processing::truncation::weight_sum(black_box(&source), max))
        });
        let mut plan = RowPlan::new();
        for (name, rule) in rules {
            group.bench_function(BenchmarkId::new(name, shape), |b| {
                b.iter(|| {
                    row.copy_from_slice(&source);
                    plan.clear();
                    plan.push(Edit::Truncate(rule));
                    plan.apply(black_box(&mut row)).unwrap()
                })
            });
        }
        // llama.cpp's default chain (its samplers on at their defaults) as one plan: the later
        // steps run on the 40 tokens top-k keeps (the survivors' path).
        let chain = [
            Edit::Truncate(Truncation::TopK { k: 40, min_keep: 1 }),
            Edit::Truncate(Truncation::TopP {
                p: 0.95,
                min_keep: 1,
            }),
            Edit::Truncate(Truncation::MinP {
                p: 0.05,
                min_keep: 1,
            }),
            Edit::Scale { temperature: 0.8 },
        ];
        group.bench_function(BenchmarkId::new("llama_cpp_default_chain", shape), |b| {
            b.iter(|| {
                row.copy_from_slice(&source);
                plan.clear();
                for edit in chain {
                    plan.push(edit);
                }
                plan.apply(black_box(&mut row)).unwrap()
            })
        });
    }
    group.finish();
}

/// The samplers of llama.cpp and text-generation-webui, and the mass-based truncations, on one
/// f32 row beside the row's memcpy: a row shaped like a model's and a row of N(0, 1) logits (what
/// sampling at temperature 1 from a flat model looks like). Each iteration restores the row.
fn samplers(c: &mut Criterion) {
    let mut group = c.benchmark_group("samplers_f32");
    group.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let mut rng = Rng(99);
    let normal: Vec<f32> = (0..VOCAB).map(|_| rng.normal()).collect();
    for (shape, source) in [("peaked", peaked_logits(VOCAB, 7)), ("normal", normal)] {
        let mut row = source.clone();
        group.bench_function(BenchmarkId::new("memcpy", shape), |b| {
            b.iter(|| row.copy_from_slice(black_box(&source)))
        });
        let edits = [
            (
                "top_n_sigma_1",
                Edit::Truncate(Truncation::TopNSigma { n: 1.0 }),
            ),
            (
                "top_a_0.2",
                Edit::Truncate(Truncation::TopA {
                    a: 0.2,
                    min_keep: 1,
                }),
            ),
            (
                "tail_free_0.95",
                Edit::Truncate(Truncation::TailFree {
                    z: 0.95,
                    min_keep: 1,
                }),
            ),
            (
                "xtc_0.1",
                Edit::Truncate(Truncation::Xtc {
                    threshold: 0.1,
                    min_keep: 1,
                }),
            ),
            (
                "dynamic_temperature",
                Edit::Reshape(Reshape::DynamicTemperature {
                    temperature: 1.0,
                    range: 0.5,
                    exponent: 1.0,
                }),
            ),
            (
                "smoothing",
                Edit::Reshape(Reshape::Smoothing { k: 0.3, s: 0.0 }),
            ),
            (
                "mirostat_v2",
                Edit::Truncate(Truncation::MirostatV2 { mu: 10.0, key: 0 }),
            ),
            (
                "mirostat_v1",
                Edit::Truncate(Truncation::MirostatV1 {
                    mu: 10.0,
                    m: 100,
                    n_vocab: VOCAB as u32,
                    key: 0,
                }),
            ),
            (
                "adaptive_p",
                Edit::Reshape(Reshape::AdaptiveP {
                    target: 0.3,
                    key: 0,
                }),
            ),
            (
                "top_p_0.9",
                Edit::Truncate(Truncation::TopP {
                    p: 0.9,
                    min_keep: 1,
                }),
            ),
            (
                "typical_0.9",
                Edit::Truncate(Truncation::Typical {
                    mass: 0.9,
                    min_keep: 1,
                }),
            ),
            (
                "epsilon_3e-4",
                Edit::Truncate(Truncation::Epsilon {
                    epsilon: 3e-4,
                    min_keep: 1,
                }),
            ),
            (
                "eta_3e-4",
                Edit::Truncate(Truncation::Eta {
                    epsilon: 3e-4,
                    min_keep: 1,
                }),
            ),
            (
                "min_p_0.05",
                Edit::Truncate(Truncation::MinP {
                    p: 0.05,
                    min_keep: 1,
                }),
            ),
        ];
        let mut plan = RowPlan::new();
        for (name, edit) in edits {
            group.bench_function(BenchmarkId::new(name, shape), |b| {
                b.iter(|| {
                    row.copy_from_slice(&source);
                    plan.clear();
                    plan.push(edit);
                    plan.apply(black_box(&mut row)).unwrap()
                })
            });
        }
    }
    group.finish();
}

/// The three rows of `python/benchmarks/bench_llamacpp.py` (the same shapes, not the same
/// draws): flat N(0, 1), peaked N(0, 16), and a realistic one (`3 (-1.1 ln rank + N(0, 0.5))`,
/// shuffled: a Zipf-shaped model row).
fn llamacpp_rows() -> [(&'static str, Vec<f32>); 3] {
    let mut rng = Rng(2024);
    let flat: Vec<f32> = (0..VOCAB).map(|_| rng.gaussian()).collect();
    let peaked: Vec<f32> = (0..VOCAB).map(|_| rng.gaussian() * 16.0).collect();
    let mut realistic: Vec<f32> = (1..=VOCAB)
        .map(|rank| 3.0 * (-1.1 * (rank as f32).ln() + 0.5 * rng.gaussian()))
        .collect();
    for i in (1..VOCAB).rev() {
        realistic.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    [("flat", flat), ("peaked", peaked), ("realistic", realistic)]
}

/// Every row rule at llama.cpp's defaults (or the webui's), and llama.cpp's default chain (top-k
/// 40, top-p 0.95, min-p 0.05, temperature 0.8) in four orders, on the three rows of
/// [`llamacpp_rows`], each beside the row's memcpy. Each iteration restores the row (the copy is
/// part of every figure, as it is of `memcpy`).
fn chains(c: &mut Criterion) {
    let mut group = c.benchmark_group("chains_f32");
    group.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let top_k = Edit::Truncate(Truncation::TopK { k: 40, min_keep: 1 });
    let top_p = Edit::Truncate(Truncation::TopP {
        p: 0.95,
        min_keep: 1,
    });
    let min_p = Edit::Truncate(Truncation::MinP {
        p: 0.05,
        min_keep: 1,
    });
    let temperature = Edit::Scale { temperature: 0.8 };
    let plans: Vec<(&str, Vec<Edit>)> = vec![
        ("top_k_40", vec![top_k]),
        ("top_p_0.95", vec![top_p]),
        ("min_p_0.05", vec![min_p]),
        ("temperature_0.8", vec![temperature]),
        (
            "typical_0.9",
            vec![Edit::Truncate(Truncation::Typical {
                mass: 0.9,
                min_keep: 1,
            })],
        ),
        (
            "epsilon_3e-4",
            vec![Edit::Truncate(Truncation::Epsilon {
                epsilon: 3e-4,
                min_keep: 1,
            })],
        ),
        (
            "eta_3e-4",
            vec![Edit::Truncate(Truncation::Eta {
                epsilon: 3e-4,
                min_keep: 1,
            })],
        ),
        (
            "top_n_sigma_1",
            vec![Edit::Truncate(Truncation::TopNSigma { n: 1.0 })],
        ),
        (
            "top_a_0.2",
            vec![Edit::Truncate(Truncation::TopA {
                a: 0.2,
                min_keep: 1,
            })],
        ),
        (
            "tail_free_0.95",
            vec![Edit::Truncate(Truncation::TailFree {
                z: 0.95,
                min_keep: 1,
            })],
        ),
        (
            "xtc_0.1",
            vec![Edit::Truncate(Truncation::Xtc {
                threshold: 0.1,
                min_keep: 1,
            })],
        ),
        (
            "mirostat_v2",
            vec![Edit::Truncate(Truncation::MirostatV2 { mu: 10.0, key: 0 })],
        ),
        (
            "mirostat_v1",
            vec![Edit::Truncate(Truncation::MirostatV1 {
                mu: 10.0,
                m: 100,
                n_vocab: VOCAB as u32,
                key: 0,
            })],
        ),
        (
            "dynamic_temperature",
            vec![Edit::Reshape(Reshape::DynamicTemperature {
                temperature: 0.8,
                range: 0.5,
                exponent: 1.0,
            })],
        ),
        ("default_chain", vec![top_k, top_p, min_p, temperature]),
        (
            "chain_temperature_first",
            vec![temperature, top_k, top_p, min_p],
        ),
        ("chain_min_p_first", vec![min_p, top_p, top_k, temperature]),
        ("chain_top_p_first", vec![top_p, top_k, min_p, temperature]),
    ];
    for (shape, source) in llamacpp_rows() {
        let mut row = source.clone();
        group.bench_function(BenchmarkId::new("memcpy", shape), |b| {
            b.iter(|| row.copy_from_slice(black_box(&source)))
        });
        let mut plan = RowPlan::new();
        for (name, edits) in &plans {
            group.bench_function(BenchmarkId::new(*name, shape), |b| {
                b.iter(|| {
                    row.copy_from_slice(&source);
                    plan.clear();
                    for &edit in edits {
                        plan.push(edit);
                    }
                    plan.apply(black_box(&mut row)).unwrap()
                })
            });
        }
    }
    group.finish();
}

/// DRY and a windowed repetition penalty, each step after a 32,000-id history, at a window of 64
/// and of 4,096 ids: the step's cost must not grow with the window (no rescan of it). Plan only,
/// and plan plus the row's apply ("step").
fn window_steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("window_step");
    let source = peaked_logits(VOCAB, 3);
    let mut row = source.clone();
    let len = 32_000;
    let chunk = 5_000;
    for (history, pool) in [("pool500", 500u32), ("zipf", 0)] {
        let ids = ids_from(len + chunk, pool, 11);
        for window in [64usize, 4096] {
            let kinds = [
                (
                    "dry",
                    format!(
                        r#"{{"kind": "dry", "multiplier": 0.8, "penalty_last_n": {window}, "sequence_breaker_ids": []}}"#
                    ),
                ),
                (
                    "repetition_penalty",
                    format!(
                        r#"{{"kind": "repetition_penalty", "penalty": 1.1, "window": {window}}}"#
                    ),
                ),
            ];
            for (name, json) in &kinds {
                for with_row in [false, true] {
                    let mut plan = RowPlan::new();
                    let id = format!(
                        "{name}/{history}/{}",
                        if with_row { "step" } else { "plan" }
                    );
                    group.bench_with_input(BenchmarkId::new(id, window), &window, |b, _| {
                        b.iter_custom(|iters| {
                            let mut total = Duration::ZERO;
                            let mut left = iters as usize;
                            while left > 0 {
                                let steps = left.min(chunk);
                                let mut processor = realize(json, 0);
                                processor.plan(&&ids[..len], &mut plan).unwrap();
                                let start = Instant::now();
                                for step in 1..=steps {
                                    plan.clear();
                                    processor.plan(&&ids[..len + step], &mut plan).unwrap();
                                    if with_row {
                                        plan.apply(&mut row).unwrap();
                                    }
                                }
                                total += start.elapsed();
                                left -= steps;
                                if with_row {
                                    row.copy_from_slice(&source);
                                }
                            }
                            total
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

fn realize(json: &str, prompt_len: usize) -> Box<dyn LogitsProcessor> {
    let context = EngineContext {
        vocab_size: Some(VOCAB),
        ..Default::default()
    };
    ProcessorSpec::parse(json)
        .unwrap()
        .realize(&context, prompt_len)
        .unwrap()
}

/// One decode step of the history-reading processors at 1,000 and 32,000 ids of history, the
/// history one id longer than at the previous step as in a decode loop: planning alone, and the
/// plan applied to a row. Histories of 500 distinct tokens (the same at both lengths: the cost of
/// the history's length alone) and Zipf-like ones (distinct tokens grow with the length, and with
/// them the penalties' edits).
fn history_steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("history_step");
    let kinds = [
        (
            "repetition_penalty",
            r#"{"kind": "repetition_penalty", "penalty": 1.1}"#,
        ),
        (
            "frequency_penalty",
            r#"{"kind": "frequency_penalty", "penalty": 0.5}"#,
        ),
        (
            "presence_penalty",
            r#"{"kind": "presence_penalty", "penalty": 0.5}"#,
        ),
        (
            "no_repeat_ngram_3",
            r#"{"kind": "no_repeat_ngram", "n": 3}"#,
        ),
    ];
    let source = peaked_logits(VOCAB, 3);
    let mut row = source.clone();
    for (history, pool) in [("pool500", 500u32), ("zipf", 0)] {
        for (name, json) in kinds {
            for with_row in [false, true] {
                for len in [1_000usize, 32_000] {
                    let chunk = 5_000;
                    let ids = ids_from(len + chunk, pool, 11);
                    let mut plan = RowPlan::new();
                    let id = format!(
                        "{name}/{history}/{}",
                        if with_row { "step" } else { "plan" }
                    );
                    group.bench_with_input(BenchmarkId::new(id, len), &len, |b, &len| {
                        b.iter_custom(|iters| {
                            let mut total = Duration::ZERO;
                            let mut left = iters as usize;
                            while left > 0 {
                                let steps = left.min(chunk);
                                let mut processor = realize(json, 0);
                                // The first call reads the whole history, as a new request's.
                                processor.plan(&&ids[..len], &mut plan).unwrap();
                                let start = Instant::now();
                                for step in 1..=steps {
                                    plan.clear();
                                    processor.plan(&&ids[..len + step], &mut plan).unwrap();
                                    if with_row {
                                        plan.apply(&mut row).unwrap();
                                    }
                                }
                                total += start.elapsed();
                                left -= steps;
                                if with_row {
                                    row.copy_from_slice(&source);
                                }
                            }
                            total
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

/// A batch like a real sampling config: each row repetition, frequency and presence penalties,
/// temperature 0.7 and top-p 0.9, over 4,000 ids of its own history; out of place (the block
/// read, the result written elsewhere: one pass, what an HF adapter does), beside the block's
/// memcpy.
fn sampling_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("sampling_batch_f32");
    group.sample_size(20);
    let specs = parse_pipeline(
        r#"[{"kind": "repetition_penalty", "penalty": 1.1},
            {"kind": "frequency_penalty", "penalty": 0.2},
            {"kind": "presence_penalty", "penalty": 0.2},
            {"kind": "temperature", "temperature": 0.7},
            {"kind": "top_p", "p": 0.9}]"#,
    )
    .unwrap();
    let context = EngineContext {
        vocab_size: Some(VOCAB),
        ..Default::default()
    };
    for rows in [1usize, 64] {
        group.throughput(Throughput::Bytes((rows * VOCAB * 4) as u64));
        let source: Vec<f32> = (0..rows)
            .flat_map(|r| peaked_logits(VOCAB, 100 + r as u64))
            .collect();
        let mut block = source.clone();
        group.bench_function(BenchmarkId::new("memcpy", rows), |b| {
            b.iter(|| block.copy_from_slice(black_box(&source)))
        });
        let histories: Vec<Vec<u32>> = (0..rows)
            .map(|r| ids_from(4_000, 0, 50 + r as u64))
            .collect();
        let views: Vec<&dyn TokenHistory> = histories.iter().map(|h| h as _).collect();
        let mut batch = Batch::new(VOCAB);
        for row in 0..rows {
            batch
                .add(row, Pipeline::from_specs(&specs, &context, 100).unwrap())
                .unwrap();
        }
        let layout = BatchLayout::contiguous(rows, VOCAB);
        group.bench_function(BenchmarkId::new("penalties_temperature_top_p", rows), |b| {
            b.iter(|| {
                batch.plan(&views).unwrap();
                batch
                    .apply_planned_into(&source, black_box(&mut block), layout, &mut |_, _, _| {
                        Ok(())
                    })
                    .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = rows, sparse_and_masks, bitmasks, thinking_budget, batch, contention, truncation, history_steps,
        sampling_batch, samplers, chains, window_steps, no_token_checks
}
criterion_main!(benches);
