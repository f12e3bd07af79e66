//! A plan costs what its first cut leaves: once an edit has cut the row to a small kept set (a
//! truncation's band, a mask allowing few tokens, a forced token), the edits after it (later
//! truncations and reshapes included) run on the survivors alone, and the row is written once
//! (`-inf`, then the survivors). llama.cpp's default chain (top-k 40, top-p, min-p, temperature)
//! then reads the row twice and writes it once instead of a pass per kind, and a grammar's mask
//! allowing a few tokens, then a temperature and top-p, never reads the row; the results are those
//! of the full passes, bit for bit:
//!
//! - a logit the cut removed is `-inf` from there on: every dense edit allowed after it keeps
//!   `-inf` (a temperature that does, a mask, a truncation, a reshape whose resolved shape does),
//!   and the tokens a later edit names (a `Set`, a bias, a ban, a force) join the survivors,
//!   whatever their value;
//! - a later truncation or reshape resolves from the survivors' values what it resolves from the
//!   whole row ([`Truncation::band_at`]): each rule weighs only the values that are not `-inf`,
//!   its float sums run in index order, the survivors' order, and top-n-sigma's partial sums take
//!   each value by its index. The observing rules (mirostat, adaptive-p) keep what they saw by
//!   token, from the whole row: they may be the cut, not a later step.
//!
//! Plans with an edit that reads the row in another way (a forced-if, a scaled copy of another
//! logit, a whole-row rule, a bias of the largest) before the cut or after it take the full
//! passes, as do rows shorter than 4,096. A truncation that keeps more than a quarter of the row
//! (a sixteenth when nothing after it reads the row) is no cut: the next truncation, mask or force
//! may be, its band resolved from the row with the first's applied; when none is, the bands
//! resolved here are handed to the full passes ([`Survivors::Declined`]), so that no band is
//! resolved twice.

use super::{Band, Bitmask, Edit, Fill, RowPlan};
use crate::logit::Logit;
#[cfg(target_arch = "x86_64")]
use crate::truncation::{each_found, SPAN};
use crate::truncation::{kth_of, order_key, sampled_floor, Truncation, Work};

/// Rows shorter than this take the full passes.
const MIN_LEN: usize = 4096;

/// What [`RowPlan::apply_on_survivors`] did.
pub(super) enum Survivors {
    /// The plan is carried out.
    Done,
    /// Nothing was written: the full passes carry the plan out, with the bands of the truncations
    /// resolved here, by index (from the values the full passes would read).
    Declined(Vec<(usize, Band)>),
}

impl RowPlan {
    /// Carries out the (validated) plan on `row`, reading `src` when given (else `row` itself),
    /// when [`RowPlan::survivor_cut`] finds a cut and it keeps few enough tokens.
    pub(super) fn apply_on_survivors<T: Logit>(
        &mut self,
        src: Option<&[T]>,
        row: &mut [T],
        fill: Fill,
    ) -> Survivors {
        let len = row.len();
        self.bands.clear();
        self.shapes.clear();
        self.observations.clear();
        self.largest.clear();
        let Some(mut cut) = self.survivor_cut(len) else {
            return Survivors::Declined(Vec::new());
        };
        let input: &[T] = src.unwrap_or(row);
        let mut values = std::mem::take(&mut self.survivor_values);
        values.clear();
        loop {
            let most = self.most_survivors(cut, len);
            let kept = match self.edits[cut] {
                Edit::Truncate(rule) => {
                    let (kept, band) = self.cut_by_band(cut, rule, input, most, &mut values);
                    if !kept && !rule.observes() {
                        // Resolved for the next cut, or for the full passes.
                        self.bands.push((cut, band));
                        if let Some(next) = self.next_cut(cut + 1, len) {
                            values.clear();
                            cut = next;
                            continue;
                        }
                    }
                    kept
                }
                Edit::Mask(id) => {
                    let mut tokens = std::mem::take(&mut self.survivors);
                    let kept = allowed_tokens(self.bitmask(id), len, most, &mut tokens);
                    self.survivors = tokens;
                    kept
                }
                Edit::Force { token, .. } => {
                    self.survivors.clear();
                    self.survivors.push(token);
                    true
                }
                _ => unreachable!("a cut is a truncation, a mask or a force"),
            };
            if !kept {
                return self.decline(cut, values);
            }
            break;
        }
        if !matches!(self.edits[cut], Edit::Truncate(_)) {
            // A mask's or a force's survivors: their values through the cut.
            values.extend(self.survivors.iter().map(|&i| {
                self.fold(0..cut + 1, i as usize, input[i as usize])
                    .to_f32()
            }));
        }
        self.join_named_tokens(cut, input, &mut values);
        for at in cut + 1..self.edits.len() {
            if !self.step_survivors::<T>(at, &mut values) {
                return self.decline(cut, values);
            }
        }
        fill.minus_infinity(row);
        for (&i, &value) in self.survivors.iter().zip(&values) {
            row[i as usize] = T::from_f32(value);
        }
        self.survivor_values = values;
        Survivors::Done
    }

    /// Hands the plan to the full passes with the bands resolved here from the rows they read
    /// themselves (those up to `cut`; not an observing rule's, whose pass must observe).
    fn decline(&mut self, cut: usize, values: Vec<f32>) -> Survivors {
        self.survivor_values = values;
        let edits = &self.edits;
        self.bands.retain(|&(at, _)| {
            at <= cut && matches!(edits[at], Edit::Truncate(rule) if !rule.observes())
        });
        Survivors::Declined(std::mem::take(&mut self.bands))
    }

    /// The truncation `rule` at `cut` resolved over `input` with the edits before it applied
    /// (read in place for an f32 row and a first edit), and its survivors collected with their
    /// values into `self.survivors` and `values`: whether there are at most `most`, and the band.
    fn cut_by_band<T: Logit>(
        &mut self,
        cut: usize,
        rule: Truncation,
        input: &[T],
        most: usize,
        values: &mut Vec<f32>,
    ) -> (bool, Band) {
        let mut copy: Option<Box<Vec<T>>> = None;
        if cut > 0 {
            let mut scratch = match self.scratch.take() {
                Some(any) => any.downcast::<Vec<T>>().unwrap_or_default(),
                None => Box::default(),
            };
            scratch.clear();
            scratch.extend_from_slice(input);
            self.run(0..cut, &mut scratch, Fill::Cached);
            copy = Some(scratch);
        }
        let before: &[T] = copy.as_deref().map_or(input, |c| c.as_slice());
        let mut converted = std::mem::take(&mut self.values);
        let read: &[f32] = match T::as_f32(before) {
            Some(read) => read,
            None => {
                converted.clear();
                converted.extend(before.iter().map(|x| x.to_f32()));
                &converted
            }
        };
        let (kept, band) = match rule {
            Truncation::TopK { k, min_keep } => top_k_kept(
                read,
                k.max(min_keep) as usize,
                most,
                &mut self.selection,
                &mut self.survivors,
                values,
            ),
            _ => None,
        }
        .unwrap_or_else(|| {
            let band = rule.band(read, &mut self.selection);
            (
                collect_kept(read, band, most, &mut self.survivors, values),
                band,
            )
        });
        if kept {
            if rule.observes() {
                self.observe(cut, rule, read, band);
            }
            self.bands.push((cut, band));
        }
        self.values = converted;
        if let Some(copy) = copy {
            self.scratch = Some(copy);
        }
        (kept, band)
    }

    /// Adds to the survivors (kept in order, `values` beside them) every token an edit after
    /// `cut` names, with its value through the cut: a `Set` may bring it back, and the others
    /// then find it among the survivors.
    fn join_named_tokens<T: Logit>(&mut self, cut: usize, input: &[T], values: &mut Vec<f32>) {
        let start = self.survivors.len();
        for edit in &self.edits[cut + 1..] {
            let Some(token) = edit.token() else { continue };
            if self.survivors[..start].binary_search(&token).is_err() {
                let value = self.fold(0..cut + 1, token as usize, input[token as usize]);
                self.survivors.push(token);
                values.push(value.to_f32());
            }
        }
        if self.survivors.len() == start {
            return;
        }
        let mut joined: Vec<(u32, f32)> = self.survivors.drain(..).zip(values.drain(..)).collect();
        joined.sort_unstable_by_key(|&(token, _)| token);
        joined.dedup_by_key(|&mut (token, _)| token);
        for (token, value) in joined {
            self.survivors.push(token);
            values.push(value);
        }
    }

    /// Carries out the edit at `at` on the survivors' `values` (each rounded to `T`), a
    /// truncation or reshape resolved from them. False when a reshape's shape does not keep
    /// `-inf` (the full passes must then run the plan).
    fn step_survivors<T: Logit>(&mut self, at: usize, values: &mut [f32]) -> bool {
        let round = |x: f32| T::from_f32(x).to_f32();
        match self.edits[at] {
            Edit::Truncate(rule) => {
                let band = rule.band_at(values, &self.survivors, &mut self.selection);
                self.bands.push((at, band));
                for v in values.iter_mut().filter(|v| band.removes(**v)) {
                    *v = f32::NEG_INFINITY;
                }
            }
            Edit::Reshape(rule) => {
                let shape = rule.shape(values);
                if round(shape.apply(f32::NEG_INFINITY)) != f32::NEG_INFINITY {
                    return false;
                }
                self.shapes.push((at, shape));
                for v in values.iter_mut() {
                    *v = round(shape.apply(*v));
                }
            }
            Edit::Scale { temperature } => {
                for v in values.iter_mut() {
                    *v = round(*v / temperature);
                }
            }
            edit if edit.is_sparse() => {
                let token = edit.token().expect("a sparse edit names a token");
                let i = self
                    .survivors
                    .binary_search(&token)
                    .expect("named tokens joined the survivors");
                values[i] = self
                    .step(at, token as usize, T::from_f32(values[i]))
                    .to_f32();
            }
            _ => {
                for (v, &i) in values.iter_mut().zip(&self.survivors) {
                    *v = self.step(at, i as usize, T::from_f32(*v)).to_f32();
                }
            }
        }
        true
    }

    /// The index of the plan's cut when the survivors' path can take the plan on a row of `len`
    /// logits: its first truncation, mask allowing at most a quarter of the row, or force; before
    /// it only edits of one logit at a time, after it at least one edit and only edits that keep
    /// a removed logit `-inf` (or name their token), truncations and reshapes that do not observe.
    pub(super) fn survivor_cut(&self, len: usize) -> Option<usize> {
        self.next_cut(0, len)
    }

    /// [`RowPlan::survivor_cut`] from the edit at `from` on, the edits before it allowed (edits of
    /// one logit at a time, and truncations whose bands are resolved).
    fn next_cut(&self, from: usize, len: usize) -> Option<usize> {
        if len < MIN_LEN {
            return None;
        }
        let mut cut = None;
        for (at, edit) in self.edits.iter().enumerate().skip(from) {
            match *edit {
                Edit::Scale { .. }
                | Edit::Ban { .. }
                | Edit::Bias { .. }
                | Edit::Penalty { .. }
                | Edit::AddScaledAbs { .. }
                | Edit::Set { .. } => {}
                Edit::Mask(id) if allowed_count(self.bitmask(id), len) > len / 4 => {}
                Edit::Mask(_) | Edit::Force { .. } | Edit::Truncate(_) => {
                    cut = Some(at);
                    break;
                }
                _ => return None,
            }
        }
        let cut = cut?;
        if let Edit::Truncate(Truncation::TopK { k, min_keep }) = self.edits[cut] {
            if k.max(min_keep) as usize > self.most_survivors(cut, len) {
                return None;
            }
        }
        let after = &self.edits[cut + 1..];
        let allowed = after.iter().all(|e| match *e {
            Edit::Scale { temperature } => f32::NEG_INFINITY / temperature == f32::NEG_INFINITY,
            Edit::Ban { .. }
            | Edit::Bias { .. }
            | Edit::Penalty { .. }
            | Edit::AddScaledAbs { .. }
            | Edit::Set { .. }
            | Edit::Mask(_)
            | Edit::Force { .. } => true,
            Edit::Truncate(rule) => !rule.observes(),
            Edit::Reshape(rule) => !rule.observes(),
            Edit::ForceIf { .. }
            | Edit::AddScaledFrom { .. }
            | Edit::Whole(_)
            | Edit::BiasLargest { .. } => false,
        });
        (!after.is_empty() && allowed).then_some(cut)
    }

    /// How many survivors the cut at `cut` may keep on a row of `len`: a quarter of the row when
    /// a later edit reads the survivors (a truncation or reshape, whose passes over the row they
    /// save: a copy of the row, and the rule's reads of it), else a sixteenth (the survivors then
    /// save only the later edits' pass).
    fn most_survivors(&self, cut: usize, len: usize) -> usize {
        let reads = self.edits[cut + 1..]
            .iter()
            .any(|e| matches!(e, Edit::Truncate(_) | Edit::Reshape(_)));
        if reads {
            len / 4
        } else {
            len / 16
        }
    }
}

/// Top-k's band over a long row and its survivors in one pass (where [`collect_kept`] would make
/// a second): every value (and NaN) at or above a floor under the `k` largest
/// ([`sampled_floor`]) collected with its index, the k-th largest selected among them, the
/// others dropped. Whether there are at most `most` survivors, and the band, as
/// [`Truncation::band`] and [`collect_kept`] give them; `None` (nothing decided) when the floor
/// leaves fewer than `k` values.
fn top_k_kept(
    read: &[f32],
    k: usize,
    most: usize,
    work: &mut Work,
    kept: &mut Vec<u32>,
    values: &mut Vec<f32>,
) -> Option<(bool, Band)> {
    let floor = sampled_floor(read, k, work)?;
    let at_least = Band {
        lo: floor,
        hi: f32::INFINITY,
    };
    collect_kept(read, at_least, usize::MAX, kept, values);
    work.clear();
    work.extend(
        values
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| (order_key(x), 0, x)),
    );
    if work.len() < k {
        return None;
    }
    let band = Band {
        lo: kth_of(work, k),
        hi: f32::INFINITY,
    };
    let mut at = 0;
    for i in 0..kept.len() {
        if !band.removes(values[i]) {
            (kept[at], values[at]) = (kept[i], values[i]);
            at += 1;
        }
    }
    kept.truncate(at);
    values.truncate(at);
    Some((at <= most, band))
}

/// The mask's words that cover a row of `len`, the last one cut to the row.
fn row_words(mask: Bitmask<'_>, len: usize) -> impl Iterator<Item = (usize, u32)> + '_ {
    mask.words
        .iter()
        .enumerate()
        .take(len.div_ceil(32))
        .map(move |(w, &word)| match len - 32 * w {
            left @ 1..32 => (w, word & ((1u32 << left) - 1)),
            _ => (w, word),
        })
}

/// How many tokens of a row of `len` the mask allows.
fn allowed_count(mask: Bitmask<'_>, len: usize) -> usize {
    let beyond = match mask.beyond_allowed {
        true => len.saturating_sub(32 * mask.words.len()),
        false => 0,
    };
    row_words(mask, len)
        .map(|(_, word)| word.count_ones() as usize)
        .sum::<usize>()
        + beyond
}

/// The tokens of a row of `len` the mask allows, in order, into `tokens`: false (stopping early)
/// once there are more than `most`.
fn allowed_tokens(mask: Bitmask<'_>, len: usize, most: usize, tokens: &mut Vec<u32>) -> bool {
    tokens.clear();
    if allowed_count(mask, len) > most {
        return false;
    }
    for (w, mut bits) in row_words(mask, len) {
        while bits != 0 {
            tokens.push((32 * w) as u32 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    if mask.beyond_allowed {
        tokens.extend((32 * mask.words.len()).min(len) as u32..len as u32);
    }
    true
}

/// The indices and values of `row` that `band` keeps and that are not `-inf` (NaN is kept), in
/// order, into `kept` and `values`: false (stopping early) once there are more than `most`.
fn collect_kept(
    row: &[f32],
    band: Band,
    most: usize,
    kept: &mut Vec<u32>,
    values: &mut Vec<f32>,
) -> bool {
    kept.clear();
    values.clear();
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { collect_kept_avx2(row, band, most, kept, values) };
    }
    collect_kept_portable(row, band, kept, values, 0);
    kept.len() <= most
}

fn collect_kept_portable(
    row: &[f32],
    band: Band,
    kept: &mut Vec<u32>,
    values: &mut Vec<f32>,
    start: u32,
) {
    for (i, &x) in row.iter().enumerate() {
        if !band.removes(x) && x != f32::NEG_INFINITY {
            kept.push(start + i as u32);
            values.push(x);
        }
    }
}

/// [`collect_kept`] 32 values at a time: one compare against the band's low end (true for NaN)
/// skips a block where no value can be kept (most of a row cut to a few tokens), else three
/// compares into a bit mask per 16 values (each true for NaN); the kept values are appended a
/// span at a time ([`SPAN`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn collect_kept_avx2(
    row: &[f32],
    band: Band,
    most: usize,
    kept: &mut Vec<u32>,
    values: &mut Vec<f32>,
) -> bool {
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
    let whole = row.len() / 32 * 32;
    let mut found = [0u32; SPAN / 16];
    for (s, span) in row[..whole].chunks(SPAN).enumerate() {
        let mut any = 0;
        for (b, block) in span.chunks_exact(32).enumerate() {
            // SAFETY: `block` holds 32 f32.
            let x: [__m256; 4] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) });
            let maybe = x.map(|x| _mm256_cmp_ps::<_CMP_NLT_UQ>(x, lo));
            let maybe = _mm256_or_ps(
                _mm256_or_ps(maybe[0], maybe[1]),
                _mm256_or_ps(maybe[2], maybe[3]),
            );
            if _mm256_testz_ps(maybe, maybe) == 1 {
                found[2 * b] = 0;
                found[2 * b + 1] = 0;
                continue;
            }
            found[2 * b] = mask(x[0]) | mask(x[1]) << 8;
            found[2 * b + 1] = mask(x[2]) | mask(x[3]) << 8;
            any |= found[2 * b] | found[2 * b + 1];
        }
        if any == 0 {
            continue;
        }
        let start = s * SPAN;
        each_found(&found, span.len(), |i| {
            kept.push((start + i) as u32);
            values.push(span[i]);
        });
        if kept.len() > most {
            return false;
        }
    }
    collect_kept_portable(&row[whole..], band, kept, values, whole as u32);
    kept.len() <= most
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
        // Dense in the first 1,000 values, then mostly far below every band (whole blocks
        // skipped), over three spans of the vector pass.
        let row: Vec<f32> = (0..3100u32)
            .map(|i| match i.wrapping_mul(2_654_435_761) % 11 {
                _ if i >= 1000 && i % 397 != 0 => -20.0,
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
            for len in [
                0, 1, 15, 16, 17, 31, 32, 33, 999, 1000, 1024, 1025, 2080, 3100,
            ] {
                let (mut fast, mut fast_values) = (vec![], vec![]);
                let (mut portable, mut portable_values) = (vec![], vec![]);
                assert!(collect_kept(
                    &row[..len],
                    band,
                    len,
                    &mut fast,
                    &mut fast_values
                ));
                collect_kept_portable(&row[..len], band, &mut portable, &mut portable_values, 0);
                assert_eq!(fast, portable, "{band:?}, {len} values");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast_values), bits(&portable_values));
                if !fast.is_empty() {
                    let most = fast.len() - 1;
                    assert!(!collect_kept(
                        &row[..len],
                        band,
                        most,
                        &mut fast,
                        &mut fast_values
                    ));
                }
            }
        }
    }

    #[test]
    fn a_masks_allowed_tokens_are_its_set_bits_cut_to_the_row_and_past_its_words() {
        let words = [0b1011u32, 0, 1 << 31, u32::MAX];
        for (len, beyond, expected) in [
            (100, false, vec![0, 1, 3, 95, 96, 97, 98, 99]),
            (96, false, vec![0, 1, 3, 95]),
            (95, false, vec![0, 1, 3]),
            (
                130,
                true,
                [0, 1, 3, 95].into_iter().chain(96..130).collect(),
            ),
        ] {
            let mask = Bitmask {
                words: &words,
                beyond_allowed: beyond,
            };
            let mut tokens = vec![];
            assert!(allowed_tokens(mask, len, len, &mut tokens));
            assert_eq!(tokens, expected, "{len}");
            assert_eq!(allowed_count(mask, len), expected.len());
            assert!(!allowed_tokens(mask, len, expected.len() - 1, &mut tokens));
        }
    }
}
