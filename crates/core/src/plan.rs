//! A row's plan: the edits a step decided on, applied to the row in one pass.
//!
//! Edits come in three shapes, and the pass treats each at its own cost:
//! - *dense* edits change every logit the same way: [`Edit::Scale`] (temperature), [`Edit::Mask`]
//!   (a packed bitmask of allowed tokens) and [`Edit::Truncate`] (top-k, top-p, ...; resolved to a
//!   band of kept values by one extra read of the row). They run over the row in cache-sized
//!   chunks, all of them on a chunk before the next, so each logit is read and written once.
//! - *sparse* edits name one token: [`Edit::Ban`], [`Edit::Bias`], [`Edit::Penalty`],
//!   [`Edit::AddScaledAbs`], [`Edit::Set`]. They are
//!   sorted by token once (`O(e log e)`, linear for the sorted runs processors push), and each
//!   touched token's final value is computed once from its original, with the dense edits
//!   between them in their order.
//! - [`Edit::Force`] keeps one token: the row is filled with `-inf` unread and the one survivor
//!   computed on its own.
//!
//! The result is bit for bit that of applying each edit to the whole row in turn, in the row's
//! element type (a property test checks every mix and order).

use std::any::Any;
use std::sync::Arc;

use crate::error::{check_token, Result};
use crate::kernels;
use crate::logit::Logit;

mod survivors;
pub use crate::reshape::{Reshape, Shape};
pub use crate::truncation::{Band, Truncation};
pub use crate::whole::{SynthIdSlot, WholeRow};
use survivors::Survivors;

/// What a forced token's logit becomes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ForcedValue {
    /// It keeps the value it had (the reference adds a 0.0 mask entry, so `-0.0` becomes `0.0`).
    Keep,
    /// It is set to this value.
    Set(f32),
}

/// A test of token ids held by a plan ([`RowPlan::push_bias_largest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestId(u32);

/// Which tokens an [`Edit::BiasLargest`] biases among the row's largest: the kind's decision,
/// asked of each candidate the pass finds (the watermark's self-hash green test).
pub trait TokenTest: Send + Sync + std::fmt::Debug {
    fn admits(&self, token: u32) -> bool;
    /// Whether `other` is the same test (two plans are equal when their tests are).
    fn same_as(&self, other: &dyn TokenTest) -> bool;
    fn as_any(&self) -> &dyn Any;
}

/// A bitmask held by a plan ([`RowPlan::push_mask`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskId(u32);

/// One edit of a row. A plan applies its edits in order, each with the meaning it has alone; the
/// meaning of each is [`Edit::value`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Edit {
    /// Every logit becomes `logit / temperature`.
    Scale { temperature: f32 },
    /// Every logit except `token`'s becomes `-inf`.
    Force { token: u32, value: ForcedValue },
    /// `token`'s logit becomes `-inf`.
    Ban { token: u32 },
    /// `bias` is added to `token`'s logit.
    Bias { token: u32, bias: f32 },
    /// `token`'s logit is divided by `penalty` when it is positive (or zero) and multiplied by it
    /// when negative: transformers' repetition penalty.
    Penalty { token: u32, penalty: f32 },
    /// `token`'s logit `x`, when finite, becomes `x + |x| * factor` (transformers' exponential
    /// decay length penalty, which raises a negative logit and a positive one alike); a
    /// non-finite one stays as it is.
    AddScaledAbs { token: u32, factor: f32 },
    /// `token`'s logit becomes `value`, whatever it was (transformers' forced EOS with several
    /// EOS ids). Like [`ForcedValue::Set`], it can bring back a banned token.
    Set { token: u32, value: f32 },
    /// Every logit whose bit is clear in the mask becomes `-inf`.
    Mask(MaskId),
    /// Every logit outside the band the rule keeps (computed over the row as it stands here)
    /// becomes `-inf`.
    Truncate(Truncation),
    /// Every logit goes through the element-wise [`Shape`] the rule computes from the row as it
    /// stands here (dynamic temperature, smoothing). CPU only: the CUDA path refuses it.
    Reshape(Reshape),
    /// `token`'s logit `x`, when finite, becomes `x + factor * v` (the product rounded to f32
    /// first; a non-finite `x` stays as it is), `v` the
    /// logit of `source` as the row stands here (resolved in the row's pass, like a band): the
    /// zoo's multiple choice boosting a choice by its first word. CPU only.
    AddScaledFrom {
        token: u32,
        source: u32,
        factor: f32,
    },
    /// When `when` holds for the row as it stands here, an [`Edit::Force`] of `token` keeping its
    /// value (with no `token`: nothing, the edit only watches); otherwise nothing. Whether it
    /// held is kept for the processor's next step ([`RowPlan::fired`]); `key` tells one step's
    /// edit from another's. CPU only: the CUDA path refuses it.
    ForceIf {
        token: Option<u32>,
        when: Trigger,
        key: u32,
    },
    /// Every logit is rewritten by the whole-row rule (inf/NaN removal, a watermark's update),
    /// which reads the whole row and the row's element type: carried out on the row as the edits
    /// before it left it, in a pass of its own ([`WholeRow`]). CPU only.
    Whole(WholeRow),
    /// `bias` is added to each of the row's `count` largest logits as the row stands here (in
    /// torch's descending order: NaN first, then by value, a tie by the lower id) that `test`
    /// admits (resolved in the row's pass, like a band): the watermark's self-hash scheme. CPU
    /// only.
    BiasLargest { count: u32, bias: f32, test: TestId },
}

/// A condition on a row, read where an [`Edit::ForceIf`] runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// `token`'s value is the row's largest (a tie for the largest counts; NaN is never the
    /// largest, and a row of `-inf` has none).
    ArgmaxIs { token: u32 },
    /// The row's largest softmax probability is below `p` (a row with no finite maximum has no
    /// distribution: never).
    MaxProbBelow { p: f32 },
}

impl Trigger {
    /// Whether the condition holds for `values`.
    pub fn holds(&self, values: &[f32]) -> bool {
        let max = crate::truncation::largest(values);
        match *self {
            Trigger::ArgmaxIs { token } => values
                .get(token as usize)
                .is_some_and(|&x| x > f32::NEG_INFINITY && x >= max),
            Trigger::MaxProbBelow { p } => {
                if !max.is_finite() {
                    return false;
                }
                // The largest probability is 1 / S, S = sum of exp(x - max).
                let sum = crate::truncation::Softmax::weights_only(values, max).scale();
                1.0 / sum < p
            }
        }
    }
}

impl Edit {
    /// The token an edit names, `None` for an edit of the whole row.
    pub fn token(&self) -> Option<u32> {
        match *self {
            Edit::Force { token, .. }
            | Edit::Ban { token }
            | Edit::Bias { token, .. }
            | Edit::Penalty { token, .. }
            | Edit::AddScaledAbs { token, .. }
            | Edit::AddScaledFrom { token, .. }
            | Edit::Set { token, .. } => Some(token),
            Edit::ForceIf { token, .. } => token,
            Edit::Scale { .. }
            | Edit::Mask(_)
            | Edit::Truncate(_)
            | Edit::Reshape(_)
            | Edit::Whole(_) => None,
            Edit::BiasLargest { .. } => None,
        }
    }

    /// Whether the edit names one token and leaves the others alone.
    pub fn is_sparse(&self) -> bool {
        matches!(
            self,
            Edit::Ban { .. }
                | Edit::Bias { .. }
                | Edit::Penalty { .. }
                | Edit::AddScaledAbs { .. }
                | Edit::AddScaledFrom { .. }
                | Edit::Set { .. }
        )
    }

    /// The value the logit at `index`, of value `x`, takes under this edit, before rounding to
    /// the row's element type. `allowed` says whether a mask allows `index`; `band` is a
    /// truncation's resolved band ([`Band::FIRED`] for an [`Edit::ForceIf`] whose condition
    /// held, and for a token an [`Edit::BiasLargest`] biases). The one definition of each edit's meaning: the fused pass,
    /// the device kernels (held to it bit for bit) and the tests all use it.
    #[inline]
    pub fn value(&self, index: usize, x: f32, allowed: impl Fn(MaskId) -> bool, band: Band) -> f32 {
        self.value_shaped(index, x, allowed, band, Shape::Identity)
    }

    /// [`Edit::value`] with a [`Edit::Reshape`]'s resolved shape.
    #[inline]
    pub fn value_shaped(
        &self,
        index: usize,
        x: f32,
        allowed: impl Fn(MaskId) -> bool,
        band: Band,
        shape: Shape,
    ) -> f32 {
        let here = |token: u32| token as usize == index;
        match *self {
            Edit::Scale { temperature } => x / temperature,
            Edit::Force { token, value } if here(token) => match value {
                ForcedValue::Keep => x + 0.0,
                ForcedValue::Set(v) => v,
            },
            Edit::Force { .. } => f32::NEG_INFINITY,
            Edit::Ban { token } if here(token) => f32::NEG_INFINITY,
            Edit::Bias { token, bias } if here(token) => x + bias,
            Edit::Penalty { token, penalty } if here(token) => {
                if x < 0.0 {
                    x * penalty
                } else {
                    x / penalty
                }
            }
            // Two roundings in f32, as torch's `x + abs(x) * factor` on an f32 row.
            Edit::AddScaledAbs { token, factor } if here(token) && x.is_finite() => {
                x + x.abs() * factor
            }
            Edit::Set { token, value } if here(token) => value,
            // `band.lo` is the source's resolved value.
            Edit::AddScaledFrom { token, factor, .. } if here(token) && x.is_finite() => {
                x + factor * band.lo
            }
            Edit::Ban { .. }
            | Edit::Bias { .. }
            | Edit::Penalty { .. }
            | Edit::AddScaledAbs { .. }
            | Edit::AddScaledFrom { .. }
            | Edit::Set { .. } => x,
            Edit::Mask(mask) if allowed(mask) => x,
            Edit::Mask(_) => f32::NEG_INFINITY,
            Edit::Truncate(_) if band.removes(x) => f32::NEG_INFINITY,
            Edit::Truncate(_) => x,
            Edit::Reshape(_) => shape.apply(x),
            Edit::ForceIf {
                token: Some(token), ..
            } if band == Band::FIRED => {
                if here(token) {
                    x + 0.0
                } else {
                    f32::NEG_INFINITY
                }
            }
            Edit::ForceIf { .. } => x,
            // Never one logit at a time: `RowPlan::run` carries it out on the whole row.
            Edit::Whole(_) => x,
            Edit::BiasLargest { bias, .. } if band == Band::FIRED => x + bias,
            Edit::BiasLargest { .. } => x,
        }
    }
}

/// A packed bitmask: bit `i % 32` of word `i / 32` set means token `i` is allowed (the layout
/// llguidance and xgrammar use). Tokens past the last word are allowed when `beyond_allowed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bitmask<'a> {
    pub words: &'a [u32],
    pub beyond_allowed: bool,
}

impl Bitmask<'_> {
    #[inline]
    pub fn allows(&self, index: usize) -> bool {
        match self.words.get(index / 32) {
            Some(word) => word >> (index % 32) & 1 == 1,
            None => self.beyond_allowed,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct MaskSpan {
    start: usize,
    len: usize,
    beyond_allowed: bool,
}

/// The edits one row gets in one step, in order. Processors add to it; [`RowPlan::apply`] carries
/// it out in one pass over the row (see the module's documentation for the cost of each edit).
///
/// Non-finite inputs are the one deliberate difference from the reference: a forced row's other
/// logits become `-inf` even where they were NaN or `+inf` (the reference's mask add leaves NaN).
#[derive(Default)]
pub struct RowPlan {
    edits: Vec<Edit>,
    mask_words: Vec<u32>,
    masks: Vec<MaskSpan>,
    tests: Vec<Arc<dyn TokenTest>>,
    // Per `BiasLargest` edit (by index), the tokens it biases as last resolved, by token.
    largest: Vec<(usize, Vec<u32>)>,
    // Work space, reused between steps: the truncations' bands (by edit index), the sparse edits
    // sorted by token, the touched tokens' original values, and a copy of the row for truncation.
    bands: Vec<(usize, Band)>,
    shapes: Vec<(usize, Shape)>,
    // What the last pass left for the processors that read it at their next step (mirostat):
    // per observing truncation, its index, its rule and the kept tokens' probabilities under the
    // renormalized kept distribution, by token. Not cleared by `clear`: the next step's plan
    // reads it before its own pass replaces it.
    observations: Vec<Observation>,
    touched: Vec<(u32, u32)>,
    originals: Vec<f32>,
    dense: Vec<usize>,
    scratch: Option<Box<dyn Any + Send + Sync>>,
    values: Vec<f32>,
    selection: crate::truncation::Work,
    // The survivors' path (`survivors.rs`): the tokens a cut kept, by index, and their values.
    survivors: Vec<u32>,
    survivor_values: Vec<f32>,
    // The SynthID watermarks of `Edit::Whole(WholeRow::SynthId)`: each one's keys and table, and the
    // hash of its context.
    synthid: Vec<(Arc<crate::synthid::Watermark>, i64)>,
}

impl Clone for RowPlan {
    fn clone(&self) -> Self {
        Self {
            edits: self.edits.clone(),
            mask_words: self.mask_words.clone(),
            masks: self.masks.clone(),
            synthid: self.synthid.clone(),
            tests: self.tests.clone(),
            ..Self::default()
        }
    }
}

impl PartialEq for RowPlan {
    fn eq(&self, other: &Self) -> bool {
        self.edits == other.edits
            && self.masks().eq(other.masks())
            && self.synthid == other.synthid
            && self.tests.len() == other.tests.len()
            && self
                .tests
                .iter()
                .zip(&other.tests)
                .all(|(a, b)| a.same_as(b.as_ref()))
    }
}

impl std::fmt::Debug for RowPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowPlan")
            .field("edits", &self.edits)
            .field("masks", &self.masks.len())
            .finish()
    }
}

impl RowPlan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets all edits and masks, keeping the allocations.
    pub fn clear(&mut self) {
        self.edits.clear();
        self.masks.clear();
        self.mask_words.clear();
        self.synthid.clear();
        self.tests.clear();
    }

    /// Adds a watermark's update ([`WholeRow::SynthId`]) after a context of hash `context`.
    pub fn push_synthid(&mut self, watermark: Arc<crate::synthid::Watermark>, context: i64) {
        self.synthid.push((watermark, context));
        let id = SynthIdSlot(self.synthid.len() as u32 - 1);
        self.edits.push(Edit::Whole(WholeRow::SynthId(id)));
    }

    /// Carries out the whole-row edit `rule` on `row`.
    fn apply_whole<T: Logit>(&self, rule: WholeRow, row: &mut [T]) {
        rule.apply(row, &self.synthid)
    }

    /// Whether the plan holds a whole-row edit.
    fn has_whole(&self) -> bool {
        self.edits.iter().any(|e| matches!(e, Edit::Whole(_)))
    }

    /// Adds an edit. A [`Edit::Mask`] must name a mask of this plan ([`RowPlan::push_mask`]).
    pub fn push(&mut self, edit: Edit) {
        if let Edit::Mask(MaskId(id)) = edit {
            assert!((id as usize) < self.masks.len(), "a mask of another plan");
        }
        if let Edit::BiasLargest {
            test: TestId(id), ..
        } = edit
        {
            assert!((id as usize) < self.tests.len(), "a test of another plan");
        }
        self.edits.push(edit);
    }

    /// Adds a mask edit from packed words (see [`Bitmask`]).
    pub fn push_mask(&mut self, words: &[u32], beyond_allowed: bool) {
        self.push_mask_with(words.len(), beyond_allowed, |w| w.copy_from_slice(words));
    }

    /// Adds a mask edit of `len` words that `fill` writes (they start all clear: nothing allowed).
    pub fn push_mask_with(
        &mut self,
        len: usize,
        beyond_allowed: bool,
        fill: impl FnOnce(&mut [u32]),
    ) {
        let start = self.mask_words.len();
        self.mask_words.resize(start + len, 0);
        fill(&mut self.mask_words[start..]);
        self.masks.push(MaskSpan {
            start,
            len,
            beyond_allowed,
        });
        self.edits
            .push(Edit::Mask(MaskId(self.masks.len() as u32 - 1)));
    }

    /// Adds a mask edit of `len` words, all clear (nothing allowed) until written through
    /// [`RowPlan::mask_words_mut`]: for a processor that decides its mask after planning (a
    /// grammar's, computed in [`crate::LogitsProcessor::finish`]).
    pub fn reserve_mask(&mut self, len: usize, beyond_allowed: bool) -> MaskId {
        self.push_mask_with(len, beyond_allowed, |_| {});
        MaskId(self.masks.len() as u32 - 1)
    }

    /// Adds an [`Edit::BiasLargest`]: `bias` on each of the row's `count` largest logits (as the
    /// row stands at this edit) that `test` admits.
    pub fn push_bias_largest(&mut self, count: u32, bias: f32, test: Arc<dyn TokenTest>) {
        self.tests.push(test);
        self.edits.push(Edit::BiasLargest {
            count,
            bias,
            test: TestId(self.tests.len() as u32 - 1),
        });
    }

    /// The tokens the [`Edit::BiasLargest`] at `edit` biased when last resolved, by token.
    pub fn biased_largest(&self, edit: usize) -> &[u32] {
        self.largest
            .iter()
            .find(|(at, _)| *at == edit)
            .map_or(&[], |(_, tokens)| tokens)
    }

    /// The words of a mask of this plan, to write.
    pub fn mask_words_mut(&mut self, id: MaskId) -> &mut [u32] {
        let span = self.masks[id.0 as usize];
        &mut self.mask_words[span.start..span.start + span.len]
    }

    pub fn edits(&self) -> &[Edit] {
        &self.edits
    }

    /// The tokens the survivors' path last kept (possibly from an earlier step: a hint, to be
    /// read from the row).
    pub(crate) fn last_survivors(&self) -> &[u32] {
        &self.survivors
    }

    pub fn bitmask(&self, id: MaskId) -> Bitmask<'_> {
        let span = self.masks[id.0 as usize];
        Bitmask {
            words: &self.mask_words[span.start..span.start + span.len],
            beyond_allowed: span.beyond_allowed,
        }
    }

    fn masks(&self) -> impl Iterator<Item = Bitmask<'_>> {
        (0..self.masks.len()).map(|i| self.bitmask(MaskId(i as u32)))
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Checks that every token the plan names indexes a row of `vocab_size` logits.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        self.edits
            .iter()
            .filter_map(Edit::token)
            .chain(self.edits.iter().filter_map(|e| match *e {
                Edit::AddScaledFrom { source, .. } => Some(source),
                _ => None,
            }))
            .try_for_each(|token| check_token("plan", token, vocab_size))
    }

    /// The token whose logit survives when the plan forces one: the last force's. Every other logit
    /// is `-inf` after it, and no later edit turns `-inf` into anything else but an [`Edit::Set`]
    /// ([`RowPlan::set_after_force`]).
    /// `None` when a whole-row edit comes after that force (it gives `-inf` a finite value).
    pub fn forced_token(&self) -> Option<u32> {
        let last = (0..self.edits.len())
            .rev()
            .find(|&i| self.forces(i).is_some())?;
        if self.edits[last..]
            .iter()
            .any(|e| matches!(e, Edit::Whole(_)))
        {
            return None;
        }
        self.forces(last)
    }

    /// The token the edit at `index` forces: an [`Edit::Force`]'s, or an [`Edit::ForceIf`]'s
    /// whose condition held in the last resolution.
    fn forces(&self, index: usize) -> Option<u32> {
        match self.edits[index] {
            Edit::Force { token, .. } => Some(token),
            Edit::ForceIf {
                token: Some(token), ..
            } if self.band(index) == Band::FIRED => Some(token),
            _ => None,
        }
    }

    /// The tokens an [`Edit::Set`] after the last force of `range` sets (the force's own token
    /// included): with a force, the only logits besides its survivor that are not `-inf`.
    pub fn set_after_force(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = u32> + '_ {
        let after = range
            .clone()
            .rev()
            .find(|&i| self.forces(i).is_some())
            .map_or(range.end, |last| last + 1);
        self.edits[after..range.end]
            .iter()
            .filter_map(|e| match *e {
                Edit::Set { token, .. } => Some(token),
                _ => None,
            })
    }

    /// Whether the plan needs a reduction over the row before its pass.
    pub fn truncates(&self) -> bool {
        self.edits.iter().any(|e| {
            matches!(
                e,
                Edit::Truncate(_)
                    | Edit::Reshape(_)
                    | Edit::ForceIf { .. }
                    | Edit::AddScaledFrom { .. }
                    | Edit::Whole(_)
                    | Edit::BiasLargest { .. }
            )
        })
    }

    /// Whether the plan holds an edit only the CPU path carries out: a SynthID watermark's
    /// [`Edit::Whole`], an [`Edit::BiasLargest`], or a truncation rule or reshape the device's
    /// band kernel does not have ([`Truncation::on_cpu_only`], [`Reshape::on_cpu_only`]).
    pub fn cpu_only(&self) -> bool {
        self.edits.iter().any(|e| match e {
            Edit::Reshape(rule) => rule.on_cpu_only(),
            Edit::Whole(WholeRow::SynthId(_)) | Edit::BiasLargest { .. } => true,
            Edit::Truncate(rule) => rule.on_cpu_only(),
            _ => false,
        })
    }

    /// The probability the last pass gave `token` at the observing edit `rule` at index `edit`,
    /// when that pass ran with that edit: for a truncation (mirostat), among the tokens it kept,
    /// renormalized (`None` for a token it removed); for a reshape (adaptive-p), in the row it
    /// read, before its transform.
    pub fn observed(&self, edit: usize, rule: &Edit, token: u32) -> Option<f32> {
        let (_, _, observed) = self
            .observations
            .iter()
            .find(|(at, r, _)| *at == edit && r == rule)?;
        match observed {
            Observed::Kept(kept) => kept
                .binary_search_by_key(&token, |&(t, _)| t)
                .ok()
                .map(|i| kept[i].1),
            Observed::Row { values, max, scale } => {
                let x = *values.get(token as usize)?;
                x.is_finite()
                    .then(|| crate::truncation::exp(x - max) / scale)
            }
            Observed::Fired(_) => None,
        }
    }

    /// Whether the condition of the [`Edit::ForceIf`] `rule` at index `edit` held in the last
    /// pass; `None` when that pass did not run that edit.
    pub fn fired(&self, edit: usize, rule: &Edit) -> Option<bool> {
        self.observations
            .iter()
            .find_map(|(at, r, observed)| match observed {
                Observed::Fired(fired) if *at == edit && r == rule => Some(*fired),
                _ => None,
            })
    }

    /// Forgets what the last pass resolved (its bands, shapes and observations), before a pass
    /// carried out elsewhere (the device's) records its own ([`RowPlan::record_device_pass`]).
    pub fn begin_device_pass(&mut self) {
        self.bands.clear();
        self.shapes.clear();
        self.observations.clear();
        self.largest.clear();
    }

    /// Records what a pass carried out elsewhere (the device's kernels, read back) resolved at
    /// the observing edit `edit`, as [`RowPlan::resolve_truncations`] keeps it for the
    /// processor's next step: whether an [`Edit::ForceIf`] fired, an observing truncation's band
    /// over the row as it stood there, or the row an observing reshape read. Anything else is
    /// ignored.
    pub fn record_device_pass(&mut self, edit: usize, pass: DevicePass<'_>) {
        match (self.edits.get(edit).copied(), pass) {
            (Some(rule @ Edit::ForceIf { .. }), DevicePass::Fired(fired)) => {
                self.observations.push((edit, rule, Observed::Fired(fired)));
                if fired {
                    self.bands.push((edit, Band::FIRED));
                }
            }
            (Some(Edit::Truncate(rule)), DevicePass::Band { values, band }) if rule.observes() => {
                self.observe(edit, rule, values, band);
                self.bands.push((edit, band));
            }
            (Some(Edit::Reshape(rule)), DevicePass::Row { values }) if rule.observes() => {
                let shape = rule.shape(values);
                if let Shape::AdaptiveP { max, scale, .. } = shape {
                    let values = values.to_vec();
                    self.observations.push((
                        edit,
                        Edit::Reshape(rule),
                        Observed::Row { values, max, scale },
                    ));
                }
                self.shapes.push((edit, shape));
            }
            _ => {}
        }
    }

    /// Swaps what the last pass observed (what [`RowPlan::observed`] and [`RowPlan::fired`] read)
    /// with `kept`: a pipeline planning draft rows keeps each depth's and puts back the one the
    /// engine's accepted tokens resume from.
    pub(crate) fn swap_observations(&mut self, kept: &mut Observations) {
        std::mem::swap(&mut self.observations, &mut kept.0);
    }

    /// Keeps, for an observing truncation at `edit`, the probabilities of the tokens `band`
    /// keeps in `values` (`exp(x - max)` over their sum, in f64, rounded to f32).
    fn observe(&mut self, edit: usize, rule: Truncation, values: &[f32], band: Band) {
        let mut kept: Vec<(u32, f32)> = Vec::new();
        let max = crate::truncation::largest(values);
        let sum = kept_probabilities(values, band, max, &mut kept);
        for (_, q) in kept.iter_mut() {
            *q = (*q as f64 / sum) as f32;
        }
        self.observations
            .push((edit, Edit::Truncate(rule), Observed::Kept(kept)));
    }

    /// The shape of the reshape at `edit` as last resolved ([`RowPlan::resolve_truncations`]).
    pub fn shape(&self, edit: usize) -> Shape {
        self.shapes
            .iter()
            .find(|(at, _)| *at == edit)
            .map_or(Shape::Identity, |&(_, shape)| shape)
    }

    /// The band of the truncation at `edit` as last resolved ([`RowPlan::resolve_truncations`]).
    pub fn band(&self, edit: usize) -> Band {
        self.bands
            .iter()
            .find(|(at, _)| *at == edit)
            .map_or(Band::ALL, |&(_, band)| band)
    }

    /// The value the logit at `index` ends with, from its value before the plan (truncations
    /// resolved). Costs O(edits).
    #[inline]
    pub fn value_at<T: Logit>(&self, index: usize, original: T) -> T {
        self.fold(0..self.edits.len(), index, original)
    }

    /// The edits `range` folded over one logit, rounding to `T` after each as a row pass would.
    fn fold<T: Logit>(&self, range: std::ops::Range<usize>, index: usize, value: T) -> T {
        range.fold(value, |v, i| self.step(i, index, v))
    }

    #[inline]
    fn step<T: Logit>(&self, edit: usize, index: usize, value: T) -> T {
        let allowed = |id| self.bitmask(id).allows(index);
        let band = match self.edits[edit] {
            Edit::BiasLargest { .. } => biases_at(self.biased_largest(edit), index),
            _ => self.band(edit),
        };
        T::from_f32(self.edits[edit].value_shaped(
            index,
            value.to_f32(),
            allowed,
            band,
            self.shape(edit),
        ))
    }

    /// Applies the plan to `row` in place. On error (a token outside the row) the row is untouched.
    pub fn apply<T: Logit>(&mut self, row: &mut [T]) -> Result<()> {
        self.validate(row.len())?;
        self.apply_validated(row, Fill::Cached);
        Ok(())
    }

    /// Resolves every truncation's band from `row` (the values before the plan): each truncation
    /// reads the row with the edits before it applied, in one copy of the row (a truncation with
    /// no edit before it reads an f32 row in place). Nothing to do without one.
    pub fn resolve_truncations<T: Logit>(&mut self, row: &[T]) {
        self.resolve_reductions(row, Vec::new())
    }

    /// [`RowPlan::resolve_truncations`], taking the bands `known` (by index, of non-observing
    /// truncations) instead of resolving them again.
    fn resolve_reductions<T: Logit>(&mut self, row: &[T], known: Vec<(usize, Band)>) {
        self.bands.clear();
        self.shapes.clear();
        self.observations.clear();
        self.largest.clear();
        let mut scratch: Option<Box<Vec<T>>> = None;
        let mut done = 0;
        for at in 0..self.edits.len() {
            let rule = match self.edits[at] {
                Edit::Truncate(rule) => Reduction::Band(rule),
                Edit::Reshape(rule) => Reduction::Shape(rule),
                Edit::ForceIf { when, .. } => Reduction::Trigger(when),
                Edit::AddScaledFrom { source, .. } => Reduction::Value(source),
                Edit::BiasLargest { count, .. } => Reduction::Largest(count),
                _ => continue,
            };
            let known = known.iter().find(|&&(cut, _)| cut == at);
            let resolved = match (at, T::as_f32(row), known) {
                (_, _, Some(&(_, band))) => Resolved::Band(band),
                (0, Some(values), _) => rule.resolve(values, &mut self.selection),
                _ => {
                    let scratch = scratch.get_or_insert_with(|| {
                        let mut copy = match self.scratch.take() {
                            Some(any) => any.downcast::<Vec<T>>().unwrap_or_default(),
                            None => Box::default(),
                        };
                        copy.clear();
                        copy.extend_from_slice(row);
                        copy
                    });
                    self.run(done..at, scratch, Fill::Cached);
                    done = at;
                    match T::as_f32(scratch) {
                        Some(values) => rule.resolve(values, &mut self.selection),
                        None => {
                            self.values.clear();
                            self.values.extend(scratch.iter().map(|x| x.to_f32()));
                            rule.resolve(&self.values, &mut self.selection)
                        }
                    }
                }
            };
            match (resolved, rule) {
                (Resolved::Band(band), Reduction::Band(rule)) if rule.observes() => {
                    // The values the rule read: the row in place, or the copy with the edits
                    // before it applied.
                    let read: &[T] = match (at, T::as_f32(row), &scratch) {
                        (0, Some(_), _) | (_, _, None) => row,
                        (_, _, Some(scratch)) => scratch,
                    };
                    let owned: Vec<f32>;
                    let values = match T::as_f32(read) {
                        Some(values) => values,
                        None => {
                            owned = read.iter().map(|x| x.to_f32()).collect();
                            &owned
                        }
                    };
                    self.observe(at, rule, values, band);
                    self.bands.push((at, band));
                }
                (Resolved::Band(band), _) => self.bands.push((at, band)),
                (Resolved::Shape(shape), Reduction::Shape(rule)) if rule.observes() => {
                    // The row the rule read, kept whole (one copy) with its softmax's maximum
                    // and sum, for the processor's next step.
                    if let Shape::AdaptiveP { max, scale, .. } = shape {
                        let read: &[T] = match (at, T::as_f32(row), &scratch) {
                            (0, Some(_), _) | (_, _, None) => row,
                            (_, _, Some(scratch)) => scratch,
                        };
                        let values = read.iter().map(|x| x.to_f32()).collect();
                        self.observations.push((
                            at,
                            Edit::Reshape(rule),
                            Observed::Row { values, max, scale },
                        ));
                    }
                    self.shapes.push((at, shape));
                }
                (Resolved::Shape(shape), _) => self.shapes.push((at, shape)),
                (Resolved::Largest(mut tokens), _) => {
                    let Edit::BiasLargest {
                        test: TestId(id), ..
                    } = self.edits[at]
                    else {
                        unreachable!("only a BiasLargest resolves to tokens")
                    };
                    let test = &self.tests[id as usize];
                    // Each test may be costly (a watermark's green list is a randperm of the
                    // vocab): the candidates on the pool's threads.
                    use rayon::prelude::*;
                    let admitted: Vec<bool> = tokens.par_iter().map(|&t| test.admits(t)).collect();
                    let mut admitted = admitted.into_iter();
                    tokens.retain(|_| admitted.next() == Some(true));
                    tokens.sort_unstable();
                    self.largest.push((at, tokens));
                }
                (Resolved::Fired(fired), _) => {
                    self.observations
                        .push((at, self.edits[at], Observed::Fired(fired)));
                    if fired {
                        self.bands.push((at, Band::FIRED));
                    }
                }
            }
        }
        if let Some(scratch) = scratch {
            self.scratch = Some(scratch);
        }
    }

    /// [`RowPlan::apply`] for a plan already validated against `row.len()`.
    pub(crate) fn apply_validated<T: Logit>(&mut self, row: &mut [T], fill: Fill) {
        if self.edits.is_empty() {
            return;
        }
        let known = match self.apply_on_survivors(None, row, fill) {
            Survivors::Done => return,
            Survivors::Declined(known) => known,
        };
        self.resolve_reductions(row, known);
        self.run(0..self.edits.len(), row, fill);
    }

    /// Carries out the edits `range` (truncations in it resolved) on `row`: in one pass, or one
    /// between each whole-row edit and the next.
    fn run<T: Logit>(&mut self, range: std::ops::Range<usize>, row: &mut [T], fill: Fill) {
        if let Some(at) = range
            .clone()
            .find(|&i| matches!(self.edits[i], Edit::Whole(_)))
        {
            let Edit::Whole(rule) = self.edits[at] else {
                unreachable!()
            };
            self.run_pass(range.start..at, row, fill);
            self.apply_whole(rule, row);
            return self.run(at + 1..range.end, row, fill);
        }
        self.run_pass(range, row, fill)
    }

    /// [`RowPlan::run`] for edits without a whole-row one.
    fn run_pass<T: Logit>(&mut self, range: std::ops::Range<usize>, row: &mut [T], fill: Fill) {
        if range.is_empty() {
            return;
        }
        if let Some(token) = range.clone().rev().find_map(|i| self.forces(i)) {
            let index = token as usize;
            let survivor = self.fold(range.clone(), index, row[index]);
            let set: Vec<(usize, T)> = self
                .set_after_force(range.clone())
                .map(|t| {
                    (
                        t as usize,
                        self.fold(range.clone(), t as usize, row[t as usize]),
                    )
                })
                .collect();
            fill.minus_infinity(row);
            row[index] = survivor;
            for (t, value) in set {
                row[t] = value;
            }
            return;
        }
        self.sort_sparse(range.clone());
        self.originals.clear();
        let mut previous = None;
        for &(token, _) in &self.touched {
            if previous != Some(token) {
                self.originals.push(row[token as usize].to_f32());
                previous = Some(token);
            }
        }
        self.dense_pass(row, None);
        self.write_sparse(row);
    }

    /// The plan applied to `src`, written to `dst` (of the same length), `src` left as it is: one
    /// pass that reads and writes each logit once, where a copy and an edit in place would make
    /// two. The plan must be validated against the length.
    pub(crate) fn apply_into_validated<T: Logit>(&mut self, src: &[T], dst: &mut [T]) {
        if self.has_whole() {
            dst.copy_from_slice(src);
            return self.apply_validated(dst, Fill::Cached);
        }
        let known = match self.apply_on_survivors(Some(src), dst, Fill::Cached) {
            Survivors::Done => return,
            Survivors::Declined(known) => known,
        };
        self.resolve_reductions(src, known);
        if let Some(token) = self.forced_token() {
            let index = token as usize;
            kernels::fill(dst, T::NEG_INFINITY);
            dst[index] = self.value_at(index, src[index]);
            for t in self.set_after_force(0..self.edits.len()) {
                dst[t as usize] = self.value_at(t as usize, src[t as usize]);
            }
            return;
        }
        self.sort_sparse(0..self.edits.len());
        self.originals.clear();
        let mut previous = None;
        for &(token, _) in &self.touched {
            if previous != Some(token) {
                self.originals.push(src[token as usize].to_f32());
                previous = Some(token);
            }
        }
        self.dense_pass(dst, Some(src));
        self.write_sparse(dst);
    }

    /// Collects the sparse edits of `range` by token (stable: each token's edits stay in order)
    /// and the dense edits' indices.
    fn sort_sparse(&mut self, range: std::ops::Range<usize>) {
        self.touched.clear();
        self.dense.clear();
        for i in range {
            let edit = &self.edits[i];
            match edit.token() {
                Some(token) if edit.is_sparse() => self.touched.push((token, i as u32)),
                _ => self.dense.push(i),
            }
        }
        // By token, then plan order (edit indices are unique): each token's edits stay in order.
        // One processor's edits usually come sorted already.
        if !self.touched.is_sorted() {
            self.touched.sort_unstable();
        }
    }

    /// The dense edits over the whole row (reading `src` instead of `row` when given): a chain of
    /// scales alone runs as whole-row divisions; anything else chunk by chunk, every edit on a
    /// chunk while it is in cache.
    fn dense_pass<T: Logit>(&self, row: &mut [T], src: Option<&[T]>) {
        let scales_only = self
            .dense
            .iter()
            .all(|&i| matches!(self.edits[i], Edit::Scale { .. }));
        if scales_only {
            let mut temperatures = self.dense.iter().map(|&i| match self.edits[i] {
                Edit::Scale { temperature } => temperature,
                _ => unreachable!(),
            });
            if let Some(src) = src {
                match temperatures.next() {
                    Some(t) => T::divide_into(src, row, t),
                    None => row.copy_from_slice(src),
                }
            }
            for t in temperatures {
                in_halves(row, |_, part| T::divide_row(part, t));
            }
            return;
        }
        in_halves(row, |offset, part| {
            for (c, chunk) in part.chunks_mut(CHUNK).enumerate() {
                let start = offset + c * CHUNK;
                if let Some(src) = src {
                    chunk.copy_from_slice(&src[start..start + chunk.len()]);
                }
                for &i in &self.dense {
                    match self.edits[i] {
                        Edit::Scale { temperature } => T::divide_row(chunk, temperature),
                        Edit::Mask(id) => mask_chunk(chunk, start, self.bitmask(id)),
                        Edit::Truncate(_) => kernels::remove_outside(chunk, self.band(i)),
                        Edit::Reshape(_) => self.shape(i).apply_row(chunk),
                        // One whose condition held makes the pass a forced one instead.
                        Edit::ForceIf { .. } => {}
                        Edit::BiasLargest { bias, .. } => {
                            for &t in self.biased_largest(i) {
                                let Some(x) = (t as usize)
                                    .checked_sub(start)
                                    .and_then(|j| chunk.get_mut(j))
                                else {
                                    continue;
                                };
                                *x = T::from_f32(x.to_f32() + bias);
                            }
                        }
                        _ => unreachable!("only dense edits are listed"),
                    }
                }
            }
        });
    }

    /// Writes each touched token's final value: its original, through its own edits and the dense
    /// edits, merged in plan order.
    fn write_sparse<T: Logit>(&self, row: &mut [T]) {
        let mut at = 0;
        for &original in &self.originals {
            let token = self.touched[at].0;
            let end = at
                + self.touched[at..]
                    .iter()
                    .take_while(|(t, _)| *t == token)
                    .count();
            let index = token as usize;
            let mut value = T::from_f32(original);
            let mut dense = self.dense.iter().peekable();
            for &(_, edit) in &self.touched[at..end] {
                while let Some(&&d) = dense.peek().filter(|&&&d| d < edit as usize) {
                    value = self.step(d, index, value);
                    dense.next();
                }
                value = self.step(edit as usize, index, value);
            }
            for &d in dense {
                value = self.step(d, index, value);
            }
            row[index] = value;
            at = end;
        }
    }
}

impl RowPlan {
    /// The meaning [`RowPlan::apply`] keeps, the slow way, for tests and fuzzing: each edit
    /// applied to the whole row in turn (a truncation's band resolved from the row as it stands
    /// there), rounding to `T` after each. On error (a token outside the row) the row is
    /// untouched.
    #[doc(hidden)]
    pub fn apply_edit_by_edit<T: Logit>(&self, row: &mut [T]) -> Result<()> {
        self.validate(row.len())?;
        for (i, edit) in self.edits.iter().enumerate() {
            if let Edit::Whole(rule) = *edit {
                self.apply_whole(rule, row);
                continue;
            }
            let values = || row.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
            let (band, shape) = match edit {
                // The rule's own resolution, checked against sorts in `truncation`'s tests; here
                // the point is the plan's composition.
                Edit::Truncate(rule) => (
                    rule.band(&values(), &mut Default::default()),
                    Shape::Identity,
                ),
                Edit::Reshape(rule) => (Band::ALL, rule.shape(&values())),
                Edit::ForceIf { when, .. } if when.holds(&values()) => {
                    (Band::FIRED, Shape::Identity)
                }
                Edit::AddScaledFrom { source, .. } => {
                    let v = row[*source as usize].to_f32();
                    (Band { lo: v, hi: v }, Shape::Identity)
                }
                _ => (Band::ALL, Shape::Identity),
            };
            let biased: Vec<u32> = match *edit {
                Edit::BiasLargest {
                    count,
                    test: TestId(id),
                    ..
                } => {
                    let mut tokens = crate::truncation::largest_first(&values(), count as usize);
                    tokens.retain(|&t| self.tests[id as usize].admits(t));
                    tokens.sort_unstable();
                    tokens
                }
                _ => Vec::new(),
            };
            for (index, x) in row.iter_mut().enumerate() {
                let allowed = |id| self.bitmask(id).allows(index);
                let band = match edit {
                    Edit::BiasLargest { .. } => biases_at(&biased, index),
                    _ => band,
                };
                *x = T::from_f32(self.edits[i].value_shaped(
                    index,
                    x.to_f32(),
                    allowed,
                    band,
                    shape,
                ));
            }
        }
        Ok(())
    }
}

/// What an observing edit's pass left for its processor: the edit's index, the edit, and what it
/// saw.
type Observation = (usize, Edit, Observed);

/// What a pass carried out elsewhere (the device's) resolved at an observing edit
/// ([`RowPlan::record_device_pass`]).
#[derive(Debug, Clone, Copy)]
pub enum DevicePass<'a> {
    /// Whether an [`Edit::ForceIf`]'s condition held.
    Fired(bool),
    /// An observing truncation's band, over the row as it stood there.
    Band { values: &'a [f32], band: Band },
    /// The row an observing reshape read (adaptive-p's).
    Row { values: &'a [f32] },
}

/// What one pass observed, out of its plan ([`RowPlan::swap_observations`]).
#[derive(Default)]
pub(crate) struct Observations(Vec<Observation>);

enum Observed {
    /// A truncation's kept tokens, each with its probability among them, by token.
    Kept(Vec<(u32, f32)>),
    /// The row a reshape read, with its softmax's maximum and sum.
    Row {
        values: Vec<f32>,
        max: f32,
        scale: f32,
    },
    /// Whether a [`Edit::ForceIf`]'s condition held.
    Fired(bool),
}

/// A rule that reads the row before its edit: a truncation's band or a reshape's shape.
#[derive(Clone, Copy)]
enum Reduction {
    Band(Truncation),
    Shape(Reshape),
    Trigger(Trigger),
    /// The value of one logit (an [`Edit::AddScaledFrom`]'s source), kept as a band `v..=v`.
    Value(u32),
    /// The ids of the row's `count` largest logits (an [`Edit::BiasLargest`]'s candidates).
    Largest(u32),
}

enum Resolved {
    Band(Band),
    Shape(Shape),
    Fired(bool),
    Largest(Vec<u32>),
}

/// An [`Edit::BiasLargest`]'s meaning at `index`, as [`Edit::value`] reads it: [`Band::FIRED`]
/// where the edit biases the token (`biased` sorted).
fn biases_at(biased: &[u32], index: usize) -> Band {
    if biased.binary_search(&(index as u32)).is_ok() {
        Band::FIRED
    } else {
        Band::ALL
    }
}

impl Reduction {
    fn resolve(&self, values: &[f32], work: &mut crate::truncation::Work) -> Resolved {
        match self {
            Reduction::Band(rule) => Resolved::Band(rule.band(values, work)),
            Reduction::Shape(rule) => Resolved::Shape(rule.shape(values)),
            Reduction::Trigger(rule) => Resolved::Fired(rule.holds(values)),
            Reduction::Value(token) => {
                let v = values.get(*token as usize).copied().unwrap_or(f32::NAN);
                Resolved::Band(Band { lo: v, hi: v })
            }
            Reduction::Largest(count) => {
                Resolved::Largest(crate::truncation::largest_first(values, *count as usize))
            }
        }
    }
}

/// Logits per chunk of the chunked dense pass: 16 KiB of f32, well inside L1 with its mask words.
const CHUNK: usize = 4096;

/// Sets the logits of `chunk` (starting at token `start`, a multiple of 32) that `mask` does not
/// allow to `-inf`: whole words through [`kernels::mask_groups`], a row's last part-word one logit
/// at a time, and the tokens past the mask's words filled or left whole.
fn mask_chunk<T: Logit>(chunk: &mut [T], start: usize, mask: Bitmask<'_>) {
    debug_assert_eq!(start % 32, 0);
    let first = (start / 32).min(mask.words.len());
    let words = &mask.words[first..mask.words.len().min(first + chunk.len().div_ceil(32))];
    let (covered, beyond) = chunk.split_at_mut(chunk.len().min(words.len() * 32));
    let whole = covered.len() / 32;
    let (groups, part) = covered.split_at_mut(whole * 32);
    kernels::mask_groups(groups, &words[..whole]);
    if let Some(&word) = words.get(whole) {
        for (j, x) in part.iter_mut().enumerate() {
            if word >> j & 1 == 0 {
                *x = T::NEG_INFINITY;
            }
        }
    }
    if !mask.beyond_allowed {
        beyond.fill(T::NEG_INFINITY);
    }
}

/// How a forced row's `-inf` fill is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Ordinary stores: the row stays in cache for the sampler that reads it next.
    Cached,
    /// Streaming stores, for a block larger than the caches: no read of each line before it is
    /// overwritten, half the memory traffic (measured: 1.38 -> 1.06 ms for the mixed batch at
    /// B = 64), but a row that fits in cache is then read back from memory (14 -> 26 us a row).
    Streaming,
}

impl Fill {
    /// Sets every logit of `row` to `-inf`, in halves on two threads where [`in_halves`] splits.
    pub(crate) fn minus_infinity<T: Logit>(self, row: &mut [T]) {
        match self {
            Fill::Cached => in_halves(row, |_, part| kernels::fill(part, T::NEG_INFINITY)),
            Fill::Streaming => in_halves(row, |_, part| {
                kernels::fill_streaming(part, T::NEG_INFINITY)
            }),
        }
    }
}

/// Rows at least this long are split in two halves on two threads when the row is edited inside
/// the core's thread pool (a batch's rows), where a join is a cheap push onto the worker's deque.
const SPLIT_LEN: usize = 1 << 16;

/// Runs `edit(offset, part)` over `row` (an element-wise edit, so any split gives the same
/// result; `offset` is where `part` starts in the row, a multiple of 64).
///
/// A row edited from outside the pool (a single-row call from Python) stays on the calling thread:
/// handing it to pool threads costs thread wake-ups (cross-CPU interrupts, expensive in a VM) that
/// measured more than the row's own work here: 30 us against 14 us for a 151,936-logit fill with
/// `rayon::join` from outside the pool, and still 18 against 12 with the caller sharing chunks with
/// one woken helper. A spinning helper (as OpenMP keeps) would win on an idle machine; see
/// docs/python.md.
fn in_halves<T: Send>(row: &mut [T], edit: impl Fn(usize, &mut [T]) + Sync) {
    if row.len() >= SPLIT_LEN
        && rayon::current_thread_index().is_some()
        && rayon::current_num_threads() > 1
    {
        // A multiple of 64 keeps both halves on whole SIMD blocks, mask words and cache lines.
        let half = row.len() / 2 / 64 * 64;
        let (first, second) = row.split_at_mut(half);
        rayon::join(|| edit(0, first), || edit(half, second));
    } else {
        edit(0, row);
    }
}

/// The `(index, exp(x - max))` of every finite value `band` keeps, into `kept`, and the f64 sum of
/// those `q`s in index order. Compiled for FMA and AVX2 where the CPU has them (`exp`'s fused
/// multiply-adds are then instructions, not the C library's `fmaf`: the same bits).
fn kept_probabilities(values: &[f32], band: Band, max: f32, kept: &mut Vec<(u32, f32)>) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { kept_probabilities_fma(values, band, max, kept) };
    }
    kept_probabilities_portable(values, band, max, kept)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn kept_probabilities_fma(values: &[f32], band: Band, max: f32, kept: &mut Vec<(u32, f32)>) -> f64 {
    kept_probabilities_portable(values, band, max, kept)
}

#[inline(always)]
fn kept_probabilities_portable(
    values: &[f32],
    band: Band,
    max: f32,
    kept: &mut Vec<(u32, f32)>,
) -> f64 {
    let mut sum = 0f64;
    // Blocks of 16 without a kept value (most of them) cost a branch-free compare.
    for (c, block) in values.chunks(16).enumerate() {
        let mut any = false;
        for &x in block {
            any |= (x >= band.lo) & (x <= band.hi);
        }
        if !any {
            continue;
        }
        for (j, &x) in block.iter().enumerate() {
            if x.is_finite() && !band.removes(x) {
                let q = crate::truncation::exp(x - max);
                sum += q as f64;
                kept.push(((16 * c + j) as u32, q));
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use proptest::prelude::*;

    fn step_by_step<T: Logit>(plan: &RowPlan, row: &mut [T]) {
        plan.apply_edit_by_edit(row).unwrap();
    }

    fn edit_strategy(vocab: u32) -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0.05f32..20.0).prop_map(|temperature| Edit::Scale { temperature }),
            (0..vocab).prop_map(|token| Edit::Ban { token }),
            (0..vocab, -5.0f32..5.0).prop_map(|(token, bias)| Edit::Bias { token, bias }),
            (0..vocab, 0.2f32..3.0).prop_map(|(token, penalty)| Edit::Penalty { token, penalty }),
            (0..vocab, -0.9f32..4.0)
                .prop_map(|(token, factor)| Edit::AddScaledAbs { token, factor }),
            (0..vocab, -3.0f32..3.0).prop_map(|(token, value)| Edit::Set { token, value }),
            (0..vocab).prop_map(|token| Edit::Force {
                token,
                value: ForcedValue::Keep
            }),
            (0..vocab, -3.0f32..3.0).prop_map(|(token, v)| Edit::Force {
                token,
                value: ForcedValue::Set(v)
            }),
            // A mask: marked by a placeholder, filled in by `plan_of`.
            any::<u64>().prop_map(|seed| Edit::Mask(MaskId(seed as u32))),
            (1u32..6).prop_map(|k| Edit::Truncate(Truncation::TopK { k, min_keep: 1 })),
            (0.05f32..1.0).prop_map(|p| Edit::Truncate(Truncation::TopP { p, min_keep: 1 })),
            (0.0f32..1.0).prop_map(|p| Edit::Truncate(Truncation::MinP { p, min_keep: 2 })),
            (0.05f32..0.95)
                .prop_map(|mass| Edit::Truncate(Truncation::Typical { mass, min_keep: 1 })),
            (0.0001f32..0.05).prop_map(|epsilon| Edit::Truncate(Truncation::Epsilon {
                epsilon,
                min_keep: 1
            })),
            (0.0001f32..0.05).prop_map(|epsilon| Edit::Truncate(Truncation::Eta {
                epsilon,
                min_keep: 3
            })),
            (-1.0f32..3.0).prop_map(|n| Edit::Truncate(Truncation::TopNSigma { n })),
            (0.0f32..1.0).prop_map(|a| Edit::Truncate(Truncation::TopA { a, min_keep: 2 })),
            (0.0f32..1.0).prop_map(|z| Edit::Truncate(Truncation::TailFree { z, min_keep: 1 })),
            (0.0f32..0.5).prop_map(|threshold| Edit::Truncate(Truncation::Xtc {
                threshold,
                min_keep: 2
            })),
            (0.0f32..2.0, -0.5f32..1.5, 0.0f32..3.0).prop_map(|(temperature, range, exponent)| {
                Edit::Reshape(Reshape::DynamicTemperature {
                    temperature,
                    range,
                    exponent,
                })
            }),
            (-1.0f32..2.0, -1.0f32..2.0)
                .prop_map(|(k, s)| Edit::Reshape(Reshape::Smoothing { k, s })),
            Just(Edit::Whole(WholeRow::InfNanRemove)),
            // A watermark: marked by a placeholder, filled in by `plan_of`.
            any::<u32>().prop_map(|seed| Edit::Whole(WholeRow::SynthId(SynthIdSlot(seed)))),
            (0..vocab, 0..vocab, -2.0f32..2.0).prop_map(|(token, source, factor)| {
                Edit::AddScaledFrom {
                    token,
                    source,
                    factor,
                }
            }),
            (proptest::option::of(0..vocab), 0..vocab).prop_map(|(token, argmax)| {
                Edit::ForceIf {
                    token,
                    when: Trigger::ArgmaxIs { token: argmax },
                    key: 0,
                }
            }),
            (proptest::option::of(0..vocab), 0.0f32..1.0).prop_map(|(token, p)| {
                Edit::ForceIf {
                    token,
                    when: Trigger::MaxProbBelow { p },
                    key: 0,
                }
            }),
            // A test: marked by a placeholder (its seed), made by `plan_of`.
            (1u32..50, -3.0f32..3.0, any::<u32>()).prop_map(|(count, bias, seed)| {
                Edit::BiasLargest {
                    count,
                    bias,
                    test: TestId(seed),
                }
            }),
        ]
    }

    /// A test admitting about half the ids, by a hash of the id and a seed.
    #[derive(Debug, PartialEq)]
    struct Hashed(u32);

    impl TokenTest for Hashed {
        fn admits(&self, token: u32) -> bool {
            (token ^ self.0).wrapping_mul(0x9e37_79b9) >> 31 == 1
        }
        fn same_as(&self, other: &dyn TokenTest) -> bool {
            other.as_any().downcast_ref::<Self>() == Some(self)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    /// A plan of `edits` for a row of `len`: out-of-row tokens dropped, masks made from their seed.
    fn plan_of(edits: &[Edit], len: usize) -> RowPlan {
        let mut plan = RowPlan::new();
        for edit in edits {
            match *edit {
                Edit::Mask(MaskId(seed)) => {
                    // One seed in seven a narrow mask (a word in 16 with one bit), else about
                    // half the tokens and one in each word.
                    let narrow = seed % 7 == 6;
                    let words: Vec<u32> = (0..len.div_ceil(32) as u32)
                        .map(|w| {
                            let hash = (seed ^ w.wrapping_mul(0x9e37_79b9)).rotate_left(w);
                            match narrow {
                                true if hash.wrapping_mul(0x85eb_ca6b) >> 28 == 0 => {
                                    1 << (hash % 32)
                                }
                                true => 0,
                                false => hash | 1,
                            }
                        })
                        .collect();
                    let short = seed % 3 == 0;
                    let words = if short {
                        &words[..words.len() / 2]
                    } else {
                        &words[..]
                    };
                    plan.push_mask(words, seed % 2 == 0);
                }
                Edit::Whole(WholeRow::SynthId(SynthIdSlot(seed))) => {
                    let keys = [seed as i64, 7, -3];
                    let watermark =
                        crate::synthid::Watermark::new(&keys[..1 + seed as usize % 3], 1 << 8, 0);
                    plan.push_synthid(Arc::new(watermark.unwrap()), seed as i64 * 31);
                }
                Edit::AddScaledFrom { source, .. } if source as usize >= len => {}
                Edit::BiasLargest {
                    count,
                    bias,
                    test: TestId(seed),
                } => plan.push_bias_largest(count, bias, Arc::new(Hashed(seed))),
                e if e.token().is_none_or(|t| (t as usize) < len) => plan.push(e),
                _ => {}
            }
        }
        plan
    }

    fn bits<T: Logit>(row: &[T]) -> Vec<u32> {
        row.iter().map(|x| x.to_f32().to_bits()).collect()
    }

    fn check_fused<T: Logit>(
        plan: &mut RowPlan,
        row: &[f32],
    ) -> std::result::Result<(), TestCaseError> {
        let source: Vec<T> = row.iter().map(|&x| T::from_f32(x)).collect();
        let mut fused = source.clone();
        let mut expected = source.clone();
        plan.apply(&mut fused).unwrap();
        step_by_step(plan, &mut expected);
        prop_assert_eq!(bits(&fused), bits(&expected));
        let mut into = vec![T::from_f32(7.0); row.len()];
        plan.apply_into_validated(&source, &mut into);
        prop_assert_eq!(bits(&into), bits(&expected));
        Ok(())
    }

    proptest! {
        #[test]
        fn fused_pass_equals_step_by_step(
            row in proptest::collection::vec(-30.0f32..30.0, 1..300),
            edits in proptest::collection::vec(edit_strategy(300), 0..8),
        ) {
            let mut plan = plan_of(&edits, row.len());
            check_fused::<f32>(&mut plan, &row)?;
            check_fused::<bf16>(&mut plan, &row)?;
            check_fused::<f16>(&mut plan, &row)?;
        }

        #[test]
        fn many_sparse_edits_on_few_tokens_equal_step_by_step(
            row in proptest::collection::vec(-30.0f32..30.0, 8..40),
            edits in proptest::collection::vec(edit_strategy(8), 0..60),
        ) {
            let mut plan = plan_of(&edits, row.len());
            check_fused::<f32>(&mut plan, &row)?;
        }

        #[test]
        fn a_banned_token_never_comes_back(
            row in proptest::collection::vec(-30.0f32..30.0, 8..32),
            before in proptest::collection::vec(edit_strategy(8), 0..3),
            after in proptest::collection::vec(edit_strategy(8), 0..3),
            banned in 0u32..8,
        ) {
            let edits: Vec<Edit> = before
                .iter()
                .chain(&[Edit::Ban { token: banned }])
                .chain(&after)
                // Setting by value brings a token back; a whole-row edit gives it a finite minimum.
                .filter(|e| {
                    !matches!(
                        e,
                        Edit::Force { value: ForcedValue::Set(_), .. }
                            | Edit::Set { .. }
                            | Edit::Whole(_)
                    )
                })
                .copied()
                .collect();
            let mut plan = plan_of(&edits, row.len());
            let mut row = row;
            plan.apply(&mut row).unwrap();
            prop_assert_eq!(row[banned as usize], f32::NEG_INFINITY);
        }
    }

    /// Rows long enough for the survivors' path (`survivors.rs`), some past top-k's sampled floor
    /// (8,192), with ties (values on a grid of quarters, and with a long tail for one row in
    /// two), and a few NaN, `-inf` or `+inf` (or every twelfth value one of them).
    fn long_row() -> impl Strategy<Value = Vec<f32>> {
        let grid = |low: i32| (low..120).prop_map(|q| q as f32 / 4.0);
        let special = prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY)];
        (
            prop_oneof![
                proptest::collection::vec(grid(-120), 4096..10_000),
                proptest::collection::vec(grid(-1200), 4096..10_000),
            ],
            proptest::collection::vec((any::<prop::sample::Index>(), special.clone()), 0..4),
            prop_oneof![9 => Just(None), 1 => special.prop_map(Some)],
        )
            .prop_map(|(mut row, specials, every)| {
                let len = row.len();
                for (at, x) in specials {
                    row[at.index(len)] = x;
                }
                if let Some(x) = every {
                    row.iter_mut().step_by(12).for_each(|v| *v = x);
                }
                row
            })
    }

    /// The edits that cut a long row to few tokens, or may: a top-k, every truncation rule at
    /// parameters that keep few of a [`long_row`] (or, now and then, many: the full passes then
    /// take the band resolved for the cut), a narrow mask, a force.
    fn cut_strategy() -> impl Strategy<Value = Edit> {
        let min_keep = prop_oneof![3 => Just(1u32), 1 => 2u32..5];
        let truncate = |rule: Truncation| Edit::Truncate(rule);
        prop_oneof![
            (1u32..300, min_keep.clone())
                .prop_map(move |(k, min_keep)| truncate(Truncation::TopK { k, min_keep })),
            (0.001f32..0.9, min_keep.clone())
                .prop_map(move |(p, min_keep)| truncate(Truncation::TopP { p, min_keep })),
            (0.01f32..1.0, min_keep.clone())
                .prop_map(move |(p, min_keep)| truncate(Truncation::MinP { p, min_keep })),
            (0.001f32..0.5, min_keep.clone())
                .prop_map(move |(mass, min_keep)| truncate(Truncation::Typical { mass, min_keep })),
            (0.0001f32..0.05, min_keep.clone()).prop_map(move |(epsilon, min_keep)| {
                truncate(Truncation::Epsilon { epsilon, min_keep })
            }),
            (0.0001f32..0.05, min_keep.clone()).prop_map(move |(epsilon, min_keep)| truncate(
                Truncation::Eta { epsilon, min_keep }
            )),
            (0.001f32..0.3).prop_map(move |n| truncate(Truncation::TopNSigma { n })),
            (0.0f32..1.0, min_keep.clone())
                .prop_map(move |(a, min_keep)| truncate(Truncation::TopA { a, min_keep })),
            (min_keep.clone(), any::<bool>()).prop_map(move |(min_keep, normalized)| {
                truncate(Truncation::PLess {
                    min_keep,
                    normalized,
                })
            }),
            (0.05f32..1.0).prop_map(move |top_h| truncate(Truncation::TopH { top_h })),
            (0.0f32..0.5, min_keep.clone())
                .prop_map(move |(z, min_keep)| truncate(Truncation::TailFree { z, min_keep })),
            (0.0f32..0.3, min_keep).prop_map(move |(threshold, min_keep)| {
                truncate(Truncation::Xtc {
                    threshold,
                    min_keep,
                })
            }),
            (0.5f32..9.0).prop_map(move |mu| truncate(Truncation::MirostatV2 { mu, key: 1 })),
            (0.5f32..9.0, 2u32..120).prop_map(move |(mu, m)| {
                truncate(Truncation::MirostatV1 {
                    mu,
                    m,
                    n_vocab: 10_000,
                    key: 2,
                })
            }),
            any::<u32>().prop_map(|seed| Edit::Mask(MaskId(seed / 7 * 7 + 6))),
            (
                0u32..10_000,
                prop_oneof![
                    Just(ForcedValue::Keep),
                    (-3.0f32..3.0).prop_map(ForcedValue::Set)
                ]
            )
                .prop_map(|(token, value)| Edit::Force { token, value }),
        ]
    }

    /// The edits a cut may be followed by on the survivors' path, beside every other edit: the
    /// truncation rules `edit_strategy` lacks, and log-softmax.
    fn after_cut_strategy() -> impl Strategy<Value = Edit> {
        prop_oneof![
            4 => edit_strategy(10_000),
            1 => cut_strategy().prop_filter("not an observing rule", |e| {
                !matches!(e, Edit::Truncate(rule) if rule.observes())
            }),
            1 => Just(Edit::Reshape(Reshape::LogSoftmax)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Whatever cuts the row first (a truncation of any rule, a narrow mask, a force), after
        /// edits of one logit at a time and before any edits, the fused pass is the edits one by
        /// one, in f32, bf16 and f16; and an observing cut (mirostat) observes what the full
        /// passes observe.
        #[test]
        fn a_cut_then_any_edits_equal_step_by_step(
            row in long_row(),
            before in proptest::collection::vec(edit_strategy(10_000), 0..3),
            cut in cut_strategy(),
            after in proptest::collection::vec(after_cut_strategy(), 1..7),
        ) {
            let edits: Vec<Edit> = before
                .iter()
                .chain(&[cut])
                .chain(&after)
                .copied()
                .collect();
            let mut plan = plan_of(&edits, row.len());
            check_fused::<f32>(&mut plan, &row)?;
            check_fused::<bf16>(&mut plan, &row)?;
            check_fused::<f16>(&mut plan, &row)?;
            let observer = (0..plan.edits().len()).find(|&i| {
                matches!(plan.edits()[i], Edit::Truncate(rule) if rule.observes())
            });
            if let Some(at) = observer {
                let rule = plan.edits()[at];
                let observed = |plan: &RowPlan| {
                    (0..row.len() as u32)
                        .map(|t| plan.observed(at, &rule, t).map(f32::to_bits))
                        .collect::<Vec<_>>()
                };
                plan.apply(&mut row.clone()).unwrap();
                let fused = observed(&plan);
                plan.resolve_truncations(&row);
                prop_assert_eq!(fused, observed(&plan));
            }
        }
    }

    #[test]
    fn llama_cpps_default_chain_and_its_orders_take_the_survivors_path() {
        let vocab = 151_936;
        let mut uniform = crate::truncation::uniform(0x9e37_79b9_7f4a_7c15);
        // Uniform in [-8, 8), and one token in a thousand 10 higher: a few hundred likely tokens.
        let row: Vec<f32> = (0..vocab)
            .map(|i| {
                let x = uniform() * 16.0 - 8.0;
                x + if i % 1000 == 0 { 10.0 } else { 0.0 }
            })
            .collect();
        let top_k = Edit::Truncate(Truncation::TopK { k: 40, min_keep: 1 });
        let top_p = Edit::Truncate(Truncation::TopP {
            p: 0.95,
            min_keep: 1,
        });
        let min_p = Edit::Truncate(Truncation::MinP {
            p: 0.05,
            min_keep: 1,
        });
        let temperature = Edit::Scale { temperature: 0.8 };
        let allowing_few = Edit::Mask(MaskId(13));
        let force = Edit::Force {
            token: 77,
            value: ForcedValue::Keep,
        };
        let mirostat = Edit::Truncate(Truncation::MirostatV2 { mu: 3.0, key: 0 });
        for (edits, cut) in [
            (vec![top_k, top_p, min_p, temperature], 0),
            // transformers' order: the temperature first, the top-k read from a copy.
            (vec![temperature, top_k, top_p, min_p], 1),
            (vec![min_p, top_p, top_k, temperature], 0),
            (vec![top_p, min_p, temperature, top_k], 0),
            (vec![allowing_few, temperature, top_p, min_p], 0),
            (vec![temperature, force, top_p, temperature], 1),
            (vec![mirostat, temperature, top_p], 0),
        ] {
            let mut plan = plan_of(&edits, vocab);
            assert_eq!(plan.survivor_cut(vocab), Some(cut), "{edits:?}");
            let (mut fused, mut expected) = (row.clone(), row.clone());
            let taken = plan.apply_on_survivors(None, &mut fused, Fill::Cached);
            assert!(matches!(taken, Survivors::Done), "{edits:?}");
            plan.apply_edit_by_edit(&mut expected).unwrap();
            assert_eq!(bits(&fused), bits(&expected), "{edits:?}");
            assert!(fused.iter().filter(|x| x.is_finite()).count() <= 300);
        }
        // A truncation that keeps too many: the next one cuts, from the row with the first's
        // band applied; when none does, the full passes take both bands resolved.
        let wide = Edit::Truncate(Truncation::MinP {
            p: 1e-8,
            min_keep: 1,
        });
        let wider = Edit::Truncate(Truncation::MinP {
            p: 1e-9,
            min_keep: 1,
        });
        for (edits, taken) in [
            (vec![wide, top_k, top_p, temperature], true),
            (vec![wide, wider, temperature], false),
        ] {
            let mut plan = plan_of(&edits, vocab);
            let (mut fused, mut expected) = (row.clone(), row.clone());
            match plan.apply_on_survivors(None, &mut fused, Fill::Cached) {
                Survivors::Done => assert!(taken, "{edits:?}"),
                Survivors::Declined(known) => {
                    assert!(!taken, "{edits:?}");
                    assert_eq!(known.iter().map(|k| k.0).collect::<Vec<_>>(), [0, 1]);
                    assert_eq!(bits(&fused), bits(&row), "nothing written");
                    plan.resolve_reductions(&fused, known);
                    plan.run(0..edits.len(), &mut fused, Fill::Cached);
                }
            }
            plan.apply_edit_by_edit(&mut expected).unwrap();
            assert_eq!(bits(&fused), bits(&expected), "{edits:?}");
        }
    }

    #[test]
    fn long_rows_split_across_threads_equal_one_pass() {
        let row: Vec<f32> = (0..200_003)
            .map(|i| (i % 1013) as f32 / 7.0 - 50.0)
            .collect();
        let mask: Vec<u32> = (0..3000u32).map(|w| w.wrapping_mul(0x9e37_79b9)).collect();
        let plans = [
            vec![Edit::Scale { temperature: 0.7 }],
            vec![Edit::Force {
                token: 150_001,
                value: ForcedValue::Keep,
            }],
            vec![
                Edit::Scale { temperature: 0.3 },
                Edit::Ban { token: 5 },
                Edit::Bias {
                    token: 7,
                    bias: 1.5,
                },
                Edit::Mask(MaskId(0)),
                Edit::Truncate(Truncation::TopK {
                    k: 5000,
                    min_keep: 1,
                }),
            ],
        ];
        for edits in plans {
            let mut plan = RowPlan::new();
            for e in &edits {
                match e {
                    Edit::Mask(_) => plan.push_mask(&mask, true),
                    e => plan.push(*e),
                }
            }
            let mut expected = row.clone();
            step_by_step(&plan, &mut expected);
            // From outside the pool (one thread) and from inside it (two halves joined).
            let mut outside = row.clone();
            plan.apply(&mut outside).unwrap();
            let mut inside = row.clone();
            rayon::scope(|_| plan.clone().apply(&mut inside).unwrap());
            assert_eq!(bits(&outside), bits(&expected));
            assert_eq!(bits(&inside), bits(&expected));
        }
    }

    #[test]
    fn masks_of_whole_and_mixed_words_equal_step_by_step_across_chunk_and_row_ends() {
        // Runs of banned, allowed and mixed words, of lengths that straddle the pass's chunks
        // (128 words) and the kernel's eight-word blocks.
        let word = |run: usize, w: usize| match (w / run) % 3 {
            0 => 0,
            1 => u32::MAX,
            _ => (w as u32).wrapping_mul(0x9e37_79b9) | 1,
        };
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
        for len in [
            1,
            31,
            32,
            33,
            255,
            257,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            CHUNK + 31,
            2 * CHUNK + 40,
            3 * CHUNK - 7,
        ] {
            let row: Vec<f32> = (0..len)
                .map(|i| match i % 97 {
                    s @ 0..4 => specials[s],
                    _ => (i % 1013) as f32 / 7.0 - 50.0,
                })
                .collect();
            let full = len.div_ceil(32);
            for run in [1, 5, 9, 200] {
                // Every word, one short (the row's last part-word past the mask), half of them.
                for words in [full, full - 1, full / 2] {
                    let words: Vec<u32> = (0..words).map(|w| word(run, w)).collect();
                    for beyond_allowed in [false, true] {
                        let mut plan = RowPlan::new();
                        plan.push_mask(&words, beyond_allowed);
                        check_fused::<f32>(&mut plan, &row).unwrap();
                        check_fused::<f16>(&mut plan, &row).unwrap();
                        check_fused::<bf16>(&mut plan, &row).unwrap();
                    }
                }
            }
        }
    }

    #[test]
    fn out_of_vocab_token_leaves_the_row_untouched() {
        let mut plan = RowPlan::new();
        plan.push(Edit::Scale { temperature: 0.5 });
        plan.push(Edit::Force {
            token: 9,
            value: ForcedValue::Keep,
        });
        let mut row = vec![1.0f32; 4];
        assert!(plan.apply(&mut row).is_err());
        assert_eq!(row, vec![1.0; 4]);
    }

    #[test]
    fn forced_keep_turns_negative_zero_into_zero_like_the_reference_mask() {
        let mut plan = RowPlan::new();
        plan.push(Edit::Force {
            token: 1,
            value: ForcedValue::Keep,
        });
        let mut row = [3.0f32, -0.0, 2.0];
        plan.apply(&mut row).unwrap();
        assert_eq!(row[1].to_bits(), 0.0f32.to_bits());
        assert_eq!(row[0], f32::NEG_INFINITY);
    }

    #[test]
    fn a_mask_allows_only_its_set_bits_and_past_its_words_as_told() {
        let mut row = vec![1.0f32; 70];
        let mut plan = RowPlan::new();
        plan.push_mask(&[0b101, 0], false);
        plan.apply(&mut row).unwrap();
        let kept: Vec<usize> = (0..70).filter(|&i| row[i] == 1.0).collect();
        assert_eq!(kept, [0, 2]);

        let mut row = vec![1.0f32; 70];
        let mut plan = RowPlan::new();
        plan.push_mask(&[u32::MAX, 0], true);
        plan.apply(&mut row).unwrap();
        let kept = (0..70).filter(|&i| row[i] == 1.0).count();
        assert_eq!(kept, 32 + 6);
    }

    #[test]
    fn repetition_penalty_divides_positives_and_multiplies_negatives() {
        let mut plan = RowPlan::new();
        for token in 0..3 {
            plan.push(Edit::Penalty {
                token,
                penalty: 2.0,
            });
        }
        let mut row = [4.0f32, -4.0, 0.0, 4.0];
        plan.apply(&mut row).unwrap();
        assert_eq!(row, [2.0, -8.0, 0.0, 4.0]);
    }
}
