//! Dynamic temperature's row math: the temperature from the row's normalized entropy.

use crate::reshape::{Shape, MIN_TEMPERATURE};
use crate::truncation::{heavy, Softmax, Work};

thread_local! {
    /// The scratch space of [`heavy`], kept between the calls of a thread.
    static WORK: std::cell::Cell<Work> = const { std::cell::Cell::new(Vec::new()) };
}

/// The shape dynamic temperature gives `values`.
#[inline(always)]
pub(crate) fn shape(values: &[f32], temperature: f32, range: f32, exponent: f32) -> Shape {
    let greedy_or_scale = |t: f32| {
        // Below the smallest temperature, a division would turn logits into infinity.
        if (t as f64) < MIN_TEMPERATURE {
            let max = crate::truncation::largest(values);
            Shape::Greedy { max }
        } else {
            Shape::Scale { temperature: t }
        }
    };
    if range <= 0.0 {
        return greedy_or_scale(temperature);
    }
    let min_temp = (temperature - range).max(0.0);
    let max_temp = temperature + range;
    // The sums from the values that weigh anything when they are few (`exp` for those alone),
    // else over the whole row.
    let mut work = WORK.take();
    let softmax = heavy(values, true, &mut work, |_, softmax, _| Some(softmax))
        .unwrap_or_else(|_| Softmax::of(values));
    WORK.set(work);
    let finite = values.iter().filter(|x| x.is_finite()).count();
    if finite <= 1 || !softmax.is_defined() {
        return Shape::Identity;
    }
    let max_entropy = (finite as f64).ln();
    let entropy = (softmax.scale() as f64).ln() + softmax.entropy_sum as f64 / softmax.sum as f64;
    let normalized = (entropy / max_entropy) as f32;
    greedy_or_scale(min_temp + (max_temp - min_temp) * normalized.powf(exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `temp_ext` arithmetic in f64: the temperature it divides by.
    fn llama_temperature(values: &[f32], t: f64, range: f64, exponent: f64) -> f64 {
        let finite: Vec<f64> = values
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| x as f64)
            .collect();
        let max = finite.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = finite.iter().map(|x| (x - max).exp()).sum();
        let h: f64 = -finite
            .iter()
            .map(|x| {
                let p = (x - max).exp() / s;
                if p > 0.0 {
                    p * p.ln()
                } else {
                    0.0
                }
            })
            .sum::<f64>();
        let lo = (t - range).max(0.0);
        lo + (t + range - lo) * (h / (finite.len() as f64).ln()).powf(exponent)
    }

    #[test]
    fn the_temperature_is_llama_cpps_within_rounding() {
        let mut seed = 1u64;
        for len in [2usize, 10, 1000, 50_000] {
            for (t, range, exponent) in [(1.0, 0.5, 1.0), (0.8, 1.0, 2.0), (1.5, 0.2, 0.5)] {
                for scale in [0.5f32, 4.0, 20.0] {
                    let row: Vec<f32> = (0..len)
                        .map(|i| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            match i % 13 {
                                12 => f32::NEG_INFINITY,
                                _ => ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale,
                            }
                        })
                        .collect();
                    let Shape::Scale { temperature } = shape(&row, t, range, exponent) else {
                        panic!("a scale")
                    };
                    let expected = llama_temperature(&row, t as f64, range as f64, exponent as f64);
                    assert!(
                        (temperature as f64 - expected).abs() < 1e-5 * expected.max(1.0),
                        "{len} {scale}: {temperature} vs {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn edge_cases_follow_llama_cpp() {
        let ninf = f32::NEG_INFINITY;
        assert_eq!(shape(&[1.0, ninf], 1.0, 0.5, 1.0), Shape::Identity);
        // A one-hot row has entropy 0: the smallest temperature, here 0, which is greedy.
        assert_eq!(
            shape(&[0.0, -200.0, -300.0], 0.5, 1.0, 1.0),
            Shape::Greedy { max: 0.0 }
        );
        assert_eq!(
            shape(&[0.0, 1.0], 0.7, 0.0, 1.0),
            Shape::Scale { temperature: 0.7 }
        );
    }
}
