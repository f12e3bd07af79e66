use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, Truncation};
use crate::processors::LogitsProcessor;

/// A truncation rule at every step (the `top_k`, `top_p`, `min_p`, `typical_p`,
/// `epsilon_cutoff` and `eta_cutoff` kinds): the row keeps the tokens the rule keeps, computed
/// over the row as the steps before it left it, and the others become `-inf`. The rules'
/// semantics (transformers' warpers; ties at the boundary all kept) are [`Truncation`]'s.
///
/// ```
/// use logits_processing::{process_row, processors::Truncate, Truncation};
/// let mut top2 = Truncate::new(Truncation::TopK { k: 2, min_keep: 1 })?;
/// let mut row = [1.0f32, 3.0, 2.0, 0.0];
/// process_row(&mut top2, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, 3.0, 2.0, ninf]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Truncate {
    rule: Truncation,
}

impl Truncate {
    /// The rule, its parameters checked ([`Truncation::validate`]).
    pub fn new(rule: Truncation) -> Result<Self> {
        rule.validate()?;
        Ok(Self { rule })
    }

    pub fn rule(&self) -> Truncation {
        self.rule
    }
}

impl LogitsProcessor for Truncate {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        plan.push(Edit::Truncate(self.rule));
        Ok(())
    }

    fn undo(&mut self) {}
}

/// The default of `min_tokens_to_keep`.
pub(crate) fn one() -> u32 {
    1
}
