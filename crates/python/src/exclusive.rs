//! One call at a time on an object that several Python threads may share.
//!
//! A processor or batch holds state that a call changes, and a call releases the GIL while it
//! edits the logits, so another thread may call the same object meanwhile. Calls from other
//! threads wait their turn (with the GIL released, so the running call can take it back when it
//! calls Python); a call made from inside a running call of the same object, on the same thread
//! (a user's processor calling the batch that runs it), cannot wait for itself and raises
//! `BusyError`.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::prelude::*;

use crate::errors::{new_err, Kind};

pub(crate) struct Exclusive<T> {
    value: Mutex<T>,
    // The thread holding the lock (see `thread_token`), 0 when none.
    holder: AtomicUsize,
}

/// The locked value; the lock is released when it is dropped.
pub(crate) struct Held<'a, T> {
    guard: MutexGuard<'a, T>,
    holder: &'a AtomicUsize,
}

/// A number that tells this thread from every other live thread.
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

impl<T: Send> Exclusive<T> {
    pub fn new(value: T) -> Self {
        Self {
            value: Mutex::new(value),
            holder: AtomicUsize::new(0),
        }
    }

    /// The value, once no other call holds it; `what` names the object in a `BusyError`.
    pub fn lock(&self, py: Python<'_>, what: &str) -> PyResult<Held<'_, T>> {
        let me = thread_token();
        let guard = loop {
            match self.value.try_lock() {
                Ok(guard) => break guard,
                // A panic inside a call already became an exception; the state it left is whole
                // (every step is planned, then applied or taken back).
                Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    if self.holder.load(Ordering::Acquire) == me {
                        return Err(new_err(
                            Kind::Busy,
                            format!(
                                "this {what} was called from inside its own call on the same \
                                 thread (a processor it runs calling it?)"
                            ),
                        ));
                    }
                    // Wait without the GIL: the holder may need it to finish.
                    py.detach(|| drop(self.value.lock()));
                }
            }
        };
        self.holder.store(me, Ordering::Release);
        Ok(Held {
            guard,
            holder: &self.holder,
        })
    }
}

impl<T> Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        self.holder.store(0, Ordering::Release);
    }
}
