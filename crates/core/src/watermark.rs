//! The green lists of transformers' `WatermarkLogitsProcessor` (Kirchenbauer et al., "A
//! Watermark for Large Language Models"), bit for bit with its CPU generator: the seed from the
//! ids before a token, torch's CPU `randperm` of the vocab under that seed
//! ([`randperm`](self::randperm)), its first `int(vocab * greenlist_ratio)` entries green. The
//! kind `watermark` (`processors/watermark.rs`) biases them; [`detect`] counts them in a text.
//!
//! On a GPU, transformers seeds a CUDA generator (Philox), whose permutations differ: the lists
//! here are those of a model run on the CPU, or of a detector given `device="cpu"`.

pub mod detect;
pub mod randperm;

use std::sync::{Arc, Mutex};

pub use detect::{detect, DetectOptions, Detection};

/// The size of the self-hash scheme's fixed table (transformers' `table_size`).
pub const TABLE_SIZE: usize = 1_000_003;

/// The self-hash scheme considers this many of the row's largest logits (transformers' 40).
pub const SELF_HASH_CANDIDATES: u32 = 40;

/// torch reduces a seed modulo `2^64 - 1` before `manual_seed`.
const SEED_MODULUS: i128 = u64::MAX as i128;

/// How a green list is seeded from the ids before the token it colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedingScheme {
    /// `hashing_key * last id` (the paper's algorithm 2).
    LeftHash,
    /// The minimum over the window (the last `context_width` ids, the candidate token last) of
    /// `hashing_key * (T[id] + 1) * (T[candidate] + 1)` in wrapping int64, `T` the fixed
    /// table (algorithm 3).
    SelfHash,
}

/// One watermark's settings, and the fixed table the self-hash scheme reads.
#[derive(Clone)]
pub struct GreenLists {
    vocab_size: usize,
    greenlist_size: usize,
    hashing_key: i64,
    scheme: SeedingScheme,
    context_width: usize,
    table: Option<Arc<[u32]>>,
}

impl std::fmt::Debug for GreenLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GreenLists")
            .field("vocab_size", &self.vocab_size)
            .field("greenlist_size", &self.greenlist_size)
            .field("hashing_key", &self.hashing_key)
            .field("scheme", &self.scheme)
            .field("context_width", &self.context_width)
            .finish()
    }
}

impl PartialEq for GreenLists {
    // The table is a function of the key.
    fn eq(&self, other: &Self) -> bool {
        (
            self.vocab_size,
            self.greenlist_size,
            self.hashing_key,
            self.scheme,
            self.context_width,
        ) == (
            other.vocab_size,
            other.greenlist_size,
            other.hashing_key,
            other.scheme,
            other.context_width,
        )
    }
}

impl GreenLists {
    /// The settings as transformers' constructor takes them (already checked: `vocab_size` at
    /// most [`randperm::MAX_N`], `greenlist_ratio` in `(0, 1)`, `context_width >= 1`). The
    /// self-hash scheme's table comes from a small cache shared by every caller ([`fixed_table`]).
    pub fn new(
        vocab_size: usize,
        greenlist_ratio: f64,
        hashing_key: i64,
        scheme: SeedingScheme,
        context_width: usize,
    ) -> Self {
        Self {
            vocab_size,
            // Python's `int(vocab_size * greenlist_ratio)`: the f64 product, truncated.
            greenlist_size: (vocab_size as f64 * greenlist_ratio) as usize,
            hashing_key,
            scheme,
            context_width,
            table: (scheme == SeedingScheme::SelfHash).then(|| fixed_table(hashing_key)),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn greenlist_size(&self) -> usize {
        self.greenlist_size
    }

    pub fn scheme(&self) -> SeedingScheme {
        self.scheme
    }

    pub fn context_width(&self) -> usize {
        self.context_width
    }

    /// `set_seed(input_seq)`'s seed, after the modulo: from the last `context_width` ids of
    /// `ids` (the self-hash scheme's candidate last among them). `ids` is not empty.
    pub fn seed(&self, ids: &[u32]) -> u64 {
        let window = &ids[ids.len().saturating_sub(self.context_width)..];
        let last = *window.last().expect("a seed needs an id");
        let seed: i128 = match &self.table {
            None => self.hashing_key as i128 * last as i128,
            Some(table) => {
                // torch's int64 tensor arithmetic wraps: `(key * a) * b`, then the minimum.
                let entry = |id: u32| table[id as usize % TABLE_SIZE] as i64 + 1;
                let b = entry(last);
                window
                    .iter()
                    .map(|&id| self.hashing_key.wrapping_mul(entry(id)).wrapping_mul(b))
                    .min()
                    .expect("a window is not empty") as i128
            }
        };
        // Python's `%`: the non-negative remainder.
        seed.rem_euclid(SEED_MODULUS) as u64
    }

    /// The green list after `ids` (transformers' `_get_greenlist_ids`), in permutation order:
    /// the first [`GreenLists::greenlist_size`] entries of `perm`, which it fills.
    pub fn green_list<'a>(&self, ids: &[u32], perm: &'a mut Vec<u32>) -> &'a [u32] {
        let len = self.greenlist_size.min(self.vocab_size);
        randperm::randperm_prefix(self.vocab_size, len, self.seed(ids), perm);
        &perm[..len]
    }

    /// Whether `token` is in the green list seeded by `ids` (the detector's `_get_ngram_score`):
    /// for the self-hash scheme `ids` ends with `token` itself.
    pub fn is_green(&self, ids: &[u32], token: u32) -> bool {
        randperm::in_prefix(self.vocab_size, self.greenlist_size, self.seed(ids), token)
    }
}

/// How many fixed tables the cache keeps (4 MB each): requests share the table of their key
/// while it is cached; a key past these is built again (about 10 ms) when next asked for.
pub const FIXED_TABLES_CACHED: usize = 4;

static FIXED_TABLES: Mutex<Vec<(i64, Arc<[u32]>)>> = Mutex::new(Vec::new());

/// `torch.randperm(1_000_003)` under `manual_seed(hashing_key)`: the self-hash scheme's table,
/// from a cache of the [`FIXED_TABLES_CACHED`] keys used last.
pub fn fixed_table(hashing_key: i64) -> Arc<[u32]> {
    let cached = |tables: &mut Vec<(i64, Arc<[u32]>)>| {
        let at = tables.iter().position(|(key, _)| *key == hashing_key)?;
        let entry = tables.remove(at);
        let table = entry.1.clone();
        tables.insert(0, entry);
        Some(table)
    };
    if let Some(table) = cached(&mut FIXED_TABLES.lock().unwrap_or_else(|e| e.into_inner())) {
        return table;
    }
    // Built outside the lock: another thread may build the same table meanwhile, which costs
    // time, not correctness.
    let table: Arc<[u32]> = randperm::randperm(TABLE_SIZE, hashing_key as u64).into();
    let mut tables = FIXED_TABLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(table) = cached(&mut tables) {
        return table;
    }
    tables.insert(0, (hashing_key, table.clone()));
    tables.truncate(FIXED_TABLES_CACHED);
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lefthash_seeds_are_pythons_products_modulo_2_64_minus_1() {
        let lists = GreenLists::new(100, 0.25, 15485863, SeedingScheme::LeftHash, 3);
        assert_eq!(lists.seed(&[9, 42]), 15485863 * 42);
        // A product past 2^64 - 1, and a negative key: Python's non-negative remainder.
        let big = GreenLists::new(100, 0.25, i64::MAX, SeedingScheme::LeftHash, 1);
        let expected = (i64::MAX as i128 * 4_000_000_000i128).rem_euclid(u64::MAX as i128);
        assert_eq!(big.seed(&[4_000_000_000]) as i128, expected);
        let negative = GreenLists::new(100, 0.25, -7, SeedingScheme::LeftHash, 1);
        assert_eq!(negative.seed(&[3]), u64::MAX - 21);
        assert_eq!(lists.greenlist_size(), 25);
    }

    #[test]
    fn selfhash_seeds_wrap_in_int64_and_take_the_minimum() {
        let lists = GreenLists::new(1000, 0.25, 15485863, SeedingScheme::SelfHash, 2);
        let table = fixed_table(15485863);
        let entry = |id: u32| table[id as usize % TABLE_SIZE] as i64 + 1;
        let (x, c) = (17u32, 1_000_010u32);
        let b = entry(c);
        let product = |id| 15485863i64.wrapping_mul(entry(id)).wrapping_mul(b);
        let min = product(x).min(product(c)) as i128;
        assert_eq!(
            lists.seed(&[5, x, c]) as i128,
            min.rem_euclid(u64::MAX as i128)
        );
        // 15485863 * 1e6 * 1e6 overflows int64: some products here are negative.
        assert!((0..200u32).any(|id| product(id) < 0));
    }

    #[test]
    fn green_lists_and_membership_agree() {
        for scheme in [SeedingScheme::LeftHash, SeedingScheme::SelfHash] {
            let lists = GreenLists::new(500, 0.3, 77, scheme, 2);
            let mut perm = Vec::new();
            let ids = [3u32, 9];
            let green = lists.green_list(&ids, &mut perm).to_vec();
            assert_eq!(green.len(), 150);
            for token in 0..500 {
                assert_eq!(lists.is_green(&ids, token), green.contains(&token));
            }
        }
    }

    #[test]
    fn the_cache_keeps_the_last_keys_and_shares_their_tables() {
        let a = fixed_table(11);
        assert!(Arc::ptr_eq(&a, &fixed_table(11)));
        for key in 100..100 + FIXED_TABLES_CACHED as i64 {
            fixed_table(key);
        }
        let cached = FIXED_TABLES.lock().unwrap().len();
        assert!(cached <= FIXED_TABLES_CACHED);
        assert_eq!(fixed_table(11)[..], a[..]);
    }
}
