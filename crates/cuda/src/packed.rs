//! The packed form of a step's row plans that the kernel reads, and a host emulation of the kernel.
//!
//! Layout (u32 words; see `kernels/apply.cu`, which must agree): one descriptor of
//! [`DESC_WORDS`] words per listed row (a *slot*), then the data the descriptors point into:
//!
//! | word | meaning |
//! | --- | --- |
//! | 0 | row index in the block |
//! | 1 | the forced token ([`RowPlan::forced_token`]), or [`NO_FORCE`] |
//! | 2, 3 | word range of the dense scale chain: the temperatures of the `Scale` edits, in order |
//! | 4, 5 | word range of the sorted, distinct tokens that `Ban` / `Bias` edits touch |
//! | 6, 7 | word range of the whole edit list, [`EDIT_WORDS`] words an edit: kind, token, f32 bits |
//!
//! A forced row carries only its edit list (the survivor's value is `value_at` of its original;
//! every other logit becomes `-inf` unread). Any other row carries its scale chain, its touched
//! tokens, and, when it touches any, its edit list. Packing reuses one `Vec<u32>`: after the
//! first steps it allocates nothing.

use logits_processing::{Batch, BatchLayout, Edit, ForcedValue, Logit, RowPlan, Stage};

use crate::CudaError;

/// Threads per block; `THREADS` in the kernel.
pub const THREADS: usize = 256;
/// Logits per thread; `PER_THREAD` in the kernel.
pub const PER_THREAD: usize = 4;
/// Logits per block: a row is cut into `ceil(vocab / TILE)` tiles, one block each.
pub const TILE: usize = THREADS * PER_THREAD;
/// Words per slot descriptor.
pub const DESC_WORDS: usize = 8;
/// Words per packed edit.
pub const EDIT_WORDS: usize = 3;
/// The forced-token word of a row without a forced token.
pub const NO_FORCE: u32 = u32::MAX;

pub const EDIT_SCALE: u32 = 0;
pub const EDIT_FORCE_KEEP: u32 = 1;
pub const EDIT_FORCE_SET: u32 = 2;
pub const EDIT_BAN: u32 = 3;
pub const EDIT_BIAS: u32 = 4;

/// A step's plans, packed. Reuse one across steps: [`PackedPlans::pack`] clears and refills it.
#[derive(Debug, Default, Clone)]
pub struct PackedPlans {
    words: Vec<u32>,
    slots: usize,
    // Which rows were seen this step, to refuse a row listed twice (two blocks writing one row).
    seen: Vec<bool>,
}

impl PackedPlans {
    pub fn new() -> Self {
        Self::default()
    }

    /// The packed words, descriptors first.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// How many rows the kernel will edit (listed rows with a non-empty plan).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Packs `plans` (row, plan) for a block of `rows` rows of `vocab_size` logits. Empty plans are
    /// left out. Every plan is validated first (tokens inside the vocab, rows inside the block, no
    /// row twice); on error the previous content is gone and `slots()` is 0.
    ///
    /// `plans` makes the iterator; it is called twice (validate, then pack), so a caller can pass
    /// a filter over its own rows without collecting them.
    pub fn pack<'a, F, I>(
        &mut self,
        plans: F,
        rows: usize,
        vocab_size: usize,
    ) -> Result<(), CudaError>
    where
        F: Fn() -> I,
        I: Iterator<Item = (usize, &'a RowPlan)>,
    {
        self.words.clear();
        self.slots = 0;
        if vocab_size > i32::MAX as usize - TILE {
            return Err(CudaError::InvalidArgument(format!(
                "vocab size {vocab_size} is too large for the kernel's 32-bit indices"
            )));
        }
        self.seen.clear();
        self.seen.resize(rows, false);
        let mut slots = 0;
        for (row, plan) in plans() {
            if row >= rows {
                return Err(CudaError::InvalidArgument(format!(
                    "row {row} is outside the block's {rows} rows"
                )));
            }
            if std::mem::replace(&mut self.seen[row], true) {
                return Err(CudaError::InvalidArgument(format!(
                    "row {row} is listed twice"
                )));
            }
            plan.validate(vocab_size)?;
            if !plan.is_empty() {
                slots += 1;
            }
        }
        self.words.resize(slots * DESC_WORDS, 0);
        for (slot, (row, plan)) in plans().filter(|(_, p)| !p.is_empty()).enumerate() {
            let mut desc = [0u32; DESC_WORDS];
            desc[0] = row as u32;
            let forced = plan.forced_token();
            desc[1] = forced.unwrap_or(NO_FORCE);
            let at = |words: &Vec<u32>| words.len() as u32;
            desc[2] = at(&self.words);
            desc[3] = desc[2];
            desc[4] = desc[2];
            desc[5] = desc[2];
            if forced.is_none() {
                for edit in plan.edits() {
                    if let Edit::Scale { temperature } = *edit {
                        self.words.push(temperature.to_bits());
                    }
                }
                desc[3] = at(&self.words);
                desc[4] = desc[3];
                for edit in plan.edits() {
                    if let Some(token) = edit.token() {
                        self.words.push(token);
                    }
                }
                let touched = &mut self.words[desc[4] as usize..];
                touched.sort_unstable();
                let distinct = dedup_sorted(touched);
                self.words.truncate(desc[4] as usize + distinct);
                desc[5] = at(&self.words);
            }
            desc[6] = at(&self.words);
            if forced.is_some() || desc[5] > desc[4] {
                for edit in plan.edits() {
                    let (kind, token, value) = match *edit {
                        Edit::Scale { temperature } => (EDIT_SCALE, 0, temperature),
                        Edit::Force {
                            token,
                            value: ForcedValue::Keep,
                        } => (EDIT_FORCE_KEEP, token, 0.0),
                        Edit::Force {
                            token,
                            value: ForcedValue::Set(v),
                        } => (EDIT_FORCE_SET, token, v),
                        Edit::Ban { token } => (EDIT_BAN, token, 0.0),
                        Edit::Bias { token, bias } => (EDIT_BIAS, token, bias),
                    };
                    self.words
                        .extend_from_slice(&[kind, token, value.to_bits()]);
                }
            }
            desc[7] = at(&self.words);
            self.words[slot * DESC_WORDS..(slot + 1) * DESC_WORDS].copy_from_slice(&desc);
        }
        if self.words.len() > u32::MAX as usize {
            self.words.clear();
            return Err(CudaError::InvalidArgument(
                "the packed plans exceed 4 G words".into(),
            ));
        }
        self.slots = slots;
        Ok(())
    }
}

/// Moves the distinct values of a sorted slice to its front; returns how many there are.
fn dedup_sorted(values: &mut [u32]) -> usize {
    if values.is_empty() {
        return 0;
    }
    let mut kept = 1;
    for i in 1..values.len() {
        if values[i] != values[kept - 1] {
            values[kept] = values[i];
            kept += 1;
        }
    }
    kept
}

/// Blocks per row for a vocab: `ceil(vocab / TILE)`.
pub fn tiles_per_row(vocab_size: usize) -> usize {
    vocab_size.div_ceil(TILE)
}

/// The kernel's `T::round`: a value rounded to the element type and widened back.
fn round<T: Logit>(v: f32) -> f32 {
    T::from_f32(v).to_f32()
}

fn value_at<T: Logit>(words: &[u32], begin: usize, end: usize, index: u32, mut v: f32) -> f32 {
    for e in words[begin..end].chunks_exact(EDIT_WORDS) {
        let (kind, token, x) = (e[0], e[1], f32::from_bits(e[2]));
        v = match kind {
            EDIT_SCALE => round::<T>(v / x),
            EDIT_FORCE_KEEP if token == index => round::<T>(v + 0.0),
            EDIT_FORCE_SET if token == index => round::<T>(x),
            EDIT_FORCE_KEEP | EDIT_FORCE_SET => f32::NEG_INFINITY,
            EDIT_BAN if token == index => f32::NEG_INFINITY,
            EDIT_BIAS if token == index => round::<T>(v + x),
            _ => v,
        };
    }
    v
}

fn lower_bound(words: &[u32], mut begin: usize, mut end: usize, token: u32) -> usize {
    while begin < end {
        let mid = begin + (end - begin) / 2;
        if words[mid] < token {
            begin = mid + 1;
        } else {
            end = mid;
        }
    }
    begin
}

/// Runs the kernel's algorithm on the host: every block (slot, tile) and every thread of it, in
/// the kernel's order, over `logits` (`row_stride` elements a row), with the kernel's arithmetic
/// (values held in f32, rounded to the element type after every edit). The property tests compare
/// it with [`RowPlan::apply`] bit for bit, which checks the packing without a GPU.
pub fn emulate<T: Logit>(
    packed: &PackedPlans,
    vocab_size: usize,
    row_stride: usize,
    logits: &mut [T],
) {
    emulate_typed(packed, vocab_size, row_stride, logits)
}

fn emulate_typed<T: Logit>(packed: &PackedPlans, vocab: usize, stride: usize, logits: &mut [T]) {
    let words = packed.words();
    let tiles = tiles_per_row(vocab);
    let vocab = vocab as u32;
    for block in 0..packed.slots() * tiles {
        let (slot, tile) = (block / tiles, block % tiles);
        let d = &words[slot * DESC_WORDS..(slot + 1) * DESC_WORDS];
        let [row, forced, scale_begin, scale_end, touched_begin, touched_end, edit_begin, edit_end] =
            std::array::from_fn(|i| d[i]);
        let (edit_begin, edit_end) = (edit_begin as usize, edit_end as usize);
        let x = &mut logits[row as usize * stride..];
        let tile_begin = (tile * TILE) as u32;
        if forced != NO_FORCE {
            for thread in 0..THREADS as u32 {
                for k in 0..PER_THREAD as u32 {
                    let i = tile_begin + thread + k * THREADS as u32;
                    if i < vocab {
                        let i_ = i as usize;
                        x[i_] = if i == forced {
                            T::from_f32(value_at::<T>(
                                words,
                                edit_begin,
                                edit_end,
                                i,
                                x[i_].to_f32(),
                            ))
                        } else {
                            T::NEG_INFINITY
                        };
                    }
                }
            }
            continue;
        }
        let (touched_begin, touched_end) = (touched_begin as usize, touched_end as usize);
        let (mut lo, mut hi) = (touched_begin, touched_begin);
        if touched_begin < touched_end {
            lo = lower_bound(words, touched_begin, touched_end, tile_begin);
            hi = lower_bound(words, lo, touched_end, tile_begin + TILE as u32);
        }
        if scale_begin == scale_end {
            for thread in 0..THREADS {
                for t in (lo + thread..hi).step_by(THREADS) {
                    let i = words[t];
                    let v = value_at::<T>(words, edit_begin, edit_end, i, x[i as usize].to_f32());
                    x[i as usize] = T::from_f32(v);
                }
            }
            continue;
        }
        for thread in 0..THREADS as u32 {
            for k in 0..PER_THREAD as u32 {
                let i = tile_begin + thread + k * THREADS as u32;
                if i >= vocab {
                    continue;
                }
                let mut r = x[i as usize].to_f32();
                let mut touched = false;
                if lo < hi {
                    let at = lower_bound(words, lo, hi, i);
                    touched = at < hi && words[at] == i;
                }
                if touched {
                    r = value_at::<T>(words, edit_begin, edit_end, i, r);
                } else {
                    for &s in &words[scale_begin as usize..scale_end as usize] {
                        r = round::<T>(r / f32::from_bits(s));
                    }
                }
                x[i as usize] = T::from_f32(r);
            }
        }
    }
}

/// Stage levels of a planned batch: the most stages any row has.
pub(crate) fn levels(batch: &Batch) -> usize {
    batch
        .iter()
        .map(|(_, p)| p.stages().len())
        .max()
        .unwrap_or(0)
}

/// The rows whose `level`-th stage is a plan, with it.
pub(crate) fn level_plans(batch: &Batch, level: usize) -> impl Iterator<Item = (usize, &RowPlan)> {
    batch
        .iter()
        .filter_map(move |(row, pipeline)| match pipeline.stages().get(level) {
            Some(Stage::Plan(plan)) => Some((row, plan)),
            _ => None,
        })
}

/// The rows whose `level`-th stage is an external step, with its key.
pub(crate) fn level_externals(
    batch: &Batch,
    level: usize,
) -> impl Iterator<Item = (usize, u64)> + '_ {
    batch
        .iter()
        .filter_map(move |(row, pipeline)| match pipeline.stages().get(level) {
            Some(Stage::External(key)) => Some((row, *key)),
            _ => None,
        })
}

/// The host emulation's hook for an external step: `(row, key, logits_row)`.
pub type HostExternal<'a, T> = dyn FnMut(usize, u64, &mut [T]) -> Result<(), CudaError> + 'a;

/// `CudaBatchApplier::apply_batch` on the host: the same stage levels, packing and launches, with
/// [`emulate`] for each launch and `external(row, key, row_logits)` for each external step.
pub fn emulate_batch<T: Logit>(
    packed: &mut PackedPlans,
    batch: &Batch,
    logits: &mut [T],
    layout: BatchLayout,
    external: &mut HostExternal<'_, T>,
) -> Result<(), CudaError> {
    let vocab = batch.vocab_size();
    batch.check_layout(logits.len(), layout)?;
    for level in 0..levels(batch) {
        packed.pack(|| level_plans(batch, level), layout.rows, vocab)?;
        emulate(packed, vocab, layout.row_stride, logits);
        for (row, key) in level_externals(batch, level) {
            let start = row * layout.row_stride;
            external(row, key, &mut logits[start..start + vocab])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_keeps_distinct_sorted_values() {
        let mut v = [1, 1, 2, 5, 5, 5, 9];
        let n = dedup_sorted(&mut v);
        assert_eq!(&v[..n], &[1, 2, 5, 9]);
        assert_eq!(dedup_sorted(&mut []), 0);
    }

    #[test]
    fn kernel_constants_match_the_source() {
        let source = crate::KERNEL_SOURCE;
        let define = |name: &str| -> String {
            let prefix = format!("#define {name} ");
            source
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("{name} is not defined in apply.cu"))
                .trim()
                .to_string()
        };
        assert_eq!(define("THREADS"), THREADS.to_string());
        assert_eq!(define("PER_THREAD"), PER_THREAD.to_string());
        assert_eq!(define("DESC_WORDS"), DESC_WORDS.to_string());
        assert_eq!(define("EDIT_WORDS"), EDIT_WORDS.to_string());
        assert_eq!(define("NO_FORCE"), format!("0x{NO_FORCE:X}u"));
        for (name, value) in [
            ("EDIT_SCALE", EDIT_SCALE),
            ("EDIT_FORCE_KEEP", EDIT_FORCE_KEEP),
            ("EDIT_FORCE_SET", EDIT_FORCE_SET),
            ("EDIT_BAN", EDIT_BAN),
            ("EDIT_BIAS", EDIT_BIAS),
        ] {
            assert_eq!(define(name), format!("{value}u"));
        }
    }
}
