//! Locally typical sampling's row math: the values whose information content is closest to the
//! entropy, until their mass reaches `mass`.

#[cfg(target_arch = "x86_64")]
use crate::truncation::select::weighted_select;
#[cfg(target_arch = "x86_64")]
use crate::truncation::simd;
use crate::truncation::{heavy, heavy_below, largest, order_key, weigh, Band, Softmax, Work};

/// The band typical keeps: from the values that weigh anything when they are few
/// ([`from_heavy`]), else with the passes of `truncation/simd.rs` for `min_keep` 1 where the CPU
/// has them ([`band_wide`]), otherwise by partial sorts of the scores ([`by_sorting`]).
#[inline(always)]
pub(crate) fn band(values: &[f32], mass: f32, min_keep: usize, work: &mut Work) -> Band {
    let max = match from_heavy(values, mass, min_keep, work) {
        Ok(band) => return band,
        Err(max) => max.unwrap_or_else(|| largest(values)),
    };
    if !max.is_finite() {
        // No distribution (as `Softmax::is_defined`).
        return Band::ALL;
    }
    #[cfg(target_arch = "x86_64")]
    if min_keep == 1 && simd::available() && values.len() < 1 << 21 {
        let (sum, entropy_sum) = simd::sums(values, max, true);
        let softmax = Softmax {
            max,
            sum,
            entropy_sum,
        };
        return band_wide(values, softmax, mass, work);
    }
    by_sorting(values, &Softmax::of(values), mass, min_keep, work)
}

/// Typical's band from the values that weigh anything, when they are few ([`heavy`]) and no value
/// below them can have a score within the band's: the selection is [`band_wide`]'s (or
/// [`by_sorting`]'s) over them (their mass is the row's). A value below them has `x - max` at most
/// the edge's, so while the edge's `d + E / W` is negative its score is at least the edge's;
/// the band's largest score is at one of its ends (the score is convex in the value). As `E / W`
/// is a mean of `-d` over the values that weigh anything, nearly all within 33 of the maximum and
/// most of the mass within a few units of it, the check holds on every row seen: it guards the
/// argument.
fn from_heavy(
    values: &[f32],
    mass: f32,
    min_keep: usize,
    work: &mut Work,
) -> Result<Band, Option<f32>> {
    heavy(values, true, work, |near, softmax, work| {
        if min_keep > near.len() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        let band = if min_keep == 1 && simd::available() {
            band_wide(near, softmax, mass, work)
        } else {
            by_sorting(near, &softmax, mass, min_keep, work)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let band = by_sorting(near, &softmax, mass, min_keep, work);
        let shift = softmax.shift();
        let score = |x: f32| softmax.typical_score(x, shift);
        let edge = softmax.max - heavy_below(true);
        let below_edge = (edge - softmax.max) + shift < 0.0;
        (band != Band::ALL && below_edge && score(edge) > score(band.lo).max(score(band.hi)))
            .then_some(band)
    })
}

/// Typical's band with the passes of `truncation/simd.rs` (`min_keep` 1): the sums `W` and `E` in one pass, then
/// the mass of each bucket of scores (1/16 wide) in another; the boundary is selected among the
/// values of the bucket where the running mass, smallest scores first, reaches the target.
#[cfg(target_arch = "x86_64")]
fn band_wide(values: &[f32], softmax: Softmax, mass: f32, work: &mut Work) -> Band {
    let max = softmax.max;
    let key = simd::Key::Typical {
        shift: softmax.shift(),
    };
    let target = softmax.target(mass);
    let (_, reached) = simd::reaching_bucket(values, max, key, mass, |_| target, work);
    let Some((bucket, above)) = reached else {
        return Band::ALL;
    };
    let (lo, hi) = simd::collect_bucket(values, max, key, bucket, work);
    simd::fill_weights(work, max);
    // Keys are the bitwise-not of the scores' order keys: the largest key is the smallest score.
    let cut = weighted_select(work, above, target).0;
    let (lo, hi) = work
        .iter()
        .filter(|e| e.0 >= cut)
        .fold((lo, hi), |(lo, hi), e| (lo.min(e.2), hi.max(e.2)));
    Band { lo, hi }
}

/// Orders `work` so that its first `m` entries are the `m` smallest keys, sorted; returns how
/// many are sorted (`m`, or all of them).
fn smallest_sorted(work: &mut [(u32, u64, f32)], m: usize) -> usize {
    let m = m.min(work.len());
    if m < work.len() {
        work.select_nth_unstable_by_key(m, |e| e.0);
    }
    work[..m].sort_unstable_by_key(|e| e.0);
    m
}

/// Candidate counts tried in turn before a whole-row sort: most rows put their mass on a few
/// hundred tokens.
const CANDIDATES: [usize; 3] = [256, 4096, 32768];

/// The first entry, in key order, where the running sum of weights reaches `target`, and how many
/// entries are sorted: `None` when the sorted entries do not reach it.
fn first_reaching(work: &mut [(u32, u64, f32)], target: f64, at_least: usize) -> Option<usize> {
    let total = work.len();
    for m in CANDIDATES.into_iter().chain([total]) {
        let sorted = smallest_sorted(work, m.max(at_least));
        let mut sum = 0u64;
        for (rank, &(_, w, _)) in work[..sorted].iter().enumerate() {
            sum += w;
            if sum as f64 >= target {
                return Some(rank);
            }
        }
        if sorted == total {
            break;
        }
    }
    None
}

/// transformers keeps the tokens up to and including the first whose cumulative mass, in order of
/// score, reaches `mass`, at least `min_keep` of them, and (here) every token of a smaller or
/// equal score.
#[inline(always)]
pub(super) fn by_sorting(
    values: &[f32],
    softmax: &Softmax,
    mass: f32,
    min_keep: usize,
    work: &mut Work,
) -> Band {
    let shift = softmax.shift();
    work.clear();
    for &x in values {
        if !x.is_nan() && x != f32::NEG_INFINITY {
            work.push((order_key(softmax.typical_score(x, shift)), 0, x));
        }
    }
    weigh(work, softmax.max);
    let total = work.len();
    if total == 0 {
        return Band::ALL;
    }
    let keep = min_keep.min(total);
    let Some(last) = first_reaching(work, softmax.target(mass), keep) else {
        return Band::ALL;
    };
    // `first_reaching` sorted at least `keep` entries.
    let cut = work[last].0.max(work[keep - 1].0);
    let (lo, hi) = work
        .iter()
        .filter(|e| e.0 <= cut)
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), e| {
            (lo.min(e.2), hi.max(e.2))
        });
    Band { lo, hi }
}
