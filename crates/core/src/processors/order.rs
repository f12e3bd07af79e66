//! Where each kind stands in a pipeline: the canonical order (the registry's), and the orders
//! and settings refused (a mask after a truncation, a prompt-dependent spec without `prompt_len`).

use super::KINDS;
use crate::error::Result;
use crate::spec::ProcessorSpec;

/// Refuses a mask (allowed ids, a grammar, the caller's bitmask) listed after a truncation step:
/// truncating first keeps a few tokens by their logits, and the mask can then allow none of them,
/// which leaves the row with no token at all. Every engine applies its grammar before truncation,
/// and so does [`canonical_order`]. `specs` come with where each stood in the pipeline
/// (`"[3]"`); the error names the mask's `kind` field there and the truncation step it follows.
pub fn check_order<'a>(
    specs: impl IntoIterator<Item = (&'a str, &'a ProcessorSpec)>,
) -> Result<()> {
    let mut truncation: Option<(&str, &ProcessorSpec)> = None;
    for (at, spec) in specs {
        if let (Some((cut_at, cut)), true) = (truncation, spec.masks()) {
            return Err(crate::error::Error::InvalidSpec {
                field: crate::error::field_at(at, "kind"),
                message: format!(
                    "'{}' comes after the truncation step {}'{}': truncating first can leave no \
                     token the mask allows (a row of -inf); list masks before truncation, as \
                     canonical_order() does",
                    spec.kind(),
                    match cut_at {
                        "" => String::new(),
                        at => format!("{at} "),
                    },
                    cut.kind(),
                ),
            });
        }
        if truncation.is_none() && spec.truncates() {
            truncation = Some((at, spec));
        }
    }
    Ok(())
}

/// Refuses specs that depend on where the prompt ends ([`ProcessorSpec::needs_prompt_len`]: a
/// grammar, the penalties that count the output alone, the kinds that count new tokens, a
/// sequence positioned by tokens) when no `prompt_len` is given: read from 0, the prompt would
/// count as output (a grammar would reject it and allow only EOS). The error, an
/// [`crate::Error::InvalidArgument`], names `prompt_len` and the first such spec (`specs` come
/// with where each stood, `"[2]"`).
pub fn check_prompt_len<'a>(
    specs: impl IntoIterator<Item = (&'a str, &'a ProcessorSpec)>,
    prompt_len: Option<usize>,
) -> Result<()> {
    if prompt_len.is_some() {
        return Ok(());
    }
    match specs.into_iter().find(|(_, spec)| spec.needs_prompt_len()) {
        Some((at, spec)) => Err(crate::error::Error::InvalidArgument {
            field: "prompt_len".into(),
            message: format!(
                "the spec {}'{}' depends on where the prompt ends in the ids; give prompt_len \
                 (the prompt's length in ids, 0 for none)",
                match at {
                    "" => String::new(),
                    at => format!("{at} "),
                },
                spec.kind()
            ),
        }),
        None => Ok(()),
    }
}

/// In the canonical order, user processors (external steps) go before the first spec of this
/// kind or of a kind after it in [`KINDS`].
pub const USER_STEPS_BEFORE: &str = "thinking_budget";

/// The default order of a pipeline given as a set of specs (e.g. from a generation config):
/// biases and penalties; bans and allowed ids, then forced tokens; (user processors, see
/// [`user_steps_at`]); the thinking budget; temperature; truncation (top-k, top-p, min-p, typical,
/// epsilon, eta, transformers' order). Specs of one kind keep their order. A pipeline given as
/// a list keeps the list's order; this is for callers that hold a set.
///
/// In this order no step brings back a token an earlier one banned, except the steps that force
/// a token by setting its value (`forced_eos`, the thinking budget's end token), as transformers
/// and the reference do.
pub fn canonical_order(mut specs: Vec<ProcessorSpec>) -> Vec<ProcessorSpec> {
    specs.sort_by_key(|spec| kind_rank(spec.kind()));
    specs
}

/// Where user processors go among specs in the canonical order: the index of the first spec at
/// or after [`USER_STEPS_BEFORE`].
pub fn user_steps_at(ordered: &[ProcessorSpec]) -> usize {
    let boundary = kind_rank(USER_STEPS_BEFORE);
    ordered
        .iter()
        .position(|spec| kind_rank(spec.kind()) >= boundary)
        .unwrap_or(ordered.len())
}

pub(crate) fn kind_rank(kind: &str) -> usize {
    KINDS
        .iter()
        .position(|k| k.name == kind)
        .unwrap_or(KINDS.len())
}
