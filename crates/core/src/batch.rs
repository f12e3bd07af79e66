//! The engine-facing object: one pipeline per row of a `[rows, vocab]` block, edited in one call.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::logit::Logit;
use crate::pipeline::Pipeline;
use crate::plan::Fill;

/// Blocks at least this large have their forced rows filled with streaming stores: they cannot
/// stay in cache anyway (see `Fill::Streaming`).
const STREAMING_MIN_BYTES: usize = 16 << 20;

/// The caller's hook for a pipeline's external steps: `(row, key, logits_row)`.
pub type ExternalCall<'a, T> = dyn FnMut(usize, u64, &mut [T]) -> Result<()> + 'a;

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
/// ```
/// use logits_processing::{parse_pipeline, Batch, BatchLayout, Pipeline, SpecContext, TokenHistory};
/// let vocab = 4;
/// let context = SpecContext { vocab_size: Some(vocab), ..Default::default() };
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
    rows: Vec<Option<Pipeline>>,
}

impl Batch {
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            rows: vec![],
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// How many rows hold a request.
    pub fn occupied(&self) -> usize {
        self.rows.iter().flatten().count()
    }

    pub fn get(&self, row: usize) -> Option<&Pipeline> {
        self.rows.get(row)?.as_ref()
    }

    pub fn get_mut(&mut self, row: usize) -> Option<&mut Pipeline> {
        self.rows.get_mut(row)?.as_mut()
    }

    /// Puts a new request's pipeline at `row`, replacing (and returning) what was there. Every
    /// token id the pipeline can name is checked against the vocab first.
    pub fn add(&mut self, row: usize, pipeline: Pipeline) -> Result<Option<Pipeline>> {
        pipeline.validate(self.vocab_size).map_err(|e| Error::Row {
            row,
            message: e.to_string(),
        })?;
        if self.rows.len() <= row {
            self.rows.resize_with(row + 1, || None);
        }
        Ok(self.rows[row].replace(pipeline))
    }

    /// Drops the empty slots past the last request.
    fn trim(&mut self) {
        while matches!(self.rows.last(), Some(None)) {
            self.rows.pop();
        }
    }

    /// Takes the request at `row` out of the batch.
    pub fn remove(&mut self, row: usize) -> Option<Pipeline> {
        let removed = self.rows.get_mut(row)?.take();
        self.trim();
        removed
    }

    /// Moves the request at `from` to `to` (vLLM's unidirectional move); what was at `to` is
    /// dropped and returned.
    pub fn move_row(&mut self, from: usize, to: usize) -> Option<Pipeline> {
        if from == to {
            return None;
        }
        let moving = self.remove(from);
        let replaced = self.remove(to);
        if let Some(pipeline) = moving {
            if self.rows.len() <= to {
                self.rows.resize_with(to + 1, || None);
            }
            self.rows[to] = Some(pipeline);
        }
        replaced
    }

    /// Swaps the requests at `a` and `b`.
    pub fn swap_rows(&mut self, a: usize, b: usize) {
        let len = self.rows.len().max(a + 1).max(b + 1);
        self.rows.resize_with(len, || None);
        self.rows.swap(a, b);
        self.trim();
    }

    /// Checks the block's shape: every row holding a request must lie in it.
    pub fn check_layout(&self, len: usize, layout: BatchLayout) -> Result<()> {
        if layout.row_stride < self.vocab_size {
            return Err(Error::Shape(format!(
                "row stride {} is less than the vocab size {}",
                layout.row_stride, self.vocab_size
            )));
        }
        let required = layout.required_len(self.vocab_size);
        if len < required {
            return Err(Error::Shape(format!(
                "{} rows of stride {} and vocab {} need {required} elements, the buffer has {len}",
                layout.rows, layout.row_stride, self.vocab_size
            )));
        }
        if let Some(row) = (layout.rows..self.rows.len()).find(|&r| self.rows[r].is_some()) {
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
    /// [`Batch::apply`]. Cheap: each processor reads only the ids new since its last step.
    pub fn plan(&mut self, histories: &[&dyn TokenHistory]) -> Result<()> {
        for (row, pipeline) in self.rows.iter_mut().enumerate() {
            if let Some(pipeline) = pipeline {
                let ids = histories.get(row).ok_or_else(|| Error::Row {
                    row,
                    message: format!("no token ids given ({} histories)", histories.len()),
                })?;
                pipeline.plan(*ids)?;
            }
        }
        Ok(())
    }

    /// Applies the last plans to the block; the second phase of [`Batch::apply`]. Rows without
    /// external steps run in parallel; rows with them run after, on this thread, calling
    /// `external(row, key, logits_row)` for each external step in its place.
    pub fn apply_planned<T: Logit>(
        &mut self,
        logits: &mut [T],
        layout: BatchLayout,
        external: &mut ExternalCall<'_, T>,
    ) -> Result<()> {
        self.check_layout(logits.len(), layout)?;
        let vocab = self.vocab_size;
        if layout.rows == 0 || vocab == 0 {
            return Ok(());
        }
        let block = &mut logits[..layout.required_len(vocab)];
        let fill = if std::mem::size_of_val(block) >= STREAMING_MIN_BYTES {
            Fill::Streaming
        } else {
            Fill::Cached
        };
        block
            .par_chunks_mut(layout.row_stride)
            .zip(self.rows.par_iter_mut())
            .for_each(|(row, pipeline)| {
                if let Some(pipeline) = pipeline.as_mut().filter(|p| !p.has_external()) {
                    // Built-in stages never fail once validated.
                    let _ = pipeline.apply_stages(&mut row[..vocab], fill, &mut |_, _| Ok(()));
                }
            });
        for (index, (row, pipeline)) in block
            .chunks_mut(layout.row_stride)
            .zip(self.rows.iter_mut())
            .enumerate()
        {
            if let Some(pipeline) = pipeline.as_mut().filter(|p| p.has_external()) {
                pipeline
                    .apply_planned(&mut row[..vocab], &mut |key, row| external(index, key, row))?;
            }
        }
        Ok(())
    }

    /// [`Batch::apply_planned`] reading `src` and writing `dst`, two blocks of one layout, `src`
    /// left as it is (HF transformers' rule for processors): each row is read and written once,
    /// where a copy and an edit in place would make two passes. Rows without a request are
    /// copied. On a shape error nothing is written.
    pub fn apply_planned_into<T: Logit>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        layout: BatchLayout,
        external: &mut ExternalCall<'_, T>,
    ) -> Result<()> {
        self.check_layout(src.len(), layout)?;
        self.check_layout(dst.len(), layout)?;
        let vocab = self.vocab_size;
        if layout.rows == 0 || vocab == 0 {
            return Ok(());
        }
        let len = layout.required_len(vocab);
        let (src, dst) = (&src[..len], &mut dst[..len]);
        // One slot per row of the block, so that rows without a request are visited (and copied).
        if self.rows.len() < layout.rows {
            self.rows.resize_with(layout.rows, || None);
        }
        dst.par_chunks_mut(layout.row_stride)
            .zip(src.par_chunks(layout.row_stride))
            .zip(self.rows.par_iter_mut())
            .for_each(|((to, from), pipeline)| match pipeline {
                Some(pipeline) if pipeline.has_external() => {}
                Some(pipeline) => {
                    // Built-in stages never fail once validated.
                    let _ = pipeline.apply_stages_into(
                        &from[..vocab],
                        &mut to[..vocab],
                        &mut |_, _| Ok(()),
                    );
                }
                None => to[..vocab].copy_from_slice(&from[..vocab]),
            });
        let mut result = Ok(());
        for (index, ((to, from), pipeline)) in dst
            .chunks_mut(layout.row_stride)
            .zip(src.chunks(layout.row_stride))
            .zip(self.rows.iter_mut())
            .enumerate()
        {
            if let Some(pipeline) = pipeline.as_mut().filter(|p| p.has_external()) {
                result = pipeline.apply_stages_into(
                    &from[..vocab],
                    &mut to[..vocab],
                    &mut |key, row| external(index, key, row),
                );
                if result.is_err() {
                    break;
                }
            }
        }
        self.trim();
        result
    }

    /// Edits every occupied row of `logits` with its pipeline, given each row's ids so far. On a
    /// shape error nothing is edited. A batch with no external steps cannot fail past the checks.
    pub fn apply<T: Logit>(
        &mut self,
        logits: &mut [T],
        layout: BatchLayout,
        histories: &[&dyn TokenHistory],
    ) -> Result<()> {
        self.check_layout(logits.len(), layout)?;
        self.plan(histories)?;
        self.apply_planned(logits, layout, &mut |row, key, _| {
            Err(Error::Row {
                row,
                message: format!("external step {key} needs a callback; use apply_planned"),
            })
        })
    }

    /// Every row index holding a request, with its pipeline.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Pipeline)> {
        self.rows
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.as_ref()?)))
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
        let step: Box<dyn crate::LogitsProcessor> = match kind % 4 {
            0 => Box::new(Temperature::new(0.3 + seed as f64 % 7.0).unwrap()),
            1 => Box::new(ForcedSequence::new(vec![seed % VOCAB as u32, 5], Some(0)).unwrap()),
            2 => Box::new(ThinkingBudget::new(tokens, (seed % 5) as usize, 0.5).unwrap()),
            _ => Box::new(crate::BanTokens::new(vec![seed % VOCAB as u32])),
        };
        let mut steps = vec![Step::Processor(step)];
        if kind >= 4 {
            steps.push(Step::Processor(Box::new(Temperature::new(0.7).unwrap())));
        }
        Pipeline::new(steps)
    }

    proptest! {
        /// The batch gives each row what its pipeline alone gives it, whatever the row order.
        #[test]
        fn batch_equals_each_row_alone(
            kinds in proptest::collection::vec(proptest::option::of((0u8..8, 0u32..1000)), 1..9),
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
    fn bad_shapes_and_vocab_are_errors_and_edit_nothing() {
        let mut batch = Batch::new(VOCAB);
        let too_big = Pipeline::new(vec![Step::Processor(Box::new(
            ForcedSequence::new(vec![VOCAB as u32], Some(0)).unwrap(),
        ))]);
        assert!(matches!(
            batch.add(0, too_big),
            Err(Error::Row { row: 0, .. })
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
}
