//! Truncation rules: keep the most likely tokens of a row, set the others to `-inf`.
//!
//! Each rule needs a reduction over the row (a maximum, a softmax sum, an entropy, a k-th largest
//! value) before it can say which tokens go. The tokens a rule keeps always form one interval of
//! values (for top-k, top-p, min-p, epsilon and eta: every value from some threshold up; for
//! typical: a band around the entropy), so a rule resolves to a [`Band`], and applying it is an
//! element-wise compare in the row's one pass. Selection uses partial selection
//! (`select_nth_unstable`), never a sort of the whole row, except for top-p and typical on rows
//! whose mass is spread over most of the vocab.
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
                let softmax = Softmax::of(values);
                let threshold = p * softmax.probability(softmax.max);
                floor(softmax.keep_from(values, threshold), work)
            }
            Truncation::Epsilon { epsilon, .. } => {
                let softmax = Softmax::of(values);
                floor(softmax.keep_from(values, epsilon), work)
            }
            Truncation::Eta { epsilon, .. } => {
                let softmax = Softmax::of(values);
                let entropy = softmax.entropy(values);
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

/// The k-th largest non-NaN value (`-inf` when there are fewer than k).
fn kth_largest(values: &[f32], k: usize, work: &mut Vec<(f32, f32)>) -> f32 {
    work.clear();
    work.extend(values.iter().filter(|x| !x.is_nan()).map(|&x| (x, x)));
    if k == 0 || k > work.len() {
        return f32::NEG_INFINITY;
    }
    let at = work.len() - k;
    let (_, kth, _) = work.select_nth_unstable_by(at, |a, b| a.0.total_cmp(&b.0));
    kth.0
}

/// A row's softmax, computed as torch computes it: `exp(x - max) / sum(exp(x - max))`.
struct Softmax {
    max: f32,
    sum: f32,
}

impl Softmax {
    fn of(values: &[f32]) -> Self {
        let max = values
            .iter()
            .filter(|x| !x.is_nan())
            .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let sum = if max.is_infinite() {
            0.0
        } else {
            values
                .iter()
                .filter(|x| !x.is_nan())
                .map(|&x| ((x - max) as f64).exp())
                .sum::<f64>() as f32
        };
        Self { max, sum }
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
    fn keep_from(&self, values: &[f32], threshold: f32) -> Band {
        if !self.is_defined() {
            return Band::ALL;
        }
        let lo = values
            .iter()
            .filter(|&&x| self.probability(x) >= threshold)
            .fold(f32::INFINITY, |m, &x| m.min(x));
        Band {
            lo,
            hi: f32::INFINITY,
        }
    }

    /// `-sum(p * log p)`, the entropy of the row's distribution.
    fn entropy(&self, values: &[f32]) -> f32 {
        if !self.is_defined() {
            return 0.0;
        }
        let log_sum = (self.sum as f64).ln();
        -values
            .iter()
            .filter(|x| !x.is_nan() && **x != f32::NEG_INFINITY)
            .map(|&x| {
                let log_p = (x - self.max) as f64 - log_sum;
                log_p.exp() * log_p
            })
            .sum::<f64>() as f32
    }
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

/// Candidate counts tried in turn before a whole-row sort: most rows put their mass on a few
/// hundred tokens.
const CANDIDATES: [usize; 3] = [256, 4096, 32768];

fn top_p(values: &[f32], p: f32, min_keep: usize, work: &mut Vec<(f32, f32)>) -> Band {
    let softmax = Softmax::of(values);
    if !softmax.is_defined() {
        return Band::ALL;
    }
    work.clear();
    // Largest first: keyed by the negated value.
    work.extend(values.iter().filter(|x| !x.is_nan()).map(|&x| (-x, x)));
    let total = work.len();
    for m in CANDIDATES.into_iter().chain([total]) {
        let sorted = smallest_sorted(work, m);
        // Keep a token while the mass of the tokens above it is below p.
        let mut above = 0.0f64;
        for (rank, &(_, x)) in work[..sorted].iter().enumerate() {
            if above >= p as f64 && rank >= min_keep {
                return Band {
                    lo: work[rank - 1].1,
                    hi: f32::INFINITY,
                };
            }
            above += softmax.probability(x) as f64;
        }
        if sorted == total {
            break;
        }
    }
    Band::ALL
}

fn typical(values: &[f32], mass: f32, min_keep: usize, work: &mut Vec<(f32, f32)>) -> Band {
    let softmax = Softmax::of(values);
    if !softmax.is_defined() {
        return Band::ALL;
    }
    let entropy = softmax.entropy(values) as f64;
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
