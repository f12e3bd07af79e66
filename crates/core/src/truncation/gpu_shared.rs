//! The arithmetic a truncation band is computed with, shared with the GPU: the device's band kernel
//! (`python/logits_processing/kernels/apply.py`) computes the same bits from the same definitions,
//! with the constants here (through `logits_processing_cuda::packed::constants`).
//!
//! A band is a function of the row's values alone, computed with arithmetic that a GPU reproduces
//! bit for bit (the device's band kernel does), whatever order it visits the values in:
//!
//! - **Maximum** `m`: the largest non-NaN value under `f32::total_cmp` order ([`order_key`]).
//! - **Unnormalized probability** `q(x) = exp(x - m)`, the subtraction in f32 and [`exp`] built
//!   only from IEEE f32 basic operations and fused multiply-adds (`f32::mul_add`, CUDA `fmaf`,
//!   both correctly rounded), never the platform's libm. Its error against the exact `e^x`, over
//!   f32 that a test samples in `[-103, 88]`, is below 1 unit in the last place (0.99 ulp at
//!   worst); `exp(0)` is exactly 1, so the largest value's `q` is 1.
//! - **Sums in fixed point**: each `q` is rounded to an integer multiple of `2^-32` ([`fixed`],
//!   round to nearest even; `q <= 1`, so at most `2^32`) and summed as `u64`, which is exact and
//!   so independent of order for any row shorter than `2^31`. The softmax sum is
//!   `W = sum fixed(q(x))`; a probability `q / W` is therefore known to `2^-33` of the largest
//!   probability, and probabilities below that count as 0 in every sum.
//! - **Entropy**: with `d = x - m`, `H = ln S + E / W` where `S = W * 2^-32` and
//!   `E = sum fixed(q * -d)` (over values that are not `-inf`). No logarithm is needed: the
//!   typical rule compares `-ln p - H = -d - E / W`, and eta's `exp(-H)` is `exp(-E / W) / S`.
//!   `E / W` is an f64 division (correctly rounded), rounded to f32.
//! - **Thresholds** are compared in `q` units, each from IEEE operations: min-p keeps
//!   `q >= p` (the top probability's `q` is 1); epsilon keeps `q >= epsilon * S`; eta keeps
//!   `q >= min(epsilon * S, sqrt(epsilon) * exp(-E / W))`. Mass targets (top-p, typical) are
//!   `p * W` in f64, compared with exact `u64` partial sums converted to f64.
//! - **Selection** is by exact keys: a rule's boundary is one of the row's values (or, for
//!   typical, one of the scores `|d + E / W|`), the one where a partial sum over the values in key
//!   order first reaches the target. A sort, a partial selection or a radix select over
//!   [`order_key`]s finds the same one.
//!
//! Against transformers' f64 softmax the bands differ only where a probability sits within this
//! rounding of the rule's threshold (a test allows one boundary token to differ).

/// Bits after the point of the fixed-point probabilities ([`fixed`]).
pub const FIXED_BITS: u32 = 32;

/// `v` (non-negative, below `2^31`) as an integer multiple of `2^-FIXED_BITS`, rounded to nearest
/// even: `round(v * 2^32)`. The multiplication is exact, so this is one correct rounding.
#[inline(always)]
pub fn fixed(v: f32) -> u64 {
    (v * (1u64 << FIXED_BITS) as f32).round_ties_even() as u64
}

/// `q^2` (q a probability's `exp`, at most 1) as an integer multiple of `2^-FIXED_BITS`, rounded to
/// nearest even: the square is exact in f64, so this is one correct rounding, and a sum of them
/// (p-less's collision sum) is exact in any order.
#[inline(always)]
pub fn fixed_square(q: f32) -> u64 {
    let q = q as f64;
    (q * q * (1u64 << FIXED_BITS) as f64).round_ties_even() as u64
}

/// `e^x` from IEEE f32 basic operations and fused multiply-adds only, so that any machine with
/// IEEE arithmetic (a GPU's `fmaf` included) computes the same bits: Cody-Waite reduction by
/// `ln 2` (`x = n ln 2 + r`, `|r| <= ln 2 / 2`), Cephes' degree-7 polynomial for `e^r`, and a
/// scale by `2^n` (in two steps below the normal range). Within 1 ulp of the exact value
/// (a test samples `[-103, 88]`); `exp(0) == 1`; below `-104` it is 0, above `88.73` infinity.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    let n = x.mul_add(EXP_LOG2_E, EXP_SHIFTER) - EXP_SHIFTER;
    let r = n.mul_add(-EXP_LN2_HI, x);
    let r = n.mul_add(-EXP_LN2_LO, r);
    let p = EXP_POLY[1..]
        .iter()
        .fold(EXP_POLY[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    let n = n as i32;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    if n < -126 {
        y * pow2(n + 64) * pow2(-64)
    } else if n > 127 {
        y * 2.0 * pow2(n - 1)
    } else {
        y * pow2(n)
    }
}

/// [`exp`] is 0 below this.
pub const EXP_MIN: f32 = -104.0;
/// [`exp`] is infinite above this.
pub const EXP_MAX: f32 = 88.73;
/// `log2(e)`, rounded to f32.
pub const EXP_LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `1.5 * 2^23`: adding it rounds to an integer (nearest even), subtracting it recovers it.
pub const EXP_SHIFTER: f32 = 12_582_912.0;
/// `ln 2` in two parts: the high part has few bits, so `n * EXP_LN2_HI` is exact.
pub const EXP_LN2_HI: f32 = 0.693_359_4;
pub const EXP_LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' polynomial for `(e^r - 1 - r) / r^2`, highest degree first (Horner, with fused
/// multiply-adds).
pub const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// The natural logarithm of a finite `x >= 1` (what a softmax sum `W * 2^-32` is), in f64, from
/// IEEE basic operations only (fdlibm's `__ieee754_log`: `x = 2^k (1 + f)`, `ln(1 + f)` by the
/// series in `s = f / (2 + f)`), so a GPU computes the same bits. Within 1 unit in the last place
/// of the exact logarithm (a test compares it with the platform's).
pub fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut high = (bits >> 32) as i32;
    let low = bits as u32;
    let mut k = (high >> 20) - 1023;
    high &= 0x000f_ffff;
    // The mantissa in [sqrt(2)/2, sqrt(2)), and k to match.
    let i = (high + 0x95f64) & 0x0010_0000;
    let x = f64::from_bits((((high | (i ^ 0x3ff0_0000)) as u32 as u64) << 32) | low as u64);
    k += i >> 20;
    let f = x - 1.0;
    let dk = k as f64;
    if (0x000f_ffff & (2 + high)) < 3 {
        // |f| < 2^-20.
        if f == 0.0 {
            return dk * LN_LN2_HI + dk * LN_LN2_LO;
        }
        let r = f * f * (0.5 - (1.0 / 3.0) * f);
        return dk * LN_LN2_HI - ((r - dk * LN_LN2_LO) - f);
    }
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LN_POLY[1] + w * (LN_POLY[3] + w * LN_POLY[5]));
    let t2 = z * (LN_POLY[0] + w * (LN_POLY[2] + w * (LN_POLY[4] + w * LN_POLY[6])));
    let r = t2 + t1;
    if ((high - 0x6147a) | (0x6b851 - high)) > 0 {
        let hfsq = 0.5 * f * f;
        dk * LN_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN_LN2_LO)) - f)
    } else {
        dk * LN_LN2_HI - ((s * (f - r) - dk * LN_LN2_LO) - f)
    }
}

/// [`ln`]'s split of `ln 2` (its high part has trailing zeros, so `k * LN_LN2_HI` is exact), by
/// their bits (fdlibm's).
pub const LN_LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
pub const LN_LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// [`ln`]'s series coefficients (fdlibm's `Lg1` to `Lg7`), by their bits.
pub const LN_POLY: [f64; 7] = [
    f64::from_bits(0x3FE5_5555_5555_5593),
    f64::from_bits(0x3FD9_9999_9997_FA04),
    f64::from_bits(0x3FD2_4924_9422_9359),
    f64::from_bits(0x3FCC_71C5_1D8E_78AF),
    f64::from_bits(0x3FC7_4664_96CB_03DE),
    f64::from_bits(0x3FC3_9A09_D078_C69F),
    f64::from_bits(0x3FC2_F112_DF3E_5244),
];

/// The key that orders f32 as `f32::total_cmp` does, as an unsigned integer.
#[inline]
pub fn order_key(x: f32) -> u32 {
    let bits = x.to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The f32 of an [`order_key`].
#[inline]
pub fn from_order_key(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ln` is within one unit in the last place of the platform's logarithm, and equal to it
    /// nearly always (97.7% of these), from 1 to 2^60 (softmax sums live between 1 and 2^49).
    #[test]
    fn ln_is_within_an_ulp_of_the_platforms() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut same = 0;
        let cases = 200_000;
        for n in 0..cases {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let x = match n % 4 {
                0 => 1.0 + (seed >> 11) as f64 / (1u64 << 53) as f64,
                1 => (seed >> 4) as f64,
                2 => 1.0 + (n as f64) * 1e-9,
                _ => (seed >> 40) as f64 + 1.0,
            };
            let (got, want) = (ln(x), x.ln());
            assert!(
                (got.to_bits() as i64 - want.to_bits() as i64).abs() <= 1,
                "ln({x:e}) = {got:e}, platform {want:e}"
            );
            same += usize::from(got == want);
        }
        assert!(
            same * 100 > cases * 95,
            "{same} of {cases} equal the platform's"
        );
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(2.0).to_bits(), std::f64::consts::LN_2.to_bits());
    }

    /// The largest error of [`exp`] in ulp of the exact value, over every 97th f32 of `[-103, 0]`
    /// and a grid of `[0, 88]`.
    #[test]
    fn exp_is_within_one_ulp_and_exact_at_zero() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        let ulp_error = |x: f32| {
            let exact = (x as f64).exp();
            let rounded = exact as f32;
            let ulp = if rounded.is_subnormal() || rounded == 0.0 {
                f32::from_bits(1) as f64
            } else {
                (f32::from_bits(rounded.to_bits() + 1) - rounded) as f64
            };
            (exp(x) as f64 - exact).abs() / ulp
        };
        let mut worst = (0.0f64, 0.0f32);
        let mut bits = 0.0f32.to_bits() | 0x8000_0000;
        while f32::from_bits(bits) >= -103.0 {
            let x = f32::from_bits(bits);
            let e = ulp_error(x);
            if e > worst.0 {
                worst = (e, x);
            }
            bits += 97;
        }
        for i in 0..88_000 {
            let x = i as f32 * 1e-3;
            let e = ulp_error(x);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 < 1.0, "{} ulp at {}", worst.0, worst.1);
        println!("exp: worst {} ulp at {}", worst.0, worst.1);
    }
}
