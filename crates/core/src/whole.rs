//! Whole-row edits: rules that rewrite every logit of the row from the row as a whole and from
//! the element type, carried out between the plan's passes (`RowPlan::run` splits the edits
//! there), never one logit at a time. Each rule's row math is one file beside this one:
//! `inf_nan_remove.rs` and `synthid.rs`. The kinds (in `crate::processors`) decide which rule
//! runs; nothing here imports them.

mod inf_nan_remove;
mod synthid;

use std::sync::Arc;

use crate::logit::Logit;
use crate::synthid::Watermark;

/// A SynthID watermark held by a plan ([`crate::RowPlan::push_synthid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthIdSlot(pub(crate) u32);

/// An edit of the whole row ([`crate::Edit::Whole`]). Both give `-inf` a finite value, so a
/// forced token's `-inf` fill before one is not the row's last word: the pass before it ends
/// there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WholeRow {
    /// NaN becomes `0.0`, `+inf` the element type's largest finite value, `-inf` its smallest:
    /// transformers' `InfNanRemoveLogitsProcessor` (see
    /// [`crate::processors::InfNanRemoveSpec`]).
    InfNanRemove,
    /// SynthID Text's tournament update of the row's softmax, then its log (see
    /// [`crate::processors::SynthIdWatermarkSpec`]).
    SynthId(SynthIdSlot),
}

impl WholeRow {
    /// Carries out the rule on `row`; `synthid` are the plan's SynthID watermarks, each one's keys and table and
    /// the hash of its context.
    pub(crate) fn apply<T: Logit>(&self, row: &mut [T], synthid: &[(Arc<Watermark>, i64)]) {
        match *self {
            WholeRow::InfNanRemove => inf_nan_remove::apply(row),
            WholeRow::SynthId(SynthIdSlot(id)) => {
                let (marks, context) = &synthid[id as usize];
                synthid::apply(row, marks, *context)
            }
        }
    }
}
