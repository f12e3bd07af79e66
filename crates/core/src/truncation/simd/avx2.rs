//! The passes of `simd.rs` eight values at a time, for CPUs with AVX2 and FMA but no AVX-512:
//! the same weights (the same IEEE operations in the same order on each lane), the same buckets
//! and the same candidates, so a rule selects the same band whichever of the three paths ran.
//! Where AVX-512 has an instruction AVX2 lacks, the equivalent exact steps stand in: the scale by
//! `2^(n + 32)` is a product with that power of two (exact: the result is normal for every live
//! lane), an unsigned conversion is a signed one whose overflow value lands in the last bucket,
//! and a masked load is a copy of the row's last values into a vector of `-inf`.

use std::arch::x86_64::*;

use super::super::select::SPAN;
use super::super::softmax::{ENTROPY_WEIGHTLESS, WEIGHTLESS};
use super::super::{Work, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2_E, EXP_POLY, EXP_SHIFTER, FIXED_BITS};
use super::{Histogram, Key, Window, BUCKETS, STAGED};

/// The weights of eight values under the row's maximum.
struct Lanes {
    max: __m256,
}

impl Lanes {
    #[inline(always)]
    fn new(max: f32) -> Self {
        // SAFETY: only called from functions compiled for AVX2.
        Lanes {
            max: unsafe { _mm256_set1_ps(max) },
        }
    }

    /// `d = x - max`.
    #[inline(always)]
    unsafe fn d(&self, x: __m256) -> __m256 {
        _mm256_sub_ps(x, self.max)
    }

    /// `exp(d) * 2^32`, unrounded, by [`super::super::exp`]'s operations: `y * 2^(n + 32)`, the
    /// power of two built from its exponent bits (exact, and normal, for every `d >= -87`).
    /// Lanes with `d` below -87, `-inf` or NaN give garbage: the callers mask them.
    #[inline(always)]
    unsafe fn scaled_exp(&self, d: __m256) -> __m256 {
        let splat = |v: f32| _mm256_set1_ps(v);
        let n = _mm256_sub_ps(
            _mm256_fmadd_ps(d, splat(EXP_LOG2_E), splat(EXP_SHIFTER)),
            splat(EXP_SHIFTER),
        );
        let r = _mm256_fmadd_ps(n, splat(-EXP_LN2_HI), d);
        let r = _mm256_fmadd_ps(n, splat(-EXP_LN2_LO), r);
        let mut p = splat(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, splat(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), splat(1.0));
        let bias = _mm256_set1_epi32(127 + FIXED_BITS as i32);
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), bias));
        _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
    }

    /// `fixed(exp(d))` of eight lanes as integral f32, 0 where `d < -23` or NaN; and the mask of
    /// the other lanes (all ones).
    #[inline(always)]
    unsafe fn weights(&self, d: __m256) -> (__m256, __m256) {
        let live = _mm256_cmp_ps::<_CMP_GE_OQ>(d, _mm256_set1_ps(-WEIGHTLESS));
        (round(live, self.scaled_exp(d)), live)
    }

    /// The weights and the entropy weights `fixed(q * -d)` as integral f32, 0 where `d < -27`
    /// or NaN (as `simd.rs`); and the mask of the other lanes.
    #[inline(always)]
    unsafe fn weights_and_entropy(&self, d: __m256) -> (__m256, __m256, __m256) {
        let live = _mm256_cmp_ps::<_CMP_GE_OQ>(d, _mm256_set1_ps(-ENTROPY_WEIGHTLESS));
        let scaled = self.scaled_exp(d);
        let minus_d = _mm256_sub_ps(_mm256_setzero_ps(), d);
        let entropy = round(live, _mm256_mul_ps(scaled, minus_d));
        (round(live, scaled), entropy, live)
    }
}

/// Rounds to the nearest integer, ties to even (`fixed`'s rounding); 0 outside `live`.
#[inline(always)]
unsafe fn round(live: __m256, v: __m256) -> __m256 {
    _mm256_and_ps(
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v),
        live,
    )
}

/// Whether any lane of a compare mask is set.
#[inline(always)]
unsafe fn any(mask: __m256) -> bool {
    _mm256_movemask_ps(mask) != 0
}

/// Eight integral f32 (below `2^33`) added into two f64 accumulators, exactly.
#[inline(always)]
unsafe fn add_exact(sums: &mut [__m256d; 2], t: __m256) {
    sums[0] = _mm256_add_pd(sums[0], _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
    sums[1] = _mm256_add_pd(sums[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(t)));
}

#[inline(always)]
unsafe fn total(sums: [__m256d; 2]) -> u64 {
    let mut lanes = [0f64; 4];
    _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(sums[0], sums[1]));
    lanes.iter().map(|&s| s as u64).sum()
}

/// The values of `values` in vectors of eight, the last one filled with `fill`, each with the
/// mask of its real lanes (bit `i` for lane `i`).
struct Vectors<'a> {
    blocks: std::slice::ChunksExact<'a, f32>,
    rest: &'a [f32],
    fill: f32,
}

impl<'a> Vectors<'a> {
    #[inline(always)]
    fn new(values: &'a [f32], fill: f32) -> Self {
        let blocks = values.chunks_exact(8);
        let rest = blocks.remainder();
        Vectors { blocks, rest, fill }
    }
}

impl Iterator for Vectors<'_> {
    type Item = (__m256, u32);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(block) = self.blocks.next() {
            // SAFETY: only called from functions compiled for AVX2; `block` holds 8 f32.
            return Some((unsafe { _mm256_loadu_ps(block.as_ptr()) }, 0xff));
        }
        if self.rest.is_empty() {
            return None;
        }
        let mut lanes = [self.fill; 8];
        lanes[..self.rest.len()].copy_from_slice(self.rest);
        let real = (1u32 << self.rest.len()) - 1;
        self.rest = &[];
        // SAFETY: as above; `lanes` holds 8 f32.
        Some((unsafe { _mm256_loadu_ps(lanes.as_ptr()) }, real))
    }
}

/// The softmax sums `W` and `E` over `values` under their maximum `max`.
#[target_feature(enable = "avx2,fma")]
pub(super) fn sums_with_entropy(values: &[f32], max: f32) -> (u64, u64) {
    let lanes = Lanes::new(max);
    let mut w = [_mm256_setzero_pd(); 2];
    let mut e = [_mm256_setzero_pd(); 2];
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    // SAFETY: AVX2 and FMA are enabled here; a block holds 16 f32.
    unsafe {
        // Two independent chains of `exp` a step.
        for block in blocks {
            let a = lanes.d(_mm256_loadu_ps(block.as_ptr()));
            let b = lanes.d(_mm256_loadu_ps(block.as_ptr().add(8)));
            let live = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(-ENTROPY_WEIGHTLESS)),
                _mm256_cmp_ps::<_CMP_GE_OQ>(b, _mm256_set1_ps(-ENTROPY_WEIGHTLESS)),
            );
            if !any(live) {
                continue;
            }
            let (ta, tea, _) = lanes.weights_and_entropy(a);
            let (tb, teb, _) = lanes.weights_and_entropy(b);
            add_exact(&mut w, ta);
            add_exact(&mut e, tea);
            add_exact(&mut w, tb);
            add_exact(&mut e, teb);
        }
        for (x, _) in Vectors::new(rest, f32::NEG_INFINITY) {
            let (t, te, live) = lanes.weights_and_entropy(lanes.d(x));
            if any(live) {
                add_exact(&mut w, t);
                add_exact(&mut e, te);
            }
        }
        (total(w), total(e))
    }
}

/// The bucket of each lane's key (see [`Key`]); NaN, and `-inf` for typical, land in the last.
#[inline(always)]
unsafe fn buckets(key: Key, d: __m256) -> __m256i {
    let scaled = match key {
        Key::Value => _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), d), _mm256_set1_ps(32.0)),
        Key::Typical { shift } => _mm256_mul_ps(score(d, shift), _mm256_set1_ps(16.0)),
    };
    // Out of range (and NaN) converts to `0x8000_0000`, above every bucket unsigned: the last.
    _mm256_min_epu32(
        _mm256_cvttps_epi32(scaled),
        _mm256_set1_epi32(BUCKETS as i32 - 1),
    )
}

/// Typical's score `|d + shift|`.
#[inline(always)]
unsafe fn score(d: __m256, shift: f32) -> __m256 {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    _mm256_and_ps(_mm256_add_ps(d, _mm256_set1_ps(shift)), magnitude)
}

/// Which lanes are candidates of the rule (bit `i` for lane `i`): real and not NaN; for
/// typical, not `-inf` either.
#[inline(always)]
unsafe fn candidates(key: Key, x: __m256, real: u32) -> u32 {
    let mut m = _mm256_cmp_ps::<_CMP_ORD_Q>(x, x);
    if let Key::Typical { .. } = key {
        m = _mm256_and_ps(
            m,
            _mm256_cmp_ps::<_CMP_NEQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY)),
        );
    }
    real & _mm256_movemask_ps(m) as u32
}

/// For each mask of eight lanes, the permutation that moves its set lanes to the front, in order.
const COMPRESS: [[u32; 8]; 256] = {
    let mut table = [[0u32; 8]; 256];
    let mut mask = 0;
    while mask < 256 {
        let (mut lane, mut to) = (0, 0);
        while lane < 8 {
            if mask >> lane & 1 == 1 {
                table[mask][to] = lane as u32;
                to += 1;
            }
            lane += 1;
        }
        mask += 1;
    }
    table
};

/// One span of `simd::bucket_masses`, eight values at a time, as `simd.rs`'s `masses_span_512`.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) fn masses_span(
    span: &[f32],
    max: f32,
    key: Key,
    window: Window,
    histogram: &mut Histogram,
) -> (u64, u64) {
    debug_assert!(span.len() <= STAGED && histogram.staged == 0);
    let lanes = Lanes::new(max);
    // Buckets are below 1024: the signed compares are the unsigned ones.
    let first = _mm256_set1_epi32(window.first as i32);
    let past_last = _mm256_set1_epi32(window.last as i32 + 1);
    let mut sums = [_mm256_setzero_pd(); 2];
    let mut before = [_mm256_setzero_pd(); 2];
    // SAFETY: AVX2 and FMA are enabled here; a vector's entries fit after the staged ones.
    unsafe {
        for (x, _) in Vectors::new(span, f32::NEG_INFINITY) {
            let d = lanes.d(x);
            let (t, heavy) = lanes.weights(d);
            if !any(heavy) {
                continue;
            }
            add_exact(&mut sums, t);
            let b = buckets(key, d);
            let earlier = _mm256_cmpgt_epi32(first, b);
            add_exact(&mut before, _mm256_and_ps(t, _mm256_castsi256_ps(earlier)));
            // Weightless lanes in the window are staged too (they add 0).
            let inside = _mm256_andnot_si256(earlier, _mm256_cmpgt_epi32(past_last, b));
            let inside = _mm256_movemask_ps(_mm256_castsi256_ps(inside)) as usize;
            if inside == 0 {
                continue;
            }
            let order = _mm256_loadu_si256(COMPRESS[inside].as_ptr().cast());
            let (index, weight) = histogram.next_free();
            _mm256_storeu_si256(index.cast(), _mm256_permutevar8x32_epi32(b, order));
            _mm256_storeu_ps(weight, _mm256_permutevar8x32_ps(t, order));
            histogram.staged += inside.count_ones() as usize;
        }
        (total(sums), total(before))
    }
}

/// One span of `simd::collect_bucket`, as `simd.rs`'s `bucket_span_512`.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) fn bucket_span(
    span: &[f32],
    max: f32,
    key: Key,
    bucket: u32,
    inside: &mut [u32; SPAN / 16],
) -> (f32, f32, bool) {
    let max_v = _mm256_set1_ps(max);
    let bucket_v = _mm256_set1_epi32(bucket as i32);
    let mut lo = _mm256_set1_ps(f32::INFINITY);
    let mut hi = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut any = 0;
    inside.fill(0);
    // SAFETY: AVX2 and FMA are enabled here.
    unsafe {
        for (at, (x, real)) in Vectors::new(span, f32::NEG_INFINITY).enumerate() {
            let d = _mm256_sub_ps(x, max_v);
            let b = buckets(key, d);
            let ok = candidates(key, x, real);
            // Buckets are below 1024: the signed compares are the unsigned ones.
            let before_v = _mm256_castsi256_ps(_mm256_cmpgt_epi32(bucket_v, b));
            let before = ok & _mm256_movemask_ps(before_v) as u32;
            if before != 0 {
                let mask = lane_mask(before);
                lo = _mm256_blendv_ps(lo, _mm256_min_ps(lo, x), mask);
                hi = _mm256_blendv_ps(hi, _mm256_max_ps(hi, x), mask);
            }
            let inside_v = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, bucket_v));
            let found = ok & _mm256_movemask_ps(inside_v) as u32;
            inside[at / 2] |= found << (at % 2 * 8);
            any |= found;
        }
        (reduce_min(lo), reduce_max(hi), any != 0)
    }
}

/// The vector mask of the lanes whose bits are set in `bits`.
#[inline(always)]
unsafe fn lane_mask(bits: u32) -> __m256 {
    let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let set = _mm256_and_si256(_mm256_set1_epi32(bits as i32), lane_bits);
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane_bits))
}

#[inline(always)]
unsafe fn reduce_min(v: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    lanes
        .into_iter()
        .fold(f32::INFINITY, |m, x| if x < m { x } else { m })
}

#[inline(always)]
unsafe fn reduce_max(v: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    lanes
        .into_iter()
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// Sets each entry's weight to `fixed(exp(value - max))`.
#[target_feature(enable = "avx2,fma")]
pub(super) fn fill_weights(work: &mut Work, max: f32) {
    let lanes = Lanes::new(max);
    let mut x = [f32::NEG_INFINITY; 8];
    let mut t = [0f32; 8];
    for chunk in work.chunks_mut(8) {
        for (slot, e) in x.iter_mut().zip(chunk.iter()) {
            *slot = e.2;
        }
        // SAFETY: AVX2 and FMA are enabled here; the arrays hold 8 f32.
        unsafe {
            let (w, _) = lanes.weights(lanes.d(_mm256_loadu_ps(x.as_ptr())));
            _mm256_storeu_ps(t.as_mut_ptr(), w);
        }
        for (e, &w) in chunk.iter_mut().zip(&t) {
            e.1 = w as u64;
        }
    }
}

/// One span of `simd::smallest_above_and_between`, as `simd.rs`'s `between_span_512`.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) fn between_span(
    span: &[f32],
    lo: f32,
    hi: f32,
    between: &mut [u32; SPAN / 16],
) -> (f32, bool) {
    let (lo_v, hi_v) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let infinity = _mm256_set1_ps(f32::INFINITY);
    // Two vectors of running minima: a block of sixteen values a step.
    let (mut smallest_a, mut smallest_b) = (infinity, infinity);
    let mut any = 0;
    let blocks = span.chunks_exact(16);
    let rest = blocks.remainder();
    for (at, block) in blocks.enumerate() {
        // SAFETY: AVX2 and FMA are enabled here; `block` holds 16 f32.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        // `min_ps(m, x)` is `m < x ? m : x`: the running minimum of the values at or above `hi`
        // (the others replaced by `+inf`; NaN is never at or above it).
        let above_a = _mm256_cmp_ps::<_CMP_GE_OQ>(a, hi_v);
        let above_b = _mm256_cmp_ps::<_CMP_GE_OQ>(b, hi_v);
        smallest_a = _mm256_min_ps(smallest_a, _mm256_blendv_ps(infinity, a, above_a));
        smallest_b = _mm256_min_ps(smallest_b, _mm256_blendv_ps(infinity, b, above_b));
        let inside = |x: __m256| {
            _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(x, lo_v),
                _mm256_cmp_ps::<_CMP_LT_OQ>(x, hi_v),
            )
        };
        between[at] =
            _mm256_movemask_ps(inside(a)) as u32 | (_mm256_movemask_ps(inside(b)) as u32) << 8;
        any |= between[at];
    }
    // SAFETY: AVX2 is enabled here.
    let mut smallest = unsafe { reduce_min(_mm256_min_ps(smallest_a, smallest_b)) };
    // The last values, fewer than sixteen, one by one (the same compares).
    if !rest.is_empty() {
        let mut mask = 0;
        for (j, &x) in rest.iter().enumerate() {
            if x >= hi {
                smallest = smallest.min(x);
            } else if x >= lo {
                mask |= 1 << j;
            }
        }
        between[span.len() / 16] = mask;
        any |= mask;
    }
    (smallest, any != 0)
}

/// `simd::values_at_least`'s pass: two compares and a bit mask a block of sixteen, then the
/// values at or above the floor pushed one by one.
#[target_feature(enable = "avx2,fma")]
pub(super) fn values_at_least(
    values: &[f32],
    floor: f32,
    limit: usize,
    out: &mut Vec<f32>,
) -> bool {
    let start = out.len();
    let floor_v = _mm256_set1_ps(floor);
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    for block in blocks {
        // SAFETY: AVX2 is enabled here; `block` holds 16 f32.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        let mut at_least = (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(a, floor_v))
            | _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(b, floor_v)) << 8)
            as u32;
        if at_least == 0 {
            continue;
        }
        while at_least != 0 {
            out.push(block[at_least.trailing_zeros() as usize]);
            at_least &= at_least - 1;
        }
        if out.len() - start > limit {
            return false;
        }
    }
    out.extend(rest.iter().filter(|&&x| x >= floor));
    out.len() - start <= limit
}

/// `simd::finite_lane_sums`'s pass: lane `j` of the first f64 vector adds the values at `j`,
/// `j + 8`, ..., lane `j` of the second those at `j + 4`, `j + 12`, ...
#[target_feature(enable = "avx2,fma")]
pub(super) fn finite_lane_sums(
    values: &[f32],
    deviation_from: Option<f64>,
) -> (usize, f32, [f64; 8]) {
    let infinity = _mm256_set1_pd(f64::INFINITY);
    let magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(i64::MAX));
    let mean = _mm256_set1_pd(deviation_from.unwrap_or(0.0));
    let mut sums = [_mm256_setzero_pd(); 2];
    let mut max = [_mm256_set1_pd(f64::NEG_INFINITY); 2];
    let mut count = 0usize;
    // SAFETY: AVX2 and FMA are enabled here.
    unsafe {
        // NaN fills a short block: not finite, so it adds `0.0` and counts nothing.
        for (x, _) in Vectors::new(values, f32::NAN) {
            let halves = [
                _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
            ];
            for (h, x) in halves.into_iter().enumerate() {
                let finite = _mm256_cmp_pd::<_CMP_LT_OQ>(_mm256_and_pd(x, magnitude), infinity);
                let term = match deviation_from {
                    None => {
                        count += (_mm256_movemask_pd(finite) as u32).count_ones() as usize;
                        // `max_pd(m, x)` is `m > x ? m : x`: only finite lanes take part.
                        let candidate =
                            _mm256_blendv_pd(_mm256_set1_pd(f64::NEG_INFINITY), x, finite);
                        max[h] = _mm256_max_pd(max[h], candidate);
                        x
                    }
                    Some(_) => {
                        let d = _mm256_sub_pd(x, mean);
                        _mm256_mul_pd(d, d)
                    }
                };
                sums[h] = _mm256_add_pd(sums[h], _mm256_and_pd(term, finite));
            }
        }
        let mut lanes = [0f64; 8];
        _mm256_storeu_pd(lanes.as_mut_ptr(), sums[0]);
        _mm256_storeu_pd(lanes.as_mut_ptr().add(4), sums[1]);
        let mut maxima = [0f64; 8];
        _mm256_storeu_pd(maxima.as_mut_ptr(), max[0]);
        _mm256_storeu_pd(maxima.as_mut_ptr().add(4), max[1]);
        let max = maxima
            .into_iter()
            .fold(f64::NEG_INFINITY, |m, x| if x > m { x } else { m });
        (count, max as f32, lanes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::{largest, order_key, Softmax};
    use super::*;

    /// Whether the CPU has this module's features (whatever `LOGITS_PROCESSING_CPU` says: the
    /// tests call the passes directly).
    fn present() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    /// Whether the AVX-512 passes can run too, to be compared with these.
    fn sixteen_present() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
    }

    /// Rows of every length up to 70 and a few long ones, with NaN, `-inf` (and `+inf` where
    /// `infinite`), ties, signed zeros and values far below the maximum, at several offsets.
    fn rows(infinite: bool) -> Vec<Vec<f32>> {
        let mut next = crate::truncation::uniform(0x9e37_79b9_7f4a_7c15);
        let mut rows = vec![];
        let lengths = (0..70).chain([1000, 3001, 4099]);
        for (n, len) in lengths.enumerate() {
            let (spread, offset) = [(1.0f32, 0.0f32), (8.0, -3.0), (0.05, 3e4), (40.0, 1e3)][n % 4];
            let row = (0..len)
                .map(|i| match (i * 7 + n) % 41 {
                    3 => f32::NAN,
                    5 => f32::NEG_INFINITY,
                    7 if infinite => f32::INFINITY,
                    9 => offset,
                    11 => 0.0,
                    13 => -0.0,
                    15 => offset - 30.0 * spread,
                    // Ties: values on a grid of 1/8.
                    _ => ((next() - 0.5) * 32.0 * spread).round() * 0.125 + offset,
                })
                .collect();
            rows.push(row);
        }
        rows
    }

    fn bucket(key: Key, x: f32, max: f32) -> usize {
        let scaled = match key {
            Key::Value => -(x - max) * 32.0,
            Key::Typical { shift } => ((x - max) + shift).abs() * 16.0,
        };
        if scaled.is_nan() || scaled >= (BUCKETS - 1) as f32 {
            BUCKETS - 1
        } else {
            scaled as usize
        }
    }

    fn is_candidate(key: Key, x: f32) -> bool {
        !x.is_nan() && (matches!(key, Key::Value) || x != f32::NEG_INFINITY)
    }

    #[test]
    fn the_sums_are_the_weights_one_by_one() {
        if !present() {
            eprintln!("skipped: no AVX2 and FMA on this CPU");
            return;
        }
        for row in rows(false) {
            let max = largest(&row);
            if !max.is_finite() {
                continue;
            }
            let softmax = Softmax {
                max,
                sum: 0,
                entropy_sum: 0,
            };
            let expected = row.iter().fold((0, 0), |(w, e), &x| {
                let (a, b) = softmax.weights(x);
                (w + a, e + b)
            });
            // SAFETY: the CPU has AVX2 and FMA (checked above); AVX-512 where checked.
            unsafe {
                assert_eq!(sums_with_entropy(&row, max), expected, "{row:?}");
                if sixteen_present() {
                    assert_eq!(super::super::sums_with_entropy(&row, max), expected);
                }
                let mut work: Work = row.iter().map(|&x| (0, 0, x)).collect();
                fill_weights(&mut work, max);
                for e in &work {
                    assert_eq!(e.1, softmax.weights(e.2).0, "{}", e.2);
                }
            }
        }
    }

    #[test]
    fn buckets_and_their_candidates_are_the_scalar_ones() {
        if !present() {
            eprintln!("skipped: no AVX2 and FMA on this CPU");
            return;
        }
        for row in rows(false) {
            let max = largest(&row);
            if !max.is_finite() {
                continue;
            }
            let softmax = Softmax {
                max,
                sum: 0,
                entropy_sum: 0,
            };
            // SAFETY: the CPU has AVX2 and FMA (checked above); AVX-512 where checked.
            unsafe {
                let (sum, entropy_sum) = sums_with_entropy(&row, max);
                let shift = Softmax {
                    max,
                    sum,
                    entropy_sum,
                }
                .shift();
                for key in [Key::Value, Key::Typical { shift }] {
                    let mut expected = [0u64; BUCKETS];
                    for &x in &row {
                        expected[bucket(key, x, max)] += softmax.weights(x).0;
                    }
                    for (first, last) in [(0, BUCKETS - 1), (0, 5), (3, 40), (100, BUCKETS - 1)] {
                        let window = Window {
                            first: first as u32,
                            last: last as u32,
                        };
                        // The window's buckets as they are, every earlier bucket's mass in the
                        // one before it, nothing after it.
                        let mut want = [0u64; BUCKETS];
                        want[first..=last].copy_from_slice(&expected[first..=last]);
                        if first > 0 {
                            want[first - 1] = expected[..first].iter().sum();
                        }
                        let mut masses = [0u64; BUCKETS];
                        let narrow_sum = super::super::bucket_masses_at(
                            &row,
                            max,
                            key,
                            window,
                            &mut masses,
                            false,
                        );
                        assert_eq!(narrow_sum, sum);
                        assert_eq!(masses, want, "{key:?} {window:?}");
                        if sixteen_present() {
                            let mut wide = [0u64; BUCKETS];
                            let wide_sum = super::super::bucket_masses_at(
                                &row, max, key, window, &mut wide, true,
                            );
                            assert_eq!((wide_sum, wide), (sum, want), "{key:?} {window:?}");
                        }
                    }
                    let mut work = vec![];
                    for b in (0..BUCKETS).filter(|&b| expected[b] > 0 || b % 97 == 0) {
                        work.clear();
                        let (lo, hi) = super::super::collect_bucket_at(
                            &row, max, key, b as u32, &mut work, false,
                        );
                        let inside: Vec<f32> = row
                            .iter()
                            .copied()
                            .filter(|&x| is_candidate(key, x) && bucket(key, x, max) == b)
                            .collect();
                        let got: Vec<f32> = work.iter().map(|e| e.2).collect();
                        assert_eq!(
                            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            inside.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                        );
                        for e in &work {
                            let k = match key {
                                Key::Value => order_key(e.2),
                                Key::Typical { shift } => {
                                    !order_key(softmax.typical_score(e.2, shift))
                                }
                            };
                            assert_eq!(e.0, k);
                        }
                        let before = row
                            .iter()
                            .copied()
                            .filter(|&x| is_candidate(key, x) && bucket(key, x, max) < b);
                        let (elo, ehi) = before.fold((f32::INFINITY, f32::NEG_INFINITY), |m, x| {
                            (m.0.min(x), m.1.max(x))
                        });
                        // Equal as floats: which zero a tie of `0.0` and `-0.0` gives is open.
                        assert_eq!((lo, hi), (elo, ehi), "{key:?} {b}");
                        if sixteen_present() {
                            let mut wide = vec![];
                            let bounds = super::super::collect_bucket_at(
                                &row, max, key, b as u32, &mut wide, true,
                            );
                            assert_eq!(bounds, (lo, hi));
                            assert_eq!(wide, work);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_compare_pass_is_the_scalar_one() {
        if !present() {
            eprintln!("skipped: no AVX2 and FMA on this CPU");
            return;
        }
        for row in rows(true) {
            let max = largest(&row);
            for (lo, hi) in [
                (max - 4.0, f32::INFINITY),
                (max - 0.5, max),
                (f32::MIN, f32::INFINITY),
                (0.0, 0.0),
                (-1.0, 1.0),
            ] {
                let mut expected = vec![];
                let mut smallest = f32::INFINITY;
                for &x in &row {
                    if x >= hi {
                        smallest = smallest.min(x);
                    } else if x >= lo {
                        expected.push(x.to_bits());
                    }
                }
                let mut work = vec![];
                // SAFETY: the CPU has AVX2 and FMA (checked above); AVX-512 where checked.
                unsafe {
                    let got = super::super::smallest_above_and_between_at(
                        &row,
                        lo,
                        hi,
                        usize::MAX,
                        &mut work,
                        false,
                    );
                    assert_eq!(got, Some(smallest), "{lo} {hi}");
                    let values: Vec<u32> = work.iter().map(|e| e.2.to_bits()).collect();
                    assert_eq!(values, expected);
                    if expected.len() > 2 {
                        work.clear();
                        let limit = expected.len() - 1;
                        let none = super::super::smallest_above_and_between_at(
                            &row, lo, hi, limit, &mut work, false,
                        );
                        assert_eq!(none, None);
                    }
                    if sixteen_present() {
                        work.clear();
                        let wide = super::super::smallest_above_and_between_at(
                            &row,
                            lo,
                            hi,
                            usize::MAX,
                            &mut work,
                            true,
                        );
                        assert_eq!(wide, Some(smallest));
                    }
                }
            }
        }
    }

    #[test]
    fn the_finite_lane_sums_are_the_scalar_ones() {
        if !present() {
            eprintln!("skipped: no AVX2 and FMA on this CPU");
            return;
        }
        for row in rows(true) {
            for mean in [None, Some(0.5f64), Some(-3e4)] {
                let mut sums = [0f64; 8];
                let mut count = 0;
                let mut max = f32::NEG_INFINITY;
                for (i, &x) in row.iter().enumerate() {
                    if x.is_finite() {
                        sums[i % 8] += match mean {
                            None => x as f64,
                            Some(m) => (x as f64 - m) * (x as f64 - m),
                        };
                        count += 1;
                        max = max.max(x);
                    }
                }
                let expected = match mean {
                    None => (count, max),
                    Some(_) => (0, f32::NEG_INFINITY),
                };
                // SAFETY: the CPU has AVX2 and FMA (checked above); AVX-512 where checked.
                unsafe {
                    let (c, m, got) = finite_lane_sums(&row, mean);
                    assert_eq!((c, m), expected);
                    let bits = |s: [f64; 8]| s.map(f64::to_bits);
                    assert_eq!(bits(got), bits(sums), "{mean:?} {}", row.len());
                    if sixteen_present() {
                        let (c, m, wide) = super::super::finite_lane_sums_512(&row, mean);
                        assert_eq!((c, m), expected);
                        assert_eq!(bits(wide), bits(sums));
                    }
                }
            }
        }
    }
}
