//! A request's ordered processors.

use crate::error::{check_token, Result};
use crate::history::TokenHistory;
use crate::logit::Logit;
use crate::plan::{Fill, RowPlan};
use crate::processors::LogitsProcessor;
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
        let steps = specs
            .iter()
            .map(|spec| Ok(Step::Processor(spec.realize(context, prompt_len)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::new(steps))
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
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

    /// Decides this step's edits from the ids, into [`Pipeline::stages`].
    pub fn plan(&mut self, ids: &dyn TokenHistory) -> Result<()> {
        for stage in &mut self.stages {
            if let Stage::Plan(plan) = stage {
                plan.clear();
            }
        }
        for (step, &stage) in self.steps.iter_mut().zip(&self.stage_of) {
            if let (Step::Processor(processor), Stage::Plan(plan)) = (step, &mut self.stages[stage])
            {
                processor.plan(ids, plan)?;
            }
        }
        Ok(())
    }

    /// The stages as last planned.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Applies the last plan to `row`, calling `external` for each external step in its place.
    /// The plan must have been validated against the row's length ([`Pipeline::validate`]).
    pub fn apply_planned<T: Logit>(
        &mut self,
        row: &mut [T],
        external: &mut dyn FnMut(u64, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        self.apply_stages(row, Fill::Cached, external)
    }

    pub(crate) fn apply_stages<T: Logit>(
        &mut self,
        row: &mut [T],
        fill: Fill,
        external: &mut dyn FnMut(u64, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        for stage in &mut self.stages {
            match stage {
                Stage::Plan(plan) => plan.apply_validated(row, fill),
                Stage::External(key) => external(*key, row)?,
            }
        }
        Ok(())
    }

    /// [`Pipeline::apply_planned`] reading `src` and writing `dst` (of the same length), `src`
    /// left as it is: when the first stage is built-ins, one pass does the copy and the edit.
    pub(crate) fn apply_stages_into<T: Logit>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        external: &mut dyn FnMut(u64, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        let first_is_plan = match self.stages.first_mut() {
            Some(Stage::Plan(plan)) => {
                plan.apply_into_validated(src, dst);
                true
            }
            _ => {
                dst.copy_from_slice(src);
                false
            }
        };
        for stage in &mut self.stages[usize::from(first_is_plan)..] {
            match stage {
                Stage::Plan(plan) => plan.apply_validated(dst, Fill::Cached),
                Stage::External(key) => external(*key, dst)?,
            }
        }
        Ok(())
    }

    /// Plans and applies in one call, for a pipeline with no external steps. On error the row is
    /// as it was.
    pub fn process<T: Logit>(&mut self, ids: &dyn TokenHistory, row: &mut [T]) -> Result<()> {
        self.validate(row.len())?;
        self.plan(ids)?;
        self.apply_planned(row, &mut |key, _| {
            Err(crate::Error::External(format!(
                "external step {key} needs a callback; use apply_planned"
            )))
        })
    }
}
