//! Caches keyed by what a request sent, bounded by the bytes they hold: a client that sends a
//! thousand distinct large specs cannot make the process keep a thousand large values.
//!
//! A value states its own size ([`Footprint`]); the cache keeps the most recently used values
//! whose sizes (and keys) add up to at most its budget, dropping the least recently used first.
//! A value larger than the whole budget is handed back to its request and not kept. A value
//! dropped from the cache lives on only in the requests that hold it, and is freed with the last.

use std::any::Any;
use std::sync::Arc;

use lru::LruCache;

/// What a cached value holds, in bytes: its heap allocations and its own size, counted so that a
/// value's memory is never under-stated (an upper bound where the value grows).
pub(crate) trait Footprint {
    fn footprint(&self) -> usize;
}

impl Footprint for Vec<u32> {
    fn footprint(&self) -> usize {
        std::mem::size_of::<Self>() + self.capacity() * 4
    }
}

impl Footprint for Vec<Vec<u32>> {
    fn footprint(&self) -> usize {
        std::mem::size_of::<Self>() + self.iter().map(Footprint::footprint).sum::<usize>()
    }
}

/// Bytes a cache entry costs beyond its key's bytes and its value's footprint (the LRU's node,
/// the map's slot, the `Arc`'s counts).
const ENTRY_OVERHEAD: usize = 128;

type Shared = Arc<dyn Any + Send + Sync>;

/// Values by key, at most `budget` bytes of them (see the module's documentation).
pub(crate) struct ByteBudgetCache {
    entries: LruCache<String, (Shared, usize)>,
    held: usize,
    budget: usize,
}

impl ByteBudgetCache {
    pub fn new(budget: usize) -> Self {
        Self {
            entries: LruCache::unbounded(),
            held: 0,
            budget,
        }
    }

    /// The value at `key`, now the most recently used.
    pub fn get(&mut self, key: &str) -> Option<Shared> {
        self.entries.get(key).map(|(value, _)| value.clone())
    }

    /// Keeps `value` at `key` if it fits the budget, dropping the least recently used values
    /// until it does; a value larger than the whole budget is not kept.
    pub fn put(&mut self, key: &str, value: Shared, footprint: usize) {
        let cost = footprint
            .saturating_add(key.len())
            .saturating_add(ENTRY_OVERHEAD);
        if let Some((_, old)) = self.entries.pop(key) {
            self.held -= old;
        }
        if cost > self.budget {
            return;
        }
        while self.held + cost > self.budget {
            match self.entries.pop_lru() {
                Some((_, (_, dropped))) => self.held -= dropped,
                None => break,
            }
        }
        self.entries.put(key.to_string(), (value, cost));
        self.held += cost;
    }

    /// The bytes the kept values cost (at most the budget).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Values kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(n: usize) -> (Shared, usize) {
        let v = vec![0u32; n];
        let footprint = v.footprint();
        (Arc::new(v), footprint)
    }

    #[test]
    fn keeps_the_most_recent_values_within_the_budget() {
        let mut cache = ByteBudgetCache::new(10_000);
        for i in 0..100 {
            let (v, f) = value(500);
            cache.put(&format!("k{i}"), v, f);
            assert!(cache.held() <= 10_000, "{}", cache.held());
        }
        // 500 ids are 2,000 bytes and a bit: four fit.
        assert_eq!(cache.len(), 4);
        assert!(cache.get("k99").is_some() && cache.get("k95").is_none());
        // Used keeps it: k96 survives the next put, k97 (now the oldest) goes.
        assert!(cache.get("k96").is_some());
        let (v, f) = value(500);
        cache.put("new", v, f);
        assert!(cache.get("k96").is_some() && cache.get("k97").is_none());
    }

    #[test]
    fn a_value_larger_than_the_budget_is_not_kept() {
        let mut cache = ByteBudgetCache::new(1_000);
        let (v, f) = value(10);
        cache.put("small", v, f);
        let (v, f) = value(1_000);
        cache.put("large", v, f);
        assert!(cache.get("large").is_none());
        assert!(cache.get("small").is_some());
        // Put again under the same key: counted once.
        let (v, f) = value(10);
        cache.put("small", v, f);
        assert_eq!(cache.len(), 1);
        assert!(cache.held() < 1_000);
    }
}
