//! A phrase forced one token a step after a trigger, as the zoo's phrase kinds do
//! (`force_last_phrase`, `trigger_phrase`, `prevent_hallucination`), with its position counted by
//! generated tokens.
//!
//! A trigger that reads the row is an [`Edit::ForceIf`]: whether it fired is known only after the
//! row's pass, and is read back at the next step ([`RowPlan::fired`]). A processor that has not
//! seen its passes (a fresh one for a resumed or migrated request, a pipeline that drops its
//! plans) reads its state from the ids instead: every full occurrence of the phrase among the
//! generated ids is a run done, and generated ids ending with a part of the phrase are a run in
//! progress (under hard forcing, a run writes the phrase verbatim). Ids alone cannot tell a phrase
//! the model wrote by itself from a forced one; the passes can.

use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::cursor::Cursor;

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The trigger is armed: the kind pushes its trigger ([`PhraseRuns::arm`]).
    Armed,
    /// Force the phrase's token at this index.
    Force(usize),
    /// Nothing this step (the zoo's reset step after a phrase).
    Idle,
    /// No more runs.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct State {
    /// Runs begun.
    runs: u32,
    /// The step (generated tokens before it) at which the latest run's trigger fired.
    fired_at: Option<usize>,
    /// Whether the state follows the passes (else it is read from the ids at each step).
    observed: bool,
    /// The trigger pushed at the last armed step: its index in the plan, the edit, the step, and
    /// whether its firing begins a run.
    pending: Option<(usize, Edit, usize, bool)>,
    /// The step last planned.
    last_step: Option<usize>,
    /// The ids of the step last planned: ids that do not extend them (another request's, or a
    /// rewrite) are read afresh, whatever the passes said about the old ones.
    cursor: Cursor,
}

/// The runs of one request's phrase: see the module's documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PhraseRuns {
    phrase: Vec<u32>,
    prompt_len: usize,
    /// The phrase's first token comes this many steps after the trigger (1: `trigger_after`).
    offset: usize,
    /// Steps after a phrase before the trigger is armed again.
    gap: usize,
    max_runs: Option<u32>,
    /// The trigger token of a phrase that follows its trigger step: generated ids ending with it
    /// read as a trigger that fired at the last step.
    trigger_before: Option<u32>,
    state: State,
    before: State,
}

impl PhraseRuns {
    pub fn new(
        phrase: Vec<u32>,
        prompt_len: usize,
        offset: usize,
        gap: usize,
        max_runs: Option<u32>,
    ) -> Self {
        Self {
            phrase,
            prompt_len,
            offset,
            gap,
            max_runs,
            trigger_before: None,
            state: State::default(),
            before: State::default(),
        }
    }

    /// The same runs, a phrase following `trigger`'s step (offset 1): ids that end with the
    /// trigger read as a trigger that fired at the last step (the model usually writes the token
    /// that was its argmax).
    pub fn with_trigger_before(mut self, trigger: Option<u32>) -> Self {
        self.trigger_before = trigger.filter(|_| self.offset == 1);
        self
    }

    pub fn phrase(&self) -> &[u32] {
        &self.phrase
    }

    /// The step being planned: generated tokens so far.
    pub fn step(&self, ids: &dyn TokenHistory) -> usize {
        ids.token_count().saturating_sub(self.prompt_len)
    }

    /// Learns what the last pass says and returns this step's phase, and whether the last armed
    /// step's trigger fired (`None`: not known from a pass). Call once per plan, before pushing.
    pub fn begin(&mut self, ids: &dyn TokenHistory, plan: &RowPlan) -> (Phase, Option<bool>) {
        self.before = self.state;
        let n = self.step(ids);
        let mut learned = None;
        let state = &mut self.state;
        let last_step = state.last_step;
        let advanced = last_step.is_some_and(|last| n > last);
        match state.pending.take() {
            Some((at, edit, step, starts_run)) if n > step => match plan.fired(at, &edit) {
                Some(fired) => {
                    learned = Some(fired);
                    if fired && starts_run {
                        state.runs += 1;
                        state.fired_at = Some(step);
                    }
                }
                None => state.observed = false,
            },
            // The same step planned again, or ids rolled back: read them.
            Some(_) => state.observed = false,
            None if !advanced => state.observed = false,
            None => {}
        }
        if state.fired_at.is_some_and(|f| n <= f) || !state.cursor.extended_by(ids) {
            state.observed = false;
        } else if let (Some(fired_at), Some(last)) = (state.fired_at, last_step) {
            // The ids since the last step, where the run forced its phrase, must be the phrase:
            // else they are not this run's (the forced token was not taken) and are read.
            let run = fired_at + self.offset..fired_at + self.offset + self.phrase.len();
            let written = last.max(run.start)..n.min(run.end);
            if written
                .into_iter()
                .any(|i| ids.token_at(self.prompt_len + i) != self.phrase[i - run.start])
            {
                state.observed = false;
            }
        }
        state.cursor.read_all(ids);
        if !state.observed {
            let (runs, fired_at) = self.read(ids);
            self.state.runs = runs;
            self.state.fired_at = fired_at;
        }
        self.state.last_step = Some(n);
        (self.phase(n), learned)
    }

    fn phase(&self, n: usize) -> Phase {
        let len = self.phrase.len();
        if let Some(fired_at) = self.state.fired_at {
            let k = n.saturating_sub(fired_at + self.offset);
            if n >= fired_at + self.offset && k < len {
                return Phase::Force(k);
            }
            if k < len + self.gap {
                return Phase::Idle;
            }
        }
        match self.max_runs {
            Some(max) if self.state.runs >= max => Phase::Done,
            _ => Phase::Armed,
        }
    }

    /// Pushes the armed step's trigger; `starts_run`: whether its firing begins a run.
    pub fn arm(&mut self, plan: &mut RowPlan, edit: Edit, n: usize, starts_run: bool) {
        self.state.pending = Some((plan.edits().len(), edit, n, starts_run));
        plan.push(edit);
        // A trigger whose outcome a pass will report: the state can follow the passes from here.
        self.state.observed = true;
    }

    /// A trigger decided without the row (a clock): the run begins at step `n`.
    pub fn fire_now(&mut self, n: usize) {
        self.state.runs += 1;
        self.state.fired_at = Some(n);
        self.state.observed = true;
    }

    /// Whether the state follows the passes (else it was read from the ids this step).
    pub fn observed(&self) -> bool {
        self.state.observed
    }

    /// The state, for a kind's [`crate::LogitsProcessor::checkpoint`]: what the passes said of
    /// its triggers is in it.
    pub fn saved(&self) -> State {
        self.state
    }

    pub fn restore(&mut self, state: State) {
        self.state = state;
    }

    pub fn undo(&mut self) {
        self.state = self.before;
    }

    pub fn reset(&mut self) {
        self.state = State::default();
        self.before = State::default();
    }

    /// Runs and the latest run's trigger step, from the generated ids alone.
    fn read(&self, ids: &dyn TokenHistory) -> (u32, Option<usize>) {
        let len = self.phrase.len();
        let n = self.step(ids);
        let at = |i: usize| ids.token_at(self.prompt_len + i);
        let matches = |start: usize, k: usize| (0..k).all(|j| at(start + j) == self.phrase[j]);
        let mut runs = 0u32;
        let mut fired_at = None;
        let mut i = 0;
        // Full occurrences, left to right, not overlapping.
        while i + len <= n {
            if matches(i, len) {
                runs += 1;
                fired_at = Some(i.saturating_sub(self.offset));
                i += len;
            } else {
                i += 1;
            }
        }
        // A part of the phrase ending the ids, after the last full one: the longest.
        let from = fired_at.map_or(0, |f| f + self.offset + len);
        for k in (1..len).rev() {
            if n >= k && n - k >= from && matches(n - k, k) {
                runs += 1;
                return (runs, Some((n - k).saturating_sub(self.offset)));
            }
        }
        let below_max = self.max_runs.is_none_or(|max| runs < max);
        if let Some(trigger) = self.trigger_before {
            if below_max && n > from && at(n - 1) == trigger {
                return (runs + 1, Some(n - 1));
            }
        }
        (runs, fired_at)
    }
}

/// Runs a processor through `rows` with its passes, the next id the forced one or else the row's
/// `fallback`; at each step a fresh processor given the same ids (a re-sent request) must edit
/// the row the same way. Returns the generated ids.
#[cfg(test)]
pub(crate) fn resumed_equals_uninterrupted(
    make: impl Fn() -> Box<dyn crate::processors::LogitsProcessor>,
    prompt: &[u32],
    rows: &[(Vec<f32>, u32)],
) -> Vec<u32> {
    use crate::{Pipeline, Step};
    let mut running = Pipeline::new(vec![Step::Processor(make())]);
    let mut ids = prompt.to_vec();
    for (row, fallback) in rows {
        let (mut got, mut want) = (row.clone(), row.clone());
        running.process(&ids, &mut got).unwrap();
        Pipeline::new(vec![Step::Processor(make())])
            .process(&ids, &mut want)
            .unwrap();
        assert_eq!(got, want, "after {ids:?}");
        let kept: Vec<usize> = (0..got.len()).filter(|&i| got[i].is_finite()).collect();
        ids.push(if kept.len() == 1 {
            kept[0] as u32
        } else {
            *fallback
        });
    }
    ids.split_off(prompt.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Trigger;

    fn trigger(n: usize) -> Edit {
        Edit::ForceIf {
            token: Some(7),
            when: Trigger::ArgmaxIs { token: 2 },
            key: n as u32,
        }
    }

    #[test]
    fn reads_runs_and_a_run_in_progress_from_the_ids() {
        let mut runs = PhraseRuns::new(vec![7, 8, 9], 2, 0, 0, None);
        // Prompt [0, 0]; generated: 7 8 9 (a run), 5, 7 8 (a run in progress).
        let ids = [0u32, 0, 7, 8, 9, 5, 7, 8];
        assert_eq!(runs.read(&ids), (2, Some(4)));
        assert_eq!(runs.begin(&ids, &RowPlan::new()), (Phase::Force(2), None));
        let done = [0u32, 0, 7, 8, 9];
        assert_eq!(runs.read(&done), (1, Some(0)));
    }

    #[test]
    fn a_fired_trigger_starts_the_run_and_counts_by_generated_tokens() {
        let mut runs = PhraseRuns::new(vec![7, 8], 1, 0, 0, Some(1));
        let mut plan = RowPlan::new();
        let (phase, _) = runs.begin(&[0u32], &plan);
        assert_eq!(phase, Phase::Armed);
        runs.arm(&mut plan, trigger(0), 0, true);
        // The row's argmax is token 2: the trigger fires and forces 7.
        let mut row = [0.0f32, 1.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0];
        plan.apply(&mut row).unwrap();
        assert_eq!(row.iter().filter(|x| x.is_finite()).count(), 1);
        assert_eq!(row[7], 0.5);
        plan.clear();
        let (phase, fired) = runs.begin(&[0u32, 7], &plan);
        assert_eq!((phase, fired), (Phase::Force(1), Some(true)));
        assert!(runs.observed());
        let (phase, _) = runs.begin(&[0u32, 7, 8], &plan);
        assert_eq!(phase, Phase::Done);
    }
}
