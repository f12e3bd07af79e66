//! Min-p's row math: the values whose probability is at least `p` times the largest, decided by
//! comparison away from `max + ln p`.

use crate::truncation::select::{max_and_near, with_min_keep};
use crate::truncation::{exp, largest, Band, Work};

/// The band min-p keeps: the row's maximum and the lowest kept value in one pass where AVX2
/// allows ([`one_pass`]), otherwise in two ([`lowest`]); then at least `min_keep` values.
#[inline(always)]
pub(crate) fn band(values: &[f32], p: f32, min_keep: usize, work: &mut Work) -> Band {
    if let Some((max, lo)) = one_pass(values, p, work) {
        return with_min_keep(values, lo, max, min_keep, work);
    }
    let max = largest(values);
    if !max.is_finite() {
        // No distribution (as `Softmax::is_defined`).
        return Band::ALL;
    }
    with_min_keep(values, lowest(values, max, p), max, min_keep, work)
}

/// Values visited together by the vectorizable loops: two AVX2 vectors.
const LANES: usize = 16;

/// min-p's bounds: every value above the first is kept, every value below the second removed.
#[inline(always)]
fn min_p_bounds(max: f32, p: f32) -> (f32, f32) {
    let ln_p = (p as f64).ln() as f32;
    let margin = 0.01 + max.abs() * (4.0 * f32::EPSILON);
    let above = if p >= 1e-30 {
        max + (ln_p + margin)
    } else {
        f32::INFINITY
    };
    (above, max + (ln_p - margin))
}

/// min-p's lowest kept value before `min_keep`: the smallest `x` with `q(x) >= p`.
///
/// `q(x) = exp(x - max)` is within one unit in the last place of `e^(x - max)` (the [`exp`]
/// test), so away from `max + ln p` the comparison is decided by `x` alone: above
/// `max + ln p + margin` it holds, below `max + ln p - margin` it does not (the margin, 0.01 and
/// the rounding of `max + ln p`, is far more than a relative error of one unit can bridge). One
/// pass finds the smallest value above the lower bound; only when that is within the margin does
/// a second pass compute `q`, for the values within it. Thresholds whose `q` would be subnormal (where one unit is
/// not a small relative error) compute every `q` from the lower bound up.
#[inline(always)]
fn lowest(values: &[f32], max: f32, p: f32) -> f32 {
    let (above, floor) = min_p_bounds(max, p);
    let smaller = |m: f32, x: f32| if x >= floor && x < m { x } else { m };
    let blocks = values.chunks_exact(LANES);
    let mut lo = blocks
        .remainder()
        .iter()
        .fold(f32::INFINITY, |m, &x| smaller(m, x));
    let mut lanes = [f32::INFINITY; LANES];
    for block in blocks {
        for (m, &x) in lanes.iter_mut().zip(block) {
            *m = smaller(*m, x);
        }
    }
    lo = lanes.into_iter().fold(lo, f32::min);
    if lo > above {
        return lo;
    }
    // Values above the margin by comparison, blocks with one within it value by value.
    let within = |m: f32, x: f32| {
        if x >= floor && x <= above && exp(x - max) >= p {
            m.min(x)
        } else {
            m
        }
    };
    let blocks = values.chunks_exact(LANES);
    let mut lo = blocks.remainder().iter().fold(f32::INFINITY, |m, &x| {
        if x > above {
            m.min(x)
        } else {
            within(m, x)
        }
    });
    let mut lanes = [f32::INFINITY; LANES];
    for block in blocks {
        let mut near = false;
        for (m, &x) in lanes.iter_mut().zip(block) {
            let kept = if x > above { x } else { f32::INFINITY };
            *m = if kept < *m { kept } else { *m };
            near |= (x >= floor) & (x <= above);
        }
        if near {
            lo = block.iter().fold(lo, |m, &x| within(m, x));
        }
    }
    lanes.into_iter().fold(lo, f32::min)
}

/// The row's maximum and [`lowest`]'s value in one pass where AVX2 allows: the values within
/// `1 - ln p` of the running maximum are collected (a superset of those min-p can keep, since the
/// maximum only grows), then decided as [`lowest`] decides them. `None` (the caller takes two
/// passes) without AVX2, for a row without a finite maximum, a maximum beyond `1e5` (where the
/// margin is no longer small against the rounding), `p < 1e-30`, or more than 4,096 candidates.
#[inline(always)]
fn one_pass(values: &[f32], p: f32, work: &mut Work) -> Option<(f32, f32)> {
    #[cfg(target_arch = "x86_64")]
    if p >= 1e-30 && crate::cpu::avx2() {
        let ln_p = (p as f64).ln() as f32;
        let max = max_and_near(values, ln_p - 1.0, 4096, work)?;
        // The sign of a zero maximum, as `largest` decides it.
        let max = if max == 0.0 { largest(values) } else { max };
        if !(max.is_finite() && max.abs() < 1e5) {
            return None;
        }
        let (above, floor) = min_p_bounds(max, p);
        let lo = work
            .iter()
            .map(|e| e.2)
            .filter(|&x| x > above || (x >= floor && exp(x - max) >= p))
            .fold(f32::INFINITY, f32::min);
        return Some((max, lo));
    }
    let _ = (values, p, work);
    None
}
