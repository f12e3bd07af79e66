//! Selections shared by the truncation rules: the values at or above a floor, the k-th largest,
//! the lowest value whose `q` reaches a threshold, the entry where a running mass reaches a
//! target.

use crate::truncation::{exp, largest, order_key, Band, Work, EXP_MIN};

/// Values a compare pass scans between its appends to a `Vec`. An append may grow the vector (a
/// call, after which no vector register survives), and a loop that appends as it goes, or even
/// one nested in such a loop, stores and reloads its running minima or maxima every block
/// (measured: most of the pass's time). So a span is scanned by a function of its own, without
/// calls, that records the masks of the lanes it found; they are appended after it.
pub(crate) const SPAN: usize = 1024;

/// Calls `take` with the index in its span of each lane set in `masks` (a mask of sixteen lanes
/// per block), for a span of `len` values.
#[inline(always)]
pub(crate) fn each_found(masks: &[u32; SPAN / 16], len: usize, mut take: impl FnMut(usize)) {
    for (block, &mask) in masks[..len.div_ceil(16)].iter().enumerate() {
        let mut mask = mask;
        while mask != 0 {
            take(block * 16 + mask.trailing_zeros() as usize);
            mask &= mask - 1;
        }
    }
}

/// Collects into `work` every value `x >= floor` (an upper set of the row under
/// `f32::total_cmp` order: NaN never, `-0.0` and `0.0` together), each with `weight(x)`.
/// Most rows have few such values; blocks without one cost a compare.
#[inline(always)]
pub(crate) fn collect_from(
    values: &[f32],
    floor: f32,
    work: &mut Work,
    weight: impl Fn(f32) -> u64,
) {
    work.clear();
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { collect_from_avx2(values, floor, work, &weight) };
    }
    let entry = |x: f32| (order_key(x), weight(x), x);
    work.extend(values.iter().filter(|&&x| x >= floor).map(|&x| entry(x)));
}

/// [`collect_from`] a block of 16 values at a time: two compares and a bit mask, then only the
/// values at or above the floor visited.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn collect_from_avx2(values: &[f32], floor: f32, work: &mut Work, weight: &impl Fn(f32) -> u64) {
    use std::arch::x86_64::*;
    let entry = |x: f32| (order_key(x), weight(x), x);
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    let floor_v = _mm256_set1_ps(floor);
    for block in blocks {
        // SAFETY: `block` holds 16 f32.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        let mut at_or_above = (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(a, floor_v))
            | _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(b, floor_v)) << 8)
            as u32;
        while at_or_above != 0 {
            work.push(entry(block[at_or_above.trailing_zeros() as usize]));
            at_or_above &= at_or_above - 1;
        }
    }
    work.extend(rest.iter().filter(|&&x| x >= floor).map(|&x| entry(x)));
}

/// The float maximum of `values` (NaN never wins a comparison; the sign of a zero is not
/// decided), with every value but `-inf` at or above `running maximum + below` collected into
/// `work` (key and weight 0): a superset of the values at or above `maximum + below`, in one pass.
/// `None` past `limit` of them, or without AVX2.
#[inline(always)]
pub(crate) fn max_and_near(
    values: &[f32],
    below: f32,
    limit: usize,
    work: &mut Work,
) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { max_and_near_avx2(values, below, limit, work) };
    }
    let _ = (values, below, limit, work);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn max_and_near_avx2(values: &[f32], below: f32, limit: usize, work: &mut Work) -> Option<f32> {
    work.clear();
    let rest = &values[values.len() / 16 * 16..];
    // The float maximum so far.
    let mut max = f32::NEG_INFINITY;
    let mut found = [0u32; SPAN / 16];
    for span in values[..values.len() - rest.len()].chunks(SPAN) {
        let any;
        (max, any) = near_span_avx2(span, max, below, &mut found);
        if !any {
            continue;
        }
        each_found(&found, span.len(), |i| work.push((0, 0, span[i])));
        if work.len() > limit {
            return None;
        }
    }
    let max = rest.iter().fold(max, |m, &x| if x > m { x } else { m });
    // The last values against the final maximum.
    let floor = (max + below).max(f32::MIN);
    work.extend(rest.iter().filter(|&&x| x >= floor).map(|&x| (0, 0, x)));
    (work.len() <= limit).then_some(max)
}

/// One span of [`max_and_near_avx2`] (whole blocks of sixteen) from the maximum so far: the masks
/// of the values near the running maximum into `found`, and the maximum after the span. A
/// function of its own, without calls ([`SPAN`]), so that its running maximum stays in a register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline(never)]
fn near_span_avx2(span: &[f32], max: f32, below: f32, found: &mut [u32; SPAN / 16]) -> (f32, bool) {
    use std::arch::x86_64::*;
    let (below_v, lowest) = (_mm256_set1_ps(below), _mm256_set1_ps(f32::MIN));
    // The floor of a running maximum: never below the lowest finite value, so `-inf` stays out.
    let floor = |running: __m256| _mm256_max_ps(_mm256_add_ps(running, below_v), lowest);
    let mut running = _mm256_set1_ps(max);
    let mut any = 0;
    for (at, block) in span.chunks_exact(16).enumerate() {
        // SAFETY: `block` holds 16 f32.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        // `max_ps(x, m)` is `x > m ? x : m`: NaN never enters.
        running = _mm256_max_ps(a, _mm256_max_ps(b, running));
        // Each lane's maximum is at most the row's: its floor is at most the final one.
        let near = |floor: __m256| {
            (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(a, floor))
                | _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(b, floor)) << 8) as u32
        };
        found[at] = 0;
        if near(floor(running)) == 0 {
            continue;
        }
        // Every lane to the maximum so far, then against its floor.
        let halves = _mm256_max_ps(running, _mm256_permute2f128_ps::<1>(running, running));
        let pairs = _mm256_max_ps(halves, _mm256_permute_ps::<0b01_00_11_10>(halves));
        running = _mm256_max_ps(pairs, _mm256_permute_ps::<0b10_11_00_01>(pairs));
        found[at] = near(floor(running));
        any |= found[at];
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), running) };
    let max = lanes
        .into_iter()
        .fold(max, |m, x| if x > m { x } else { m });
    (max, any != 0)
}

/// The k-th largest non-NaN value (`-inf` when there are fewer than k).
///
/// On long rows the values are first narrowed to those at or above a pivot taken from a strided
/// sample, chosen so that the k largest are almost surely among them; the selection among them is
/// exact, and when there are fewer than k the whole row is selected from. `-inf` values are never
/// collected: a row a grammar masked is mostly `-inf`, and selecting among them all is slow.
#[inline(always)]
pub(crate) fn kth_largest(values: &[f32], k: usize, work: &mut Work) -> f32 {
    if k == 0 {
        return f32::NEG_INFINITY;
    }
    if k == 1 {
        return largest(values);
    }
    if let Some(floor) = sampled_floor(values, k, work) {
        collect_from(values, floor, work, |_| 0);
        if work.len() >= k {
            return kth_of(work, k);
        }
    }
    collect_from(values, f32::MIN, work, |_| 0);
    if k > work.len() {
        return f32::NEG_INFINITY;
    }
    kth_of(work, k)
}

/// A floor under the `k` largest values of a long row (`None` for a row shorter than 8,192, or a
/// `k` near its length): a value of a strided sample, at least `f32::MIN`. Twice the expected
/// share of the k largest, and a margin: the values at or above it are about `2k + 4 * step`,
/// fewer than k about once in a thousand rows for small k.
pub(crate) fn sampled_floor(values: &[f32], k: usize, work: &mut Work) -> Option<f32> {
    const SAMPLE: usize = 1024;
    let n = values.len();
    if n < 8 * SAMPLE {
        return None;
    }
    work.clear();
    let step = n / SAMPLE;
    work.extend(
        values
            .iter()
            .step_by(step)
            .filter(|x| !x.is_nan())
            .map(|&x| (order_key(x), 0, x)),
    );
    let rank = 2 * k * work.len() / n + 4;
    if rank >= work.len() {
        return None;
    }
    let at = work.len() - rank;
    Some(
        work.select_nth_unstable_by_key(at, |e| e.0)
            .1
             .2
            .max(f32::MIN),
    )
}

/// The value with the k-th largest key in `work` (`1 <= k <= work.len()`).
pub(crate) fn kth_of(work: &mut Work, k: usize) -> f32 {
    let at = work.len() - k;
    work.select_nth_unstable_by_key(at, |e| e.0).1 .2
}

/// The band from `lo` up, lowered to the `min_keep`-th largest value (`max` itself for one).
#[inline(always)]
pub(crate) fn with_min_keep(
    values: &[f32],
    lo: f32,
    max: f32,
    min_keep: usize,
    work: &mut Work,
) -> Band {
    Band {
        lo: lo.min(match min_keep {
            1 => max,
            _ => kth_largest(values, min_keep, work),
        }),
        hi: f32::INFINITY,
    }
}

/// The first bucket where the running mass reaches `target`, and the mass before it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn reaching_bucket(masses: &[u64], target: f64) -> Option<(usize, u64)> {
    let mut above = 0u64;
    for (bucket, &mass) in masses.iter().enumerate() {
        if (above + mass) as f64 >= target {
            return Some((bucket, above));
        }
        above += mass;
    }
    None
}

/// The entry `v` of `work` whose mass of larger keys (plus `above`, the mass of values outside
/// `work` above all of it) is below `target` and whose mass of keys at or above it reaches
/// `target` (the running sum in key order, largest first, first reaches the target at `v`; its
/// key is unique, whatever the order of ties). `above` and `work`'s whole mass must reach it.
/// Quickselect by weight: expected linear time.
pub(crate) fn weighted_select(
    work: &mut [(u32, u64, f32)],
    above: u64,
    target: f64,
) -> (u32, u64, f32) {
    let mut part = work;
    // The mass of the values larger than every key in `part`.
    let mut above = above;
    loop {
        if part.len() <= 32 {
            part.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
            let mut sum = above;
            for e in part.iter() {
                sum += e.1;
                if sum as f64 >= target {
                    return *e;
                }
            }
            unreachable!("the mass reaches the target");
        }
        // Median of three keys as the pivot.
        let (a, b, c) = (part[0].0, part[part.len() / 2].0, part[part.len() - 1].0);
        let pivot = a.max(b).min(a.min(b).max(c));
        // Three-way partition: larger keys first, then the pivot's ties, then smaller ones.
        let mut larger = 0;
        let mut end = part.len();
        let mut i = 0;
        while i < end {
            if part[i].0 > pivot {
                part.swap(i, larger);
                larger += 1;
                i += 1;
            } else if part[i].0 < pivot {
                end -= 1;
                part.swap(i, end);
            } else {
                i += 1;
            }
        }
        let mass_larger = above + part[..larger].iter().map(|e| e.1).sum::<u64>();
        if mass_larger as f64 >= target {
            part = &mut part[..larger];
            continue;
        }
        let mass_tied = mass_larger + part[larger..end].iter().map(|e| e.1).sum::<u64>();
        if mass_tied as f64 >= target {
            return part[larger];
        }
        above = mass_tied;
        part = &mut part[end..];
    }
}

/// The smallest value but `-inf` whose `q = exp(x - max)` reaches `threshold` (`+inf` when none
/// does). `q`
/// is monotone in `x`, so only the values within a margin of `max + ln(threshold)` need their
/// `q` computed: those above the margin all reach it, those below none does (the margin, 0.01
/// plus 8 units in the last place of `max`, is far wider than the error of `exp` and of the
/// subtraction). One pass: the smallest value above the margin, and the few inside it.
#[inline(always)]
pub(crate) fn lowest_reaching(values: &[f32], max: f32, threshold: f32, work: &mut Work) -> f32 {
    work.clear();
    let ln = (threshold as f64).ln();
    let margin = 0.01 + max.abs() as f64 * (1.0 / (1u64 << 20) as f64);
    // Near `exp`'s floor (-104, where its results are subnormal and coarse), and for a threshold
    // of 0 or NaN, every value is decided exactly.
    let exact_only = threshold.is_nan() || threshold <= 0.0 || ln - margin < (EXP_MIN + 1.0) as f64;
    // `-inf` is never a candidate (its q is 0, which reaches a threshold of 0).
    let lo = if exact_only {
        f32::MIN
    } else {
        (max as f64 + ln - margin) as f32
    };
    let hi = if exact_only {
        f32::INFINITY
    } else {
        (max as f64 + ln + margin) as f32
    };
    let mut sure = f32::INFINITY;
    #[cfg(target_arch = "x86_64")]
    let simd = crate::truncation::simd_available();
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    if simd {
        #[cfg(target_arch = "x86_64")]
        if let Some(smallest) =
            crate::truncation::smallest_above_and_between(values, lo, hi, usize::MAX, work)
        {
            sure = smallest;
        }
    } else {
        for &x in values {
            if x >= lo {
                if x >= hi {
                    sure = sure.min(x);
                } else {
                    work.push((0, 0, x));
                }
            }
        }
    }
    let mut lowest = sure;
    for &(_, _, x) in work.iter() {
        if x < lowest && exp(x - max) >= threshold {
            lowest = x;
        }
    }
    lowest
}

/// The ids of the `count` first values of `values` in torch's descending order (NaN first, then
/// by value, `-0.0` and `0.0` equal, a tie by the lower id), in that order: one pass with the
/// `count` best so far, most values rejected by one compare against the worst of them.
pub(crate) fn largest_first(values: &[f32], count: usize) -> Vec<u32> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // A larger key comes first: the value's order (NaN above everything), then the lower id.
    let key = |i: usize, x: f32| {
        let order = if x.is_nan() {
            u32::MAX
        } else {
            order_key(x + 0.0)
        };
        (order as u64) << 32 | (u32::MAX - i as u32) as u64
    };
    let mut best: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(count + 1);
    for (i, &x) in values.iter().enumerate() {
        if best.len() < count {
            best.push(Reverse(key(i, x)));
        } else if best.peek().is_some_and(|&Reverse(worst)| key(i, x) > worst) {
            best.pop();
            best.push(Reverse(key(i, x)));
        }
    }
    let mut keys: Vec<u64> = best.into_iter().map(|Reverse(k)| k).collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    keys.into_iter()
        .map(|k| u32::MAX - (k & u32::MAX as u64) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    /// The compare passes that append a span at a time collect every value they find, in row
    /// order, wherever it sits: both ends of a span, of a block and of a row not a whole number
    /// of blocks long.
    #[test]
    fn span_passes_collect_at_every_edge() {
        for len in [1usize, 16, 17, 1023, 1024, 1025, 3 * super::SPAN + 21] {
            let mut row = vec![-5.0f32; len];
            let marked: Vec<usize> = [0, 15, 16, 1023, 1024, 2047, 2048, len - 1]
                .into_iter()
                .filter(|&i| i < len)
                .collect();
            for &i in &marked {
                row[i] = i as f32 / 4096.0;
            }
            let want: Vec<f32> = {
                let mut v: Vec<usize> = marked.clone();
                v.dedup();
                v.into_iter().map(|i| row[i]).collect()
            };
            let found = |work: &super::Work| work.iter().map(|e| e.2).collect::<Vec<f32>>();
            let mut work = vec![];
            #[cfg(target_arch = "x86_64")]
            if crate::truncation::simd_available() {
                let smallest = crate::truncation::smallest_above_and_between(
                    &row,
                    0.0,
                    9.0,
                    usize::MAX,
                    &mut work,
                );
                assert_eq!(smallest, Some(f32::INFINITY), "len {len}");
                assert_eq!(found(&work), want, "len {len}");
            }
            if let Some(max) = super::max_and_near(&row, -1.0, usize::MAX, &mut work) {
                assert_eq!(max, want[want.len() - 1].max(row[0]), "len {len}");
                // A superset: values near the running maximum as it grew.
                let got = found(&work);
                assert!(want.iter().all(|x| got.contains(x)), "len {len}");
            }
        }
    }

    #[test]
    fn largest_first_is_a_sorts_prefix_nan_first_ties_by_id() {
        let mut state = 12345u32;
        for len in [0usize, 1, 5, 39, 40, 41, 500, 5000] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    match state >> 28 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        3 => 0.0,
                        _ => (state >> 20 & 63) as f32 / 4.0 - 8.0,
                    }
                })
                .collect();
            let mut sorted: Vec<u32> = (0..len as u32).collect();
            let rank = |x: f32| if x.is_nan() { f32::INFINITY } else { x + 0.0 };
            sorted.sort_by(|&a, &b| {
                let (x, y) = (row[a as usize], row[b as usize]);
                (y.is_nan().cmp(&x.is_nan()))
                    .then(rank(y).partial_cmp(&rank(x)).unwrap())
                    .then(a.cmp(&b))
            });
            for count in [0, 1, 40, len + 3] {
                let want = &sorted[..count.min(len)];
                assert_eq!(
                    super::largest_first(&row, count),
                    want,
                    "len {len} count {count}"
                );
            }
        }
    }

    use super::*;
    use crate::truncation::largest;

    #[test]
    fn the_lowest_reaching_value_is_the_exact_one_at_any_offset() {
        let mut seed = 17u64;
        for offset in [0.0f32, -50.0, 1e3, 1e5, 3e6] {
            for spread in [0.1f32, 3.0, 40.0, 200.0] {
                let row: Vec<f32> = (0..3000)
                    .map(|i| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        match i % 97 {
                            5 => f32::NAN,
                            6 => f32::NEG_INFINITY,
                            _ => {
                                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread + offset
                            }
                        }
                    })
                    .collect();
                let max = largest(&row);
                for threshold in [0.0f32, 1e-45, 1e-30, 1e-8, 1e-3, 0.1, 0.5, 1.0, 2.0] {
                    let exact = row
                        .iter()
                        .filter(|&&x| x > f32::NEG_INFINITY && exp(x - max) >= threshold)
                        .fold(f32::INFINITY, |m, &x| m.min(x));
                    let got = lowest_reaching(&row, max, threshold, &mut vec![]);
                    assert_eq!(
                        got.to_bits(),
                        exact.to_bits(),
                        "{offset} {spread} {threshold}"
                    );
                }
            }
        }
    }
}
