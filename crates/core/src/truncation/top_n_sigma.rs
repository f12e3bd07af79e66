//! Top-n-sigma's row math: the band of the values within `n` standard deviations of the
//! maximum.

use crate::truncation::Band;

/// The band top-n-sigma keeps: `x >= max - n * sigma`, the maximum, mean and standard deviation
/// over the finite values (`-inf`, `+inf` and NaN take no part; NaN is never removed). The mean
/// and the variance are summed in f64 in a fixed order (eight partial sums); `n * sigma` and the
/// subtraction are f32, as llama.cpp computes them.
#[inline(always)]
pub(crate) fn band(values: &[f32], n: f32) -> Band {
    if n <= 0.0 {
        return Band::ALL;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::truncation::simd_available() {
        let (count, max, sums) = crate::truncation::finite_lane_sums(values, None);
        if count <= 1 {
            return Band::ALL;
        }
        let mean = pairwise(&sums) / count as f64;
        let variance = pairwise(&crate::truncation::finite_lane_sums(values, Some(mean)).2);
        let sigma = (variance / count as f64).sqrt() as f32;
        return Band {
            lo: max - n * sigma,
            hi: f32::INFINITY,
        };
    }
    let (count, max, sum) = finite_stats(values);
    if count <= 1 {
        return Band::ALL;
    }
    let mean = sum / count as f64;
    let variance = lanes(values, |x| {
        let d = x as f64 - mean;
        d * d
    });
    let sigma = (variance / count as f64).sqrt() as f32;
    Band {
        lo: max - n * sigma,
        hi: f32::INFINITY,
    }
}

/// [`band`] of a row whose values other than `-inf` are `values`, at the ascending indices `at`
/// (every other value `-inf`, which takes no part): the same sums, each value added to the
/// partial sum of its index in the row, in index order, so the same bits as over the whole row.
pub(crate) fn band_at(values: &[f32], at: &[u32], n: f32) -> Band {
    if n <= 0.0 {
        return Band::ALL;
    }
    let finite = || {
        values
            .iter()
            .zip(at)
            .filter(|(x, _)| x.is_finite())
            .map(|(&x, &i)| (x, i as usize % LANES))
    };
    let (mut count, mut max, mut acc) = (0usize, f32::NEG_INFINITY, [0f64; LANES]);
    for (x, lane) in finite() {
        count += 1;
        max = max.max(x);
        acc[lane] += x as f64;
    }
    if count <= 1 {
        return Band::ALL;
    }
    let mean = pairwise(&acc) / count as f64;
    let mut acc = [0f64; LANES];
    for (x, lane) in finite() {
        let d = x as f64 - mean;
        acc[lane] += d * d;
    }
    let sigma = (pairwise(&acc) / count as f64).sqrt() as f32;
    Band {
        lo: max - n * sigma,
        hi: f32::INFINITY,
    }
}

/// Values summed at a time, one partial sum each (a fixed order: the same sums on every run).
const LANES: usize = 8;

/// `sum f(x)` over the finite values, in f64: `LANES` partial sums in index order, added
/// pairwise at the end. Branch-free, so the compiler vectorizes it.
#[inline(always)]
fn lanes(values: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; LANES];
    let blocks = values.chunks_exact(LANES);
    let rest = blocks.remainder();
    for block in blocks {
        for (a, &x) in acc.iter_mut().zip(block) {
            *a += if x.is_finite() { f(x) } else { 0.0 };
        }
    }
    for (a, &x) in acc.iter_mut().zip(rest) {
        *a += if x.is_finite() { f(x) } else { 0.0 };
    }
    pairwise(&acc)
}

/// The partial sums added pairwise.
#[inline(always)]
fn pairwise(acc: &[f64; LANES]) -> f64 {
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// The number, maximum and f64 sum of the finite values, in one pass (the sum as [`lanes`]
/// adds it).
#[inline(always)]
pub(crate) fn finite_stats(values: &[f32]) -> (usize, f32, f64) {
    let mut count = [0u32; LANES];
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut acc = [0f64; LANES];
    let mut add = |j: usize, x: f32| {
        let finite = x.is_finite();
        count[j] += finite as u32;
        max[j] = if finite && x > max[j] { x } else { max[j] };
        acc[j] += if finite { x as f64 } else { 0.0 };
    };
    let blocks = values.chunks_exact(LANES);
    let rest = blocks.remainder();
    for block in blocks {
        for (j, &x) in block.iter().enumerate() {
            add(j, x);
        }
    }
    for (j, &x) in rest.iter().enumerate() {
        add(j, x);
    }
    let count = count.iter().map(|&c| c as usize).sum();
    let max = max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    (count, max, pairwise(&acc))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's loop, in f64.
    fn reference(values: &[f32], n: f32) -> Vec<bool> {
        let finite: Vec<f64> = values
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| x as f64)
            .collect();
        if n <= 0.0 || finite.len() <= 1 {
            return vec![true; values.len()];
        }
        let max = finite.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let var = finite.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / finite.len() as f64;
        let cut = max - n as f64 * var.sqrt();
        values
            .iter()
            .map(|&x| x.is_nan() || x as f64 >= cut)
            .collect()
    }

    #[test]
    fn keeps_what_the_definition_keeps_away_from_the_cut() {
        let mut seed = 7u64;
        for len in [2usize, 3, 17, 1000] {
            for n in [0.5f32, 1.0, 2.0, -1.0] {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        match i % 11 {
                            3 => f32::NEG_INFINITY,
                            _ => ((seed >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0,
                        }
                    })
                    .collect();
                let b = band(&row, n);
                let expected = reference(&row, n);
                let cut = if n > 0.0 { b.lo } else { f32::NEG_INFINITY };
                for (i, &x) in row.iter().enumerate() {
                    if (x - cut).abs() > 1e-4 && x.is_finite() {
                        assert_eq!(
                            !b.removes(x),
                            expected[i],
                            "len {len} n {n} x {x} cut {cut}"
                        );
                    }
                }
            }
        }
    }

    /// The one-pass sum is [`lanes`]' sum bit for bit (the same eight partial sums).
    #[test]
    fn one_pass_stats_are_the_lane_sums() {
        let mut seed = 3u64;
        for len in [0usize, 1, 7, 8, 9, 1000, 151_936] {
            let row: Vec<f32> = (0..len)
                .map(|i| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    match i % 29 {
                        3 => f32::NEG_INFINITY,
                        4 => f32::NAN,
                        5 => f32::INFINITY,
                        _ => {
                            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e4 * (i % 7) as f32
                        }
                    }
                })
                .collect();
            let (count, max, sum) = finite_stats(&row);
            assert_eq!(count, row.iter().filter(|x| x.is_finite()).count());
            let finite_max = row
                .iter()
                .filter(|x| x.is_finite())
                .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            assert_eq!(max.to_bits(), finite_max.to_bits());
            assert_eq!(sum.to_bits(), lanes(&row, |x| x as f64).to_bits(), "{len}");
            #[cfg(target_arch = "x86_64")]
            if crate::truncation::simd_available() {
                let (c, m, sums) = crate::truncation::finite_lane_sums(&row, None);
                assert_eq!((c, m.to_bits()), (count, max.to_bits()));
                assert_eq!(pairwise(&sums).to_bits(), sum.to_bits(), "{len}");
                let mean = sum / count.max(1) as f64;
                let squares = lanes(&row, |x| (x as f64 - mean) * (x as f64 - mean));
                let wide = pairwise(&crate::truncation::finite_lane_sums(&row, Some(mean)).2);
                assert_eq!(wide.to_bits(), squares.to_bits(), "{len}");
            }
        }
    }

    /// Over the values that are not `-inf`, with their indices, the band is the whole row's, bit
    /// for bit.
    #[test]
    fn the_band_at_indices_is_the_rows() {
        let mut seed = 5u64;
        for len in [2usize, 9, 1000, 20_000] {
            let row: Vec<f32> = (0..len)
                .map(|i| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    match (seed >> 33) % 5 {
                        0 if i % 3 == 0 => f32::NAN,
                        0 | 1 => f32::NEG_INFINITY,
                        _ => ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0,
                    }
                })
                .collect();
            let at: Vec<u32> = (0..len as u32)
                .filter(|&i| row[i as usize] != f32::NEG_INFINITY)
                .collect();
            let values: Vec<f32> = at.iter().map(|&i| row[i as usize]).collect();
            for n in [0.5f32, 1.0, 3.0, -1.0] {
                let (whole, sparse) = (band(&row, n), band_at(&values, &at, n));
                assert_eq!(whole.lo.to_bits(), sparse.lo.to_bits(), "len {len} n {n}");
                assert_eq!(whole.hi, sparse.hi);
            }
        }
    }

    #[test]
    fn non_finite_values_take_no_part() {
        let nan = f32::NAN;
        let ninf = f32::NEG_INFINITY;
        let b = band(&[0.0, 1.0, 2.0, 3.0, ninf, nan], 1.0);
        let sigma = (1.25f64).sqrt() as f32;
        assert_eq!(b.lo, 3.0 - sigma);
        assert!(!b.removes(nan));
        assert_eq!(band(&[1.0, ninf, ninf], 1.0), Band::ALL);
    }
}
