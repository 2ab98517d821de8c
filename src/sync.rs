//! Lock helpers shared by the crate: they take a lock also after a panic
//! elsewhere poisoned it. The data behind the engine's locks stays
//! consistent at every panic point (each critical section either completes
//! or changes nothing), and a panicking caller must not take the whole
//! engine down with it.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, also when poisoned.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes `l` for reading, also when poisoned.
pub(crate) fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Takes `l` for writing, also when poisoned.
pub(crate) fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
