//! Read access to a request's token ids without copying them.

/// The token ids of one request so far, oldest first.
///
/// Processors read only the ids they need (usually the ones new since their last call), so a
/// binding can expose a foreign list (a Python list, a tensor) without converting all of it.
pub trait TokenHistory {
    fn token_count(&self) -> usize;
    /// The id at `index`; `index < self.len()`.
    fn token_at(&self, index: usize) -> u32;

    fn last_token(&self) -> Option<u32> {
        self.token_count().checked_sub(1).map(|i| self.token_at(i))
    }
}

/// Any owned or borrowed list of ids: `Vec<u32>`, `[u32; N]`, `&[u32]`, `Box<[u32]>`.
impl<T: AsRef<[u32]>> TokenHistory for T {
    fn token_count(&self) -> usize {
        self.as_ref().len()
    }
    fn token_at(&self, index: usize) -> u32 {
        self.as_ref()[index]
    }
}
