//! The kernels' algorithms run on the host over the packed words: the oracle the property tests
//! compare with [`RowPlan::apply`] bit for bit, which checks the packing and the kernels' logic
//! without a GPU, and the self-check's reference on a GPU.

use super::*;

/// The kernel's `T::round`: a value rounded to the element type and widened back.
fn round<T: Logit>(v: f32) -> f32 {
    T::from_f32(v).to_f32()
}

/// The plan's meaning of a mask edit, without a plan at hand: [`Edit::value`] asks the `allowed`
/// closure, which reads the packed words, so any mask id does.
fn a_mask_edit() -> Edit {
    let mut plan = RowPlan::new();
    plan.push_mask(&[], true);
    plan.edits()[0]
}

/// The packed words and one row's descriptor, for the emulation.
struct Row<'a> {
    words: &'a [u32],
    desc: &'a [u32],
    mask_edit: Edit,
}

impl Row<'_> {
    fn dense_op(&self, d: u32) -> &[u32] {
        let at = self.desc[2] as usize + d as usize * DENSE_WORDS;
        &self.words[at..at + DENSE_WORDS]
    }

    /// The value dense op `d` gives the logit at `index` of value `v`: [`Edit::value`] of the edit
    /// the op encodes, rounded to `T`.
    fn dense<T: Logit>(&self, d: u32, index: u32, v: f32) -> f32 {
        let op = self.dense_op(d);
        let (a, b, c) = (op[1], op[2], op[3]);
        let (edit, band) = match Op::from_code(op[0]) {
            Some(Op::Scale) => (
                Edit::Scale {
                    temperature: f32::from_bits(a),
                },
                Band::ALL,
            ),
            Some(Op::ForceKeep) => (
                Edit::Force {
                    token: a,
                    value: ForcedValue::Keep,
                },
                Band::ALL,
            ),
            Some(Op::ForceSet) => (
                Edit::Force {
                    token: a,
                    value: ForcedValue::Set(f32::from_bits(b)),
                },
                Band::ALL,
            ),
            Some(Op::Mask) => (self.mask_edit, Band::ALL),
            Some(Op::Truncate) => {
                let r = &self.words[a as usize..a as usize + BAND_WORDS];
                let rule = Rule::decode(r[2], r[3], r[4]).expect("a packed rule");
                let band = Band {
                    lo: f32::from_bits(r[0]),
                    hi: f32::from_bits(r[1]),
                };
                (Edit::Truncate(rule), band)
            }
            other => unreachable!("{other:?} is not a dense op"),
        };
        let allowed = |_| {
            let mask = Bitmask {
                words: &self.words[a as usize..(a + b) as usize],
                beyond_allowed: c != 0,
            };
            mask.allows(index as usize)
        };
        round::<T>(edit.value(index as usize, v, allowed, band))
    }

    /// [`Self::dense`] as a truncation sees the row (`segments`): at each truncation, a logit that
    /// a force since the previous truncation did not name is `-inf` whatever came after the force
    /// ([`RowPlan::resolve_truncations`] applies the plan up to each truncation as a whole plan,
    /// and a forced plan fills the other logits).
    /// `set`: whether an [`Edit::Set`] of the logit came after the last force so far (a truncation
    /// then sees it as the CPU's forced segment does: [`RowPlan::set_after_force`]).
    fn dense_step<T: Logit>(
        &self,
        d: u32,
        index: u32,
        v: f32,
        segments: bool,
        set: &mut bool,
    ) -> f32 {
        let v = if segments {
            self.segment_end(d, index, v, *set)
        } else {
            v
        };
        let code = self.dense_op(d)[0];
        if code == Op::ForceKeep as u32 || code == Op::ForceSet as u32 {
            *set = false;
        }
        self.dense::<T>(d, index, v)
    }

    fn segment_end(&self, d: u32, index: u32, v: f32, set: bool) -> f32 {
        let op = self.dense_op(d);
        if op[0] == Op::Truncate as u32 && op[2] != NO_TOKEN && op[2] != index && !set {
            f32::NEG_INFINITY
        } else {
            v
        }
    }

    fn sparse<T: Logit>(head: u32, value: u32, index: u32, v: f32) -> f32 {
        let x = f32::from_bits(value);
        let token = index;
        let edit = match Op::from_code(head & ((1 << OP_BITS) - 1)) {
            Some(Op::Ban) => Edit::Ban { token },
            Some(Op::Bias) => Edit::Bias { token, bias: x },
            Some(Op::Penalty) => Edit::Penalty { token, penalty: x },
            Some(Op::AddScaledAbs) => Edit::AddScaledAbs { token, factor: x },
            Some(Op::Set) => Edit::Set { token, value: x },
            other => unreachable!("{other:?} is not a sparse op"),
        };
        round::<T>(edit.value(index as usize, v, |_| true, Band::ALL))
    }
}

/// The kernels' evaluation of one logit: from its value `v` before the plan, through the dense
/// ops `[0, dense_end)` and, for a touched token (`program`: its place in the touched list), its
/// own sparse ops before dense op `dense_end`, merged in plan order. `segments`: as a truncation
/// sees the row (the band kernel), where `dense_end` is that truncation.
fn eval<T: Logit>(
    row: &Row,
    index: u32,
    mut v: f32,
    program: u32,
    dense_end: u32,
    segments: bool,
) -> f32 {
    let mut next = 0;
    // Whether a Set of this logit came after the last force so far.
    let mut set = false;
    if program != NO_TOKEN {
        let bounds = row.desc[6] as usize + program as usize;
        let (begin, end) = (row.words[bounds] as usize, row.words[bounds + 1] as usize);
        for op in row.words[begin..end].chunks_exact(SPARSE_WORDS) {
            let before = op[0] >> OP_BITS;
            if before > dense_end {
                break;
            }
            while next < before {
                v = row.dense_step::<T>(next, index, v, segments, &mut set);
                next += 1;
            }
            set |= op[0] & ((1 << OP_BITS) - 1) == Op::Set as u32;
            v = Row::sparse::<T>(op[0], op[1], index, v);
        }
    }
    while next < dense_end {
        v = row.dense_step::<T>(next, index, v, segments, &mut set);
        next += 1;
    }
    if segments {
        v = row.segment_end(dense_end, index, v, set);
    }
    v
}

/// The first position in `words[begin..end]` (sorted) whose value is >= `token`.
fn lower_bound(words: &[u32], mut begin: usize, mut end: usize, token: u32) -> usize {
    while begin < end {
        let mid = begin + (end - begin) / 2;
        if words[mid] < token {
            begin = mid + 1;
        } else {
            end = mid;
        }
    }
    begin
}

/// The touched tokens' positions in `row`'s touched list that fall in `[tile_begin, tile_end)`.
fn tile_touched(row: &Row, tile_begin: u32, tile_end: u32) -> (usize, usize) {
    let (begin, n) = (row.desc[4] as usize, row.desc[5] as usize);
    let lo = lower_bound(row.words, begin, begin + n, tile_begin);
    let hi = lower_bound(row.words, lo, begin + n, tile_end);
    (lo - begin, hi - begin)
}

/// Runs the kernels' algorithms on the host: the band kernel for each truncating slot, then every
/// block (slot, tile) of the apply kernel and every thread of it, in the kernels' order, over
/// `logits` (`row_stride` elements a row), with the kernels' arithmetic (values held in f32,
/// rounded to the element type after every edit, each edit's value from [`Edit::value`]). The
/// property tests compare it with [`RowPlan::apply`] bit for bit, which checks the packing and
/// the kernels' logic without a GPU.
pub fn emulate<T: Logit>(
    packed: &PackedPlans,
    vocab_size: usize,
    row_stride: usize,
    logits: &mut [T],
) {
    // The band kernel writes the bands into the device copy of the words.
    let mut words = packed.words().to_vec();
    let (list, n) = packed.truncating();
    for b in 0..n {
        let slot = words[list + b] as usize;
        emulate_bands(&mut words, slot, vocab_size, row_stride, logits);
    }
    emulate_apply(&words, packed.slots(), vocab_size, row_stride, logits);
}

/// The band kernel's block for one truncating slot: each truncation of the row in order, its
/// band written into its record.
fn emulate_bands<T: Logit>(
    words: &mut [u32],
    slot: usize,
    vocab: usize,
    stride: usize,
    logits: &[T],
) {
    let desc: [u32; DESC_WORDS] = std::array::from_fn(|i| words[slot * DESC_WORDS + i]);
    let x = &logits[desc[0] as usize * stride..desc[0] as usize * stride + vocab];
    let mask_edit = a_mask_edit();
    for d in 0..desc[3] {
        let op_at = desc[2] as usize + d as usize * DENSE_WORDS;
        if words[op_at] != Op::Truncate as u32 {
            continue;
        }
        let record = words[op_at + 1] as usize;
        let row = Row {
            words,
            desc: &desc,
            mask_edit,
        };
        // The row as it stands at this truncation, tile by tile as the kernel reads it.
        let mut values = Vec::with_capacity(vocab);
        for tile_begin in (0..vocab).step_by(TILE) {
            let tile_end = (tile_begin + TILE).min(vocab);
            let (lo, hi) = tile_touched(&row, tile_begin as u32, tile_end as u32);
            let touched = &words[desc[4] as usize..][lo..hi];
            for (i, x) in (tile_begin..tile_end).zip(&x[tile_begin..tile_end]) {
                let program = match touched.binary_search(&(i as u32)) {
                    Ok(at) => (lo + at) as u32,
                    Err(_) => NO_TOKEN,
                };
                values.push(eval::<T>(&row, i as u32, x.to_f32(), program, d, true));
            }
        }
        let rule = Rule::decode(words[record + 2], words[record + 3], words[record + 4])
            .expect("a packed rule");
        let band = resolve_band(&rule, &values);
        words[record] = band.lo.to_bits();
        words[record + 1] = band.hi.to_bits();
    }
}

/// A rule's band over `values` by the band kernel's algorithm: passes over the row (a maximum,
/// the fixed-point sums, then histograms of keys), each a reduction whose result does not depend
/// on the order the threads visit the values in. The arithmetic is the core's
/// ([`Softmax`], [`truncation::exp`], [`truncation::fixed`]); the selections are the kernel's.
pub fn resolve_band(rule: &Truncation, values: &[f32]) -> Band {
    let non_nan = |x: f32| (!x.is_nan()).then(|| (order_key(x), 1));
    // The k-th largest non-NaN value's key, or -inf's when there are fewer than k.
    let kth_key = |k: u32| {
        select_key(values, non_nan, k as f64, false).unwrap_or(order_key(f32::NEG_INFINITY))
    };
    if rule.on_cpu_only() {
        // Never packed (refused); the core's own band.
        return rule.band(values, &mut Vec::new());
    }
    if let Truncation::TopK { k, min_keep } = *rule {
        return Band {
            lo: from_order_key(kth_key(k.max(min_keep))),
            hi: f32::INFINITY,
        };
    }
    // Pass: the maximum, as an order key (-inf when every value is NaN).
    let max_key = values
        .iter()
        .filter(|x| !x.is_nan())
        .fold(order_key(f32::NEG_INFINITY), |m, &x| m.max(order_key(x)));
    let mut softmax = Softmax {
        max: from_order_key(max_key),
        sum: 0,
        entropy_sum: 0,
    };
    if !softmax.is_defined() {
        return Band::ALL;
    }
    // Pass: the fixed-point sums.
    for &x in values {
        let (w, e) = softmax.weights(x);
        softmax.sum += w;
        softmax.entropy_sum += e;
    }
    let min_keep = rule.min_keep();
    let lo_key = match *rule {
        Truncation::TopK { .. }
        | Truncation::TopNSigma { .. }
        | Truncation::TopA { .. }
        | Truncation::PLess { .. }
        | Truncation::TopH { .. }
        | Truncation::TailFree { .. }
        | Truncation::Xtc { .. }
        | Truncation::MirostatV1 { .. }
        | Truncation::MirostatV2 { .. } => unreachable!("resolved above"),
        Truncation::MinP { .. } | Truncation::Epsilon { .. } | Truncation::Eta { .. } => {
            // Pass: the smallest value whose q reaches the threshold.
            let threshold = softmax.threshold(rule);
            values
                .iter()
                .filter(|&&x| !x.is_nan() && softmax.q(x) >= threshold)
                .fold(order_key(f32::INFINITY), |m, &x| m.min(order_key(x)))
        }
        Truncation::TopP { p, .. } => {
            let weighted = |x: f32| (!x.is_nan()).then(|| (order_key(x), softmax.weights(x).0));
            match select_key(values, weighted, softmax.target(p), false) {
                Some(key) => key,
                None => return Band::ALL,
            }
        }
        Truncation::Typical { mass, .. } => {
            // Keys that grow as the score falls: the selection takes the largest keys first.
            let shift = softmax.shift();
            let scored = |x: f32| {
                (!x.is_nan() && x != f32::NEG_INFINITY)
                    .then(|| !order_key(softmax.typical_score(x, shift)))
            };
            let by_mass = |x: f32| scored(x).map(|key| (key, softmax.weights(x).0));
            let by_count = |x: f32| scored(x).map(|key| (key, 1));
            let Some(mass_cut) = select_key(values, by_mass, softmax.target(mass), false) else {
                return Band::ALL;
            };
            let Some(count_cut) = select_key(values, by_count, min_keep as f64, true) else {
                return Band::ALL;
            };
            // Pass: the smallest and largest value scoring at most the cut.
            let cut = mass_cut.min(count_cut);
            let (lo, hi) = values
                .iter()
                .filter(|&&x| scored(x).is_some_and(|key| key >= cut))
                .fold(
                    (order_key(f32::INFINITY), order_key(f32::NEG_INFINITY)),
                    |(lo, hi), &x| (lo.min(order_key(x)), hi.max(order_key(x))),
                );
            return Band {
                lo: from_order_key(lo),
                hi: from_order_key(hi),
            };
        }
    };
    Band {
        lo: from_order_key(lo_key.min(kth_key(min_keep))),
        hi: f32::INFINITY,
    }
}

/// The band kernel's weighted radix select: the largest key, among the keys `key_of` gives the
/// values (`None`: the value takes no part), at which the weights of the keys at or above it
/// reach `target` (compared in f64). One histogram of [`RADIX_BITS`]-bit digits per pass, most
/// significant first, each pass weighing only the keys that start with the digits chosen so far;
/// each bin's thread tests whether the running sum crosses the target in its bin. With `clamp`,
/// the target is at most the total weight. `None` when the total does not reach the target, or the
/// target is not positive.
pub fn select_key(
    values: &[f32],
    key_of: impl Fn(f32) -> Option<(u32, u64)>,
    target: f64,
    clamp: bool,
) -> Option<u32> {
    const BINS: usize = 1 << RADIX_BITS;
    let mut target = target;
    let mut prefix = 0u32;
    let mut above = 0u64;
    for pass in 0..32 / RADIX_BITS {
        let shift = 32 - RADIX_BITS * (pass + 1);
        let fixed = if pass == 0 {
            0
        } else {
            u32::MAX << (shift + RADIX_BITS)
        };
        let mut hist = [0u64; BINS];
        for &v in values {
            if let Some((key, w)) = key_of(v) {
                if key & fixed == prefix && w != 0 {
                    hist[(key >> shift) as usize & (BINS - 1)] += w;
                }
            }
        }
        // Inclusive sums from the top bin down.
        let mut suffix = hist;
        for b in (0..BINS - 1).rev() {
            suffix[b] += suffix[b + 1];
        }
        if pass == 0 {
            let total = suffix[0];
            if clamp {
                target = target.min(total as f64);
            }
            if target.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
                || (total as f64) < target
            {
                return None;
            }
        }
        let chosen = (0..BINS).find(|&b| {
            let reached = above + suffix[b];
            ((reached - hist[b]) as f64) < target && reached as f64 >= target
        })?;
        above += suffix[chosen] - hist[chosen];
        prefix |= (chosen as u32) << shift;
    }
    Some(prefix)
}

/// The k-th largest non-NaN value under `total_cmp` (`-inf` when k is 0 or there are fewer than
/// k), by the band kernel's radix select with every value weighing 1. Exact: the result is one of
/// the values.
pub fn radix_kth_largest(values: &[f32], k: u32) -> f32 {
    let non_nan = |x: f32| (!x.is_nan()).then(|| (order_key(x), 1));
    select_key(values, non_nan, k as f64, false).map_or(f32::NEG_INFINITY, from_order_key)
}

fn emulate_apply<T: Logit>(
    words: &[u32],
    slots: usize,
    vocab: usize,
    stride: usize,
    logits: &mut [T],
) {
    let tiles = tiles_per_row(vocab);
    let mask_edit = a_mask_edit();
    for block in 0..slots * tiles {
        let (slot, tile) = (block / tiles, block % tiles);
        let row = Row {
            words,
            desc: &words[slot * DESC_WORDS..(slot + 1) * DESC_WORDS],
            mask_edit,
        };
        let [r, forced, _, n_dense, touched_begin, n_touched, _, _, survivors, n_survivors] =
            std::array::from_fn(|i| row.desc[i]);
        let survivors = &words[survivors as usize..(survivors + n_survivors) as usize];
        let x = &mut logits[r as usize * stride..];
        let tile_begin = (tile * TILE) as u32;
        let touched = &words[touched_begin as usize..(touched_begin + n_touched) as usize];
        let elements = |thread: u32| {
            (0..PER_THREAD as u32)
                .map(move |k| tile_begin + thread + k * THREADS as u32)
                .filter(|&i| (i as usize) < vocab)
        };
        if forced != NO_TOKEN {
            let survives = |i: u32| i == forced || survivors.binary_search(&i).is_ok();
            for thread in 0..THREADS as u32 {
                for i in elements(thread).filter(|&i| !survives(i)) {
                    x[i as usize] = T::NEG_INFINITY;
                }
            }
            // The survivors, each by the thread that owns it: the forced token, then the others.
            for &i in std::iter::once(&forced).chain(survivors) {
                if (i as usize) < tile * TILE || (i as usize) >= (tile + 1) * TILE {
                    continue;
                }
                let at = lower_bound(touched, 0, touched.len(), i);
                let program = if at < touched.len() && touched[at] == i {
                    at as u32
                } else {
                    NO_TOKEN
                };
                let v = x[i as usize].to_f32();
                x[i as usize] = T::from_f32(eval::<T>(&row, i, v, program, n_dense, false));
            }
            continue;
        }
        let (lo, hi) = tile_touched(&row, tile_begin, tile_begin + TILE as u32);
        if n_dense == 0 {
            // Sparse edits only: the touched tokens, nothing else.
            for thread in 0..THREADS {
                for t in (lo + thread..hi).step_by(THREADS) {
                    let i = touched[t];
                    let v = x[i as usize].to_f32();
                    x[i as usize] = T::from_f32(eval::<T>(&row, i, v, t as u32, 0, false));
                }
            }
            continue;
        }
        // The tile's map from logit to touched position, as the kernel builds it in shared memory.
        let mut map = vec![NO_TOKEN; TILE];
        for (t, &token) in touched.iter().enumerate().take(hi).skip(lo) {
            map[(token - tile_begin) as usize] = t as u32;
        }
        for thread in 0..THREADS as u32 {
            for i in elements(thread) {
                let program = map[(i - tile_begin) as usize];
                let v = x[i as usize].to_f32();
                x[i as usize] = T::from_f32(eval::<T>(&row, i, v, program, n_dense, false));
            }
        }
    }
}

/// The host emulation's hook for an external step: `(row, key, logits_row)`.
pub type HostExternal<'a, T> = dyn FnMut(usize, u64, &mut [T]) -> Result<(), CudaError> + 'a;

/// `CudaBatchApplier::apply_batch` on the host: the same stage levels, packing and launches, with
/// [`emulate`] for each launch and `external(row, key, row_logits)` for each external step.
pub fn emulate_batch<T: Logit>(
    packed: &mut PackedPlans,
    batch: &Batch,
    logits: &mut [T],
    layout: BatchLayout,
    external: &mut HostExternal<'_, T>,
) -> Result<(), CudaError> {
    let vocab = batch.vocab_size();
    batch.check_layout(logits.len(), layout)?;
    for level in 0..levels(batch) {
        packed.pack(|| level_plans(batch, level), layout.rows, vocab)?;
        emulate(packed, vocab, layout.row_stride, logits);
        for (row, key) in level_externals(batch, level) {
            let start = row * layout.row_stride;
            external(row, key, &mut logits[start..start + vocab])?;
        }
    }
    Ok(())
}
