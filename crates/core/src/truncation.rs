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
//! `truncation/simd.rs` instead (the same weights, sixteen or eight at a time; the level is
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
//! # Files
//!
//! Each rule's row math is one file beside this one, a `band` function that [`Truncation::band`]
//! dispatches to: `top_k.rs`, `top_p.rs`, `min_p.rs`, `typical.rs`, `epsilon.rs` (epsilon and
//! eta), `top_n_sigma.rs`, `top_a.rs`, `tail_free.rs`, `xtc.rs` and `mirostat.rs` (versions 1 and
//! 2). What they share: `band.rs` ([`Band`], [`Work`]), `softmax.rs` (the fixed-point
//! [`Softmax`], the row's maximum, [`weight_sum`]), `select.rs` (the k-th largest value, the
//! values at or above a floor, the lowest value whose `q` reaches a threshold, the quickselect by
//! weight), `gpu_shared.rs` (the arithmetic a GPU reproduces) and `simd.rs` with `simd/avx2.rs`
//! (the AVX-512 and AVX2 mass passes). The kinds that truncate (in `crate::processors`) decide
//! which rule runs with which parameters; nothing here imports them.
//!
//! # Arithmetic: the same band on every machine
//!
//! A band is a function of the row's values alone, computed with the arithmetic of
//! [`gpu_shared`] (an IEEE-only `exp`, fixed-point sums, order keys), which a GPU reproduces bit
//! for bit whatever order it visits the values in; that module says how, and the CUDA crate
//! writes its kernel's constants from it. This module is the CPU's selection.

mod band;
mod epsilon;
mod gpu_shared;
mod min_p;
mod mirostat;
mod p_less;
mod select;
#[cfg(target_arch = "x86_64")]
mod simd;
mod softmax;
mod tail_free;
mod top_a;
mod top_h;
mod top_k;
mod top_n_sigma;
mod top_p;
mod typical;
mod xtc;

pub use band::{Band, Work};
pub use gpu_shared::{
    exp, fixed, fixed_square, from_order_key, ln, order_key, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2_E,
    EXP_MAX, EXP_MIN, EXP_POLY, EXP_SHIFTER, FIXED_BITS, LN_LN2_HI, LN_LN2_LO, LN_POLY,
};
pub(crate) use select::{
    collect_from, each_found, kth_largest, kth_of, largest_first, sampled_floor, SPAN,
};
pub(crate) use softmax::{heavy, heavy_below, largest, lowest_reaching_near, near_max, weigh};
pub use softmax::{weight_sum, Softmax};

use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
pub(crate) use simd::{available as simd_available, finite_lane_sums, smallest_above_and_between};

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
    /// P-less sampling: values whose probability is at least the sum of the squared
    /// probabilities (no parameter but `min_keep`).
    PLess { min_keep: u32, normalized: bool },
    /// Top-H: the largest values while their cumulative entropy stays within `top_h` times the
    /// entropy of the 100 largest (transformers' `TopHLogitsWarper`).
    TopH { top_h: f32 },
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
            Truncation::PLess { .. } => ("min_tokens_to_keep", 1.0, true),
            Truncation::TopH { top_h } => ("top_h", top_h, top_h > 0.0 && top_h <= 1.0),
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
            Truncation::PLess { .. } => ">= 1",
            Truncation::TopH { .. } => "0 < top_h <= 1",
            Truncation::TailFree { .. } => "0 <= z <= 1",
            Truncation::Xtc { .. } => "0 <= threshold <= 1",
            Truncation::MirostatV1 { .. } | Truncation::MirostatV2 { .. } => "of finite numbers",
        }
    }

    /// Whether only the CPU path has this rule (the device's band kernel has top-k, top-p, min-p,
    /// typical, epsilon, eta, top-a, XTC, mirostat 2 and p-less).
    pub fn on_cpu_only(&self) -> bool {
        matches!(
            self,
            Truncation::TopNSigma { .. }
                | Truncation::TopH { .. }
                | Truncation::TailFree { .. }
                | Truncation::MirostatV1 { .. }
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
            | Truncation::PLess { min_keep, .. }
            | Truncation::TailFree { min_keep, .. }
            | Truncation::Xtc { min_keep, .. } => min_keep,
            Truncation::TopNSigma { .. }
            | Truncation::TopH { .. }
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

    /// The band this rule keeps of a row whose values other than `-inf` are `values`, at the
    /// ascending indices `at` (every other value `-inf`): among `values`, it keeps what the
    /// rule's band over the whole row keeps. Every rule weighs only the values that are not
    /// `-inf` (`-inf` weighs nothing in the fixed-point sums, and is never counted or kept), and
    /// the float sums some rules take (p-less's) run over them in index order; top-n-sigma's
    /// partial sums take each value by its index ([`top_n_sigma::band_at`]). The observing rules
    /// (mirostat) keep probabilities by token: not for this.
    pub(crate) fn band_at(&self, values: &[f32], at: &[u32], work: &mut Work) -> Band {
        match *self {
            Truncation::TopNSigma { n } => top_n_sigma::band_at(values, at, n),
            _ => self.band(values, work),
        }
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
            Truncation::TopK { k, min_keep } => top_k::band(values, k, min_keep, work),
            Truncation::TopP { p, .. } => top_p::band(values, p, min_keep, work),
            Truncation::MinP { p, .. } => min_p::band(values, p, min_keep, work),
            Truncation::Typical { mass, .. } => typical::band(values, mass, min_keep, work),
            Truncation::Epsilon { .. } | Truncation::Eta { .. } => {
                epsilon::band(values, self, min_keep, work)
            }
            Truncation::TopNSigma { n } => top_n_sigma::band(values, n),
            Truncation::TopA { a, .. } => top_a::band(values, a, min_keep, work),
            Truncation::PLess { normalized, .. } => {
                p_less::band(values, min_keep, normalized, work)
            }
            Truncation::TopH { top_h } => top_h::band(values, top_h, work),
            Truncation::TailFree { z, .. } => tail_free::band(values, z, min_keep, work),
            Truncation::Xtc { threshold, .. } => xtc::band(values, threshold, min_keep, work),
            Truncation::MirostatV2 { mu, .. } => mirostat::band_v2(values, mu, work),
            Truncation::MirostatV1 { mu, m, n_vocab, .. } => {
                mirostat::band_v1(values, mu, m, n_vocab, work)
            }
        }
    }
}

/// Uniform values in [0, 1) from a xorshift64 generator: the tests' reproducible rows.
#[cfg(test)]
pub(crate) fn uniform(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    }
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
            | Truncation::PLess { .. }
            | Truncation::TopH { .. }
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
            return typical::by_sorting(values, &softmax, mass, min_keep, &mut vec![]);
        }
        let lo = match *rule {
            Truncation::TopK { .. }
            | Truncation::Typical { .. }
            | Truncation::TopNSigma { .. }
            | Truncation::TopA { .. }
            | Truncation::PLess { .. }
            | Truncation::TopH { .. }
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

    /// Long rows whose mass sits near the maximum (as a model's does): a normal tail or a Zipf
    /// shape, on a grid (ties) or not, with NaN, `-inf` and offsets, where [`heavy`]'s pass holds
    /// every value that weighs anything.
    fn model_row() -> impl Strategy<Value = Vec<f32>> {
        (16_000usize..24_000, 0u8..4, any::<u64>(), -50.0f32..50.0).prop_map(
            |(len, shape, seed, offset)| {
                let mut uniform = super::uniform(seed | 1);
                (0..len)
                    .map(|i| {
                        let normal = (0..4).map(|_| uniform()).sum::<f32>() * 1.732 - 3.464;
                        let x = match shape {
                            0 => normal * 16.0,
                            1 => (normal * 16.0 * 4.0).round() / 4.0,
                            2 => 3.0 * (-1.1 * ((i + 1) as f32).ln() + 0.5 * normal),
                            _ => normal * 4.0 - 30.0 + if i % 997 == 0 { 40.0 } else { 0.0 },
                        };
                        match (uniform() * 400.0) as u32 {
                            0 => f32::NAN,
                            1 => f32::NEG_INFINITY,
                            _ => x + offset,
                        }
                    })
                    .collect()
            },
        )
    }

    /// On a model's row of 151,936 (a normal tail of deviation 16; a Zipf shape, shuffled) the
    /// values near the maximum are few: [`heavy`] takes it, with the whole row's sums.
    #[test]
    fn heavy_takes_a_models_row() {
        if !crate::cpu::avx2_fma() {
            eprintln!("skipped: the values near the maximum are collected with AVX2 and FMA");
            return;
        }
        let mut uniform = super::uniform(0x2545_f491_4f6c_dd1d);
        let mut normal = || (0..12).map(|_| uniform()).sum::<f32>() - 6.0;
        let peaked: Vec<f32> = (0..151_936).map(|_| normal() * 16.0).collect();
        let mut zipf: Vec<f32> = (1..=151_936)
            .map(|rank| 3.0 * (-1.1 * (rank as f32).ln() + 0.5 * normal()))
            .collect();
        for i in (1..zipf.len()).rev() {
            zipf.swap(i, (uniform() * (i + 1) as f32) as usize % (i + 1));
        }
        let mut work = vec![];
        for row in [peaked, zipf] {
            let softmax = Softmax::of(&row);
            for entropy in [false, true] {
                let near = heavy(&row, entropy, &mut work, |near, s, _| Some((s, near.len())));
                let (sums, count) = near.expect("taken");
                let entropy_sum = if entropy { softmax.entropy_sum } else { 0 };
                assert_eq!(
                    sums,
                    Softmax {
                        entropy_sum,
                        ..softmax
                    }
                );
                assert!(count < 151_936 / 16);
            }
        }
    }

    /// Top-p and typical on flat rows of Qwen3's vocab, where most of the row weighs something:
    /// the bucket counted over the window a sample suggests, or over the whole row when the
    /// sample misleads (every sampled value far from the rest), gives the definition's band.
    #[test]
    fn flat_rows_select_the_definitions_bands_through_the_sampled_window() {
        let mut uniform = super::uniform(0x9e37_79b9_7f4a_7c15);
        let mut normal = || (0..12).map(|_| uniform()).sum::<f32>() - 6.0;
        let len = 151_936;
        let normal_row: Vec<f32> = (0..len).map(|_| normal()).collect();
        let wide_row: Vec<f32> = (0..len).map(|i| normal_row[i] * 2.0 - 1.0).collect();
        // The sampled values (every 148th, from 0) sit far above the rest: the sample puts every
        // boundary in the first buckets, where the row's is not.
        let stride = len / 1024;
        let misleading: Vec<f32> = (0..len)
            .map(|i| if i % stride == 0 { 6.0 } else { normal_row[i] })
            .collect();
        for row in [normal_row, wide_row, misleading] {
            for p in [0.05f32, 0.5, 0.9, 0.95, 0.999] {
                for rule in [
                    Truncation::TopP { p, min_keep: 1 },
                    Truncation::Typical {
                        mass: p,
                        min_keep: 1,
                    },
                ] {
                    let fast = rule.band(&row, &mut vec![]);
                    let slow = band_by_definition(&rule, &row);
                    assert_eq!(
                        (fast.lo.to_bits(), fast.hi.to_bits()),
                        (slow.lo.to_bits(), slow.hi.to_bits()),
                        "{rule:?}"
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Where [`heavy`] holds every value that weighs anything, the rules that select from it
        /// keep what their definitions keep over the whole row (the same bits for top-p's value).
        #[test]
        fn bands_from_the_heavy_values_are_the_whole_rows(
            row in model_row(),
            p in 0.01f32..1.0,
            mass in 0.01f32..0.99,
            epsilon in 1e-6f32..0.1,
            a in 0.001f32..1.0,
            threshold in 0.001f32..0.5,
            mu in 0.5f32..12.0,
        ) {
            let mut work = vec![];
            let softmax = Softmax::of(&row);
            // The sums from the values that weigh anything are the whole row's, when they are few
            // enough (`heavy_takes_a_models_row`).
            let near = |entropy, work: &mut Work| heavy(&row, entropy, work, |_, s, _| Some(s));
            if let Ok(weights_only) = near(false, &mut work) {
                prop_assert_eq!(weights_only, Softmax { entropy_sum: 0, ..softmax });
            }
            if let Ok(both) = near(true, &mut work) {
                prop_assert_eq!(both, softmax);
            }
            let kept = |band: Band| row.iter().map(|&x| !band.removes(x)).collect::<Vec<_>>();
            // The smallest value (not `-inf`) whose `q` reaches `t`, over the whole row.
            let lowest = |t: f32| {
                row.iter()
                    .filter(|&&x| x != f32::NEG_INFINITY && softmax.q(x) >= t)
                    .fold(f32::INFINITY, |m, &x| m.min(x))
            };
            let upward = |lo: f32| Band { lo: lo.min(softmax.max), hi: f32::INFINITY };
            for rule in [
                Truncation::TopP { p, min_keep: 1 },
                Truncation::Typical { mass, min_keep: 1 },
                Truncation::Typical { mass, min_keep: 3 },
                Truncation::Epsilon { epsilon, min_keep: 1 },
                Truncation::Eta { epsilon, min_keep: 1 },
            ] {
                let (fast, slow) = (rule.band(&row, &mut work), band_by_definition(&rule, &row));
                prop_assert_eq!(kept(fast), kept(slow), "{:?}", rule);
                if let Truncation::TopP { .. } = rule {
                    prop_assert_eq!(fast.lo.to_bits(), slow.lo.to_bits());
                }
            }
            let top_a = Truncation::TopA { a, min_keep: 1 };
            let by_definition = upward(lowest(a / softmax.scale()));
            prop_assert_eq!(kept(top_a.band(&row, &mut work)), kept(by_definition), "{:?}", top_a);
            let mirostat = Truncation::MirostatV2 { mu, key: 0 };
            let t = (softmax.scale() as f64 * (-(mu as f64)).exp2()) as f32;
            prop_assert_eq!(kept(mirostat.band(&row, &mut work)), kept(upward(lowest(t))), "{:?}", mirostat);
            let xtc = Truncation::Xtc { threshold, min_keep: 1 };
            let v = lowest(threshold * softmax.scale());
            let by_definition = match row.iter().any(|&x| x > v) {
                true => Band { lo: f32::NEG_INFINITY, hi: v },
                false => Band::ALL,
            };
            prop_assert_eq!(kept(xtc.band(&row, &mut work)), kept(by_definition), "{:?}", xtc);
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
