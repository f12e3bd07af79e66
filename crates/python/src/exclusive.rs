//! One call at a time on an object that several Python threads may share.
//!
//! A processor or batch holds state that a call changes, and a call releases the GIL while it
//! edits the logits, so another thread may call the same object meanwhile. Calls from other
//! threads wait their turn (with the GIL released, so the running call can take it back when it
//! calls Python); a call made from inside a running call of the same object, on the same thread
//! (a user's processor calling the batch that runs it), cannot wait for itself and raises
//! `BusyError`; so does a call that would wait for a thread that waits, through the objects it
//! calls, for this one (two objects whose calls call each other from two threads).

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard};

use pyo3::prelude::*;

use crate::errors::{new_err, ErrorClass};

pub(crate) struct Exclusive<T> {
    value: Mutex<T>,
}

/// The locked value; the lock is released when it is dropped.
pub(crate) struct Held<'a, T> {
    guard: Option<MutexGuard<'a, T>>,
    object: usize,
}

/// Who holds and who waits for which object, for every object at once: a call that would wait
/// for a thread that (through the objects they wait for) waits for this one would never end,
/// and raises `BusyError` instead (thread 1 in a step of A calling B while thread 2 in a step
/// of B calls A). Objects are named by their address, threads by [`thread_token`]. The value's
/// own mutex is only ever taken by its holder here, so it never blocks.
struct Registry {
    // Object -> the thread holding it.
    holders: BTreeMap<usize, usize>,
    // Thread -> the object it waits for.
    waiting: BTreeMap<usize, usize>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    holders: BTreeMap::new(),
    waiting: BTreeMap::new(),
});
/// Signalled whenever an object is released.
static RELEASED: Condvar = Condvar::new();

fn lock_registry() -> MutexGuard<'static, Registry> {
    // Its sections only read and write the maps: a panic cannot leave them half-changed.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A number that tells this thread from every other live thread.
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

impl Registry {
    /// Whether waiting for `object` would make `me` wait for itself: the chain of holders and
    /// the objects they wait for comes back to `me`.
    fn would_deadlock(&self, me: usize, mut object: usize) -> bool {
        // Each thread waits for one object at most, so a chain longer than the waiters loops
        // without `me` (a state in change; it is looked at again by whoever changes it).
        for _ in 0..=self.waiting.len() {
            match self.holders.get(&object) {
                Some(&holder) if holder == me => return true,
                Some(holder) => match self.waiting.get(holder) {
                    Some(&next) => object = next,
                    None => return false,
                },
                None => return false,
            }
        }
        false
    }
}

impl<T: Send> Exclusive<T> {
    pub fn new(value: T) -> Self {
        Self {
            value: Mutex::new(value),
        }
    }

    /// The value, once no other call holds it; `what` names the object in a `BusyError`.
    pub fn lock(&self, py: Python<'_>, what: &str) -> PyResult<Held<'_, T>> {
        let me = thread_token();
        let object = self as *const Self as usize;
        loop {
            let mut registry = lock_registry();
            let refused = match registry.holders.get(&object) {
                None => {
                    registry.waiting.remove(&me);
                    registry.holders.insert(object, me);
                    drop(registry);
                    return Ok(self.held(object));
                }
                Some(&holder) if holder == me => format!(
                    "this {what} was called from inside its own call on the same thread (a \
                     processor it runs calling it?)"
                ),
                Some(_) if registry.would_deadlock(me, object) => format!(
                    "this {what} is in a call on another thread that waits for an object this \
                     thread is calling: waiting would never end (two objects whose calls call \
                     each other, from two threads?)"
                ),
                Some(_) => {
                    registry.waiting.insert(me, object);
                    drop(registry);
                    // Wait without the GIL (the holder may need it to finish); then take the
                    // object with the GIL held, as a call does.
                    py.detach(|| {
                        let mut now = lock_registry();
                        while now.holders.contains_key(&object) {
                            now = RELEASED.wait(now).unwrap_or_else(|e| e.into_inner());
                        }
                    });
                    continue;
                }
            };
            registry.waiting.remove(&me);
            return Err(new_err(ErrorClass::Busy, refused));
        }
    }

    fn held(&self, object: usize) -> Held<'_, T> {
        // A panic inside a call already became an exception; the state it left is whole (every
        // step is planned, then applied or taken back).
        let guard = self.value.lock().unwrap_or_else(|e| e.into_inner());
        Held {
            guard: Some(guard),
            object,
        }
    }
}

impl<T> Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl<T> DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        // The value first, so the next holder's lock of it never blocks.
        drop(self.guard.take());
        let mut registry = lock_registry();
        registry.holders.remove(&self.object);
        // A waiter registers before it sleeps, under the same lock: none registered, none to
        // wake (a wake-up is a system call, a tenth of a small call's time).
        let waiters = !registry.waiting.is_empty();
        drop(registry);
        if waiters {
            RELEASED.notify_all();
        }
    }
}
