//! A packed bitmask applied to a row: each word of 32 tokens costs what it must. A word of banned
//! tokens (most of a grammar's mask) is a fill of `-inf`, the logits unread; a word of allowed
//! tokens is skipped; a mixed word is a branch-free select of each logit's bits (random bits would
//! mispredict a branch per token).

use crate::logit::Logit;

/// Sets each logit of `row` (whole groups of 32, one word of `words` each) whose bit is clear to
/// `-inf`; bit `j` of word `w` is logit `32 * w + j`.
pub(crate) fn mask_groups<T: Logit>(row: &mut [T], words: &[u32]) {
    // Checked always: the AVX2 path writes through raw pointers (one compare a chunk).
    assert_eq!(row.len(), words.len() * 32, "32 logits per mask word");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2; `row` holds 32 logits per word.
        return unsafe { avx2::mask_groups(row, words) };
    }
    mask_groups_portable(row, words)
}

fn mask_groups_portable<T: Logit>(row: &mut [T], words: &[u32]) {
    for (group, &word) in row.chunks_exact_mut(32).zip(words) {
        match word {
            u32::MAX => {}
            0 => group.fill(T::NEG_INFINITY),
            _ => select_portable(group, word),
        }
    }
}

/// `group[j]` kept where bit `j` of `allowed` is set, `-inf` elsewhere, on the bits of each logit
/// (an and, an and-not and an or per lane, which the compiler vectorizes).
fn select_portable<T: Logit>(group: &mut [T], allowed: u32) {
    macro_rules! select {
        ($bits:ty) => {{
            // SAFETY: T is a float type of exactly this size and alignment (checked by DTYPE).
            let lanes: &mut [$bits; 32] = unsafe { &mut *(group.as_mut_ptr() as *mut [$bits; 32]) };
            let neg_inf: $bits = unsafe { std::mem::transmute_copy(&T::NEG_INFINITY) };
            for (j, x) in lanes.iter_mut().enumerate() {
                let keep: $bits = if allowed & (1 << j) != 0 { !0 } else { 0 };
                *x = (*x & keep) | (neg_inf & !keep);
            }
        }};
    }
    debug_assert_eq!(group.len(), 32);
    match T::DTYPE.size() {
        4 => select!(u32),
        2 => select!(u16),
        _ => unreachable!("logits are 2 or 4 bytes"),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::logit::Logit;

    /// [`super::mask_groups`], the whole loop in one function so that nothing is called per word.
    /// Eight words (256 logits) are tested at once: a grammar's mask is mostly long runs of
    /// banned (or allowed) tokens.
    ///
    /// # Safety
    /// The CPU must have AVX2, and `row` hold `32 * words.len()` logits.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn mask_groups<T: Logit>(row: &mut [T], words: &[u32]) {
        let wide = T::DTYPE.size() == 4;
        // Bytes per group of 32 logits, in vectors of 32 bytes.
        let vectors = if wide { 4 } else { 2 };
        let neg_inf = {
            let bits: u32 = if wide {
                std::mem::transmute_copy(&T::NEG_INFINITY)
            } else {
                let half: u16 = std::mem::transmute_copy(&T::NEG_INFINITY);
                u32::from(half) * 0x1_0001
            };
            _mm256_set1_epi32(bits as i32)
        };
        // Lane `j` of vector `k` holds bit `8k + j` of the word (32-bit lanes), or bit `j` of the
        // word's half `k` (16-bit lanes, two to each 32-bit lane here).
        let lane_bits: [__m256i; 4] = std::array::from_fn(|k| {
            let lanes: [u32; 8] = std::array::from_fn(|j| match wide {
                true => 1 << (8 * k + j),
                false => 1 << (2 * j) | 1 << (2 * j + 17),
            });
            _mm256_loadu_si256(lanes.as_ptr() as *const __m256i)
        });
        let out = row.as_mut_ptr() as *mut __m256i;
        // One group of 32 logits, at vector `v` of the row.
        let group = |v: usize, word: u32| {
            // SAFETY (for the block): the group lies inside `row`, 32 logits per word.
            match word {
                u32::MAX => {}
                0 => {
                    for k in 0..vectors {
                        _mm256_storeu_si256(out.add(v + k), neg_inf);
                    }
                }
                _ => {
                    // A byte blend: LLVM turns a float blend of the loaded logits into a masked
                    // store of the `-inf`s, measured 3-4x slower on AMD's AVX2 parts.
                    for (k, &bit) in lane_bits[..vectors].iter().enumerate() {
                        let spread = if wide {
                            _mm256_set1_epi32(word as i32)
                        } else {
                            _mm256_set1_epi16((word >> (16 * k)) as i16)
                        };
                        let keep = if wide {
                            _mm256_cmpeq_epi32(_mm256_and_si256(spread, bit), bit)
                        } else {
                            _mm256_cmpeq_epi16(_mm256_and_si256(spread, bit), bit)
                        };
                        let x = _mm256_loadu_si256(out.add(v + k));
                        _mm256_storeu_si256(out.add(v + k), _mm256_blendv_epi8(neg_inf, x, keep));
                    }
                }
            }
        };
        let mut blocks = words.chunks_exact(8);
        let mut v = 0;
        for block in &mut blocks {
            let eight = _mm256_loadu_si256(block.as_ptr() as *const __m256i);
            if _mm256_testz_si256(eight, eight) == 1 {
                for k in 0..8 * vectors {
                    _mm256_storeu_si256(out.add(v + k), neg_inf);
                }
            } else if _mm256_testc_si256(eight, _mm256_set1_epi32(-1)) == 0 {
                for (i, &word) in block.iter().enumerate() {
                    group(v + i * vectors, word);
                }
            }
            v += 8 * vectors;
        }
        for &word in blocks.remainder() {
            group(v, word);
            v += vectors;
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use proptest::prelude::*;

    use super::*;

    /// The meaning: each logit whose bit is clear becomes `-inf`, the others keep their bits.
    fn masked<T: Logit>(row: &[T], words: &[u32]) -> Vec<u32> {
        row.iter()
            .enumerate()
            .map(|(i, &x)| match words[i / 32] >> (i % 32) & 1 {
                1 => bits(x),
                _ => bits(T::NEG_INFINITY),
            })
            .collect()
    }

    fn bits<T: Logit>(x: T) -> u32 {
        // SAFETY: T is 2 or 4 bytes.
        unsafe {
            match T::DTYPE.size() {
                4 => std::mem::transmute_copy::<T, u32>(&x),
                _ => u32::from(std::mem::transmute_copy::<T, u16>(&x)),
            }
        }
    }

    /// Words drawn from those a mask holds: all banned, all allowed, one or a few of either, and
    /// random, in runs long enough to fill the eight-word blocks.
    fn word_strategy() -> impl Strategy<Value = Vec<u32>> {
        let word = prop_oneof![
            Just(0u32),
            Just(u32::MAX),
            (0u32..32).prop_map(|j| 1 << j),
            (0u32..32).prop_map(|j| !(1 << j)),
            any::<u32>(),
        ];
        proptest::collection::vec((word, 1usize..12), 0..12).prop_map(|runs| {
            runs.into_iter()
                .flat_map(|(w, n)| std::iter::repeat_n(w, n))
                .collect()
        })
    }

    fn check<T: Logit>(words: &[u32], seed: u32) -> std::result::Result<(), TestCaseError> {
        // NaN, infinities and signed zeros among ordinary values: the select keeps their bits.
        let specials = [f32::NAN, f32::INFINITY, -0.0, 0.0, f32::NEG_INFINITY];
        let row: Vec<T> = (0..words.len() * 32)
            .map(|i| match (i as u32 ^ seed) % 23 {
                s @ 0..5 => T::from_f32(specials[s as usize]),
                s => T::from_f32(s as f32 * 0.37 - 4.0),
            })
            .collect();
        let expected = masked(&row, words);
        let result = |row: &[T]| row.iter().map(|&x| bits(x)).collect::<Vec<_>>();
        let mut portable = row.clone();
        mask_groups_portable(&mut portable, words);
        prop_assert_eq!(result(&portable), expected.clone());
        let mut dispatched = row.clone();
        mask_groups(&mut dispatched, words);
        prop_assert_eq!(result(&dispatched), expected.clone());
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut simd = row.clone();
            // SAFETY: the CPU has AVX2; 32 logits per word.
            unsafe { avx2::mask_groups(&mut simd, words) };
            prop_assert_eq!(result(&simd), expected);
        }
        Ok(())
    }

    proptest! {
        /// The portable path and the AVX2 one (where the CPU has it) both give the meaning, for
        /// each element type.
        #[test]
        fn both_paths_mask_exactly(words in word_strategy(), seed in any::<u32>()) {
            check::<f32>(&words, seed)?;
            check::<f16>(&words, seed)?;
            check::<bf16>(&words, seed)?;
        }
    }
}
