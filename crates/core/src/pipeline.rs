//! A request's ordered processors.

use crate::error::{check_token, Result};
use crate::history::TokenHistory;
use crate::logit::Logit;
use crate::plan::{Fill, RowPlan};
use crate::processors::LogitsProcessor;
use crate::raw::RawRow;
use crate::spec::{ProcessorSpec, SpecContext};

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
            steps,
            stages,
            stage_of,
        }
    }

    /// Fresh state for each spec, in order (see [`ProcessorSpec::realize`]).
    pub fn from_specs(
        specs: &[ProcessorSpec],
        context: &SpecContext,
        prompt_len: usize,
    ) -> Result<Self> {
        crate::processors::check_order(specs.iter().map(|spec| (spec.position(), spec)))?;
        let steps = specs
            .iter()
            .map(|spec| Ok(Step::Processor(spec.realize(context, prompt_len)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::new(steps))
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

    /// Checks every token id the pipeline can name against `vocab_size`.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        match self.max_token_id() {
            Some(token) => check_token("pipeline", token, vocab_size),
            None => Ok(()),
        }
    }

    pub fn reset(&mut self) {
        for step in &mut self.steps {
            if let Step::Processor(p) = step {
                p.reset();
            }
        }
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

    /// The failures its processors keep as state (see [`LogitsProcessor::failure`]).
    pub fn failures(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter_map(|s| match s {
                Step::Processor(p) => p.failure(),
                Step::External(_) => None,
            })
            .collect()
    }

    /// The first phase of [`Pipeline::plan`]: every processor reads its new ids and plans, costly
    /// work left to [`Pipeline::finish`]. On error every processor's state is as it was.
    pub fn plan_ids(&mut self, ids: &dyn TokenHistory) -> Result<()> {
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
            if let Err(error) = processor.plan(ids, plan) {
                self.undo_steps(j);
                return Err(error);
            }
        }
        Ok(())
    }

    /// Takes back the last successful [`Pipeline::plan`]: every processor's state is again what
    /// it was before it.
    pub fn undo(&mut self) {
        self.undo_steps(self.steps.len());
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
        Ok(())
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
