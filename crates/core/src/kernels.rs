//! Whole-row passes. The row is the expensive part (150k–250k logits), so each pass is written to
//! run at memory speed.

use half::{bf16, f16};

use crate::logit::Logit;
use crate::truncation::Band;

mod mask;
pub(crate) use mask::mask_groups;

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
    (FAST_DIVISOR_MIN..=FAST_DIVISOR_MAX).contains(&divisor.abs()) && crate::cpu::avx2_fma_f16c()
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
///
/// The SIMD path mostly takes one multiply per element, proven exact for the divisor before the
/// row is touched (see `simd::method`).
pub(crate) fn divide_f16(pass: Pass<f16>, divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_simd(divisor) {
        // SAFETY: as above.
        unsafe { simd::divide_f16(pass, divisor) };
        return;
    }
    divide_f16_portable(pass, divisor);
}

/// Divides in f32 and rounds back to nearest-even, as torch does for bf16 (SIMD path: as f16).
pub(crate) fn divide_bf16(pass: Pass<bf16>, divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_simd(divisor) {
        // SAFETY: as above.
        unsafe { simd::divide_bf16(pass, divisor) };
        return;
    }
    divide_bf16_portable(pass, divisor);
}

/// The definition of the f16 quotient, and the path for CPUs without the SIMD kernels.
fn divide_f16_portable(pass: Pass<f16>, divisor: f32) {
    pass.map(|x| f16::from_f32(x.to_f32() / divisor));
}

/// The definition of the bf16 quotient, and the path for CPUs without the SIMD kernels.
fn divide_bf16_portable(pass: Pass<bf16>, divisor: f32) {
    pass.map(|x| bf16::from_f32(x.to_f32() / divisor));
}

/// Sets every logit outside `band` to `-inf` (NaN stays): a compare and a select per logit,
/// stored whole (the compiler turns a select into masked stores, slow on AMD's AVX2 parts).
pub(crate) fn remove_outside<T: Logit>(row: &mut [T], band: Band) {
    #[cfg(target_arch = "x86_64")]
    if let Some(row) = T::as_f32_mut(row) {
        if crate::cpu::avx() {
            // SAFETY: the CPU has AVX.
            return unsafe { remove_outside_avx(row, band) };
        }
    }
    remove_outside_portable(row, band)
}

fn remove_outside_portable<T: Logit>(row: &mut [T], band: Band) {
    for x in row.iter_mut() {
        if band.removes(x.to_f32()) {
            *x = T::NEG_INFINITY;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn remove_outside_avx(row: &mut [f32], band: Band) {
    use std::arch::x86_64::*;
    let (lo, hi) = (_mm256_set1_ps(band.lo), _mm256_set1_ps(band.hi));
    let (infinity, sign) = (_mm256_set1_ps(f32::INFINITY), _mm256_set1_ps(-0.0));
    let mut blocks = row.chunks_exact_mut(8);
    for block in &mut blocks {
        let p = block.as_mut_ptr();
        // SAFETY: `block` holds 8 f32.
        let x = unsafe { _mm256_loadu_ps(p) };
        // `x < lo || x > hi`, false for NaN, as `Band::removes`.
        let outside = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi),
        );
        // `min(bound, x)` is `bound < x ? bound : x`: `-inf` outside, `x` (NaN too) inside. A
        // blend of `x` would be compiled into a masked store.
        let bound = _mm256_or_ps(infinity, _mm256_and_ps(outside, sign));
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(p, _mm256_min_ps(bound, x)) };
    }
    remove_outside_portable(blocks.into_remainder(), band);
}

/// Sets every element to `value`, 32 bytes a store where the CPU has AVX (generic code is
/// compiled for SSE2's 16-byte stores, which take twice as long over a row in cache).
pub(crate) fn fill<T: Copy>(row: &mut [T], value: T) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx() {
        // SAFETY: the CPU has AVX.
        unsafe { simd::fill(row, value) };
        return;
    }
    row.fill(value);
}

/// Sets every element to `value` with streaming (non-temporal) stores where AVX2 is present: a
/// forced row is written without being read, and streaming stores skip reading each cache line
/// before overwriting it, which halves the memory traffic of a fill that does not fit in cache.
pub(crate) fn fill_streaming<T: Copy>(row: &mut [T], value: T) {
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of::<T>() <= 32 && crate::cpu::avx2() {
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
    use std::sync::atomic::{AtomicU64, Ordering};

    #[target_feature(enable = "avx")]
    pub(super) fn fill<T: Copy>(row: &mut [T], value: T) {
        row.fill(value);
    }

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
        // Magnitudes compared as integers, where they order as the values do and a NaN is above
        // infinity: a NaN cannot erase a lane's bound (as it can a float min or max), and it
        // takes the division, which keeps its payload and sign (the fused path can flip them).
        let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
        let mut smallest = abs_mask;
        let mut largest = _mm256_setzero_si256();
        for &x in xs.iter() {
            let magnitude = _mm256_and_si256(_mm256_castps_si256(x), abs_mask);
            smallest = _mm256_min_epu32(smallest, magnitude);
            largest = _mm256_max_epu32(largest, magnitude);
        }
        let min = _mm256_set1_epi32(FAST_DIVIDEND_MIN.to_bits() as i32);
        let max = _mm256_set1_epi32(FAST_DIVIDEND_MAX.to_bits() as i32);
        let out_of_range = _mm256_or_si256(
            _mm256_cmpgt_epi32(min, smallest),
            _mm256_cmpgt_epi32(largest, max),
        );
        if _mm256_testz_si256(out_of_range, out_of_range) == 1 {
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

    // The 16-bit quotients. torch divides in f32 and rounds the quotient again to 16 bits, so the
    // exact result needs the f32 quotient only to decide the second rounding: a product by the
    // reciprocal, a few f32 ulps off, rounds to the same 16 bits unless the quotient lies next to
    // a rounding midpoint. Which inputs do is fixed by the divisor, so instead of checking every
    // element, a formula is proven for the divisor once, on a few thousand inputs that stand for
    // all of them:
    //
    // - Scaling by 2^k commutes with each step (the f32 product or fused multiply-add, and the
    //   rounding to 16 bits, ties included) while the values stay normal; past the top, both
    //   sides overflow to infinity together, because IEEE rounds as if the exponent were
    //   unbounded and then overflows. An input is its significand times 2^k, so a formula that
    //   gives the exact quotient of every significand (128 for bf16, 1024 for f16) at one scale
    //   where everything is normal gives it for every input large enough (`small_bound`).
    // - The inputs below that are few (the f16 subnormals and smallest normals, the bf16
    //   magnitudes near the bottom of the range): each is tried. Where one fails (quotients
    //   below 2^-126 round on a fixed grid, which scaling says nothing about; x / 2 with ties
    //   up is wrong there), a checked kernel sends every block with a result that small to the
    //   exact kernel instead, for two more operations per vector.
    // - Both sides are odd functions of the input; zeros, infinities and NaN come out of the
    //   formulas as they come out of the division (the tests go through all of them).
    //
    // The formulas, cheapest first; one of them passes for every divisor we tried (the tests
    // sweep the usual temperatures), the exact kernel covers any other:
    // - `x * r`, r = 1/divisor rounded: wrong only where a quotient is within about an f32 ulp of
    //   a 16-bit midpoint, which for a given divisor is usually no input at all.
    // - `x * hi + x * lo` with one rounding, hi + lo = 1/divisor to ~40 bits or more: the f32
    //   quotient itself for nearly every divisor. Needed where products by a decimal's
    //   reciprocal sit an ulp from a midpoint (0.6, 1.2, 0.3: x / 0.6 is 1.5429686 and
    //   x * (1 / 0.6) is 1.5429688 for x = 0.92578125).
    // - bf16 only: ties rounded up (one add) or to even (four more operations). Quotients that
    //   are exact bf16 midpoints are common (x / 0.8 = 1.25 x), and need the second.

    /// How a 16-bit row is divided, chosen per divisor by [`method`].
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(super) enum Method {
        /// `x * r` (`split`: `x * hi + x * lo`), rounded to 16 bits with ties up, or to even;
        /// `checked`: blocks with tiny results go to the exact kernel.
        Product {
            split: bool,
            even: bool,
            checked: bool,
        },
        /// The exact kernel: the f32 quotient (fused correction or division), then rounding.
        Exact,
    }

    impl Method {
        pub(super) const fn product(split: bool, even: bool, checked: bool) -> Self {
            Method::Product {
                split,
                even,
                checked,
            }
        }

        /// Cheapest first (operations per vector of 16 on the fast path: 10, +2 for a split,
        /// +4 for ties to even, +2 for the check).
        pub(super) const BF16: [Method; 8] = [
            Method::product(false, false, false),
            Method::product(true, false, false),
            Method::product(false, false, true),
            Method::product(false, true, false),
            Method::product(true, false, true),
            Method::product(false, true, true),
            Method::product(true, true, false),
            Method::product(true, true, true),
        ];
        /// F16C rounds ties to even: `even` is always set.
        pub(super) const F16: [Method; 4] = [
            Method::product(false, true, false),
            Method::product(true, true, false),
            Method::product(false, true, true),
            Method::product(true, true, true),
        ];

        fn code(self) -> u8 {
            match self {
                Method::Product {
                    split,
                    even,
                    checked,
                } => 1 | (split as u8) << 1 | (even as u8) << 2 | (checked as u8) << 3,
                Method::Exact => 16,
            }
        }

        fn from_code(code: u8) -> Method {
            match code {
                16 => Method::Exact,
                _ => Method::product(code & 2 != 0, code & 4 != 0, code & 8 != 0),
            }
        }
    }

    /// Methods already chosen, by divisor and type: a choice costs a few microseconds, and
    /// decoding divides by the same few temperatures row after row. An entry is the divisor's
    /// bits, the type and the method in one word, so a racing reader sees a whole entry.
    static CHOSEN: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(super) enum Half {
        F16 = 1,
        Bf16 = 2,
    }

    impl Half {
        /// Bits of `hi` in the split reciprocal. bf16 takes `x * lo + (x * hi)`: with 16 bits,
        /// `x * hi` (8 + 16) is exact while normal, `x * lo` is exact inside the fused
        /// multiply-add, and nothing underflows before the one rounding; hi + lo is 1/divisor to
        /// about 40 bits. f16 inputs have 11 bits, so f16 takes `x * hi + (x * lo)` with 24 (48
        /// in all): `x * lo` is rounded, but never below 2^-102.
        fn split_bits(self) -> u32 {
            match self {
                Half::F16 => 24,
                Half::Bf16 => 16,
            }
        }
    }

    /// [`choose`], remembered.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn method(divisor: f32, half: Half) -> Method {
        let key = (divisor.to_bits() as u64) << 32 | (half as u64) << 8;
        let hash = (divisor.to_bits() ^ half as u32).wrapping_mul(0x9e37_79b9) >> 26;
        let slot = &CHOSEN[hash as usize];
        let entry = slot.load(Ordering::Relaxed);
        if entry & !0xff == key && entry & 0xff != 0 {
            return Method::from_code(entry as u8);
        }
        let chosen = choose(divisor, half);
        slot.store(key | chosen.code() as u64, Ordering::Relaxed);
        chosen
    }

    /// The cheapest method proven exact for this divisor and type.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn choose(divisor: f32, half: Half) -> Method {
        let candidates: &[Method] = match half {
            Half::F16 => &Method::F16,
            Half::Bf16 => &Method::BF16,
        };
        candidates
            .iter()
            .copied()
            .find(|&m| verify(divisor, half, m))
            .unwrap_or(Method::Exact)
    }

    /// Whether `method` gives the exact quotient of every value of the type (see above).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn verify(divisor: f32, half: Half, method: Method) -> bool {
        match method {
            Method::Exact => true,
            Method::Product { split: true, .. }
                if split_reciprocal(divisor, half.split_bits()).is_none() =>
            {
                false
            }
            _ => match half {
                Half::F16 => verify_f16(divisor, method),
                Half::Bf16 => verify_bf16(divisor, method),
            },
        }
    }

    /// `1 / divisor` in two parts, `hi + lo`: `hi` has `bits` significant bits and is rounded
    /// toward zero, so that `lo` has its sign. An infinity then comes out of `x * hi + x * lo` as
    /// an infinity, not as the NaN of inf - inf. None when `hi` is the exact reciprocal (`lo`
    /// would be zero, and inf * 0 NaN; the plain product is exact then anyway).
    fn split_reciprocal(divisor: f32, bits: u32) -> Option<(f32, f32)> {
        let ulp = 1 << (24 - bits);
        let mut hi = f32::from_bits((1.0 / divisor).to_bits() & !(ulp - 1));
        let mut rest = (-hi).mul_add(divisor, 1.0);
        if rest < 0.0 {
            // `hi` is too large in magnitude: one of its ulps toward zero.
            hi = f32::from_bits(hi.to_bits() - ulp);
            rest = (-hi).mul_add(divisor, 1.0);
        }
        // Below 2^-13 and, rounded or not, far more precise than needed. Not negative, and zero
        // only if it is exactly.
        (rest != 0.0).then(|| (hi, rest / divisor))
    }

    /// Inputs at least this large (in magnitude) are covered by their significand: their
    /// products and quotients stay normal, as f32 for bf16 (from 2^-124 |divisor|) and as f16
    /// (from 2^-13 |divisor|; f32 never underflows there). The checked kernels leave smaller ones
    /// to the exact kernel: their quotients are below 2^-64 (bf16) or 2^-12 (f16), with margin.
    fn small_bound(divisor: f32, half: Half) -> f32 {
        let exponent = match half {
            Half::F16 => -13,
            Half::Bf16 => -124,
        };
        divisor.abs() * f32::from_bits(((127 + exponent) as u32) << 23)
    }

    /// Every significand of `bits` bits, times the divisor's power of two and sign: quotients fall
    /// in (0.5, 2), normal in any type.
    fn significands(divisor: f32, bits: u32) -> impl Iterator<Item = f32> {
        let scale = f32::from_bits(divisor.to_bits() & 0xff80_0000);
        (0..1u32 << bits).map(move |m| f32::from_bits(0x3f80_0000 | m << (23 - bits)) * scale)
    }

    /// Results below these (bits of 2^-64 and 2^-12; doubled, as the kernels compare them) take
    /// the exact block in the checked kernels.
    const TINY_BF16: i16 = 0x1f80 * 2;
    const TINY_F16: i16 = 0x0c00 * 2;

    /// The reciprocal as the product formulas take it.
    struct Reciprocal {
        /// `1 / divisor`, rounded to nearest.
        rounded: __m256,
        /// [`split_reciprocal`]; the rounded reciprocal and zero where there is none (unused then).
        hi: __m256,
        lo: __m256,
    }

    impl Reciprocal {
        #[inline]
        #[target_feature(enable = "avx2")]
        fn new(divisor: f32, half: Half) -> Self {
            let split = split_reciprocal(divisor, half.split_bits());
            let (hi, lo) = split.unwrap_or((1.0 / divisor, 0.0));
            Self {
                rounded: _mm256_set1_ps(1.0 / divisor),
                hi: _mm256_set1_ps(hi),
                lo: _mm256_set1_ps(lo),
            }
        }

        /// `x / divisor` for bf16 inputs by the plain or the split product (see
        /// [`Half::split_bits`]).
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        fn times_bf16<const SPLIT: bool>(&self, x: __m256) -> __m256 {
            if SPLIT {
                _mm256_fmadd_ps(x, self.lo, _mm256_mul_ps(x, self.hi))
            } else {
                _mm256_mul_ps(x, self.rounded)
            }
        }

        /// `x / divisor` for f16 inputs, likewise.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        fn times_f16<const SPLIT: bool>(&self, x: __m256) -> __m256 {
            if SPLIT {
                _mm256_fmadd_ps(x, self.hi, _mm256_mul_ps(x, self.lo))
            } else {
                _mm256_mul_ps(x, self.rounded)
            }
        }
    }

    /// Sixteen bf16 quotients from sixteen bf16 values by a product formula. The odd elements are
    /// the high halves of the 32-bit lanes, f32 once the even ones are masked off; the even ones
    /// are shifted up. Rounding adds half a bf16 ulp; the results are the high halves, the even
    /// ones shifted back down.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn bf16_product<const SPLIT: bool, const EVEN: bool>(v: __m256i, r: &Reciprocal) -> __m256i {
        let odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-0x1_0000)));
        let even = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
        let half_ulp = _mm256_set1_epi32(0x8000);
        let odd = _mm256_add_epi32(_mm256_castps_si256(r.times_bf16::<SPLIT>(odd)), half_ulp);
        let even = _mm256_add_epi32(_mm256_castps_si256(r.times_bf16::<SPLIT>(even)), half_ulp);
        let up = _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(even), odd);
        if !EVEN {
            return up;
        }
        // A tie (discarded half exactly 0x8000, now 0) was rounded up; to even means clearing the
        // lowest bit, which rounding up to an even value left clear already.
        let discarded = _mm256_blend_epi16::<0b1010_1010>(even, _mm256_slli_epi32::<16>(odd));
        let tie = _mm256_subs_epu16(_mm256_set1_epi16(1), discarded);
        _mm256_andnot_si256(tie, up)
    }

    /// Eight f16 quotients by a product formula (F16C rounds to nearest-even).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_product<const SPLIT: bool>(x: __m256, r: &Reciprocal) -> __m128i {
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r.times_f16::<SPLIT>(x))
    }

    /// Sixteen bf16 quotients by `method` (a product).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn bf16_product_by(method: Method, v: __m256i, r: &Reciprocal) -> __m256i {
        match method {
            Method::Product {
                split: false,
                even: false,
                ..
            } => bf16_product::<false, false>(v, r),
            Method::Product {
                split: true,
                even: false,
                ..
            } => bf16_product::<true, false>(v, r),
            Method::Product {
                split: false,
                even: true,
                ..
            } => bf16_product::<false, true>(v, r),
            _ => bf16_product::<true, true>(v, r),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn verify_bf16(divisor: f32, method: Method) -> bool {
        // The bf16 at or just above the bound (rounded up: its top half, plus one if anything
        // was cut off).
        let small = small_bound(divisor, Half::Bf16)
            .to_bits()
            .div_ceil(0x1_0000);
        let mut xs: Vec<bf16> = significands(divisor, 7).map(bf16::from_f32).collect();
        // Every positive magnitude up to it, unless the kernel checks for them.
        if !matches!(method, Method::Product { checked: true, .. }) {
            xs.extend((1..=small.min(0x7f7f) as u16).map(bf16::from_bits));
        }
        xs.resize(xs.len().div_ceil(16) * 16, bf16::ONE);
        let (d, r) = (
            _mm256_set1_ps(divisor),
            Reciprocal::new(divisor, Half::Bf16),
        );
        let zero = _mm256_setzero_si256();
        xs.chunks_exact(16).all(|x| {
            // SAFETY: the chunk holds sixteen values.
            let v = unsafe { _mm256_loadu_si256(x.as_ptr() as *const __m256i) };
            let lo = _mm256_div_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), d);
            let hi = _mm256_div_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), d);
            let exact = _mm256_packus_epi32(round_to_bf16(lo), round_to_bf16(hi));
            let fast = bf16_product_by(method, v, &r);
            _mm256_movemask_epi8(_mm256_cmpeq_epi8(fast, exact)) == -1
        })
    }

    /// The significands go in as f32, which F16C widening gives exactly: scaled, they need not be
    /// f16 values.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn verify_f16(divisor: f32, method: Method) -> bool {
        let Method::Product { split, checked, .. } = method else {
            return true;
        };
        let (d, r) = (_mm256_set1_ps(divisor), Reciprocal::new(divisor, Half::F16));
        let exact = |x: __m256| {
            let fast = if split {
                f16_product::<true>(x, &r)
            } else {
                f16_product::<false>(x, &r)
            };
            let exact = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_div_ps(x, d));
            _mm_movemask_epi8(_mm_cmpeq_epi8(fast, exact)) == 0xffff
        };
        let significands: Vec<f32> = significands(divisor, 10).collect();
        // SAFETY: each chunk holds eight values.
        if !significands
            .chunks_exact(8)
            .all(|x| exact(unsafe { _mm256_loadu_ps(x.as_ptr()) }))
        {
            return false;
        }
        if checked {
            return true;
        }
        // Every positive magnitude up to the first f16 at or above the bound.
        let bound = small_bound(divisor, Half::F16);
        let small = f16::from_f32(bound).to_bits().saturating_add(1).min(0x7bff);
        (0..=small / 8).all(|i| {
            let bits = _mm_add_epi16(
                _mm_set1_epi16((i * 8) as i16),
                _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7),
            );
            exact(_mm256_cvtph_ps(bits))
        })
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn divide_bf16(pass: Pass<bf16>, divisor: f32) {
        let method = if pass.len < BLOCK {
            Method::Exact
        } else {
            method(divisor, Half::Bf16)
        };
        divide_bf16_by(pass, divisor, method);
    }

    /// [`divide_bf16`] by a given method, which must be exact for the divisor.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn divide_bf16_by(pass: Pass<bf16>, divisor: f32, method: Method) {
        let Method::Product {
            split,
            even,
            checked,
        } = method
        else {
            let (d, r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
            let (whole, tail) = blocks(&pass);
            for block in 0..whole {
                let at = block * BLOCK;
                exact_bf16_block(pass.src.add(at), pass.dst.add(at), d, r);
            }
            for i in tail {
                *pass.dst.add(i) = bf16::from_f32((*pass.src.add(i)).to_f32() / divisor);
            }
            return;
        };
        let done = match (split, even, checked) {
            (false, false, false) => divide_bf16_as::<false, false, false>(&pass, divisor),
            (true, false, false) => divide_bf16_as::<true, false, false>(&pass, divisor),
            (false, true, false) => divide_bf16_as::<false, true, false>(&pass, divisor),
            (true, true, false) => divide_bf16_as::<true, true, false>(&pass, divisor),
            (false, false, true) => divide_bf16_as::<false, false, true>(&pass, divisor),
            (true, false, true) => divide_bf16_as::<true, false, true>(&pass, divisor),
            (false, true, true) => divide_bf16_as::<false, true, true>(&pass, divisor),
            (true, true, true) => divide_bf16_as::<true, true, true>(&pass, divisor),
        };
        for i in done..pass.len {
            *pass.dst.add(i) = bf16::from_f32((*pass.src.add(i)).to_f32() / divisor);
        }
    }

    /// The pass up to its last whole block (`CHECKED`) or vector by a product formula; returns
    /// how many elements it did.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn divide_bf16_as<const SPLIT: bool, const EVEN: bool, const CHECKED: bool>(
        pass: &Pass<bf16>,
        divisor: f32,
    ) -> usize {
        let r = Reciprocal::new(divisor, Half::Bf16);
        let (src, dst) = (pass.src as *const __m256i, pass.dst as *mut __m256i);
        if !CHECKED {
            let vectors = pass.len / 16;
            for i in 0..vectors {
                let v = _mm256_loadu_si256(src.add(i));
                _mm256_storeu_si256(dst.add(i), bf16_product::<SPLIT, EVEN>(v, &r));
            }
            return vectors * 16;
        }
        let (d, exact_r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
        let limit = _mm256_set1_epi16(TINY_BF16);
        let (whole, _) = blocks(pass);
        for block in 0..whole {
            let (src, dst) = (src.add(block * BLOCK / 16), dst.add(block * BLOCK / 16));
            let mut out = [_mm256_setzero_si256(); BLOCK / 16];
            // Each result doubled (sign dropped), the smallest per lane.
            let mut smallest = _mm256_set1_epi16(-1);
            for (i, o) in out.iter_mut().enumerate() {
                *o = bf16_product::<SPLIT, EVEN>(_mm256_loadu_si256(src.add(i)), &r);
                smallest = _mm256_min_epu16(smallest, _mm256_add_epi16(*o, *o));
            }
            // Results are stored only once the block is known good: the pass may be in place.
            let tiny = _mm256_subs_epu16(limit, smallest);
            if _mm256_testz_si256(tiny, tiny) == 1 {
                for (i, o) in out.iter().enumerate() {
                    _mm256_storeu_si256(dst.add(i), *o);
                }
            } else {
                exact_bf16_block(src as *const bf16, dst as *mut bf16, d, exact_r);
            }
        }
        whole * BLOCK
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn divide_f16(pass: Pass<f16>, divisor: f32) {
        let method = if pass.len < BLOCK {
            Method::Exact
        } else {
            method(divisor, Half::F16)
        };
        divide_f16_by(pass, divisor, method);
    }

    /// [`divide_f16`] by a given method, which must be exact for the divisor.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn divide_f16_by(pass: Pass<f16>, divisor: f32, method: Method) {
        let done = match method {
            Method::Exact => {
                let (d, r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
                let (whole, _) = blocks(&pass);
                for block in 0..whole {
                    let at = block * BLOCK;
                    exact_f16_block(pass.src.add(at), pass.dst.add(at), d, r);
                }
                whole * BLOCK
            }
            Method::Product { split, checked, .. } => match (split, checked) {
                (false, false) => divide_f16_as::<false, false>(&pass, divisor),
                (true, false) => divide_f16_as::<true, false>(&pass, divisor),
                (false, true) => divide_f16_as::<false, true>(&pass, divisor),
                (true, true) => divide_f16_as::<true, true>(&pass, divisor),
            },
        };
        for i in done..pass.len {
            *pass.dst.add(i) = f16::from_f32((*pass.src.add(i)).to_f32() / divisor);
        }
    }

    /// As [`divide_bf16_as`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn divide_f16_as<const SPLIT: bool, const CHECKED: bool>(
        pass: &Pass<f16>,
        divisor: f32,
    ) -> usize {
        let r = Reciprocal::new(divisor, Half::F16);
        let (src, dst) = (pass.src as *const __m128i, pass.dst as *mut __m128i);
        if !CHECKED {
            let vectors = pass.len / 8;
            for i in 0..vectors {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(src.add(i)));
                _mm_storeu_si128(dst.add(i), f16_product::<SPLIT>(x, &r));
            }
            return vectors * 8;
        }
        let (d, exact_r) = (_mm256_set1_ps(divisor), _mm256_set1_ps(1.0 / divisor));
        let limit = _mm_set1_epi16(TINY_F16);
        let (whole, _) = blocks(pass);
        for block in 0..whole {
            let (src, dst) = (src.add(block * BLOCK / 8), dst.add(block * BLOCK / 8));
            let mut out = [_mm_setzero_si128(); BLOCK / 8];
            let mut smallest = _mm_set1_epi16(-1);
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_product::<SPLIT>(_mm256_cvtph_ps(_mm_loadu_si128(src.add(i))), &r);
                smallest = _mm_min_epu16(smallest, _mm_add_epi16(*o, *o));
            }
            let tiny = _mm_subs_epu16(limit, smallest);
            if _mm_testz_si128(tiny, tiny) == 1 {
                for (i, o) in out.iter().enumerate() {
                    _mm_storeu_si128(dst.add(i), *o);
                }
            } else {
                exact_f16_block(src as *const f16, dst as *mut f16, d, exact_r);
            }
        }
        whole * BLOCK
    }

    /// One block of exact f16 quotients: widened, divided by [`divide_block`], narrowed.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exact_f16_block(src: *const f16, dst: *mut f16, d: __m256, r: __m256) {
        let (src, dst) = (src as *const __m128i, dst as *mut __m128i);
        let mut xs = [_mm256_setzero_ps(); VECTORS];
        for (i, x) in xs.iter_mut().enumerate() {
            *x = _mm256_cvtph_ps(_mm_loadu_si128(src.add(i)));
        }
        divide_block(&mut xs, d, r);
        for (i, x) in xs.iter().enumerate() {
            _mm_storeu_si128(dst.add(i), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*x));
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

    /// One block of exact bf16 quotients: widened, divided by [`divide_block`], narrowed.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exact_bf16_block(src: *const bf16, dst: *mut bf16, d: __m256, r: __m256) {
        let (src, dst) = (src as *const __m256i, dst as *mut __m256i);
        let zero = _mm256_setzero_si256();
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
            // NaN payloads and signs included.
            assert!(
                q.to_bits() == want.to_bits(),
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

    /// Every 16-bit pattern divided by `divisor` through `divide`, in place (and between two rows
    /// if `between`), against the definition.
    fn check_every_value<T>(divisor: f32, divide: impl Fn(Pass<T>, f32), what: &str, between: bool)
    where
        T: Copy + Into<f32> + HalfBits,
    {
        let all: Vec<T> = (0..=u16::MAX).map(T::from_bits).collect();
        let mut in_place = all.clone();
        divide(Pass::in_place(&mut in_place), divisor);
        let mut into = in_place.clone();
        if between {
            divide(Pass::between(&all, &mut into), divisor);
        }
        for (i, &x) in all.iter().enumerate() {
            let want = T::from_f32(x.into() / divisor);
            // NaN payloads and signs included.
            for (got, how) in [(in_place[i], "in place"), (into[i], "between")] {
                assert!(
                    got.to_bits() == want.to_bits(),
                    "{what} {:#06x} / {divisor} ({how}): got {:#06x}, want {:#06x}",
                    x.to_bits(),
                    got.to_bits(),
                    want.to_bits(),
                );
            }
        }
    }

    trait HalfBits: Sized {
        fn from_bits(bits: u16) -> Self;
        fn to_bits(self) -> u16;
        fn from_f32(x: f32) -> Self;
    }

    impl HalfBits for f16 {
        fn from_bits(bits: u16) -> Self {
            f16::from_bits(bits)
        }
        fn to_bits(self) -> u16 {
            f16::to_bits(self)
        }
        fn from_f32(x: f32) -> Self {
            f16::from_f32(x)
        }
    }

    impl HalfBits for bf16 {
        fn from_bits(bits: u16) -> Self {
            bf16::from_bits(bits)
        }
        fn to_bits(self) -> u16 {
            bf16::to_bits(self)
        }
        fn from_f32(x: f32) -> Self {
            bf16::from_f32(x)
        }
    }

    /// Temperatures people use and their reciprocals (the benchmark alternates t and 1/t), ones
    /// whose quotients sit on or next to 16-bit midpoints (0.8, 0.6, 1.2, 0.3, 1/0.7, 2), awkward
    /// ones, a negative one, and the ends of the SIMD range.
    const DIVISORS: [f32; 26] = [
        0.7,
        1.0 / 0.7,
        0.6,
        1.0 / 0.6,
        0.8,
        1.2,
        0.3,
        1.3,
        1.0 / 1.3,
        1.0 / 3.0,
        3.0,
        1.999_999,
        1e-3,
        3e4,
        0.13,
        0.03,
        0.09,
        0.36,
        0.5,
        2.0,
        1.0,
        7.0,
        -0.7,
        FAST_DIVISOR_MIN,
        FAST_DIVISOR_MAX,
        0.1,
    ];

    #[test]
    fn every_half_value_divides_like_f32_then_rounds() {
        // Outside the SIMD range too: a subnormal, a tiny and a huge divisor.
        for divisor in DIVISORS.into_iter().chain([1e-40, 1e-35, 3e35]) {
            check_every_value(divisor, divide_f16, "f16", true);
            check_every_value(divisor, divide_bf16, "bf16", true);
        }
    }

    #[test]
    fn the_portable_path_is_the_definition() {
        for divisor in [0.7f32, 1.0 / 0.7, 0.6, 1e-40] {
            check_every_value(divisor, divide_f16_portable, "f16", true);
            check_every_value(divisor, divide_bf16_portable, "bf16", true);
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod methods {
        use super::super::simd::{self, Half, Method};
        use super::*;

        /// Whether the CPU has the SIMD kernels' features (whatever `LOGITS_PROCESSING_CPU`
        /// says: these tests call the kernels directly).
        fn simd_present() -> bool {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }

        /// Every method that passes the proof for `divisor`, run on every value: the proof must
        /// not pass a method that is wrong anywhere (the checked ones included, whose check then
        /// has to catch what the proof left out).
        fn check_proven_methods(divisor: f32) {
            for (half, methods) in [
                (Half::Bf16, &simd::Method::BF16[..]),
                (Half::F16, &simd::Method::F16[..]),
            ] {
                for &method in methods.iter().chain([&Method::Exact]) {
                    // SAFETY: the CPU has the features (checked by the callers).
                    if !unsafe { simd::verify(divisor, half, method) } {
                        continue;
                    }
                    let what = format!("{half:?} by {method:?}");
                    match half {
                        Half::Bf16 => check_every_value(
                            divisor,
                            // SAFETY: as above.
                            |pass, d| unsafe { simd::divide_bf16_by(pass, d, method) },
                            &what,
                            false,
                        ),
                        Half::F16 => check_every_value(
                            divisor,
                            // SAFETY: as above.
                            |pass, d| unsafe { simd::divide_f16_by(pass, d, method) },
                            &what,
                            false,
                        ),
                    }
                }
            }
        }

        #[test]
        fn every_proven_method_is_exact_everywhere() {
            if !simd_present() {
                return;
            }
            for divisor in DIVISORS {
                check_proven_methods(divisor);
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(16))]
            #[test]
            fn every_proven_method_is_exact_for_random_divisors(
                exponent in -30i32..30,
                significand in 0u32..1 << 23,
                negative: bool,
            ) {
                prop_assume!(simd_present());
                let magnitude = f32::from_bits(((127 + exponent) as u32) << 23 | significand);
                check_proven_methods(if negative { -magnitude } else { magnitude });
            }
        }

        #[test]
        fn usual_temperatures_take_a_product() {
            if !simd_present() {
                return;
            }
            // SAFETY: the CPU has the features.
            let chosen = |t: f32, half| unsafe { simd::method(t, half) };
            let product = Method::product;
            // The cheapest, ties to even, and the split product, where each is needed.
            assert_eq!(chosen(0.7, Half::Bf16), product(false, false, false));
            assert_eq!(chosen(0.8, Half::Bf16), product(false, true, false));
            assert_eq!(chosen(1.0 / 0.7, Half::Bf16), product(false, true, false));
            assert_eq!(chosen(0.6, Half::Bf16), product(true, true, false));
            assert_eq!(chosen(0.7, Half::F16), product(false, true, false));
            assert_eq!(chosen(0.6, Half::F16), product(true, true, false));
            // No temperature from 0.01 to 4 in steps of 0.01, nor its reciprocal, is left to
            // the exact kernel.
            for t in (1..=400).map(|i| i as f32 / 100.0) {
                for t in [t, 1.0 / t] {
                    for half in [Half::Bf16, Half::F16] {
                        assert_ne!(chosen(t, half), Method::Exact, "{half:?} / {t}");
                    }
                }
            }
        }

        #[test]
        fn remembered_methods_match_fresh_ones() {
            if !simd_present() {
                return;
            }
            // Both types for each divisor, twice over: the second round reads the cache, and
            // collisions between types or divisors must not mix their entries up.
            for _ in 0..2 {
                for t in (1..=300).map(|i| i as f32 / 37.0) {
                    for half in [Half::Bf16, Half::F16] {
                        // SAFETY: the CPU has the features.
                        let (remembered, fresh) =
                            unsafe { (simd::method(t, half), simd::choose(t, half)) };
                        assert_eq!(remembered, fresh, "{half:?} / {t}");
                    }
                }
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
            // Any length, so whole vectors, whole blocks and tails all occur.
            let h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
            let b: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
            let want_h: Vec<f16> = h.iter().map(|x| f16::from_f32(x.to_f32() / divisor)).collect();
            let want_b: Vec<bf16> = b.iter().map(|x| bf16::from_f32(x.to_f32() / divisor)).collect();
            let (mut in_place_h, mut into_h) = (h.clone(), h.clone());
            let (mut in_place_b, mut into_b) = (b.clone(), b.clone());
            divide_f16(Pass::in_place(&mut in_place_h), divisor);
            divide_f16(Pass::between(&h, &mut into_h), divisor);
            divide_bf16(Pass::in_place(&mut in_place_b), divisor);
            divide_bf16(Pass::between(&b, &mut into_b), divisor);
            for got in [&in_place_h, &into_h] {
                for (got, want) in got.iter().zip(&want_h) {
                    prop_assert_eq!(got.to_bits(), want.to_bits());
                }
            }
            for got in [&in_place_b, &into_b] {
                for (got, want) in got.iter().zip(&want_b) {
                    prop_assert_eq!(got.to_bits(), want.to_bits());
                }
            }
        }
    }
}
