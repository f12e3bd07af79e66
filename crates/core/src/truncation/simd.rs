//! The mass passes of the truncation rules sixteen values at a time (AVX-512), for CPUs that have
//! it: the fixed-point softmax sums, sums by bucket of a key, and the compare passes that collect
//! the few values a rule's boundary is selected from. Every weight is the one
//! [`Softmax::weights`](super::Softmax::weights) gives (the same IEEE operations in the same
//! order on each lane; tests compare them), so a rule selects the same band whichever path ran.
//! With AVX2 and FMA but no AVX-512, each pass is `simd/avx2.rs`'s, eight values at a time, with
//! the same results; without either, the rules take the selections written in their own files
//! (`truncation/top_p.rs` and the others), which the tests use as the reference.

use std::arch::x86_64::*;

mod avx2;

use super::select::{each_found, SPAN};
use super::softmax::{ENTROPY_WEIGHTLESS, WEIGHTLESS};
use super::{
    order_key, Work, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2_E, EXP_POLY, EXP_SHIFTER, FIXED_BITS,
};

/// Whether the CPU runs these passes: AVX2 and FMA at least ([`crate::cpu`]).
#[inline(always)]
pub(crate) fn available() -> bool {
    crate::cpu::avx2_fma()
}

/// Whether the passes run sixteen values at a time (AVX-512 F and DQ; the weights' fused
/// multiply-adds are AVX-512's own); else eight at a time, with AVX2 and FMA.
#[inline(always)]
fn sixteen() -> bool {
    crate::cpu::avx512()
}

/// Buckets of [`bucket_masses`]: a key's range cut into this many intervals.
pub(crate) const BUCKETS: usize = 1024;

/// How a value's key is computed for [`bucket_masses`] and [`collect_bucket`]; buckets are
/// intervals of the key, numbered from the first the rule takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Key {
    /// The value itself, largest first (top-p): bucket `(max - x) * 32`.
    Value,
    /// Typical's score `|(x - max) + shift|`, smallest first: bucket `score * 16`. `-inf` is no
    /// candidate.
    Typical { shift: f32 },
}

/// The weights of sixteen values under the row's maximum.
struct Lanes {
    max: __m512,
}

impl Lanes {
    #[inline(always)]
    fn new(max: f32) -> Self {
        // SAFETY: only called from functions compiled for AVX-512.
        Lanes {
            max: unsafe { _mm512_set1_ps(max) },
        }
    }

    /// `d = x - max`.
    #[inline(always)]
    unsafe fn d(&self, x: __m512) -> __m512 {
        _mm512_sub_ps(x, self.max)
    }

    /// `exp(d) * 2^32`, unrounded, by [`super::exp`]'s operations: `y * 2^n` with `n` and the
    /// polynomial `y` as there, the scale by `2^(n + 32)` one exact `scalef` (the product of the
    /// scalar path's `q = y * 2^n`, normal for every `d >= -87`, and `2^32`). Lanes with `d`
    /// below -87, `-inf` or NaN give garbage: the callers mask them.
    #[inline(always)]
    unsafe fn scaled_exp(&self, d: __m512) -> __m512 {
        let splat = |v: f32| _mm512_set1_ps(v);
        let biased = _mm512_fmadd_ps(d, splat(EXP_LOG2_E), splat(EXP_SHIFTER));
        let n = _mm512_sub_ps(biased, splat(EXP_SHIFTER));
        // `n + 32`, exactly: both are small integers.
        let n_scaled = _mm512_sub_ps(biased, splat(EXP_SHIFTER - FIXED_BITS as f32));
        let r = _mm512_fmadd_ps(n, splat(-EXP_LN2_HI), d);
        let r = _mm512_fmadd_ps(n, splat(-EXP_LN2_LO), r);
        let mut p = splat(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, splat(c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), splat(1.0));
        _mm512_scalef_ps(y, n_scaled)
    }

    /// `fixed(exp(d))` of sixteen lanes as integral f32, 0 where `d < -23` (every such weight is
    /// 0: `WEIGHTLESS`) or NaN; and the mask of the other lanes.
    #[inline(always)]
    unsafe fn weights(&self, d: __m512) -> (__m512, __mmask16) {
        let live = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(d, _mm512_set1_ps(-WEIGHTLESS));
        (round(live, self.scaled_exp(d)), live)
    }

    /// The weights and the entropy weights `fixed(q * -d)` as integral f32, 0 where `d < -27`
    /// (an entropy weight there is 0: `ENTROPY_WEIGHTLESS`) or NaN; and the mask of the other
    /// lanes. `(q * 2^32) * -d` is `(q * -d) * 2^32`: scaling by `2^32` commutes with the
    /// rounding of a normal product.
    #[inline(always)]
    unsafe fn weights_and_entropy(&self, d: __m512) -> (__m512, __m512, __mmask16) {
        let live = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(d, _mm512_set1_ps(-ENTROPY_WEIGHTLESS));
        let scaled = self.scaled_exp(d);
        let minus_d = _mm512_sub_ps(_mm512_setzero_ps(), d);
        let entropy = round(live, _mm512_mul_ps(scaled, minus_d));
        (round(live, scaled), entropy, live)
    }
}

/// Rounds to the nearest integer, ties to even (`fixed`'s rounding); 0 outside `live`.
#[inline(always)]
unsafe fn round(live: __mmask16, v: __m512) -> __m512 {
    _mm512_maskz_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(live, v)
}

/// Sixteen integral f32 (below `2^33`) added into two f64 accumulators, exactly.
#[inline(always)]
unsafe fn add_exact(sums: &mut [__m512d; 2], t: __m512) {
    let low = _mm512_castps512_ps256(t);
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t)));
    sums[0] = _mm512_add_pd(sums[0], _mm512_cvtps_pd(low));
    sums[1] = _mm512_add_pd(sums[1], _mm512_cvtps_pd(high));
}

#[inline(always)]
unsafe fn total(sums: [__m512d; 2]) -> u64 {
    let mut lanes = [0f64; 8];
    _mm512_storeu_pd(lanes.as_mut_ptr(), _mm512_add_pd(sums[0], sums[1]));
    lanes.iter().map(|&s| s as u64).sum()
}

/// The values of `values` in vectors of sixteen, the last one filled with `-inf` (weight 0, and
/// no candidate of any rule), each with the mask of its real lanes. An iterator, not a closure,
/// so that the loop body is compiled in its caller, with AVX-512.
struct Vectors<'a> {
    blocks: std::slice::Chunks<'a, f32>,
}

impl<'a> Vectors<'a> {
    #[inline(always)]
    fn new(values: &'a [f32]) -> Self {
        Vectors {
            blocks: values.chunks(16),
        }
    }
}

impl Iterator for Vectors<'_> {
    type Item = (__m512, __mmask16);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let block = self.blocks.next()?;
        let real = ((1u32 << block.len()) - 1) as __mmask16;
        // SAFETY: only called from functions compiled for AVX-512; the masked load reads the
        // block's lanes alone.
        let x = unsafe {
            _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), real, block.as_ptr())
        };
        Some((x, real))
    }
}

/// The softmax sums over `values` under their maximum `max`: `W`, and `E` when `entropy` (else 0).
/// Rows shorter than `2^21` (the f64 lanes stay exact); longer ones are the caller's to split.
pub(crate) fn sums(values: &[f32], max: f32, entropy: bool) -> (u64, u64) {
    debug_assert!(values.len() < 1 << 21);
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe {
        match (sixteen(), entropy) {
            (true, true) => sums_with_entropy(values, max),
            (true, false) => (weight_sum(values, max), 0),
            (false, true) => avx2::sums_with_entropy(values, max),
            (false, false) => (super::softmax::weight_sum_avx2(values, max), 0),
        }
    }
}

#[target_feature(enable = "avx512f,avx512dq")]
fn weight_sum(values: &[f32], max: f32) -> u64 {
    let lanes = Lanes::new(max);
    let mut sums = [_mm512_setzero_pd(); 2];
    // SAFETY: AVX-512 F and DQ are enabled here.
    unsafe {
        for (x, _) in Vectors::new(values) {
            let (t, live) = lanes.weights(lanes.d(x));
            // Vectors far below the maximum weigh nothing (most of a trained model's row).
            if live != 0 {
                add_exact(&mut sums, t);
            }
        }
        total(sums)
    }
}

#[target_feature(enable = "avx512f,avx512dq")]
fn sums_with_entropy(values: &[f32], max: f32) -> (u64, u64) {
    let lanes = Lanes::new(max);
    let mut w = [_mm512_setzero_pd(); 2];
    let mut e = [_mm512_setzero_pd(); 2];
    // SAFETY: AVX-512 F and DQ are enabled here.
    unsafe {
        for (x, _) in Vectors::new(values) {
            let (t, te, live) = lanes.weights_and_entropy(lanes.d(x));
            if live != 0 {
                add_exact(&mut w, t);
                add_exact(&mut e, te);
            }
        }
        (total(w), total(e))
    }
}

/// The bucket of each lane's key (see [`Key`]); NaN, and `-inf` for typical, land in the last.
#[inline(always)]
unsafe fn buckets(key: Key, d: __m512) -> __m512i {
    let scaled = match key {
        Key::Value => _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), d), _mm512_set1_ps(32.0)),
        Key::Typical { shift } => _mm512_mul_ps(score(d, shift), _mm512_set1_ps(16.0)),
    };
    // Out of range (and NaN) converts to `u32::MAX`, then the last bucket.
    _mm512_min_epu32(
        _mm512_cvttps_epu32(scaled),
        _mm512_set1_epi32(BUCKETS as i32 - 1),
    )
}

/// Typical's score `|d + shift|` ([`super::Softmax::typical_score`]).
#[inline(always)]
unsafe fn score(d: __m512, shift: f32) -> __m512 {
    _mm512_abs_ps(_mm512_add_ps(d, _mm512_set1_ps(shift)))
}

/// Which lanes are candidates of the rule: not NaN; for typical, not `-inf` either.
#[inline(always)]
unsafe fn candidates(key: Key, x: __m512, real: __mmask16) -> __mmask16 {
    let not_nan = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x);
    let m = real & not_nan;
    match key {
        Key::Value => m,
        Key::Typical { .. } => {
            m & _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY))
        }
    }
}

/// Entries staged between the histogram's adds: each pass compresses a vector's in-window
/// buckets and weights into the next free entries, and they are added a span of this many
/// values at a time. (Adding them straight from the vector's lanes, the compiler extracts each
/// lane from the register, which cost several times the adds.)
const STAGED: usize = 256;

/// The weight of each bucket, in four copies filled entry by entry in turn: neighbouring values
/// often share a bucket, and one copy would chain each addition on the previous one's store.
/// Their strides are not a multiple of 4 KiB, so the same bucket of two copies does not alias in
/// the store buffer.
struct Histogram {
    copies: [[u64; BUCKETS + 16]; 4],
    index: [u32; STAGED],
    /// Weights as the passes compute them: integral f32 below `2^33`, exact.
    weight: [f32; STAGED],
    staged: usize,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            copies: [[0; BUCKETS + 16]; 4],
            index: [0; STAGED],
            weight: [0.0; STAGED],
            staged: 0,
        }
    }

    /// The next free entries: a span's pass, of at most [`STAGED`] values on an empty stage,
    /// stores a whole vector of entries there and counts those it took.
    #[inline(always)]
    fn next_free(&mut self) -> (*mut u32, *mut f32) {
        // SAFETY: at most `STAGED - 16` entries are staged before a vector of a span (checked
        // by the passes' `debug_assert`s), and a vector holds at most 16.
        unsafe {
            (
                self.index.as_mut_ptr().add(self.staged),
                self.weight.as_mut_ptr().add(self.staged),
            )
        }
    }

    fn add_staged(&mut self) {
        let n = self.staged;
        let (index, weight) = (&self.index[..n], &self.weight[..n]);
        // SAFETY: the weights are integral, finite and below 2^33 (the passes' `weights`), and
        // the buckets below BUCKETS (the passes' `buckets`): one conversion instruction and no
        // bounds check an entry.
        let add = |copy: &mut [u64; BUCKETS + 16], bucket: u32, weight: f32| unsafe {
            *copy.get_unchecked_mut(bucket as usize) += weight.to_int_unchecked::<i64>() as u64;
        };
        let [a, b, c, d] = &mut self.copies;
        let mut quads = index.chunks_exact(4).zip(weight.chunks_exact(4));
        for (i, w) in &mut quads {
            add(a, i[0], w[0]);
            add(b, i[1], w[1]);
            add(c, i[2], w[2]);
            add(d, i[3], w[3]);
        }
        let done = n / 4 * 4;
        for (&i, &w) in index[done..].iter().zip(&weight[done..]) {
            add(a, i, w);
        }
        self.staged = 0;
    }

    /// The weight of each bucket, into `masses`.
    fn masses(mut self, masses: &mut [u64; BUCKETS]) {
        self.add_staged();
        for (b, mass) in masses.iter_mut().enumerate() {
            *mass = self.copies.iter().map(|c| c[b]).sum();
        }
    }
}

/// Buckets `first..=last` of a key: the ones [`bucket_masses`] counts one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub first: u32,
    pub last: u32,
}

impl Window {
    pub(crate) const ALL: Window = Window {
        first: 0,
        last: BUCKETS as u32 - 1,
    };
}

/// The total `W` and, in `masses`, the weight of each bucket of `key` in `window`, with the
/// weight of every bucket before it in the bucket just before it (NaN adds nothing; the buckets
/// after the window are left 0). Only the values in the window are staged for the histogram's
/// scalar adds: the rest cost a few vector operations.
pub(crate) fn bucket_masses(
    values: &[f32],
    max: f32,
    key: Key,
    window: Window,
    masses: &mut [u64; BUCKETS],
) -> u64 {
    debug_assert!(values.len() < 1 << 21);
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe { bucket_masses_at(values, max, key, window, masses, sixteen()) }
}

/// [`bucket_masses`] sixteen values at a time where `wide` (the CPU must have AVX-512 F and DQ),
/// else eight (AVX2 and FMA).
unsafe fn bucket_masses_at(
    values: &[f32],
    max: f32,
    key: Key,
    window: Window,
    masses: &mut [u64; BUCKETS],
    wide: bool,
) -> u64 {
    let mut histogram = Histogram::new();
    let (mut sum, mut before) = (0, 0);
    for span in values.chunks(STAGED) {
        // SAFETY: the caller checked the features; the span holds at most `STAGED` values and
        // the stage is empty (added after each span).
        let (span_sum, span_before) = unsafe {
            if wide {
                masses_span_512(span, max, key, window, &mut histogram)
            } else {
                avx2::masses_span(span, max, key, window, &mut histogram)
            }
        };
        sum += span_sum;
        before += span_before;
        histogram.add_staged();
    }
    histogram.masses(masses);
    if window.first > 0 {
        masses[window.first as usize - 1] = before;
    }
    sum
}

/// One span of [`bucket_masses`] ([`STAGED`] values at most, so that their entries fit the
/// empty stage): its `W` and the mass of the buckets before the window, the window's entries
/// staged. A function of its own, without calls, so that its sums stay in registers.
#[target_feature(enable = "avx512f,avx512dq")]
#[inline(never)]
unsafe fn masses_span_512(
    span: &[f32],
    max: f32,
    key: Key,
    window: Window,
    histogram: &mut Histogram,
) -> (u64, u64) {
    debug_assert!(span.len() <= STAGED && histogram.staged == 0);
    let lanes = Lanes::new(max);
    let (first, last) = (
        _mm512_set1_epi32(window.first as i32),
        _mm512_set1_epi32(window.last as i32),
    );
    let mut sums = [_mm512_setzero_pd(); 2];
    let mut before = [_mm512_setzero_pd(); 2];
    for (x, _) in Vectors::new(span) {
        let d = lanes.d(x);
        let (t, heavy) = lanes.weights(d);
        if heavy == 0 {
            continue;
        }
        add_exact(&mut sums, t);
        let b = buckets(key, d);
        let earlier = _mm512_cmplt_epu32_mask(b, first);
        let low = _mm512_cvtps_pd(_mm512_castps512_ps256(t));
        let high = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(t),
        )));
        before[0] = _mm512_mask_add_pd(before[0], earlier as u8, before[0], low);
        before[1] = _mm512_mask_add_pd(before[1], (earlier >> 8) as u8, before[1], high);
        // Weightless lanes in the window are staged too (they add 0).
        let inside = !earlier & _mm512_cmple_epu32_mask(b, last);
        if inside == 0 {
            continue;
        }
        // A whole vector stored at the next free entry: at most 16 before it per vector.
        let (index, weight) = histogram.next_free();
        _mm512_storeu_si512(index.cast(), _mm512_maskz_compress_epi32(inside, b));
        _mm512_storeu_ps(weight, _mm512_maskz_compress_ps(inside, t));
        histogram.staged += inside.count_ones() as usize;
    }
    (total(sums), total(before))
}

/// The window of buckets where a sample of the row puts the bucket whose running mass reaches
/// `fraction` of the total (generously: a miss costs a second pass, never a wrong band);
/// [`Window::ALL`] for a short row. Every 1/1024th value, its weight and bucket.
pub(crate) fn sampled_window(
    values: &[f32],
    max: f32,
    key: Key,
    fraction: f32,
    work: &mut Work,
) -> Window {
    const SAMPLES: usize = 1024;
    // The sample's running mass is within this fraction of the row's with room to spare.
    const MARGIN: f64 = 0.05;
    if values.len() < 16 * SAMPLES {
        return Window::ALL;
    }
    let stride = values.len() / SAMPLES;
    work.clear();
    work.extend((0..SAMPLES).map(|i| {
        let x = values[i * stride];
        let scaled = match key {
            Key::Value => (0.0 - (x - max)) * 32.0,
            Key::Typical { shift } => ((x - max) + shift).abs() * 16.0,
        };
        let bucket = if scaled < (BUCKETS - 1) as f32 {
            scaled as u32
        } else {
            BUCKETS as u32 - 1
        };
        (bucket, 0, x)
    }));
    fill_weights(work, max);
    let mut by_bucket = [0u64; BUCKETS];
    for e in work.iter() {
        by_bucket[e.0 as usize] += e.1;
    }
    let total: u64 = by_bucket.iter().sum();
    if total == 0 {
        return Window::ALL;
    }
    let reaching = |share: f64| {
        let mut running = 0;
        by_bucket
            .iter()
            .position(|&m| {
                running += m;
                running as f64 >= share * total as f64
            })
            .unwrap_or(BUCKETS - 1) as u32
    };
    let fraction = fraction as f64;
    Window {
        first: reaching(fraction - MARGIN).saturating_sub(2),
        last: (reaching(fraction + MARGIN) + 2).min(BUCKETS as u32 - 1),
    }
}

/// The total `W` and the bucket of `key` where the running mass reaches `target(W)`, with the
/// mass before it (`None` when the row's mass never reaches it): counted over the
/// [`sampled_window`], and over the whole row when the bucket is outside it.
pub(crate) fn reaching_bucket(
    values: &[f32],
    max: f32,
    key: Key,
    fraction: f32,
    target: impl Fn(u64) -> f64,
    work: &mut Work,
) -> (u64, Option<(usize, u64)>) {
    let mut masses = [0u64; BUCKETS];
    let window = sampled_window(values, max, key, fraction, work);
    let sum = bucket_masses(values, max, key, window, &mut masses);
    match super::select::reaching_bucket(&masses, target(sum)) {
        Some((bucket, above))
            if bucket >= window.first as usize && bucket <= window.last as usize =>
        {
            return (sum, Some((bucket, above)));
        }
        None if window == Window::ALL => return (sum, None),
        _ => {}
    }
    let sum = bucket_masses(values, max, key, Window::ALL, &mut masses);
    (sum, super::select::reaching_bucket(&masses, target(sum)))
}

/// Collects into `work` the candidates of `key` in bucket `bucket` (key, weight left 0, value),
/// the key `order_key` of the value (top-p) or the bitwise-not of the score's (typical: smallest
/// score first, as the selection takes the largest key first). Returns the smallest and largest
/// value among the candidates of the buckets before `bucket`.
pub(crate) fn collect_bucket(
    values: &[f32],
    max: f32,
    key: Key,
    bucket: usize,
    work: &mut Work,
) -> (f32, f32) {
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe { collect_bucket_at(values, max, key, bucket as u32, work, sixteen()) }
}

/// [`collect_bucket`] sixteen values at a time where `wide` (the CPU must have AVX-512 F and
/// DQ), else eight (AVX2 and FMA).
unsafe fn collect_bucket_at(
    values: &[f32],
    max: f32,
    key: Key,
    bucket: u32,
    work: &mut Work,
    wide: bool,
) -> (f32, f32) {
    work.clear();
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    let mut inside = [0u32; SPAN / 16];
    for span in values.chunks(SPAN) {
        // SAFETY: the caller checked the features.
        let (span_lo, span_hi, any) = unsafe {
            if wide {
                bucket_span_512(span, max, key, bucket, &mut inside)
            } else {
                avx2::bucket_span(span, max, key, bucket, &mut inside)
            }
        };
        lo = lo.min(span_lo);
        hi = hi.max(span_hi);
        if any {
            each_found(&inside, span.len(), |i| {
                work.push(bucket_entry(key, max, span[i]))
            });
        }
    }
    (lo, hi)
}

/// One span of [`collect_bucket`]: the masks of the lanes in `bucket` into `inside`, and the
/// smallest and largest candidates before it. A function of its own, without calls, so that
/// its running vectors stay in registers.
#[target_feature(enable = "avx512f,avx512dq")]
#[inline(never)]
fn bucket_span_512(
    span: &[f32],
    max: f32,
    key: Key,
    bucket: u32,
    inside: &mut [u32; SPAN / 16],
) -> (f32, f32, bool) {
    let max_v = _mm512_set1_ps(max);
    let bucket_v = _mm512_set1_epi32(bucket as i32);
    let mut lo = _mm512_set1_ps(f32::INFINITY);
    let mut hi = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut any = 0;
    // SAFETY: AVX-512 F and DQ are enabled here.
    unsafe {
        for (at, (x, real)) in Vectors::new(span).enumerate() {
            let d = _mm512_sub_ps(x, max_v);
            let b = buckets(key, d);
            let ok = candidates(key, x, real);
            let before = ok & _mm512_cmplt_epu32_mask(b, bucket_v);
            lo = _mm512_mask_min_ps(lo, before, lo, x);
            hi = _mm512_mask_max_ps(hi, before, hi, x);
            inside[at] = (ok & _mm512_cmpeq_epu32_mask(b, bucket_v)) as u32;
            any |= inside[at];
        }
    }
    (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi), any != 0)
}

/// A candidate of `key`'s bucket as [`collect_bucket`] collects it.
#[inline(always)]
fn bucket_entry(key: Key, max: f32, v: f32) -> (u32, u64, f32) {
    let k = match key {
        Key::Value => order_key(v),
        Key::Typical { shift } => !order_key(((v - max) + shift).abs()),
    };
    (k, 0, v)
}

/// Sets each entry's weight to `fixed(exp(value - max))`.
pub(crate) fn fill_weights(work: &mut Work, max: f32) {
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe {
        if sixteen() {
            fill_weights_512(work, max)
        } else {
            avx2::fill_weights(work, max)
        }
    }
}

#[target_feature(enable = "avx512f,avx512dq")]
fn fill_weights_512(work: &mut Work, max: f32) {
    let lanes = Lanes::new(max);
    let mut x = [f32::NEG_INFINITY; 16];
    let mut t = [0f32; 16];
    for chunk in work.chunks_mut(16) {
        for (slot, e) in x.iter_mut().zip(chunk.iter()) {
            *slot = e.2;
        }
        // SAFETY: AVX-512 F and DQ are enabled here; the arrays hold 16 f32.
        unsafe {
            let (w, _) = lanes.weights(lanes.d(_mm512_loadu_ps(x.as_ptr())));
            _mm512_storeu_ps(t.as_mut_ptr(), w);
        }
        for (e, &w) in chunk.iter_mut().zip(&t) {
            e.1 = w as u64;
        }
    }
}

/// The smallest value at or above `hi` (`+inf` when none), and into `work` every value in
/// `lo..hi` (key and weight left 0): the compare pass of `select::lowest_reaching`. `None` once
/// more than `limit` values are in `lo..hi`.
pub(crate) fn smallest_above_and_between(
    values: &[f32],
    lo: f32,
    hi: f32,
    limit: usize,
    work: &mut Work,
) -> Option<f32> {
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe { smallest_above_and_between_at(values, lo, hi, limit, work, sixteen()) }
}

/// [`smallest_above_and_between`] sixteen values at a time where `wide` (the CPU must have
/// AVX-512 F and DQ), else eight (AVX2 and FMA).
unsafe fn smallest_above_and_between_at(
    values: &[f32],
    lo: f32,
    hi: f32,
    limit: usize,
    work: &mut Work,
    wide: bool,
) -> Option<f32> {
    work.clear();
    let mut smallest = f32::INFINITY;
    let mut between = [0u32; SPAN / 16];
    for span in values.chunks(SPAN) {
        // SAFETY: the caller checked the features.
        let (span_smallest, any) = unsafe {
            if wide {
                between_span_512(span, lo, hi, &mut between)
            } else {
                avx2::between_span(span, lo, hi, &mut between)
            }
        };
        smallest = smallest.min(span_smallest);
        if !any {
            continue;
        }
        each_found(&between, span.len(), |i| work.push((0, 0, span[i])));
        if work.len() > limit {
            return None;
        }
    }
    Some(smallest)
}

/// One span of [`smallest_above_and_between`]: the masks of the lanes in `lo..hi` into
/// `between`, and the smallest value at or above `hi`. A function of its own, without calls, so
/// that its running minimum stays in a register.
#[target_feature(enable = "avx512f,avx512dq")]
#[inline(never)]
fn between_span_512(span: &[f32], lo: f32, hi: f32, between: &mut [u32; SPAN / 16]) -> (f32, bool) {
    let (lo_v, hi_v) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    let mut smallest = _mm512_set1_ps(f32::INFINITY);
    let mut any = 0;
    for (at, (x, real)) in Vectors::new(span).enumerate() {
        let above = real & _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi_v);
        smallest = _mm512_mask_min_ps(smallest, above, smallest, x);
        between[at] = (real
            & _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, lo_v)
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, hi_v)) as u32;
        any |= between[at];
    }
    (_mm512_reduce_min_ps(smallest), any != 0)
}

/// Appends to `out` every value of `values` at or above `floor` (NaN never), in order: false,
/// stopping, once more than `limit` are appended. AVX-512 compresses each vector's lanes
/// (`vcompressps`) and stores them whole; AVX2 pushes them one by one.
pub(crate) fn values_at_least(
    values: &[f32],
    floor: f32,
    limit: usize,
    out: &mut Vec<f32>,
) -> bool {
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe {
        if sixteen() {
            values_at_least_512(values, floor, limit, out)
        } else {
            avx2::values_at_least(values, floor, limit, out)
        }
    }
}

#[target_feature(enable = "avx512f,avx512dq")]
fn values_at_least_512(values: &[f32], floor: f32, limit: usize, out: &mut Vec<f32>) -> bool {
    let start = out.len();
    // Room for `limit` values and one more vector: the check comes after each store.
    out.reserve(limit + 16);
    let floor_v = _mm512_set1_ps(floor);
    let mut end = start;
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    for block in blocks {
        // SAFETY: AVX-512 F is enabled here; `block` holds 16 f32, and `out` has room for the
        // 16 lanes past `end` while `end - start <= limit`.
        unsafe {
            let x = _mm512_loadu_ps(block.as_ptr());
            let at_least = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, floor_v);
            if at_least == 0 {
                continue;
            }
            // Compressed in the register, then a whole vector stored (a compressing store to
            // memory is microcoded on some CPUs, many times slower); the lanes past the count
            // are overwritten by the next store or cut by the length.
            let packed = _mm512_maskz_compress_ps(at_least, x);
            _mm512_storeu_ps(out.as_mut_ptr().add(end), packed);
            end += at_least.count_ones() as usize;
            out.set_len(end);
        }
        if end - start > limit {
            return false;
        }
    }
    out.extend(rest.iter().filter(|&&x| x >= floor));
    out.len() - start <= limit
}

/// Top-n-sigma's sums with its eight f64 partial sums as the eight lanes of one vector (lane
/// `j` adds the values at `j`, `j + 8`, ... in index order, as `top_n_sigma::lanes` does; a
/// non-finite value adds `0.0`): with `deviation_from` `None`, the number, maximum and sum of the
/// finite values; with `Some(mean)`, the sum of `(x - mean)^2` (in the count and maximum's
/// places, 0 and `-inf`).
pub(crate) fn finite_lane_sums(
    values: &[f32],
    deviation_from: Option<f64>,
) -> (usize, f32, [f64; 8]) {
    // SAFETY: the caller checked `available()`; `sixteen()` that the CPU has AVX-512.
    unsafe {
        if sixteen() {
            finite_lane_sums_512(values, deviation_from)
        } else {
            avx2::finite_lane_sums(values, deviation_from)
        }
    }
}

#[target_feature(enable = "avx512f,avx512dq")]
fn finite_lane_sums_512(values: &[f32], deviation_from: Option<f64>) -> (usize, f32, [f64; 8]) {
    let infinity = _mm512_set1_pd(f64::INFINITY);
    let mean = _mm512_set1_pd(deviation_from.unwrap_or(0.0));
    let mut sums = _mm512_setzero_pd();
    let mut max = _mm512_set1_pd(f64::NEG_INFINITY);
    let mut count = 0usize;
    for block in values.chunks(8) {
        let real = ((1u32 << block.len()) - 1) as __mmask8;
        // SAFETY: AVX-512 F and DQ are enabled here; the masked load reads the block's lanes.
        unsafe {
            let x = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(
                real as __mmask16,
                block.as_ptr(),
            )));
            let finite = real & _mm512_cmp_pd_mask::<_CMP_LT_OQ>(_mm512_abs_pd(x), infinity);
            let term = match deviation_from {
                None => {
                    count += finite.count_ones() as usize;
                    max = _mm512_mask_max_pd(max, finite, max, x);
                    x
                }
                Some(_) => {
                    let d = _mm512_sub_pd(x, mean);
                    _mm512_mul_pd(d, d)
                }
            };
            sums = _mm512_add_pd(sums, _mm512_maskz_mov_pd(finite, term));
        }
    }
    let mut lanes = [0f64; 8];
    // SAFETY: AVX-512 F is enabled here; `lanes` holds 8 f64.
    let max = unsafe {
        _mm512_storeu_pd(lanes.as_mut_ptr(), sums);
        _mm512_reduce_max_pd(max)
    };
    (count, max as f32, lanes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::truncation::{largest, Softmax};

    /// Each bucket's mass is the sum of the weights of the values collected from it, for both
    /// keys, on rows with NaN, infinities, ties and large offsets.
    #[test]
    fn bucket_masses_are_the_weights_of_the_buckets_values() {
        if !available() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        let mut next = crate::truncation::uniform(0x2545_f491_4f6c_dd1d);
        for (spread, offset) in [(1.0f32, 0.0f32), (8.0, -3.0), (0.05, 30_000.0), (40.0, 1e3)] {
            let row: Vec<f32> = (0..3001)
                .map(|i| match i % 53 {
                    7 => f32::NAN,
                    8 => f32::NEG_INFINITY,
                    9 => offset,
                    _ => ((next() - 0.5) * 4.0 * spread + offset).round() * 0.125 + offset * 0.875,
                })
                .collect();
            let max = largest(&row);
            let (sum, entropy_sum) = sums(&row, max, true);
            let shift = Softmax {
                max,
                sum,
                entropy_sum,
            }
            .shift();
            for key in [Key::Value, Key::Typical { shift }] {
                let mut masses = [0u64; BUCKETS];
                assert_eq!(bucket_masses(&row, max, key, Window::ALL, &mut masses), sum);
                let mut work = vec![];
                let mut collected = 0;
                for (bucket, &mass) in masses.iter().enumerate() {
                    if mass == 0 && bucket % 97 != 0 {
                        continue;
                    }
                    collect_bucket(&row, max, key, bucket, &mut work);
                    fill_weights(&mut work, max);
                    assert_eq!(
                        work.iter().map(|e| e.1).sum::<u64>(),
                        mass,
                        "{key:?} {bucket}"
                    );
                    collected += work.len();
                }
                assert!(collected > 0);
            }
        }
    }
}
