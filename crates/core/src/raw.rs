//! Rows reached through raw pointers, so that no Rust reference to a row is alive while code
//! outside Rust (a user's Python processor) writes it through its own pointer.

/// One row of `len` logits at `ptr`.
#[derive(Debug)]
pub(crate) struct RawRow<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for RawRow<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RawRow<T> {}

// SAFETY: a RawRow is an address; whoever dereferences it upholds the aliasing rules (rows of a
// block are disjoint, and each is edited by one thread at a time).
unsafe impl<T: Send> Send for RawRow<T> {}
unsafe impl<T: Send> Sync for RawRow<T> {}

impl<T> RawRow<T> {
    pub(crate) fn of(row: &mut [T]) -> Self {
        Self {
            ptr: row.as_mut_ptr(),
            len: row.len(),
        }
    }

    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` elements.
    pub(crate) unsafe fn new(ptr: *mut T, len: usize) -> Self {
        Self { ptr, len }
    }

    /// The `len` elements from `start` on.
    ///
    /// # Safety
    /// They must lie inside this row.
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> Self {
        Self {
            ptr: self.ptr.add(start),
            len,
        }
    }

    /// The row as a slice, for as long as the caller keeps no other reference to it.
    ///
    /// # Safety
    /// The row must be valid, and no other reference to it may be used while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice<'a>(&self) -> &'a mut [T] {
        std::slice::from_raw_parts_mut(self.ptr, self.len)
    }
}
