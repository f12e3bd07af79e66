//! How far an incremental processor has read a request's ids, and whether new ids extend them.

use crate::history::TokenHistory;
use crate::processors::CHECKED_TAIL;

/// The number of ids read and the last [`CHECKED_TAIL`] of them. New ids count as extending the
/// ones read when there are at least as many and they agree at those last positions; anything
/// else (a rollback, another request's ids) makes the processor rescan. A fingerprint, not a full
/// comparison: engines pass each request's ids append-only, and a new request gets fresh state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Cursor {
    seen: usize,
    // The last min(seen, CHECKED_TAIL) ids read, oldest first.
    tail: [u32; CHECKED_TAIL],
}

impl Cursor {
    /// How many ids have been read.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Whether `ids` extend the ids read so far (see the type's documentation).
    pub fn extended_by(&self, ids: &dyn TokenHistory) -> bool {
        let tail_len = self.seen.min(CHECKED_TAIL);
        let tail_start = self.seen - tail_len;
        ids.token_count() >= self.seen
            && (0..tail_len).all(|i| ids.token_at(tail_start + i) == self.tail[i])
    }

    /// Marks all of `ids` read.
    pub fn read_all(&mut self, ids: &dyn TokenHistory) {
        self.seen = ids.token_count();
        let tail_start = self.seen.saturating_sub(CHECKED_TAIL);
        for (slot, i) in self.tail.iter_mut().zip(tail_start..self.seen) {
            *slot = ids.token_at(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_extends_and_a_changed_tail_or_a_rollback_does_not() {
        let mut cursor = Cursor::default();
        assert!(cursor.extended_by(&[1u32, 2]));
        cursor.read_all(&[1u32, 2, 3]);
        assert!(cursor.extended_by(&[1u32, 2, 3]));
        assert!(cursor.extended_by(&[1u32, 2, 3, 4]));
        assert!(!cursor.extended_by(&[1u32, 2]));
        assert!(!cursor.extended_by(&[1u32, 9, 3, 4]));
    }
}
