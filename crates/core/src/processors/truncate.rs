//! The truncation kinds (`top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`,
//! `eta_cutoff`): one shape, a spec struct naming its rule's parameters, and one processor,
//! [`Truncate`]. Their behaviour is the rule's ([`Truncation`], `truncation.rs`); a kind with
//! behaviour of its own would get a file of its own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, Truncation};
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

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

/// A truncation kind's spec: the rule it names.
trait RuleSpec {
    fn rule(&self) -> Truncation;
}

/// Each truncation spec is checked as its rule is, and realized as [`Truncate`] of it.
macro_rules! truncation_kinds {
    ($($spec:ident),* $(,)?) => {
        $(
            impl KindSpec for $spec {
                fn check(&self) -> Result<()> {
                    self.rule().validate()
                }

                fn realize(&self, _: &SpecContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
                    Ok(Box::new(Truncate::new(self.rule())?))
                }
            }
        )*
    };
}

truncation_kinds!(
    TopKSpec,
    TopPSpec,
    MinPSpec,
    TypicalPSpec,
    EpsilonCutoffSpec,
    EtaCutoffSpec
);

/// `{"kind": "top_k", "k": 50, "min_tokens_to_keep": 1}`: keeps the `k` (at least 1) largest logits
/// and every logit tied with the k-th; `min_tokens_to_keep` (at least 1, default 1) as in
/// transformers' `TopKLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopKSpec {
    pub k: u32,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for TopKSpec {
    fn rule(&self) -> Truncation {
        Truncation::TopK {
            k: self.k,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

/// `{"kind": "top_p", "p": 0.9, "min_tokens_to_keep": 1}`: keeps the smallest set of largest logits
/// whose probability reaches `p` (`0 < p <= 1`); `min_tokens_to_keep` (at least 1, default 1) as in
/// transformers' `TopPLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopPSpec {
    pub p: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for TopPSpec {
    fn rule(&self) -> Truncation {
        Truncation::TopP {
            p: self.p as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

/// `{"kind": "min_p", "p": 0.05, "min_tokens_to_keep": 1}`: keeps the logits whose probability is
/// at least `p` (`0 <= p <= 1`) times the largest; `min_tokens_to_keep` (at least 1, default 1) as
/// in transformers' `MinPLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MinPSpec {
    pub p: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for MinPSpec {
    fn rule(&self) -> Truncation {
        Truncation::MinP {
            p: self.p as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

/// `{"kind": "typical_p", "mass": 0.9, "min_tokens_to_keep": 1}`: locally typical sampling with
/// mass `mass` (`0 < mass < 1`); `min_tokens_to_keep` (at least 1, default 1) as in transformers'
/// `TypicalLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypicalPSpec {
    pub mass: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for TypicalPSpec {
    fn rule(&self) -> Truncation {
        Truncation::Typical {
            mass: self.mass as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

/// `{"kind": "epsilon_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1}`: keeps the logits whose
/// probability is at least `epsilon` (`0 < epsilon < 1`); `min_tokens_to_keep` (at least 1, default
/// 1) as in transformers' `EpsilonLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EpsilonCutoffSpec {
    pub epsilon: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for EpsilonCutoffSpec {
    fn rule(&self) -> Truncation {
        Truncation::Epsilon {
            epsilon: self.epsilon as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}

/// `{"kind": "eta_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1}`: keeps the logits whose
/// probability is at least `min(epsilon, sqrt(epsilon) * exp(-entropy))` (`0 < epsilon < 1`);
/// `min_tokens_to_keep` (at least 1, default 1) as in transformers' `EtaLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EtaCutoffSpec {
    pub epsilon: f64,
    #[serde(default = "one")]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for EtaCutoffSpec {
    fn rule(&self) -> Truncation {
        Truncation::Eta {
            epsilon: self.epsilon as f32,
            min_keep: self.min_tokens_to_keep,
        }
    }
}
