//! A row's plan: the edits a step decided on, applied to the row in one pass.

use crate::error::{check_token, Result};
use crate::kernels;
use crate::logit::Logit;

/// What a forced token's logit becomes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ForcedValue {
    /// It keeps the value it had (the reference adds a 0.0 mask entry, so `-0.0` becomes `0.0`).
    Keep,
    /// It is set to this value.
    Set(f32),
}

/// One edit of a row. A plan applies its edits in order, each with the meaning it has alone.
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
}

impl Edit {
    /// The token a sparse edit names, `None` for an edit of the whole row.
    pub fn token(&self) -> Option<u32> {
        match *self {
            Edit::Scale { .. } => None,
            Edit::Force { token, .. } | Edit::Ban { token } | Edit::Bias { token, .. } => {
                Some(token)
            }
        }
    }

    /// This edit applied to the logit at `index` whose value is `value`.
    #[inline]
    fn apply_at<T: Logit>(&self, index: usize, value: T) -> T {
        let here = |token: u32| token as usize == index;
        match *self {
            Edit::Scale { temperature } => T::from_f32(value.to_f32() / temperature),
            Edit::Force { token, value: kept } if here(token) => match kept {
                ForcedValue::Keep => T::from_f32(value.to_f32() + 0.0),
                ForcedValue::Set(v) => T::from_f32(v),
            },
            Edit::Force { .. } => T::NEG_INFINITY,
            Edit::Ban { token } if here(token) => T::NEG_INFINITY,
            Edit::Bias { token, bias } if here(token) => T::from_f32(value.to_f32() + bias),
            Edit::Ban { .. } | Edit::Bias { .. } => value,
        }
    }
}

/// The edits one row gets in one step, in order. Processors add to it; [`RowPlan::apply`] carries
/// it out in one pass over the row:
/// - with a `Force` anywhere, the row is filled with `-inf` (write only) and the one surviving
///   logit is computed on its own;
/// - otherwise each `Scale` is one pass (usually there is one), and the sparse edits (`Ban`,
///   `Bias`) touch only their tokens.
///
/// The result equals applying each edit to the whole row in turn (a property test checks it).
/// Non-finite inputs are the one deliberate difference from the reference: a forced row's other
/// logits become `-inf` even where they were NaN or `+inf` (the reference's mask add leaves NaN).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowPlan {
    edits: Vec<Edit>,
    // Reused between steps: the original values of the tokens that sparse edits touch.
    originals: Vec<(u32, f32)>,
}

impl RowPlan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets all edits, keeping the allocation.
    pub fn clear(&mut self) {
        self.edits.clear();
    }

    pub fn push(&mut self, edit: Edit) {
        self.edits.push(edit);
    }

    pub fn edits(&self) -> &[Edit] {
        &self.edits
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Checks that every token the plan names indexes a row of `vocab_size` logits.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        self.edits
            .iter()
            .filter_map(Edit::token)
            .try_for_each(|token| check_token("plan", token, vocab_size))
    }

    /// The token whose logit survives when the plan forces one: the last force's. Every other logit
    /// is `-inf` after it, and later edits keep `-inf` at `-inf`.
    pub fn forced_token(&self) -> Option<u32> {
        self.edits.iter().rev().find_map(|e| match *e {
            Edit::Force { token, .. } => Some(token),
            _ => None,
        })
    }

    /// The value the logit at `index` ends with, from its value before the plan.
    #[inline]
    pub fn value_at<T: Logit>(&self, index: usize, original: T) -> T {
        self.edits
            .iter()
            .fold(original, |value, edit| edit.apply_at(index, value))
    }

    /// Applies the plan to `row` in place. On error (a token outside the row) the row is untouched.
    pub fn apply<T: Logit>(&mut self, row: &mut [T]) -> Result<()> {
        self.validate(row.len())?;
        self.apply_validated(row, Fill::Cached);
        Ok(())
    }

    /// [`RowPlan::apply`] for a plan already validated against `row.len()`.
    pub(crate) fn apply_validated<T: Logit>(&mut self, row: &mut [T], fill: Fill) {
        if self.edits.is_empty() {
            return;
        }
        if let Some(token) = self.forced_token() {
            let index = token as usize;
            let survivor = self.value_at(index, row[index]);
            match fill {
                Fill::Cached => in_halves(row, |part| part.fill(T::NEG_INFINITY)),
                Fill::Streaming => {
                    in_halves(row, |part| kernels::fill_streaming(part, T::NEG_INFINITY))
                }
            }
            row[index] = survivor;
            return;
        }
        self.keep_originals(row);
        for edit in &self.edits {
            if let Edit::Scale { temperature } = *edit {
                in_halves(row, |part| T::divide_row(part, temperature));
            }
        }
        self.write_sparse(row);
    }

    /// The plan applied to `src`, written to `dst` (of the same length), `src` left as it is: one
    /// pass that reads and writes each logit once, where a copy and an edit in place would make
    /// two. The plan must be validated against the length.
    pub(crate) fn apply_into_validated<T: Logit>(&mut self, src: &[T], dst: &mut [T]) {
        if let Some(token) = self.forced_token() {
            let index = token as usize;
            dst.fill(T::NEG_INFINITY);
            dst[index] = self.value_at(index, src[index]);
            return;
        }
        self.keep_originals(src);
        let mut temperatures = self.edits.iter().filter_map(|edit| match *edit {
            Edit::Scale { temperature } => Some(temperature),
            _ => None,
        });
        match temperatures.next() {
            Some(temperature) => T::divide_into(src, dst, temperature),
            None => dst.copy_from_slice(src),
        }
        for temperature in temperatures {
            T::divide_row(dst, temperature);
        }
        self.write_sparse(dst);
    }

    /// Remembers the values before the plan of the tokens that sparse edits touch.
    fn keep_originals<T: Logit>(&mut self, row: &[T]) {
        self.originals.clear();
        for edit in &self.edits {
            if let Some(token) = edit.token() {
                self.originals.push((token, row[token as usize].to_f32()));
            }
        }
    }

    /// Writes the final value of each token a sparse edit touches, from its original.
    fn write_sparse<T: Logit>(&self, row: &mut [T]) {
        for &(token, original) in &self.originals {
            let index = token as usize;
            row[index] = self.value_at(index, T::from_f32(original));
        }
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

/// Rows at least this long are split in two halves on two threads when the row is edited inside
/// the core's thread pool (a batch's rows), where a join is a cheap push onto the worker's deque.
const SPLIT_LEN: usize = 1 << 16;

/// Runs `edit` over `row` (an element-wise edit, so any split gives the same result).
///
/// A row edited from outside the pool (a single-row call from Python) stays on the calling thread:
/// handing it to pool threads costs thread wake-ups (cross-CPU interrupts, expensive in a VM) that
/// measured more than the row's own work here: 30 us against 14 us for a 151,936-logit fill with
/// `rayon::join` from outside the pool, and still 18 against 12 with the caller sharing chunks with
/// one woken helper. A spinning helper (as OpenMP keeps) would win on an idle machine; see
/// docs/python.md.
fn in_halves<T: Send>(row: &mut [T], edit: impl Fn(&mut [T]) + Sync) {
    if row.len() >= SPLIT_LEN
        && rayon::current_thread_index().is_some()
        && rayon::current_num_threads() > 1
    {
        // A multiple of 64 keeps both halves on whole SIMD blocks and cache lines.
        let (first, second) = row.split_at_mut(row.len() / 2 / 64 * 64);
        rayon::join(|| edit(first), || edit(second));
    } else {
        edit(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use proptest::prelude::*;

    /// Each edit applied to the whole row in turn: the meaning a plan must keep.
    fn step_by_step<T: Logit>(edits: &[Edit], row: &mut [T]) {
        for edit in edits {
            for (i, x) in row.iter_mut().enumerate() {
                *x = edit.apply_at(i, *x);
            }
        }
    }

    fn edit_strategy(vocab: u32) -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0.05f32..20.0).prop_map(|temperature| Edit::Scale { temperature }),
            (0..vocab).prop_map(|token| Edit::Ban { token }),
            (0..vocab, -5.0f32..5.0).prop_map(|(token, bias)| Edit::Bias { token, bias }),
            (0..vocab).prop_map(|token| Edit::Force {
                token,
                value: ForcedValue::Keep
            }),
            (0..vocab, -3.0f32..3.0).prop_map(|(token, v)| Edit::Force {
                token,
                value: ForcedValue::Set(v)
            }),
        ]
    }

    fn bits<T: Logit>(row: &[T]) -> Vec<u32> {
        row.iter().map(|x| x.to_f32().to_bits()).collect()
    }

    proptest! {
        #[test]
        fn fused_pass_equals_step_by_step(
            row in proptest::collection::vec(-30.0f32..30.0, 1..64),
            edits in proptest::collection::vec(edit_strategy(64), 0..6),
        ) {
            let mut plan = RowPlan::new();
            edits
                .iter()
                .filter(|e| e.token().is_none_or(|t| (t as usize) < row.len()))
                .for_each(|e| plan.push(*e));

            let mut fused = row.clone();
            let mut expected = row.clone();
            plan.apply(&mut fused).unwrap();
            step_by_step(plan.edits(), &mut expected);
            prop_assert_eq!(bits(&fused), bits(&expected));

            let mut fused: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
            let mut expected = fused.clone();
            plan.apply(&mut fused).unwrap();
            step_by_step(plan.edits(), &mut expected);
            prop_assert_eq!(bits(&fused), bits(&expected));
        }

        #[test]
        fn applying_into_another_row_equals_a_copy_edited_in_place(
            row in proptest::collection::vec(-30.0f32..30.0, 1..200),
            edits in proptest::collection::vec(edit_strategy(200), 0..6),
        ) {
            let mut plan = RowPlan::new();
            edits
                .iter()
                .filter(|e| e.token().is_none_or(|t| (t as usize) < row.len()))
                .for_each(|e| plan.push(*e));
            let mut in_place = row.clone();
            plan.apply(&mut in_place).unwrap();
            let mut into = vec![7.0f32; row.len()];
            plan.apply_into_validated(&row, &mut into);
            prop_assert_eq!(bits(&into), bits(&in_place));

            let source: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
            let mut in_place = source.clone();
            plan.apply(&mut in_place).unwrap();
            let mut into = vec![bf16::ONE; row.len()];
            plan.apply_into_validated(&source, &mut into);
            prop_assert_eq!(bits(&into), bits(&in_place));
        }

        #[test]
        fn a_banned_token_never_comes_back(
            row in proptest::collection::vec(-30.0f32..30.0, 8..32),
            before in proptest::collection::vec(edit_strategy(8), 0..3),
            after in proptest::collection::vec(edit_strategy(8), 0..3),
            banned in 0u32..8,
        ) {
            let mut plan = RowPlan::new();
            before
                .iter()
                .chain(&[Edit::Ban { token: banned }])
                .chain(&after)
                .filter(|e| !matches!(e, Edit::Force { value: ForcedValue::Set(_), .. }))
                .for_each(|e| plan.push(*e));
            let mut row = row;
            plan.apply(&mut row).unwrap();
            prop_assert_eq!(row[banned as usize], f32::NEG_INFINITY);
        }
    }

    #[test]
    fn long_rows_split_across_threads_equal_one_pass() {
        let row: Vec<f32> = (0..200_003)
            .map(|i| (i % 1013) as f32 / 7.0 - 50.0)
            .collect();
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
            ],
        ];
        for edits in plans {
            let mut plan = RowPlan::new();
            edits.iter().for_each(|e| plan.push(*e));
            let mut expected = row.clone();
            step_by_step(&edits, &mut expected);
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
}
