//! Truncation rules: keep the most likely tokens of a row, set the others to `-inf`.
//!
//! Each rule needs a reduction over the row (a maximum, a softmax sum, an entropy, a k-th largest
//! value) before it can say which tokens go. The tokens a rule keeps always form one interval of
//! values (for top-k, top-p, min-p, epsilon and eta: every value from some threshold up; for
//! typical: a band around the entropy), so a rule resolves to a [`Band`], and applying it is an
//! element-wise compare in the row's one pass. Selection avoids sorting the row:
//! - top-k (and every rule's `min_keep`) selects among the values at or above a pivot taken from
//!   a strided sample of the row (one compare per value; the whole row when the pivot leaves
//!   fewer than k);
//! - min-p reads the row once: its maximum, and the few values near `max + ln p`, the only ones
//!   whose `exp` must be computed to decide them;
//! - top-p computes the total `W` (one pass of [`exp`], vectorized), then selects its boundary by
//!   weight among the values within a few units of the maximum (the whole row if they do not
//!   hold the target mass), by a quickselect on the running mass;
//! - typical, epsilon and eta compute both sums over the row; typical then sorts growing
//!   prefixes of its scores (partial selections) until they hold its mass.
//!
//! Where the CPU has AVX-512, or AVX2 and FMA, the mass-based rules take the passes of
//! `truncation/wide.rs` instead (the same weights, sixteen or eight at a time; the level is
//! [`crate::cpu::level`]): the sums in one pass, then a compare pass for
//! epsilon and eta; for top-p on a row with many values near its maximum, and for typical, one pass
//! that sums the mass of each bucket of the key (the value, or typical's score) and a selection
//! among the values of the one bucket where the running mass reaches the target.
//!
//! These are algorithms only: every band is the one the definitions below give (a property test
//! compares them with whole-row selections on rows with ties, NaN, infinities and 16-bit values).
//!
//! Semantics are transformers' warpers (`TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`,
//! `TypicalLogitsWarper`, `EpsilonLogitsWarper`, `EtaLogitsWarper`) with two documented choices:
//! - Ties at the boundary are all kept (transformers keeps whichever its sort put first).
//! - NaN logits are never removed (transformers' `scores < threshold` is false for NaN) and take
//!   no part in the reduction.
//!
//! # Arithmetic: the same band on every machine
//!
//! A band is a function of the row's values alone, computed with the arithmetic of
//! [`gpu_shared`] (an IEEE-only `exp`, fixed-point sums, order keys), which a GPU reproduces bit
//! for bit whatever order it visits the values in; that module says how, and the CUDA crate
//! writes its kernel's constants from it. This module is the CPU's selection.

mod gpu_shared;
mod mirostat;
mod select;
mod tail_free;
mod top_a;
mod top_n_sigma;
#[cfg(target_arch = "x86_64")]
mod wide;
mod xtc;

pub use gpu_shared::{
    exp, fixed, from_order_key, order_key, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2_E, EXP_MAX, EXP_MIN,
    EXP_POLY, EXP_SHIFTER, FIXED_BITS,
};

use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
pub(crate) use wide::{available as wide_available, finite_lane_sums, smallest_above_and_between};

/// Values outside `lo..=hi` become `-inf`; values inside (and NaN) are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    pub lo: f32,
    pub hi: f32,
}

impl Band {
    /// Keeps everything.
    pub const ALL: Band = Band {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };

    /// Not a band of values: marks an [`crate::Edit::ForceIf`] whose condition held.
    pub const FIRED: Band = Band {
        lo: f32::INFINITY,
        hi: f32::NEG_INFINITY,
    };

    #[inline]
    pub fn removes(&self, x: f32) -> bool {
        x < self.lo || x > self.hi
    }
}

/// A truncation rule and its parameters. `min_keep` (transformers' `min_tokens_to_keep`, at least
/// 1) is how many of the largest values every rule keeps whatever its threshold says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Truncation {
    /// The `k` largest values (and every value tied with the k-th).
    TopK { k: u32, min_keep: u32 },
    /// The smallest set of largest values whose probability mass reaches `p`.
    TopP { p: f32, min_keep: u32 },
    /// Values whose probability is at least `p` times the largest probability.
    MinP { p: f32, min_keep: u32 },
    /// Locally typical sampling: the values whose information content is closest to the
    /// entropy, until their mass reaches `mass`.
    Typical { mass: f32, min_keep: u32 },
    /// Values whose probability is at least `epsilon`.
    Epsilon { epsilon: f32, min_keep: u32 },
    /// Values whose probability is at least `min(epsilon, sqrt(epsilon) * exp(-entropy))`.
    Eta { epsilon: f32, min_keep: u32 },
    /// Values at least `max - n * sigma`, `sigma` the population standard deviation of the finite
    /// values (llama.cpp's top-n-sigma; `n <= 0` keeps everything).
    TopNSigma { n: f32 },
    /// Values whose probability is at least `a` times the square of the largest probability.
    TopA { a: f32, min_keep: u32 },
    /// Tail-free sampling: the largest values until the cumulative normalized second derivative
    /// of the sorted probabilities passes `z`.
    TailFree { z: f32, min_keep: u32 },
    /// XTC's cut, when its draw says it applies: every value above the least likely one whose
    /// probability is at least `threshold` is removed.
    Xtc { threshold: f32, min_keep: u32 },
    /// Mirostat 1: the `k` largest values, `k` from the target surprise `mu` and a Zipf exponent
    /// estimated from the `m` largest; `key` tells one step's rule from another's.
    MirostatV1 {
        mu: f32,
        m: u32,
        n_vocab: u32,
        key: u32,
    },
    /// Mirostat 2: the values whose surprise `-log2 p` is at most `mu` (at least the largest).
    MirostatV2 { mu: f32, key: u32 },
}

impl Truncation {
    /// Checks the parameters' ranges, naming the field.
    pub fn validate(&self) -> Result<()> {
        let (name, value, ok) = match *self {
            Truncation::TopK { k, .. } => ("k", k as f32, k >= 1),
            Truncation::TopP { p, .. } => ("p", p, p > 0.0 && p <= 1.0),
            Truncation::MinP { p, .. } => ("p", p, (0.0..=1.0).contains(&p)),
            Truncation::Typical { mass, .. } => ("mass", mass, mass > 0.0 && mass < 1.0),
            Truncation::Epsilon { epsilon, .. } | Truncation::Eta { epsilon, .. } => {
                ("epsilon", epsilon, epsilon > 0.0 && epsilon < 1.0)
            }
            Truncation::TopNSigma { n } => ("n", n, n.is_finite()),
            Truncation::TopA { a, .. } => ("a", a, (0.0..=1.0).contains(&a)),
            Truncation::TailFree { z, .. } => ("z", z, (0.0..=1.0).contains(&z)),
            Truncation::Xtc { threshold, .. } => {
                ("threshold", threshold, (0.0..=1.0).contains(&threshold))
            }
            Truncation::MirostatV1 { mu, .. } | Truncation::MirostatV2 { mu, .. } => {
                ("mu", mu, mu.is_finite())
            }
        };
        if !ok {
            return Err(Error::argument(
                name,
                format!("{value} is outside the range {}", self.range()),
            ));
        }
        if self.min_keep() == 0 {
            return Err(Error::argument("min_tokens_to_keep", "must be at least 1"));
        }
        Ok(())
    }

    fn range(&self) -> &'static str {
        match self {
            Truncation::TopK { .. } => ">= 1",
            Truncation::TopP { .. } => "0 < p <= 1",
            Truncation::MinP { .. } => "0 <= p <= 1",
            Truncation::Typical { .. } => "0 < mass < 1",
            Truncation::Epsilon { .. } | Truncation::Eta { .. } => "0 < epsilon < 1",
            Truncation::TopNSigma { .. } => "of finite numbers",
            Truncation::TopA { .. } => "0 <= a <= 1",
            Truncation::TailFree { .. } => "0 <= z <= 1",
            Truncation::Xtc { .. } => "0 <= threshold <= 1",
            Truncation::MirostatV1 { .. } | Truncation::MirostatV2 { .. } => "of finite numbers",
        }
    }

    /// Whether only the CPU path has this rule (the CUDA kernel has top-k, top-p, min-p,
    /// typical, epsilon and eta).
    pub fn on_cpu_only(&self) -> bool {
        matches!(
            self,
            Truncation::TopNSigma { .. }
                | Truncation::TopA { .. }
                | Truncation::TailFree { .. }
                | Truncation::Xtc { .. }
                | Truncation::MirostatV1 { .. }
                | Truncation::MirostatV2 { .. }
        )
    }

    /// Whether the rule's pass keeps the kept tokens' probabilities for its processor's next
    /// step ([`crate::RowPlan::observed`]): mirostat's.
    pub fn observes(&self) -> bool {
        self.key().is_some()
    }

    /// The step key of a rule that observes.
    pub fn key(&self) -> Option<u32> {
        match *self {
            Truncation::MirostatV1 { key, .. } | Truncation::MirostatV2 { key, .. } => Some(key),
            _ => None,
        }
    }

    pub fn min_keep(&self) -> u32 {
        match *self {
            Truncation::TopK { min_keep, .. }
            | Truncation::TopP { min_keep, .. }
            | Truncation::MinP { min_keep, .. }
            | Truncation::Typical { min_keep, .. }
            | Truncation::Epsilon { min_keep, .. }
            | Truncation::Eta { min_keep, .. }
            | Truncation::TopA { min_keep, .. }
            | Truncation::TailFree { min_keep, .. }
            | Truncation::Xtc { min_keep, .. } => min_keep,
            Truncation::TopNSigma { .. }
            | Truncation::MirostatV1 { .. }
            | Truncation::MirostatV2 { .. } => 1,
        }
    }

    /// The band this rule keeps of `values` (the row as it stands where the rule runs).
    /// `work` is scratch space, reused between calls.
    ///
    /// Where the CPU has fused multiply-add and AVX2 (runtime detection), the computation is
    /// compiled to use them (FMA, and an exact rounding instruction for [`fixed`]); elsewhere `f32::mul_add` is the C library's `fmaf`, slower, with the same bits
    /// (both are correctly rounded; a test compares the two paths).
    pub fn band(&self, values: &[f32], work: &mut Work) -> Band {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2_fma() {
            // SAFETY: the CPU has FMA and AVX2.
            return unsafe { self.band_fma(values, work) };
        }
        self.band_portable(values, work)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn band_fma(&self, values: &[f32], work: &mut Work) -> Band {
        self.band_portable(values, work)
    }

    #[inline(always)]
    fn band_portable(&self, values: &[f32], work: &mut Work) -> Band {
        let min_keep = self.min_keep() as usize;
        match *self {
            Truncation::TopNSigma { n } => return top_n_sigma::band(values, n),
            Truncation::TopA { a, .. } => return top_a::band(values, a, min_keep, work),
            Truncation::TailFree { z, .. } => return tail_free::band(values, z, min_keep, work),
            Truncation::Xtc { threshold, .. } => {
                return xtc::band(values, threshold, min_keep, work)
            }
            Truncation::MirostatV2 { mu, .. } => return mirostat::band_v2(values, mu, work),
            Truncation::MirostatV1 { mu, m, n_vocab, .. } => {
                return mirostat::band_v1(values, mu, m, n_vocab, work)
            }
            _ => {}
        }
        if let Truncation::TopK { k, min_keep } = *self {
            return Band {
                lo: kth_largest(values, k.max(min_keep) as usize, work),
                hi: f32::INFINITY,
            };
        }
        if let Truncation::MinP { p, .. } = *self {
            if let Some((max, lo)) = min_p_one_pass(values, p, work) {
                return Band {
                    lo: lo.min(match min_keep {
                        1 => max,
                        _ => kth_largest(values, min_keep, work),
                    }),
                    hi: f32::INFINITY,
                };
            }
        }
        let max = largest(values);
        if !max.is_finite() {
            // No distribution (as `Softmax::is_defined`).
            return Band::ALL;
        }
        let lo = match *self {
            Truncation::TopK { .. }
            | Truncation::TopNSigma { .. }
            | Truncation::TopA { .. }
            | Truncation::TailFree { .. }
            | Truncation::Xtc { .. }
            | Truncation::MirostatV1 { .. }
            | Truncation::MirostatV2 { .. } => unreachable!("resolved above"),
            Truncation::TopP { p, .. } => match top_p(values, max, p, work) {
                Some(lo) => lo,
                None => return Band::ALL,
            },
            Truncation::MinP { p, .. } => min_p(values, max, p),
            Truncation::Typical { mass, .. } => {
                #[cfg(target_arch = "x86_64")]
                if min_keep == 1 && wide::available() && values.len() < 1 << 21 {
                    return typical_wide(values, max, mass, work);
                }
                return typical(values, &Softmax::of(values), mass, min_keep, work);
            }
            Truncation::Epsilon { .. } | Truncation::Eta { .. } => {
                #[cfg(target_arch = "x86_64")]
                if wide::available() && values.len() < 1 << 21 {
                    // The sums in one pass, then the lowest value whose `q` reaches the
                    // threshold by comparison (`exp` only near it).
                    let (sum, entropy_sum) =
                        wide::sums(values, max, matches!(self, Truncation::Eta { .. }));
                    let softmax = Softmax {
                        max,
                        sum,
                        entropy_sum,
                    };
                    let threshold = softmax.threshold(self);
                    let lo = select::lowest_reaching(values, max, threshold, work);
                    return Band {
                        lo: lo.min(match min_keep {
                            1 => max,
                            _ => kth_largest(values, min_keep, work),
                        }),
                        hi: f32::INFINITY,
                    };
                }
                // Plain loops, not closures, here and below: inlined into the FMA-compiled caller.
                let softmax = Softmax::of(values);
                let threshold = softmax.threshold(self);
                let mut lo = f32::INFINITY;
                for &x in values {
                    if !x.is_nan() && softmax.q(x) >= threshold {
                        lo = lo.min(x);
                    }
                }
                lo
            }
        };
        Band {
            lo: lo.min(match min_keep {
                1 => max,
                _ => kth_largest(values, min_keep, work),
            }),
            hi: f32::INFINITY,
        }
    }
}

/// Scratch space for [`Truncation::band`]: (key, weight, value) entries.
pub type Work = Vec<(u32, u64, f32)>;

/// The largest non-NaN value under `f32::total_cmp` order (`-inf` when there is none): the
/// softmax's maximum.
#[inline(always)]
pub(crate) fn largest(values: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let max = if crate::cpu::avx() {
        // SAFETY: the CPU has AVX.
        unsafe { largest_float_avx(values) }
    } else {
        largest_float(values)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let max = largest_float(values);
    if max == 0.0 {
        // `0.0` is above `-0.0` in the total order.
        let positive = values.iter().any(|x| x.to_bits() == 0);
        return if positive { 0.0 } else { -0.0 };
    }
    max
}

/// The largest value by float comparison (NaN never wins one; `-inf` for none): [`largest`]
/// but for the sign of a zero.
fn largest_float(values: &[f32]) -> f32 {
    values
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// [`largest_float`] with four independent vectors of running maxima.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn largest_float_avx(values: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let blocks = values.chunks_exact(32);
    let rest = largest_float(blocks.remainder());
    let mut maxima = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    for block in blocks {
        for (i, m) in maxima.iter_mut().enumerate() {
            // SAFETY: `block` holds 32 f32. `max_ps(x, m)` is `x > m ? x : m`.
            *m = _mm256_max_ps(unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) }, *m);
        }
    }
    let mut lanes = [0f32; 32];
    for (i, m) in maxima.into_iter().enumerate() {
        // SAFETY: `lanes` holds 32 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * i), m) };
    }
    lanes
        .into_iter()
        .fold(rest, |m, x| if x > m { x } else { m })
}

/// Values visited together by the vectorizable loops: two AVX2 vectors.
const LANES: usize = 16;

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
    const SAMPLE: usize = 1024;
    let n = values.len();
    if n >= 8 * SAMPLE {
        work.clear();
        let step = n / SAMPLE;
        work.extend(
            values
                .iter()
                .step_by(step)
                .filter(|x| !x.is_nan())
                .map(|&x| (order_key(x), 0, x)),
        );
        // Twice the expected share of the k largest, and a margin: the candidates are about
        // 2k + 4 * step values, fewer than k about once in a thousand rows for small k.
        let rank = 2 * k * work.len() / n + 4;
        if rank < work.len() {
            let at = work.len() - rank;
            let pivot = work.select_nth_unstable_by_key(at, |e| e.0).1 .2;
            collect_from(values, pivot.max(f32::MIN), work, |_| 0);
            if work.len() >= k {
                return kth_of(work, k);
            }
        }
    }
    collect_from(values, f32::MIN, work, |_| 0);
    if k > work.len() {
        return f32::NEG_INFINITY;
    }
    kth_of(work, k)
}

/// The value with the k-th largest key in `work` (`1 <= k <= work.len()`).
fn kth_of(work: &mut Work, k: usize) -> f32 {
    let at = work.len() - k;
    work.select_nth_unstable_by_key(at, |e| e.0).1 .2
}

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
fn min_p(values: &[f32], max: f32, p: f32) -> f32 {
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

/// The row's maximum and [`min_p`]'s value in one pass where AVX2 allows: the values within
/// `1 - ln p` of the running maximum are collected (a superset of those min-p can keep, since the
/// maximum only grows), then decided as [`min_p`] decides them. `None` (the caller takes two
/// passes) without AVX2, for a row without a finite maximum, a maximum beyond `1e5` (where the
/// margin is no longer small against the rounding), `p < 1e-30`, or more than 4,096 candidates.
#[inline(always)]
fn min_p_one_pass(values: &[f32], p: f32, work: &mut Work) -> Option<(f32, f32)> {
    #[cfg(target_arch = "x86_64")]
    if p >= 1e-30 && crate::cpu::avx2() {
        let ln_p = (p as f64).ln() as f32;
        // SAFETY: the CPU has AVX2.
        let max = unsafe { max_and_candidates_avx2(values, ln_p - 1.0, work) }?;
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

/// The float maximum of `values` (NaN never wins a comparison; the sign of a zero is not
/// decided), with every value at or above `running maximum + below` collected into `work`:
/// `None` past 4,096 of them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn max_and_candidates_avx2(values: &[f32], below: f32, work: &mut Work) -> Option<f32> {
    use std::arch::x86_64::*;
    const LIMIT: usize = 4096;
    work.clear();
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    let below_v = _mm256_set1_ps(below);
    let mut running = _mm256_set1_ps(f32::NEG_INFINITY);
    for block in blocks {
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
        if near(_mm256_add_ps(running, below_v)) == 0 {
            continue;
        }
        // Every lane to the maximum so far, then against its floor.
        let halves = _mm256_max_ps(running, _mm256_permute2f128_ps::<1>(running, running));
        let pairs = _mm256_max_ps(halves, _mm256_permute_ps::<0b01_00_11_10>(halves));
        running = _mm256_max_ps(pairs, _mm256_permute_ps::<0b10_11_00_01>(pairs));
        let mut near = near(_mm256_add_ps(running, below_v));
        while near != 0 {
            let x = block[near.trailing_zeros() as usize];
            work.push((0, 0, x));
            near &= near - 1;
        }
        if work.len() > LIMIT {
            return None;
        }
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), running) };
    let max = lanes
        .into_iter()
        .chain(rest.iter().copied())
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m });
    // The last values against the final maximum.
    work.extend(
        rest.iter()
            .filter(|&&x| x >= max + below)
            .map(|&x| (0, 0, x)),
    );
    Some(max)
}

/// Top-p's lowest kept value before `min_keep`: the largest value where the mass of the values
/// at or above it reaches `p`.
///
/// The total `W` takes one pass of [`exp`] over the row ([`weight_sum`]); the boundary is then
/// selected among the values within a few units of the maximum, where nearly all of the mass of
/// most rows is (the whole row when they do not reach the target).
#[inline(always)]
fn top_p(values: &[f32], max: f32, p: f32, work: &mut Work) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if wide::available() && values.len() < 1 << 21 {
        return top_p_wide(values, max, p, work);
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

/// [`top_p`] with the passes of `truncation/wide.rs`. A row with few values within 4 of its maximum (a trained
/// model's) selects among them once the total is known, as [`top_p`] does; otherwise one pass
/// computes the total and the mass of each bucket of 1/32 below the maximum, and the boundary is
/// selected among the values of the bucket where the running mass reaches the target (a flat
/// row's: the buckets above it hold most of the mass, and most of the row is never collected).
#[cfg(target_arch = "x86_64")]
fn top_p_wide(values: &[f32], max: f32, p: f32, work: &mut Work) -> Option<f32> {
    if wide::smallest_above_and_between(values, max - 4.0, f32::INFINITY, 4096, work).is_some() {
        keyed(work);
        wide::fill_weights(work, max);
        let softmax = Softmax::weights_only(values, max);
        let target = softmax.target(p);
        let mass: u64 = work.iter().map(|e| e.1).sum();
        if mass as f64 >= target {
            return Some(weighted_select(work, 0, target).2);
        }
    }
    let mut masses = [0u64; wide::BUCKETS];
    let softmax = Softmax {
        max,
        sum: wide::bucket_masses(values, max, wide::Key::Value, &mut masses),
        entropy_sum: 0,
    };
    let target = softmax.target(p);
    let (bucket, above) = reaching_bucket(&masses, target)?;
    wide::collect_bucket(values, max, wide::Key::Value, bucket, work);
    wide::fill_weights(work, max);
    Some(weighted_select(work, above, target).2)
}

/// The first bucket where the running mass reaches `target`, and the mass before it.
#[cfg(target_arch = "x86_64")]
fn reaching_bucket(masses: &[u64], target: f64) -> Option<(usize, u64)> {
    let mut above = 0u64;
    for (bucket, &mass) in masses.iter().enumerate() {
        if (above + mass) as f64 >= target {
            return Some((bucket, above));
        }
        above += mass;
    }
    None
}

/// Sets each entry's key to its value's [`order_key`].
#[cfg(target_arch = "x86_64")]
fn keyed(work: &mut Work) {
    for e in work.iter_mut() {
        e.0 = order_key(e.2);
    }
}

/// Typical's band with the passes of `truncation/wide.rs` (`min_keep` 1): the sums `W` and `E` in one pass, then
/// the mass of each bucket of scores (1/16 wide) in another; the boundary is selected among the
/// values of the bucket where the running mass, smallest scores first, reaches the target.
#[cfg(target_arch = "x86_64")]
fn typical_wide(values: &[f32], max: f32, mass: f32, work: &mut Work) -> Band {
    let (sum, entropy_sum) = wide::sums(values, max, true);
    let softmax = Softmax {
        max,
        sum,
        entropy_sum,
    };
    let key = wide::Key::Typical {
        shift: softmax.shift(),
    };
    let target = softmax.target(mass);
    let mut masses = [0u64; wide::BUCKETS];
    wide::bucket_masses(values, max, key, &mut masses);
    let Some((bucket, above)) = reaching_bucket(&masses, target) else {
        return Band::ALL;
    };
    let (lo, hi) = wide::collect_bucket(values, max, key, bucket, work);
    wide::fill_weights(work, max);
    // Keys are the bitwise-not of the scores' order keys: the largest key is the smallest score.
    let cut = weighted_select(work, above, target).0;
    let (lo, hi) = work
        .iter()
        .filter(|e| e.0 >= cut)
        .fold((lo, hi), |(lo, hi), e| (lo.min(e.2), hi.max(e.2)));
    Band { lo, hi }
}

/// The entry `v` of `work` whose mass of larger keys (plus `above`, the mass of values outside
/// `work` above all of it) is below `target` and whose mass of keys at or above it reaches
/// `target` (the running sum in key order, largest first, first reaches the target at `v`; its
/// key is unique, whatever the order of ties). `above` and `work`'s whole mass must reach it.
/// Quickselect by weight: expected linear time.
fn weighted_select(work: &mut [(u32, u64, f32)], above: u64, target: f64) -> (u32, u64, f32) {
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

/// `sum fixed(q(x))` over `values`, the softmax's `W` (NaN adds nothing): AVX2 where the CPU has
/// it, with the same bits as [`Softmax::weights`] one value at a time (a test compares them).
#[inline(always)]
pub fn weight_sum(values: &[f32], max: f32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if values.len() < 1 << 21 && wide::available() {
        return wide::sums(values, max, false).0;
    }
    #[cfg(target_arch = "x86_64")]
    if values.len() < 1 << 21 && crate::cpu::avx2_fma() {
        // SAFETY: the CPU has FMA and AVX2.
        return unsafe { weight_sum_avx2(values, max) };
    }
    weight_sum_scalar(values, max)
}

#[inline(always)]
fn weight_sum_scalar(values: &[f32], max: f32) -> u64 {
    let softmax = Softmax {
        max,
        sum: 0,
        entropy_sum: 0,
    };
    values.iter().map(|&x| softmax.weights(x).0).sum()
}

/// [`weight_sum`] eight values at a time: [`exp`]'s operations in the same order on each lane.
/// Only `d = x - max` in `[-87, 0]` is computed (there `exp`'s scale `2^n` is normal); below it
/// `q < 2^-125` and its weight is 0, as for NaN.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn weight_sum_avx2(values: &[f32], max: f32) -> u64 {
    use std::arch::x86_64::*;
    let splat = _mm256_set1_ps;
    let (max_v, floor, weightless) = (splat(max), splat(-87.0), splat(-WEIGHTLESS));
    let (log2_e, shifter) = (splat(EXP_LOG2_E), splat(EXP_SHIFTER));
    let (ln2_hi, ln2_lo) = (splat(-EXP_LN2_HI), splat(-EXP_LN2_LO));
    let one = splat(1.0);
    // `q * 2^32` is `y * 2^(n + 32)`: the same rounding, scaled exactly.
    let bias = _mm256_set1_epi32(127 + FIXED_BITS as i32);
    // `round(q * 2^32)` of eight values (0 where `d < -87` or NaN), as integral f32.
    let fixed_weights = |x: __m256| {
        let d = _mm256_sub_ps(x, max_v);
        let live = _mm256_cmp_ps::<_CMP_GE_OQ>(d, floor);
        let n = _mm256_sub_ps(_mm256_fmadd_ps(d, log2_e, shifter), shifter);
        let r = _mm256_fmadd_ps(n, ln2_hi, d);
        let r = _mm256_fmadd_ps(n, ln2_lo, r);
        let mut p = splat(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, splat(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), bias));
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(y, _mm256_castsi256_ps(pow2)),
        );
        _mm256_and_ps(t, live)
    };
    // Sums of integers below 2^32 in f64 are exact up to 2^53: rows of up to 2^21 values.
    let mut sums = [_mm256_setzero_pd(); 4];
    let add = |sums: &mut [__m256d; 4], t: __m256| {
        sums[0] = _mm256_add_pd(sums[0], _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
        sums[1] = _mm256_add_pd(sums[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(t)));
    };
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    for block in blocks {
        // SAFETY: `block` holds 16 f32.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        // Blocks far below the maximum weigh nothing (most of a model's row).
        let heavy = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(a, max_v), weightless),
            _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(b, max_v), weightless),
        );
        if _mm256_testz_ps(heavy, heavy) == 1 {
            continue;
        }
        // Two independent chains of `exp`, interleaved.
        let (ta, tb) = (fixed_weights(a), fixed_weights(b));
        add(&mut sums, ta);
        sums.swap(0, 2);
        sums.swap(1, 3);
        add(&mut sums, tb);
    }
    let sum = _mm256_add_pd(
        _mm256_add_pd(sums[0], sums[1]),
        _mm256_add_pd(sums[2], sums[3]),
    );
    let mut lanes = [0f64; 4];
    // SAFETY: `lanes` holds 4 f64.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), sum) };
    lanes.iter().map(|&sum| sum as u64).sum::<u64>() + weight_sum_scalar(rest, max)
}

/// Values more than this below the maximum have weight 0: `exp(d) < 2^-33`, which rounds to 0
/// in fixed point (a test checks every f32 from `-104` to here).
const WEIGHTLESS: f32 = 23.0;

/// A row's softmax in the fixed-point form the module docs describe: the maximum, the sum `W`
/// of the probabilities' fixed-point weights and the entropy sum `E`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softmax {
    pub max: f32,
    pub sum: u64,
    pub entropy_sum: u64,
}

impl Softmax {
    /// The weight sum of `values` under their maximum `max`, without the entropy sum: what the
    /// rules that compare probabilities (top-p, top-a, XTC, mirostat, adaptive-p) need.
    #[inline(always)]
    pub fn weights_only(values: &[f32], max: f32) -> Self {
        Softmax {
            max,
            sum: weight_sum(values, max),
            entropy_sum: 0,
        }
    }

    /// The maximum of `values`; then the sums over them (in any order: they are exact), with the
    /// passes of `truncation/wide.rs` where the CPU has them.
    #[inline(always)]
    pub fn of(values: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if values.len() < 1 << 21 && wide::available() {
            let max = largest(values);
            let (sum, entropy_sum) = if max.is_finite() {
                wide::sums(values, max, true)
            } else {
                (0, 0)
            };
            return Softmax {
                max,
                sum,
                entropy_sum,
            };
        }
        let max = values
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| order_key(x))
            .max()
            .map_or(f32::NEG_INFINITY, from_order_key);
        let mut softmax = Softmax {
            max,
            sum: 0,
            entropy_sum: 0,
        };
        if softmax.is_defined() {
            for &x in values {
                let (w, e) = softmax.weights(x);
                softmax.sum += w;
                softmax.entropy_sum += e;
            }
        }
        softmax
    }

    /// Whether the row has a distribution: its largest non-NaN value is finite.
    pub fn is_defined(&self) -> bool {
        self.max.is_finite()
    }

    /// `exp(x - max)`, the probability of `x` times the sum `S`.
    #[inline(always)]
    pub fn q(&self, x: f32) -> f32 {
        exp(x - self.max)
    }

    /// The fixed-point weights `x` adds to the sum and to the entropy sum (NaN adds nothing).
    #[inline(always)]
    pub fn weights(&self, x: f32) -> (u64, u64) {
        if x.is_nan() {
            return (0, 0);
        }
        let d = x - self.max;
        let q = exp(d);
        if q > 0.0 {
            (fixed(q), fixed(q * -d))
        } else {
            (0, 0)
        }
    }

    /// The sum `S = W * 2^-32` of the `q`s, in f32.
    pub fn scale(&self) -> f32 {
        (self.sum as f64 / (1u64 << FIXED_BITS) as f64) as f32
    }

    /// `E / W`, the entropy less `ln S`, in f32.
    pub fn shift(&self) -> f32 {
        (self.entropy_sum as f64 / self.sum as f64) as f32
    }

    /// A fraction `p` of the total mass, in the units of the fixed-point sums.
    pub fn target(&self, p: f32) -> f64 {
        p as f64 * self.sum as f64
    }

    /// The `q` a value must reach to be kept by min-p, epsilon or eta (`+inf` for other rules).
    #[inline(always)]
    pub fn threshold(&self, rule: &Truncation) -> f32 {
        match *rule {
            Truncation::MinP { p, .. } => p,
            Truncation::Epsilon { epsilon, .. } => epsilon * self.scale(),
            Truncation::Eta { epsilon, .. } => {
                (epsilon * self.scale()).min(epsilon.sqrt() * exp(-self.shift()))
            }
            _ => f32::INFINITY,
        }
    }

    /// The typical rule's score of `x`: `|-ln p - H| = |d + E / W|`.
    #[inline(always)]
    pub fn typical_score(&self, x: f32, shift: f32) -> f32 {
        ((x - self.max) + shift).abs()
    }
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
fn typical(values: &[f32], softmax: &Softmax, mass: f32, min_keep: usize, work: &mut Work) -> Band {
    let shift = softmax.shift();
    work.clear();
    for &x in values {
        if !x.is_nan() && x != f32::NEG_INFINITY {
            let score = softmax.typical_score(x, shift);
            work.push((order_key(score), softmax.weights(x).0, x));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// transformers' warpers, as written there: a whole-row sort and a softmax in f64.
    fn reference(rule: &Truncation, x: &[f32]) -> Vec<bool> {
        let n = x.len();
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
        let p: Vec<f64> = x.iter().map(|&v| (v as f64 - max).exp() / sum).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| x[b].total_cmp(&x[a])); // largest first
        let min_keep = rule.min_keep() as usize;
        let mut keep = vec![false; n];
        for &i in order.iter().take(min_keep) {
            keep[i] = true;
        }
        match *rule {
            Truncation::TopNSigma { .. }
            | Truncation::TopA { .. }
            | Truncation::TailFree { .. }
            | Truncation::Xtc { .. }
            | Truncation::MirostatV1 { .. }
            | Truncation::MirostatV2 { .. } => {
                unreachable!("tested against their definitions in their own files")
            }
            Truncation::TopK { k, min_keep } => {
                let kth = x[order[(k.max(min_keep) as usize).min(n) - 1]];
                (0..n).for_each(|i| keep[i] = x[i] >= kth);
            }
            Truncation::TopP { p: top_p, .. } => {
                // Ascending cumulative mass; remove where it is <= 1 - p.
                let mut cumulative = 0.0;
                for &i in order.iter().rev() {
                    cumulative += p[i];
                    keep[i] |= cumulative > 1.0 - top_p as f64;
                }
            }
            Truncation::MinP { p: min_p, .. } => {
                let top = p.iter().cloned().fold(0.0, f64::max);
                (0..n).for_each(|i| keep[i] |= p[i] >= min_p as f64 * top);
            }
            Truncation::Epsilon { epsilon, .. } => {
                (0..n).for_each(|i| keep[i] |= p[i] >= epsilon as f64);
            }
            Truncation::Eta { epsilon, .. } => {
                let entropy: f64 = -p
                    .iter()
                    .map(|&q| if q > 0.0 { q * q.ln() } else { 0.0 })
                    .sum::<f64>();
                let eta = (epsilon as f64).min((epsilon as f64).sqrt() * (-entropy).exp());
                (0..n).for_each(|i| keep[i] |= p[i] >= eta);
            }
            Truncation::Typical { mass, .. } => {
                let entropy: f64 = -p
                    .iter()
                    .map(|&q| if q > 0.0 { q * q.ln() } else { 0.0 })
                    .sum::<f64>();
                let shifted: Vec<f64> = p.iter().map(|&q| (-q.ln() - entropy).abs()).collect();
                let mut by_shift: Vec<usize> = (0..n).collect();
                by_shift.sort_by(|&a, &b| shifted[a].total_cmp(&shifted[b]));
                let mut cumulative = 0.0;
                let mut last = n - 1;
                for (rank, &i) in by_shift.iter().enumerate() {
                    cumulative += p[i];
                    if cumulative >= mass as f64 {
                        last = rank;
                        break;
                    }
                }
                let cut = shifted[by_shift[last.max(min_keep.min(n) - 1)]];
                keep = (0..n).map(|i| shifted[i] <= cut).collect();
            }
        }
        keep
    }

    fn rule() -> impl Strategy<Value = Truncation> {
        let min_keep = 1u32..4;
        prop_oneof![
            (1u32..40, min_keep.clone()).prop_map(|(k, min_keep)| Truncation::TopK { k, min_keep }),
            (0.05f32..1.0, min_keep.clone())
                .prop_map(|(p, min_keep)| Truncation::TopP { p, min_keep }),
            (0.0f32..1.0, min_keep.clone())
                .prop_map(|(p, min_keep)| Truncation::MinP { p, min_keep }),
            (0.05f32..0.95, min_keep.clone())
                .prop_map(|(mass, min_keep)| Truncation::Typical { mass, min_keep }),
            (0.0001f32..0.2, min_keep.clone())
                .prop_map(|(epsilon, min_keep)| Truncation::Epsilon { epsilon, min_keep }),
            (0.0001f32..0.2, min_keep)
                .prop_map(|(epsilon, min_keep)| Truncation::Eta { epsilon, min_keep }),
        ]
    }

    /// The rules as first defined, by whole-row selections: every value's weight, a partial
    /// selection of the k-th largest over all of them. The fast paths must give the same bands.
    fn band_by_definition(rule: &Truncation, values: &[f32]) -> Band {
        let kth_largest = |k: usize| {
            let mut keys: Vec<(u32, f32)> = values
                .iter()
                .filter(|x| !x.is_nan())
                .map(|&x| (order_key(x), x))
                .collect();
            if k == 0 || k > keys.len() {
                return f32::NEG_INFINITY;
            }
            let at = keys.len() - k;
            keys.select_nth_unstable_by_key(at, |e| e.0).1 .1
        };
        let min_keep = rule.min_keep() as usize;
        if let Truncation::TopK { k, min_keep } = *rule {
            return Band {
                lo: kth_largest(k.max(min_keep) as usize),
                hi: f32::INFINITY,
            };
        }
        let softmax = Softmax::of(values);
        if !softmax.is_defined() {
            return Band::ALL;
        }
        if let Truncation::Typical { mass, .. } = *rule {
            // Growing sorted prefixes of the scores, the path without AVX-512.
            return typical(values, &softmax, mass, min_keep, &mut vec![]);
        }
        let lo = match *rule {
            Truncation::TopK { .. }
            | Truncation::Typical { .. }
            | Truncation::TopNSigma { .. }
            | Truncation::TopA { .. }
            | Truncation::TailFree { .. }
            | Truncation::Xtc { .. }
            | Truncation::MirostatV1 { .. }
            | Truncation::MirostatV2 { .. } => return rule.band(values, &mut vec![]),
            Truncation::TopP { p, .. } => {
                let mut by_key: Vec<(u32, u64, f32)> = values
                    .iter()
                    .filter(|x| !x.is_nan())
                    .map(|&x| (order_key(x), softmax.weights(x).0, x))
                    .collect();
                by_key.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
                let mut sum = 0u64;
                let reached = by_key.iter().find(|e| {
                    sum += e.1;
                    sum as f64 >= softmax.target(p)
                });
                match reached {
                    Some(e) => e.2,
                    None => return Band::ALL,
                }
            }
            _ => {
                let threshold = softmax.threshold(rule);
                values
                    .iter()
                    .filter(|&&x| !x.is_nan() && softmax.q(x) >= threshold)
                    .fold(f32::INFINITY, |lo, &x| lo.min(x))
            }
        };
        Band {
            lo: lo.min(kth_largest(min_keep)),
            hi: f32::INFINITY,
        }
    }

    /// Rows with what the fast paths must get right: ties (few distinct values, or values
    /// rounded to f16 / bf16), NaN, infinities, signed zeros, every value equal, values far
    /// below the maximum, and lengths past the sampled pivot's threshold.
    fn awkward_row() -> impl Strategy<Value = Vec<f32>> {
        let len = prop_oneof![1usize..300, 8_000usize..20_000];
        (len, 0u8..7, any::<u64>()).prop_map(|(len, shape, seed)| {
            let mut state = seed | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            (0..len)
                .map(|_| {
                    let r = next();
                    let uniform = (r >> 40) as f32 / (1u64 << 24) as f32;
                    let x = match shape {
                        0 => (r % 7) as f32 - 3.0,
                        1 => 3.25,
                        2 => half::f16::from_f32(uniform * 30.0 - 20.0).to_f32(),
                        3 => half::bf16::from_f32(uniform * 30.0 - 20.0).to_f32(),
                        4 => uniform * 200.0 - 150.0,
                        6 => 30_000.0 + (r % 9) as f32 * 0.25,
                        _ => uniform * 20.0 - 2.0 + if r % 500 == 0 { 12.0 } else { 0.0 },
                    };
                    match (r >> 8) % 97 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        3 => 0.0,
                        4 if shape == 4 => f32::INFINITY,
                        _ => x,
                    }
                })
                .collect()
        })
    }

    fn awkward_rule() -> impl Strategy<Value = Truncation> {
        let min_keep = prop_oneof![Just(1u32), 2u32..6, 50u32..200];
        prop_oneof![
            (prop_oneof![1u32..60, 1u32..5000], min_keep.clone())
                .prop_map(|(k, min_keep)| Truncation::TopK { k, min_keep }),
            (prop_oneof![0.001f32..1.0, Just(1.0)], min_keep.clone())
                .prop_map(|(p, min_keep)| Truncation::TopP { p, min_keep }),
            (
                prop_oneof![
                    0.0f32..1.0,
                    Just(0.0),
                    Just(1.0),
                    1e-40f32..1e-20,
                    (1u8..4).prop_map(|k| (-(k as f32)).exp()),
                ],
                min_keep.clone()
            )
                .prop_map(|(p, min_keep)| Truncation::MinP { p, min_keep }),
            (0.0001f32..0.2, min_keep.clone())
                .prop_map(|(epsilon, min_keep)| Truncation::Epsilon { epsilon, min_keep }),
            (0.0001f32..0.2, min_keep.clone())
                .prop_map(|(epsilon, min_keep)| Truncation::Eta { epsilon, min_keep }),
            (
                prop_oneof![0.001f32..1.0, Just(0.5), Just(0.999_999)],
                prop_oneof![3 => Just(1u32), 1 => min_keep]
            )
                .prop_filter("mass below 1", |(mass, _)| *mass < 1.0)
                .prop_map(|(mass, min_keep)| Truncation::Typical { mass, min_keep }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// The fast paths (sampled pivots, the min-p cut by comparison, the candidates near the
        /// maximum, the vectorized weight sum) give the band of the definition: the same bits
        /// for a selected value, the same kept values for min-p, epsilon and eta.
        #[test]
        fn fast_bands_are_the_definitions(row in awkward_row(), rule in awkward_rule()) {
            let fast = rule.band(&row, &mut vec![]);
            let slow = band_by_definition(&rule, &row);
            let portable = rule.band_portable(&row, &mut vec![]);
            let differ = |band: Band| row.iter().filter(|&&x| band.removes(x) != slow.removes(x)).count();
            prop_assert_eq!(differ(fast), 0, "{:?}: {:?} against {:?}", rule, fast, slow);
            prop_assert_eq!(differ(portable), 0, "{:?}: {:?} against {:?}", rule, portable, slow);
            if matches!(rule, Truncation::TopK { .. } | Truncation::TopP { .. }) {
                prop_assert_eq!(fast.lo.to_bits(), slow.lo.to_bits(), "{:?}", rule);
            }
            if let Truncation::Typical { .. } = rule {
                // The band's ends are row values (`-0.0` and `0.0` alike: `min` of the two is
                // either).
                prop_assert!(fast.lo == slow.lo && fast.hi == slow.hi, "{:?}: {:?} against {:?}", rule, fast, slow);
            }
        }

        /// The vectorized sum of weights is the one-value-at-a-time sum, bit for bit, over
        /// values around every range `exp` distinguishes (normal, subnormal, zero results).
        #[test]
        fn weight_sum_is_the_sum_of_weights(
            row in proptest::collection::vec(
                prop_oneof![
                    -110.0f32..0.0,
                    -90.0f32..-84.0,
                    -24.0f32..0.0,
                    Just(f32::NAN),
                    Just(f32::NEG_INFINITY),
                    Just(-0.0f32),
                ],
                0..200,
            ),
            // Mostly weightless: whole blocks skipped.
            far in proptest::collection::vec(prop_oneof![9 => -110.0f32..-22.0, 1 => -30.0f32..0.0], 0..400),
        ) {
            let softmax = Softmax { max: 0.0, sum: 0, entropy_sum: 0 };
            for row in [row, far] {
                let one_by_one: u64 = row.iter().map(|&x| softmax.weights(x).0).sum();
                prop_assert_eq!(weight_sum(&row, 0.0), one_by_one);
                prop_assert_eq!(weight_sum_scalar(&row, 0.0), one_by_one);
                #[cfg(target_arch = "x86_64")]
                {
                    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                        // SAFETY: the CPU has AVX2 and FMA.
                        prop_assert_eq!(unsafe { weight_sum_avx2(&row, 0.0) }, one_by_one);
                    }
                    if wide::available() {
                        let entropy: u64 = row.iter().map(|&x| softmax.weights(x).1).sum();
                        prop_assert_eq!(wide::sums(&row, 0.0, true), (one_by_one, entropy));
                        let mut work: Work = row.iter().map(|&x| (0, 0, x)).collect();
                        wide::fill_weights(&mut work, 0.0);
                        for e in &work {
                            prop_assert_eq!(e.1, softmax.weights(e.2).0, "{}", e.2);
                        }
                    }
                }
            }
        }
    }

    /// Each bucket's mass is the sum of the weights of the values collected from it, for both
    /// keys, on rows with NaN, infinities, ties and large offsets.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bucket_masses_are_the_weights_of_the_buckets_values() {
        if !wide::available() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        for (spread, offset) in [(1.0f32, 0.0f32), (8.0, -3.0), (0.05, 30_000.0), (40.0, 1e3)] {
            let row: Vec<f32> = (0..3001)
                .map(|i| match i % 53 {
                    7 => f32::NAN,
                    8 => f32::NEG_INFINITY,
                    9 => offset,
                    _ => ((next() - 0.5) * 4.0 * spread + offset).round() * 0.125 + offset * 0.875,
                })
                .collect();
            let max = largest(&row);
            let (sum, entropy_sum) = wide::sums(&row, max, true);
            let shift = Softmax {
                max,
                sum,
                entropy_sum,
            }
            .shift();
            for key in [wide::Key::Value, wide::Key::Typical { shift }] {
                let mut masses = [0u64; wide::BUCKETS];
                assert_eq!(wide::bucket_masses(&row, max, key, &mut masses), sum);
                let mut work = vec![];
                let mut collected = 0;
                for (bucket, &mass) in masses.iter().enumerate() {
                    if mass == 0 && bucket % 97 != 0 {
                        continue;
                    }
                    wide::collect_bucket(&row, max, key, bucket, &mut work);
                    wide::fill_weights(&mut work, max);
                    assert_eq!(
                        work.iter().map(|e| e.1).sum::<u64>(),
                        mass,
                        "{key:?} {bucket}"
                    );
                    collected += work.len();
                }
                assert!(collected > 0);
            }
        }
    }

    proptest! {
        /// On rows of distinct values the band keeps exactly what the sorted reference keeps,
        /// unless a probability sits within rounding of the rule's threshold.
        #[test]
        fn bands_keep_what_a_full_sort_keeps(
            row in proptest::collection::hash_set(-2000i32..2000, 1..600),
            scale in 0.001f32..0.05,
            rule in rule(),
        ) {
            let x: Vec<f32> = row.into_iter().map(|v| v as f32 * scale).collect();
            let band = rule.band(&x, &mut vec![]);
            let want = reference(&rule, &x);
            let got: Vec<bool> = x.iter().map(|&v| !band.removes(v)).collect();
            let differ = (0..x.len()).filter(|&i| got[i] != want[i]).count();
            // Rounding (f32 probabilities here, f64 in the reference) may move one boundary token.
            prop_assert!(differ <= 1, "{rule:?}: {differ} of {} differ", x.len());
        }
    }

    proptest! {
        /// A band depends on the row's values, not on their order: the sums are exact.
        #[test]
        fn bands_do_not_depend_on_the_order_of_the_row(
            row in proptest::collection::vec(-40.0f32..40.0, 1..400),
            rule in rule(),
            rotate in 0usize..400,
        ) {
            let mut other = row.clone();
            other.reverse();
            let by = rotate % other.len();
            other.rotate_left(by);
            let a = rule.band(&row, &mut vec![]);
            let b = rule.band(&other, &mut vec![]);
            let kept = |band: Band| row.iter().map(|&x| !band.removes(x)).collect::<Vec<_>>();
            prop_assert_eq!(kept(a), kept(b), "{:?}", rule);
        }
    }

    proptest! {
        /// The FMA-compiled path and the portable one (`fmaf`) give the same bands.
        #[test]
        fn fma_and_portable_paths_give_the_same_band(
            row in proptest::collection::vec(-60.0f32..60.0, 1..300),
            rule in rule(),
        ) {
            let a = rule.band(&row, &mut vec![]);
            let b = rule.band_portable(&row, &mut vec![]);
            prop_assert_eq!((a.lo.to_bits(), a.hi.to_bits()), (b.lo.to_bits(), b.hi.to_bits()));
        }
    }

    /// The largest error of [`exp`] in ulp of the exact value, over every 97th f32 of `[-103, 0]`
    /// and a grid of `[0, 88]`.
    #[test]
    fn exp_is_within_one_ulp_and_exact_at_zero() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        let ulp_error = |x: f32| {
            let exact = (x as f64).exp();
            let rounded = exact as f32;
            let ulp = if rounded.is_subnormal() || rounded == 0.0 {
                f32::from_bits(1) as f64
            } else {
                (f32::from_bits(rounded.to_bits() + 1) - rounded) as f64
            };
            (exp(x) as f64 - exact).abs() / ulp
        };
        let mut worst = (0.0f64, 0.0f32);
        let mut bits = 0.0f32.to_bits() | 0x8000_0000;
        while f32::from_bits(bits) >= -103.0 {
            let x = f32::from_bits(bits);
            let e = ulp_error(x);
            if e > worst.0 {
                worst = (e, x);
            }
            bits += 97;
        }
        for i in 0..88_000 {
            let x = i as f32 * 1e-3;
            let e = ulp_error(x);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 < 1.0, "{} ulp at {}", worst.0, worst.1);
        println!("exp: worst {} ulp at {}", worst.0, worst.1);
    }

    /// Every f32 from `-104` (below which `exp` is 0) up to `-WEIGHTLESS` has weight 0: the
    /// vectorized sum may skip blocks below it.
    #[test]
    fn values_far_below_the_maximum_weigh_nothing() {
        let softmax = Softmax {
            max: 0.0,
            sum: 0,
            entropy_sum: 0,
        };
        let (from, to) = (EXP_MIN.to_bits(), (-WEIGHTLESS).to_bits());
        // Negative floats: larger bits are further from zero.
        for bits in to..=from {
            let d = f32::from_bits(bits);
            assert_eq!(softmax.weights(d).0, 0, "{d}");
        }
        assert!(softmax.weights(-WEIGHTLESS + 0.5).0 > 0);
    }

    #[test]
    fn top_k_keeps_ties_and_everything_when_k_exceeds_the_row() {
        let x = [1.0f32, 3.0, 3.0, 2.0, f32::NEG_INFINITY];
        let band = Truncation::TopK { k: 2, min_keep: 1 }.band(&x, &mut vec![]);
        let kept: Vec<bool> = x.iter().map(|&v| !band.removes(v)).collect();
        assert_eq!(kept, [false, true, true, false, false]);
        let all = Truncation::TopK { k: 50, min_keep: 1 }.band(&x, &mut vec![]);
        assert_eq!(all.lo, f32::NEG_INFINITY);
    }

    #[test]
    fn top_k_over_a_long_row_mostly_masked_to_minus_infinity() {
        let mut x = vec![f32::NEG_INFINITY; 20_000];
        for (i, v) in [(7, 2.0f32), (900, -1.0), (12_345, 5.0), (19_999, 2.0)] {
            x[i] = v;
        }
        for (k, lo) in [
            (1, 5.0),
            (2, 2.0),
            (3, 2.0),
            (4, -1.0),
            (5, f32::NEG_INFINITY),
        ] {
            let rule = Truncation::TopK { k, min_keep: 1 };
            assert_eq!(rule.band(&x, &mut vec![]).lo, lo, "k {k}");
            assert_eq!(band_by_definition(&rule, &x).lo, lo, "k {k}");
        }
    }

    #[test]
    fn parameters_out_of_range_are_refused_naming_the_field() {
        let bad = [
            (Truncation::TopK { k: 0, min_keep: 1 }, "k"),
            (
                Truncation::TopP {
                    p: 0.0,
                    min_keep: 1,
                },
                "p",
            ),
            (
                Truncation::MinP {
                    p: 1.5,
                    min_keep: 1,
                },
                "p",
            ),
            (
                Truncation::Typical {
                    mass: 1.0,
                    min_keep: 1,
                },
                "mass",
            ),
            (
                Truncation::Eta {
                    epsilon: 0.0,
                    min_keep: 1,
                },
                "epsilon",
            ),
            (Truncation::TopK { k: 3, min_keep: 0 }, "min_tokens_to_keep"),
        ];
        for (rule, field) in bad {
            match rule.validate() {
                Err(Error::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{rule:?}: {other:?}"),
            }
        }
    }
}
