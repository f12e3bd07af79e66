//! The packed form of a step's row plans that the kernels read (the host emulation of the
//! kernels, the tests' oracle, is [`emulate`]'s module, `packed/emulate.rs`).
//!
//! The words follow the plan's own shape ([`RowPlan`]): each row's *dense* edits (scales, masks,
//! forces, truncations) as one chain that every logit goes through, and its *sparse* edits (bans,
//! biases, penalties, raises, sets) grouped by token into one short *program* per touched token,
//! each sparse op tagged with how many dense ops come before it in the plan. A touched logit's value is then its
//! own ops and the dense ops merged in plan order: O(its edits + dense edits), never a scan of the
//! whole edit list.
//!
//! Layout (u32 words), one descriptor of [`DESC_WORDS`] words per listed row (a *slot*), then the
//! data the descriptors point into, then the list of slots that truncate:
//!
//! | word | meaning |
//! | --- | --- |
//! | 0 | row index in the block |
//! | 1 | the forced token ([`RowPlan::forced_token`]), or [`NO_TOKEN`] |
//! | 2, 3 | word offset and count of the dense ops, [`DENSE_WORDS`] words each |
//! | 4, 5 | word offset and count of the touched tokens (sorted, distinct) |
//! | 6 | word offset of the programs' bounds: touched count + 1 word offsets into the sparse ops |
//! | 7 | how many truncations the row has |
//! | 8, 9 | word offset and count of a forced row's other survivors (sorted, distinct) |
//!
//! A forced row's other survivors are the tokens an [`Edit::Set`] after its last force names
//! ([`RowPlan::set_after_force`]), the forced token left out: usually none.
//!
//! Dense op: `[op, a, b, c]`: [`Op::Scale`] `a` = temperature bits; [`Op::ForceKeep`] `a` = token;
//! [`Op::ForceSet`] `a` = token, `b` = value bits; [`Op::Mask`] `a` = word offset of the mask's
//! words, `b` = their count, `c` = 1 when tokens past them are allowed; [`Op::Truncate`] `a` = word
//! offset of its band record, `b` = the last force's token before it since the previous truncation
//! (or [`NO_TOKEN`]): as a truncation sees the row, a logit that force did not name is `-inf`,
//! unless an [`Edit::Set`] after the force (and before the truncation) names it.
//!
//! Sparse op: `[op | dense_before << OP_BITS, value bits]` for [`Op::Ban`], [`Op::Bias`] (the bias),
//! [`Op::Penalty`] (the penalty), [`Op::AddScaledAbs`] (the factor), [`Op::Set`] (the value).
//!
//! Band record ([`BAND_WORDS`] words): `[lo, hi, rule, parameter, min_keep]`. The band kernel
//! (`lp_bands_*`, one block per truncating row) resolves each truncation of a row in order over
//! the row as it stands there and writes `lo` and `hi`; the apply kernel then reads them.
//!
//! A forced row writes `-inf` everywhere but its survivors (the forced token and the tokens an
//! [`Edit::Set`] after the last force names), unread; only the survivors' programs are
//! packed (every touched token's when the row also truncates: the bands see them). Packing reuses
//! its buffers: after the first steps it allocates nothing. Its cost is linear in the edits (one
//! sort of the sparse edits by token) plus a copy of each mask's words.
//!
//! The op codes, the layout constants and the rules' codes are defined here once; the kernel gets
//! them from [`kernel_header`], prepended to its source ([`crate::kernel_source`]).

use logits_processing::truncation::{self, Softmax};
pub use logits_processing::truncation::{from_order_key, order_key};
use logits_processing::{
    Band, Batch, BatchLayout, Bitmask, Edit, ForcedValue, Logit, RowPlan, Stage, Truncation,
};

use crate::CudaError;

mod emulate;

pub use emulate::{
    emulate, emulate_batch, radix_kth_largest, resolve_band, select_key, HostExternal,
};

/// Threads per block of both kernels.
pub const THREADS: usize = 256;
/// Logits per thread in a tile.
pub const PER_THREAD: usize = 4;
/// Logits per block of the apply kernel: a row is cut into `ceil(vocab / TILE)` tiles.
pub const TILE: usize = THREADS * PER_THREAD;
/// Words per slot descriptor.
pub const DESC_WORDS: usize = 10;
/// Words per dense op.
pub const DENSE_WORDS: usize = 4;
/// Words per sparse op.
pub const SPARSE_WORDS: usize = 2;
/// Words per band record.
pub const BAND_WORDS: usize = 5;
/// No token: a row without a forced token, a truncation without a force before it.
pub const NO_TOKEN: u32 = u32::MAX;
/// A sparse op's first word: the op code in the low `OP_BITS` bits, the dense ops before it above.
pub const OP_BITS: u32 = 8;
/// Bits per digit of the band kernel's radix select (one histogram bin per thread).
pub const RADIX_BITS: u32 = 8;

/// The most dense ops a row may have (the sparse ops' `dense_before` field).
const MAX_DENSE: usize = 1 << (32 - OP_BITS);

/// The kernel's op codes: one per edit meaning, each carried out as [`Edit::value`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(test, derive(strum::EnumIter))]
#[repr(u32)]
pub enum Op {
    Scale = 0,
    ForceKeep = 1,
    ForceSet = 2,
    Ban = 3,
    Bias = 4,
    Penalty = 5,
    Mask = 6,
    Truncate = 7,
    AddScaledAbs = 8,
    Set = 9,
}

impl Op {
    pub const ALL: [Op; 10] = [
        Op::Scale,
        Op::ForceKeep,
        Op::ForceSet,
        Op::Ban,
        Op::Bias,
        Op::Penalty,
        Op::Mask,
        Op::Truncate,
        Op::AddScaledAbs,
        Op::Set,
    ];

    /// The op that carries out `edit`; `None` for an edit the kernel does not have (a
    /// [`Edit::Reshape`], [`Edit::ForceIf`], [`Edit::AddScaledFrom`] or [`Edit::BiasLargest`]:
    /// plans holding one are refused,
    /// [`RowPlan::cpu_only`]). Exhaustive: a new
    /// kind of edit does not compile until it is given an op here (and then in the kernel, through
    /// [`kernel_header`]) or refused.
    pub fn of(edit: &Edit) -> Option<Op> {
        Some(match edit {
            Edit::Scale { .. } => Op::Scale,
            Edit::Force {
                value: ForcedValue::Keep,
                ..
            } => Op::ForceKeep,
            Edit::Force {
                value: ForcedValue::Set(_),
                ..
            } => Op::ForceSet,
            Edit::Ban { .. } => Op::Ban,
            Edit::Bias { .. } => Op::Bias,
            Edit::Penalty { .. } => Op::Penalty,
            Edit::AddScaledAbs { .. } => Op::AddScaledAbs,
            Edit::Set { .. } => Op::Set,
            Edit::Mask(_) => Op::Mask,
            Edit::Truncate(_) => Op::Truncate,
            Edit::Reshape(_)
            | Edit::ForceIf { .. }
            | Edit::AddScaledFrom { .. }
            | Edit::Whole(_)
            | Edit::BiasLargest { .. } => return None,
        })
    }

    /// Its name in the kernel source.
    pub fn c_name(self) -> &'static str {
        match self {
            Op::Scale => "OP_SCALE",
            Op::ForceKeep => "OP_FORCE_KEEP",
            Op::ForceSet => "OP_FORCE_SET",
            Op::Ban => "OP_BAN",
            Op::Bias => "OP_BIAS",
            Op::Penalty => "OP_PENALTY",
            Op::Mask => "OP_MASK",
            Op::Truncate => "OP_TRUNCATE",
            // The kernel source's name for it (the checked-in PTX carries a hash of that source).
            Op::AddScaledAbs => "OP_RAISE",
            Op::Set => "OP_SET",
        }
    }

    pub fn from_code(code: u32) -> Option<Op> {
        Op::ALL.into_iter().find(|op| *op as u32 == code)
    }
}

/// A truncation rule's code in a band record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(test, derive(strum::EnumIter))]
#[repr(u32)]
pub enum Rule {
    TopK = 0,
    TopP = 1,
    MinP = 2,
    Typical = 3,
    Epsilon = 4,
    Eta = 5,
}

impl Rule {
    pub const ALL: [Rule; 6] = [
        Rule::TopK,
        Rule::TopP,
        Rule::MinP,
        Rule::Typical,
        Rule::Epsilon,
        Rule::Eta,
    ];

    /// The rule's code, its parameter's bits and `min_keep`, as a band record holds them; `None`
    /// for a rule the kernel does not have ([`Truncation::on_cpu_only`]).
    pub fn of(rule: &Truncation) -> Option<(Rule, u32, u32)> {
        Some(match *rule {
            Truncation::TopK { k, min_keep } => (Rule::TopK, k, min_keep),
            Truncation::TopP { p, min_keep } => (Rule::TopP, p.to_bits(), min_keep),
            Truncation::MinP { p, min_keep } => (Rule::MinP, p.to_bits(), min_keep),
            Truncation::Typical { mass, min_keep } => (Rule::Typical, mass.to_bits(), min_keep),
            Truncation::Epsilon { epsilon, min_keep } => {
                (Rule::Epsilon, epsilon.to_bits(), min_keep)
            }
            Truncation::Eta { epsilon, min_keep } => (Rule::Eta, epsilon.to_bits(), min_keep),
            Truncation::TopNSigma { .. }
            | Truncation::TopA { .. }
            | Truncation::PLess { .. }
            | Truncation::TopH { .. }
            | Truncation::TailFree { .. }
            | Truncation::Xtc { .. }
            | Truncation::MirostatV1 { .. }
            | Truncation::MirostatV2 { .. } => return None,
        })
    }

    /// The rule a band record holds.
    pub fn decode(code: u32, parameter: u32, min_keep: u32) -> Option<Truncation> {
        let x = f32::from_bits(parameter);
        Some(match Rule::ALL.into_iter().find(|r| *r as u32 == code)? {
            Rule::TopK => Truncation::TopK {
                k: parameter,
                min_keep,
            },
            Rule::TopP => Truncation::TopP { p: x, min_keep },
            Rule::MinP => Truncation::MinP { p: x, min_keep },
            Rule::Typical => Truncation::Typical { mass: x, min_keep },
            Rule::Epsilon => Truncation::Epsilon {
                epsilon: x,
                min_keep,
            },
            Rule::Eta => Truncation::Eta {
                epsilon: x,
                min_keep,
            },
        })
    }

    pub fn c_name(self) -> &'static str {
        match self {
            Rule::TopK => "RULE_TOP_K",
            Rule::TopP => "RULE_TOP_P",
            Rule::MinP => "RULE_MIN_P",
            Rule::Typical => "RULE_TYPICAL",
            Rule::Epsilon => "RULE_EPSILON",
            Rule::Eta => "RULE_ETA",
        }
    }
}

/// A constant of the packed layout, as the kernels see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Constant {
    Int(u32),
    Float(f32),
}

/// Every constant of the packed layout, every op code and rule code, and exp's coefficients, by
/// name: their one definition, which the CUDA source ([`kernel_header`]) and the Triton kernels
/// (through the Python extension) are both given.
pub fn constants() -> Vec<(String, Constant)> {
    use Constant::{Float, Int};
    let mut all: Vec<(String, Constant)> = [
        ("THREADS", Int(THREADS as u32)),
        ("PER_THREAD", Int(PER_THREAD as u32)),
        ("DESC_WORDS", Int(DESC_WORDS as u32)),
        ("DENSE_WORDS", Int(DENSE_WORDS as u32)),
        ("SPARSE_WORDS", Int(SPARSE_WORDS as u32)),
        ("BAND_WORDS", Int(BAND_WORDS as u32)),
        ("NO_TOKEN", Int(NO_TOKEN)),
        ("OP_BITS", Int(OP_BITS)),
        ("RADIX_BITS", Int(RADIX_BITS)),
        ("FIXED_BITS", Int(truncation::FIXED_BITS)),
        ("EXP_MIN", Float(truncation::EXP_MIN)),
        ("EXP_MAX", Float(truncation::EXP_MAX)),
        ("EXP_LOG2_E", Float(truncation::EXP_LOG2_E)),
        ("EXP_SHIFTER", Float(truncation::EXP_SHIFTER)),
        ("EXP_LN2_HI", Float(truncation::EXP_LN2_HI)),
        ("EXP_LN2_LO", Float(truncation::EXP_LN2_LO)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    for (i, c) in truncation::EXP_POLY.iter().enumerate() {
        all.push((format!("EXP_POLY_{i}"), Float(*c)));
    }
    all.push((
        "EXP_POLY_LEN".into(),
        Int(truncation::EXP_POLY.len() as u32),
    ));
    for op in Op::ALL {
        all.push((op.c_name().to_string(), Int(op as u32)));
    }
    for rule in Rule::ALL {
        all.push((rule.c_name().to_string(), Int(rule as u32)));
    }
    all
}

/// The `#define`s the kernel source is compiled with: [`constants`], floats by their bits (the
/// kernel's exp is the core's, operation for operation).
pub fn kernel_header() -> String {
    let mut h = String::from(
        "// Generated by crates/cuda/src/packed.rs (kernel_header): the packed layout's constants.\n",
    );
    for (name, value) in constants() {
        let value = match value {
            // THREADS and PER_THREAD are used in array sizes and static_asserts: plain ints.
            Constant::Int(v) if name == "THREADS" || name == "PER_THREAD" => v.to_string(),
            Constant::Int(v) if name == "NO_TOKEN" => format!("0x{v:X}u"),
            Constant::Int(v) => format!("{v}u"),
            Constant::Float(x) => format!("__uint_as_float(0x{:08X}u)", x.to_bits()),
        };
        h.push_str(&format!("#define {name} {value}\n"));
    }
    h
}

/// One sparse edit while packing: its token, its place in the plan, its op word and value.
#[derive(Debug, Clone, Copy)]
struct Sparse {
    token: u32,
    at: u32,
    head: u32,
    value: u32,
}

/// A step's plans, packed. Reuse one across steps: [`PackedPlans::pack`] clears and refills it.
#[derive(Debug, Default, Clone)]
pub struct PackedPlans {
    words: Vec<u32>,
    slots: usize,
    truncating: (usize, usize),
    // Which rows were seen this step, to refuse a row listed twice (two blocks writing one row).
    seen: Vec<bool>,
    sparse: Vec<Sparse>,
    // A forced row's other survivors (sorted, distinct): the tokens a set after its last force names.
    survivors: Vec<u32>,
    truncating_slots: Vec<u32>,
}

impl PackedPlans {
    pub fn new() -> Self {
        Self::default()
    }

    /// The packed words, descriptors first.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// How many rows the apply kernel will edit (listed rows with a non-empty plan).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The word offset and length of the list of slots that truncate (the band kernel's grid).
    pub fn truncating(&self) -> (usize, usize) {
        self.truncating
    }

    /// Packs `plans` (row, plan) for a block of `rows` rows of `vocab_size` logits. Empty plans are
    /// left out. Every plan is checked first (tokens inside the vocab, rows inside the block, no
    /// row twice); on error the previous content is gone and
    /// `slots()` is 0.
    ///
    /// `plans` makes the iterator; it is called twice (check, then pack), so a caller can pass a
    /// filter over its own rows without collecting them.
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
        self.truncating = (0, 0);
        self.truncating_slots.clear();
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
            let desc = self.pack_row(row, plan, vocab_size)?;
            if desc[7] > 0 {
                self.truncating_slots.push(slot as u32);
            }
            self.words[slot * DESC_WORDS..(slot + 1) * DESC_WORDS].copy_from_slice(&desc);
        }
        self.truncating = (self.words.len(), self.truncating_slots.len());
        self.words.extend_from_slice(&self.truncating_slots);
        if self.words.len() > u32::MAX as usize {
            self.words.clear();
            return Err(CudaError::InvalidArgument(
                "the packed plans exceed 4 G words".into(),
            ));
        }
        self.slots = slots;
        Ok(())
    }

    /// Appends one row's data; returns its descriptor.
    fn pack_row(
        &mut self,
        row: usize,
        plan: &RowPlan,
        vocab: usize,
    ) -> Result<[u32; DESC_WORDS], CudaError> {
        let edits = plan.edits();
        let forced = plan.forced_token();
        let n_dense = edits.iter().filter(|e| !e.is_sparse()).count();
        if n_dense >= MAX_DENSE {
            return Err(CudaError::InvalidArgument(format!(
                "row {row} has {n_dense} dense edits; the kernel takes fewer than {MAX_DENSE}"
            )));
        }
        let mut desc = [0u32; DESC_WORDS];
        desc[0] = row as u32;
        desc[1] = forced.unwrap_or(NO_TOKEN);
        let dense_begin = self.words.len();
        desc[2] = dense_begin as u32;
        desc[3] = n_dense as u32;
        self.words.resize(dense_begin + n_dense * DENSE_WORDS, 0);

        // A forced row's other survivors: what a Set after its last force brings back.
        self.survivors.clear();
        if let Some(f) = forced {
            self.survivors
                .extend(plan.set_after_force(0..edits.len()).filter(|&t| t != f));
            self.survivors.sort_unstable();
            self.survivors.dedup();
        }

        // Dense ops in order (their data appended after them), sparse edits collected.
        let truncates = plan.truncates();
        self.sparse.clear();
        let mut dense = 0;
        let mut segment_force = NO_TOKEN;
        let mut truncations = 0;
        for (at, edit) in edits.iter().enumerate() {
            let op = Op::of(edit).ok_or_else(|| unsupported(row, edit))?;
            if edit.is_sparse() {
                let (token, value) = match *edit {
                    Edit::Ban { token } => (token, 0),
                    Edit::Bias { token, bias } => (token, bias.to_bits()),
                    Edit::Penalty { token, penalty } => (token, penalty.to_bits()),
                    Edit::AddScaledAbs { token, factor } => (token, factor.to_bits()),
                    Edit::Set { token, value } => (token, value.to_bits()),
                    _ => unreachable!("only ban, bias, penalty, raise and set are sparse"),
                };
                // A forced row needs only its survivors' programs, unless a band sees the others.
                if truncates
                    || forced.is_none_or(|f| f == token)
                    || self.survivors.binary_search(&token).is_ok()
                {
                    self.sparse.push(Sparse {
                        token,
                        at: at as u32,
                        head: op as u32 | (dense as u32) << OP_BITS,
                        value,
                    });
                }
                continue;
            }
            let words: [u32; DENSE_WORDS] = match *edit {
                Edit::Scale { temperature } => [op as u32, temperature.to_bits(), 0, 0],
                Edit::Force { token, value } => {
                    segment_force = token;
                    let v = match value {
                        ForcedValue::Keep => 0,
                        ForcedValue::Set(v) => v.to_bits(),
                    };
                    [op as u32, token, v, 0]
                }
                Edit::Mask(id) => {
                    let mask = plan.bitmask(id);
                    // Words past the vocab are never read.
                    let len = mask.words.len().min(vocab.div_ceil(32));
                    let offset = self.words.len() as u32;
                    self.words.extend_from_slice(&mask.words[..len]);
                    [op as u32, offset, len as u32, mask.beyond_allowed as u32]
                }
                Edit::Truncate(rule) => {
                    let (code, parameter, min_keep) =
                        Rule::of(&rule).ok_or_else(|| unsupported(row, edit))?;
                    let offset = self.words.len() as u32;
                    let all = Band::ALL;
                    self.words.extend_from_slice(&[
                        all.lo.to_bits(),
                        all.hi.to_bits(),
                        code as u32,
                        parameter,
                        min_keep,
                    ]);
                    truncations += 1;
                    [
                        op as u32,
                        offset,
                        std::mem::replace(&mut segment_force, NO_TOKEN),
                        0,
                    ]
                }
                Edit::Ban { .. }
                | Edit::Bias { .. }
                | Edit::Penalty { .. }
                | Edit::AddScaledAbs { .. }
                | Edit::Set { .. } => unreachable!(),
                Edit::Reshape(_)
                | Edit::ForceIf { .. }
                | Edit::AddScaledFrom { .. }
                | Edit::Whole(_)
                | Edit::BiasLargest { .. } => {
                    unreachable!("refused by `Op::of` above")
                }
            };
            let at = dense_begin + dense * DENSE_WORDS;
            self.words[at..at + DENSE_WORDS].copy_from_slice(&words);
            dense += 1;
        }
        desc[7] = truncations;

        // Sparse edits grouped by token, each token's in plan order: one sort.
        self.sparse.sort_unstable_by_key(|s| (s.token, s.at));
        let touched = self
            .sparse
            .iter()
            .enumerate()
            .filter(|&(i, s)| i == 0 || self.sparse[i - 1].token != s.token)
            .count();
        desc[4] = self.words.len() as u32;
        desc[5] = touched as u32;
        let bounds = desc[4] as usize + touched;
        desc[6] = bounds as u32;
        let ops = bounds + touched + 1;
        self.words.resize(ops, 0);
        let mut t = 0;
        for (i, s) in self.sparse.iter().enumerate() {
            if i == 0 || self.sparse[i - 1].token != s.token {
                self.words[desc[4] as usize + t] = s.token;
                self.words[bounds + t] = (ops + i * SPARSE_WORDS) as u32;
                t += 1;
            }
        }
        self.words[bounds + touched] = (ops + self.sparse.len() * SPARSE_WORDS) as u32;
        for s in &self.sparse {
            self.words.extend_from_slice(&[s.head, s.value]);
        }
        desc[8] = self.words.len() as u32;
        desc[9] = self.survivors.len() as u32;
        self.words.extend_from_slice(&self.survivors);
        Ok(desc)
    }
}

/// The error for an edit the kernel does not carry out.
fn unsupported(row: usize, edit: &Edit) -> CudaError {
    CudaError::Unsupported(format!(
        "row {row}'s plan holds {edit:?}, which only the CPU path carries out"
    ))
}

/// Blocks per row for a vocab: `ceil(vocab / TILE)`.
pub fn tiles_per_row(vocab_size: usize) -> usize {
    vocab_size.div_ceil(TILE)
}

/// Whether the kernel carries out every edit of `plan` (what [`PackedPlans::pack`] accepts,
/// apart from its bounds checks): `false` exactly when [`RowPlan::cpu_only`] is true.
pub fn kernel_carries(plan: &RowPlan) -> bool {
    plan.edits().iter().all(|edit| match edit {
        Edit::Truncate(rule) => Rule::of(rule).is_some(),
        other => Op::of(other).is_some(),
    })
}

/// Whether some row of a planned batch holds, at some stage, a plan the kernel does not carry
/// out: a step the host round trip ([`crate::round_trip`]) takes.
pub fn needs_host(batch: &Batch) -> bool {
    (0..levels(batch)).any(|level| level_plans(batch, level).any(|(_, plan)| !kernel_carries(plan)))
}

/// Stage levels of a planned batch: the most stages any row has.
pub fn levels(batch: &Batch) -> usize {
    batch
        .iter()
        .map(|(_, p)| p.stages().len())
        .max()
        .unwrap_or(0)
}

/// The rows whose `level`-th stage is a plan, with it.
pub fn level_plans(batch: &Batch, level: usize) -> impl Iterator<Item = (usize, &RowPlan)> {
    batch
        .iter()
        .filter_map(move |(row, pipeline)| match pipeline.stages().get(level) {
            Some(Stage::Plan(plan)) => Some((row, plan)),
            _ => None,
        })
}

/// The rows whose `level`-th stage is an external step, with its key.
pub fn level_externals(batch: &Batch, level: usize) -> impl Iterator<Item = (usize, u64)> + '_ {
    batch
        .iter()
        .filter_map(move |(row, pipeline)| match pipeline.stages().get(level) {
            Some(Stage::External(key)) => Some((row, *key)),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use logits_processing::Truncation;

    /// Every truncation rule: the kernel carries a plan holding it exactly when the plan is not
    /// `cpu_only`, and `pack` accepts it exactly then.
    #[test]
    fn kernel_carries_exactly_the_plans_pack_accepts() {
        let rules = [
            Truncation::TopK { k: 2, min_keep: 1 },
            Truncation::TopP {
                p: 0.5,
                min_keep: 1,
            },
            Truncation::MinP {
                p: 0.1,
                min_keep: 1,
            },
            Truncation::Typical {
                mass: 0.5,
                min_keep: 1,
            },
            Truncation::Epsilon {
                epsilon: 0.01,
                min_keep: 1,
            },
            Truncation::Eta {
                epsilon: 0.01,
                min_keep: 1,
            },
            Truncation::TopNSigma { n: 1.0 },
            Truncation::TopA {
                a: 0.1,
                min_keep: 1,
            },
            Truncation::TailFree {
                z: 0.9,
                min_keep: 1,
            },
            Truncation::Xtc {
                threshold: 0.1,
                min_keep: 1,
            },
            Truncation::MirostatV1 {
                mu: 5.0,
                m: 4,
                n_vocab: 8,
                key: 0,
            },
            Truncation::MirostatV2 { mu: 5.0, key: 0 },
        ];
        let mut refused = 0;
        for rule in rules {
            let mut plan = RowPlan::new();
            plan.push(Edit::Truncate(rule));
            let carries = kernel_carries(&plan);
            assert_eq!(carries, !plan.cpu_only(), "{rule:?}");
            let packed = PackedPlans::new().pack(|| std::iter::once((0, &plan)), 1, 8);
            assert_eq!(packed.is_ok(), carries, "{rule:?}: {packed:?}");
            refused += usize::from(!carries);
        }
        // top-n-sigma, top-a, tail-free, XTC and both mirostats.
        assert_eq!(refused, 6);
    }

    #[test]
    fn op_codes_are_distinct_and_decode() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(Op::from_code(*op as u32), Some(*op));
            assert!(Op::ALL[..i].iter().all(|o| *o as u32 != *op as u32));
            assert!((*op as u32) < 1 << OP_BITS);
        }
        for rule in Rule::ALL {
            let t = Rule::decode(rule as u32, 0x3f00_0000, 3).unwrap();
            assert_eq!(Rule::of(&t).unwrap().0, rule);
        }
    }

    /// `ALL` (which the header, the decoder and the self-check go by) holds every variant, as
    /// the enums themselves list them: a variant left out of `ALL` fails here. (`Op::of` is an
    /// exhaustive match: a new kind of edit does not compile without its op.)
    #[test]
    fn all_lists_every_variant_in_code_order() {
        use strum::IntoEnumIterator;
        assert_eq!(Op::iter().collect::<Vec<_>>().len(), Op::ALL.len());
        for op in Op::iter() {
            assert_eq!(Op::ALL[op as usize], op, "{op:?}");
        }
        assert_eq!(Rule::iter().collect::<Vec<_>>().len(), Rule::ALL.len());
        for rule in Rule::iter() {
            assert_eq!(Rule::ALL[rule as usize], rule, "{rule:?}");
        }
    }

    #[test]
    fn the_header_defines_every_constant() {
        use strum::IntoEnumIterator;
        let header = kernel_header();
        // Every variant of the enums themselves, not of the `ALL` the header is written from.
        for op in Op::iter() {
            assert!(header.contains(&format!("#define {} {}u\n", op.c_name(), op as u32)));
        }
        for rule in Rule::iter() {
            assert!(header.contains(&format!("#define {} {}u\n", rule.c_name(), rule as u32)));
        }
        assert!(header.contains(&format!("#define THREADS {THREADS}\n")));
        assert!(header.contains("#define NO_TOKEN 0xFFFFFFFFu\n"));
        // exp's constants by their bits: 1.5 * 2^23 and the polynomial's last coefficient.
        assert!(header.contains("#define EXP_SHIFTER __uint_as_float(0x4B400000u)\n"));
        let last = logits_processing::truncation::EXP_POLY[5].to_bits();
        assert!(header.contains(&format!(
            "#define EXP_POLY_5 __uint_as_float(0x{last:08X}u)\n"
        )));
    }

    #[test]
    fn order_keys_follow_total_cmp() {
        let xs = [
            f32::NEG_INFINITY,
            -1e30,
            -1.0,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            1.0,
            3e38,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{} {}", w[0], w[1]);
        }
        for x in xs {
            assert_eq!(from_order_key(order_key(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn radix_select_equals_the_cpu_top_k() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..400 {
            let len = 1 + (next() % 300) as usize;
            let values: Vec<f32> = (0..len)
                .map(|_| match next() % 12 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f32::NEG_INFINITY,
                    4 => f32::INFINITY,
                    5 => 1.5,
                    _ => (next() % 2000) as f32 / 37.0 - 27.0,
                })
                .collect();
            let k = (next() % (len as u64 + 3)) as u32;
            let rule = Truncation::TopK { k, min_keep: 1 };
            let cpu = rule.band(&values, &mut vec![]);
            let gpu = resolve_band(&rule, &values);
            assert_eq!(cpu.lo.to_bits(), gpu.lo.to_bits(), "case {case}, k {k}");
            assert_eq!(cpu.hi.to_bits(), gpu.hi.to_bits());
        }
    }

    /// Every rule, through the band kernel's algorithm and through the core's, keeps the same
    /// values, on rows with NaN, signed zeros, infinities, ties and subnormals.
    #[test]
    fn kernel_bands_keep_what_the_cpu_keeps() {
        let mut seed = 0x0bad_5eed_1234_5678u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..3000 {
            let len = 1 + (next() % 400) as usize;
            let special = next() % 4 == 0;
            let values: Vec<f32> = (0..len)
                .map(|_| match next() % if special { 14 } else { 200 } {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f32::NEG_INFINITY,
                    4 => f32::INFINITY,
                    5 => 1.5,
                    6 => 1e-40,
                    _ => (next() % 4000) as f32 / 97.0 - 20.0,
                })
                .collect();
            let fraction = (next() % 1000) as f32 / 1000.0;
            let min_keep = 1 + (next() % 4) as u32;
            let rule = match next() % 6 {
                0 => Truncation::TopK {
                    k: 1 + (next() % 50) as u32,
                    min_keep,
                },
                1 => Truncation::TopP {
                    p: fraction.max(1e-3),
                    min_keep,
                },
                2 => Truncation::MinP {
                    p: fraction,
                    min_keep,
                },
                3 => Truncation::Typical {
                    mass: fraction.clamp(1e-3, 0.999),
                    min_keep,
                },
                4 => Truncation::Epsilon {
                    epsilon: fraction * 0.01 + 1e-6,
                    min_keep,
                },
                _ => Truncation::Eta {
                    epsilon: fraction * 0.01 + 1e-6,
                    min_keep,
                },
            };
            let cpu = rule.band(&values, &mut vec![]);
            let gpu = resolve_band(&rule, &values);
            for &x in &values {
                assert_eq!(
                    cpu.removes(x),
                    gpu.removes(x),
                    "case {case}, {rule:?}, {x}: CPU {cpu:?}, kernel {gpu:?}"
                );
            }
        }
    }
}
