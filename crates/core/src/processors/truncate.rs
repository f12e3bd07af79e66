//! The truncation kinds (`top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`,
//! `eta_cutoff`): one shape, a spec struct naming its rule's parameters, and one processor,
//! [`Truncate`]. Their behaviour is the rule's ([`Truncation`]; each rule's row math is a file
//! under `truncation/`); a kind with behaviour of its own would get a file of its own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, Truncation};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

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

/// A truncation kind's spec: the rule it names, `None` for the ecosystems' "off" value of its
/// parameter (the spec then changes nothing).
trait RuleSpec {
    fn rule(&self) -> Result<Option<Truncation>>;
}

/// A spec at its "off" value: no edit at all, so the row is left bit for bit as it was.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Off;

impl LogitsProcessor for Off {
    fn plan(&mut self, _ids: &dyn TokenHistory, _plan: &mut RowPlan) -> Result<()> {
        Ok(())
    }

    fn undo(&mut self) {}
}

/// Each truncation spec is checked as its rule is, and realized as [`Truncate`] of it (or as
/// nothing at its "off" value).
macro_rules! truncation_kinds {
    ($($spec:ident),* $(,)?) => {
        $(
            impl KindSpec for $spec {
                fn check(&self) -> Result<()> {
                    self.rule()?.map_or(Ok(()), |rule| rule.validate())
                }

                fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
                    Ok(match self.rule()? {
                        Some(rule) => Box::new(Truncate::new(rule)?),
                        None => Box::new(Off),
                    })
                }
            }
        )*
    };
}

/// The `min_tokens_to_keep` largest logits (and ties): what llama.cpp keeps for `top_p` 0 and
/// `min_p` above 1.
fn keep_min(min_keep: u32) -> Truncation {
    Truncation::TopK {
        k: min_keep,
        min_keep,
    }
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
/// transformers' `TopKLogitsWarper`. `k` 0 or -1 is off (the row is left as it is), as in
/// llama.cpp, vLLM and SGLang; below -1 is refused.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopKSpec {
    #[schemars(range(min = -1, max = 4294967295i64))]
    pub k: i64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for TopKSpec {
    fn rule(&self) -> Result<Option<Truncation>> {
        match self.k {
            0 | -1 => Ok(None),
            k => match u32::try_from(k) {
                Ok(k) => Ok(Some(Truncation::TopK {
                    k,
                    min_keep: self.min_tokens_to_keep,
                })),
                Err(_) => Err(Error::argument(
                    "k",
                    format!("{k} is outside the range >= 1 (0 or -1: off) and < 2^32"),
                )),
            },
        }
    }
}

/// `{"kind": "top_p", "p": 0.9, "min_tokens_to_keep": 1}`: keeps the smallest set of largest logits
/// whose probability reaches `p` (`0 < p <= 1`); `min_tokens_to_keep` (at least 1, default 1) as in
/// transformers' `TopPLogitsWarper`. `p` 1 is off (the row is left as it is); `p` 0 keeps the
/// `min_tokens_to_keep` largest logits (and ties), as llama.cpp and transformers do.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopPSpec {
    #[schemars(range(min = 0.0, max = 1.0))]
    pub p: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

/// A rule's parameter within `lo` and `hi` (each allowed when its flag says so), checked as the
/// f64 written (not once rounded), then rounded to the f32 the rule takes and kept inside the
/// range (a positive `5e-324` is f32's smallest positive, not 0). Refused naming `field`.
pub(crate) fn parameter(
    field: &str,
    value: f64,
    (lo, lo_in): (f64, bool),
    (hi, hi_in): (f64, bool),
) -> Result<f32> {
    let above = if lo_in { value >= lo } else { value > lo };
    let below = if hi_in { value <= hi } else { value < hi };
    if !(above && below) {
        let sign = |allowed: bool| if allowed { "<=" } else { "<" };
        return Err(Error::argument(
            field,
            format!(
                "{value} is outside the range {lo} {} {field} {} {hi}",
                sign(lo_in),
                sign(hi_in)
            ),
        ));
    }
    let f32_lo = if lo_in {
        lo as f32
    } else {
        (lo as f32).next_up()
    };
    let f32_hi = if hi_in {
        hi as f32
    } else {
        (hi as f32).next_down()
    };
    Ok((value as f32).clamp(f32_lo, f32_hi))
}

impl RuleSpec for TopPSpec {
    fn rule(&self) -> Result<Option<Truncation>> {
        Ok(match self.p {
            1.0 => None,
            0.0 => Some(keep_min(self.min_tokens_to_keep)),
            p => Some(Truncation::TopP {
                p: parameter("p", p, (0.0, false), (1.0, true))?,
                min_keep: self.min_tokens_to_keep,
            }),
        })
    }
}

/// `{"kind": "min_p", "p": 0.05, "min_tokens_to_keep": 1}`: keeps the logits whose probability is
/// at least `p` (`0 <= p <= 1`) times the largest; `min_tokens_to_keep` (at least 1, default 1) as
/// in transformers' `MinPLogitsWarper`. `p` 0 is off (the row is left as it is); a finite `p`
/// above 1 keeps the `min_tokens_to_keep` largest logits (and ties), as llama.cpp does.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MinPSpec {
    #[schemars(range(min = 0.0))]
    pub p: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for MinPSpec {
    fn rule(&self) -> Result<Option<Truncation>> {
        Ok(match self.p {
            0.0 => None,
            p if p > 1.0 && p.is_finite() => Some(keep_min(self.min_tokens_to_keep)),
            p => Some(Truncation::MinP {
                p: parameter("p", p, (0.0, true), (1.0, true))?,
                min_keep: self.min_tokens_to_keep,
            }),
        })
    }
}

/// `{"kind": "typical_p", "mass": 0.9, "min_tokens_to_keep": 1}`: locally typical sampling with
/// mass `mass` (`0 < mass < 1`); `min_tokens_to_keep` (at least 1, default 1) as in transformers'
/// `TypicalLogitsWarper`. `mass` 1 is off (the row is left as it is), as in llama.cpp.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypicalPSpec {
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1.0))]
    pub mass: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for TypicalPSpec {
    fn rule(&self) -> Result<Option<Truncation>> {
        Ok(match self.mass {
            1.0 => None,
            mass => Some(Truncation::Typical {
                mass: parameter("mass", mass, (0.0, false), (1.0, false))?,
                min_keep: self.min_tokens_to_keep,
            }),
        })
    }
}

/// `{"kind": "epsilon_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1}`: keeps the logits whose
/// probability is at least `epsilon` (`0 < epsilon < 1`); `min_tokens_to_keep` (at least 1, default
/// 1) as in transformers' `EpsilonLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EpsilonCutoffSpec {
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub epsilon: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for EpsilonCutoffSpec {
    fn rule(&self) -> Result<Option<Truncation>> {
        Ok(Some(Truncation::Epsilon {
            epsilon: parameter("epsilon", self.epsilon, (0.0, false), (1.0, false))?,
            min_keep: self.min_tokens_to_keep,
        }))
    }
}

/// `{"kind": "eta_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1}`: keeps the logits whose
/// probability is at least `min(epsilon, sqrt(epsilon) * exp(-entropy))` (`0 < epsilon < 1`);
/// `min_tokens_to_keep` (at least 1, default 1) as in transformers' `EtaLogitsWarper`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EtaCutoffSpec {
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub epsilon: f64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub min_tokens_to_keep: u32,
}

impl RuleSpec for EtaCutoffSpec {
    fn rule(&self) -> Result<Option<Truncation>> {
        Ok(Some(Truncation::Eta {
            epsilon: parameter("epsilon", self.epsilon, (0.0, false), (1.0, false))?,
            min_keep: self.min_tokens_to_keep,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::{EngineContext, ProcessorSpec};

    /// A row with ties, NaN, both infinities and signed zeros, where any edit would show.
    fn row() -> Vec<f32> {
        vec![
            1.5,
            f32::NAN,
            -0.0,
            3.0,
            3.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            -7.25,
            0.0,
            2.0,
        ]
    }

    fn run(json: &str) -> crate::Result<Vec<f32>> {
        let spec = ProcessorSpec::parse(json)?;
        let mut processor = spec.realize(&EngineContext::default(), 1)?;
        let mut row = row();
        crate::process_row(processor.as_mut(), &[0u32, 3, 3, 9], &mut row)?;
        Ok(row)
    }

    #[test]
    fn off_values_leave_the_row_bit_for_bit() {
        for json in [
            r#"{"kind": "top_k", "k": 0}"#,
            r#"{"kind": "top_k", "k": -1}"#,
            r#"{"kind": "top_p", "p": 1.0}"#,
            r#"{"kind": "min_p", "p": 0.0}"#,
            r#"{"kind": "typical_p", "mass": 1.0}"#,
            r#"{"kind": "repetition_penalty", "penalty": 1.0}"#,
            r#"{"kind": "frequency_penalty", "penalty": 0.0}"#,
            r#"{"kind": "presence_penalty", "penalty": 0.0}"#,
        ] {
            let got: Vec<u32> = run(json).unwrap().iter().map(|x| x.to_bits()).collect();
            let want: Vec<u32> = row().iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "{json}");
        }
    }

    #[test]
    fn top_p_zero_and_min_p_above_one_keep_the_largest_as_llama_cpp() {
        let ninf = f32::NEG_INFINITY;
        let row = [1.0f32, 4.0, 2.0, 3.0];
        for (json, want) in [
            (r#"{"kind": "top_p", "p": 0.0}"#, [ninf, 4.0, ninf, ninf]),
            (r#"{"kind": "min_p", "p": 1.5}"#, [ninf, 4.0, ninf, ninf]),
            (
                r#"{"kind": "min_p", "p": 7.0, "min_tokens_to_keep": 2}"#,
                [ninf, 4.0, ninf, 3.0],
            ),
            (
                r#"{"kind": "top_p", "p": 0.0, "min_tokens_to_keep": 3}"#,
                [ninf, 4.0, 2.0, 3.0],
            ),
        ] {
            let spec = ProcessorSpec::parse(json).unwrap();
            let mut processor = spec.realize(&EngineContext::default(), 0).unwrap();
            let mut got = row;
            crate::process_row(processor.as_mut(), &[0u32], &mut got).unwrap();
            assert_eq!(got, want, "{json}");
        }
    }

    #[test]
    fn penalties_beyond_two_are_accepted_as_llama_cpp_does() {
        let got = run(r#"{"kind": "frequency_penalty", "penalty": 3.0}"#).unwrap();
        // Token 3 occurs twice after the one-id prompt: 3.0 - 3.0 * 2.
        assert_eq!(got[3], -3.0);
        let got = run(r#"{"kind": "presence_penalty", "penalty": -2.5}"#).unwrap();
        assert_eq!(got[9], 4.5);
    }
}
