//! What a pipeline keeps to resume from any draft row it planned, under speculative decoding.
//!
//! An engine verifying `k` drafts hands a request `1 + k` rows a step, row `j` sampled after the
//! committed ids and the drafts `1..=j`; a pipeline plans them one after the other, each as the
//! step after the one before. The next step's ids keep the drafts the engine accepted and then
//! the token it sampled: they part from the ids planned after the accepted ones. A processor
//! whose state is a function of the ids reads them again there. One whose next step reads what
//! the previous step's pass observed (mirostat's `mu`, a phrase trigger: see
//! [`LogitsProcessor::checkpoint`]) cannot: so after each plan its checkpoint is kept, and once a
//! later plan has read that plan's pass, the pass's observations too. A plan whose ids extend
//! the ids of a kept plan but the last resumes from it: the processors restored from its
//! checkpoints, its pass's observations put back in the stages. A rejected draft so leaves no
//! trace, and no processor is copied.

use crate::history::TokenHistory;
use crate::pipeline::{Stage, Step};
use crate::plan::Observations;
use crate::processor::Checkpoint;
use crate::processors::cursor::Cursor;

/// The last plans' checkpoints and observations (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct Drafts {
    // How many plans are kept: the draft rows of a step and its first row, and the plan before
    // it (so the step's first row may be planned again). 0: none (no speculative decoding).
    keep: usize,
    // The plans kept, oldest first, each planned ids one longer than the one before.
    planned: Vec<Depth>,
    // During a plan: the index in `planned` of the plan it resumes from, and whether that is an
    // earlier plan than the last (a rewind).
    base: Option<(usize, bool)>,
    // The last plan, until the next one (or its undo): what it resumed from. Its depth is the
    // last of `planned`, still followed by the plans it rewound past.
    pending: Option<Option<(usize, bool)>>,
}

/// One plan: the ids it planned, its processors' checkpoints after it (by step), and, once a
/// later plan has read them, its pass's observations (by stage; the last plan's are still in
/// its stages).
#[derive(Debug)]
struct Depth {
    ids: Cursor,
    checkpoints: Vec<(usize, Checkpoint)>,
    observations: Vec<Observations>,
}

impl std::fmt::Debug for Observations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observations(..)")
    }
}

impl Drafts {
    /// Keeps enough to resume from any of `speculative_tokens` drafts a step.
    pub fn new(speculative_tokens: usize) -> Self {
        Self {
            keep: match speculative_tokens {
                0 => 0,
                k => k.saturating_add(2),
            },
            ..Self::default()
        }
    }

    pub fn clear(&mut self) {
        self.planned.clear();
        self.base = None;
        self.pending = None;
    }

    /// Before a plan of `ids`: resumes from the kept plan whose ids are `ids` but the last, when
    /// it is not the last plan.
    pub fn before_plan(
        &mut self,
        ids: &dyn TokenHistory,
        steps: &mut [Step],
        stages: &mut [Stage],
    ) {
        self.settle();
        let n = ids.token_count();
        let base = self
            .planned
            .iter()
            .rposition(|d| d.ids.seen() + 1 == n && d.ids.extended_by(ids));
        self.base = base.map(|b| (b, b + 1 < self.planned.len()));
        if let Some((b, true)) = self.base {
            let last = self.planned.len() - 1;
            swap(stages, &mut self.planned[last].observations);
            swap(stages, &mut self.planned[b].observations);
            restore(steps, &self.planned[b]);
        }
    }

    /// After a successful plan of `ids`: keeps its checkpoints; the observations it read go back
    /// to the plan they came from.
    pub fn after_plan(&mut self, ids: &dyn TokenHistory, steps: &[Step], stages: &mut [Stage]) {
        if self.keep == 0 {
            return;
        }
        let checkpoints: Vec<(usize, Checkpoint)> = steps
            .iter()
            .enumerate()
            .filter_map(|(j, step)| match step {
                Step::Processor(p) => p.checkpoint().map(|c| (j, c)),
                Step::External(_) => None,
            })
            .collect();
        let base = self.base.take();
        if checkpoints.is_empty() {
            // Every state is a function of the ids: nothing to keep.
            self.clear();
            return;
        }
        if let Some((b, _)) = base {
            swap(stages, &mut self.planned[b].observations);
        }
        let mut cursor = Cursor::default();
        cursor.read_all(ids);
        self.planned.push(Depth {
            ids: cursor,
            checkpoints,
            observations: vec![],
        });
        self.pending = Some(base);
    }

    /// A plan failed after [`Drafts::before_plan`]: back to the state before it (the processors
    /// that planned are undone by the caller first).
    pub fn abandon(&mut self, steps: &mut [Step], stages: &mut [Stage]) {
        if let Some((b, true)) = self.base.take() {
            self.unwind(b, steps, stages);
        }
    }

    /// Takes back the last plan, as [`crate::Pipeline::undo`] (after its processors' undo).
    pub fn undo(&mut self, steps: &mut [Step], stages: &mut [Stage]) {
        let Some(base) = self.pending.take() else {
            return;
        };
        self.planned.pop();
        if let Some((b, rewound)) = base {
            swap(stages, &mut self.planned[b].observations);
            if rewound {
                self.unwind(b, steps, stages);
            }
        }
    }

    /// Back from a rewind to plan `b`, its observations in the stages: the last plan's state.
    fn unwind(&mut self, b: usize, steps: &mut [Step], stages: &mut [Stage]) {
        let last = self.planned.len() - 1;
        swap(stages, &mut self.planned[b].observations);
        swap(stages, &mut self.planned[last].observations);
        restore(steps, &self.planned[last]);
    }

    /// The last plan stands: the plans it rewound past go, and the oldest beyond `keep`.
    fn settle(&mut self) {
        let Some(base) = self.pending.take() else {
            return;
        };
        let Some(last) = self.planned.pop() else {
            return;
        };
        match base {
            Some((b, _)) => self.planned.truncate(b + 1),
            None => self.planned.clear(),
        }
        self.planned.push(last);
        let excess = self.planned.len().saturating_sub(self.keep);
        self.planned.drain(..excess);
    }
}

/// Swaps the stages' observations with `kept` (one per stage).
fn swap(stages: &mut [Stage], kept: &mut Vec<Observations>) {
    kept.resize_with(stages.len(), Observations::default);
    for (stage, kept) in stages.iter_mut().zip(kept) {
        if let Stage::Plan(plan) = stage {
            plan.swap_observations(kept);
        }
    }
}

fn restore(steps: &mut [Step], depth: &Depth) {
    for (j, checkpoint) in &depth.checkpoints {
        if let Step::Processor(p) = &mut steps[*j] {
            p.restore(checkpoint);
        }
    }
}
