//! The one way outboxd takes a `std` mutex.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, ignoring poisoning: a poisoned lock only means a task panicked while
/// holding it, and every value outboxd keeps behind one stays whole between statements.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
