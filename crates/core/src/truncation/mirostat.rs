//! Mirostat's row math: version 1's `k` from a Zipf estimate, version 2's surprise bound.

use crate::truncation::select::lowest_reaching;
use crate::truncation::{
    collect_from, exp, heavy, kth_largest, largest, lowest_reaching_near, Band, Softmax, Work,
};

/// Mirostat 2's band: the values whose probability is at least `2^-mu` (`q >= S 2^-mu`), at
/// least the largest (every tie of it). From the values that weigh anything when they are few
/// ([`heavy`]: one pass) and the threshold is not tiny.
#[inline(always)]
pub(crate) fn band_v2(values: &[f32], mu: f32, work: &mut Work) -> Band {
    let threshold = |softmax: &Softmax| (softmax.scale() as f64 * (-(mu as f64)).exp2()) as f32;
    let near = heavy(values, false, work, |near, softmax, work| {
        let lo = lowest_reaching_near(near, softmax.max, threshold(&softmax), work)?;
        Some(Band {
            lo: lo.min(softmax.max),
            hi: f32::INFINITY,
        })
    });
    let max = match near {
        Ok(band) => return band,
        Err(max) => max.unwrap_or_else(|| largest(values)),
    };
    if !max.is_finite() {
        return Band::ALL;
    }
    let softmax = Softmax::weights_only(values, max);
    Band {
        lo: lowest_reaching(values, max, threshold(&softmax), work).min(max),
        hi: f32::INFINITY,
    }
}

/// Mirostat 1's band: `s_hat` from the `m` largest finite values' probabilities (llama.cpp's f32
/// arithmetic), then the `max(k, 1)` largest values (every tie of the k-th).
#[inline(always)]
pub(crate) fn band_v1(values: &[f32], mu: f32, m: u32, n_vocab: u32, work: &mut Work) -> Band {
    let max = largest(values);
    if !max.is_finite() {
        return Band::ALL;
    }
    let finite = values.iter().filter(|x| x.is_finite()).count();
    let top = (m as usize).min(finite);
    let floor = kth_largest(values, top, work);
    // `floor` is finite (the row's maximum is, and `top` is at most the finite count): the values
    // at or above it are the finite ones, collected by the vectorized compare pass.
    collect_from(values, floor, work, |_| 0);
    work.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
    let softmax = Softmax::weights_only(values, max);
    let scale = softmax.scale();
    let p = |i: usize| exp(work[i].2 - max) / scale;
    let mut sum_ti_bi = 0.0f32;
    let mut sum_ti_sq = 0.0f32;
    for i in 0..(m as usize - 1).min(finite.saturating_sub(1)) {
        let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
        let b_i = (p(i) / p(i + 1)).ln();
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
    }
    let s_hat = sum_ti_bi / sum_ti_sq;
    let epsilon_hat = s_hat - 1.0;
    let k = ((epsilon_hat * 2f32.powf(mu)) / (1.0 - (n_vocab as f32).powf(-epsilon_hat)))
        .powf(1.0 / s_hat);
    // `int(k)` in C++: truncation toward 0; NaN and values out of `int`'s range are undefined
    // behaviour there, and x86's conversion gives `INT_MIN`, so llama.cpp keeps one token: so
    // does this.
    let k = if !(-2_147_483_648.0..2_147_483_648.0).contains(&k) {
        1
    } else {
        (k as i64).max(1) as usize
    };
    Band {
        lo: kth_largest(values, k.min(finite), work),
        hi: f32::INFINITY,
    }
}
