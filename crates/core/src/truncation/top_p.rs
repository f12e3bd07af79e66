//! Top-p's row math: the smallest set of largest values whose probability mass reaches `p`.

#[cfg(target_arch = "x86_64")]
use crate::truncation::select::reaching_bucket;
use crate::truncation::select::{collect_from, weighted_select, with_min_keep};
use crate::truncation::{largest, Band, Softmax, Work};
#[cfg(target_arch = "x86_64")]
use crate::truncation::{order_key, simd};

/// The band top-p keeps: from the lowest value its mass needs ([`lowest`]), at least `min_keep`
/// values; everything when the row has no distribution or its mass never reaches `p`.
#[inline(always)]
pub(crate) fn band(values: &[f32], p: f32, min_keep: usize, work: &mut Work) -> Band {
    let max = largest(values);
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
        return lowest_simd(values, max, p, work, true);
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

/// [`lowest`] with the passes of `truncation/simd.rs`. A row with few values within 4 of its
/// maximum (a trained model's) selects among them once the total is known, as [`lowest`] does.
/// Otherwise the boundary is selected among the values of the buckets of 1/32 below the maximum
/// where the running mass reaches the target (a flat row's: the buckets above it hold most of
/// the mass, and most of the row is never collected): those a sample of the row points to, which
/// one pass weighs and collects (when `sample`); where they miss, the bucket the row's histogram
/// finds.
#[cfg(target_arch = "x86_64")]
fn lowest_simd(values: &[f32], max: f32, p: f32, work: &mut Work, sample: bool) -> Option<f32> {
    // `work` holds, when `top`, every value within 4 of the maximum, weighed.
    let top = simd::top_values(values, max, work);
    if top {
        keyed(work);
        let softmax = Softmax::weights_only(values, max);
        let target = softmax.target(p);
        let mass: u64 = work.iter().map(|e| e.1).sum();
        if mass as f64 >= target {
            return Some(weighted_select(work, 0, target).2);
        }
    }
    let key = simd::Key::Value;
    if let Some((above, target)) = sample.then(|| sampled(values, max, p, top, work)).flatten() {
        return Some(weighted_select(work, above, target).2);
    }
    let mut masses = [0u64; simd::BUCKETS];
    let softmax = Softmax {
        max,
        sum: simd::bucket_masses(values, max, key, &mut masses),
        entropy_sum: 0,
    };
    let target = softmax.target(p);
    let (bucket, above) = reaching_bucket(&masses, target)?;
    simd::collect_buckets::<false>(values, max, key, (bucket, bucket), usize::MAX, work);
    simd::fill_weights(work, max);
    Some(weighted_select(work, above, target).2)
}

/// The candidates of the buckets a sample of the row points to, collected into `work` and
/// weighed, with the mass above them and the target, when the running mass reaches the target
/// among them. `top`: `work` holds every value within 4 of the maximum, weighed.
#[cfg(target_arch = "x86_64")]
fn sampled(values: &[f32], max: f32, p: f32, top: bool, work: &mut Work) -> Option<(u64, f64)> {
    let key = simd::Key::Value;
    let buckets = simd::likely_buckets(values, max, key, p as f64, top.then_some(&*work))?;
    let found = simd::collect_buckets::<true>(values, max, key, buckets, values.len() / 4, work)?;
    let total = Softmax {
        max,
        sum: found.total,
        entropy_sum: 0,
    };
    let target = total.target(p);
    simd::reached_in(work, max, found.above, target).then_some((found.above, target))
}

/// Sets each entry's key to its value's [`order_key`].
#[cfg(target_arch = "x86_64")]
fn keyed(work: &mut Work) {
    for e in work.iter_mut() {
        e.0 = order_key(e.2);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) mod tests {
    use super::*;

    /// Rows of a vocab's size and of the smallest sampled size, whose mass is spread (the
    /// sampled window's case): normal, wider, uniform, few distinct values; some with `-inf`
    /// and NaN among them.
    pub(crate) fn spread_rows() -> Vec<Vec<f32>> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut rows = vec![];
        for len in [151_936usize, 16_384] {
            for shape in 0..5 {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        let u = next();
                        let normal = (-2.0 * next().max(1e-12).ln()).sqrt()
                            * (std::f32::consts::TAU * u).cos();
                        match (shape, i % 101) {
                            (4, 0) => f32::NEG_INFINITY,
                            (4, 1) => f32::NAN,
                            (0 | 4, _) => normal,
                            (1, _) => normal * 3.0,
                            (2, _) => u * 8.0,
                            _ => (u * 6.0).floor() * 0.5,
                        }
                    })
                    .collect();
                rows.push(row);
            }
        }
        rows
    }

    #[test]
    fn the_sampled_window_finds_the_boundary_the_histogram_does() {
        if !simd::available() {
            eprintln!("skipped: no AVX2 and FMA on this CPU");
            return;
        }
        let mut work = vec![];
        let (mut cases, mut hits) = (0, 0);
        for row in spread_rows() {
            let max = largest(&row);
            for p in [0.01f32, 0.3, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
                let with_sample = lowest_simd(&row, max, p, &mut work, true).map(f32::to_bits);
                let histogram = lowest_simd(&row, max, p, &mut work, false).map(f32::to_bits);
                assert_eq!(with_sample, histogram, "{} values, p {p}", row.len());
                // How often the window holds the boundary, on rows of a vocab's size at the
                // values of p people use (a miss costs a pass, never a wrong band).
                if row.len() == 151_936 && (0.5..=0.95).contains(&p) {
                    let top = simd::top_values(&row, max, &mut work);
                    cases += 1;
                    hits += usize::from(sampled(&row, max, p, top, &mut work).is_some());
                }
            }
        }
        assert!(hits * 5 >= cases * 4, "{hits} of {cases}");
    }
}
