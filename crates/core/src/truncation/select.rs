//! Selections shared by the truncation rules.

use crate::truncation::{exp, Work, EXP_MIN};

/// The smallest value but `-inf` whose `q = exp(x - max)` reaches `threshold` (`+inf` when none
/// does). `q`
/// is monotone in `x`, so only the values within a margin of `max + ln(threshold)` need their
/// `q` computed: those above the margin all reach it, those below none does (the margin, 0.01
/// plus 8 units in the last place of `max`, is far wider than the error of `exp` and of the
/// subtraction). One pass: the smallest value above the margin, and the few inside it.
#[inline(always)]
pub(crate) fn lowest_reaching(values: &[f32], max: f32, threshold: f32, work: &mut Work) -> f32 {
    work.clear();
    let ln = (threshold as f64).ln();
    let margin = 0.01 + max.abs() as f64 * (1.0 / (1u64 << 20) as f64);
    // Near `exp`'s floor (-104, where its results are subnormal and coarse), and for a threshold
    // of 0 or NaN, every value is decided exactly.
    let exact_only = threshold.is_nan() || threshold <= 0.0 || ln - margin < (EXP_MIN + 1.0) as f64;
    // `-inf` is never a candidate (its q is 0, which reaches a threshold of 0).
    let lo = if exact_only {
        f32::MIN
    } else {
        (max as f64 + ln - margin) as f32
    };
    let hi = if exact_only {
        f32::INFINITY
    } else {
        (max as f64 + ln + margin) as f32
    };
    let mut sure = f32::INFINITY;
    #[cfg(target_arch = "x86_64")]
    let wide = crate::truncation::wide_available();
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    if wide {
        #[cfg(target_arch = "x86_64")]
        if let Some(smallest) =
            crate::truncation::smallest_above_and_between(values, lo, hi, usize::MAX, work)
        {
            sure = smallest;
        }
    } else {
        for &x in values {
            if x >= lo {
                if x >= hi {
                    sure = sure.min(x);
                } else {
                    work.push((0, 0, x));
                }
            }
        }
    }
    let mut lowest = sure;
    for &(_, _, x) in work.iter() {
        if x < lowest && exp(x - max) >= threshold {
            lowest = x;
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::truncation::largest;

    #[test]
    fn the_lowest_reaching_value_is_the_exact_one_at_any_offset() {
        let mut seed = 17u64;
        for offset in [0.0f32, -50.0, 1e3, 1e5, 3e6] {
            for spread in [0.1f32, 3.0, 40.0, 200.0] {
                let row: Vec<f32> = (0..3000)
                    .map(|i| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        match i % 97 {
                            5 => f32::NAN,
                            6 => f32::NEG_INFINITY,
                            _ => {
                                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread + offset
                            }
                        }
                    })
                    .collect();
                let max = largest(&row);
                for threshold in [0.0f32, 1e-45, 1e-30, 1e-8, 1e-3, 0.1, 0.5, 1.0, 2.0] {
                    let exact = row
                        .iter()
                        .filter(|&&x| x > f32::NEG_INFINITY && exp(x - max) >= threshold)
                        .fold(f32::INFINITY, |m, &x| m.min(x));
                    let got = lowest_reaching(&row, max, threshold, &mut vec![]);
                    assert_eq!(
                        got.to_bits(),
                        exact.to_bits(),
                        "{offset} {spread} {threshold}"
                    );
                }
            }
        }
    }
}
