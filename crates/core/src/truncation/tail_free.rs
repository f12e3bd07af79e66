//! Tail-free sampling's row math: the largest values until the cumulative normalized second
//! derivative of the sorted probabilities passes `z`.

use crate::truncation::select::with_min_keep;
use crate::truncation::{exp, from_order_key, near_max, order_key, Band, Work};

/// The band tail-free keeps: the finite values sorted (by [`order_key`], largest first: a radix
/// sort of the keys), their `q = exp(x - max)` ([`exp`]) and every sum in f64 in that order.
/// Plain loops, not closures: they are compiled with the FMA of the band's caller.
#[inline(always)]
pub(crate) fn band(values: &[f32], z: f32, min_keep: usize, work: &mut Work) -> Band {
    if let Some(band) = from_the_top(values, z, min_keep, work) {
        return band;
    }
    if values.contains(&f32::INFINITY) {
        return Band::ALL;
    }
    // Taken out and put back, not borrowed in a closure, so the loops stay in this function.
    let Scratch {
        mut keys,
        mut other,
        mut p,
        near,
    } = SCRATCH.take();
    // `!order_key`: ascending keys are descending values.
    keys.clear();
    for &x in values {
        if x.is_finite() {
            keys.push(!order_key(x));
        }
    }
    let n = keys.len();
    let cut = if n <= 1 {
        None
    } else {
        radix_sort(&mut keys, &mut other);
        let max = from_order_key(!keys[0]);
        p.clear();
        for &key in &keys {
            p.push(exp(from_order_key(!key) - max) as f64);
        }
        let mut total = 0f64;
        for &v in &p {
            total += v;
        }
        // Each probability divided once (the same quotients as dividing at each use).
        for v in p.iter_mut() {
            *v /= total;
        }
        let mut d2_total = 0f64;
        for w in p.windows(3) {
            d2_total += (w[0] - 2.0 * w[1] + w[2]).abs();
        }
        // Kept: the first, and one more for each cumulative share of d2 at most z (a NaN share,
        // when every d2 is 0, removes nothing but the last, as in the webui).
        let mut kept = 1;
        let mut cumulative = 0.0;
        for w in p.windows(3) {
            cumulative += (w[0] - 2.0 * w[1] + w[2]).abs() / d2_total;
            if cumulative > z as f64 {
                break;
            }
            kept += 1;
        }
        Some((from_order_key(!keys[kept.min(n) - 1]), max))
    };
    SCRATCH.set(Scratch {
        keys,
        other,
        p,
        near,
    });
    match cut {
        Some((lo, max)) => with_min_keep(values, lo, max, min_keep, work),
        None => Band::ALL,
    }
}

/// How far below the maximum [`from_the_top`] sorts: `e^-40` is below half a unit in the last
/// place of 1, the least the total can be.
const TOP_BELOW: f32 = 40.0;

/// The band of [`band`] from the values within [`TOP_BELOW`] of the maximum and the two largest
/// below them, when the rest cannot change a bit of it (a model's row: most of it lies further
/// below; a flat row is `None`). In the order the sums run (largest first), every later term of
/// the total `sum q` is below half a unit in the last place of the sum so far, and every later
/// second difference `|p_i - 2 p_(i+1) + p_(i+2)|` (at most `4 p_i`) below half a unit of the d2
/// sum: adding them changes nothing. `None` (nothing decided) when that does not hold, when the
/// walk of the cumulative share passes the values sorted, for a row whose values near its maximum
/// are more than a third of it ([`near_max`]), or with fewer than two values just below them.
#[inline(always)]
fn from_the_top(values: &[f32], z: f32, min_keep: usize, work: &mut Work) -> Option<Band> {
    let Scratch {
        mut keys,
        mut other,
        mut p,
        mut near,
    } = SCRATCH.take();
    let found = near_max(
        values,
        -(TOP_BELOW + 1.0),
        values.len() / 3,
        work,
        &mut near,
    );
    // Every value from `max - 41` up (an upper set of the row), then the two below `edge`.
    keys.clear();
    let max = match found {
        Ok(max) if max.is_finite() && max.abs() < 1e5 => {
            let floor = max - (TOP_BELOW + 1.0);
            keys.extend(near.iter().filter(|&&x| x >= floor).map(|&x| !order_key(x)));
            max
        }
        _ => f32::NAN,
    };
    let edge = max - TOP_BELOW;
    radix_sort(&mut keys, &mut other);
    let top = keys.partition_point(|&key| from_order_key(!key) >= edge);
    let band = (!max.is_nan() && keys.len() >= top + 2).then(|| {
        let max = from_order_key(!keys[0]);
        p.clear();
        for &key in &keys[..top + 2] {
            p.push(exp(from_order_key(!key) - max) as f64);
        }
        let mut total = 0f64;
        for &v in &p[..top] {
            total += v;
        }
        // The terms after the top: the first bounds the rest.
        let half_unit = |sum: f64| (f64::from_bits(sum.to_bits() + 1) - sum) / 2.0;
        if p[top] >= half_unit(total) {
            return None;
        }
        for v in p.iter_mut() {
            *v /= total;
        }
        let mut d2_total = 0f64;
        for w in p.windows(3) {
            d2_total += (w[0] - 2.0 * w[1] + w[2]).abs();
        }
        // A margin of 2 on `4 p_i` for the rounding of the differences.
        if 8.0 * p[top] >= half_unit(d2_total) {
            return None;
        }
        let mut cumulative = 0.0;
        for (kept, w) in (1..).zip(p.windows(3)) {
            cumulative += (w[0] - 2.0 * w[1] + w[2]).abs() / d2_total;
            if cumulative > z as f64 {
                let lo = from_order_key(!keys[kept - 1]);
                return Some(with_min_keep(values, lo, max, min_keep, work));
            }
        }
        // The walk goes on past the values sorted here.
        None
    });
    SCRATCH.set(Scratch {
        keys,
        other,
        p,
        near,
    });
    match found {
        Ok(f32::INFINITY) => Some(Band::ALL),
        _ => band.flatten(),
    }
}

/// The sort's keys and its other buffer, and the probabilities, kept between the calls of a
/// thread: allocated (and faulted in) afresh at each step, a vocab's worth (2.4 MB at 151,936
/// values) cost a quarter of the step. They hold at most the longest row the thread has cut.
#[derive(Default)]
struct Scratch {
    keys: Vec<u32>,
    other: Vec<u32>,
    p: Vec<f64>,
    near: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Sorts `keys` ascending: least significant digit first, 11 bits a pass (`other` the pass's
/// destination).
fn radix_sort(keys: &mut Vec<u32>, other: &mut Vec<u32>) {
    const BITS: u32 = 11;
    other.clear();
    other.resize(keys.len(), 0);
    for pass in 0..3 {
        let shift = pass * BITS;
        let digit = |k: u32| ((k >> shift) & ((1 << BITS) - 1)) as usize;
        let mut starts = [0usize; 1 << BITS];
        for &k in keys.iter() {
            starts[digit(k)] += 1;
        }
        let mut at = 0;
        for start in starts.iter_mut() {
            let count = *start;
            *start = at;
            at += count;
        }
        for &k in keys.iter() {
            let slot = &mut starts[digit(k)];
            other[*slot] = k;
            *slot += 1;
        }
        std::mem::swap(keys, other);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// text-generation-webui's `TailFreeLogitsWarper` over the finite values, in f64.
    fn webui(values: &[f32], z: f64, min_keep: usize) -> Vec<bool> {
        let mut order: Vec<usize> = (0..values.len())
            .filter(|&i| values[i].is_finite())
            .collect();
        order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
        let max = values[order[0]] as f64;
        let q: Vec<f64> = order
            .iter()
            .map(|&i| (values[i] as f64 - max).exp())
            .collect();
        let s: f64 = q.iter().sum();
        let p: Vec<f64> = q.iter().map(|q| q / s).collect();
        let d1: Vec<f64> = p.windows(2).map(|w| w[1] - w[0]).collect();
        let d2: Vec<f64> = d1.windows(2).map(|w| (w[1] - w[0]).abs()).collect();
        let t: f64 = d2.iter().sum();
        let mut cdf = 0.0;
        let mut remove = vec![false];
        for d in &d2 {
            cdf += d / t;
            remove.push(cdf > z);
        }
        remove.push(true);
        for r in remove.iter_mut().take(min_keep) {
            *r = false;
        }
        let mut keep = vec![false; values.len()];
        for (rank, &i) in order.iter().enumerate() {
            keep[i] = !remove[rank];
        }
        keep
    }

    /// The band as first written: the entries sorted by a comparison sort, `q` and the sums in
    /// that order.
    fn by_comparison_sort(values: &[f32], z: f32, min_keep: usize) -> Band {
        let mut work: Vec<(u32, f32)> = values
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| (order_key(x), x))
            .collect();
        let n = work.len();
        if n <= 1 || values.contains(&f32::INFINITY) {
            return Band::ALL;
        }
        work.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        let max = work[0].1;
        let q: Vec<f64> = work.iter().map(|e| exp(e.1 - max) as f64).collect();
        let total: f64 = q.iter().sum();
        let p = |i: usize| q[i] / total;
        let d2: Vec<f64> = (0..n.saturating_sub(2))
            .map(|i| (p(i) - 2.0 * p(i + 1) + p(i + 2)).abs())
            .collect();
        let d2_total: f64 = d2.iter().sum();
        let mut kept = 1;
        let mut cumulative = 0.0;
        for &d in &d2 {
            cumulative += d / d2_total;
            if cumulative > z as f64 {
                break;
            }
            kept += 1;
        }
        let lo = work[kept.min(n) - 1].1;
        with_min_keep(values, lo, max, min_keep, &mut vec![])
    }

    #[test]
    fn the_radix_sorted_band_is_the_comparison_sorted_one() {
        let mut seed = 9u64;
        for len in [2usize, 3, 50, 4_000, 40_000] {
            for shape in 0..4 {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let u = (seed >> 40) as f32 / (1u64 << 24) as f32;
                        match (i % 41, shape) {
                            (3, _) => f32::NEG_INFINITY,
                            (4, _) => f32::NAN,
                            (5, _) => -0.0,
                            (6, _) => 0.0,
                            (_, 0) => u * 8.0 - 4.0,
                            (_, 1) => ((u * 16.0).round() - 8.0) * 0.5,
                            (_, 2) => half::f16::from_f32(u * 30.0 - 20.0).to_f32(),
                            _ => 30_000.0 + (u * 9.0).round() * 0.25,
                        }
                    })
                    .collect();
                for z in [0.0f32, 0.5, 0.95, 1.0] {
                    for min_keep in [1usize, 3] {
                        let fast = band(&row, z, min_keep, &mut vec![]);
                        let slow = by_comparison_sort(&row, z, min_keep);
                        assert_eq!(fast.lo.to_bits(), slow.lo.to_bits(), "{len} {shape} {z}");
                    }
                }
            }
        }
    }

    /// On rows of a model's shape (a normal tail of deviation 16, a Zipf shape; ties, NaN and
    /// `-inf` among them) the band sorted from the top alone is the whole sort's, bit for bit.
    #[test]
    fn the_band_from_the_top_is_the_whole_sorts() {
        let mut seed = 13u64;
        let mut uniform = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut taken = 0;
        for shape in 0..3 {
            let row: Vec<f32> = (0..30_000)
                .map(|i| {
                    let normal = (0..4).map(|_| uniform()).sum::<f32>() * 1.732 - 3.464;
                    match (i % 97, shape) {
                        (3, _) => f32::NEG_INFINITY,
                        (4, _) => f32::NAN,
                        (_, 0) => normal * 16.0,
                        (_, 1) => (normal * 64.0).round() / 4.0,
                        _ => 3.0 * (-1.1 * ((i + 1) as f32).ln() + 0.5 * normal) + 7.0,
                    }
                })
                .collect();
            for z in [0.0f32, 0.5, 0.95, 0.999, 1.0] {
                for min_keep in [1usize, 3] {
                    let top = from_the_top(&row, z, min_keep, &mut vec![]);
                    taken += top.is_some() as usize;
                    let slow = by_comparison_sort(&row, z, min_keep);
                    let fast = band(&row, z, min_keep, &mut vec![]);
                    assert_eq!(fast.lo.to_bits(), slow.lo.to_bits(), "{shape} {z}");
                    if let Some(top) = top {
                        assert_eq!(top.lo.to_bits(), slow.lo.to_bits(), "{shape} {z}");
                    }
                }
            }
        }
        // Every z but 0.999 and 1, whose walk passes the values sorted (the values near the
        // maximum are collected with AVX2 and FMA).
        let expected = if crate::cpu::avx2_fma() { 18 } else { 0 };
        assert_eq!(taken, expected, "the top alone decided {taken} of 30");
    }

    #[test]
    fn equals_text_generation_webui_on_distinct_values() {
        let mut seed = 5u64;
        for len in [3usize, 4, 10, 500] {
            for z in [0.0f64, 0.3, 0.9, 0.99] {
                for min_keep in [1usize, 2] {
                    let row: Vec<f32> = (0..len)
                        .map(|i| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            if i % 7 == 6 {
                                return f32::NEG_INFINITY;
                            }
                            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 12.0 - 6.0
                        })
                        .collect();
                    let b = band(&row, z as f32, min_keep, &mut vec![]);
                    let kept: Vec<bool> = row
                        .iter()
                        .map(|&x| x.is_finite() && !b.removes(x))
                        .collect();
                    assert_eq!(kept, webui(&row, z, min_keep), "len {len} z {z}");
                }
            }
        }
    }
}
