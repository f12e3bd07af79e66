//! A plan whose first truncation is a top-k that keeps few tokens costs what that top-k leaves:
//! once it has cut the row, the edits after it (later truncations included) run on its survivors
//! alone, and the row is written once (`-inf`, then the survivors). llama.cpp's default chain (top-k
//! 40, top-p, min-p, temperature) then reads the row twice and writes it once instead of a pass
//! per kind, with the results of the full passes bit for bit:
//!
//! - a logit the top-k removed is `-inf` from there on: every edit allowed after it keeps `-inf`
//!   (a positive finite temperature, a finite bias, a positive finite penalty, a mask, a ban, a
//!   scaled raise of a finite logit, a truncation), except a `Set`, whose token is kept with the
//!   survivors;
//! - every later truncation is one the kernels carry (top-k, top-p, min-p, typical, epsilon, eta),
//!   whose band depends only on the finite values of the row (the `-inf` ones weigh nothing in its
//!   fixed-point sums, and count for nothing it keeps): resolved from the survivors, it keeps the
//!   same ones. Rules with order-dependent float sums or observations are not taken.
//!
//! Any other plan, or a top-k whose survivors (ties included) are more than an eighth of the row,
//! takes the full passes.

use super::{in_halves, Band, Edit, Fill, RowPlan};
use crate::kernels;
use crate::logit::Logit;

impl RowPlan {
    /// Carries out the (validated) plan on `row`, reading `src` when given (else `row` itself),
    /// when its first truncation is a top-k that keeps few tokens and every edit after it allows
    /// the survivors' path. Returns false, having changed nothing, otherwise.
    pub(super) fn apply_on_survivors<T: Logit>(
        &mut self,
        src: Option<&[T]>,
        row: &mut [T],
        fill: Fill,
    ) -> bool {
        let Some(cut) = self.survivor_cut(row.len()) else {
            return false;
        };
        let Edit::Truncate(top_k) = self.edits[cut] else {
            unreachable!("survivor_cut names a truncation")
        };
        // The values the top-k reads: the row, or a copy with the edits before it applied.
        let mut scratch = std::mem::take(&mut self.values);
        let band = {
            let input: &[T] = src.unwrap_or(row);
            let read: &[f32] = match (cut, T::as_f32(input)) {
                (0, Some(values)) => values,
                _ => {
                    let mut copy = input.to_vec();
                    self.bands.clear();
                    self.run(0..cut, &mut copy, Fill::Cached);
                    scratch.clear();
                    scratch.extend(copy.iter().map(|x| x.to_f32()));
                    &scratch
                }
            };
            let band = top_k.band(read, &mut self.selection);
            collect_kept(read, band, &mut self.survivors);
            band
        };
        self.values = scratch;
        if self.survivors.len() > row.len() / 8 {
            return false;
        }
        let revived = self.edits[cut + 1..].iter().filter_map(|edit| match *edit {
            Edit::Set { token, .. } => Some(token),
            _ => None,
        });
        let before = self.survivors.len();
        self.survivors.extend(revived);
        if self.survivors.len() > before {
            self.survivors.sort_unstable();
            self.survivors.dedup();
        }
        self.bands.clear();
        self.shapes.clear();
        self.observations.clear();
        self.bands.push((cut, band));
        let input: &[T] = src.unwrap_or(row);
        let mut kept: Vec<T> = self
            .survivors
            .iter()
            .map(|&i| self.fold(0..cut + 1, i as usize, input[i as usize]))
            .collect();
        for at in cut + 1..self.edits.len() {
            if let Edit::Truncate(rule) = self.edits[at] {
                self.values.clear();
                self.values.extend(kept.iter().map(|x| x.to_f32()));
                let band = rule.band(&self.values, &mut self.selection);
                self.bands.push((at, band));
            }
            for (value, &i) in kept.iter_mut().zip(&self.survivors) {
                *value = self.step(at, i as usize, *value);
            }
        }
        match fill {
            Fill::Cached => in_halves(row, |_, part| part.fill(T::NEG_INFINITY)),
            Fill::Streaming => in_halves(row, |_, part| {
                kernels::fill_streaming(part, T::NEG_INFINITY)
            }),
        }
        for (&i, &value) in self.survivors.iter().zip(&kept) {
            row[i as usize] = value;
        }
        true
    }

    /// The index of the plan's first truncation when the survivors' path can take the plan on a
    /// row of `len` logits: a top-k keeping at most a sixteenth of the row, nothing before it that
    /// forces or reshapes, and after it only edits that keep a removed logit `-inf` (a `Set`
    /// aside) and truncations the kernels carry; at least one edit after it.
    pub(super) fn survivor_cut(&self, len: usize) -> Option<usize> {
        const MIN_LEN: usize = 4096;
        if len < MIN_LEN {
            return None;
        }
        let cut = self
            .edits
            .iter()
            .position(|e| matches!(e, Edit::Truncate(_)))?;
        let Edit::Truncate(rule @ crate::Truncation::TopK { k, min_keep }) = self.edits[cut] else {
            return None;
        };
        let keeps = k.max(min_keep) as usize;
        if rule.observes() || keeps.saturating_mul(16) > len || cut + 1 == self.edits.len() {
            return None;
        }
        let before = self.edits[..cut].iter().all(|e| {
            !matches!(
                e,
                Edit::Force { .. }
                    | Edit::ForceIf { .. }
                    | Edit::Reshape(_)
                    | Edit::AddScaledFrom { .. }
                    | Edit::Whole(_)
                    | Edit::BiasLargest { .. }
            )
        });
        let after = self.edits[cut + 1..].iter().all(|e| match *e {
            Edit::Scale { temperature } => temperature.is_finite() && temperature > 0.0,
            Edit::Bias { bias, .. } => bias.is_finite(),
            Edit::Penalty { penalty, .. } => penalty.is_finite() && penalty > 0.0,
            Edit::Ban { .. } | Edit::Mask(_) | Edit::AddScaledAbs { .. } | Edit::Set { .. } => true,
            Edit::Truncate(rule) => !rule.on_cpu_only() && !rule.observes(),
            Edit::Force { .. }
            | Edit::ForceIf { .. }
            | Edit::Reshape(_)
            | Edit::AddScaledFrom { .. }
            | Edit::Whole(_) => false,
            Edit::BiasLargest { .. } => false,
        });
        (before && after).then_some(cut)
    }
}

/// The indices of the values of `row` that `band` keeps and that are not `-inf` (NaN is kept), in
/// order.
fn collect_kept(row: &[f32], band: Band, kept: &mut Vec<u32>) {
    kept.clear();
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { collect_kept_avx2(row, band, kept) };
    }
    collect_kept_portable(row, band, kept, 0);
}

fn collect_kept_portable(row: &[f32], band: Band, kept: &mut Vec<u32>, start: u32) {
    let keeps = |x: f32| !band.removes(x) && x != f32::NEG_INFINITY;
    kept.extend(
        (0..row.len() as u32)
            .filter(|&i| keeps(row[i as usize]))
            .map(|i| start + i),
    );
}

/// [`collect_kept`] 16 values at a time: three compares into a bit mask (each true for NaN), then
/// only the kept values visited.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn collect_kept_avx2(row: &[f32], band: Band, kept: &mut Vec<u32>) {
    use std::arch::x86_64::*;
    let (lo, hi, minus_inf) = (
        _mm256_set1_ps(band.lo),
        _mm256_set1_ps(band.hi),
        _mm256_set1_ps(f32::NEG_INFINITY),
    );
    let mask = |x: __m256| {
        let inside = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_NLT_UQ>(x, lo),
            _mm256_cmp_ps::<_CMP_NGT_UQ>(x, hi),
        );
        _mm256_movemask_ps(_mm256_and_ps(
            inside,
            _mm256_cmp_ps::<_CMP_NEQ_UQ>(x, minus_inf),
        )) as u32
    };
    let blocks = row.chunks_exact(16);
    let rest = blocks.remainder();
    for (b, block) in blocks.enumerate() {
        // SAFETY: `block` holds 16 f32.
        let (x, y) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        let mut bits = mask(x) | mask(y) << 8;
        while bits != 0 {
            kept.push((b * 16) as u32 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    collect_kept_portable(rest, band, kept, (row.len() - rest.len()) as u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_collection_keeps_what_the_portable_one_keeps() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            1.0,
            -1.0,
        ];
        let row: Vec<f32> = (0..1000u32)
            .map(|i| match i.wrapping_mul(2_654_435_761) % 11 {
                n if (n as usize) < specials.len() => specials[n as usize],
                n => n as f32 - 8.0,
            })
            .collect();
        for band in [
            Band::ALL,
            Band {
                lo: 0.0,
                hi: f32::INFINITY,
            },
            Band { lo: -1.0, hi: 1.0 },
            Band { lo: 2.5, hi: 2.5 },
        ] {
            for len in [0, 1, 15, 16, 17, 999, 1000] {
                let (mut fast, mut portable) = (vec![], vec![]);
                collect_kept(&row[..len], band, &mut fast);
                collect_kept_portable(&row[..len], band, &mut portable, 0);
                assert_eq!(fast, portable, "{band:?}, {len} values");
            }
        }
    }
}
