//! transformers' `WatermarkDetector`: each n-gram of a text (`context_width + 1` ids, or
//! `context_width` with the self-hash scheme) scores its last id green or not under the green
//! list its first ids seed; the count against the expected `greenlist_ratio` gives a z-score,
//! its one-sided normal p-value, and the verdict `z > z_threshold`.

use std::collections::HashMap;

use crate::error::{Error, Result};

use super::{GreenLists, SeedingScheme};

/// What the detector is asked besides the watermark's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetectOptions {
    /// The ratio the z-score expects (the watermark's `greenlist_ratio`, as the detector reads it
    /// from the config, not the green list's rounded size).
    pub greenlist_ratio: f64,
    /// Count each distinct n-gram once (`ignore_repeated_ngrams`).
    pub ignore_repeated_ngrams: bool,
    /// The verdict is `z_score > z_threshold` (transformers' default 3.0).
    pub z_threshold: f64,
    /// The model's BOS id (the decoder start id of an encoder-decoder model): a leading one is
    /// not scored. `None`: nothing is stripped.
    pub bos_token_id: Option<u32>,
}

impl Default for DetectOptions {
    fn default() -> Self {
        Self {
            greenlist_ratio: 0.25,
            ignore_repeated_ngrams: false,
            z_threshold: 3.0,
            bos_token_id: None,
        }
    }
}

/// One text's verdict: `WatermarkDetectorOutput`'s fields for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detection {
    pub num_tokens_scored: usize,
    pub num_green_tokens: usize,
    pub green_fraction: f64,
    pub z_score: f64,
    pub p_value: f64,
    pub prediction: bool,
    pub confidence: f64,
}

/// The detector's verdict for each of `texts` (a batch: as transformers, a leading BOS is
/// stripped from every text when the first has one, and a batch where some texts start with it
/// and some do not is refused). Each text needs more than `context_width` ids after the BOS.
///
/// ```
/// use logits_processing::watermark::{detect, DetectOptions, GreenLists, SeedingScheme};
/// let lists = GreenLists::new(1000, 0.25, 15485863, SeedingScheme::LeftHash, 1);
/// // A text whose every token is green after the one before it.
/// let mut text = vec![7u32];
/// let mut perm = Vec::new();
/// for _ in 0..40 {
///     let next = lists.green_list(&text, &mut perm)[0];
///     text.push(next);
/// }
/// let verdict = detect(&lists, &DetectOptions::default(), &[&text])?[0];
/// assert_eq!((verdict.num_tokens_scored, verdict.num_green_tokens), (40, 40));
/// assert!(verdict.prediction && verdict.z_score > 7.0);
/// # Ok::<(), logits_processing::Error>(())
/// ```
pub fn detect(
    lists: &GreenLists,
    options: &DetectOptions,
    texts: &[&[u32]],
) -> Result<Vec<Detection>> {
    let ratio = options.greenlist_ratio;
    if !(ratio.is_finite() && 0.0 < ratio && ratio < 1.0) {
        return Err(Error::argument(
            "greenlist_ratio",
            format!("must be in (0, 1), got {ratio}"),
        ));
    }
    let starts_with_bos = |text: &[u32]| {
        options
            .bos_token_id
            .is_some_and(|bos| text.first() == Some(&bos))
    };
    let strip = texts.first().is_some_and(|t| starts_with_bos(t));
    if texts.iter().any(|t| starts_with_bos(t) != strip) {
        return Err(Error::argument(
            "input_ids",
            "some texts start with the BOS token and some do not: prepare them with the same \
             tokenization parameters",
        ));
    }
    let width = lists.context_width();
    let n = match lists.scheme() {
        SeedingScheme::LeftHash => width + 1,
        SeedingScheme::SelfHash => width,
    };
    texts
        .iter()
        .enumerate()
        .map(|(row, text)| {
            let text = if strip { &text[1..] } else { text };
            if text.len() <= width {
                return Err(Error::argument(
                    format!("input_ids[{row}]"),
                    format!(
                        "must have at least 1 token to score after the first {width} \
                         (context_width) ids, got {} ids",
                        text.len()
                    ),
                ));
            }
            let mut frequencies: HashMap<&[u32], usize> = HashMap::new();
            for ngram in text.windows(n) {
                *frequencies.entry(ngram).or_default() += 1;
            }
            let (mut scored, mut green) = (0usize, 0usize);
            for (ngram, count) in frequencies {
                let target = ngram[n - 1];
                let prefix = match lists.scheme() {
                    SeedingScheme::LeftHash => &ngram[..n - 1],
                    SeedingScheme::SelfHash => ngram,
                };
                let weight = if options.ignore_repeated_ngrams {
                    1
                } else {
                    count
                };
                scored += weight;
                if lists.is_green(prefix, target) {
                    green += weight;
                }
            }
            Ok(verdict(scored, green, options))
        })
        .collect()
}

/// The z-score, p-value and verdict from the counts, in f64 as numpy computes them.
fn verdict(scored: usize, green: usize, options: &DetectOptions) -> Detection {
    let (t, g, ratio) = (scored as f64, green as f64, options.greenlist_ratio);
    let z_score = (g - ratio * t) / (t * ratio * (1.0 - ratio)).sqrt();
    let p_value = 0.5 * libm::erfc(z_score / std::f64::consts::SQRT_2);
    Detection {
        num_tokens_scored: scored,
        num_green_tokens: green,
        green_fraction: g / t,
        z_score,
        p_value,
        prediction: z_score > options.z_threshold,
        confidence: 1.0 - p_value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_z_score_and_p_value_follow_the_formulas() {
        let d = verdict(100, 40, &DetectOptions::default());
        let z = (40.0 - 25.0) / (100.0f64 * 0.25 * 0.75).sqrt();
        assert_eq!(d.z_score, z);
        assert!((d.p_value - 0.000_266_0).abs() < 1e-6, "{}", d.p_value);
        assert!(d.prediction);
        assert_eq!(d.confidence, 1.0 - d.p_value);
        assert_eq!(d.green_fraction, 0.4);
    }

    #[test]
    fn repeated_ngrams_count_once_when_asked_and_bos_is_stripped() {
        let lists = GreenLists::new(50, 0.5, 3, SeedingScheme::LeftHash, 1);
        let text = [1u32, 2, 1, 2, 1, 2];
        let all = detect(&lists, &DetectOptions::default(), &[&text]).unwrap()[0];
        assert_eq!(all.num_tokens_scored, 5);
        let once = DetectOptions {
            ignore_repeated_ngrams: true,
            ..Default::default()
        };
        let unique = detect(&lists, &once, &[&text]).unwrap()[0];
        assert_eq!(unique.num_tokens_scored, 2);
        let bos = DetectOptions {
            bos_token_id: Some(1),
            ..Default::default()
        };
        assert_eq!(
            detect(&lists, &bos, &[&text]).unwrap()[0].num_tokens_scored,
            4
        );
        // A batch mixing texts with and without the BOS is refused; a text too short too.
        assert!(detect(&lists, &bos, &[&text, &[2, 1, 2]]).is_err());
        assert!(detect(&lists, &DetectOptions::default(), &[&[4]]).is_err());
    }
}
