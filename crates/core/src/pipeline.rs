//! A request's ordered processors.

use crate::drafts::Drafts;
use crate::error::{check_token, Error, Result};
use crate::history::TokenHistory;
use crate::logit::Logit;
use crate::plan::{Edit, Fill, RowPlan};
use crate::processors::LogitsProcessor;
use crate::raw::RawRow;
use crate::spec::{EngineContext, ProcessorSpec, MAX_PIPELINE_LEN};

/// One step of a pipeline.
#[derive(Debug)]
pub enum Step {
    /// A built-in (or any Rust) processor: it only plans, and its edits are fused with its
    /// neighbours' into one pass.
    Processor(Box<dyn LogitsProcessor>),
    /// A processor this crate cannot see into (a user's Python callable), named by a key the caller
    /// chooses. It runs on the row directly, in its place, through the caller's callback.
    External(u64),
}

/// One entry of a pipeline given to [`Pipeline::from_entries`].
pub enum PipelineEntry<E> {
    /// Specs, realized in order (one entry may hold a JSON list of them).
    Specs(Vec<ProcessorSpec>),
    /// A processor the caller built.
    Processor(Box<dyn LogitsProcessor>),
    /// A step the caller runs itself ([`Step::External`]).
    External(E),
}

/// The steps and labels of a pipeline being built from specs.
#[derive(Default)]
struct Built {
    steps: Vec<Step>,
    labels: Vec<String>,
}

impl Built {
    fn push(&mut self, label: String, step: Step) {
        self.labels.push(label);
        self.steps.push(step);
    }

    /// Realizes `spec`, labelled by its place (`[2] ban_tokens`; a spec without one by its
    /// step's index), its errors by the entry's place `at`.
    fn realize(
        &mut self,
        at: &str,
        spec: &ProcessorSpec,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<()> {
        let processor = spec
            .realize(context, prompt_len)
            .map_err(|e| e.in_spec(at))?;
        let label = match format!("{at}{}", spec.position()) {
            place if place.is_empty() => format!("[{}] {}", self.steps.len(), spec.kind()),
            place => format!("{place} {}", spec.kind()),
        };
        self.push(label, Step::Processor(processor));
        Ok(())
    }

    fn finish(self, context: &EngineContext) -> Result<Pipeline> {
        if self.steps.len() > MAX_PIPELINE_LEN {
            return Err(Error::TooLarge {
                field: "pipeline".into(),
                len: self.steps.len(),
                limit: MAX_PIPELINE_LEN,
            });
        }
        Ok(Pipeline::new(self.steps)
            .with_labels(self.labels)
            .with_eos_token_ids(context.eos_token_ids.clone())
            .with_speculative_tokens(context.speculative_tokens))
    }
}

/// What a planned pipeline does to its row: runs of fused built-ins and the external steps between.
// A pipeline holds a handful of stages; boxing the plan would add an indirection per step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    Plan(RowPlan),
    External(u64),
}

/// The processors of one request, in order. Each step sees the row as the steps before it left it.
///
/// A step never hands back a row with no finite logit without saying so: when the logits given
/// have none, or the steps leave none (allowed ids all banned, a grammar's mask meeting a ban, a
/// bitmask of zeros, a truncation before a mask, a user's processor), the row allows only the
/// EOS ids ([`Pipeline::with_eos_token_ids`], taken from the [`EngineContext`]'s): EOS at 0.0,
/// every other logit `-inf`. Where no EOS id is known the row is left as the steps left it. Either
/// way [`Pipeline::failures`] says why, naming the steps that could remove tokens; the reason
/// stands until [`Pipeline::reset`] (a later step with finite logits is edited as usual). The
/// check reads each row until its first finite logit, before and after the steps; after them,
/// the tokens the steps forced and the EOS ids are looked at first.
///
/// ```
/// use logits_processing::{Pipeline, ForcedSequence, Temperature, Step};
/// let mut pipeline = Pipeline::new(vec![
///     Step::Processor(Box::new(Temperature::new(0.5)?)),
///     Step::Processor(Box::new(ForcedSequence::new(vec![1], Some(0))?)),
/// ]);
/// let mut row = [1.0f32, 3.0, 5.0];
/// pipeline.process(&[9u32], &mut row)?;
/// assert_eq!(row, [f32::NEG_INFINITY, 6.0, f32::NEG_INFINITY]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct Pipeline {
    steps: Vec<Step>,
    stages: Vec<Stage>,
    // The stage each step belongs to.
    stage_of: Vec<usize>,
    // How each step is named in a failure: its spec's place and kind (`[2] ban_tokens`); none
    // given, its place and type.
    labels: Vec<String>,
    // The edits each step added to its stage's plan in the last plan, as a range of indices.
    edits_of: Vec<std::ops::Range<usize>>,
    // The ids the last plan read, for the failure's message.
    planned_ids: usize,
    // The ids a row with no finite logit is left with.
    eos_token_ids: Vec<u32>,
    // Why a step left the row with no finite logit, the first time one did.
    no_token: Option<String>,
    // `no_token` before the last plan, for `undo`.
    no_token_before: Option<Option<String>>,
    // What it keeps to resume from a draft row ([`Pipeline::with_speculative_tokens`]).
    drafts: Drafts,
}

/// Whether some logit of `row` is finite, so that a sampler can draw from it. It reads the row in
/// blocks of 64 and stops after the first block holding a finite logit: a row of real logits
/// costs one block, a row whose one allowed token is its last costs a read of the row.
pub fn has_finite_logit<T: Logit>(row: &[T]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { has_finite_logit_avx2(row) };
    }
    has_finite_logit_portable(row)
}

/// [`has_finite_logit`] compiled for AVX2: 32-byte vectors, twice SSE2's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn has_finite_logit_avx2<T: Logit>(row: &[T]) -> bool {
    has_finite_logit_portable(row)
}

#[inline(always)]
fn has_finite_logit_portable<T: Logit>(row: &[T]) -> bool {
    const BLOCK: usize = 64;
    let mut blocks = row.chunks_exact(BLOCK);
    // No early exit inside a block, so that the test is vectorized.
    blocks.any(|block| block.iter().fold(0, |any, &x| any | x.exponent_unset()) != 0)
        || blocks.remainder().iter().any(|&x| x.is_finite())
}

impl Pipeline {
    pub fn new(steps: Vec<Step>) -> Self {
        let mut stages = vec![];
        let mut stage_of = vec![];
        for step in &steps {
            match step {
                Step::Processor(_) => {
                    if !matches!(stages.last(), Some(Stage::Plan(_))) {
                        stages.push(Stage::Plan(RowPlan::new()));
                    }
                }
                Step::External(key) => stages.push(Stage::External(*key)),
            }
            stage_of.push(stages.len() - 1);
        }
        Self {
            edits_of: vec![0..0; steps.len()],
            steps,
            stages,
            stage_of,
            ..Default::default()
        }
    }

    /// Names the steps, one label each, for [`Pipeline::failures`] (an empty one, or none given:
    /// the step's place and its processor's type, `[1] BanTokens`).
    pub fn with_labels(mut self, labels: Vec<String>) -> Self {
        assert_eq!(labels.len(), self.steps.len(), "one label per step");
        self.labels = labels;
        self
    }

    /// The ids a row left with no finite logit is given (see [`Pipeline`]); checked against the
    /// vocab by [`Pipeline::validate`].
    pub fn with_eos_token_ids(mut self, eos_token_ids: Vec<u32>) -> Self {
        self.eos_token_ids = eos_token_ids;
        self
    }

    /// Plans draft rows exactly, for an engine verifying up to `speculative_tokens` drafts a
    /// request a step (one row each, planned after the one before: the drafts' ids extend the
    /// committed ones). When a plan's ids part from those planned after a draft the engine
    /// rejected, every processor resumes from the plan of the ids they share: the processors
    /// whose next step reads what the previous step's pass observed
    /// ([`LogitsProcessor::checkpoint`]) from what was kept after that plan and its pass (the
    /// last `speculative_tokens + 2` plans are kept), the others by reading the ids again. 0 (the
    /// default): nothing is kept. Given by [`EngineContext::speculative_tokens`].
    ///
    /// ```
    /// use logits_processing::{EngineContext, Pipeline, ProcessorSpec};
    /// let specs = [ProcessorSpec::parse(r#"{"kind": "mirostat", "tau": 1.0, "eta": 0.5}"#)?];
    /// let drafting = EngineContext { speculative_tokens: 1, ..Default::default() };
    /// let mut speculative = Pipeline::from_specs(&specs, &drafting, 0)?;
    /// let mut plain = Pipeline::from_specs(&specs, &EngineContext::default(), 0)?;
    /// let row = |one: f32| [0.0f32, one, 2.0, 0.5];
    /// // The committed ids [7], and a row for the draft 1 after them.
    /// speculative.process(&[7u32], &mut row(1.0))?;
    /// speculative.process(&[7u32, 1], &mut row(2.0))?;
    /// plain.process(&[7u32], &mut row(1.0))?;
    /// // The engine rejects the draft and samples 2: mu is read from the pass of the first row.
    /// let (mut a, mut b) = (row(3.0), row(3.0));
    /// speculative.process(&[7u32, 2], &mut a)?;
    /// plain.process(&[7u32, 2], &mut b)?;
    /// assert_eq!(a, b);
    /// assert_eq!(a.iter().filter(|x| x.is_finite()).count(), 2);
    /// # Ok::<(), logits_processing::Error>(())
    /// ```
    pub fn with_speculative_tokens(mut self, speculative_tokens: usize) -> Self {
        self.drafts = Drafts::new(speculative_tokens);
        self
    }

    /// The ids a row left with no finite logit is given.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Fresh state for each spec, in order (see [`ProcessorSpec::realize`]).
    pub fn from_specs(
        specs: &[ProcessorSpec],
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Self> {
        crate::processors::check_order(specs.iter().map(|spec| (spec.position(), spec)))?;
        let mut built = Built::default();
        for spec in specs {
            built.realize("", spec, context, prompt_len)?;
        }
        built.finish(context)
    }

    /// [`Pipeline::from_specs`] for a caller with steps of its own beside the specs (the Python
    /// binding: processor objects and callables). Each entry comes with where it stands in what
    /// the caller was given (`"[1]"`, or `""` for a lone entry), which labels its steps and
    /// prefixes its specs' errors; `external` turns a caller's step into its key and its name.
    /// The specs of every entry together are held to the order rules, and the pipeline to
    /// [`MAX_PIPELINE_LEN`] steps.
    pub fn from_entries<E>(
        entries: Vec<(String, PipelineEntry<E>)>,
        context: &EngineContext,
        prompt_len: usize,
        mut external: impl FnMut(E) -> (u64, String),
    ) -> Result<Self> {
        let placed: Vec<(String, &ProcessorSpec)> = entries
            .iter()
            .filter_map(|(at, entry)| match entry {
                PipelineEntry::Specs(specs) => Some(
                    specs
                        .iter()
                        .map(move |s| (format!("{at}{}", s.position()), s)),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        crate::processors::check_order(placed.iter().map(|(at, spec)| (at.as_str(), *spec)))?;
        let mut built = Built::default();
        for (at, entry) in entries {
            match entry {
                PipelineEntry::Specs(specs) => {
                    for spec in &specs {
                        built.realize(&at, spec, context, prompt_len)?;
                    }
                }
                // Named by its type, as the pipeline names it.
                PipelineEntry::Processor(processor) => {
                    built.push(String::new(), Step::Processor(processor))
                }
                PipelineEntry::External(step) => {
                    let (key, name) = external(step);
                    built.push(format!("{at} {name}"), Step::External(key));
                }
            }
        }
        built.finish(context)
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn into_steps(self) -> Vec<Step> {
        self.steps
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub fn has_external(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::External(_)))
    }

    /// The largest token id any step can name.
    pub fn max_token_id(&self) -> Option<u32> {
        self.steps
            .iter()
            .filter_map(|step| match step {
                Step::Processor(p) => p.max_token_id(),
                Step::External(_) => None,
            })
            .max()
    }

    /// Checks every token id the pipeline can name against `vocab_size`, its EOS ids too.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        if let Some(token) = self.max_token_id() {
            check_token("pipeline", token, vocab_size)?;
        }
        self.eos_token_ids
            .iter()
            .try_for_each(|&eos| check_token("eos_token_id", eos, vocab_size))
    }

    /// Back to the state of a new request: every processor's, and no failure.
    pub fn reset(&mut self) {
        for step in &mut self.steps {
            if let Step::Processor(p) = step {
                p.reset();
            }
        }
        self.no_token = None;
        self.no_token_before = None;
        self.drafts.clear();
    }

    /// Decides this step's edits from the ids, into [`Pipeline::stages`]: [`Pipeline::plan_ids`]
    /// then [`Pipeline::finish`]. On error every processor's state is as it was before the call.
    pub fn plan(&mut self, ids: &dyn TokenHistory) -> Result<()> {
        self.plan_ids(ids)?;
        self.finish();
        Ok(())
    }

    /// Whether a step of this pipeline has costly work after planning ([`Pipeline::finish`]).
    pub fn finishes(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, Step::Processor(p) if p.finishes()))
    }

    /// The second phase of [`Pipeline::plan`]: each processor's [`LogitsProcessor::finish`]
    /// (a grammar's mask). Never fails.
    pub fn finish(&mut self) {
        for j in 0..self.steps.len() {
            if let (Step::Processor(processor), Stage::Plan(plan)) =
                (&mut self.steps[j], &mut self.stages[self.stage_of[j]])
            {
                if processor.finishes() {
                    processor.finish(plan);
                }
            }
        }
    }

    /// Whether a step of this pipeline applies the caller's bitmask (`{"kind": "bitmask"}`).
    pub fn takes_bitmask(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, Step::Processor(p) if p.caller_mask().is_some()))
    }

    /// Copies the caller's mask words for this row into the masks the last plan reserved for
    /// them (see [`Pipeline::takes_bitmask`]).
    pub fn fill_caller_masks(&mut self, words: &[u32]) -> Result<()> {
        for j in 0..self.steps.len() {
            if let (Step::Processor(processor), Stage::Plan(plan)) =
                (&self.steps[j], &mut self.stages[self.stage_of[j]])
            {
                if let Some(id) = processor.caller_mask() {
                    let slot = plan.mask_words_mut(id);
                    if slot.len() != words.len() {
                        return Err(crate::Error::Shape(format!(
                            "the bitmask has {} words per row, the vocab needs {}",
                            words.len(),
                            slot.len()
                        )));
                    }
                    slot.copy_from_slice(words);
                }
            }
        }
        Ok(())
    }

    /// The failures its processors keep as state (see [`LogitsProcessor::failure`]), and why a
    /// step left the row with no finite logit, if one did (see [`Pipeline`]).
    pub fn failures(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter_map(|s| match s {
                Step::Processor(p) => p.failure(),
                Step::External(_) => None,
            })
            .chain(self.no_token.clone())
            .collect()
    }

    /// The first phase of [`Pipeline::plan`]: every processor reads its new ids and plans, costly
    /// work left to [`Pipeline::finish`]. On error every processor's state is as it was.
    pub fn plan_ids(&mut self, ids: &dyn TokenHistory) -> Result<()> {
        self.drafts
            .before_plan(ids, &mut self.steps, &mut self.stages);
        for stage in &mut self.stages {
            if let Stage::Plan(plan) = stage {
                plan.clear();
            }
        }
        for j in 0..self.steps.len() {
            let (Step::Processor(processor), Stage::Plan(plan)) =
                (&mut self.steps[j], &mut self.stages[self.stage_of[j]])
            else {
                continue;
            };
            let start = plan.edits().len();
            if let Err(error) = processor.plan(ids, plan) {
                self.undo_steps(j);
                self.drafts.abandon(&mut self.steps, &mut self.stages);
                return Err(error);
            }
            self.edits_of[j] = start..plan.edits().len();
        }
        self.drafts.after_plan(ids, &self.steps, &mut self.stages);
        self.planned_ids = ids.token_count();
        self.no_token_before = Some(self.no_token.clone());
        Ok(())
    }

    /// Takes back the last successful [`Pipeline::plan`]: every processor's state is again what
    /// it was before it, and so is the failure its apply may have recorded.
    pub fn undo(&mut self) {
        self.undo_steps(self.steps.len());
        self.drafts.undo(&mut self.steps, &mut self.stages);
        if let Some(before) = self.no_token_before.take() {
            self.no_token = before;
        }
    }

    fn undo_steps(&mut self, planned: usize) {
        for step in self.steps[..planned].iter_mut().rev() {
            if let Step::Processor(processor) = step {
                processor.undo();
            }
        }
    }

    /// Checks every token the last plan names against `vocab_size`, whatever the processors'
    /// [`LogitsProcessor::max_token_id`] said.
    pub fn validate_plans(&self, vocab_size: usize) -> Result<()> {
        self.stages.iter().try_for_each(|stage| match stage {
            Stage::Plan(plan) => plan.validate(vocab_size),
            Stage::External(_) => Ok(()),
        })
    }

    /// The stages as last planned.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The plan of stage `stage` as last planned (`None` for an external step), to record what a
    /// pass carried out elsewhere resolved ([`RowPlan::record_device_pass`]).
    pub fn plan_mut(&mut self, stage: usize) -> Option<&mut RowPlan> {
        match self.stages.get_mut(stage)? {
            Stage::Plan(plan) => Some(plan),
            Stage::External(_) => None,
        }
    }

    /// Applies the last plan to `row`, calling `external` for each external step in its place.
    /// The plan must have been validated against the row's length
    /// ([`Pipeline::validate_plans`]).
    pub fn apply_planned<T: Logit>(
        &mut self,
        row: &mut [T],
        external: &mut dyn FnMut(u64, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        let raw = RawRow::of(row);
        // SAFETY: `raw` comes from a slice borrowed for the whole call, and the external step's
        // slice is made from it only while no other reference to the row is alive.
        unsafe {
            self.apply_raw(None, raw, Fill::Cached, &mut |key| {
                external(key, raw.slice())
            })
        }
    }

    /// The stages applied to the row at `dst`, reading `src` first when given (an out-of-place
    /// apply: when the first stage is built-ins, one pass does the copy and the edit). No
    /// reference to the row is alive while `external` runs.
    ///
    /// # Safety
    /// `dst` (and `src`) must be valid for their length for the whole call, `src` must not overlap
    /// `dst`, and nothing but `external` may access them meanwhile.
    pub(crate) unsafe fn apply_raw<T: Logit>(
        &mut self,
        src: Option<RawRow<T>>,
        dst: RawRow<T>,
        fill: Fill,
        external: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let had_finite = has_finite_logit(src.unwrap_or(dst).slice());
        let mut stages = self.stages.iter_mut();
        if let Some(src) = src {
            match stages.as_slice().first() {
                Some(Stage::Plan(_)) => {
                    let Some(Stage::Plan(plan)) = stages.next() else {
                        unreachable!()
                    };
                    plan.apply_into_validated(src.slice(), dst.slice());
                }
                _ => dst.slice().copy_from_slice(src.slice()),
            }
        }
        for stage in stages {
            match stage {
                Stage::Plan(plan) => plan.apply_validated(dst.slice(), fill),
                Stage::External(key) => external(*key)?,
            }
        }
        if !(self.probe_finite(dst.slice()) || has_finite_logit(dst.slice())) {
            self.no_token_left(dst.slice(), had_finite);
        }
        Ok(())
    }

    /// Whether a token the step likely kept has a finite logit: the tokens it forced, the EOS
    /// ids, then the first few tokens the survivors' path kept. A hint read from the row itself,
    /// so it is never wrong when it says yes; it spares a row cut to a few tokens, whose finite
    /// logits may be anywhere, a scan of the row.
    fn probe_finite<T: Logit>(&self, row: &[T]) -> bool {
        let plans = || {
            self.stages.iter().filter_map(|stage| match stage {
                Stage::Plan(plan) => Some(plan),
                Stage::External(_) => None,
            })
        };
        let forced = plans()
            .flat_map(|plan| plan.edits())
            .filter_map(|edit| match *edit {
                Edit::Force { token, .. } => Some(token),
                _ => None,
            });
        let kept = plans().flat_map(|plan| plan.last_survivors().iter().take(4).copied());
        forced
            .chain(self.eos_token_ids.iter().copied())
            .chain(kept)
            .any(|token| row.get(token as usize).is_some_and(|x| x.is_finite()))
    }

    /// The row has no finite logit after the step: it allows only the EOS ids, where there are
    /// any, and the first time the failure says why.
    #[cold]
    fn no_token_left<T: Logit>(&mut self, row: &mut [T], had_finite: bool) {
        let eos: Vec<u32> = self
            .eos_token_ids
            .iter()
            .copied()
            .filter(|&eos| (eos as usize) < row.len())
            .collect();
        if !eos.is_empty() {
            row.fill(T::NEG_INFINITY);
            for &token in &eos {
                row[token as usize] = T::from_f32(0.0);
            }
        }
        if self.no_token.is_some() {
            return;
        }
        let cause = if !had_finite {
            "the logits given had no finite value (all -inf or NaN)".to_string()
        } else {
            let removers: Vec<String> = (0..self.steps.len())
                .filter(|&j| self.can_remove_tokens(j))
                .map(|j| self.label(j))
                .collect();
            match removers[..] {
                [] => format!(
                    "no logit was finite after the steps {} (an overflow)",
                    (0..self.steps.len())
                        .map(|j| self.label(j))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => format!(
                    "no token was left with a finite logit after {}",
                    removers.join(", ")
                ),
            }
        };
        let outcome = match eos[..] {
            [] => "no EOS id is known (give the engine's EOS ids), so the row was left with no \
                   finite logit"
                .to_string(),
            [one] => format!("the row was given only EOS (id {one})"),
            _ => format!("the row was given only EOS (ids {eos:?})"),
        };
        self.no_token = Some(format!(
            "{cause}, at the step after {} ids; {outcome}",
            self.planned_ids
        ));
    }

    /// How step `j` is named in a failure.
    fn label(&self, j: usize) -> String {
        match (self.labels.get(j).filter(|l| !l.is_empty()), &self.steps[j]) {
            (Some(label), _) => label.clone(),
            (None, Step::Processor(p)) => format!("[{j}] {}", type_name(p.as_ref())),
            (None, Step::External(_)) => format!("[{j}] an external step"),
        }
    }

    /// Whether step `j` could remove tokens in its last plan: a ban, mask, truncation or forced
    /// token, or a step this crate cannot see into.
    fn can_remove_tokens(&self, j: usize) -> bool {
        match (&self.steps[j], &self.stages[self.stage_of[j]]) {
            (Step::External(_), _) => true,
            (Step::Processor(_), Stage::Plan(plan)) => plan
                .edits()
                .get(self.edits_of[j].clone())
                .unwrap_or_default()
                .iter()
                .any(|edit| {
                    matches!(
                        edit,
                        Edit::Force { .. } | Edit::Ban { .. } | Edit::Mask(_) | Edit::Truncate(_)
                    ) || matches!(edit, Edit::Set { value, .. } if !value.is_finite())
                }),
            (Step::Processor(_), Stage::External(_)) => false,
        }
    }

    /// Plans and applies in one call, for a pipeline with no external steps. On error the row is
    /// as it was.
    pub fn process<T: Logit>(&mut self, ids: &dyn TokenHistory, row: &mut [T]) -> Result<()> {
        if self.has_external() {
            return Err(crate::Error::External(
                "a pipeline with external steps needs a callback; use apply_planned".into(),
            ));
        }
        if self.takes_bitmask() {
            return Err(crate::Error::InvalidArgument {
                field: "bitmask".into(),
                message: "a bitmask spec needs the step's bitmask; use Batch::plan_with_bitmask"
                    .into(),
            });
        }
        self.validate(row.len())?;
        self.plan(ids)?;
        if let Err(error) = self.validate_plans(row.len()) {
            self.undo();
            return Err(error);
        }
        self.apply_planned(row, &mut |key, _| {
            Err(crate::Error::External(format!(
                "external step {key} needs a callback; use apply_planned"
            )))
        })
    }
}

/// A processor's type name without its path, for its default label.
fn type_name(processor: &dyn LogitsProcessor) -> String {
    let debug = format!("{processor:?}");
    debug
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> ProcessorSpec {
        ProcessorSpec::parse(text).unwrap()
    }

    #[test]
    fn from_entries_places_every_step_and_names_it_where_it_was_given() {
        let context = EngineContext::default();
        let entries = vec![
            (
                "[0]".to_string(),
                PipelineEntry::Specs(vec![spec(
                    r#"{"kind": "ban_tokens", "token_ids": [0, 1, 2]}"#,
                )]),
            ),
            ("[1]".to_string(), PipelineEntry::External("mine")),
            (
                "[2]".to_string(),
                PipelineEntry::Processor(
                    Box::new(crate::Temperature::new(2.0).unwrap()) as Box<dyn LogitsProcessor>
                ),
            ),
        ];
        let mut named = vec![];
        let pipeline = Pipeline::from_entries(entries, &context, 0, |name| {
            named.push(name);
            (41, format!("{name} (a caller's step)"))
        })
        .unwrap();
        assert_eq!(named, ["mine"]);
        assert!(matches!(
            pipeline.steps(),
            [Step::Processor(_), Step::External(41), Step::Processor(_)]
        ));
        assert_eq!(
            pipeline.labels[..2],
            ["[0] ban_tokens", "[1] mine (a caller's step)"]
        );
        assert_eq!(pipeline.label(2), "[2] Temperature");
        // The same specs as one list label as from_specs does.
        let listed = vec![(
            String::new(),
            PipelineEntry::<()>::Specs(vec![spec(r#"{"kind": "temperature", "temperature": 2}"#)]),
        )];
        let one = Pipeline::from_entries(listed, &context, 0, |_| unreachable!()).unwrap();
        let alone = Pipeline::from_specs(
            &[spec(r#"{"kind": "temperature", "temperature": 2}"#)],
            &context,
            0,
        )
        .unwrap();
        assert_eq!(one.labels, alone.labels);
        assert_eq!(one.labels, ["[0] temperature"]);
    }

    #[test]
    fn from_entries_refuses_what_from_specs_refuses_naming_the_entry() {
        let context = EngineContext::default();
        // A spec that cannot be realized without the engine's ids: its field is placed.
        let entries = vec![
            (
                "[0]".to_string(),
                PipelineEntry::<()>::Specs(vec![spec(
                    r#"{"kind": "temperature", "temperature": 2}"#,
                )]),
            ),
            (
                "[1]".to_string(),
                PipelineEntry::Specs(vec![spec(r#"{"kind": "hello_world"}"#)]),
            ),
        ];
        let error = Pipeline::from_entries(entries, &context, 0, |_| unreachable!()).unwrap_err();
        assert!(error.to_string().contains("[1]"), "{error}");
        // The order rules hold across entries: a mask after a truncation.
        let entries = vec![
            (
                "[0]".to_string(),
                PipelineEntry::<()>::Specs(vec![spec(r#"{"kind": "top_k", "k": 2}"#)]),
            ),
            (
                "[1]".to_string(),
                PipelineEntry::Specs(vec![spec(
                    r#"{"kind": "allowed_token_ids", "token_ids": [1]}"#,
                )]),
            ),
        ];
        let error = Pipeline::from_entries(entries, &context, 0, |_| unreachable!()).unwrap_err();
        assert!(error.to_string().contains("[1]"), "{error}");
        // At most MAX_PIPELINE_LEN steps, however they are given.
        let entries = (0..=MAX_PIPELINE_LEN)
            .map(|i| (format!("[{i}]"), PipelineEntry::External(i)))
            .collect();
        let error = Pipeline::from_entries(entries, &context, 0, |i| (i as u64, String::new()))
            .unwrap_err();
        assert!(
            matches!(
                error,
                Error::TooLarge {
                    limit: MAX_PIPELINE_LEN,
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn has_finite_logit_finds_the_one_finite_logit_wherever_it_is() {
        for len in [0usize, 1, 63, 64, 65, 200] {
            let mut row = vec![f32::NEG_INFINITY; len];
            assert!(!has_finite_logit(&row));
            row.iter_mut().step_by(3).for_each(|x| *x = f32::NAN);
            assert!(!has_finite_logit(&row));
            for at in 0..len {
                let mut one = row.clone();
                one[at] = -3.0;
                assert!(has_finite_logit(&one), "{len} {at}");
                let half: Vec<half::bf16> = one.iter().map(|&x| half::bf16::from_f32(x)).collect();
                assert!(has_finite_logit(&half), "{len} {at}");
            }
        }
    }
}
