//! Lock helpers shared by the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also after a panic elsewhere poisoned it: the data behind
/// the engine's mutexes stays consistent at every panic point (each
/// critical section either completes or changes nothing), and a panicking
/// caller must not take the whole engine down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
