//! Top-p's row math: the smallest set of largest values whose probability mass reaches `p`.

use crate::truncation::select::{collect_from, weighted_select, with_min_keep};
#[cfg(target_arch = "x86_64")]
use crate::truncation::simd;
use crate::truncation::{heavy, largest, order_key, weigh, Band, Softmax, Work};

/// The band top-p keeps: from the lowest value its mass needs, at least `min_keep` values;
/// everything when the row has no distribution or its mass never reaches `p`. The boundary is
/// selected among the values that weigh anything when they are few ([`heavy`]: one pass), else
/// as [`lowest`] selects it.
#[inline(always)]
pub(crate) fn band(values: &[f32], p: f32, min_keep: usize, work: &mut Work) -> Band {
    let near = heavy(values, false, work, |near, softmax, work| {
        // Every value that weighs anything is among them: their mass is the row's.
        work.clear();
        work.extend(near.iter().map(|&x| (order_key(x), 0, x)));
        weigh(work, softmax.max);
        Some((weighted_select(work, 0, softmax.target(p)).2, softmax.max))
    });
    let max = match near {
        Ok((lo, max)) => return with_min_keep(values, lo, max, min_keep, work),
        Err(max) => max.unwrap_or_else(|| largest(values)),
    };
    if !max.is_finite() {
        // No distribution (as `Softmax::is_defined`).
        return Band::ALL;
    }
    match lowest(values, max, p, work) {
        Some(lo) => with_min_keep(values, lo, max, min_keep, work),
        None => Band::ALL,
    }
}

/// Top-p's lowest kept value before `min_keep`: the largest value where the mass of the values
/// at or above it reaches `p`.
///
/// The total `W` takes one pass of [`exp`](super::exp) over the row
/// ([`weight_sum`](super::weight_sum)); the boundary is then selected among the values within a
/// few units of the maximum, where nearly all of the mass of most rows is (the whole row when
/// they do not reach the target).
#[inline(always)]
fn lowest(values: &[f32], max: f32, p: f32, work: &mut Work) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if simd::available() && values.len() < 1 << 21 {
        return lowest_simd(values, max, p, work);
    }
    let softmax = Softmax::weights_only(values, max);
    let target = softmax.target(p);
    for below_max in [4.0f32, 8.0, 16.0, f32::INFINITY] {
        // A floor on the values: the candidates are an upper set of the row (every value above
        // one is one), so their running mass in key order is the row's.
        collect_from(values, max - below_max, work, |x| softmax.weights(x).0);
        let mass: u64 = work.iter().map(|e| e.1).sum();
        if mass as f64 >= target {
            return Some(weighted_select(work, 0, target).2);
        }
    }
    None
}

/// [`lowest`] with the passes of `truncation/simd.rs`. A row with few values within 4 of its maximum (a trained
/// model's) selects among them once the total is known, as [`lowest`] does; otherwise one pass
/// computes the total and the mass of each bucket of 1/32 below the maximum (in the window a
/// sample suggests: [`simd::reaching_bucket`]), and the boundary is selected among the values of
/// the bucket where the running mass reaches the target (a flat row's: the buckets above it hold
/// most of the mass, and most of the row is never collected).
#[cfg(target_arch = "x86_64")]
fn lowest_simd(values: &[f32], max: f32, p: f32, work: &mut Work) -> Option<f32> {
    if simd::smallest_above_and_between(values, max - 4.0, f32::INFINITY, 4096, work).is_some() {
        keyed(work);
        simd::fill_weights(work, max);
        let softmax = Softmax::weights_only(values, max);
        let target = softmax.target(p);
        let mass: u64 = work.iter().map(|e| e.1).sum();
        if mass as f64 >= target {
            return Some(weighted_select(work, 0, target).2);
        }
    }
    let target = |sum| {
        let softmax = Softmax {
            max,
            sum,
            entropy_sum: 0,
        };
        softmax.target(p)
    };
    let (sum, reached) = simd::reaching_bucket(values, max, simd::Key::Value, p, target, work);
    let (bucket, above) = reached?;
    let target = target(sum);
    simd::collect_bucket(values, max, simd::Key::Value, bucket, work);
    simd::fill_weights(work, max);
    Some(weighted_select(work, above, target).2)
}

/// Sets each entry's key to its value's [`order_key`].
#[cfg(target_arch = "x86_64")]
fn keyed(work: &mut Work) {
    for e in work.iter_mut() {
        e.0 = order_key(e.2);
    }
}
