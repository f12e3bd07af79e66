use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, Truncation};
use crate::processors::{Checkpoint, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "mirostat", "version": 2, "tau": 5.0, "eta": 0.1}`: llama.cpp's mirostat samplers
/// (`llama_sampler_init_mirostat_v2(seed, tau, eta)`, `llama_sampler_init_mirostat(n_vocab, seed,
/// tau, eta, m)`; Basu et al., "Mirostat"). Each step truncates the row by the running target
/// surprise `mu` (it starts at `2 tau`, or at `mu` when given):
///
/// - version 2 keeps the tokens whose surprise `-log2 p` is at most `mu` (at least the most likely
///   token);
/// - version 1 estimates the Zipf exponent `s` from the `m` most likely tokens (default 100) and
///   keeps the top `k = (e 2^mu / (1 - n^-e))^(1 / s)` tokens, `e = s - 1`, `n` the tokenizer's
///   vocab (`n_vocab`, default the engine's vocab size).
///
/// The engine samples. At the next step, the sampled token (the id at the previous step's
/// position) updates `mu -= eta * (-log2 p - tau)`, `p` its probability under the previous step's
/// truncated and renormalized distribution, as llama.cpp does after sampling. That probability is
/// read from the previous step's pass over the row (the plan keeps the kept tokens'
/// probabilities), so `mu` follows the row only on the CPU path, in a pipeline that keeps its
/// plans (a `Batch` row, a Python `Processor`); the CUDA path refuses the kind.
///
/// **After a resume** (a re-sent or migrated request, a rescan), `mu` cannot be recomputed from
/// the ids alone: a fresh processor starts from `mu` if the spec gives it, else from `2 tau`.
/// To carry it, send the last `mu` in the spec (`"mu": ...`). A step whose sampled token was not
/// among the kept tokens (another processor or the engine chose it) leaves `mu` as it was.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MirostatSpec {
    #[serde(default = "default_version")]
    #[schemars(range(min = 1, max = 2))]
    pub version: u32,
    #[serde(default = "default_tau")]
    pub tau: f64,
    #[serde(default = "default_eta")]
    pub eta: f64,
    #[serde(default = "default_m")]
    #[schemars(range(min = 2))]
    pub m: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub n_vocab: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mu: Option<f64>,
}

fn default_version() -> u32 {
    2
}

fn default_tau() -> f64 {
    5.0
}

fn default_eta() -> f64 {
    0.1
}

fn default_m() -> u32 {
    100
}

impl MirostatSpec {
    fn build(&self, vocab_size: Option<usize>) -> Result<Mirostat> {
        let finite = |name: &str, v: f64| {
            if v.is_finite() && (v as f32).is_finite() {
                Ok(v as f32)
            } else {
                Err(Error::argument(name, format!("must be finite, got {v}")))
            }
        };
        let tau = finite("tau", self.tau)?;
        let eta = finite("eta", self.eta)?;
        let mu = match self.mu {
            Some(mu) => finite("mu", mu)?,
            None => 2.0 * tau,
        };
        // Read by version 1 only, and refused below 2 whatever the version, as documented.
        if self.m < 2 {
            return Err(Error::argument(
                "m",
                format!("must be at least 2, got {}", self.m),
            ));
        }
        let version = match self.version {
            1 => {
                let n_vocab = self
                    .n_vocab
                    .or(vocab_size.map(|v| v.min(u32::MAX as usize) as u32))
                    .unwrap_or(0);
                Version::V1 { m: self.m, n_vocab }
            }
            2 => Version::V2,
            v => {
                return Err(Error::argument(
                    "version",
                    format!("must be 1 or 2, got {v}"),
                ))
            }
        };
        if self.n_vocab == Some(0) {
            return Err(Error::argument("n_vocab", "must be at least 1"));
        }
        Ok(Mirostat {
            version,
            tau,
            eta,
            initial_mu: mu,
            mu,
            pending: None,
            last: None,
        })
    }
}

impl KindSpec for MirostatSpec {
    fn check(&self) -> Result<()> {
        self.build(None).map(drop)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(self.build(context.vocab_size)?))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Version {
    V1 { m: u32, n_vocab: u32 },
    V2,
}

/// Mirostat: see [`MirostatSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct Mirostat {
    version: Version,
    tau: f32,
    eta: f32,
    initial_mu: f32,
    mu: f32,
    // The edit the last plan pushed and its index in the plan: its pass leaves the kept tokens'
    // probabilities there for the next step.
    pending: Option<(usize, Truncation)>,
    // For `undo`: `mu` and `pending` before the last plan.
    last: Option<(f32, Option<(usize, Truncation)>)>,
}

impl Mirostat {
    /// The running target surprise.
    pub fn mu(&self) -> f32 {
        self.mu
    }

    fn rule(&self, key: u32) -> Truncation {
        match self.version {
            Version::V1 { m, n_vocab } => Truncation::MirostatV1 {
                mu: self.mu,
                m,
                n_vocab,
                key,
            },
            Version::V2 => Truncation::MirostatV2 { mu: self.mu, key },
        }
    }
}

impl LogitsProcessor for Mirostat {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.last = Some((self.mu, self.pending));
        if let Some((at, rule)) = self.pending {
            let key = rule.key().unwrap_or(u32::MAX) as usize;
            if ids.token_count() > key {
                if let Some(p) = plan.observed(at, &Edit::Truncate(rule), ids.token_at(key)) {
                    // As llama.cpp, in f32.
                    let surprise = -p.log2();
                    self.mu -= self.eta * (surprise - self.tau);
                }
            }
        }
        let rule = self.rule(ids.token_count().min(u32::MAX as usize) as u32);
        self.pending = Some((plan.edits().len(), rule));
        plan.push(Edit::Truncate(rule));
        Ok(())
    }

    fn undo(&mut self) {
        if let Some((mu, pending)) = self.last.take() {
            self.mu = mu;
            self.pending = pending;
        }
    }

    fn reset(&mut self) {
        self.mu = self.initial_mu;
        self.pending = None;
        self.last = None;
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        Some(Checkpoint::new((self.mu, self.pending)))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) {
        if let Some(&(mu, pending)) = checkpoint.get() {
            self.mu = mu;
            self.pending = pending;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Pipeline;

    #[test]
    fn v2_keeps_surprise_at_most_mu_and_mu_follows_the_sampled_token() {
        let spec: MirostatSpec = serde_json::from_str(r#"{"tau": 1.0, "eta": 0.5}"#).unwrap();
        let processor = spec.build(None).unwrap();
        assert_eq!(processor.mu(), 2.0);
        // p = 0.5, 0.25, 0.125, 0.125: surprises 1, 2, 3, 3; mu 2 keeps the first two.
        let l = |p: f32| p.ln();
        let row = [l(0.5), l(0.25), l(0.125), l(0.125)];
        let mut pipeline = Pipeline::new(vec![crate::Step::Processor(Box::new(processor))]);
        let mut out = row;
        pipeline.process(&[7u32], &mut out).unwrap();
        let kept: Vec<bool> = out.iter().map(|x| x.is_finite()).collect();
        assert_eq!(kept, [true, true, false, false]);
        // The engine sampled token 1: p = 0.25 / 0.75 = 1/3 after renormalizing, surprise
        // log2 3; mu = 2 - 0.5 (log2 3 - 1).
        let mut out = row;
        pipeline.process(&[7u32, 1], &mut out).unwrap();
        let Some(crate::Step::Processor(p)) = pipeline.steps().first() else {
            panic!()
        };
        let expected = 2.0 - 0.5 * (-(1.0f32 / 3.0).log2() - 1.0);
        assert!(
            format!("{p:?}").contains(&format!("mu: {expected:?}")),
            "{p:?}"
        );
    }
}
