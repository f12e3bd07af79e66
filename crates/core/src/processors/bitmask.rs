use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{MaskId, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "bitmask"}`: no fields.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BitmaskSpec {}

impl KindSpec for BitmaskSpec {
    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(CallerBitmask::new(
            context.vocab_size.unwrap_or(0).div_ceil(32),
        )))
    }

    fn takes_caller_mask(&self) -> bool {
        true
    }
}

/// The caller's own mask, for an engine that already runs a grammar library (llguidance,
/// xgrammar): each step the row of the bitmask given with the step
/// ([`crate::Batch::plan_with_bitmask`]; `Batch.apply(..., bitmask=...)` in Python) is applied in
/// the row's pass, in this processor's place, instead of in a kernel of its own. Bit `i % 32` of
/// word `i / 32` set allows token `i` (llguidance's and xgrammar's layout).
#[derive(Debug, Clone, PartialEq)]
pub struct CallerBitmask {
    words: usize,
    mask: Option<MaskId>,
}

impl CallerBitmask {
    /// For rows of `words` mask words (`ceil(vocab_size / 32)`).
    pub fn new(words: usize) -> Self {
        Self { words, mask: None }
    }
}

impl LogitsProcessor for CallerBitmask {
    fn plan(&mut self, _: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        // Nothing allowed until the batch copies the caller's row in.
        self.mask = Some(plan.reserve_mask(self.words, false));
        Ok(())
    }

    fn undo(&mut self) {}

    fn caller_mask(&self) -> Option<MaskId> {
        self.mask
    }
}
