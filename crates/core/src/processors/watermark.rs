use std::any::Any;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, TokenTest};
use crate::processors::{check_bias, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec, MAX_TOKEN_IDS};
use crate::watermark::{randperm, GreenLists, SeedingScheme, SELF_HASH_CANDIDATES};

/// `{"kind": "watermark", "greenlist_ratio": 0.25, "bias": 2.0, "seeding_scheme": "lefthash",
/// "vocab_size": 32000}`:
/// transformers' `WatermarkLogitsProcessor` (Kirchenbauer et al.), bit for bit with its CPU
/// generator: `bias` is added to the logits of a green list, the first
/// `int(vocab_size * greenlist_ratio)` entries of torch's `randperm(vocab_size)` seeded from the
/// ids so far (`"lefthash"`: `hashing_key` times the last id; `"selfhash"`: each of the row's 40
/// largest logits is biased when it is green in the list seeded by the last `context_width - 1`
/// ids and itself). Steps with fewer than `context_width` ids (prompt included) are left alone.
/// `logits_processing.detect_watermark` gives transformers' `WatermarkDetector` verdicts.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WatermarkSpec {
    /// The share of the vocab that is green, in `(0, 1)`.
    #[serde(default = "default_greenlist_ratio")]
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub greenlist_ratio: f64,
    /// Added to each green logit (finite, at most 1e30 either way).
    #[serde(default = "default_bias")]
    pub bias: f64,
    /// The key every seed is multiplied by (an int64, as torch's arithmetic takes it; the
    /// self-hash scheme's table is `randperm(1_000_003)` under this seed).
    #[serde(default = "default_hashing_key")]
    pub hashing_key: i64,
    #[serde(default)]
    pub seeding_scheme: SeedingSchemeSpec,
    /// How many ids the seed reads (`>= 1`, at most 65,536): the last one (`"lefthash"`), or the
    /// last `context_width - 1` and the candidate (`"selfhash"`).
    #[serde(default = "default_context_width")]
    #[schemars(range(min = 1, max = 65536))]
    pub context_width: usize,
    /// The vocab the green lists permute (transformers' `vocab_size`, the model's); default the
    /// engine's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 214748363))]
    pub vocab_size: Option<usize>,
}

fn default_greenlist_ratio() -> f64 {
    0.25
}

fn default_bias() -> f64 {
    2.0
}

fn default_hashing_key() -> i64 {
    15485863
}

fn default_context_width() -> usize {
    1
}

/// `seeding_scheme`'s two values, as transformers names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SeedingSchemeSpec {
    /// The green list depends on the last id (the paper's algorithm 2).
    #[default]
    Lefthash,
    /// The green list of each candidate depends on the candidate itself (algorithm 3): 40 green
    /// lists a step.
    Selfhash,
}

impl WatermarkSpec {
    fn checked(&self) -> Result<()> {
        let ratio = self.greenlist_ratio;
        if !(ratio > 0.0 && ratio < 1.0) {
            return Err(Error::argument(
                "greenlist_ratio",
                format!("must be in (0, 1), exclusively, got {ratio}"),
            ));
        }
        check_bias("bias", self.bias)?;
        if self.context_width == 0 || self.context_width > MAX_TOKEN_IDS {
            return Err(Error::argument(
                "context_width",
                format!(
                    "must be a positive integer of at most {MAX_TOKEN_IDS}, got {}",
                    self.context_width
                ),
            ));
        }
        if let Some(vocab) = self.vocab_size {
            check_vocab("vocab_size", vocab)?;
        }
        Ok(())
    }

    /// The green lists for a vocab of `vocab_size` (the spec's, else the engine's).
    pub fn green_lists(&self, vocab_size: Option<usize>) -> Result<GreenLists> {
        self.checked()?;
        let Some(vocab) = self.vocab_size.or(vocab_size) else {
            return Err(Error::spec(
                "vocab_size",
                "the green lists permute the engine's vocab: give vocab_size, or the engine's \
                 context (its tokenizer or vocab_size)",
            ));
        };
        check_vocab("vocab_size", vocab)?;
        let scheme = match self.seeding_scheme {
            SeedingSchemeSpec::Lefthash => SeedingScheme::LeftHash,
            SeedingSchemeSpec::Selfhash => SeedingScheme::SelfHash,
        };
        Ok(GreenLists::new(
            vocab,
            self.greenlist_ratio,
            self.hashing_key,
            scheme,
            self.context_width,
        ))
    }
}

fn check_vocab(field: &str, vocab: usize) -> Result<()> {
    if vocab == 0 || vocab > randperm::MAX_N {
        return Err(Error::argument(
            field,
            format!(
                "must be between 1 and {} (torch's 32-bit randperm), got {vocab}",
                randperm::MAX_N
            ),
        ));
    }
    Ok(())
}

impl KindSpec for WatermarkSpec {
    fn check(&self) -> Result<()> {
        self.checked()
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        if let (Some(vocab), Some(engine)) = (self.vocab_size, context.vocab_size) {
            // The green lists name every id below `vocab_size`.
            if vocab > engine {
                return Err(Error::TokenOutOfVocab {
                    field: "vocab_size".into(),
                    token_id: vocab as u64 - 1,
                    vocab_size: engine,
                });
            }
        }
        Ok(Box::new(Watermark::new(
            self.green_lists(context.vocab_size)?,
            self.bias as f32,
        )))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        // Without an engine, the vocab is the engine's to supply.
        (context.structure_only && context.vocab_size.is_none() && self.vocab_size.is_none())
            .then(|| self.checked())
    }
}

/// transformers' `WatermarkLogitsProcessor` for one request. Stateless beyond its settings: each
/// step's green list is a function of the ids, so a resumed request biases what the
/// uninterrupted one does.
///
/// ```
/// use logits_processing::{process_row, processors::Watermark};
/// use logits_processing::watermark::{GreenLists, SeedingScheme};
/// let lists = GreenLists::new(8, 0.25, 15485863, SeedingScheme::LeftHash, 1);
/// let mut perm = Vec::new();
/// let green = lists.green_list(&[5], &mut perm).to_vec();
/// let mut watermark = Watermark::new(lists, 2.0);
/// let mut row = [0.0f32; 8];
/// process_row(&mut watermark, &[5u32], &mut row)?;
/// for (token, &x) in row.iter().enumerate() {
///     assert_eq!(x, if green.contains(&(token as u32)) { 2.0 } else { 0.0 });
/// }
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug)]
pub struct Watermark {
    lists: Arc<GreenLists>,
    bias: f32,
    // Work space: the permutation, and the green tokens as bits (to push them sorted).
    perm: Vec<u32>,
    green: Vec<u64>,
}

impl Watermark {
    pub fn new(lists: GreenLists, bias: f32) -> Self {
        Self {
            lists: Arc::new(lists),
            bias,
            perm: Vec::new(),
            green: Vec::new(),
        }
    }
}

impl LogitsProcessor for Watermark {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let count = ids.token_count();
        let width = self.lists.context_width();
        // transformers skips a step with fewer ids than the seed reads.
        if count < width || count == 0 {
            return Ok(());
        }
        match self.lists.scheme() {
            SeedingScheme::LeftHash => {
                let last = [ids.token_at(count - 1)];
                let green = self.lists.green_list(&last, &mut self.perm);
                // As bits, then in id order: the plan's sparse edits come sorted.
                self.green.clear();
                self.green.resize(self.lists.vocab_size().div_ceil(64), 0);
                for &token in green {
                    self.green[token as usize / 64] |= 1 << (token % 64);
                }
                for (w, &word) in self.green.iter().enumerate() {
                    let mut word = word;
                    while word != 0 {
                        let token = (w * 64) as u32 + word.trailing_zeros();
                        plan.push(Edit::Bias {
                            token,
                            bias: self.bias,
                        });
                        word &= word - 1;
                    }
                }
            }
            SeedingScheme::SelfHash => {
                let window = (count + 1 - width..count)
                    .map(|i| ids.token_at(i))
                    .collect();
                plan.push_bias_largest(
                    SELF_HASH_CANDIDATES,
                    self.bias,
                    Arc::new(SelfHashGreen {
                        lists: self.lists.clone(),
                        window,
                    }),
                );
            }
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        Some(self.lists.vocab_size() as u32 - 1)
    }
}

/// The self-hash scheme's test of a candidate: green in the list seeded by the window's ids
/// followed by the candidate itself.
#[derive(Debug, PartialEq)]
struct SelfHashGreen {
    lists: Arc<GreenLists>,
    window: Vec<u32>,
}

impl TokenTest for SelfHashGreen {
    fn admits(&self, token: u32) -> bool {
        let mut ids = Vec::with_capacity(self.window.len() + 1);
        ids.extend_from_slice(&self.window);
        ids.push(token);
        self.lists.is_green(&ids, token)
    }

    fn same_as(&self, other: &dyn TokenTest) -> bool {
        other.as_any().downcast_ref::<Self>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    fn spec(json: &str) -> WatermarkSpec {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn lefthash_biases_exactly_the_green_list() {
        let lists = GreenLists::new(1000, 0.25, 15485863, SeedingScheme::LeftHash, 2);
        let mut perm = Vec::new();
        let green = lists.green_list(&[3, 9], &mut perm).to_vec();
        assert_eq!(green.len(), 250);
        let mut w = Watermark::new(lists, 1.5);
        let mut row = vec![0.25f32; 1000];
        process_row(&mut w, &[3u32, 9], &mut row).unwrap();
        for (t, &x) in row.iter().enumerate() {
            assert_eq!(
                x,
                if green.contains(&(t as u32)) {
                    1.75
                } else {
                    0.25
                }
            );
        }
        // One id with a context width of 2: the step is skipped.
        let mut row = vec![0.25f32; 1000];
        process_row(&mut w, &[9u32], &mut row).unwrap();
        assert!(row.iter().all(|&x| x == 0.25));
    }

    #[test]
    fn selfhash_biases_the_green_candidates_among_the_40_largest() {
        let lists = GreenLists::new(200, 0.5, 7, SeedingScheme::SelfHash, 2);
        let row: Vec<f32> = (0..200).map(|i| ((i * 37) % 200) as f32 / 10.0).collect();
        let ids = [4u32, 11];
        let order = crate::truncation::largest_first(&row, 40);
        let mut expected = row.clone();
        for &c in &order {
            if lists.is_green(&[11, c], c) {
                expected[c as usize] += 3.0;
            }
        }
        let mut w = Watermark::new(lists, 3.0);
        let mut got = row.clone();
        process_row(&mut w, &ids, &mut got).unwrap();
        assert_eq!(got, expected);
        assert_ne!(got, row);
    }

    #[test]
    fn specs_are_checked_as_transformers_checks_them() {
        let bad = [
            (r#"{"greenlist_ratio": 1.0}"#, "greenlist_ratio"),
            (r#"{"greenlist_ratio": 0.0}"#, "greenlist_ratio"),
            (r#"{"context_width": 0}"#, "context_width"),
            (r#"{"bias": 1e31}"#, "bias"),
            (r#"{"vocab_size": 0}"#, "vocab_size"),
        ];
        for (json, field) in bad {
            match spec(json).check() {
                Err(Error::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{json}: {other:?}"),
            }
        }
        assert!(serde_json::from_str::<WatermarkSpec>(r#"{"seeding_scheme": "hash"}"#).is_err());
        let s = spec("{}");
        assert_eq!(
            (s.greenlist_ratio, s.bias, s.hashing_key, s.context_width),
            (0.25, 2.0, 15485863, 1)
        );
        assert!(s.green_lists(None).is_err());
        assert_eq!(s.green_lists(Some(10)).unwrap().greenlist_size(), 2);
    }
}
