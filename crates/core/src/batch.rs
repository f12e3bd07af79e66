//! The engine-facing object: one pipeline per row of a `[rows, vocab]` block, edited in one call.

use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::logit::Logit;
use crate::pipeline::Pipeline;
use crate::plan::Fill;
use crate::raw::RawRow;

/// Blocks at least this large have their forced rows filled with streaming stores: they cannot
/// stay in cache anyway (see `Fill::Streaming`).
const STREAMING_MIN_BYTES: usize = 16 << 20;

/// Steps that edit less than this run on the calling thread: handing them to the pool costs thread
/// wake-ups, and on a machine whose cores are busy with other work (an engine's tokenizers,
/// scheduler, HTTP) the caller then waits for pool threads that cannot run.
const PARALLEL_MIN_BYTES: usize = 4 << 20;

/// Runs `edit` on every item of `work`, on this thread and the pool's threads together: each takes
/// the next item not yet taken until none is left. The caller works from the start rather than
/// handing everything to the pool and sleeping, so on a machine whose cores are busy with other
/// work (an engine's tokenizers, scheduler, HTTP) the step does not wait on pool threads that
/// cannot run: a pool task that starts late finds nothing left and returns at once.
fn edit_rows_with_caller<W: Send>(work: Vec<W>, edit: impl Fn(&mut W) + Sync) {
    let work: Vec<std::sync::Mutex<W>> = work.into_iter().map(std::sync::Mutex::new).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let take_and_edit = || loop {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(item) = work.get(i) else { break };
        // Each item is taken once, so its lock is never contended.
        edit(&mut item.lock().unwrap_or_else(|e| e.into_inner()));
    };
    let helpers = rayon::current_num_threads()
        .min(work.len())
        .saturating_sub(1);
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| take_and_edit());
        }
        take_and_edit();
    });
}

/// The caller's hook for a pipeline's external steps: `(row, key, logits_row)`.
pub type ExternalCall<'a, T> = dyn FnMut(usize, u64, &mut [T]) -> Result<()> + 'a;

/// A caller's bitmask for one step (`{"kind": "bitmask"}` rows): `words_per_row` packed words
/// per batch row (`ceil(vocab_size / 32)`), bit `i % 32` of word `i / 32` set allowing token `i`,
/// rows one after the other (llguidance's and xgrammar's layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBitmask<'a> {
    pub words: &'a [u32],
    pub words_per_row: usize,
}

/// Where the rows of a logits block lie in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLayout {
    /// Rows in the block (the engine's batch size this step).
    pub rows: usize,
    /// Elements from the start of one row to the next; at least the vocab size.
    pub row_stride: usize,
}

impl BatchLayout {
    /// A contiguous `[rows, vocab_size]` block.
    pub fn contiguous(rows: usize, vocab_size: usize) -> Self {
        Self {
            rows,
            row_stride: vocab_size,
        }
    }

    /// Elements a buffer must hold: the last row needs only `vocab_size` of its stride.
    pub fn required_len(&self, vocab_size: usize) -> usize {
        match self.rows {
            0 => 0,
            rows => (rows - 1) * self.row_stride + vocab_size,
        }
    }
}

/// One pipeline per batch row, following the engines' row lifecycle (a request added at a row,
/// removed, moved, two rows swapped), and one call per step that edits every row: rows in
/// parallel, each row in one pass. Rows with no request are left untouched.
///
/// A step is all or nothing: when [`Batch::plan`] or [`Batch::apply_planned`] fails in any row
/// (an id that is not a token id, a plan naming a token outside the vocab, a failing external
/// step), every row's logits and every processor's state are as they were before the step, and
/// the error says which row failed ([`Error::InRow`]). Row indices are keys, not positions in a
/// vector: any `usize` is a valid row, and nothing is allocated in proportion to one.
///
/// ```
/// use logits_processing::{parse_pipeline, Batch, BatchLayout, Pipeline, EngineContext, TokenHistory};
/// let vocab = 4;
/// let context = EngineContext { vocab_size: Some(vocab), ..Default::default() };
/// let mut batch = Batch::new(vocab);
/// let specs = parse_pipeline(r#"{"kind": "forced_sequence", "token_ids": [2], "eos_token_id": 0}"#)?;
/// batch.add(1, Pipeline::from_specs(&specs, &context, 0)?)?;
///
/// let mut logits = vec![1.0f32; 2 * vocab];
/// let ids: [&dyn TokenHistory; 2] = [&[5u32], &[7u32]];
/// batch.apply(&mut logits, BatchLayout::contiguous(2, vocab), &ids)?;
/// assert_eq!(logits[..4], [1.0; 4]); // row 0 holds no request
/// assert_eq!(logits[4..], [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug)]
pub struct Batch {
    vocab_size: usize,
    rows: BTreeMap<usize, Pipeline>,
    /// Requests set aside by [`Batch::park`], by ticket.
    parked: HashMap<u64, Pipeline>,
    next_ticket: u64,
    eos_token_ids: Vec<u32>,
}

impl Batch {
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            rows: BTreeMap::new(),
            parked: HashMap::new(),
            next_ticket: 0,
            eos_token_ids: vec![],
        }
    }

    /// The EOS ids a row is given when a step would leave it with no finite logit, for the
    /// pipelines added without their own ([`Pipeline::with_eos_token_ids`]); an id outside the
    /// vocab is a [`Error::TokenOutOfVocab`] naming `eos_token_id`.
    pub fn with_eos_token_ids(mut self, eos_token_ids: Vec<u32>) -> Result<Self> {
        eos_token_ids
            .iter()
            .try_for_each(|&eos| crate::error::check_token("eos_token_id", eos, self.vocab_size))?;
        self.eos_token_ids = eos_token_ids;
        Ok(self)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// How many rows hold a request.
    pub fn occupied(&self) -> usize {
        self.rows.len()
    }

    pub fn get(&self, row: usize) -> Option<&Pipeline> {
        self.rows.get(&row)
    }

    pub fn get_mut(&mut self, row: usize) -> Option<&mut Pipeline> {
        self.rows.get_mut(&row)
    }

    /// Puts a new request's pipeline at `row`, replacing (and returning) what was there. Every
    /// token id the pipeline can name is checked against the vocab first. A pipeline without EOS
    /// ids of its own takes the batch's ([`Batch::with_eos_token_ids`]).
    pub fn add(&mut self, row: usize, mut pipeline: Pipeline) -> Result<Option<Pipeline>> {
        if pipeline.eos_token_ids().is_empty() {
            pipeline = pipeline.with_eos_token_ids(self.eos_token_ids.clone());
        }
        pipeline
            .validate(self.vocab_size)
            .map_err(|e| e.in_row(row))?;
        Ok(self.rows.insert(row, pipeline))
    }

    /// Takes the request at `row` out of the batch.
    pub fn remove(&mut self, row: usize) -> Option<Pipeline> {
        self.rows.remove(&row)
    }

    /// Moves the request at `from` to `to` (vLLM's unidirectional move); what was at `to` is
    /// dropped and returned.
    pub fn move_row(&mut self, from: usize, to: usize) -> Option<Pipeline> {
        if from == to {
            return None;
        }
        match self.rows.remove(&from) {
            Some(pipeline) => self.rows.insert(to, pipeline),
            None => self.rows.remove(&to),
        }
    }

    /// Sets the request at `row` aside with all its state, leaving the row empty, and returns a
    /// ticket for [`Batch::unpark`] (None when the row is empty). For engines whose calls leave
    /// out requests that are still running (SGLang samples a prefill of joining requests without
    /// the running ones): state that the ids cannot rebuild (mirostat's `mu`, a clock, a moving
    /// average) then survives the call.
    pub fn park(&mut self, row: usize) -> Option<u64> {
        let pipeline = self.rows.remove(&row)?;
        self.next_ticket += 1;
        self.parked.insert(self.next_ticket, pipeline);
        Some(self.next_ticket)
    }

    /// Puts the request parked under `ticket` back at `row`, returning what was there; an unknown
    /// ticket is an [`Error::InvalidArgument`] naming `ticket`, and changes nothing.
    pub fn unpark(&mut self, ticket: u64, row: usize) -> Result<Option<Pipeline>> {
        let pipeline = self
            .parked
            .remove(&ticket)
            .ok_or_else(|| Error::InvalidArgument {
                field: "ticket".into(),
                message: format!("no request is parked under ticket {ticket}"),
            })?;
        Ok(self.rows.insert(row, pipeline))
    }

    /// Drops the request parked under `ticket`, returning it.
    pub fn discard(&mut self, ticket: u64) -> Option<Pipeline> {
        self.parked.remove(&ticket)
    }

    /// How many requests are parked.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Swaps the requests at `a` and `b`.
    pub fn swap_rows(&mut self, a: usize, b: usize) {
        let at_a = self.rows.remove(&a);
        let at_b = self.rows.remove(&b);
        if let Some(p) = at_a {
            self.rows.insert(b, p);
        }
        if let Some(p) = at_b {
            self.rows.insert(a, p);
        }
    }

    /// Checks the block's shape: every row holding a request must lie in it.
    pub fn check_layout(&self, len: usize, layout: BatchLayout) -> Result<()> {
        if layout.row_stride < self.vocab_size {
            return Err(Error::Shape(format!(
                "row stride {} is less than the vocab size {}",
                layout.row_stride, self.vocab_size
            )));
        }
        let required = layout
            .rows
            .checked_sub(1)
            .map_or(Some(0), |last| {
                last.checked_mul(layout.row_stride)?
                    .checked_add(self.vocab_size)
            })
            .ok_or_else(|| {
                Error::Shape(format!(
                    "{} rows of stride {} overflow",
                    layout.rows, layout.row_stride
                ))
            })?;
        if len < required {
            return Err(Error::Shape(format!(
                "{} rows of stride {} and vocab {} need {required} elements, the buffer has {len}",
                layout.rows, layout.row_stride, self.vocab_size
            )));
        }
        if let Some((&row, _)) = self.rows.range(layout.rows..).next() {
            return Err(Error::Row {
                row,
                message: format!(
                    "holds a request but the logits have only {} rows",
                    layout.rows
                ),
            });
        }
        Ok(())
    }

    /// Plans every occupied row from its ids (`histories[row]`); the first phase of
    /// [`Batch::apply`]: [`Batch::plan_ids`], then [`Batch::finish_plans`]. On error no
    /// processor's state has changed.
    pub fn plan(&mut self, histories: &[&dyn TokenHistory]) -> Result<()> {
        self.plan_with_bitmask(histories, None)
    }

    /// [`Batch::plan`] with the caller's bitmask for the rows that take one
    /// (`{"kind": "bitmask"}`); a step without one fails when a row takes one.
    pub fn plan_with_bitmask(
        &mut self,
        histories: &[&dyn TokenHistory],
        bitmask: Option<StepBitmask<'_>>,
    ) -> Result<()> {
        self.plan_ids(histories)?;
        if let Err(error) = self.fill_bitmask(bitmask) {
            self.undo_plan();
            return Err(error);
        }
        self.finish_plans();
        Ok(())
    }

    /// Copies the caller's bitmask rows into the plans of the rows that take one; the shape is
    /// checked against the vocab first.
    pub fn fill_bitmask(&mut self, bitmask: Option<StepBitmask<'_>>) -> Result<()> {
        let needed = self.vocab_size.div_ceil(32);
        if let Some(mask) = bitmask {
            if mask.words_per_row != needed {
                return Err(Error::Shape(format!(
                    "the bitmask has {} words per row, a vocab of {} needs {needed}",
                    mask.words_per_row, self.vocab_size
                )));
            }
        }
        for (&row, pipeline) in self.rows.iter_mut().filter(|(_, p)| p.takes_bitmask()) {
            let words = bitmask
                .ok_or_else(|| Error::Row {
                    row,
                    message: "has a bitmask spec but the step was given no bitmask".into(),
                })
                .and_then(|mask| {
                    let start = row
                        .checked_mul(needed)
                        .filter(|s| s + needed <= mask.words.len());
                    start
                        .map(|s| &mask.words[s..s + needed])
                        .ok_or_else(|| Error::Row {
                            row,
                            message: format!(
                                "holds a bitmask spec but the bitmask has only {} rows",
                                mask.words.len() / needed.max(1)
                            ),
                        })
                })?;
            pipeline
                .fill_caller_masks(words)
                .map_err(|e| e.in_row(row))?;
        }
        Ok(())
    }

    /// The costly part of planning (a grammar's mask), after [`Batch::plan_ids`]: the rows that
    /// have any, in parallel. Never fails; it reads no ids, so a binding runs it without its
    /// interpreter's lock.
    pub fn finish_plans(&mut self) {
        let mut rows: Vec<&mut Pipeline> =
            self.rows.values_mut().filter(|p| p.finishes()).collect();
        if rows.len() > 1 && rayon::current_num_threads() > 1 {
            rows.par_iter_mut().for_each(|p| p.finish());
        } else {
            rows.iter_mut().for_each(|p| p.finish());
        }
    }

    /// Plans every occupied row from its ids (`histories[row]`), leaving costly work to
    /// [`Batch::finish_plans`]. Cheap: each processor reads only the ids new since its last step.
    /// Every plan is then checked against the vocab. On error no processor's state has changed.
    pub fn plan_ids(&mut self, histories: &[&dyn TokenHistory]) -> Result<()> {
        let vocab = self.vocab_size;
        let mut failed = None;
        for (&row, pipeline) in self.rows.iter_mut() {
            let planned = match histories.get(row) {
                Some(ids) => pipeline.plan_ids(*ids),
                None => Err(Error::Row {
                    row,
                    message: format!("no token ids given ({} histories)", histories.len()),
                }),
            };
            if let Err(error) = planned {
                failed = Some((row, error));
                break;
            }
        }
        if failed.is_none() {
            failed = self
                .rows
                .iter()
                .find_map(|(&row, p)| p.validate_plans(vocab).err().map(|e| (row, e)));
            if failed.is_some() {
                self.undo_rows(usize::MAX);
            }
        } else if let Some((row, _)) = failed {
            self.undo_rows(row);
        }
        match failed {
            Some((row, error)) => Err(error.in_row(row)),
            None => Ok(()),
        }
    }

    /// Takes back the last successful [`Batch::plan`] (for a caller that will not apply it):
    /// every processor's state is again what it was before.
    pub fn undo_plan(&mut self) {
        self.undo_rows(usize::MAX);
    }

    /// Undoes the plans of the rows before `end`.
    fn undo_rows(&mut self, end: usize) {
        for pipeline in self.rows.range_mut(..end).map(|(_, p)| p) {
            pipeline.undo();
        }
    }

    /// Applies the last plans to the block; the second phase of [`Batch::apply`]. Rows with
    /// external steps run first, on this thread, calling `external(row, key, logits_row)` for
    /// each external step in its place; then the other rows in parallel. When an external step
    /// fails, the rows it and the steps before it edited are restored and every plan is undone
    /// (with [`Error::LogitsMoved`], the plans are undone and the block is not written again).
    pub fn apply_planned<T: Logit>(
        &mut self,
        logits: &mut [T],
        layout: BatchLayout,
        external: &mut ExternalCall<'_, T>,
    ) -> Result<()> {
        let stride = layout.row_stride;
        let vocab = self.vocab_size;
        let base = logits.as_mut_ptr();
        // SAFETY: the block is borrowed for the whole call; each external step's row slice is made
        // while no other reference to that row is alive.
        unsafe {
            self.apply_planned_raw(base, logits.len(), layout, &mut |row, key| {
                let start = row * stride;
                external(
                    row,
                    key,
                    std::slice::from_raw_parts_mut(base.add(start), vocab),
                )
            })
        }
    }

    /// [`Batch::apply_planned`] on a block given by address, for callers whose external steps
    /// write the rows through pointers of their own (a Python processor writing its tensor): no
    /// Rust reference to a row is alive while `external(row, key)` runs.
    ///
    /// # Safety
    /// `logits` must be valid for reads and writes of `len` elements for the whole call, and
    /// nothing but `external` (during its calls) may access them meanwhile. The one exception: a
    /// call of `external` that returns [`Error::LogitsMoved`] may leave them invalid, since
    /// nothing reads or writes them after it.
    pub unsafe fn apply_planned_raw<T: Logit>(
        &mut self,
        logits: *mut T,
        len: usize,
        layout: BatchLayout,
        external: &mut dyn FnMut(usize, u64) -> Result<()>,
    ) -> Result<()> {
        self.check_layout(len, layout)?;
        self.run(None, logits, len, layout, external)
    }

    /// [`Batch::apply_planned`] reading `src` and writing `dst`, two blocks of one layout, `src`
    /// left as it is (HF transformers' rule for processors): each row is read and written once,
    /// where a copy and an edit in place would make two passes. Rows without a request are
    /// copied. On error nothing is written.
    pub fn apply_planned_into<T: Logit>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        layout: BatchLayout,
        external: &mut ExternalCall<'_, T>,
    ) -> Result<()> {
        let (stride, vocab) = (layout.row_stride, self.vocab_size);
        let base = dst.as_mut_ptr();
        // SAFETY: as in `apply_planned`; `src` and `dst` are two borrows, so they do not overlap.
        unsafe {
            self.apply_planned_into_raw(
                src.as_ptr(),
                src.len(),
                base,
                dst.len(),
                layout,
                &mut |row, key| {
                    external(
                        row,
                        key,
                        std::slice::from_raw_parts_mut(base.add(row * stride), vocab),
                    )
                },
            )
        }
    }

    /// [`Batch::apply_planned_into`] on blocks given by address (see
    /// [`Batch::apply_planned_raw`]).
    ///
    /// # Safety
    /// As for [`Batch::apply_planned_raw`], for `dst`; `src` must be valid for reads of
    /// `src_len` elements (with the same exception) and must not overlap `dst`.
    pub unsafe fn apply_planned_into_raw<T: Logit>(
        &mut self,
        src: *const T,
        src_len: usize,
        dst: *mut T,
        dst_len: usize,
        layout: BatchLayout,
        external: &mut dyn FnMut(usize, u64) -> Result<()>,
    ) -> Result<()> {
        self.check_layout(src_len, layout)?;
        self.check_layout(dst_len, layout)?;
        self.run(Some(src), dst, dst_len, layout, external)
    }

    /// The shared body of the applies: external rows first (restorable), then the rest in
    /// parallel (they cannot fail once planned and validated).
    unsafe fn run<T: Logit>(
        &mut self,
        src: Option<*const T>,
        dst: *mut T,
        len: usize,
        layout: BatchLayout,
        external: &mut dyn FnMut(usize, u64) -> Result<()>,
    ) -> Result<()> {
        let vocab = self.vocab_size;
        if layout.rows == 0 || vocab == 0 {
            return Ok(());
        }
        let fill = if len.saturating_mul(std::mem::size_of::<T>()) >= STREAMING_MIN_BYTES {
            Fill::Streaming
        } else {
            Fill::Cached
        };
        let (dst, src) = (
            RawRow::new(dst, len),
            src.map(|s| RawRow::new(s as *mut T, len)),
        );
        let row_at = |row: usize| dst.part(row * layout.row_stride, vocab);
        let source_at = |row: usize| src.map(|s| s.part(row * layout.row_stride, vocab));

        // Rows with external steps: each saved before it is touched, so a failure can restore it.
        let mut saved: Vec<(usize, Vec<T>)> = vec![];
        let mut failure = None;
        for (&row, pipeline) in self.rows.iter_mut().filter(|(_, p)| p.has_external()) {
            saved.push((row, row_at(row).slice().to_vec()));
            let result =
                pipeline.apply_raw(source_at(row), row_at(row), Fill::Cached, &mut |key| {
                    external(row, key)
                });
            if let Err(error) = result {
                failure = Some(error.in_row(row));
                break;
            }
        }
        if let Some(error) = failure {
            // Memory the failed step freed is never written, not even to restore it.
            if !matches!(error.root(), Error::LogitsMoved(_)) {
                for (row, values) in saved {
                    row_at(row).slice().copy_from_slice(&values);
                }
            }
            self.undo_plan();
            return Err(error);
        }

        let mut work: Vec<(usize, Option<&mut Pipeline>)> = match src {
            // Out of place, every row of the block is written: rows without a request copied.
            Some(_) => {
                let mut pipelines = self.rows.iter_mut().peekable();
                let mut work = Vec::with_capacity(layout.rows);
                for row in 0..layout.rows {
                    match pipelines.next_if(|(&r, _)| r == row) {
                        Some((_, p)) if p.has_external() => {}
                        Some((_, p)) => work.push((row, Some(p))),
                        None => work.push((row, None)),
                    }
                }
                work
            }
            None => self
                .rows
                .iter_mut()
                .filter(|(_, p)| !p.has_external() && !p.is_empty())
                .map(|(&row, p)| (row, Some(p)))
                .collect(),
        };
        let edit_row = |(row, pipeline): &mut (usize, Option<&mut Pipeline>)| {
            let (to, from) = (row_at(*row), source_at(*row));
            match pipeline {
                // SAFETY (for the whole closure): rows of the block are disjoint and each is
                // handled by one task; built-in stages never fail once validated.
                Some(pipeline) => {
                    let _ = pipeline.apply_raw(from, to, fill, &mut |_| Ok(()));
                }
                None => {
                    if let Some(from) = from {
                        to.slice().copy_from_slice(from.slice());
                    }
                }
            }
        };
        let bytes = work.len() * vocab * std::mem::size_of::<T>();
        if bytes < PARALLEL_MIN_BYTES || rayon::current_num_threads() < 2 {
            work.iter_mut().for_each(edit_row);
        } else {
            edit_rows_with_caller(work, edit_row);
        }
        Ok(())
    }

    /// Edits every occupied row of `logits` with its pipeline, given each row's ids so far. On
    /// any error nothing is edited and no processor's state changes.
    pub fn apply<T: Logit>(
        &mut self,
        logits: &mut [T],
        layout: BatchLayout,
        histories: &[&dyn TokenHistory],
    ) -> Result<()> {
        self.apply_masked(logits, layout, histories, None)
    }

    fn apply_masked<T: Logit>(
        &mut self,
        logits: &mut [T],
        layout: BatchLayout,
        histories: &[&dyn TokenHistory],
        bitmask: Option<StepBitmask<'_>>,
    ) -> Result<()> {
        self.check_layout(logits.len(), layout)?;
        if let Some((&row, _)) = self.rows.iter().find(|(_, p)| p.has_external()) {
            return Err(Error::Row {
                row,
                message: "has external steps, which need a callback; use plan and apply_planned"
                    .into(),
            });
        }
        self.plan_with_bitmask(histories, bitmask)?;
        self.apply_planned(logits, layout, &mut |_, _, _| Ok(()))
    }

    /// [`Batch::apply`] with the caller's bitmask for the rows that take one
    /// (`{"kind": "bitmask"}`). A bitmask of the wrong shape, or none when a row takes one, is an
    /// error before anything is edited.
    pub fn apply_with_bitmask<T: Logit>(
        &mut self,
        logits: &mut [T],
        layout: BatchLayout,
        histories: &[&dyn TokenHistory],
        bitmask: StepBitmask<'_>,
    ) -> Result<()> {
        self.apply_masked(logits, layout, histories, Some(bitmask))
    }

    /// Every row index holding a request, with its pipeline, in row order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Pipeline)> {
        self.rows.iter().map(|(&row, p)| (row, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Step;
    use crate::processors::{ForcedSequence, Temperature, ThinkingBudget, ThinkingTokenConfig};
    use proptest::prelude::*;

    const VOCAB: usize = 37;

    fn pipeline_of(kind: u8, seed: u32) -> Pipeline {
        let tokens = ThinkingTokenConfig {
            start_token_id: 1,
            end_token_id: 2,
            newline_token_id: 3,
        };
        let token = seed % VOCAB as u32;
        let step: Box<dyn crate::LogitsProcessor> = match kind % 5 {
            0 => Box::new(Temperature::new(0.3 + seed as f64 % 7.0).unwrap()),
            1 => Box::new(ForcedSequence::new(vec![token, 5], Some(0)).unwrap()),
            2 => Box::new(ThinkingBudget::new(tokens, (seed % 5) as usize, 0.5).unwrap()),
            3 => Box::new(crate::BanTokens::new(vec![token])),
            // Allows one token, which the next step bans: no token is left.
            _ => Box::new(crate::processors::AllowedTokenIds::new(&[token]).unwrap()),
        };
        let mut steps = vec![Step::Processor(step)];
        if kind % 5 == 4 {
            steps.push(Step::Processor(Box::new(crate::BanTokens::new(vec![
                token,
            ]))));
        }
        if kind >= 5 {
            steps.push(Step::Processor(Box::new(Temperature::new(0.7).unwrap())));
        }
        Pipeline::new(steps)
    }

    proptest! {
        /// The batch gives each row what its pipeline alone gives it, whatever the row order.
        #[test]
        fn batch_equals_each_row_alone(
            kinds in proptest::collection::vec(proptest::option::of((0u8..10, 0u32..1000)), 1..9),
            history in proptest::collection::vec(0u32..6, 0..30),
            steps in 1usize..4,
            stride_pad in 0usize..3,
            seed in any::<u64>(),
        ) {
            let rows = kinds.len();
            let stride = VOCAB + stride_pad;
            let layout = BatchLayout { rows, row_stride: stride };
            let mut logits: Vec<f32> = (0..layout.required_len(VOCAB))
                .map(|i| ((i as u64).wrapping_mul(seed | 1) % 1000) as f32 / 37.0 - 13.0)
                .collect();
            let mut expected = logits.clone();

            // Rows are admitted in a shuffled order; the answer must not depend on it.
            let mut order: Vec<usize> = (0..rows).collect();
            order.sort_by_key(|&r| (r as u64).wrapping_mul(seed) % 97);
            let mut batch = Batch::new(VOCAB);
            for &r in &order {
                if let Some((kind, s)) = kinds[r] {
                    batch.add(r, pipeline_of(kind, s)).unwrap();
                }
            }
            let mut alone: Vec<Option<Pipeline>> =
                kinds.iter().map(|k| k.map(|(kind, s)| pipeline_of(kind, s))).collect();

            for step in 0..steps {
                let ids: Vec<Vec<u32>> = (0..rows)
                    .map(|r| history.iter().copied().chain([r as u32 % 6; 3].into_iter().take(step)).collect())
                    .collect();
                let refs: Vec<&dyn TokenHistory> = ids.iter().map(|v| v as &dyn TokenHistory).collect();
                let logits_before = logits.clone();
                batch.apply(&mut logits, layout, &refs).unwrap();
                for r in 0..rows {
                    if let Some(p) = alone[r].as_mut() {
                        p.process(refs[r], &mut expected[r * stride..r * stride + VOCAB]).unwrap();
                    }
                }
                prop_assert_eq!(
                    logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    expected.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
                // The same plans applied out of place, from the block as it was before the step.
                let mut into = vec![0.0f32; logits_before.len()];
                batch
                    .apply_planned_into(&logits_before, &mut into, layout, &mut |_, _, _| Ok(()))
                    .unwrap();
                for r in 0..rows {
                    let (from, to) = (r * stride, r * stride + VOCAB);
                    prop_assert_eq!(
                        into[from..to].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        logits[from..to].iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    );
                }
            }
        }
    }

    #[test]
    fn lifecycle_add_remove_move_swap() {
        let mut batch = Batch::new(VOCAB);
        batch.add(0, pipeline_of(1, 10)).unwrap();
        batch.add(3, pipeline_of(0, 1)).unwrap();
        assert_eq!(batch.occupied(), 2);
        assert!(batch.move_row(3, 1).is_none());
        assert!(batch.get(3).is_none() && batch.get(1).is_some());
        batch.swap_rows(0, 1);
        assert!(matches!(
            batch.get(1).unwrap().steps()[0],
            Step::Processor(_)
        ));
        let replaced = batch.move_row(0, 1);
        assert!(replaced.is_some());
        assert_eq!(batch.occupied(), 1);
        assert!(batch.remove(1).is_some());
        assert_eq!(batch.occupied(), 0);
    }

    #[test]
    fn a_parked_request_keeps_its_state_outside_the_block() {
        let forced = |logits: &[f32]| -> Vec<usize> {
            (0..VOCAB).filter(|&i| logits[i].is_finite()).collect()
        };
        let ids: [&dyn TokenHistory; 1] = [&[0u32; 0]];
        let one_row = BatchLayout::contiguous(1, VOCAB);
        let mut batch = Batch::new(VOCAB);
        batch.add(0, pipeline_of(1, 3)).unwrap(); // forces 3, then 5
        let mut logits = vec![1.0f32; VOCAB];
        batch.apply(&mut logits, one_row, &ids).unwrap();
        assert_eq!(forced(&logits), [3]);

        let ticket = batch.park(0).unwrap();
        assert!(batch.park(0).is_none());
        assert_eq!((batch.occupied(), batch.parked()), (0, 1));
        // Steps without it neither edit nor advance it.
        let mut logits = vec![1.0f32; VOCAB];
        batch.apply(&mut logits, one_row, &ids).unwrap();
        assert!(logits.iter().all(|&x| x == 1.0));
        assert!(matches!(
            batch.unpark(ticket + 1, 0),
            Err(Error::InvalidArgument { ref field, .. }) if field == "ticket"
        ));
        assert!(batch.unpark(ticket, 0).unwrap().is_none());
        assert_eq!((batch.occupied(), batch.parked()), (1, 0));
        batch.apply(&mut logits, one_row, &ids).unwrap();
        assert_eq!(forced(&logits), [5]);

        let ticket = batch.park(0).unwrap();
        assert!(batch.discard(ticket).is_some() && batch.discard(ticket).is_none());
        assert_eq!((batch.occupied(), batch.parked()), (0, 0));
    }

    #[test]
    fn bad_shapes_and_vocab_are_errors_and_edit_nothing() {
        let mut batch = Batch::new(VOCAB);
        let too_big = Pipeline::new(vec![Step::Processor(Box::new(
            ForcedSequence::new(vec![VOCAB as u32], Some(0)).unwrap(),
        ))]);
        assert!(matches!(
            batch.add(0, too_big),
            Err(Error::InRow { row: 0, .. })
        ));
        batch.add(2, pipeline_of(1, 3)).unwrap();
        let ids: [&dyn TokenHistory; 3] = [&[0u32; 0], &[0u32; 0], &[0u32; 0]];
        let mut logits = vec![1.0f32; 2 * VOCAB];
        // The request at row 2 lies outside a 2-row block.
        assert!(batch
            .apply(&mut logits, BatchLayout::contiguous(2, VOCAB), &ids)
            .is_err());
        let mut short = vec![1.0f32; 3 * VOCAB - 1];
        assert!(batch
            .apply(&mut short, BatchLayout::contiguous(3, VOCAB), &ids)
            .is_err());
        let narrow = BatchLayout {
            rows: 3,
            row_stride: VOCAB - 1,
        };
        assert!(batch.apply(&mut short, narrow, &ids).is_err());
        assert!(logits.iter().chain(&short).all(|&x| x == 1.0));
    }

    #[test]
    fn external_steps_run_in_their_place() {
        let mut batch = Batch::new(4);
        batch
            .add(
                0,
                Pipeline::new(vec![
                    Step::Processor(Box::new(Temperature::new(2.0).unwrap())),
                    Step::External(7),
                    Step::Processor(Box::new(Temperature::new(4.0).unwrap())),
                ]),
            )
            .unwrap();
        let mut logits = vec![8.0f32; 4];
        let ids: [&dyn TokenHistory; 1] = [&[0u32; 0]];
        batch.plan(&ids).unwrap();
        let mut seen = vec![];
        batch
            .apply_planned(
                &mut logits,
                BatchLayout::contiguous(1, 4),
                &mut |row, key, values| {
                    seen.push((row, key, values[0]));
                    values[0] = 100.0;
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(seen, [(0, 7, 4.0)]);
        assert_eq!(logits, [25.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn a_step_that_moved_the_logits_is_undone_without_writing_them() {
        let mut batch = Batch::new(4);
        for row in 0..2 {
            batch
                .add(
                    row,
                    Pipeline::new(vec![
                        Step::Processor(Box::new(
                            ForcedSequence::new(vec![1, 2], Some(0)).unwrap(),
                        )),
                        Step::External(row as u64),
                    ]),
                )
                .unwrap();
        }
        let layout = BatchLayout::contiguous(2, 4);
        let ids: [&dyn TokenHistory; 2] = [&[0u32; 0], &[0u32; 0]];
        let mut logits = vec![8.0f32; 8];
        batch.plan(&ids).unwrap();
        let error = batch
            .apply_planned(&mut logits, layout, &mut |row, _, _| match row {
                0 => Ok(()),
                _ => Err(Error::LogitsMoved("gone".into())),
            })
            .unwrap_err();
        assert!(matches!(error, Error::InRow { row: 1, .. }));
        // Not restored: the rows keep what the steps wrote (here, where the memory is still alive).
        assert_eq!(logits[1], 8.0);
        assert_eq!(logits[0], f32::NEG_INFINITY);
        // The plans were undone: the next step forces the first token again.
        let mut logits = vec![8.0f32; 8];
        batch.plan(&ids).unwrap();
        batch
            .apply_planned(&mut logits, layout, &mut |_, _, _| Ok(()))
            .unwrap();
        assert_eq!(logits[1], 8.0);
        assert_eq!(logits[5], 8.0);
        assert_eq!(logits[0], f32::NEG_INFINITY);
    }

    /// A processor that fails when it sees a given id, or plans a token outside the vocab (and
    /// does not say so in `max_token_id`).
    #[derive(Debug)]
    struct Faulty {
        fail_on: u32,
        out_of_vocab_on: u32,
    }

    impl crate::LogitsProcessor for Faulty {
        fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut crate::RowPlan) -> Result<()> {
            match ids.last_token() {
                Some(id) if id == self.fail_on => Err(Error::External("faulty".into())),
                Some(id) if id == self.out_of_vocab_on => {
                    plan.push(crate::Edit::Ban {
                        token: VOCAB as u32 + 3,
                    });
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        fn undo(&mut self) {}
    }

    fn with_faulty(kind: u8, seed: u32) -> Pipeline {
        let mut steps = vec![];
        steps.push(Step::Processor(Box::new(Faulty {
            fail_on: 100,
            out_of_vocab_on: 101,
        })
            as Box<dyn crate::LogitsProcessor>));
        steps.extend(pipeline_of(kind, seed).into_steps());
        steps.push(Step::Processor(Box::new(
            ForcedSequence::new(vec![seed % 5, 3, 4], Some(0)).unwrap(),
        )));
        Pipeline::new(steps)
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|x| x.to_bits()).collect()
    }

    proptest! {
        /// A step that fails in any row (a processor error, a plan outside the vocab, a failing
        /// external step) leaves every row's logits as they were, and the following steps behave
        /// as if it never happened (compared with a twin batch that never saw it).
        #[test]
        fn a_failed_step_changes_nothing(
            kinds in proptest::collection::vec((0u8..10, 0u32..1000), 1..7),
            failing_row in 0usize..7,
            failure in 0u8..3,
            steps_before in 0usize..3,
        ) {
            let rows = kinds.len();
            let failing_row = failing_row % rows;
            let layout = BatchLayout::contiguous(rows, VOCAB);
            let make = || {
                // Rows left with no finite logit are given EOS, and take it back with the step.
                let mut batch = Batch::new(VOCAB).with_eos_token_ids(vec![0]).unwrap();
                for (r, &(kind, seed)) in kinds.iter().enumerate() {
                    let mut pipeline = with_faulty(kind, seed);
                    if r == failing_row {
                        let mut steps = pipeline.into_steps();
                        steps.insert(1, Step::External(7));
                        pipeline = Pipeline::new(steps);
                    }
                    batch.add(r, pipeline).unwrap();
                }
                batch
            };
            let (mut batch, mut twin) = (make(), make());
            let start: Vec<f32> = (0..rows * VOCAB).map(|i| (i % 23) as f32 - 11.0).collect();
            let mut history: Vec<Vec<u32>> = vec![vec![9]; rows];
            let mut external_fails = false;
            let step = |batch: &mut Batch, history: &[Vec<u32>], fail: bool| {
                let refs: Vec<&dyn TokenHistory> = history.iter().map(|h| h as &dyn TokenHistory).collect();
                let mut logits = start.clone();
                let result = batch.plan(&refs).and_then(|_| {
                    batch.apply_planned(&mut logits, layout, &mut |_, _, row: &mut [f32]| {
                        row[0] = 1234.0;
                        if fail { Err(Error::External("user step".into())) } else { Ok(()) }
                    })
                });
                (result, logits)
            };
            for s in 0..steps_before {
                for h in history.iter_mut() { h.push(s as u32 % 5 + 5); }
                let (a, la) = step(&mut batch, &history, false);
                let (b, lb) = step(&mut twin, &history, false);
                prop_assert!(a.is_ok() && b.is_ok());
                prop_assert_eq!(bits(&la), bits(&lb));
            }
            // The failing step: only `batch` sees it.
            let mut failing = history.clone();
            match failure {
                0 => failing[failing_row].push(100),
                1 => failing[failing_row].push(101),
                _ => external_fails = true,
            }
            let (result, logits) = step(&mut batch, &failing, external_fails);
            match result {
                Err(Error::InRow { row, .. }) => prop_assert_eq!(row, failing_row),
                other => prop_assert!(false, "expected a row error, got {:?}", other),
            }
            prop_assert_eq!(bits(&logits), bits(&start));
            let failures = |batch: &Batch| batch.iter().map(|(_, p)| p.failures()).collect::<Vec<_>>();
            prop_assert_eq!(failures(&batch), failures(&twin));
            // Then both go on from the same history: the same answers.
            for s in 0..3 {
                for h in history.iter_mut() { h.push(s as u32 + 5); }
                let (a, la) = step(&mut batch, &history, false);
                let (b, lb) = step(&mut twin, &history, false);
                prop_assert!(a.is_ok() && b.is_ok());
                prop_assert_eq!(bits(&la), bits(&lb));
            }
            prop_assert_eq!(failures(&batch), failures(&twin));
        }
    }

    fn specs_pipeline(json: &str, eos: &[u32]) -> Pipeline {
        let context = crate::EngineContext {
            vocab_size: Some(VOCAB),
            eos_token_ids: eos.to_vec(),
            ..Default::default()
        };
        Pipeline::from_specs(&crate::parse_pipeline(json).unwrap(), &context, 0).unwrap()
    }

    fn eos_only(eos: &[u32]) -> Vec<u32> {
        bits(
            &(0..VOCAB as u32)
                .map(|t| {
                    if eos.contains(&t) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn a_row_left_with_no_token_allows_only_eos_and_says_why() {
        let mut batch = Batch::new(VOCAB);
        // The allowed id is banned: nothing is left.
        let emptied = r#"[{"kind": "ban_tokens", "token_ids": [3]},
                          {"kind": "allowed_token_ids", "token_ids": [3]}]"#;
        batch.add(0, specs_pipeline(emptied, &[2, 5])).unwrap();
        batch
            .add(
                1,
                specs_pipeline(r#"{"kind": "temperature", "temperature": 0.5}"#, &[2]),
            )
            .unwrap();
        let mut logits: Vec<f32> = (0..2 * VOCAB).map(|i| i as f32 / 10.0).collect();
        let ids: [&dyn TokenHistory; 2] = [&[1u32, 4], &[1u32]];
        batch
            .apply(&mut logits, BatchLayout::contiguous(2, VOCAB), &ids)
            .unwrap();
        assert_eq!(bits(&logits[..VOCAB]), eos_only(&[2, 5]));
        let failure = batch.get(0).unwrap().failures().join("; ");
        assert!(
            failure.contains("[0] ban_tokens, [1] allowed_token_ids"),
            "{failure}"
        );
        assert!(failure.contains("only EOS (ids [2, 5])"), "{failure}");
        assert!(batch.get(1).unwrap().failures().is_empty());

        // Logits given with no finite value, whatever the steps: the same state.
        logits[VOCAB..].fill(f32::NAN);
        logits[VOCAB + 7] = f32::NEG_INFINITY;
        batch
            .apply(&mut logits, BatchLayout::contiguous(2, VOCAB), &ids)
            .unwrap();
        assert_eq!(bits(&logits[VOCAB..]), eos_only(&[2]));
        let failure = batch.get(1).unwrap().failures().join("; ");
        assert!(
            failure.contains("logits given had no finite value"),
            "{failure}"
        );

        // A later step with finite logits is edited as usual; the reason stands until reset.
        logits[VOCAB..].fill(1.0);
        batch
            .apply(&mut logits, BatchLayout::contiguous(2, VOCAB), &ids)
            .unwrap();
        assert!(logits[VOCAB..].iter().all(|&x| x == 2.0));
        assert_eq!(batch.get(1).unwrap().failures().len(), 1);
        batch.get_mut(1).unwrap().reset();
        assert!(batch.get(1).unwrap().failures().is_empty());
    }

    #[test]
    fn without_eos_a_row_with_no_token_is_left_as_the_steps_left_it() {
        // The batch's EOS ids go to pipelines that have none; here neither has any.
        let mut batch = Batch::new(VOCAB);
        let emptied = r#"[{"kind": "allowed_token_ids", "token_ids": [3]},
                          {"kind": "ban_tokens", "token_ids": [3]}]"#;
        batch.add(0, specs_pipeline(emptied, &[])).unwrap();
        let mut logits = vec![1.0f32; VOCAB];
        let ids: [&dyn TokenHistory; 1] = [&[1u32]];
        batch
            .apply(&mut logits, BatchLayout::contiguous(1, VOCAB), &ids)
            .unwrap();
        assert!(logits.iter().all(|&x| x == f32::NEG_INFINITY));
        let failure = batch.get(0).unwrap().failures().join("; ");
        assert!(failure.contains("no EOS id is known"), "{failure}");

        let mut batch = Batch::new(VOCAB).with_eos_token_ids(vec![4]).unwrap();
        batch.add(0, specs_pipeline(emptied, &[])).unwrap();
        let mut logits = vec![1.0f32; VOCAB];
        batch
            .apply(&mut logits, BatchLayout::contiguous(1, VOCAB), &ids)
            .unwrap();
        assert_eq!(bits(&logits), eos_only(&[4]));
        assert!(matches!(
            Batch::new(VOCAB).with_eos_token_ids(vec![VOCAB as u32]),
            Err(Error::TokenOutOfVocab { .. })
        ));
    }

    #[test]
    fn a_bitmask_of_zeros_and_a_user_step_that_empties_the_row_are_caught() {
        let mut batch = Batch::new(VOCAB).with_eos_token_ids(vec![1]).unwrap();
        batch
            .add(0, specs_pipeline(r#"{"kind": "bitmask"}"#, &[]))
            .unwrap();
        batch
            .add(
                1,
                Pipeline::new(vec![
                    Step::Processor(Box::new(Temperature::new(2.0).unwrap())),
                    Step::External(9),
                ]),
            )
            .unwrap();
        let words = vec![0u32; 2 * VOCAB.div_ceil(32)];
        let mask = StepBitmask {
            words: &words,
            words_per_row: VOCAB.div_ceil(32),
        };
        let ids: [&dyn TokenHistory; 2] = [&[1u32], &[1u32]];
        let mut logits = vec![1.0f32; 2 * VOCAB];
        batch.plan_with_bitmask(&ids, Some(mask)).unwrap();
        batch
            .apply_planned(
                &mut logits,
                BatchLayout::contiguous(2, VOCAB),
                &mut |_, _, row: &mut [f32]| {
                    row.fill(f32::NEG_INFINITY);
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(bits(&logits[..VOCAB]), eos_only(&[1]));
        assert_eq!(bits(&logits[VOCAB..]), eos_only(&[1]));
        assert!(batch.get(0).unwrap().failures()[0].contains("[0] bitmask"));
        assert!(batch.get(1).unwrap().failures()[0].contains("[1] an external step"));
    }

    #[test]
    fn a_failed_step_takes_back_a_row_left_with_no_token() {
        let mut batch = Batch::new(VOCAB).with_eos_token_ids(vec![1]).unwrap();
        let emptied = Pipeline::new(vec![
            Step::Processor(Box::new(
                crate::processors::AllowedTokenIds::new(&[3]).unwrap(),
            )),
            Step::External(1),
            Step::Processor(Box::new(crate::BanTokens::new(vec![3]))),
        ]);
        batch.add(0, emptied).unwrap();
        batch
            .add(1, Pipeline::new(vec![Step::External(2)]))
            .unwrap();
        let ids: [&dyn TokenHistory; 2] = [&[1u32], &[1u32]];
        let start: Vec<f32> = (0..2 * VOCAB).map(|i| i as f32).collect();
        let mut logits = start.clone();
        batch.plan(&ids).unwrap();
        let error = batch
            .apply_planned(
                &mut logits,
                BatchLayout::contiguous(2, VOCAB),
                &mut |row, _, _: &mut [f32]| match row {
                    0 => Ok(()),
                    _ => Err(Error::External("user step".into())),
                },
            )
            .unwrap_err();
        assert!(matches!(error, Error::InRow { row: 1, .. }));
        assert_eq!(bits(&logits), bits(&start));
        assert!(batch.get(0).unwrap().failures().is_empty());
        // The same step again, without the failure: the row is caught, its steps named.
        batch.plan(&ids).unwrap();
        batch
            .apply_planned(
                &mut logits,
                BatchLayout::contiguous(2, VOCAB),
                &mut |_, _, _: &mut [f32]| Ok(()),
            )
            .unwrap();
        assert_eq!(bits(&logits[..VOCAB]), eos_only(&[1]));
        let failure = batch.get(0).unwrap().failures().join("; ");
        assert!(
            failure.contains("[0] AllowedTokenIds, [1] an external step, [2] BanTokens"),
            "{failure}"
        );
    }

    #[test]
    fn any_row_index_is_a_key_and_allocates_nothing_in_proportion() {
        let mut batch = Batch::new(VOCAB);
        batch.add(usize::MAX, pipeline_of(0, 1)).unwrap();
        batch.add(1 << 40, pipeline_of(1, 1)).unwrap();
        batch.swap_rows(usize::MAX, 3);
        assert!(batch.get(3).is_some() && batch.get(usize::MAX).is_none());
        assert!(batch.move_row(1 << 40, usize::MAX - 1).is_none());
        assert_eq!(
            batch.iter().map(|(r, _)| r).collect::<Vec<_>>(),
            [3, usize::MAX - 1]
        );
        let mut logits = vec![1.0f32; 4 * VOCAB];
        let ids: [&dyn TokenHistory; 4] = [&[0u32], &[0u32], &[0u32], &[0u32]];
        let error = batch
            .apply(&mut logits, BatchLayout::contiguous(4, VOCAB), &ids)
            .unwrap_err();
        assert!(matches!(error, Error::Row { row, .. } if row == usize::MAX - 1));
        assert!(logits.iter().all(|&x| x == 1.0));
        let huge = BatchLayout {
            rows: usize::MAX,
            row_stride: VOCAB,
        };
        assert!(matches!(batch.check_layout(10, huge), Err(Error::Shape(_))));
    }
}
