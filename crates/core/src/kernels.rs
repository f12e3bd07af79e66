//! Whole-row passes. The row is the expensive part (150k–250k logits), so each pass is written to
//! run at memory speed.

use half::{bf16, f16};

// The fused multiply-add refinement below is exact only away from overflow and underflow, so it is
// used for divisors and dividends well inside the normal range; blocks holding anything else
// (zeros, infinities, NaN, subnormals, huge values) take a true division.
const FAST_DIVISOR_MIN: f32 = 1.0 / (1u64 << 30) as f32;
const FAST_DIVISOR_MAX: f32 = (1u64 << 30) as f32;
const FAST_DIVIDEND_MIN: f32 = 1.0 / (1u64 << 60) as f32;
const FAST_DIVIDEND_MAX: f32 = (1u64 << 60) as f32;

/// Whether the AVX2 + FMA (+ F16C) kernels may run for this divisor.
#[cfg(target_arch = "x86_64")]
fn use_simd(divisor: f32) -> bool {
    (FAST_DIVISOR_MIN..=FAST_DIVISOR_MAX).contains(&divisor.abs())
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// A pass over a row: read from `src`, write to `dst`, element by element. The two are the same row
/// for an edit in place, or two rows of one length (`Pass::between`).
#[doc(hidden)]
pub struct Pass<T> {
    src: *const T,
    dst: *mut T,
    len: usize,
}

impl<T> Pass<T> {
    pub(crate) fn in_place(row: &mut [T]) -> Self {
        let p = row.as_mut_ptr();
        Self {
            src: p,
            dst: p,
            len: row.len(),
        }
    }

    /// Panics if the lengths differ (callers check them first).
    pub(crate) fn between(src: &[T], dst: &mut [T]) -> Self {
        assert_eq!(src.len(), dst.len(), "a pass needs rows of one length");
        Self {
            src: src.as_ptr(),
            dst: dst.as_mut_ptr(),
            len: dst.len(),
        }
    }

    /// Writes `f(src[i])` to `dst[i]` for every `i`.
    fn map(&self, f: impl Fn(T) -> T)
    where
        T: Copy,
    {
        for i in 0..self.len {
            // SAFETY: both pointers cover `len` elements (the constructors take them from slices
            // that outlive the pass, which is used within the call that made it).
            unsafe { *self.dst.add(i) = f(*self.src.add(i)) };
        }
    }
}

/// `x / divisor` for every element, correctly rounded.
///
/// Division is ~2.5x slower than a multiply on the CPUs we run on, enough to make a row pass
/// compute-bound. So where AVX2 and FMA are present, each quotient is computed as `q = x * r` with
/// `r = 1 / divisor`, then corrected once: `q + (x - q * divisor) * r` with fused multiply-adds.
/// Markstein's theorem makes that the correctly rounded quotient when `r` is the correctly rounded
/// reciprocal and nothing overflows or underflows; the tests compare it bit for bit with `/`.
pub(crate) fn divide_f32(pass: Pass<f32>, divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_simd(divisor) {
        // SAFETY: the CPU has the features the function is compiled for.
        unsafe { simd::divide_f32(pass, divisor) };
        return;
    }
    pass.map(|x| x / divisor);
}

/// Divides in f32 and rounds back to nearest-even, as torch does for f16.
pub(crate) fn divide_f16(pass: Pass<f16>, divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_simd(divisor) {
        // SAFETY: as above.
        unsafe { simd::divide_f16(pass, divisor) };
        return;
    }
    pass.map(|x| f16::from_f32(x.to_f32() / divisor));
}

/// Divides in f32 and rounds back to nearest-even, as torch does for bf16.
pub(crate) fn divide_bf16(pass: Pass<bf16>, divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_simd(divisor) {
        // SAFETY: as above.
        unsafe { simd::divide_bf16(pass, divisor) };
        return;
    }
    pass.map(|x| bf16::from_f32(x.to_f32() / divisor));
}

/// Sets every element to `value` with streaming (non-temporal) stores where AVX2 is present: a
/// forced row is written without being read, and streaming stores skip reading each cache line
/// before overwriting it, which halves the memory traffic of a fill that does not fit in cache.
pub(crate) fn fill_streaming<T: Copy>(row: &mut [T], value: T) {
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of::<T>() <= 32 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the function writes only inside `row`.
        unsafe { simd::fill_streaming(row, value) };
        return;
    }
    row.fill(value);
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{bf16, f16, Pass, FAST_DIVIDEND_MAX, FAST_DIVIDEND_MIN};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn fill_streaming<T: Copy>(row: &mut [T], value: T) {
        // Scalar writes up to a 32-byte boundary, streaming stores of 32 bytes, scalar tail.
        let head = row.as_ptr().align_offset(32).min(row.len());
        let (first, rest) = row.split_at_mut(head);
        first.fill(value);
        let per_vector = 32 / std::mem::size_of::<T>();
        if rest.is_empty() || 32 % std::mem::size_of::<T>() != 0 {
            rest.fill(value);
            return;
        }
        let pattern = [value; 32];
        let pattern = _mm256_loadu_si256(pattern.as_ptr() as *const __m256i);
        let mut vectors = rest.chunks_exact_mut(per_vector);
        for vector in &mut vectors {
            _mm256_stream_si256(vector.as_mut_ptr() as *mut __m256i, pattern);
        }
        vectors.into_remainder().fill(value);
        // Streaming stores are weakly ordered: make them visible before the row is handed back.
        _mm_sfence();
    }

    /// Lanes per block: the range check is made once per block, so the common case (every logit
    /// an ordinary number) costs a multiply and two fused multiply-adds per vector.
    const VECTORS: usize = 8;
    pub(super) const BLOCK: usize = VECTORS * 8;

    /// Divides a block of eight vectors in place.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn divide_block(xs: &mut [__m256; VECTORS], divisor: __m256, reciprocal: __m256) {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut smallest = _mm256_set1_ps(f32::INFINITY);
        let mut largest = _mm256_setzero_ps();
        for &x in xs.iter() {
            let magnitude = _mm256_and_ps(x, abs_mask);
            // A NaN operand makes min/max return their second operand: with the running bound
            // second, a NaN is skipped instead of erasing the bound (which would let a zero, an
            // infinity or a subnormal in the same lane take the fused path). NaN itself comes out
            // of the fused path as NaN.
            smallest = _mm256_min_ps(magnitude, smallest);
            largest = _mm256_max_ps(magnitude, largest);
        }
        let in_range = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(smallest, _mm256_set1_ps(FAST_DIVIDEND_MIN)),
            _mm256_cmp_ps::<_CMP_LE_OQ>(largest, _mm256_set1_ps(FAST_DIVIDEND_MAX)),
        );
        if _mm256_movemask_ps(in_range) == 0xff {
            for x in xs.iter_mut() {
                let q0 = _mm256_mul_ps(*x, reciprocal);
                let remainder = _mm256_fnmadd_ps(q0, divisor, *x);
                *x = _mm256_fmadd_ps(remainder, reciprocal, q0);
            }
        } else {
            // Zeros, infinities (masked logits), NaN, subnormals: a true division.
            for x in xs.iter_mut() {
                *x = _mm256_div_ps(*x, divisor);
            }
        }
    }

    /// Blocks of the pass, then the elements past the last whole block.
    fn blocks<T>(pass: &Pass<T>) -> (usize, std::ops::Range<usize>) {
        (pass.len / BLOCK, pass.len / BLOCK * BLOCK..pass.len)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn divide_f32(pass: Pass<f32>, divisor: f32) {
        let (d, r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
        let (whole, tail) = blocks(&pass);
        for block in 0..whole {
            let (src, dst) = (pass.src.add(block * BLOCK), pass.dst.add(block * BLOCK));
            let mut xs = [_mm256_setzero_ps(); VECTORS];
            for (i, x) in xs.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(src.add(8 * i));
            }
            divide_block(&mut xs, d, r);
            for (i, x) in xs.iter().enumerate() {
                _mm256_storeu_ps(dst.add(8 * i), *x);
            }
        }
        for i in tail {
            *pass.dst.add(i) = *pass.src.add(i) / divisor;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn divide_f16(pass: Pass<f16>, divisor: f32) {
        let (d, r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
        let (whole, tail) = blocks(&pass);
        for block in 0..whole {
            let src = pass.src.add(block * BLOCK) as *const __m128i;
            let dst = pass.dst.add(block * BLOCK) as *mut __m128i;
            let mut xs = [_mm256_setzero_ps(); VECTORS];
            for (i, x) in xs.iter_mut().enumerate() {
                *x = _mm256_cvtph_ps(_mm_loadu_si128(src.add(i)));
            }
            divide_block(&mut xs, d, r);
            for (i, x) in xs.iter().enumerate() {
                _mm_storeu_si128(dst.add(i), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*x));
            }
        }
        for i in tail {
            *pass.dst.add(i) = f16::from_f32((*pass.src.add(i)).to_f32() / divisor);
        }
    }

    /// The bf16 nearest-even to each f32, in the low half of its lane: add 0x7fff plus the lowest
    /// kept bit, keep the top half. Quotients of bf16 values have zero low halves when they are NaN
    /// or infinite, so the add cannot carry into them, and the result is `bf16::from_f32`'s.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn round_to_bf16(q: __m256) -> __m256i {
        let bits = _mm256_castps_si256(q);
        let lowest_kept = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7fff));
        _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, bias))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn divide_bf16(pass: Pass<bf16>, divisor: f32) {
        let (d, r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
        let zero = _mm256_setzero_si256();
        let (whole, tail) = blocks(&pass);
        for block in 0..whole {
            let src = pass.src.add(block * BLOCK) as *const __m256i;
            let dst = pass.dst.add(block * BLOCK) as *mut __m256i;
            let mut xs = [_mm256_setzero_ps(); VECTORS];
            for (i, pair) in xs.chunks_exact_mut(2).enumerate() {
                // A zero below each bf16 widens it to f32, in a lane order that packus undoes.
                let halves = _mm256_loadu_si256(src.add(i));
                pair[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, halves));
                pair[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, halves));
            }
            divide_block(&mut xs, d, r);
            for (i, pair) in xs.chunks_exact(2).enumerate() {
                let narrowed = _mm256_packus_epi32(round_to_bf16(pair[0]), round_to_bf16(pair[1]));
                _mm256_storeu_si256(dst.add(i), narrowed);
            }
        }
        for i in tail {
            *pass.dst.add(i) = bf16::from_f32((*pass.src.add(i)).to_f32() / divisor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_exact(xs: &[f32], divisor: f32) {
        let mut fast = xs.to_vec();
        divide_f32(Pass::in_place(&mut fast), divisor);
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
    fn a_nan_does_not_hide_specials_in_its_lane() {
        // The SIMD path checks a block lane by lane (element i is in lane i % 8): a NaN after a
        // zero, an infinity or a subnormal of its lane must not let them take the fused path.
        let mut xs = vec![1.0f32; 64];
        xs[0] = -0.0;
        xs[8] = f32::NAN;
        xs[2] = f32::INFINITY;
        xs[10] = f32::NAN;
        xs[20] = f32::NAN;
        xs[28] = 1e-40;
        check_exact(&xs, 0.7);
    }

    #[test]
    fn dense_sweep_matches_division() {
        // Every 997th bit pattern over the whole f32 range, against several temperatures.
        let xs: Vec<f32> = (0..u32::MAX / 997)
            .map(|i| f32::from_bits(i * 997))
            .collect();
        for divisor in [0.7f32, 0.3, 1.3, 0.1, 2.0 / 3.0, 1.999_999_9] {
            check_exact(&xs, divisor);
        }
    }

    #[test]
    fn streaming_fill_writes_exactly_the_row() {
        // Every start alignment and a range of lengths, with guards on both sides.
        for start in 0..16 {
            for len in [0, 1, 7, 8, 9, 31, 64, 100, 1000] {
                let mut wide = vec![1.0f32; start + len + 8];
                fill_streaming(&mut wide[start..start + len], f32::NEG_INFINITY);
                let mut expected = vec![1.0f32; start + len + 8];
                expected[start..start + len].fill(f32::NEG_INFINITY);
                assert_eq!(wide, expected, "f32 start {start} len {len}");

                let mut narrow = vec![bf16::ONE; start + len + 8];
                fill_streaming(&mut narrow[start..start + len], bf16::NEG_INFINITY);
                let mut expected = vec![bf16::ONE; start + len + 8];
                expected[start..start + len].fill(bf16::NEG_INFINITY);
                assert_eq!(narrow, expected, "bf16 start {start} len {len}");
            }
        }
    }

    #[test]
    fn every_half_value_divides_like_f32_then_rounds() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for divisor in [0.7f32, 0.3, 1.3, 3.0, 1e-3, 1e-35] {
            let mut h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
            let mut b: Vec<bf16> = all.iter().map(|&b| bf16::from_bits(b)).collect();
            divide_f16(Pass::in_place(&mut h), divisor);
            divide_bf16(Pass::in_place(&mut b), divisor);
            for (i, &bits) in all.iter().enumerate() {
                let want_h = f16::from_f32(f16::from_bits(bits).to_f32() / divisor);
                let want_b = bf16::from_f32(bf16::from_bits(bits).to_f32() / divisor);
                assert!(
                    h[i].to_bits() == want_h.to_bits() || (h[i].is_nan() && want_h.is_nan()),
                    "f16 {bits:#x} / {divisor}"
                );
                assert!(
                    b[i].to_bits() == want_b.to_bits() || (b[i].is_nan() && want_b.is_nan()),
                    "bf16 {bits:#x} / {divisor}"
                );
            }
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
            divide_f16(Pass::in_place(&mut h), divisor);
            divide_bf16(Pass::in_place(&mut b), divisor);
            for (got, want) in h.iter().zip(&want_h) {
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            }
            for (got, want) in b.iter().zip(&want_b) {
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            }
        }
    }
}
