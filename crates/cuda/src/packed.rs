//! The packed form of a step's row plans that the kernels read (`python/logits_processing/kernels/
//! apply.py`, the one source of the device kernels).
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
//! | 1 | the forced token when the plan's last force is an [`Edit::Force`] ([`static_forced_token`]), or [`NO_TOKEN`] |
//! | 2, 3 | word offset and count of the dense ops, [`DENSE_WORDS`] words each |
//! | 4, 5 | word offset and count of the touched tokens (sorted, distinct) |
//! | 6 | word offset of the programs' bounds: touched count + 1 word offsets into the sparse ops |
//! | 7 | how many reductions (truncations, conditional forces, values read) the band kernel resolves |
//! | 8, 9 | word offset and count of a forced row's other survivors (sorted, distinct) |
//! | 10, 11 | word offset and count of the EOS ids a row the step leaves with no finite logit gets (the safety net, run by the row's last launch of the step; none: no net) |
//! | 12, 13 | zero, for the apply kernel: whether a tile kept a finite logit, how many tiles are done |
//!
//! A forced row's other survivors are the tokens an [`Edit::Set`] after its last force names
//! ([`RowPlan::set_after_force`]), the forced token left out: usually none.
//!
//! Dense op: `[op, a, b, c]`: [`Op::Scale`] `a` = temperature bits; [`Op::ForceKeep`] `a` = token;
//! [`Op::ForceSet`] `a` = token, `b` = value bits; [`Op::Mask`] `a` = word offset of the mask's
//! words, `b` = their count, `c` = 1 when tokens past them are allowed; [`Op::Truncate`] `a` = word
//! offset of its band record; [`Op::ForceIf`] `a` = token (or [`NO_TOKEN`]: the edit only
//! watches), `b` = word offset of its trigger record; [`Op::ValueAt`] (where an
//! [`Edit::AddScaledFrom`] stands, no edit itself) `a` = the token whose value it reads, `b` = word
//! offset of its value record; [`Op::InfNanRemove`] (a whole-row edit, but one logit at a time);
//! [`Op::Reshape`] `a` = word offset of its shape record.
//! As a reduction sees the row, a logit that a force since the previous reduction did not name is
//! `-inf`, unless an [`Edit::Set`] after the force names it (the kernels track the forces).
//!
//! Sparse op: `[op | dense_before << OP_BITS, value bits]` for [`Op::Ban`], [`Op::Bias`] (the bias),
//! [`Op::Penalty`] (the penalty), [`Op::AddScaledAbs`] (the factor), [`Op::Set`] (the value),
//! [`Op::AddScaledFrom`] (the word offset of its value record; its [`Op::ValueAt`] is the dense op
//! just before it).
//!
//! Records, which the band kernel (`lp_bands`, one program per row with a reduction) writes while
//! it resolves the row's reductions in order, each over the row as it stands there, and the apply
//! kernel (and the later reductions) read:
//! - band ([`BAND_WORDS`]): `[lo, hi, rule, parameter, min_keep, extra, snapshot]` (`extra`: the
//!   high word of mirostat 2's f64 factor, whose low word is `parameter`; `snapshot`: for a rule
//!   whose processor reads its pass at the next step (mirostat), the word offset where the band
//!   kernel writes the row as it stood there, `vocab` f32 words past the packed words, else
//!   [`NO_TOKEN`]);
//! - trigger ([`TRIGGER_WORDS`]): `[trigger, parameter, fired]` ([`TRIGGER_ARGMAX`] with the token,
//!   [`TRIGGER_MAX_PROB_BELOW`] with `p`'s bits; `fired` 0 or 1);
//! - value ([`VALUE_WORDS`]): `[value bits, factor bits]`;
//! - shape ([`SHAPE_WORDS`]): `[transform, first parameter, second parameter, max bits, resolved,
//!   scale bits, snapshot]` (smoothing's quadratic with `k` and `s`, adaptive-p's transform with
//!   its target, log-softmax's; `resolved` 0 where the row's largest value is not finite: the row
//!   stays; `scale`: adaptive-p's softmax sum, log-softmax's log of it; the snapshot, for
//!   adaptive-p, as a band record's).
//!
//! A forced row writes `-inf` everywhere but its survivors (the forced token and the tokens an
//! [`Edit::Set`] after the last force names), unread; only the survivors' programs are
//! packed (every touched token's when the row also truncates: the bands see them). Packing reuses
//! its buffers: after the first steps it allocates nothing. Its cost is linear in the edits (one
//! sort of the sparse edits by token) plus a copy of each mask's words.
//!
//! What a step's processors read back at their next step ([`PackedPlans::observing`]: a
//! conditional force's `fired`, an observing truncation's band and snapshot) is in those words:
//! [`crate::Readback`] copies them back.
//!
//! The op codes, the layout constants and the rules' codes are defined here once ([`constants`]);
//! the kernels get them through the Python extension when Triton compiles or interprets them.

use logits_processing::truncation;
pub use logits_processing::truncation::{from_order_key, order_key};
use logits_processing::{
    Band, Batch, Edit, ForcedValue, Reshape, RowPlan, Stage, Trigger, Truncation, WholeRow,
};

use crate::CudaError;

/// Threads per program (block) of both kernels: 8 warps.
pub const THREADS: usize = 256;
/// Logits per program of the apply kernel (and per tile of the band kernel's passes): a row is cut
/// into `ceil(vocab / TILE)` tiles.
pub const TILE: usize = 1024;
/// Words per slot descriptor.
pub const DESC_WORDS: usize = 14;
/// Words per dense op.
pub const DENSE_WORDS: usize = 4;
/// Words per sparse op.
pub const SPARSE_WORDS: usize = 2;
/// Words per band record.
pub const BAND_WORDS: usize = 7;
/// Words per trigger record (an [`Edit::ForceIf`]'s).
pub const TRIGGER_WORDS: usize = 3;
/// Words per value record (an [`Edit::AddScaledFrom`]'s).
pub const VALUE_WORDS: usize = 2;
/// Words per shape record (an [`Edit::Reshape`]'s).
pub const SHAPE_WORDS: usize = 7;
/// A shape record's transform: smoothing's quadratic around the row's largest value.
pub const SHAPE_QUADRATIC: u32 = 0;
/// A shape record's transform: adaptive-p's, toward its target probability.
pub const SHAPE_ADAPTIVE_P: u32 = 1;
/// A shape record's transform: log-softmax's, less the log of the softmax sum.
pub const SHAPE_LOG_SOFTMAX: u32 = 2;
/// A trigger record's condition: the token's value is the row's largest.
pub const TRIGGER_ARGMAX: u32 = 0;
/// A trigger record's condition: the row's largest probability is below `p`.
pub const TRIGGER_MAX_PROB_BELOW: u32 = 1;
/// No token: a row without a forced token, a truncation without a force before it.
pub const NO_TOKEN: u32 = u32::MAX;
/// A sparse op's first word: the op code in the low `OP_BITS` bits, the dense ops before it above.
pub const OP_BITS: u32 = 8;

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
    ForceIf = 10,
    ValueAt = 11,
    InfNanRemove = 12,
    AddScaledFrom = 13,
    Reshape = 14,
}

impl Op {
    pub const ALL: [Op; 15] = [
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
        Op::ForceIf,
        Op::ValueAt,
        Op::InfNanRemove,
        Op::AddScaledFrom,
        Op::Reshape,
    ];

    /// The op that carries out `edit`; `None` for an edit the kernels do not have (an
    /// [`Edit::Reshape`], a SynthID [`Edit::Whole`], an [`Edit::BiasLargest`]: plans holding one
    /// are refused, [`RowPlan::cpu_only`]). Exhaustive: a new kind of edit does not compile until
    /// it is given an op here (and then in the kernels) or refused.
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
            Edit::ForceIf { .. } => Op::ForceIf,
            Edit::AddScaledFrom { .. } => Op::AddScaledFrom,
            Edit::Whole(WholeRow::InfNanRemove) => Op::InfNanRemove,
            Edit::Reshape(
                Reshape::Smoothing { .. } | Reshape::AdaptiveP { .. } | Reshape::LogSoftmax,
            ) => Op::Reshape,
            Edit::Reshape(_) | Edit::Whole(WholeRow::SynthId(_)) | Edit::BiasLargest { .. } => {
                return None
            }
        })
    }

    /// Its name among the kernels' constants.
    pub fn name(self) -> &'static str {
        match self {
            Op::Scale => "OP_SCALE",
            Op::ForceKeep => "OP_FORCE_KEEP",
            Op::ForceSet => "OP_FORCE_SET",
            Op::Ban => "OP_BAN",
            Op::Bias => "OP_BIAS",
            Op::Penalty => "OP_PENALTY",
            Op::Mask => "OP_MASK",
            Op::Truncate => "OP_TRUNCATE",
            Op::AddScaledAbs => "OP_RAISE",
            Op::Set => "OP_SET",
            Op::ForceIf => "OP_FORCE_IF",
            Op::ValueAt => "OP_VALUE_AT",
            Op::InfNanRemove => "OP_INF_NAN",
            Op::AddScaledFrom => "OP_ADD_FROM",
            Op::Reshape => "OP_RESHAPE",
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
    TopA = 6,
    Xtc = 7,
    MirostatV2 = 8,
    PLess = 9,
}

impl Rule {
    pub const ALL: [Rule; 10] = [
        Rule::TopK,
        Rule::TopP,
        Rule::MinP,
        Rule::Typical,
        Rule::Epsilon,
        Rule::Eta,
        Rule::TopA,
        Rule::Xtc,
        Rule::MirostatV2,
        Rule::PLess,
    ];

    /// The rule's code, parameter, `min_keep` and extra word, as a band record holds them; `None`
    /// for a rule the kernel does not have ([`Truncation::on_cpu_only`]).
    pub fn of(rule: &Truncation) -> Option<(Rule, u32, u32, u32)> {
        Some(match *rule {
            Truncation::TopK { k, min_keep } => (Rule::TopK, k, min_keep, 0),
            Truncation::TopP { p, min_keep } => (Rule::TopP, p.to_bits(), min_keep, 0),
            Truncation::MinP { p, min_keep } => (Rule::MinP, p.to_bits(), min_keep, 0),
            Truncation::Typical { mass, min_keep } => (Rule::Typical, mass.to_bits(), min_keep, 0),
            Truncation::Epsilon { epsilon, min_keep } => {
                (Rule::Epsilon, epsilon.to_bits(), min_keep, 0)
            }
            Truncation::Eta { epsilon, min_keep } => (Rule::Eta, epsilon.to_bits(), min_keep, 0),
            Truncation::TopA { a, min_keep } => (Rule::TopA, a.to_bits(), min_keep, 0),
            Truncation::Xtc {
                threshold,
                min_keep,
            } => (Rule::Xtc, threshold.to_bits(), min_keep, 0),
            // `2^-mu` in f64, as the CPU's band computes it (truncation/mirostat.rs).
            Truncation::MirostatV2 { mu, .. } => {
                let factor = (-(mu as f64)).exp2().to_bits();
                (Rule::MirostatV2, factor as u32, 1, (factor >> 32) as u32)
            }
            Truncation::PLess {
                min_keep,
                normalized,
            } => (Rule::PLess, normalized as u32, min_keep, 0),
            Truncation::TopNSigma { .. }
            | Truncation::TopH { .. }
            | Truncation::TailFree { .. }
            | Truncation::MirostatV1 { .. } => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Rule::TopK => "RULE_TOP_K",
            Rule::TopP => "RULE_TOP_P",
            Rule::MinP => "RULE_MIN_P",
            Rule::Typical => "RULE_TYPICAL",
            Rule::Epsilon => "RULE_EPSILON",
            Rule::Eta => "RULE_ETA",
            Rule::TopA => "RULE_TOP_A",
            Rule::Xtc => "RULE_XTC",
            Rule::MirostatV2 => "RULE_MIROSTAT_V2",
            Rule::PLess => "RULE_P_LESS",
        }
    }
}

/// A constant of the packed layout, as the kernels see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Constant {
    Int(u32),
    Float(f32),
    Double(f64),
}

/// Every constant of the packed layout, every op code and rule code, and exp's coefficients, by
/// name: their one definition, which the CUDA source ([`kernel_header`]) and the Triton kernels
/// (through the Python extension) are both given.
pub fn constants() -> Vec<(String, Constant)> {
    use Constant::{Double, Float, Int};
    let mut all: Vec<(String, Constant)> = [
        ("THREADS", Int(THREADS as u32)),
        ("TILE", Int(TILE as u32)),
        ("DESC_WORDS", Int(DESC_WORDS as u32)),
        ("DENSE_WORDS", Int(DENSE_WORDS as u32)),
        ("SPARSE_WORDS", Int(SPARSE_WORDS as u32)),
        ("BAND_WORDS", Int(BAND_WORDS as u32)),
        ("TRIGGER_WORDS", Int(TRIGGER_WORDS as u32)),
        ("VALUE_WORDS", Int(VALUE_WORDS as u32)),
        ("SHAPE_WORDS", Int(SHAPE_WORDS as u32)),
        ("SHAPE_QUADRATIC", Int(SHAPE_QUADRATIC)),
        ("SHAPE_ADAPTIVE_P", Int(SHAPE_ADAPTIVE_P)),
        ("SHAPE_LOG_SOFTMAX", Int(SHAPE_LOG_SOFTMAX)),
        ("LN_LN2_HI", Double(truncation::LN_LN2_HI)),
        ("LN_LN2_LO", Double(truncation::LN_LN2_LO)),
        ("TRIGGER_ARGMAX", Int(TRIGGER_ARGMAX)),
        ("TRIGGER_MAX_PROB_BELOW", Int(TRIGGER_MAX_PROB_BELOW)),
        ("NO_TOKEN", Int(NO_TOKEN)),
        ("OP_BITS", Int(OP_BITS)),
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
    for (i, c) in truncation::LN_POLY.iter().enumerate() {
        all.push((format!("LN_POLY_{i}"), Double(*c)));
    }
    for op in Op::ALL {
        all.push((op.name().to_string(), Int(op as u32)));
    }
    for rule in Rule::ALL {
        all.push((rule.name().to_string(), Int(rule as u32)));
    }
    all
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
    observing: Vec<Observing>,
    snapshot_words: usize,
}

/// An edit whose processor reads at its next step what the kernels resolved ([`RowPlan::fired`],
/// [`RowPlan::observed`]): where in the packed words to find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observing {
    /// The row, and the edit's index in its plan.
    pub row: usize,
    pub edit: usize,
    /// The word offset of its record (a trigger's or a band's).
    pub record: u32,
    /// For a truncation or a reshape, the word offset of the row as it stood there (`vocab`
    /// words).
    pub snapshot: Option<u32>,
    /// Whether the edit is a reshape (its record a shape's), else a truncation or a conditional
    /// force.
    pub reshape: bool,
}

impl PackedPlans {
    pub fn new() -> Self {
        Self::default()
    }

    /// The packed words, descriptors first.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// How many rows the apply kernel will edit (listed rows with a non-empty plan, or a safety
    /// net).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The word offset and length of the list of slots that truncate (the band kernel's grid).
    pub fn truncating(&self) -> (usize, usize) {
        self.truncating
    }

    /// The edits whose outcome the kernels leave in the words for the processors' next step.
    pub fn observing(&self) -> &[Observing] {
        &self.observing
    }

    /// Words past [`PackedPlans::words`] where the band kernel writes the observing truncations'
    /// rows (their snapshots): the device buffer holds both.
    pub fn snapshot_words(&self) -> usize {
        self.snapshot_words
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
        self.pack_with_nets(plans, rows, vocab_size, &|_| &[])
    }

    /// [`PackedPlans::pack`], with the safety net (a row left with no finite logit gets its EOS
    /// ids at 0.0, every other logit `-inf`: [`logits_processing::Pipeline`]'s) for the rows
    /// `nets` gives EOS ids: those whose step ends with this launch. Such a row is packed even
    /// with an empty plan.
    pub fn pack_with_nets<'a, 'e, F, I>(
        &mut self,
        plans: F,
        rows: usize,
        vocab_size: usize,
        nets: &dyn Fn(usize) -> &'e [u32],
    ) -> Result<(), CudaError>
    where
        F: Fn() -> I,
        I: Iterator<Item = (usize, &'a RowPlan)>,
    {
        self.words.clear();
        self.slots = 0;
        self.truncating = (0, 0);
        self.truncating_slots.clear();
        self.observing.clear();
        self.snapshot_words = 0;
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
            let eos = nets(row);
            if let Some(&token) = eos.iter().find(|&&t| t as usize >= vocab_size) {
                return Err(CudaError::InvalidArgument(format!(
                    "row {row}'s EOS id {token} is outside the vocab of {vocab_size}"
                )));
            }
            if !plan.is_empty() || !eos.is_empty() {
                slots += 1;
            }
        }
        self.words.resize(slots * DESC_WORDS, 0);
        let listed = plans().filter(|(row, p)| !p.is_empty() || !nets(*row).is_empty());
        for (slot, (row, plan)) in listed.enumerate() {
            let mut desc = self.pack_row(row, plan, vocab_size)?;
            let eos = nets(row);
            desc[10] = self.words.len() as u32;
            desc[11] = eos.len() as u32;
            self.words.extend_from_slice(eos);
            if desc[7] > 0 {
                self.truncating_slots.push(slot as u32);
            }
            self.words[slot * DESC_WORDS..(slot + 1) * DESC_WORDS].copy_from_slice(&desc);
        }
        self.truncating = (self.words.len(), self.truncating_slots.len());
        self.words.extend_from_slice(&self.truncating_slots);
        // The snapshots, after the words (never copied to the device: only written there).
        let mut next = self.words.len();
        for observing in &mut self.observing {
            if let Some(record) = observing.snapshot.as_mut() {
                self.words[*record as usize + 6] = next as u32;
                *record = next as u32;
                next += vocab_size;
            }
        }
        self.snapshot_words = next - self.words.len();
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
        let forced = static_forced_token(plan);
        // Each value read (an AddScaledFrom's) is a dense op of its own where it stands.
        let n_dense = edits
            .iter()
            .filter(|e| !e.is_sparse() || matches!(e, Edit::AddScaledFrom { .. }))
            .count();
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

        // Dense ops in order (their records appended after them), sparse edits collected.
        let truncates = plan.truncates();
        self.sparse.clear();
        let mut dense = 0;
        let mut reductions = 0;
        for (at, edit) in edits.iter().enumerate() {
            let op = Op::of(edit).ok_or_else(|| unsupported(row, edit))?;
            let mut push_dense = |words: &mut Vec<u32>, op: [u32; DENSE_WORDS]| {
                let place = dense_begin + dense * DENSE_WORDS;
                words[place..place + DENSE_WORDS].copy_from_slice(&op);
                dense += 1;
            };
            if edit.is_sparse() {
                let (token, value) = match *edit {
                    Edit::Ban { token } => (token, 0),
                    Edit::Bias { token, bias } => (token, bias.to_bits()),
                    Edit::Penalty { token, penalty } => (token, penalty.to_bits()),
                    Edit::AddScaledAbs { token, factor } => (token, factor.to_bits()),
                    Edit::Set { token, value } => (token, value.to_bits()),
                    Edit::AddScaledFrom {
                        token,
                        source,
                        factor,
                    } => {
                        // The value of `source` is read where the edit stands: a dense op just
                        // before it, whose record the sparse op then reads.
                        let record = self.words.len() as u32;
                        self.words.extend_from_slice(&[0, factor.to_bits()]);
                        push_dense(&mut self.words, [Op::ValueAt as u32, source, record, 0]);
                        reductions += 1;
                        (token, record)
                    }
                    _ => unreachable!("only ban, bias, penalty, raise, set and add are sparse"),
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
                    let (code, parameter, min_keep, extra) =
                        Rule::of(&rule).ok_or_else(|| unsupported(row, edit))?;
                    let record = self.words.len() as u32;
                    let all = Band::ALL;
                    self.words.extend_from_slice(&[
                        all.lo.to_bits(),
                        all.hi.to_bits(),
                        code as u32,
                        parameter,
                        min_keep,
                        extra,
                        NO_TOKEN,
                    ]);
                    if rule.observes() {
                        // The snapshot's place is set once every row is packed (`pack`); until
                        // then `snapshot` holds the record's.
                        self.observing.push(Observing {
                            row,
                            edit: at,
                            record,
                            snapshot: Some(record),
                            reshape: false,
                        });
                    }
                    reductions += 1;
                    [op as u32, record, 0, 0]
                }
                Edit::ForceIf { token, when, .. } => {
                    let (trigger, parameter) = match when {
                        Trigger::ArgmaxIs { token } => (TRIGGER_ARGMAX, token),
                        Trigger::MaxProbBelow { p } => (TRIGGER_MAX_PROB_BELOW, p.to_bits()),
                    };
                    let record = self.words.len() as u32;
                    self.words.extend_from_slice(&[trigger, parameter, 0]);
                    self.observing.push(Observing {
                        row,
                        edit: at,
                        record,
                        snapshot: None,
                        reshape: false,
                    });
                    reductions += 1;
                    [op as u32, token.unwrap_or(NO_TOKEN), record, 0]
                }
                Edit::Whole(WholeRow::InfNanRemove) => [op as u32, 0, 0, 0],
                Edit::Reshape(
                    rule @ (Reshape::Smoothing { .. }
                    | Reshape::AdaptiveP { .. }
                    | Reshape::LogSoftmax),
                ) => {
                    let (transform, first, second) = match rule {
                        Reshape::Smoothing { k, s } => (SHAPE_QUADRATIC, k, s),
                        Reshape::AdaptiveP { target, .. } => (SHAPE_ADAPTIVE_P, target, 0.0),
                        Reshape::LogSoftmax => (SHAPE_LOG_SOFTMAX, 0.0, 0.0),
                        _ => unreachable!(),
                    };
                    let record = self.words.len() as u32;
                    self.words.extend_from_slice(&[
                        transform,
                        first.to_bits(),
                        second.to_bits(),
                        0,
                        0,
                        0,
                        NO_TOKEN,
                    ]);
                    if rule.observes() {
                        self.observing.push(Observing {
                            row,
                            edit: at,
                            record,
                            snapshot: Some(record),
                            reshape: true,
                        });
                    }
                    reductions += 1;
                    [op as u32, record, 0, 0]
                }
                Edit::Ban { .. }
                | Edit::Bias { .. }
                | Edit::Penalty { .. }
                | Edit::AddScaledAbs { .. }
                | Edit::AddScaledFrom { .. }
                | Edit::Set { .. } => unreachable!(),
                Edit::Reshape(_) | Edit::Whole(WholeRow::SynthId(_)) | Edit::BiasLargest { .. } => {
                    unreachable!("refused by `Op::of` above")
                }
            };
            push_dense(&mut self.words, words);
        }
        desc[7] = reductions;

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

/// The token a plan forces whatever its row: its last force's when that is an [`Edit::Force`]
/// with no whole-row edit after it ([`RowPlan::forced_token`] without the step's conditions);
/// `None` when the last force is an [`Edit::ForceIf`], which the band kernel decides.
pub fn static_forced_token(plan: &RowPlan) -> Option<u32> {
    for edit in plan.edits().iter().rev() {
        match *edit {
            Edit::Force { token, .. } => return Some(token),
            Edit::ForceIf { token: Some(_), .. } | Edit::Whole(_) => return None,
            _ => {}
        }
    }
    None
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

/// The EOS ids the launch of `level` gives `row` where the step leaves it no finite logit (the
/// safety net): the row's, when its step ends with that launch (its last stage is the plan
/// there); else none.
pub fn level_net(batch: &Batch, level: usize, row: usize) -> &[u32] {
    match batch.get(row) {
        Some(pipeline)
            if pipeline.stages().len() == level + 1
                && matches!(pipeline.stages()[level], Stage::Plan(_)) =>
        {
            pipeline.eos_token_ids()
        }
        _ => &[],
    }
}

/// The rows whose step does not end with a launch (their last stage is an external step): their
/// safety net takes a launch of its own, after the step's last level ([`level_net`] for the
/// others).
pub fn rows_ending_outside(batch: &Batch) -> impl Iterator<Item = usize> + '_ {
    batch.iter().filter_map(|(row, pipeline)| {
        let ends_outside = !matches!(pipeline.stages().last(), Some(Stage::Plan(_)));
        (ends_outside && !pipeline.eos_token_ids().is_empty()).then_some(row)
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
        // top-n-sigma, tail-free and mirostat 1.
        assert_eq!(refused, 3);
    }

    #[test]
    fn op_codes_are_distinct_and_decode() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(Op::from_code(*op as u32), Some(*op));
            assert!(Op::ALL[..i].iter().all(|o| *o as u32 != *op as u32));
            assert!((*op as u32) < 1 << OP_BITS);
        }
    }

    /// `ALL` (which the kernels' constants and the self-check go by) holds every variant, as
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
}
