//! SynthID Text's hashing, sampling table and g-values, as transformers'
//! `SynthIDTextWatermarkLogitsProcessor` computes them: the `synthid_watermark` kind decides with
//! them, and the row rule (`whole/synthid.rs`) reads a token's g-values through them.
//!
//! - `accumulate_hash`: an int64 linear congruential step per datum, `h = (h + x) * M + 1`
//!   (wrapping, `M = 6364136223846793005`), from `h = 1`;
//! - a token's key at depth `d`: the context's hash, then the token, then `keys[d]`;
//! - its g-value: `table[key mod size]` (floor modulo, torch's `%`: never negative), the table
//!   `torch.randint(0, 2, (size,), generator=torch.Generator().manual_seed(seed))`, which on the
//!   CPU is `mt19937(seed mod 2^32)`'s 32-bit outputs mod 2.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// The linear congruential generator's multiplier (newlib / musl), transformers' default.
pub const MULTIPLIER: i64 = 6364136223846793005;

/// The most keys (the tournament's depth): each step costs `vocab * depth` hashes.
pub const MAX_DEPTH: usize = 64;
/// transformers' own limit (`SynthIDTextWatermarkingConfig.validate`).
pub const MAX_TABLE_SIZE: u64 = 1 << 24;
/// The longest n-gram: the context is its `ngram_len - 1` last generated ids.
pub const MAX_NGRAM_LEN: usize = 256;
/// The most context hashes remembered (each step looks among them for its own).
pub const MAX_CONTEXT_HISTORY: usize = 1 << 16;

/// `accumulate_hash` of one datum.
#[inline(always)]
pub fn accumulate(hash: i64, x: i64) -> i64 {
    hash.wrapping_add(x)
        .wrapping_mul(MULTIPLIER)
        .wrapping_add(1)
}

/// The hash of a context (`accumulate_hash` from 1 over its ids).
pub fn context_hash(context: impl IntoIterator<Item = i64>) -> i64 {
    context.into_iter().fold(1, accumulate)
}

/// The Mersenne twister torch's CPU generator is (`at::mt19937`), seeded as `manual_seed` seeds
/// it: with the seed's low 32 bits.
struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for i in 0..624 {
                let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
                let odd = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.state[i] = self.state[(i + 397) % 624] ^ (y >> 1) ^ odd;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// The sampling table: `size` bits, bit `i` the table's entry `i`.
#[derive(Debug, PartialEq, Eq)]
pub struct SamplingTable {
    size: u64,
    words: Vec<u64>,
}

// `key mod size` is a mask for a power of two (the default, 2^16), a division otherwise.

impl SamplingTable {
    /// `torch.randint(0, 2, (size,), generator=torch.Generator().manual_seed(seed))`.
    pub fn new(size: u64, seed: u64) -> Self {
        let mut mt = Mt19937::new(seed);
        let mut words = vec![0u64; size.div_ceil(64) as usize];
        for i in 0..size as usize {
            words[i / 64] |= u64::from(mt.next_u32() & 1) << (i % 64);
        }
        Self { size, words }
    }

    /// The table of `(size, seed)`, shared with every request that asked for it recently (the
    /// largest takes 2^24 draws, about 50 ms, to build).
    pub fn shared(size: u64, seed: u64) -> Arc<Self> {
        static RECENT: Mutex<Vec<(u64, u32, Arc<SamplingTable>)>> = Mutex::new(Vec::new());
        let key = (size, seed as u32);
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = recent.iter().position(|&(s, d, _)| (s, d) == key) {
            let entry = recent.remove(i);
            let table = entry.2.clone();
            recent.push(entry);
            return table;
        }
        let table = Arc::new(Self::new(size, seed));
        if recent.len() == 8 {
            recent.remove(0);
        }
        recent.push((key.0, key.1, table.clone()));
        table
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The entry `key` maps to: `table[key mod size]`, floor modulo as torch's `%`.
    #[inline(always)]
    pub fn at(&self, key: i64) -> bool {
        let i = if self.size.is_power_of_two() {
            (key as u64 & (self.size - 1)) as usize
        } else {
            key.rem_euclid(self.size as i64) as usize
        };
        self.words[i / 64] >> (i % 64) & 1 == 1
    }
}

/// What every step of one watermark reads: its keys and sampling table.
#[derive(Debug, PartialEq)]
pub struct Watermark {
    keys: Vec<i64>,
    table: Arc<SamplingTable>,
}

impl Watermark {
    /// Checks the sizes against the bounds above (an [`Error::InvalidArgument`] naming the field).
    pub fn new(keys: &[i64], table_size: u64, seed: u64) -> Result<Self> {
        if keys.is_empty() || keys.len() > MAX_DEPTH {
            return Err(Error::argument(
                "keys",
                format!("needs 1 to {MAX_DEPTH} keys, got {}", keys.len()),
            ));
        }
        if table_size == 0 || table_size > MAX_TABLE_SIZE {
            return Err(Error::argument(
                "sampling_table_size",
                format!("must be 1 to 2**24 (transformers' limit), got {table_size}"),
            ));
        }
        Ok(Self {
            keys: keys.to_vec(),
            table: SamplingTable::shared(table_size, seed),
        })
    }

    pub fn depth(&self) -> usize {
        self.keys.len()
    }

    /// The g-values of `token` after a context of hash `context`: bit `d` is depth `d`'s.
    #[inline(always)]
    pub fn g_bits(&self, context: i64, token: i64) -> u64 {
        let base = accumulate(context, token);
        let mut bits = 0u64;
        for (d, &key) in self.keys.iter().enumerate() {
            bits |= u64::from(self.table.at(accumulate(base, key))) << d;
        }
        bits
    }

    /// transformers' `compute_g_values`: for each n-gram of `ids` (`ids.len() - ngram_len + 1`
    /// of them, none when shorter), its g-values at every depth.
    pub fn compute_g_values(&self, ids: &[i64], ngram_len: usize) -> Vec<Vec<u8>> {
        if ngram_len == 0 || ids.len() < ngram_len {
            return Vec::new();
        }
        ids.windows(ngram_len)
            .map(|gram| {
                let (context, token) = gram.split_at(ngram_len - 1);
                let bits = self.g_bits(context_hash(context.iter().copied()), token[0]);
                (0..self.depth()).map(|d| (bits >> d & 1) as u8).collect()
            })
            .collect()
    }
}

/// transformers' `compute_context_repetition_mask`: for each n-gram of `ids`, whether its context
/// (its first `ngram_len - 1` ids) was new (`true`) or among the last `history` contexts (or a
/// zero hash while fewer than `history` contexts were seen, the state starting zeroed).
pub fn context_repetition_mask(ids: &[i64], ngram_len: usize, history: usize) -> Vec<bool> {
    if ngram_len == 0 || ids.len() < ngram_len {
        return Vec::new();
    }
    let hashes: Vec<i64> = (0..ids.len() - ngram_len + 1)
        .map(|k| context_hash(ids[k..k + ngram_len - 1].iter().copied()))
        .collect();
    (0..hashes.len())
        .map(|k| !seen_before(&hashes[..k], hashes[k], history))
        .collect()
}

/// Whether `hash` is among the last `history` of `earlier` (oldest first), or is 0 while fewer than
/// `history` were recorded (the ring starts zeroed).
pub fn seen_before(earlier: &[i64], hash: i64, history: usize) -> bool {
    let from = earlier.len().saturating_sub(history);
    (hash == 0 && earlier.len() < history) || earlier[from..].contains(&hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printed by the venv's torch 2.15 (CPU):
    /// `g = torch.Generator().manual_seed(seed); t = torch.randint(0, 2, (size,), generator=g)`,
    /// then the bits as hex, entry `i` bit `i % 64` of word `i / 64`, for the first 128 entries;
    /// and the count of ones over the whole table.
    #[test]
    fn the_table_is_torchs() {
        for &(seed, size, words, ones) in TORCH_TABLES {
            let table = SamplingTable::new(size, seed);
            assert_eq!(
                &table.words[..words.len()],
                words,
                "seed {seed} size {size}"
            );
            let count: u32 = table.words.iter().map(|w| w.count_ones()).sum();
            assert_eq!(count as u64, ones, "seed {seed} size {size}");
        }
    }

    include!("synthid/torch_tables.rs");

    #[test]
    fn hashes_wrap_and_keys_floor_modulo() {
        // transformers: accumulate_hash(ones, [[1, 2]]) with int64 wrapping.
        let h = context_hash([1, 2]);
        let want = accumulate(accumulate(1, 1), 2);
        assert_eq!(h, want);
        let table = SamplingTable::new(3, 0);
        // -7 % 3 == 2 in torch.
        assert_eq!(table.at(-7), table.at(2));
        assert_eq!(table.at(i64::MIN), table.at(i64::MIN.rem_euclid(3)));
    }

    /// Printed by the venv's transformers 5.24: `SynthIDTextWatermarkLogitsProcessor(3, [654, 400,
    /// 836, -2**63, 2**62], 1000, 5, 1024, cpu)`, `compute_g_values` and
    /// `compute_context_repetition_mask` of `[[0, 0, 5, 151935, 7, 7, 7, 1]]`, each n-gram's
    /// g-values as bits (depth `d` bit `d`).
    #[test]
    fn g_values_and_the_repetition_mask_are_transformers() {
        let watermark = Watermark::new(&[654, 400, 836, i64::MIN, 1 << 62], 1000, 5).unwrap();
        let ids = [0, 0, 5, 151935, 7, 7, 7, 1];
        let bits: Vec<u64> = watermark
            .compute_g_values(&ids, 3)
            .iter()
            .map(|g| g.iter().enumerate().map(|(d, &b)| u64::from(b) << d).sum())
            .collect();
        assert_eq!(bits, [28, 10, 3, 18, 21, 25]);
        assert_eq!(
            context_repetition_mask(&ids, 3, 1024),
            [true, true, true, true, true, false]
        );
    }

    #[test]
    fn a_zero_hash_counts_as_seen_until_the_ring_is_full() {
        assert!(seen_before(&[], 0, 2));
        assert!(seen_before(&[5], 0, 2));
        assert!(!seen_before(&[5, 6], 0, 2));
        assert!(seen_before(&[5, 6], 6, 2));
        assert!(!seen_before(&[5, 6, 7], 5, 2));
        assert!(!seen_before(&[], 0, 0));
    }
}
