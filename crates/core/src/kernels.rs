//! Whole-row passes. The row is the expensive part (150k–250k logits), so each pass is written to
//! run at memory speed.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};


/// Rows of 16-bit floats are widened in blocks that stay in L1, divided, and narrowed again.
const BLOCK: usize = 512;

/// Divides in f32, in blocks, rounding back to nearest-even.
pub(crate) fn divide_f16(row: &mut [f16], divisor: f32) {
    {
        let mut wide = [0f32; BLOCK];
        for block in row.chunks_mut(BLOCK) {
            let wide = &mut wide[..block.len()];
            block.convert_to_f32_slice(wide);
            divide_f32(wide, divisor);
            block.convert_from_f32_slice(wide);
        }
    }
}

/// Divides in f32, in blocks, rounding back to nearest-even.
pub(crate) fn divide_bf16(row: &mut [bf16], divisor: f32) {
    {
        let mut wide = [0f32; BLOCK];
        for block in row.chunks_mut(BLOCK) {
            let wide = &mut wide[..block.len()];
            block.convert_to_f32_slice(wide);
            divide_f32(wide, divisor);
            block.convert_from_f32_slice(wide);
        }
    }
}

// The fused multiply-add refinement below is exact only away from overflow and underflow, so it is
// used for divisors and dividends well inside the normal range; everything else (zeros, infinities,
// NaN, subnormals, huge values) takes a true division.
const FAST_DIVISOR_MIN: f32 = 1.0 / (1u64 << 30) as f32;
const FAST_DIVISOR_MAX: f32 = (1u64 << 30) as f32;
const FAST_DIVIDEND_MIN: f32 = 1.0 / (1u64 << 60) as f32;
const FAST_DIVIDEND_MAX: f32 = (1u64 << 60) as f32;

/// `x / divisor` for every element, correctly rounded.
///
/// Division is ~2.5x slower than a multiply on the CPUs we run on, enough to make a row pass
/// compute-bound. So where AVX2 and FMA are present, each quotient is computed as `q = x * r` with
/// `r = 1 / divisor`, then corrected once: `q + (x - q * divisor) * r` with fused multiply-adds.
/// Markstein's theorem makes that the correctly rounded quotient when `r` is the correctly rounded
/// reciprocal and nothing overflows or underflows; the tests compare it bit for bit with `/`.
pub(crate) fn divide_f32(row: &mut [f32], divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        let divisor_in_range = (FAST_DIVISOR_MIN..=FAST_DIVISOR_MAX).contains(&divisor.abs());
        if divisor_in_range
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports the features the function is compiled for.
            unsafe { divide_f32_fma(row, divisor) };
            return;
        }
    }
    for x in row.iter_mut() {
        *x /= divisor;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn divide_f32_fma(row: &mut [f32], divisor: f32) {
    use std::arch::x86_64::*;
    let d = _mm256_set1_ps(divisor);
    let r = _mm256_set1_ps(1.0 / divisor);
    let lo = _mm256_set1_ps(FAST_DIVIDEND_MIN);
    let hi = _mm256_set1_ps(FAST_DIVIDEND_MAX);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut chunks = row.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let p = chunk.as_mut_ptr();
        let x = _mm256_loadu_ps(p);
        let magnitude = _mm256_and_ps(x, abs_mask);
        // Ordered compares are false for NaN, which therefore takes the division below.
        let in_range = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(magnitude, lo),
            _mm256_cmp_ps::<_CMP_LE_OQ>(magnitude, hi),
        );
        let q = if _mm256_movemask_ps(in_range) == 0xff {
            let q0 = _mm256_mul_ps(x, r);
            let remainder = _mm256_fnmadd_ps(q0, d, x);
            _mm256_fmadd_ps(remainder, r, q0)
        } else {
            _mm256_div_ps(x, d)
        };
        _mm256_storeu_ps(p, q);
    }
    for x in chunks.into_remainder() {
        *x /= divisor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_exact(xs: &[f32], divisor: f32) {
        let mut fast = xs.to_vec();
        divide_f32(&mut fast, divisor);
        for (x, q) in xs.iter().zip(&fast) {
            let want = x / divisor;
            assert!(
                q.to_bits() == want.to_bits() || (q.is_nan() && want.is_nan()),
                "{x} / {divisor}: got {q:e}, want {want:e}"
            );
        }
    }

    #[test]
    fn specials_divide_exactly() {
        let xs = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE / 4.0,
            f32::MAX,
            f32::MIN,
            1.0,
            -1.0,
            3.0,
        ];
        for divisor in [0.7f32, 0.3, 1e-30, 3e35, 1.0, 2.0, f32::MIN_POSITIVE] {
            check_exact(&xs, divisor);
        }
    }

    #[test]
    fn dense_sweep_matches_division() {
        // Every 997th bit pattern over the whole f32 range, against several temperatures.
        let xs: Vec<f32> = (0..u32::MAX / 997).map(|i| f32::from_bits(i * 997)).collect();
        for divisor in [0.7f32, 0.3, 1.3, 0.1, 2.0 / 3.0, 1.999_999_9] {
            check_exact(&xs, divisor);
        }
    }

    proptest! {
        #[test]
        fn random_quotients_are_exact(
            xs in proptest::collection::vec(any::<f32>(), 1..200),
            divisor in 1e-6f32..1e6,
        ) {
            check_exact(&xs, divisor);
        }

        #[test]
        fn half_rows_round_like_f32_then_narrow(bits in proptest::collection::vec(any::<u16>(), 1..1500), divisor in 0.01f32..100.0) {
            let mut h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
            let mut b: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
            let want_h: Vec<f16> = h.iter().map(|x| f16::from_f32(x.to_f32() / divisor)).collect();
            let want_b: Vec<bf16> = b.iter().map(|x| bf16::from_f32(x.to_f32() / divisor)).collect();
            divide_f16(&mut h, divisor);
            divide_bf16(&mut b, divisor);
            for (got, want) in h.iter().zip(&want_h) {
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            }
            for (got, want) in b.iter().zip(&want_b) {
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            }
        }
    }
}
