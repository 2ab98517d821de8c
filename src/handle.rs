//! A table of live objects addressed by 64-bit handles that carry a
//! generation, so a handle that was never issued, or whose object was
//! already removed, is recognised and refused instead of being trusted.
//!
//! A handle is `generation << 32 | slot`. Generations start at 1 and grow
//! each time a slot is freed; `u64::MAX` (Mooncake's `INVALID_BATCH`) and 0
//! are never issued.

use crate::sync;
use std::sync::{Arc, RwLock};

struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

struct Inner<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

/// A generational table of `Arc<T>`.
pub struct HandleTable<T> {
    inner: RwLock<Inner<T>>,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable {
            inner: RwLock::new(Inner {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }
}

fn split(handle: u64) -> (u32, usize) {
    ((handle >> 32) as u32, (handle & 0xffff_ffff) as usize)
}

impl<T> HandleTable<T> {
    /// A table with no entries (usable in `static` items).
    pub const fn new() -> Self {
        HandleTable {
            inner: RwLock::new(Inner {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    /// Stores `value` and returns its handle.
    pub fn insert(&self, value: Arc<T>) -> u64 {
        let mut inner = sync::write(&self.inner);
        let slot = match inner.free.pop() {
            Some(s) => s,
            None => {
                inner.slots.push(Slot {
                    generation: 1,
                    value: None,
                });
                (inner.slots.len() - 1) as u32
            }
        };
        let entry = &mut inner.slots[slot as usize];
        entry.value = Some(value);
        (u64::from(entry.generation) << 32) | u64::from(slot)
    }

    /// The object behind `handle`, if the handle is live.
    pub fn get(&self, handle: u64) -> Option<Arc<T>> {
        let (generation, slot) = split(handle);
        let inner = sync::read(&self.inner);
        let entry = inner.slots.get(slot)?;
        if entry.generation != generation {
            return None;
        }
        entry.value.clone()
    }

    /// Removes `handle` when `may_remove` approves its object, returning it.
    /// `Err(None)` means the handle is not live; `Err(Some(v))` that `may_remove`
    /// refused (the entry stays).
    pub fn remove_if(
        &self,
        handle: u64,
        may_remove: impl FnOnce(&T) -> bool,
    ) -> Result<Arc<T>, Option<Arc<T>>> {
        let (generation, slot) = split(handle);
        let mut inner = sync::write(&self.inner);
        let Some(entry) = inner.slots.get_mut(slot) else {
            return Err(None);
        };
        if entry.generation != generation {
            return Err(None);
        }
        match entry.value.take() {
            None => Err(None),
            Some(v) if !may_remove(&v) => {
                entry.value = Some(v.clone());
                Err(Some(v))
            }
            Some(v) => {
                // Skip the generation that would make the handle u64::MAX.
                entry.generation = match entry.generation.wrapping_add(1) {
                    0 | u32::MAX => 1,
                    g => g,
                };
                inner.free.push(slot as u32);
                Ok(v)
            }
        }
    }

    /// Removes `handle` unconditionally, returning its object if it was live.
    pub fn remove(&self, handle: u64) -> Option<Arc<T>> {
        self.remove_if(handle, |_| true).ok()
    }

    /// Every live entry with its handle, as of now.
    pub fn entries(&self) -> Vec<(u64, Arc<T>)> {
        let inner = sync::read(&self.inner);
        inner
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let v = s.value.clone()?;
                Some((u64::from(s.generation) << 32 | i as u64, v))
            })
            .collect()
    }

    /// Removes every entry and returns them.
    pub fn drain(&self) -> Vec<Arc<T>> {
        let mut inner = sync::write(&self.inner);
        let mut out = Vec::new();
        let mut freed = Vec::new();
        for (i, entry) in inner.slots.iter_mut().enumerate() {
            if let Some(v) = entry.value.take() {
                entry.generation = match entry.generation.wrapping_add(1) {
                    0 | u32::MAX => 1,
                    g => g,
                };
                freed.push(i as u32);
                out.push(v);
            }
        }
        inner.free.extend(freed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_forged_handles_are_refused() {
        let t = HandleTable::new();
        let a = t.insert(Arc::new(1));
        assert_eq!(*t.get(a).unwrap(), 1);
        assert!(t.get(a ^ 1 << 40).is_none());
        assert!(t.get(12345).is_none());
        assert!(t.get(u64::MAX).is_none());
        assert_eq!(*t.remove(a).unwrap(), 1);
        assert!(t.get(a).is_none());
        assert!(t.remove(a).is_none());
        let b = t.insert(Arc::new(2));
        assert_ne!(a, b, "a reused slot gets a new generation");
        assert!(t.get(a).is_none());
        assert_eq!(*t.get(b).unwrap(), 2);
    }

    #[test]
    fn remove_if_keeps_refused_entries() {
        let t = HandleTable::new();
        let a = t.insert(Arc::new(7));
        assert!(matches!(t.remove_if(a, |v| *v == 8), Err(Some(_))));
        assert!(t.get(a).is_some());
        assert!(t.remove_if(a, |v| *v == 7).is_ok());
        assert!(matches!(t.remove_if(a, |_| true), Err(None)));
    }

    #[test]
    fn drain_empties_the_table() {
        let t = HandleTable::new();
        let a = t.insert(Arc::new(1));
        let _b = t.insert(Arc::new(2));
        assert_eq!(t.drain().len(), 2);
        assert!(t.get(a).is_none());
    }
}
