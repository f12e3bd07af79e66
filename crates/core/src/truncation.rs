//! Truncation rules: keep the most likely tokens of a row, set the others to `-inf`.
//!
//! Each rule needs a reduction over the row (a maximum, a softmax sum, an entropy, a k-th largest
//! value) before it can say which tokens go. The tokens a rule keeps always form one interval of
//! values (for top-k, top-p, min-p, epsilon and eta: every value from some threshold up; for
//! typical: a band around the entropy), so a rule resolves to a [`Band`], and applying it is an
//! element-wise compare in the row's one pass. No rule sorts the whole row, except top-p
//! and typical on rows whose mass is spread over most of the vocab:
//! - a k-th largest value (top-k, `min_tokens_to_keep`, top-p's candidates) comes from a pivot
//!   taken in a strided sample: one pass collects the values above it, and selection among those
//!   gives the exact k-th value (selection over the whole row when the sample was unlucky);
//! - the softmax's sum and entropy take one pass, the exponentials computed in f32 a block at a
//!   time (vectorized; within two units in the last place of `exp`) and summed in f64;
//! - a probability threshold (min-p, epsilon, eta) becomes a cut in logit space,
//!   `max + ln(threshold * sum)` (`max + ln(p)` for min-p, which needs no sum): only values within
//!   a small margin of it have their probability computed, the others' side is certain.
//!
//! Semantics are transformers' warpers (`TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`,
//! `TypicalLogitsWarper`, `EpsilonLogitsWarper`, `EtaLogitsWarper`) with two documented choices:
//! - Ties at the boundary are all kept (transformers keeps whichever its sort put first).
//! - NaN logits are never removed (transformers' `scores < threshold` is false for NaN) and take
//!   no part in the reduction.

use crate::error::{Error, Result};

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
        }
    }

    pub fn min_keep(&self) -> u32 {
        match *self {
            Truncation::TopK { min_keep, .. }
            | Truncation::TopP { min_keep, .. }
            | Truncation::MinP { min_keep, .. }
            | Truncation::Typical { min_keep, .. }
            | Truncation::Epsilon { min_keep, .. }
            | Truncation::Eta { min_keep, .. } => min_keep,
        }
    }

    /// The band this rule keeps of `values` (the row as it stands where the rule runs).
    /// `work` is scratch space, reused between calls.
    pub fn band(&self, values: &[f32], work: &mut Vec<(f32, f32)>) -> Band {
        let min_keep = self.min_keep() as usize;
        let floor = |band: Band, work: &mut Vec<(f32, f32)>| Band {
            lo: band.lo.min(kth_largest(values, min_keep, work)),
            hi: band.hi,
        };
        match *self {
            Truncation::TopK { k, min_keep } => Band {
                lo: kth_largest(values, (k.max(min_keep)) as usize, work),
                hi: f32::INFINITY,
            },
            Truncation::MinP { p, .. } => {
                // `p_i >= p * p_max` is `exp(x_i - max) >= p`: the softmax's sum cancels, so
                // min-p needs only the maximum.
                let max = max_of(values);
                if !max.is_finite() {
                    return Band::ALL;
                }
                let cut = max as f64 + (p as f64).ln();
                let lo = smallest_passing(values, cut, |x| (x - max).exp() >= p);
                floor(
                    Band {
                        lo,
                        hi: f32::INFINITY,
                    },
                    work,
                )
            }
            Truncation::Epsilon { epsilon, .. } => {
                let softmax = Softmax::of(values);
                floor(softmax.keep_from(values, epsilon), work)
            }
            Truncation::Eta { epsilon, .. } => {
                let softmax = Softmax::of(values);
                let entropy = softmax.entropy();
                let eta = epsilon.min(epsilon.sqrt() * (-entropy).exp());
                floor(softmax.keep_from(values, eta), work)
            }
            Truncation::TopP { p, min_keep } => top_p(values, p, min_keep as usize, work),
            Truncation::Typical { mass, min_keep } => {
                typical(values, mass, min_keep as usize, work)
            }
        }
    }
}

/// Rows at least this long find a k-th largest value from a sampled pivot (below), shorter ones
/// by selection over the whole row.
const PIVOT_FROM: usize = 8192;

/// The k-th largest non-NaN value (`-inf` when there are fewer than k).
///
/// On long rows and small `k`: a pivot from a strided sample of the row, chosen so that a few
/// times `k` values are expected at or above it; one pass collects those (whole chunks below the
/// pivot are skipped after one vectorized compare) and selection among them gives the exact k-th
/// value. Should fewer than `k` values lie above the pivot (an unlucky sample), the whole row is
/// selected from instead.
fn kth_largest(values: &[f32], k: usize, work: &mut Vec<(f32, f32)>) -> f32 {
    if k == 0 {
        return f32::NEG_INFINITY;
    }
    if k == 1 {
        return max_of(values);
    }
    if values.len() >= PIVOT_FROM && k <= values.len() / 16 {
        if let Some(kth) = kth_by_pivot(values, k, work) {
            return kth;
        }
    }
    work.clear();
    work.extend(values.iter().filter(|x| !x.is_nan()).map(|&x| (x, x)));
    kth_of(work, k)
}

/// The k-th largest of `work`'s keys (`-inf` when there are fewer than k).
fn kth_of(work: &mut [(f32, f32)], k: usize) -> f32 {
    if k == 0 || k > work.len() {
        return f32::NEG_INFINITY;
    }
    let at = work.len() - k;
    let (_, kth, _) = work.select_nth_unstable_by(at, |a, b| a.0.total_cmp(&b.0));
    kth.0
}

fn kth_by_pivot(values: &[f32], k: usize, work: &mut Vec<(f32, f32)>) -> Option<f32> {
    const SAMPLE: usize = 1024;
    let stride = values.len() / SAMPLE;
    work.clear();
    work.extend(
        (0..SAMPLE)
            .map(|i| values[i * stride])
            .filter(|x| !x.is_nan())
            .map(|x| (x, x)),
    );
    // The sample values expected above the k-th, with ample room.
    let rank = (4 * k * work.len() / values.len() + 16).min(work.len());
    let pivot = kth_of(work, rank);
    if pivot == f32::NEG_INFINITY {
        return None;
    }
    collect_at_least(values, pivot, work, |x| (x, x));
    // Everything at or above the pivot in the total order (and, for a pivot of 0, any -0.0): the
    // top of the row, so its k-th largest is the row's.
    (work.len() >= k).then(|| kth_of(work, k))
}

/// Pushes `entry(x)` for every value `x >= pivot` (NaN never), looking into a chunk only when a
/// vectorized count finds such a value in it.
fn collect_at_least(
    values: &[f32],
    pivot: f32,
    work: &mut Vec<(f32, f32)>,
    entry: impl Fn(f32) -> (f32, f32),
) {
    work.clear();
    for chunk in values.chunks(64) {
        let hits: u32 = chunk.iter().map(|&x| (x >= pivot) as u32).sum();
        if hits > 0 {
            work.extend(chunk.iter().filter(|&&x| x >= pivot).map(|&x| entry(x)));
        }
    }
}

/// The largest non-NaN value (`-inf` when there is none), eight lanes at a time.
fn max_of(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            // `x > m` is false for NaN: NaN never wins.
            *m = if x > *m { x } else { *m };
        }
    }
    rest.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// `exp(d)` for `d <= 0` in f32, within about one unit in the last place (Cephes' `expf`:
/// `d = n ln 2 + r`, a degree-6 polynomial in `r`, times `2^n`), written to vectorize; `0` below
/// `-87` (where f32's normal range ends), for `-inf` and for NaN.
#[inline(always)]
fn exp_nonpositive(d: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding 1.5 * 2^23 rounds to an integer in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let in_range = d >= -87.0;
    let d = if in_range { d } else { 0.0 };
    let t = d * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (d - n * 0.693_359_4) - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // n in -126..=0: 2^n is a normal f32 built from its exponent bits.
    let n = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((n + 127) as u32) << 23);
    if in_range {
        e * scale
    } else {
        0.0
    }
}

/// A row's softmax, computed as torch computes it: `exp(x - max) / sum(exp(x - max))`. One pass
/// after the maximum gives the sum and, for the entropy, `sum(exp(d) * d)` (`d = x - max`), each
/// exponential in f32 and the sums in f64.
struct Softmax {
    max: f32,
    sum: f32,
    // The entropy, `ln(sum) - sum(exp(d) * d) / sum`.
    entropy: f32,
}

impl Softmax {
    fn of(values: &[f32]) -> Self {
        let max = max_of(values);
        if max.is_infinite() {
            return Self {
                max,
                sum: 0.0,
                entropy: 0.0,
            };
        }
        // Exponentials a block at a time into a buffer (a map the compiler vectorizes), then
        // their sums in f64, four lanes each.
        let mut sums = [0.0f64; 4];
        let mut weighted = [0.0f64; 4];
        let mut e = [0.0f32; 256];
        let mut ed = [0.0f32; 256];
        for block in values.chunks(256) {
            let (e, ed) = (&mut e[..block.len()], &mut ed[..block.len()]);
            for ((e, ed), &x) in e.iter_mut().zip(ed.iter_mut()).zip(block) {
                let d = x - max;
                *e = exp_nonpositive(d);
                *ed = if *e > 0.0 { *e * d } else { 0.0 };
            }
            for (quad, quad_d) in e.chunks(4).zip(ed.chunks(4)) {
                for lane in 0..quad.len() {
                    sums[lane] += quad[lane] as f64;
                    weighted[lane] += quad_d[lane] as f64;
                }
            }
        }
        let sum: f64 = sums.iter().sum();
        let weighted: f64 = weighted.iter().sum();
        Self {
            max,
            sum: sum as f32,
            entropy: (sum.ln() - weighted / sum) as f32,
        }
    }

    /// Whether the row has a distribution: some finite value, none `+inf`.
    fn is_defined(&self) -> bool {
        self.sum > 0.0
    }

    fn probability(&self, x: f32) -> f32 {
        if self.is_defined() {
            (x - self.max).exp() / self.sum
        } else {
            f32::NAN
        }
    }

    /// The band of values whose probability is at least `threshold`: probability is monotone in
    /// the value, so it starts at the smallest such value.
    ///
    /// The probability is computed only for values near the cut, `max + ln(threshold * sum)`:
    /// further from it than the margin (a thousand times the error of the f32 subtraction and
    /// exponential), the comparison's outcome is certain.
    fn keep_from(&self, values: &[f32], threshold: f32) -> Band {
        if !self.is_defined() {
            return Band::ALL;
        }
        let cut = self.max as f64 + (threshold as f64 * self.sum as f64).ln();
        Band {
            lo: smallest_passing(values, cut, |x| self.probability(x) >= threshold),
            hi: f32::INFINITY,
        }
    }

    /// `-sum(p * log p)`, the entropy of the row's distribution.
    fn entropy(&self) -> f32 {
        if self.is_defined() {
            self.entropy
        } else {
            0.0
        }
    }
}

/// The smallest value for which `passes` holds (`+inf` when none does), for a `passes` that is
/// monotone in the value and changes near `cut` (a value in logit units): values further from
/// the cut than the margin (a thousand times the error of an f32 subtraction and exponential)
/// are decided by comparison alone, the few near it by `passes`.
fn smallest_passing(values: &[f32], cut: f64, passes: impl Fn(f32) -> bool) -> f32 {
    if !cut.is_finite() {
        return values
            .iter()
            .filter(|&&x| passes(x))
            .fold(f32::INFINITY, |m, &x| m.min(x));
    }
    let margin = 1e-3 + 2e-6 * cut.abs();
    let certain = (cut + margin) as f32;
    let near = (cut - margin) as f32;
    let mut lanes = [f32::INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x >= certain && x < *m { x } else { *m };
        }
    }
    let mut lo = rest
        .iter()
        .filter(|&&x| x >= certain)
        .chain(&lanes)
        .fold(f32::INFINITY, |m, &x| m.min(x));
    for chunk in values.chunks(64) {
        let hits: u32 = chunk
            .iter()
            .map(|&x| (x >= near && x < certain) as u32)
            .sum();
        if hits > 0 {
            for &x in chunk.iter().filter(|&&x| x >= near && x < certain) {
                if x < lo && passes(x) {
                    lo = x;
                }
            }
        }
    }
    lo
}

/// Candidate counts tried in turn before a whole-row sort: most rows put their mass on a few
/// hundred tokens.
const CANDIDATES: [usize; 3] = [256, 4096, 32768];

/// Fills `work` with at least the `m` largest non-NaN values (every value tied with the m-th
/// too), largest first, keyed by the negated value.
fn largest_sorted(values: &[f32], m: usize, work: &mut Vec<(f32, f32)>) {
    let kth = kth_largest(values, m, work);
    collect_at_least(values, kth, work, |x| (-x, x));
    work.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
}

fn top_p(values: &[f32], p: f32, min_keep: usize, work: &mut Vec<(f32, f32)>) -> Band {
    let softmax = Softmax::of(values);
    if !softmax.is_defined() {
        return Band::ALL;
    }
    let total = values.iter().filter(|x| !x.is_nan()).count();
    for m in CANDIDATES.into_iter().chain([total]) {
        largest_sorted(values, m.min(total), work);
        let sorted = work.len();
        // Keep a token while the mass of the tokens above it is below p.
        let mut above = 0.0f64;
        for (rank, &(_, x)) in work.iter().enumerate() {
            if above >= p as f64 && rank >= min_keep {
                return Band {
                    lo: work[rank - 1].1,
                    hi: f32::INFINITY,
                };
            }
            above += softmax.probability(x) as f64;
        }
        if sorted >= total {
            break;
        }
    }
    Band::ALL
}

/// Orders `work` (pairs of sort key and value) so that its first `m` entries are the `m` smallest
/// keys, sorted; returns how many are sorted (`m`, or all of them).
fn smallest_sorted(work: &mut [(f32, f32)], m: usize) -> usize {
    let m = m.min(work.len());
    if m < work.len() {
        work.select_nth_unstable_by(m, |a, b| a.0.total_cmp(&b.0));
    }
    work[..m].sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    m
}

fn typical(values: &[f32], mass: f32, min_keep: usize, work: &mut Vec<(f32, f32)>) -> Band {
    let softmax = Softmax::of(values);
    if !softmax.is_defined() {
        return Band::ALL;
    }
    let entropy = softmax.entropy() as f64;
    let log_sum = (softmax.sum as f64).ln();
    work.clear();
    work.extend(
        values
            .iter()
            .filter(|x| !x.is_nan() && **x != f32::NEG_INFINITY)
            .map(|&x| {
                let log_p = (x - softmax.max) as f64 - log_sum;
                ((-log_p - entropy).abs() as f32, x)
            }),
    );
    let total = work.len();
    if total == 0 {
        return Band::ALL;
    }
    for m in CANDIDATES.into_iter().chain([total]) {
        let sorted = smallest_sorted(work, m);
        // transformers keeps the tokens up to and including the first whose cumulative mass
        // reaches `mass`, and every token of a smaller or equal shifted score.
        let mut cumulative = 0.0f64;
        let mut last = None;
        for (rank, &(_, x)) in work[..sorted].iter().enumerate() {
            cumulative += softmax.probability(x) as f64;
            if cumulative >= mass as f64 {
                last = Some(rank);
                break;
            }
        }
        if last.is_none() && sorted < total {
            continue;
        }
        let last = last.unwrap_or(sorted - 1).max(min_keep.min(sorted) - 1);
        let cut = work[last].0;
        let kept = work[..sorted]
            .iter()
            .take_while(|(s, _)| *s <= cut)
            .map(|&(_, x)| x);
        let (lo, hi) = kept.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        return Band { lo, hi };
    }
    Band::ALL
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

    /// A long row (the fast paths start at 8,192 values) from a seed: model-like values, or
    /// values on a coarse grid (bf16-like ties), with NaN, infinities and zeros of both signs.
    fn long_row(seed: u64, len: usize, coarse: bool) -> Vec<f32> {
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        (0..len)
            .map(|i| {
                let u = next();
                let x = match i % 997 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => -0.0,
                    3 => 0.0,
                    _ if u < 0.001 => 8.0 + next() * 8.0,
                    _ => (next() + next() + next() - 1.5) * 6.0 - 2.0,
                };
                if coarse {
                    (x * 4.0).round() / 4.0
                } else {
                    x
                }
            })
            .collect()
    }

    #[test]
    fn kth_largest_by_pivot_equals_selection_over_the_whole_row() {
        for (seed, len, coarse) in [(1, 8192, false), (2, 151_936, false), (3, 151_936, true)] {
            let x = long_row(seed, len, coarse);
            let mut all: Vec<(f32, f32)> =
                x.iter().filter(|v| !v.is_nan()).map(|&v| (v, v)).collect();
            for k in [1, 2, 3, 50, 257, 4096, len / 16, len / 2] {
                let want = kth_of(&mut all, k);
                let got = kth_largest(&x, k, &mut vec![]);
                assert_eq!(got.to_bits(), want.to_bits(), "len {len} k {k}");
            }
        }
    }

    #[test]
    fn keep_from_near_the_cut_equals_the_probability_of_every_value() {
        for (seed, len, coarse) in [(4, 151_936, false), (5, 20_000, true)] {
            let x = long_row(seed, len, coarse);
            let softmax = Softmax::of(&x);
            for threshold in [1e-9f32, 1e-6, 3e-4, 0.01, 0.3, 0.9, 1.0, 2.0] {
                let got = softmax.keep_from(&x, threshold);
                let lo = x
                    .iter()
                    .filter(|&&v| softmax.probability(v) >= threshold)
                    .fold(f32::INFINITY, |m, &v| m.min(v));
                assert_eq!(got.lo.to_bits(), lo.to_bits(), "threshold {threshold}");
            }
            let max = max_of(&x);
            for p in [0.0f32, 1e-7, 1e-3, 0.05, 0.5, 1.0] {
                let got = Truncation::MinP { p, min_keep: 1 }.band(&x, &mut vec![]);
                let lo = x
                    .iter()
                    .filter(|&&v| (v - max).exp() >= p)
                    .fold(f32::INFINITY, |m, &v| m.min(v));
                assert_eq!(got.lo.to_bits(), lo.to_bits(), "min_p {p}");
            }
        }
    }

    #[test]
    fn vectorized_exp_is_within_two_ulps_and_zero_outside_the_range() {
        let mut worst = 0u32;
        for i in 0..=2_000_000 {
            let d = -87.0 * i as f32 / 2_000_000.0;
            let want = (d as f64).exp() as f32;
            let got = exp_nonpositive(d);
            worst = worst.max(got.to_bits().abs_diff(want.to_bits()));
        }
        assert!(worst <= 2, "{worst} ulps");
        for d in [f32::NEG_INFINITY, f32::NAN, -87.5, -1e30] {
            assert_eq!(exp_nonpositive(d), 0.0);
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    #[test]
    fn softmax_sums_and_entropy_agree_with_f64() {
        let x = long_row(6, 151_936, false);
        let softmax = Softmax::of(&x);
        let finite: Vec<f64> = x
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| v as f64)
            .collect();
        let max = finite.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = finite.iter().map(|&v| (v - max).exp()).sum();
        let entropy: f64 = -finite
            .iter()
            .map(|&v| {
                let log_p = v - max - sum.ln();
                log_p.exp() * log_p
            })
            .sum::<f64>();
        assert!((softmax.sum as f64 / sum - 1.0).abs() < 1e-6);
        assert!((softmax.entropy as f64 - entropy).abs() < 1e-5 * entropy.max(1.0));
    }

    #[test]
    fn long_rows_keep_what_a_full_sort_keeps() {
        let rules = [
            Truncation::TopK { k: 50, min_keep: 1 },
            Truncation::TopP {
                p: 0.9,
                min_keep: 1,
            },
            Truncation::TopP {
                p: 0.999,
                min_keep: 3,
            },
            Truncation::MinP {
                p: 0.05,
                min_keep: 1,
            },
            Truncation::MinP {
                p: 0.5,
                min_keep: 5,
            },
            Truncation::Epsilon {
                epsilon: 3e-4,
                min_keep: 1,
            },
            Truncation::Eta {
                epsilon: 3e-4,
                min_keep: 2,
            },
            Truncation::Typical {
                mass: 0.9,
                min_keep: 1,
            },
        ];
        for seed in 10..14 {
            // Distinct finite values, so the sorted reference is unambiguous.
            let mut x = long_row(seed, 60_000, false);
            x.retain(|v| v.is_finite());
            x.sort_unstable_by(f32::total_cmp);
            x.dedup();
            let mut state = seed;
            for i in (1..x.len()).rev() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                x.swap(i, (state >> 33) as usize % (i + 1));
            }
            for rule in rules {
                let band = rule.band(&x, &mut vec![]);
                let want = reference(&rule, &x);
                let differ = (0..x.len())
                    .filter(|&i| band.removes(x[i]) == want[i])
                    .count();
                assert!(differ <= 1, "{rule:?}: {differ} of {} differ", x.len());
            }
        }
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
