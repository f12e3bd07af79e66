//! Random plans, logits and ragged batch lifecycles: what the tests run through the kernels (on a
//! GPU, `tests/gpu.rs`; through Triton's interpreter, the Python suite's
//! `test_triton_kernels.py`, by [`kernel_case`]) and through the host round trip, against the CPU
//! path. Not part of the crate's API.

use std::sync::{Arc, Mutex};

use logits_processing::{
    Batch, BatchLayout, DType, Edit, ForcedValue, Logit, LogitsProcessor, Pipeline, RowPlan, Step,
    TokenHistory, Trigger, Truncation,
};

/// The vocab sizes every test runs: Qwen3's, DeepSeek's, an odd Llama-like one, a tiny one.
pub const VOCABS: [usize; 4] = [151_936, 129_280, 32_001, 7];

/// splitmix64: a seeded stream of numbers, so a proptest case is one seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

#[allow(clippy::should_implement_trait)]
impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// A logit: mostly ordinary values, sometimes the awkward ones (signed zeros, infinities, NaN,
/// subnormals, values past f16's range).
pub fn logit(rng: &mut Rng) -> f32 {
    if rng.chance(50) {
        rng.pick(&[
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -3e-39,
            7e4,
            -1e5,
            f32::MAX,
        ])
    } else {
        rng.uniform(-30.0, 30.0)
    }
}

pub fn logits<T: Logit>(rng: &mut Rng, len: usize) -> Vec<T> {
    (0..len).map(|_| T::from_f32(logit(rng))).collect()
}

/// A token, often on an edge: the row's ends and the kernel's tile boundaries.
fn token(rng: &mut Rng, vocab: usize) -> u32 {
    if rng.chance(3) {
        let edges = [
            0,
            1,
            vocab - 1,
            vocab / 2,
            255,
            256,
            1023,
            1024,
            1025,
            2047,
            2048,
            4096,
        ];
        (rng.pick(&edges) % vocab) as u32
    } else {
        rng.below(vocab) as u32
    }
}

fn temperature(rng: &mut Rng) -> f32 {
    if rng.chance(4) {
        rng.pick(&[1.0, 0.7, 0.1, 1e-3, 3e4, 0.333_333_34, 1.5])
    } else {
        rng.uniform(0.05, 20.0)
    }
}

/// One edit of a random plan; a mask is carried by its words until it is pushed into a plan.
#[derive(Debug, Clone)]
pub enum Item {
    Edit(Edit),
    Mask {
        words: Vec<u32>,
        beyond_allowed: bool,
    },
}

pub fn push(plan: &mut RowPlan, item: &Item) {
    match item {
        Item::Edit(e) => plan.push(*e),
        Item::Mask {
            words,
            beyond_allowed,
        } => plan.push_mask(words, *beyond_allowed),
    }
}

/// A mask over `vocab`: random words, sometimes fewer than the vocab needs (the rest allowed or
/// not), sometimes more.
fn mask(rng: &mut Rng, vocab: usize) -> Item {
    let needed = vocab.div_ceil(32);
    let len = match rng.below(4) {
        0 => rng.below(needed + 1),
        1 => needed + 1 + rng.below(3),
        _ => needed,
    };
    let dense = rng.chance(2);
    let words = (0..len)
        .map(|_| {
            let w = rng.next() as u32;
            if dense {
                w | rng.next() as u32
            } else {
                w
            }
        })
        .collect();
    Item::Mask {
        words,
        beyond_allowed: rng.chance(2),
    }
}

/// A truncation: every rule, with parameters at their edges now and then (k past the vocab, top-p
/// 1, min-p 0 and 1, tiny and large epsilons), `min_keep` sometimes past the vocab.
pub fn truncation(rng: &mut Rng, vocab: usize) -> Edit {
    let min_keep = if rng.chance(12) {
        vocab as u32 + 1
    } else {
        1 + rng.below(3) as u32
    };
    let fraction = |rng: &mut Rng, edges: &[f32], lo: f32, hi: f32| {
        if rng.chance(5) {
            rng.pick(edges)
        } else {
            rng.uniform(lo, hi)
        }
    };
    Edit::Truncate(match rng.below(12) {
        0 | 1 => Truncation::TopK {
            k: match rng.below(6) {
                0 => vocab as u32 + rng.below(3) as u32,
                1 => rng.below(vocab) as u32 + 1,
                2 => rng.pick(&[1, 2, 1024]),
                _ => 1 + rng.below(40) as u32,
            },
            min_keep,
        },
        2 | 3 => Truncation::TopP {
            p: fraction(rng, &[1.0, 1e-6, 0.5], 0.05, 1.0),
            min_keep,
        },
        4 => Truncation::MinP {
            p: fraction(rng, &[0.0, 1.0, 1e-9], 0.0, 1.0),
            min_keep,
        },
        5 => Truncation::Typical {
            mass: fraction(rng, &[1e-6, 0.999_999], 0.05, 0.99),
            min_keep,
        },
        6 => Truncation::Epsilon {
            epsilon: fraction(rng, &[1e-9, 0.5, 0.999], 1e-5, 0.01),
            min_keep,
        },
        7 => Truncation::Eta {
            epsilon: fraction(rng, &[1e-9, 0.5, 0.999], 1e-5, 0.01),
            min_keep,
        },
        8 => Truncation::TopA {
            a: fraction(rng, &[0.0, 1.0, 1e-6], 0.0, 1.0),
            min_keep,
        },
        9 => Truncation::Xtc {
            threshold: fraction(rng, &[0.0, 1.0, 1e-4], 0.0, 0.3),
            min_keep,
        },
        11 => Truncation::PLess {
            min_keep,
            normalized: rng.chance(2),
        },
        _ => Truncation::MirostatV2 {
            mu: fraction(rng, &[0.0, 40.0, -3.0], 0.5, 12.0),
            key: 0,
        },
    })
}

pub fn edit(rng: &mut Rng, vocab: usize) -> Item {
    Item::Edit(match rng.below(24) {
        0..=2 => Edit::Scale {
            temperature: temperature(rng),
        },
        3 | 4 => Edit::Ban {
            token: token(rng, vocab),
        },
        5 | 6 => Edit::Bias {
            token: token(rng, vocab),
            bias: if rng.chance(5) {
                rng.pick(&[0.0, -0.0, 1e5, -7.5])
            } else {
                rng.uniform(-5.0, 5.0)
            },
        },
        7 | 8 => Edit::Penalty {
            token: token(rng, vocab),
            penalty: if rng.chance(5) {
                rng.pick(&[1.0, 2.0, 0.5, 1e-3])
            } else {
                rng.uniform(0.5, 3.0)
            },
        },
        9 => return mask(rng, vocab),
        10 => truncation(rng, vocab),
        14 => Edit::AddScaledAbs {
            token: token(rng, vocab),
            factor: factor(rng),
        },
        15 | 16 => Edit::Set {
            token: token(rng, vocab),
            value: set_value(rng),
        },
        11 => Edit::Force {
            token: token(rng, vocab),
            value: ForcedValue::Keep,
        },
        17 => Edit::AddScaledFrom {
            token: token(rng, vocab),
            source: token(rng, vocab),
            factor: factor(rng),
        },
        18 => Edit::Whole(logits_processing::WholeRow::InfNanRemove),
        23 => Edit::Reshape(logits_processing::Reshape::LogSoftmax),
        22 => Edit::Reshape(logits_processing::Reshape::AdaptiveP {
            target: rng.pick(&[0.0, 0.1, 0.5, 1.0]),
            key: 0,
        }),
        21 => Edit::Reshape(logits_processing::Reshape::Smoothing {
            k: rng.pick(&[0.0, 0.3, 2.0, 1e20]),
            s: rng.pick(&[0.0, 0.1, -0.5]),
        }),
        19 | 20 => Edit::ForceIf {
            token: (!rng.chance(4)).then(|| token(rng, vocab)),
            when: if rng.chance(2) {
                Trigger::ArgmaxIs {
                    token: token(rng, vocab),
                }
            } else {
                Trigger::MaxProbBelow {
                    p: rng.pick(&[0.0, 1e-3, 0.05, 0.5, 0.99, 1.0]),
                }
            },
            key: rng.below(3) as u32,
        },
        _ => Edit::Force {
            token: token(rng, vocab),
            value: ForcedValue::Set(if rng.chance(5) {
                rng.pick(&[-0.0, 0.0, 1e5, f32::NAN, f32::NEG_INFINITY])
            } else {
                rng.uniform(-3.0, 3.0)
            }),
        },
    })
}

/// A raise's factor: usually in transformers' range, sometimes one the arithmetic treats apart.
fn factor(rng: &mut Rng) -> f32 {
    if rng.chance(5) {
        rng.pick(&[0.0, -0.0, -1.0, 1e30, -0.5])
    } else {
        rng.uniform(-0.9, 4.0)
    }
}

/// A set's value, sometimes a special one.
fn set_value(rng: &mut Rng) -> f32 {
    if rng.chance(5) {
        rng.pick(&[-0.0, 0.0, 1e5, f32::NAN, f32::NEG_INFINITY])
    } else {
        rng.uniform(-3.0, 3.0)
    }
}

/// A sparse edit (ban, bias, penalty, raise or set) of `token`.
fn sparse(rng: &mut Rng, token: u32) -> Edit {
    match rng.below(5) {
        3 => Edit::AddScaledAbs {
            token,
            factor: factor(rng),
        },
        4 => Edit::Set {
            token,
            value: set_value(rng),
        },
        0 => Edit::Ban { token },
        1 => Edit::Bias {
            token,
            bias: rng.uniform(-2.0, 2.0),
        },
        _ => Edit::Penalty {
            token,
            penalty: rng.uniform(0.5, 2.0),
        },
    }
}

/// A row's edits: usually a handful (forces less often than the rest), sometimes a long list of
/// sparse edits (many touched tokens per tile), sometimes many edits of a few tokens between
/// dense ones, sometimes none.
pub fn edits(rng: &mut Rng, vocab: usize) -> Vec<Item> {
    let mut edits = vec![];
    let n = rng.below(7);
    let allow_force = rng.chance(3);
    while edits.len() < n {
        let e = edit(rng, vocab);
        if matches!(e, Item::Edit(Edit::Force { .. })) && !allow_force {
            continue;
        }
        edits.push(e);
    }
    if rng.chance(6) {
        for _ in 0..rng.below(400) {
            let at = rng.below(edits.len() + 1);
            let t = token(rng, vocab);
            let e = sparse(rng, t);
            edits.insert(at, Item::Edit(e));
        }
    }
    if rng.chance(6) {
        let few: Vec<u32> = (0..1 + rng.below(3)).map(|_| token(rng, vocab)).collect();
        for _ in 0..rng.below(300) {
            let at = rng.below(edits.len() + 1);
            let e = if rng.chance(20) {
                Edit::Scale {
                    temperature: temperature(rng),
                }
            } else {
                let t = rng.pick(&few);
                sparse(rng, t)
            };
            edits.insert(at, Item::Edit(e));
        }
    }
    edits
}

/// A block with random plans on some of its rows (the others unlisted), listed in any order.
pub fn random_plans<T: Logit>(seed: u64, vocab: usize) -> Case<T> {
    let mut rng = Rng::new(seed);
    let rows = 1 + rng.below(if vocab > 100_000 { 4 } else { 9 });
    let layout = BatchLayout {
        rows,
        row_stride: vocab + rng.pick(&[0, 1, 5]),
    };
    let input: Vec<T> = logits(&mut rng, layout.required_len(vocab));
    let mut listed = vec![];
    for row in 0..rows {
        if !rng.chance(4) {
            listed.push((row, plan_of_items(&edits(&mut rng, vocab))));
        }
    }
    for i in (1..listed.len()).rev() {
        listed.swap(i, rng.below(i + 1));
    }
    (layout, input, listed)
}

/// What the CPU path gives for `listed` on `input`.
pub fn cpu_apply<T: Logit>(
    input: &[T],
    layout: BatchLayout,
    vocab: usize,
    listed: &mut [(usize, RowPlan)],
) -> Vec<T> {
    let mut want = input.to_vec();
    for (row, plan) in listed.iter_mut() {
        let start = *row * layout.row_stride;
        plan.apply(&mut want[start..start + vocab]).unwrap();
    }
    want
}

pub fn plan_of(edits: &[Edit]) -> RowPlan {
    let mut plan = RowPlan::new();
    edits.iter().for_each(|e| plan.push(*e));
    plan
}

pub fn plan_of_items(items: &[Item]) -> RowPlan {
    let mut plan = RowPlan::new();
    items.iter().for_each(|item| push(&mut plan, item));
    plan
}

/// Bits for comparison, every NaN as one value: NaN payloads are the one thing the GPU's
/// arithmetic may give differently (its division returns the canonical NaN).
pub fn bits<T: Logit>(xs: &[T]) -> Vec<u32> {
    xs.iter()
        .map(|x| {
            let x = x.to_f32();
            if x.is_nan() {
                0x7fc0_0000
            } else {
                x.to_bits()
            }
        })
        .collect()
}

/// The first index where two rows differ, with both values, for a readable failure.
pub fn first_difference<T: Logit>(got: &[T], want: &[T]) -> Option<(usize, f32, f32)> {
    let (g, w) = (bits(got), bits(want));
    (0..g.len())
        .find(|&i| g[i] != w[i])
        .map(|i| (i, got[i].to_f32(), want[i].to_f32()))
}

/// The handle through which a test sets a scripted processor's edits.
pub type Script = Arc<Mutex<Vec<Item>>>;

/// A processor whose edits the test sets each step (through the shared handle).
#[derive(Debug, Clone)]
pub struct Scripted {
    pub edits: Script,
    pub max_token: u32,
}

impl LogitsProcessor for Scripted {
    fn plan(
        &mut self,
        _ids: &dyn TokenHistory,
        plan: &mut RowPlan,
    ) -> logits_processing::Result<()> {
        self.edits
            .lock()
            .unwrap()
            .iter()
            .for_each(|item| push(plan, item));
        Ok(())
    }
    fn undo(&mut self) {}
    fn max_token_id(&self) -> Option<u32> {
        Some(self.max_token)
    }
}

/// The external step both paths run: a deterministic edit of the row that depends on the key.
pub fn external_edit<T: Logit>(key: u64, row: &mut [T]) {
    let i = key as usize % row.len();
    row[i] = T::from_f32(row[i].to_f32() * 0.5 + key as f32);
    let last = row.len() - 1;
    row[last] = T::from_f32(-(key as f32));
}

/// One request: a pipeline of 1-3 stages (scripted processors, sometimes an external step
/// between them), with the handles that set each processor's edits.
pub struct Request {
    pub pipeline: Option<Pipeline>,
    pub scripts: Vec<Script>,
}

pub fn request(rng: &mut Rng, vocab: usize, externals: bool) -> Request {
    let mut steps = vec![];
    let mut scripts = vec![];
    for k in 0..1 + rng.below(3) {
        if k > 0 && externals && rng.chance(2) {
            steps.push(Step::External(rng.below(1000) as u64));
        }
        let script = Arc::new(Mutex::new(vec![]));
        scripts.push(script.clone());
        steps.push(Step::Processor(Box::new(Scripted {
            edits: script,
            max_token: vocab as u32 - 1,
        })));
    }
    Request {
        pipeline: Some(Pipeline::new(steps)),
        scripts,
    }
}

/// A ragged batch over several steps: requests added, removed, moved and swapped between steps,
/// with new edits every step. `step(batch, layout)` runs the path under test after the batch is
/// planned; it returns the logits it produced, which must equal the CPU path's.
pub fn lifecycle<T: Logit>(
    seed: u64,
    vocab: usize,
    steps: usize,
    externals: bool,
    mut step: impl FnMut(&mut Batch, &[T], BatchLayout) -> Vec<T>,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut batch = Batch::new(vocab);
    // The scripts of the request at each row, moved along with it.
    let mut scripts: Vec<Option<Vec<Script>>> = vec![];
    let max_rows = 1 + rng.below(if vocab > 100_000 { 6 } else { 12 });
    for step_index in 0..steps {
        // Lifecycle events.
        for _ in 0..1 + rng.below(3) {
            let row = rng.below(max_rows);
            if scripts.len() < max_rows {
                scripts.resize(max_rows, None);
            }
            match rng.below(5) {
                0 | 1 => {
                    let mut r = request(&mut rng, vocab, externals);
                    batch
                        .add(row, r.pipeline.take().unwrap())
                        .map_err(|e| e.to_string())?;
                    scripts[row] = Some(r.scripts);
                }
                2 => {
                    batch.remove(row);
                    scripts[row] = None;
                }
                3 => {
                    let to = rng.below(max_rows);
                    batch.move_row(row, to);
                    if row != to {
                        scripts[to] = scripts[row].take();
                    }
                }
                _ => {
                    let b = rng.below(max_rows);
                    batch.swap_rows(row, b);
                    scripts.swap(row, b);
                }
            }
        }
        for s in scripts.iter().flatten() {
            for script in s {
                *script.lock().unwrap() = edits(&mut rng, vocab);
            }
        }
        for (r, s) in scripts.iter().enumerate() {
            assert_eq!(
                batch.get(r).is_some(),
                s.is_some(),
                "the test lost track of row {r}"
            );
        }
        let rows = batch.iter().map(|(r, _)| r + 1).max().unwrap_or(0) + rng.below(2);
        let layout = BatchLayout {
            rows,
            row_stride: vocab + rng.pick(&[0, 0, 1, 3]),
        };
        let input: Vec<T> = logits(&mut rng, layout.required_len(vocab));
        let empty: &[u32] = &[];
        let histories: Vec<&dyn TokenHistory> =
            (0..rows).map(|_| &empty as &dyn TokenHistory).collect();
        batch.plan(&histories).map_err(|e| e.to_string())?;

        let got = step(&mut batch, &input, layout);
        let mut want = input.clone();
        batch
            .apply_planned(&mut want, layout, &mut |_, key, row| {
                external_edit(key, row);
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        if let Some((i, g, w)) = first_difference(&got, &want) {
            return Err(format!(
                "step {step_index}, {} rows, vocab {vocab}, {}: element {i} (row {}, index {}) is {g:e}, the CPU gives {w:e}",
                rows,
                T::DTYPE.name(),
                i / layout.row_stride,
                i % layout.row_stride
            ));
        }
    }
    Ok(())
}

pub fn dtypes() -> [DType; 3] {
    [DType::F32, DType::F16, DType::BF16]
}

/// Runs `f::<T>` for the element type `dtype` names.
#[macro_export]
macro_rules! for_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            logits_processing::DType::F32 => $f::<f32>($($arg),*),
            logits_processing::DType::F16 => $f::<logits_processing::f16>($($arg),*),
            logits_processing::DType::BF16 => $f::<logits_processing::bf16>($($arg),*),
        }
    };
}

/// Rows of ordinary logits (spread narrow or wide, ties in the 16-bit types, a few `-inf`, NaN and
/// signed zeros, never `+inf`, so every row has a distribution), each with a truncation of every
/// rule after a few other edits (and sometimes a second truncation or a mask between).
pub fn truncation_plans<T: Logit>(seed: u64, vocab: usize) -> Case<T> {
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
    (layout, input, listed)
}

/// A block, its rows' plans: what a case is.
pub type Case<T> = (BatchLayout, Vec<T>, Vec<(usize, RowPlan)>);

/// The cases the kernels are run on, by name: `"plans"` ([`random_plans`]), `"truncations"`
/// ([`truncation_plans`]), `"self_check"` (the device's self-check plans at `vocab`, one group of
/// rows), and three fixed ones: `"one_token"` (hundreds of edits of three tokens between scales), `"sets_after_force"`
/// (a forced row that sets tokens after its force, before and after a truncation) and
/// `"forced_zero"` (a forced `-0.0` comes back `0.0`, as the reference's mask add makes it).
pub fn kernel_case<T: Logit>(name: &str, seed: u64, vocab: usize) -> Result<Case<T>, String> {
    let contiguous = |input: Vec<T>, plans: Vec<RowPlan>| {
        let layout = BatchLayout::contiguous(input.len() / vocab, vocab);
        (layout, input, plans.into_iter().enumerate().collect())
    };
    Ok(match name {
        "plans" => random_plans(seed, vocab),
        "truncations" => truncation_plans(seed, vocab),
        "self_check" => {
            // Its first group of rows: every group has the same plans.
            let layout = BatchLayout {
                rows: crate::self_check::GROUP,
                ..crate::self_check::layout(vocab)
            };
            let plans = crate::self_check::plans(vocab)
                .into_iter()
                .filter(|(row, _)| *row < layout.rows)
                .collect();
            (layout, crate::self_check::input(layout, vocab), plans)
        }
        "one_token" => {
            let mut rng = Rng::new(seed);
            let mut plan = RowPlan::new();
            for i in 0..600 {
                let token = (i % 3) as u32 * (vocab as u32 / 3);
                plan.push(if i % 97 == 0 {
                    Edit::Scale {
                        temperature: rng.uniform(0.5, 2.0),
                    }
                } else {
                    sparse(&mut rng, token)
                });
            }
            contiguous(logits(&mut rng, vocab), vec![plan])
        }
        "sets_after_force" => {
            // Sets after the last force bring their tokens back (a band after such a set sees
            // them), a set before the force does not; tokens on both sides of a tile edge.
            let last = vocab as u32 - 1;
            let force = |token| Edit::Force {
                token,
                value: ForcedValue::Keep,
            };
            let set = |token, value| Edit::Set { token, value };
            let raise = |token, factor| Edit::AddScaledAbs { token, factor };
            let top_k = |k| Edit::Truncate(Truncation::TopK { k, min_keep: 1 });
            let plans = vec![
                plan_of(&[force(1023), set(1024, 2.0), set(7, -1.5), set(1024, 3.0)]),
                plan_of(&[set(5, 9.0), force(1023), set(1023, 1.0), raise(1023, 0.5)]),
                plan_of(&[force(10), set(11, 50.0), top_k(1), set(12, 1.0)]),
                plan_of(&[
                    force(10),
                    set(11, -50.0),
                    raise(11, 0.25),
                    top_k(1),
                    force(20),
                    set(21, 0.0),
                ]),
                plan_of(&[
                    Edit::Bias {
                        token: last,
                        bias: 1.0,
                    },
                    force(last),
                    set(0, f32::NEG_INFINITY),
                    set(2048, f32::NAN),
                    Edit::Scale { temperature: 0.5 },
                    top_k(2),
                    Edit::Ban { token: 2048 },
                ]),
            ];
            let input = (0..plans.len() * vocab)
                .map(|i| T::from_f32((i % vocab % 37) as f32 * 0.25 - 4.0))
                .collect();
            contiguous(input, plans)
        }
        "forced_zero" => {
            let mut input = vec![T::from_f32(1.0); vocab];
            input[1] = T::from_f32(-0.0);
            let plan = plan_of(&[Edit::Force {
                token: 1,
                value: ForcedValue::Keep,
            }]);
            contiguous(input, vec![plan])
        }
        other => return Err(format!("no kernel case named {other:?}")),
    })
}
